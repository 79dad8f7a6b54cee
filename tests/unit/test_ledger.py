"""The run ledger (per-batch counts on disk), the job record and the failpoint switch."""

from __future__ import annotations

import json

import pytest

from keyshift.errors import ConfigurationError
from keyshift.processing.job_record import load_job_record, save_job_record
from keyshift.processing.spark_checkpoint import committed_batches
from keyshift.processing.failpoints import FAILPOINT_ENV, armed
from keyshift.processing.job_config import JobConfig
from keyshift.processing.outputs.ledger import BatchCounts, RunLedger


def _batch(batch_id: int, slots: list[int], windows: int = 0, late: int = 0, dead: dict[str, int] | None = None) -> BatchCounts:
    dead = dead or {}
    return BatchCounts(batch_id=batch_id, windows_emitted=windows, sum_window_counts=sum(slots) - late - sum(dead.values()),
                       late_events=late, dead_letters=sum(dead.values()), per_slot_events=slots, dead_letters_by_reason=dead)


def test_totals_sum_every_batch(tmp_path):
    ledger = RunLedger(tmp_path)
    ledger.record(_batch(0, [3, 1], windows=2, dead={"malformed JSON": 1}))
    ledger.record(_batch(1, [0, 5], windows=1, late=2, dead={"malformed JSON": 1, "invalid UTF-8": 1}))
    totals = ledger.totals(partitions=2)
    assert totals.batches == 2
    assert totals.per_slot_events == [3, 6] and totals.processed_events == 9
    assert totals.late_events == 2 and totals.dead_letters == 3 and totals.windows_emitted == 3
    assert totals.dead_letters_by_reason == {"malformed JSON": 2, "invalid UTF-8": 1}
    assert totals.accounted_events == totals.processed_events


def test_a_replayed_batch_replaces_its_record_and_is_not_counted_twice(tmp_path):
    ledger = RunLedger(tmp_path)
    ledger.record(_batch(0, [2, 2]))
    ledger.record(_batch(1, [1, 0]))
    ledger.record(_batch(1, [1, 0]))  # Spark replays batch 1 after a crash
    assert ledger.totals(partitions=2).per_slot_events == [3, 2]
    assert [b.batch_id for b in ledger.batches()] == [0, 1]
    assert not list(ledger.dir.glob("*.tmp"))


def test_a_sink_built_on_a_ledger_starts_from_its_totals(tmp_path):
    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.processing.outputs.sinks import KeyedWindowSink

    RunLedger(tmp_path).record(_batch(4, [1, 2, 3]))
    sink = KeyedWindowSink(FLIGHT_DELAYS, tmp_path, "r", epoch=0, partitions=3)
    assert sink.counters.per_slot_events == [1, 2, 3] and sink.last_batch_id == 4


def test_the_barrier_refuses_batches_not_admitted_and_waits_for_the_one_admitted(tmp_path):
    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.processing.outputs.sinks import BatchRefused, KeyedWindowSink

    sink = KeyedWindowSink(FLIGHT_DELAYS, tmp_path, "r", epoch=0, partitions=3)
    sink.admit(7)
    sink.close_barrier()
    assert sink.in_flight  # batch 7 was in the sink before the cut: it finishes
    with pytest.raises(BatchRefused, match="batch 8 refused"):
        sink.admit(8)
    sink.release(7)
    assert not sink.in_flight and sink.last_query_batch == 7


def test_py4j_logs_a_refused_batch_as_one_line_and_other_errors_with_their_traceback(tmp_path, caplog):
    """A stop's refused batch is no crash: py4j's traceback for it is replaced by one INFO line."""
    import logging

    from keyshift.jobs.flight_delays import FLIGHT_DELAYS
    from keyshift.processing.outputs.sinks import KeyedWindowSink

    sink = KeyedWindowSink(FLIGHT_DELAYS, tmp_path, "r", epoch=0, partitions=3)
    sink.close_barrier()
    py4j_log = logging.getLogger("py4j.clientserver")
    caplog.set_level(logging.INFO)
    for call in (lambda: sink.admit(8), lambda: 1 / 0):  # as py4j's callback server logs a foreachBatch's exception
        try:
            call()
        except Exception:
            py4j_log.exception("There was an exception while executing the Python Proxy on the Python Side.")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [type(r.exc_info[1]) for r in errors] == [ZeroDivisionError]
    assert any("batch 8 refused" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


def test_job_record_round_trip(tmp_path):
    config = JobConfig.from_options(run_id="r1", strategy="hot_split", partitions=4, end_offsets={0: 10, 3: 7},
                                  assignment={"ORD": 1}, split={"ORD": (1, 2)}, limit=17)
    save_job_record(tmp_path, config, {0: 0, 1: 5, 2: 0, 3: 0}, {"events_produced": "17"})
    loaded, start, replay = load_job_record(tmp_path)
    assert loaded == config
    assert start == {0: 0, 1: 5, 2: 0, 3: 0} and replay == {"events_produced": "17"}


def test_the_job_record_stores_the_config_by_group_and_reads_one_written_flat(tmp_path):
    """The grouped form is what job.json holds; a record written before the groups (flat
    fields, some this version no longer knows) reads to the same config."""
    import json

    config = JobConfig.from_options(run_id="r1", strategy="least_count", partitions=4, watermark="key", bound_ms=60_000,
                                    max_partition_drift_ms=3_600_000, exchange="plain", topic="t", limit=17, end_offsets={0: 3})
    save_job_record(tmp_path, config, {0: 0, 1: 0, 2: 0, 3: 0}, {})
    stored = json.loads((tmp_path / "job.json").read_text())["config"]
    assert stored["placement"]["strategy"] == "least_count" and stored["event_time"]["mode"] == "key"
    assert stored["event_time"]["max_partition_drift_ms"] == 3_600_000 and stored["exchange"] == {"mode": "plain", "emit": "batch"}
    assert stored["input"]["topic"] == "t" and stored["input"]["end_offsets"] == {"0": 3}
    assert JobConfig.from_json(stored) == config
    flat = {"run_id": "r1", "job": "flight_delays", "strategy": "least_count", "partitions": 4, "watermark": "key", "bound_ms": 60_000,
            "max_partition_drift_ms": 3_600_000, "exchange": "plain", "topic": "t", "limit": 17, "end_offsets": {"0": 3},
            "a_field_of_an_older_version": 1}
    assert JobConfig.from_json(flat) == config
    with pytest.raises(ConfigurationError, match="'watermark_mode' is not a job setting"):
        JobConfig.from_options("r", watermark_mode="key")
    with pytest.raises(ConfigurationError, match="malformed"):
        JobConfig.from_json({"job": "flight_delays"})


def test_stateful_partitions_live_in_the_job_record_and_its_segments(tmp_path):
    import dataclasses
    import json

    from keyshift.processing.job_record import Segment, load_segments

    config = JobConfig.from_options(run_id="r2", partitions=32, max_stateful_partitions=8)
    assert config.placement.stateful_partitions == 8
    save_job_record(tmp_path, config, {p: 0 for p in range(32)}, {})
    loaded, _, _ = load_job_record(tmp_path)
    [segment] = load_segments(tmp_path)
    assert loaded.placement.max_stateful_partitions == 8 and segment.stateful_partitions == 8
    assert segment.config(loaded).placement.stateful_partitions == 8
    # a switch's segment at P = 4 runs min(4, 8) = 4; a segment of a run from before the cap has none: S = P
    assert dataclasses.replace(segment, partitions=4, stateful_partitions=4).config(loaded).placement.stateful_partitions == 4
    old = {k: v for k, v in segment.as_json().items() if k != "stateful_partitions"}
    assert Segment.from_json(old).config(loaded).placement.stateful_partitions == 32
    # the stored form is the JSON the job record has always had: offsets keyed by partition as text
    stored = json.loads((tmp_path / "job.json").read_text())["segments"]
    assert stored == [segment.as_json()] and stored[0]["start_offsets"]["31"] == 0 and "marker_floor" not in stored[0]
    assert Segment.from_json(stored[0]) == segment


def test_stateful_partitions_are_at_most_p():
    from keyshift.errors import PlacementError

    assert JobConfig.from_options(run_id="r", partitions=8).placement.stateful_partitions == 8
    assert JobConfig.from_options(run_id="r", partitions=8, max_stateful_partitions=64).placement.stateful_partitions == 8
    assert JobConfig.from_options(run_id="r", partitions=8, max_stateful_partitions=3).placement.stateful_partitions == 3
    with pytest.raises(PlacementError, match="max_stateful_partitions"):
        _ = JobConfig.from_options(run_id="r", partitions=8, max_stateful_partitions=0).placement.stateful_partitions


def test_the_ingest_stage_runs_s_tasks_except_under_global_merge():
    assert JobConfig.from_options(run_id="r", partitions=32, max_stateful_partitions=2).source_tasks == 2
    assert JobConfig.from_options(run_id="r", partitions=8).source_tasks == 8
    assert JobConfig.from_options(run_id="r", partitions=8, max_stateful_partitions=64).source_tasks == 8
    # global_merge's tasks each merge one Kafka partition's slot into Redis: never coalesced
    assert JobConfig.from_options(run_id="r", partitions=32, max_stateful_partitions=2, exchange="global_merge").source_tasks == 32


def test_resuming_without_a_job_record_names_the_problem(tmp_path):
    from keyshift.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="no job.json"):
        load_job_record(tmp_path)


def test_committed_batches_reads_spark_checkpoint_files(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, offsets in ((0, {"0": 5, "1": 3}), (1, {"0": 9, "1": 4}), (2, {"0": 12, "1": 4})):
        (tmp_path / "offsets" / str(batch)).write_text("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps({"t": offsets}))
    for batch in (0, 1):  # batch 2 planned, not committed
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert committed_batches(tmp_path, "t") == ([0, 1], {0: 9, 1: 4})
    assert committed_batches(tmp_path / "none", "t") == ([], {})


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),  # unset: nothing armed
        ("sink.after_outputs@5", ("sink.after_outputs", 5)),
        ("sink.before_batch@0", ("sink.before_batch", 0)),
    ],
)
def test_armed_failpoint(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(FAILPOINT_ENV, raising=False)
    else:
        monkeypatch.setenv(FAILPOINT_ENV, value)
    assert armed() == expected


def test_a_malformed_failpoint_is_refused(monkeypatch):
    monkeypatch.setenv(FAILPOINT_ENV, "sink.after_outputs")
    with pytest.raises(ValueError, match="NAME@BATCH_ID"):
        armed()


def test_end_of_input_markers_go_out_once_the_next_batch_can_take_the_rest_and_them():
    from keyshift.processing.sources.kafka_input import input_reached, marker_room

    target = {0: 100, 1: 50}
    room = marker_room(20, 2)  # 20 records per batch, 2 of them markers
    assert room == 18
    assert not input_reached(target, {}, {0: 80, 1: 40}, room)  # 30 left: another full batch first
    assert input_reached(target, {}, {0: 90, 1: 42}, room)  # 18 left: they and the 2 markers fit
    assert input_reached(target, {0: 100, 1: 50}, {}, room)  # consumed to the end
    assert not input_reached(target, {}, {}, room)  # nothing planned yet
    assert input_reached(target, {}, {0: 1, 1: 1}, marker_room(None, 2))  # no limit per batch
    assert not input_reached(target, {}, {0: 99, 1: 50})  # the default: the end itself


def test_job_record_round_trips_and_names_its_job(tmp_path):
    from keyshift.errors import ConfigurationError
    from keyshift.processing.job_record import JobRecord

    assert JobRecord.job_name(tmp_path) is None  # not started: no record
    config = JobConfig.from_options(run_id="r3", partitions=4, end_offsets={0: 5, 1: 7, 2: 0, 3: 1})
    save_job_record(tmp_path, config, {0: 0, 1: 2, 2: 0, 3: 0}, {"events_produced": "13"})
    record = JobRecord.read(tmp_path)
    assert record.config == config and record.start_offsets == {0: 0, 1: 2, 2: 0, 3: 0}
    assert record.replay == {"events_produced": "13"} and [s.index for s in record.segments] == [0]
    assert JobRecord.job_name(tmp_path) == "flight_delays"
    # the input end, once fixed, stays when a later save has none
    save_job_record(tmp_path, JobConfig.from_options(run_id="r3", partitions=4), record.start_offsets, record.replay)
    assert JobRecord.read(tmp_path).config.input.end_offsets == {0: 5, 1: 7, 2: 0, 3: 1}
    (tmp_path / "job.json").write_text('{"config": {"run_id": "r3"}}')
    with pytest.raises(ConfigurationError, match="malformed"):
        JobRecord.read(tmp_path)

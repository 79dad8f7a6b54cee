"""The keyshift page's pure data gathering (`keyshift.ui.data`) and its charts, on records shaped as
their writers store them (no Redis, no Airflow)."""

from __future__ import annotations

import json

import pytest

from keyshift.ui import data, plots


def progress(batch, slots, strategy="hash", epoch=0, segment=0, at_ms=None):
    """One progress record as `RunRecorder.progress` writes it (the fields the page reads)."""
    return {"batch_id": batch, "processed_rows_per_slot": slots, "strategy": strategy, "epoch": epoch, "segment": segment,
            "timestamp_ms": at_ms if at_ms is not None else 1_000 * batch, "input_rows": sum(slots)}


def test_batch_loads_keep_the_last_record_of_a_replayed_batch_and_sort_by_batch():
    records = [progress(1, [5, 5]), progress(0, [1, 3]), progress(1, [6, 4]), progress(2, [2, 2], "least_count", 1, 1)]
    batches = data.batch_loads(records)
    assert [b.batch_id for b in batches] == [0, 1, 2]
    assert batches[1].slot_events == (6, 4)  # the replay's record wins
    assert batches[0].balance_degree == pytest.approx(1 / 3) and batches[0].max_over_mean == pytest.approx(1.5)
    assert (batches[2].strategy, batches[2].epoch, batches[2].segment) == ("least_count", 1, 1)


def test_the_ledger_wins_and_adds_batches_progress_lacks():
    batches = data.batch_loads([progress(0, [1, 3])], {0: [2, 2], 1: [4, 0]})
    assert [(b.batch_id, b.slot_events) for b in batches] == [(0, (2, 2)), (1, (4, 0))]
    assert batches[1].strategy is None and batches[1].balance_degree == 0.0


def test_read_ledger_and_jsonl_tolerate_a_half_written_line(tmp_path):
    (tmp_path / "batches").mkdir()
    (tmp_path / "batches" / "00000003.json").write_text(json.dumps({"batch_id": 3, "per_slot_events": [1, 2]}))
    (tmp_path / "progress.jsonl").write_text(json.dumps(progress(0, [1])) + "\n{\"batch_id\": 1, \"proc")
    assert data.read_ledger(tmp_path) == {3: [1, 2]}
    assert [r["batch_id"] for r in data.read_jsonl(tmp_path / "progress.jsonl")] == [0]
    assert data.read_jsonl(tmp_path / "absent.jsonl") == [] and data.read_json(tmp_path / "absent.json") is None


def test_segment_starts_mark_where_a_switch_took_effect():
    batches = data.batch_loads([progress(0, [1, 1]), progress(1, [1, 1]), progress(2, [1, 1], "least_count", 1, 1),
                                progress(3, [1, 1, 1], "least_count", 2, 2)])  # P 2 -> 3 at batch 3
    assert [b.batch_id for b in data.segment_starts(batches)] == [0, 2, 3]


@pytest.mark.parametrize(
    ("job", "record", "last", "expected"),
    [
        # the job record's last segment wins
        ({"segments": [{"strategy": "hash", "partitions": 8, "epoch": 0}, {"strategy": "least_count", "partitions": 8, "epoch": 3, "index": 1}]},
         {"strategy": "hash"}, None, ("least_count", 8, 3, 1, "job.json segments")),
        # no segments: the last batch's strategy and epoch, P from its slots
        ({"config": {"strategy": "hash"}}, {"strategy": "hash"}, progress(4, [1, 1, 1], "hot_split", 2, 1),
         ("hot_split", 3, 2, 1, "progress")),
        # nothing but the job record's config, grouped as stored, or flat as before the groups
        ({"config": {"placement": {"strategy": "least_count", "partitions": 4, "epoch": 2}, "exchange": {"mode": "plain"}}}, None, None,
         ("least_count", 4, 2, None, "job.json config")),
        ({"config": {"strategy": "modulo", "partitions": 6, "epoch": 1, "exchange": "plain"}}, None, None,
         ("modulo", 6, 1, None, "job.json config")),
        # nothing but the Redis record (values are text there)
        (None, {"strategy": "least_key", "partitions": "4", "epoch": "5"}, None, ("least_key", 4, 5, None, "run record")),
        # nothing at all
        (None, None, None, (None, None, None, None, "nothing recorded")),
    ],
)
def test_in_force(job, record, last, expected):
    batches = data.batch_loads([last]) if last else []
    force = data.in_force(job, record, batches)
    assert (force.strategy, force.partitions, force.epoch, force.segment, force.source) == expected


def switch_record(switch_id="sw-1", state="done", **fields):
    """A switch record as `SwitchControl` stores it after the verified and done steps."""
    record = {
        "switch_id": switch_id, "requested_at": 100.0, "finished_at": 180.0, "strategy_from": "hash", "strategy_to": "least_count",
        "partitions_from": 8, "partitions_to": 8, "epoch_from": 0, "epoch_to": 1, "reason": "threshold: 0.29 < 0.6",
        "state": state, "step": "done", "pause_seconds": 12.5,
        "migration": {"keys_moved": 28, "keys_total": 223, "state_bytes": 3000, "state_bytes_moved": 500},
        "verify": {"placement": {"ok": True, "misplaced": []}, "conservation": {"ok": True}},
    }
    record.update(fields)
    return record


def test_switch_rows_merge_history_and_the_switch_under_way():
    under_way = switch_record("sw-2", state="running", requested_at=200.0, finished_at=None, step="migrated", pause_seconds=None, verify=None)
    rows = data.switch_rows([switch_record()], under_way)
    assert [r.switch_id for r in rows] == ["sw-1", "sw-2"]
    done, running = rows
    assert (done.pause_s, done.keys_moved, done.keys_total, done.verified) == (12.5, 28, 223, True)
    assert (running.state, running.step, running.pause_s, running.verified) == ("running", "migrated", None, None)
    # the current record of a finished switch is also its newest history entry: listed once
    assert len(data.switch_rows([switch_record()], switch_record())) == 1


def test_a_failed_placement_check_is_not_verified():
    record = switch_record(state="failed", verify={"ok": False, "misplaced": ["ORD"]}, error="state on the wrong slot: ['ORD']")
    row = data.switch_row(record)
    assert row.placement_ok is False and row.verified is False and "wrong slot" in row.error


def quality_document(success=True):
    failed = [] if success else [{"expectation": "expect_column_values_to_be_between", "kwargs": {"column": "slot"},
                                  "unexpected_count": 2, "element_count": 10}]
    return {"run_id": "r", "success": success, "data_docs": "/x/data_docs/index.html",
            "suites": [{"suite": "flight_delay_windows", "success": success, "rows": 10, "evaluated": 20, "failed": failed}]}


def test_quality_from_quality_json_with_its_data_docs(tmp_path):
    (tmp_path / "quality.json").write_text(json.dumps(quality_document(success=False)))
    (tmp_path / "data_docs").mkdir()
    (tmp_path / "data_docs" / "index.html").write_text("<html></html>")
    result = data.quality_result(tmp_path)
    assert result.success is False and result.data_docs == "data_docs/index.html" and result.source == "quality.json"
    assert result.suites[0].failed == 1 and result.suites[0].rows == 10
    assert result.failures == ("flight_delay_windows: expect_column_values_to_be_between(column=slot) failed on 2 of 10 rows",)


def test_quality_from_the_pipeline_record_skipped_or_missing(tmp_path):
    assert data.quality_result(tmp_path) is None
    (tmp_path / "pipeline.json").write_text(json.dumps({"quality": {"skipped": True, "run_id": "r"}}))
    assert data.quality_result(tmp_path) is None
    pipeline = {"quality": {"success": True, "suites": [{"suite": "run_reconciliation", "rows": 1, "evaluated": 21, "failed": 0}]}}
    (tmp_path / "pipeline.json").write_text(json.dumps(pipeline))
    result = data.quality_result(tmp_path)
    assert result.success and result.source == "pipeline.json" and result.data_docs is None
    assert result.suites[0].success and result.suites[0].failed == 0


def monitor_record(at_s, hash_bd, least_bd, lag=None, switch=False, run_id="r1"):
    """A monitor record shaped like `evaluate.evaluation_record` plus the monitor's context."""
    return {
        "at_s": at_s, "job_run_id": run_id,
        "evaluation": {"in_force": "hash", "results": [{"strategy": "hash", "balance_degree": hash_bd},
                                                       {"strategy": "least_count", "balance_degree": least_bd}]},
        "measured": {"processed": {"balance_degree": hash_bd + 0.01}},
        "decision": {"switch": switch, "strategy": "least_count" if switch else "hash"},
        "consumer_lag": None if lag is None else {"total": lag, "per_partition": {"0": lag}},
    }


def test_monitor_series_of_every_strategy_lag_and_decisions():
    records = [monitor_record(10.0, 0.3, 0.9, lag=500), monitor_record(20.0, 0.28, 0.95, switch=True), monitor_record(30.0, 0.9, 0.95, lag=0)]
    series = data.strategy_balance_series(records)
    assert series["hash"] == [(10.0, 0.3), (20.0, 0.28), (30.0, 0.9)]
    assert series["least_count"][1] == (20.0, 0.95)
    assert series["measured processed"][0] == (10.0, pytest.approx(0.31))
    assert data.lag_series(records) == [(10.0, 500), (30.0, 0)]  # the evaluation without a lag is left out
    assert data.switch_decisions(records) == [(20.0, "least_count")]
    assert data.strategy_in_force(records[-1]) == "hash"


def test_records_of_a_run_by_name_else_by_time():
    records = [monitor_record(10.0, 0.3, 0.9, run_id="a"), monitor_record(20.0, 0.3, 0.9, run_id="b"), monitor_record(30.0, 0.3, 0.9, run_id="b")]
    assert [r["at_s"] for r in data.records_of_run(records, "b", None, None)] == [20.0, 30.0]
    assert [r["at_s"] for r in data.records_of_run(records, "c", 15.0, 25.0)] == [20.0]
    assert [r["at_s"] for r in data.records_of_run(records, "c", 15.0, None)] == [20.0, 30.0]


def test_task_seconds_per_stage_in_batch_order():
    stages = data.task_seconds({"source": {"10": [1.0, 2.0], "2": [3.0, 4.0]}, "stateful": {}})
    assert stages == {"source": [(2, (3.0, 4.0)), (10, (1.0, 2.0))]}
    assert data.task_seconds(None) == {}


def test_charts_are_inline_svg_with_text_labels_and_empty_without_data():
    batches = data.batch_loads([progress(0, [5, 1]), progress(1, [3, 3], "least_count", 1, 1)])
    svg = plots.slot_load_svg(batches)
    assert svg.startswith("<svg") and "least_count e1" in svg and "micro-batch" in svg
    records = [monitor_record(10.0, 0.3, 0.9, lag=500), monitor_record(20.0, 0.28, 0.95, lag=20, switch=True)]
    assert "switch to least_count" in plots.strategy_balance_svg(data.strategy_balance_series(records), "hash", data.switch_decisions(records))
    assert "records behind" in plots.lag_svg(data.lag_series(records))
    assert "stateful" in plots.task_seconds_svg({"stateful": [(0, (1.0, 2.0))]})
    assert plots.slot_load_svg([]) == plots.lag_svg([]) == plots.task_seconds_svg({}) == plots.strategy_balance_svg({}) == ""


def test_quality_from_the_demo_summary_and_a_pipeline_check_that_raised(tmp_path):
    import os

    demo = {"run_id": "r", "quality": {"success": True, "evaluated": 20, "rows": 3, "failed": [], "data_docs": None}}
    (tmp_path / "summary.json").write_text(json.dumps(demo))  # `keyshift run demo` writes its suite's result here
    result = data.quality_result(tmp_path)
    assert result.success and result.source == "summary.json" and result.suites[0].suite == data.DEMO_SUITE
    assert (result.suites[0].rows, result.suites[0].evaluated, result.suites[0].failed) == (3, 20, 0)

    # the pipeline's data_quality task, later, failed before any suite result: it wins, and says why
    (tmp_path / "pipeline.json").write_text(json.dumps({"quality": {"success": False, "error": "alerts topic unreadable"}}))
    stamp = (tmp_path / "summary.json").stat().st_mtime + 5
    os.utime(tmp_path / "pipeline.json", (stamp, stamp))
    result = data.quality_result(tmp_path)
    assert result.success is False and result.source == "pipeline.json" and result.failures == ("alerts topic unreadable",)

    failed = {"success": False, "evaluated": 20, "rows": 3, "failed": [{"type": "expect_x", "kwargs": {}, "line": "slot out of range"}]}
    (tmp_path / "summary.json").write_text(json.dumps({"quality": failed}))
    os.utime(tmp_path / "summary.json", (stamp + 5, stamp + 5))
    result = data.quality_result(tmp_path)
    assert result.success is False and result.suites[0].failed == 1 and result.failures == ("slot out of range",)


@pytest.mark.parametrize(
    "summary, latest, expected",
    [
        # the run ended: the summary's figures, the top reasons most first (ties by name), at most three
        ({"events_read": 3_000_000, "late_events": 1_183_168, "dead_letters": 528_770, "pending_events": 0, "windows_emitted": 9,
          "dead_letters_by_reason": {"too far behind the stream": 528_768, "bad json": 1, "no key": 1, "null time": 0}},
         None, (3_000_000, 1_183_168, 528_770, (("too far behind the stream", 528_768), ("bad json", 1), ("no key", 1)), 0, 9, "summary")),
        # still running, no ledger given: the last batch's counters; pending = read - accounted
        (None, {"events_read": 500, "events_accounted": 420, "late_events": 3, "dead_letters": 0},
         (500, 3, 0, (), 80, None, "progress")),
        (None, {"events_read": 500}, (500, None, None, (), None, None, "progress")),  # an older progress record
        (None, None, (None, None, None, (), None, None, "nothing recorded")),
    ],
)
def test_run_figures(summary, latest, expected):
    figures = data.run_figures(summary, latest)
    assert (figures.events_read, figures.late_events, figures.dead_letters, figures.dead_letter_reasons, figures.pending,
            figures.windows, figures.source) == expected


def test_a_running_run_shows_its_ledgers_windows_and_dead_letter_reasons(tmp_path):
    """While a run goes on, windows and dead-letter reasons come from its ledger (one file per
    batch, as the sink writes it); the folder is only read."""
    from keyshift.processing.outputs.ledger import BatchCounts, RunLedger

    assert data.ledger_totals(tmp_path) is None and not (tmp_path / "batches").exists()
    ledger = RunLedger(tmp_path)
    ledger.record(BatchCounts(batch_id=0, windows_emitted=5, dead_letters=2, dead_letters_by_reason={"bad json": 2}))
    ledger.record(BatchCounts(batch_id=1, windows_emitted=7, dead_letters=3, dead_letters_by_reason={"bad json": 1, "no key": 2}))
    ledger.record(BatchCounts(batch_id=1, windows_emitted=7, dead_letters=3, dead_letters_by_reason={"bad json": 1, "no key": 2}))  # replayed
    totals = data.ledger_totals(tmp_path)
    assert totals == (12, {"bad json": 3, "no key": 2})
    figures = data.run_figures(None, {"events_read": 500, "events_accounted": 420, "late_events": 0, "dead_letters": 5}, totals)
    assert figures.windows == 12 and figures.dead_letter_reasons == (("bad json", 3), ("no key", 2)) and figures.pending == 80


@pytest.mark.parametrize(
    "late, dead, success, marks",
    [
        (0, 0, True, ()),  # nothing to see
        (0, 0, None, ()),  # no quality result yet is not a failure
        (1_183_168, 528_768, True, ("1,183,168 late events", "528,768 dead letters")),
        (0, 0, False, ("quality failed",)),
        (None, None, False, ("quality failed",)),  # figures unknown
    ],
)
def test_attention_marks_late_dead_letters_and_failed_quality(late, dead, success, marks):
    figures = data.RunFigures(10, late, dead, (), 0, 1, "summary")
    quality = None if success is None else data.QualityResult(success, (), None, "quality.json")
    assert data.attention(figures, quality) == marks

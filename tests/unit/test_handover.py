"""The state handover of a switch's barrier batch: barrier rows, the processor's snapshot, the
snapshot file and the sink's admission of the barrier batch (pure parts; the real query's
snapshot is compared with Spark's state reader in tests/integration/test_switch.py)."""

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester
from test_processor import SLOT, T0, TOKEN, TOKENS, kind, rows

from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators import handover, processor
from keyshift.processing.operators.processor import PENDING_STATE_NAME, KeyedWindowProcessor, state_variables
from keyshift.processing.outputs.handover import read_snapshot, split_snapshot, write_snapshot


@pytest.fixture
def handing_over(monkeypatch):
    """The processor as in a barrier batch's tasks (`HANDOVER_PROPERTY` set)."""
    monkeypatch.setattr(processor, "handover_requested", lambda: True)


@pytest.fixture
def tester():
    return TwsTester(KeyedWindowProcessor(FLIGHT_DELAYS, TOKENS), timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)


def barrier_only() -> pd.DataFrame:
    """What a token receives in a barrier batch without events: one barrier row."""
    frame = rows(("ORD", T0, 1)).iloc[0:0]
    barrier = {c: [None] for c in frame.columns}
    barrier.update(token=[TOKEN], count=[0])
    return pd.DataFrame(barrier, columns=frame.columns)


def test_barrier_rows_reach_every_token_and_carry_no_event():
    schema = pa.schema([("token", pa.int32()), ("origin", pa.string()), ("count", pa.int64()),
                        ("event_ts", pa.timestamp("us", "UTC")), ("is_control", pa.bool_())])
    table = handover.barrier_rows(schema, TOKENS, "is_control")
    assert table.schema == schema and table.num_rows == len(TOKENS)
    assert table.column("token").to_pylist() == list(TOKENS) and set(table.column("count").to_pylist()) == {0}
    assert set(table.column("is_control").to_pylist()) == {False}
    assert table.column("event_ts").null_count == table.num_rows and table.column("origin").null_count == table.num_rows


def test_the_processor_drops_barrier_rows(tester):
    batch = pd.concat([rows(("ORD", T0 + 5, 10)), barrier_only()], ignore_index=True)
    out = tester.testInPandas(TOKEN, batch)
    assert kind(out, "load")["count"].tolist() == [1]  # the barrier row counts no event
    assert kind(out, "handover").empty  # outside a barrier batch nothing is handed over
    assert list(tester.peekMapState(PENDING_STATE_NAME, TOKEN)) == [("ORD",)]


def test_a_barrier_batch_snapshots_every_entry_and_timer_after_the_batch(tester, handing_over):
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 5, 10), ("LGA", T0 + HOUR_MS + 5, 20)))
    out = tester.testInPandas(TOKEN, rows(("ORD", T0 + 9, 30), ids=[7]))  # after this batch's own rows
    header, state = kind(out, "handover"), kind(out, "state")
    assert len(header) == 1 and header["slot"].tolist() == [SLOT] and header["count"].tolist() == [len(state)]
    assert set(state["handover_seq"]) == set(header["handover_seq"])
    entries = state[state["state_variable"] == PENDING_STATE_NAME]
    expected = tester.peekMapState(PENDING_STATE_NAME, TOKEN)
    assert {(k,): pickle.loads(v) for k, v in zip(entries["origin"], entries["state_value"])} == \
        {k: tuple(v) for k, v in expected.items()}
    timers = state[state["state_variable"] == handover.TIMERS]
    tester.handle.setGroupingKey(TOKEN)
    assert sorted(pickle.loads(v)[0] for v in timers["state_value"]) == sorted(tester.handle.listTimers())


def test_a_token_with_only_a_barrier_row_hands_its_state_over(tester, monkeypatch):
    tester.testInPandas(TOKEN, rows(("ORD", T0 + 5, 10)))
    monkeypatch.setattr(processor, "handover_requested", lambda: True)
    out = tester.testInPandas(TOKEN, barrier_only())
    assert kind(out, "load")["count"].tolist() == [0]
    assert kind(out, "handover")["count"].tolist() == [2]  # ORD's windows and the slot's timer


def snapshot_file(tmp_path, tester, handing_over_tokens=TOKENS):
    """The snapshot file of a barrier batch in which every token of `handing_over_tokens` ran."""
    frames = []
    for slot, token in enumerate(TOKENS):
        if token not in handing_over_tokens:
            continue
        events = [("ORD" if slot % 2 else "LGA", T0 + slot * HOUR_MS + 5, slot)] if slot < 4 else []
        frames.append(tester.testInPandas(token, rows(*events, ids=[slot]) if events else barrier_only().assign(token=token)))
    out = pd.concat(frames, ignore_index=True)
    rest, snapshot = split_snapshot(out)
    assert snapshot is not None and not rest["kind"].isin(("state", "handover")).any()
    return write_snapshot(snapshot, FLIGHT_DELAYS.key, tmp_path / "handover" / "7.parquet")


def test_the_snapshot_file_reads_as_the_state_reader_gives_the_state(tmp_path, tester, handing_over):
    state, timers = read_snapshot(snapshot_file(tmp_path, tester), state_variables(FLIGHT_DELAYS), TOKENS)
    pending = state[PENDING_STATE_NAME]
    assert list(pending.columns[:3]) == ["old_token", "partition_id", "key"]
    assert sorted(zip(pending["old_token"], pending["key"])) == sorted((TOKENS[s], "ORD" if s % 2 else "LGA") for s in range(4))
    assert state["key_clocks"].empty and len(timers) == 4 and set(timers["old_token"]) == set(TOKENS[:4])
    assert sorted(timers["expiry_ms"]) == [T0 + (s + 1) * HOUR_MS - 1 for s in range(4)]


def test_a_snapshot_without_every_token_is_not_used(tmp_path, tester, handing_over):
    path = snapshot_file(tmp_path, tester, handing_over_tokens=TOKENS[:-1])
    assert read_snapshot(path, state_variables(FLIGHT_DELAYS), TOKENS) is None
    assert read_snapshot(tmp_path / "missing.parquet", state_variables(FLIGHT_DELAYS), TOKENS) is None


def test_the_latest_snapshot_of_a_token_counts_and_an_incomplete_one_is_refused(tmp_path):
    def snap(seq, keys):
        n = len(keys)
        state = pd.DataFrame({"kind": "state", "slot": 0, "partition_id": 1, "origin": keys, "count": None,
                              "state_variable": PENDING_STATE_NAME,
                              "state_value": [pickle.dumps((b"p", b"i", b"")) for _ in keys], "handover_seq": seq})
        header = pd.DataFrame({"kind": ["handover"], "slot": [0], "partition_id": [1], "origin": [None], "count": [n],
                               "state_variable": [None], "state_value": [None], "handover_seq": [seq]})
        return [state, header]

    variables = state_variables(FLIGHT_DELAYS)
    # input first (two keys), then a timer pass that closed one
    path = write_snapshot(pd.concat(snap(1, ["ORD", "LGA"]) + snap(2, ["ORD"]), ignore_index=True), "origin", tmp_path / "a.parquet")
    state, _ = read_snapshot(path, variables, TOKENS[:1])
    assert state[PENDING_STATE_NAME]["key"].tolist() == ["ORD"]
    broken = snap(3, ["ORD", "LGA"])
    broken[1]["count"] = 3  # a row is missing
    path = write_snapshot(pd.concat(broken, ignore_index=True), "origin", tmp_path / "b.parquet")
    assert read_snapshot(path, variables, TOKENS[:1]) is None


def test_the_sink_admits_one_barrier_batch_and_refuses_the_rest(tmp_path):
    from keyshift.processing.outputs.sinks import BatchRefused, KeyedWindowSink

    sink = KeyedWindowSink(FLIGHT_DELAYS, tmp_path, "r", epoch=0, partitions=8)
    sink.admit(4)  # in the sink when the switch comes: it finishes as usual
    assert sink.request_handover("sw-1")
    sink.release(4)
    sink.admit(5)
    assert sink.handover_batch == 5 and sink.barrier.is_set()
    with pytest.raises(BatchRefused):
        sink.admit(6)
    assert not sink.request_handover("sw-1") and not sink.withdraw_handover()


def test_a_handover_no_batch_came_for_is_withdrawn(tmp_path):
    from keyshift.processing.outputs.sinks import KeyedWindowSink

    sink = KeyedWindowSink(FLIGHT_DELAYS, tmp_path, "r", epoch=0, partitions=8)
    assert sink.request_handover("sw-1") and sink.withdraw_handover()
    sink.admit(3)
    assert sink.handover_batch is None and not sink.barrier.is_set()


def test_split_snapshot_leaves_batches_without_snapshot_alone():
    out = pd.DataFrame({"kind": ["window", "load"], "handover_seq": [None, None]})
    rest, snapshot = split_snapshot(out)
    assert snapshot is None and rest is out
    assert np.array_equal(split_snapshot(out.drop(columns="handover_seq"))[0]["kind"], ["window", "load"])


class _StoppingQuery:
    """A stand-in for the old `StreamingQuery` after its barrier batch: `stop()` takes a while."""

    def __init__(self, fail: bool = False):
        self.stopped = False
        self.fail = fail

    def exception(self):
        return None

    @property
    def isActive(self):  # noqa: N802 (pyspark's name)
        return not self.stopped

    def stop(self):
        import time

        time.sleep(0.2)
        if self.fail:
            raise RuntimeError("py4j gone")
        self.stopped = True


class _IdleSink:
    """A sink with the barrier batch committed and nothing in flight."""

    in_flight = False
    last_query_batch = None

    def close_barrier(self):
        pass


def test_the_old_query_stops_in_the_background_and_publishes_after(tmp_path):
    """`BackgroundStop` returns at once; `join` waits for the stop, then publishes the old
    query's last progress; a failed stop is the switch's JobError at `join`."""
    import time

    from keyshift.errors import JobError
    from keyshift.runtime.driver_switch import BackgroundStop

    query, published = _StoppingQuery(), []
    started = time.monotonic()
    stopping = BackgroundStop(query, _IdleSink(), tmp_path, lambda: published.append(query.stopped))
    assert time.monotonic() - started < 0.15 and not query.stopped  # the switch goes on meanwhile
    stopping.join()
    assert query.stopped and published == [True]  # published once the query stopped
    failing = BackgroundStop(_StoppingQuery(fail=True), _IdleSink(), tmp_path, lambda: published.append("no"))
    with pytest.raises(JobError, match="stopping the old query failed: py4j gone"):
        failing.join()
    assert published == [True]

"""Per-partition event time (`keyshift.eventtime.partition_clocks`): the fold, activity and
idleness, the cap that makes Spark's watermark follow the slowest active partition, the files."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from keyshift.errors import JobError
from keyshift.eventtime.partition_clocks import (
    PartitionClock, PartitionClocks, PartitionClockStore, SliceReport, cap_event_times, in_force, listed_partitions,
)

DAY = 86_400_000
T0 = 1_800_000_000_000  # processing time, ms


def clocks_at(times: dict[int, int | None], time_ms: int = T0, idle_timeout_ms: int = 60_000, last_active=None) -> PartitionClocks:
    return PartitionClocks(0, time_ms, idle_timeout_ms,
                           {p: PartitionClock(t, (last_active or {}).get(p, time_ms)) for p, t in times.items()})


def test_the_reference_is_the_slowest_active_partition_never_the_fastest():
    clocks = clocks_at({0: 10 * DAY, 1: 100 * DAY, 2: 50 * DAY})
    assert clocks.reference_ms() == 10 * DAY
    assert clocks.reference_ms(exclude=0) == 50 * DAY
    assert clocks.drift_ms() == 90 * DAY
    assert list(clocks.caps_ms(4)) == [50 * DAY, 10 * DAY, 10 * DAY, 10 * DAY]


def test_a_partition_without_an_event_holds_the_others_until_it_is_idle():
    clocks = clocks_at({0: 10 * DAY, 1: None}, last_active={0: T0 + 61_000})
    assert clocks.reference_ms() == -math.inf and clocks.reference_ms(exclude=1) == 10 * DAY
    later = replace(clocks, time_ms=T0 + 61_000)  # partition 1: 61 s without a record, idle
    assert later.idle() == [1] and later.reference_ms() == 10 * DAY


def test_idle_partitions_are_left_out_and_rejoin_with_their_next_record():
    clocks = clocks_at({0: 10 * DAY, 1: 40 * DAY}, time_ms=T0 + 120_000, last_active={0: T0, 1: T0 + 120_000})
    assert clocks.idle() == [0] and clocks.reference_ms() == 40 * DAY
    after = clocks.advance([{0: SliceReport(5, 11 * DAY)}])
    rejoined = in_force(after, 1, T0 + 125_000, 60_000)
    assert rejoined.idle() == [] and rejoined.reference_ms() == 11 * DAY


def test_advance_takes_the_largest_valid_time_and_a_marker_finishes_the_partition():
    clocks = clocks_at({0: 10 * DAY, 1: 20 * DAY})
    after = clocks.advance([{0: SliceReport(3, 12 * DAY)}, {0: SliceReport(2, 11 * DAY), 1: SliceReport(1, None, marker=True)}])
    assert after[0] == PartitionClock(12 * DAY, T0, False)
    assert after[1] == PartitionClock(20 * DAY, T0, True)
    done = in_force(after, 1, T0 + 1, 60_000)
    assert done.reference_ms() == 12 * DAY  # the finished partition holds nothing back
    assert in_force({**after, 0: replace(after[0], finished=True)}, 2, T0, 60_000).reference_ms() == math.inf


def test_a_report_of_only_rejected_records_keeps_the_clock_but_marks_activity():
    clocks = clocks_at({0: 10 * DAY}, last_active={0: T0 - 50_000})
    after = clocks.advance([{0: SliceReport(7, None)}])
    assert after[0] == PartitionClock(10 * DAY, T0, False)


def test_the_cap_keeps_a_row_at_or_below_every_other_active_partition():
    # partition 0 is months behind partition 1: its rows keep their times, partition 1's are
    # held at partition 0's clock, so Spark's max over the rows is the slower partition's time
    caps = clocks_at({0: 10 * DAY, 1: 100 * DAY}).caps_ms(2)
    capped, keeps = cap_event_times(np.array([11 * DAY, 101 * DAY]), np.array([0, 1]), caps)
    assert capped.tolist() == [11 * DAY, 10 * DAY] and keeps.tolist() == [True, True]
    caps = clocks_at({0: None, 1: 100 * DAY}).caps_ms(2)
    capped, keeps = cap_event_times(np.array([5 * DAY, 101 * DAY]), np.array([0, 1]), caps)
    assert keeps.tolist() == [True, False]  # partition 0 has no clock yet: partition 1 may not move the watermark
    capped, keeps = cap_event_times(np.array([5 * DAY]), np.array([7]), caps)  # a partition not listed: no cap
    assert capped.tolist() == [5 * DAY] and keeps.tolist() == [True]


def test_the_store_writes_once_and_a_replay_reads_the_same_clocks(tmp_path):
    store = PartitionClockStore(tmp_path)
    first = store.prepare(0, T0, 60_000, listed=[0, 1])
    assert first.clocks == {0: PartitionClock(None, T0), 1: PartitionClock(None, T0)}
    store.seal(0, "checkpoint", [{0: SliceReport(10, 5 * DAY)}, {1: SliceReport(10, 9 * DAY)}])
    second = store.prepare(1, T0 + 5_000, 60_000, listed=[0, 1])
    assert second.event_time_ms(0) == 5 * DAY and second.event_time_ms(1) == 9 * DAY
    assert store.prepare(1, T0 + 999_999, 60_000) == second  # a replay: the file wins, not the new time
    assert [c.batch_id for c in store.history()] == [0, 1]


def test_a_batch_without_clocks_cannot_be_sealed(tmp_path):
    with pytest.raises(JobError, match="not prepared"):
        PartitionClockStore(tmp_path).seal(3, "checkpoint", [])


def test_listed_partitions_reads_sparks_offset_log(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"flights":{"2":10,"0":5,"1":7}}\n')
    assert listed_partitions(tmp_path, 4) == [0, 1, 2]
    assert listed_partitions(tmp_path, 5) == []


def test_ingest_caps_event_ts_only_outside_global_mode(monkeypatch):
    import pyarrow as pa

    from keyshift.eventtime.plausibility import PlausibilityLimits
    from keyshift.processing.operators.ingest import IngestContext, capped_event_times

    clocks = clocks_at({0: 10 * DAY, 1: 100 * DAY})
    monkeypatch.setattr(IngestContext, "partition_clocks", lambda self: (0, clocks))
    rows = pa.table({"kafka_partition": pa.array([0, 1, 1], pa.int32())})
    times = pa.array([11 * DAY, 101 * DAY, None], pa.int64())
    context = IngestContext(run_id="r", end_offsets=None, bound_ms=0, limits=PlausibilityLimits(), batch_channel="unused",
                            cap_event_time=True)
    assert capped_event_times(rows, times, context).to_pylist() == [11 * DAY, 10 * DAY, None]
    assert capped_event_times(rows, times, replace(context, cap_event_time=False)).to_pylist() == [11 * DAY, 101 * DAY, None]

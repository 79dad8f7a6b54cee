"""Watermark alignment's planning of a micro-batch's offsets (`keyshift.eventtime.alignment`)."""

from __future__ import annotations

import pytest

from keyshift.eventtime.alignment import aligned_ends, first_after, prorated_ends

DAY = 86_400_000


def _times(partitions: dict[int, list[int | None]]):
    """A `time_at` over in-memory partitions (offset = list index), counting its probes."""
    calls = []

    def time_at(partition: int, offset: int):
        calls.append((partition, offset))
        return partitions[partition][offset]

    return time_at, calls


def test_prorated_ends_follow_spark_rate_limit():
    # 100 records over remaining 300/100/0: 75 and 25; a share below one record rounds up
    assert prorated_ends({0: 0, 1: 0, 2: 5}, {0: 300, 1: 100, 2: 5}, 100) == {0: 75, 1: 25, 2: 5}
    assert prorated_ends({0: 0, 1: 0}, {0: 1000, 1: 1}, 10) == {0: 9, 1: 1}
    assert prorated_ends({0: 3}, {0: 10}, None) == {0: 10}


def test_first_after_is_the_first_offset_past_the_limit():
    time_at, _ = _times({0: [1, 2, 2, 5, 9, 12]})
    assert first_after(0, 0, 6, 4, time_at) == 3
    assert first_after(0, 0, 6, 100, time_at) == 6
    assert first_after(0, 0, 6, 0, time_at) == 0
    assert first_after(0, 4, 6, 4, time_at) == 4


def test_a_partition_ahead_is_paused_and_the_slowest_reads_its_share():
    # partition 1 starts 10 days after partition 0: with a 1-day drift it waits
    times = {0: [i * 3_600_000 for i in range(100)], 1: [10 * DAY + i * 3_600_000 for i in range(100)]}
    time_at, _ = _times(times)
    ends, frontier = aligned_ends({0: 0, 1: 0}, {0: 100, 1: 100}, 40, DAY, time_at)
    assert ends[1] == 0
    assert ends[0] == 40  # the spare of the paused partition goes to the slowest
    assert frontier == 39 * 3_600_000


def test_no_partition_reads_past_the_slowest_plus_the_drift():
    # three partitions at different paces: 1 h, 2 h and 30 min per record
    times = {0: [i * 3_600_000 for i in range(500)], 1: [i * 7_200_000 for i in range(500)],
             2: [i * 1_800_000 for i in range(500)]}
    time_at, _ = _times(times)
    start = {0: 0, 1: 0, 2: 0}
    drift = 6 * 3_600_000
    read = 0
    while any(start[p] < 500 for p in start):
        ends, frontier = aligned_ends(start, {p: 500 for p in start}, 60, drift, time_at)
        assert sum(ends[p] - start[p] for p in start) <= 60
        assert sum(ends[p] - start[p] for p in start) > 0  # always progress
        reached = [times[p][ends[p] - 1] for p in start if ends[p] > start[p]]
        for p in start:
            if ends[p] > start[p]:
                assert times[p][ends[p] - 1] <= frontier + drift
        assert frontier == min(reached + [times[p][start[p]] for p in start if ends[p] == start[p] < 500])
        read += sum(ends[p] - start[p] for p in start)
        start = ends
    assert read == 1500


def test_records_without_event_time_never_cut_and_markers_are_read():
    times = {0: [0, 1, 2, None], 1: [10 * DAY, None]}
    time_at, _ = _times(times)
    ends, _ = aligned_ends({0: 0, 1: 0}, {0: 4, 1: 2}, None, DAY, time_at)
    assert ends == {0: 4, 1: 0}
    ends, frontier = aligned_ends({0: 4, 1: 0}, {0: 4, 1: 2}, None, DAY, time_at)
    assert ends == {0: 4, 1: 2} and frontier == 10 * DAY


def test_unknown_event_times_mean_no_cut():
    time_at, _ = _times({0: [None] * 5, 1: [None] * 5})
    assert aligned_ends({0: 0, 1: 2}, {0: 5, 1: 5}, None, 0, time_at) == ({0: 5, 1: 5}, None)


def test_new_and_empty_partitions():
    time_at, calls = _times({0: [5, 6, 7], 1: []})
    ends, _ = aligned_ends({0: 3, 1: 0}, {0: 3, 1: 0}, 10, DAY, time_at)
    assert ends == {0: 3, 1: 0} and calls == []


def test_negative_drift_is_refused():
    with pytest.raises(ValueError, match="max_drift_ms"):
        aligned_ends({0: 0}, {0: 1}, None, -1, lambda p, o: 0)

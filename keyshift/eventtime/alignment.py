"""Watermark alignment on Kafka partitions: how far each partition may be read in a micro-batch.

Spark's Kafka source reads each partition of a micro-batch in proportion to its remaining
offsets (`maxOffsetsPerTrigger` prorated by `KafkaMicroBatchStream.rateLimit`), whatever event
time the records hold; in a backfill of a topic whose partitions hold different periods it reads
them weeks apart, and everything waiting for the slowest partition (a window of a fast partition,
under a watermark that follows the slowest) is held as state meanwhile. Apache Flink bounds this
with watermark alignment (FLIP-182, FLIP-217: `WatermarkStrategy.withWatermarkAlignment(group,
maxAllowedWatermarkDrift)`): a split whose watermark runs more than the allowed drift ahead of the
group's minimum is paused until the others catch up; its records stay in Kafka, not in state.

keyshift does the same when it plans a micro-batch's offsets (`aligned_ends`): each partition p
gets Spark's prorated share of the batch's records, then is cut at the first record whose event
time is more than `max_drift_ms` past F, the event time the slowest partition reaches in this
batch (the minimum, over partitions with records to read, of the event time of the last record
their share reaches). The slowest partition always reads its whole share, so the run always
advances; a partition already more than the drift ahead reads nothing (paused) and resumes once
the others are within the drift. Records the cuts leave unread are offered again, prorated, to the
partitions that were not cut, for a few rounds, so a batch stays close to its `maxOffsetsPerTrigger`.

The rule needs the event time at an offset without reading the partition: `time_at(p, o)` (the
engine's Kafka reader fetches a few records at o), and a binary search over offsets assumes each
partition is in event-time order (the same assumption as the per-partition clocks,
`keyshift.eventtime.partition_clocks`); where it is not, a cut falls somewhere in the disorder, which
costs state, never correctness: every offset is read by some batch, and the batch's offsets are
fixed in Spark's offset log before it runs, so a replay reads the same records.

Records without an event time (end-of-input markers, records that are not valid events) never
cut a partition and never count as its reach.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

TimeAt = Callable[[int, int], "int | None"]
"""`time_at(partition, offset)`: the event time (ms) of the record at `offset` of `partition`,
or None when it has none (not a valid event, a control record)."""

ROUNDS = 8
"""Rounds in which records left unread by the cuts are offered again to the partitions not cut."""


def prorated_ends(start: Mapping[int, int], latest: Mapping[int, int], max_records: int | None) -> dict[int, int]:
    """Spark's split of a batch's record limit over Kafka partitions.

    Args:
        start: partition -> first offset of the batch.
        latest: partition -> offset past the last record available.
        max_records: `maxOffsetsPerTrigger` (records), None for no limit.

    Returns:
        partition -> end offset (exclusive): `start + limit * remaining / total`, floored, or
        rounded up when below one record (Spark 4 `KafkaMicroBatchStream.rateLimit`), at most
        `latest`; where rounding up passes the limit, the largest shares give the excess back
        (at least one record each), so the batch holds at most `max_records` when that allows
        one record per partition.
    """
    remaining = {p: max(0, int(latest.get(p, start[p])) - int(start[p])) for p in start}
    total = sum(remaining.values())
    if max_records is None or total <= max_records:
        return {p: int(start[p]) + remaining[p] for p in start}
    shares = {}
    for p, size in remaining.items():
        share = max_records * (size / total)
        shares[p] = min(size, int(math.ceil(share) if share < 1 else math.floor(share)))
    # rounding small shares up can pass the limit by a few records (Spark allows it); take them
    # back from the largest shares, so a batch never holds more than `max_records`
    excess = sum(shares.values()) - max_records
    for p in sorted(shares, key=lambda q: -shares[q]):
        if excess <= 0:
            break
        taken = min(excess, shares[p] - 1)
        shares[p] -= taken
        excess -= taken
    return {p: int(start[p]) + shares[p] for p in start}


def first_after(partition: int, low: int, high: int, limit_ms: int, time_at: TimeAt) -> int:
    """The first offset in [low, high) whose record's event time is past `limit_ms`, or `high`.

    A binary search, exact when the partition's event times are non-decreasing over [low, high);
    a record without an event time takes that of the nearest record before it that has one
    (`_time_near`), and counts as within the limit when none has.
    """
    lo, hi = int(low), int(high)
    while lo < hi:
        mid = (lo + hi) // 2
        t = _time_near(partition, low, mid, time_at)
        if t is not None and t > limit_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo


LOOK_BACK = 8
"""Records looked back from a record without an event time for one that has one."""


def _time_near(partition: int, low: int, offset: int, time_at: TimeAt) -> int | None:
    """The event time at `offset`, or of the nearest of the `LOOK_BACK` records before it (not
    before `low`) that has one; None when none has."""
    for at in range(offset, max(low, offset - LOOK_BACK) - 1, -1):
        t = time_at(partition, at)
        if t is not None:
            return t
    return None


def _position(partition: int, start: int, end: int, time_at: TimeAt) -> int | None:
    """Where a partition stands in event time after reading [start, end): the event time of its
    last record with one (looking back at most a few records); when it reads nothing, that of the
    next record it would read. None when neither has an event time."""
    if end > start:
        return _time_near(partition, start, end - 1, time_at)
    return time_at(partition, start)


def aligned_ends(start: Mapping[int, int], latest: Mapping[int, int], max_records: int | None, max_drift_ms: int,
                 time_at: TimeAt) -> tuple[dict[int, int], int | None]:
    """A micro-batch's end offset per partition, aligned so no partition runs more than
    `max_drift_ms` of event time ahead of the slowest (module docstring; Flink FLIP-182).

    The slowest partition is the one that stands lowest in event time after the batch among the
    partitions with records to read (`_position`: its last record read, or the next one when it
    reads none). Each round offers records (first Spark's prorated split of `max_records`, then
    what the cuts left, prorated over the partitions whose next record is within the drift) and
    cuts every partition at the first record past the slowest position + `max_drift_ms`. The
    slowest position never falls from one round to the next, so no round undoes another's reads.

    Args:
        start: partition -> first offset of the batch.
        latest: partition -> offset past the last record available now.
        max_records: the batch's record limit (`maxOffsetsPerTrigger`), None for none.
        max_drift_ms: the largest drift allowed (ms of event time), >= 0.
        time_at: event time at an offset (`TimeAt`).

    Returns:
        (partition -> end offset (exclusive), F): F is the slowest position (ms of event time),
        None when no partition with records has an event time to stand at (no cut then).

    Raises:
        ValueError: `max_drift_ms` < 0.
    """
    if max_drift_ms < 0:
        raise ValueError(f"max_drift_ms must be >= 0, not {max_drift_ms}")
    start = {int(p): int(o) for p, o in start.items()}
    latest = {p: max(start[p], int(latest.get(p, start[p]))) for p in start}
    ends = dict(start)
    offered = prorated_ends(start, latest, max_records)
    frontier = None
    for _ in range(ROUNDS):
        positions = [_position(p, start[p], offered[p], time_at) for p in start if latest[p] > start[p]]
        positions = [t for t in positions if t is not None]
        frontier = min(positions) if positions else None
        for p in start:
            ends[p] = offered[p] if frontier is None else first_after(p, ends[p], offered[p], frontier + max_drift_ms, time_at)
        if max_records is None:
            break
        spare = max_records - sum(ends[p] - start[p] for p in start)
        open_ = {p: ends[p] for p in start if ends[p] < latest[p]
                 and (frontier is None or (time_at(p, ends[p]) or 0) <= frontier + max_drift_ms)}
        if not open_ or spare < len(open_):  # (every partition offered gets at least one record)
            break
        more = prorated_ends(open_, {p: latest[p] for p in open_}, spare)
        offered = {p: more.get(p, ends[p]) for p in start}
    return ends, frontier

"""Event-time plausibility: the rule on both sides of each limit, and in a real streaming query
(the watermark it reads from the offset log, quarantine before the watermark, a replayed batch)."""

import json

import numpy as np
import pytest

from keyshift.errors import ConfigurationError, JobError
from keyshift.eventtime.plausibility import (
    DAY_MS,
    TOO_FAR_AHEAD,
    TOO_FAR_BEHIND,
    TOO_FAR_IN_THE_FUTURE,
    BatchReference,
    PlausibilityLimits,
    block_medians,
    implausible_reasons,
    lower_median,
    read_batch_reference,
)
from keyshift.eventtime.windows import HOUR_MS

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
NOW = 1_795_000_000_000  # a batch timestamp in 2026
BOUND = HOUR_MS
LIMITS = PlausibilityLimits(max_ahead_ms=7 * DAY_MS, max_behind_ms=30 * DAY_MS, reference_min_events=5)
A, H = LIMITS.max_ahead_ms, LIMITS.max_behind_ms


def judge(times, watermark=0, timestamp=NOW, checked=None):
    times = np.array(times, dtype=np.int64)
    checked = np.ones(len(times), dtype=bool) if checked is None else np.array(checked)
    return implausible_reasons(times, checked, BatchReference(watermark, timestamp), BOUND, LIMITS).tolist()


W = T0 + 10 * DAY_MS  # a watermark in force: the latest event seen so far is W + BOUND

CASES = [
    # (event time of the last event, watermark, batch timestamp, expected reason of that event);
    # the chunk also holds 5 ordinary events at W + BOUND (or at T0 before any watermark)
    (W + BOUND + A, W, NOW, None),  # exactly at the ahead limit
    (W + BOUND + A + 1, W, NOW, TOO_FAR_AHEAD),  # one ms past it
    (W - H, W, NOW, None),  # exactly at the behind limit (late, not absurd)
    (W - H - 1, W, NOW, TOO_FAR_BEHIND),
    (0, W, NOW, TOO_FAR_BEHIND),  # 1970
    (4_102_444_800_000, W, NOW, TOO_FAR_IN_THE_FUTURE),  # 2100: past the batch's time first
    (NOW + A, 0, NOW, None),  # a live stream (events at the batch time): exactly A ahead of it
    (T0 + A, 0, NOW, None),  # first batch: the chunk's median (T0) is the reference
    (T0 + A + 1, 0, NOW, TOO_FAR_AHEAD),
    (T0 - H, 0, NOW, None),
    (T0 - H - 1, 0, NOW, TOO_FAR_BEHIND),
    (0, 0, NOW, TOO_FAR_BEHIND),  # 1970 in the first batch
    (4_102_444_800_000, 0, NOW, TOO_FAR_IN_THE_FUTURE),
    (NOW + A + 1, W, NOW, TOO_FAR_IN_THE_FUTURE),
    (4_102_444_800_000, W, None, TOO_FAR_AHEAD),  # outside a streaming query: no batch time
]


@pytest.mark.parametrize(("last", "watermark", "timestamp", "reason"), CASES)
def test_rule_on_both_sides_of_each_limit(last, watermark, timestamp, reason):
    ordinary = W + BOUND if watermark else T0
    if last == NOW + A and not watermark:
        ordinary = NOW  # a live stream: events at the batch time
    got = judge([ordinary] * 5 + [last], watermark, timestamp)
    assert got == [None] * 5 + [reason]


def test_the_chunk_median_moves_the_ahead_limit_with_the_stream():
    """A backfill batch spanning more than A past the watermark, or a stream resuming after a
    pause, is judged against its own median: most of a chunk is never quarantined."""
    jump = W + BOUND + 40 * DAY_MS
    assert judge([jump + i for i in range(5)] + [jump + A], W) == [None] * 6
    assert judge([jump + i for i in range(5)] + [jump + 4 + A + 1], W)[-1] == TOO_FAR_AHEAD


def test_a_backfill_chunk_spanning_more_than_twice_the_limit_is_judged_block_by_block():
    """hot_split at P = 32: a partition's slice of a batch spans weeks of event time, in order. Each
    event is judged against the median of its own block, so none of the slice is quarantined, while
    an absurd event inside it still is."""
    limits = PlausibilityLimits(max_ahead_ms=7 * DAY_MS, reference_min_events=5, reference_block_events=100)
    span = np.arange(1_000) * (60 * DAY_MS // 1_000) + T0  # 60 days over 1,000 events
    reasons = implausible_reasons(span, np.ones(1_000, dtype=bool), BatchReference(0, NOW), BOUND, limits)
    assert reasons.tolist() == [None] * 1_000
    whole_chunk = PlausibilityLimits(max_ahead_ms=7 * DAY_MS, reference_min_events=5, reference_block_events=1_000)
    assert TOO_FAR_AHEAD in implausible_reasons(span, np.ones(1_000, dtype=bool), BatchReference(0, NOW), BOUND, whole_chunk).tolist()
    absurd = span.copy()
    absurd[500] = T0 + 400 * DAY_MS
    reasons = implausible_reasons(absurd, np.ones(1_000, dtype=bool), BatchReference(0, None), BOUND, limits).tolist()
    assert reasons[500] == TOO_FAR_AHEAD and reasons.count(None) == 999


def test_block_medians_join_a_short_last_block_and_leave_small_chunks_undefined():
    times = np.arange(23, dtype=np.float64)
    medians = block_medians(times, 10, 5)
    assert medians[:10].tolist() == [4.0] * 10 and medians[10:].tolist() == [16.0] * 13  # 20..22 joined 10..19
    assert np.isnan(block_medians(np.arange(4, dtype=np.float64), 10, 5)).all()


def test_a_small_first_chunk_has_no_stream_reference():
    """Below reference_min_events only the batch time limits a first-batch chunk (documented)."""
    assert judge([T0, 0, T0 + 100 * DAY_MS]) == [None, None, None]
    assert judge([T0, 4_102_444_800_000]) == [None, TOO_FAR_IN_THE_FUTURE]


def test_a_minority_cannot_pull_the_median():
    assert judge([T0] * 3 + [4_000_000_000_000] * 2, timestamp=None) == [None] * 3 + [TOO_FAR_AHEAD] * 2


def test_unchecked_rows_are_neither_judged_nor_counted_in_the_median():
    got = judge([T0] * 5 + [0, 4_000_000_000_000], timestamp=None, checked=[True] * 5 + [False, False])
    assert got == [None] * 7
    assert judge([], timestamp=None) == []


def test_lower_median_is_an_element():
    assert lower_median(np.array([5, 1, 3, 2])) == 2
    assert lower_median(np.array([7])) == 7


@pytest.mark.parametrize("name", ["max_ahead_ms", "max_behind_ms", "reference_min_events", "reference_block_events"])
def test_limits_must_be_positive(name):
    with pytest.raises(ConfigurationError, match=name):
        PlausibilityLimits(**{name: 0})


def test_a_missing_offset_log_fails_loudly(tmp_path):
    with pytest.raises(JobError, match="checkpoint"):
        read_batch_reference(tmp_path, 3)


# --- in a real streaming query -------------------------------------------------------------


def test_the_batch_reference_is_the_one_spark_logged_and_replays(spark, tmp_path):
    """The driver reads each batch's W and T from Spark's offset log (and publishes them to the
    tasks, `keyshift.eventtime.batch_channel`): the values Spark itself runs the batch with, and
    the same when Spark replays the batch after a crash."""
    from pyspark.sql import functions as F

    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    latest = T0 + 9_000
    (source / "a.json").write_text("\n".join(json.dumps({"t": T0 + i * 1_000}) for i in range(10)) + "\n")
    (source / "b.json").write_text(json.dumps({"t": latest + 1}) + "\n")

    def run() -> tuple[dict[int, int], object]:
        frame = spark.readStream.schema("t LONG").option("maxFilesPerTrigger", 1).json(str(source))
        timed = frame.withColumn("ts", F.timestamp_millis("t")).withWatermark("ts", f"{BOUND} milliseconds")
        seen: dict[int, int] = {}

        def judge(batch, b: int) -> None:  # as ClockedBatches: read the reference, then run the batch
            seen[b] = read_batch_reference(checkpoint, b).watermark_ms
            batch.count()

        query = timed.writeStream.foreachBatch(judge)\
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        query.awaitTermination(120)
        return seen, query

    seen, query = run()
    assert seen == {0: 0, 1: latest - BOUND}
    assert query.lastProgress["eventTime"]["watermark"] == "2000-12-31T23:00:09.000Z"  # Spark's own: latest - BOUND
    reference = read_batch_reference(checkpoint, 1)
    assert reference.timestamp_ms is not None and reference.timestamp_ms > NOW - 400 * DAY_MS

    for name in ("1", ".1.crc"):  # a crash before batch 1 committed: Spark replays it, same reference
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    replayed, _ = run()
    assert replayed == {1: latest - BOUND} and read_batch_reference(checkpoint, 1) == reference

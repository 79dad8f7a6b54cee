"""Event-time plausibility: quarantine events whose time is absurd relative to the stream.

One event with `event_time` in 2100 would move the watermark (max event time seen - bound) so far
that every later event of every key is late; one in 1970 would open a window decades behind the
stream. Such an event is not data: it goes to the dead-letter output with a reason, is counted
as a dead letter (so events read = Σ window counts + late + dead letters + pending still holds),
and never reaches the watermark operator. The check therefore runs before Spark's
`withWatermark`: in a job, inside the ingest stage (`keyshift.processing.operators.ingest`, with
`implausible_reasons`).

The rule, for an event with event time t (ms) in micro-batch b:

- W = the watermark in force for batch b and T = the batch's timestamp (its processing time,
  ms), both read from Spark's offset log `<checkpoint>/offsets/<b>` (`batchWatermarkMs`,
  `batchTimestampMs`). Spark writes that file before it runs the batch and reads it back when it
  replays the batch after a crash, so a replay sees the same W and T. T is a wall clock, but
  the one recorded for the batch, never the clock of the replay. W = 0 means no watermark yet.
  In keyshift's jobs W is the event's own Kafka partition's: its clock before the batch minus
  the delay (`keyshift.eventtime.partition_clocks`, written before the batch and read back on a
  replay, like the offset log), 0 before the partition's first event; so a partition that a
  backfill reads months behind another is judged against itself, never against the fastest
  (`keyshift.processing.operators.ingest.IngestContext.partition_reference`). The driver reads
  the offset log and the clocks and publishes them to the tasks before the batch runs
  (`keyshift.eventtime.batch_channel`): no executor reads the checkpoint.
- The chunk: the records the engine's ingest stage (`keyshift.processing.operators.ingest`) is handed at
  once, `spark.sql.execution.arrow.maxRecordsPerBatch` Kafka records (default 10,000) of one
  Kafka partition's slice of the batch, in offset order, counted from the slice's start (a
  coalesced ingest task reading several partitions re-cuts Spark's batches so,
  `keyshift.processing.operators.ingest.kafka_partition_chunks`); the same records on a replay with the
  same configuration. Its events are the run's valid records in it. The chunk's events are cut, in offset order,
  into blocks of `reference_block_events` (K, default 1,000); a last block of fewer than
  `reference_min_events` (S) events joins the one before it. m = the lower median of the event
  times of the event's own block when that block holds at least S events, else undefined. A
  block, not the whole chunk, so that a backfill whose chunk spans more event time than 2A
  (hot_split at P = 32 on the flights: a partition's 7,800 events of a batch span about two
  weeks) is judged against the events near it.
- "too far in the future": t > T + A (A = `max_ahead_ms`). Needs no history, so it also holds
  in the first batch and in small chunks.
- "too far ahead of the stream": t > F + A, where F = max(W + B, m) over the defined ones
  (B = the watermark bound, so W + B is the latest event time seen before batch b). The median
  keeps a batch that spans more event time than A (a backfill) and a stream resuming after a
  pause from being quarantined; it cannot be pulled far by fewer than half of a block.
- "too far behind the stream": t < R - H (H = `max_behind_ms`), R = W when W > 0, else m. An
  event behind W but within H is late, as before: it goes to the late output.
- Otherwise the event is plausible. The first rule that holds gives the reason, in the order
  above.

Limits: in the first batch (W = 0) a block of fewer than S events has no reference but the
batch time, so a 1970 event in such a block passes (it is then emitted as its own old window).
A stream that pauses for longer than A and then delivers fewer than S events per chunk is
quarantined until a chunk of S events arrives; raise A for such a stream. Changing
`maxRecordsPerBatch` between a crash and its resume changes the chunks, so a replayed batch may
classify differently: keep it fixed for a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keyshift.checkpoint_files import CheckpointFiles, join
from keyshift.errors import ConfigurationError, JobError

DAY_MS = 86_400_000
"""One day of event time, in milliseconds."""

TOO_FAR_IN_THE_FUTURE = "event_time too far in the future"
TOO_FAR_AHEAD = "event_time too far ahead of the stream"
TOO_FAR_BEHIND = "event_time too far behind the stream"
REASONS = (TOO_FAR_IN_THE_FUTURE, TOO_FAR_AHEAD, TOO_FAR_BEHIND)
"""The dead-letter reasons of this rule, in the order it checks them."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The task-local property Spark's micro-batch execution sets to the batch id (pyspark 4.2)."""


@dataclass(frozen=True)
class PlausibilityLimits:
    """The limits of the plausibility rule (see the module docstring).

    Attributes:
        max_ahead_ms: A, ms of event time an event may be ahead of the stream (and of its
            batch's timestamp). Default 7 days: more than half the event time a 10,000-record
            chunk of one partition spans in a flights-3m backfill (about 5 days at P = 8).
        max_behind_ms: H, ms of event time an event may be behind the watermark (or, in the
            first batch, its block's median). Default 30 days.
        reference_min_events: S, events a block needs for its median to count as a reference.
            Default 50.
        reference_block_events: K, events per block of a chunk (the median's reach). Default
            1,000: about two days of event time of one partition of the flights at P = 32.

    Raises:
        ConfigurationError: a limit < 1.
    """

    max_ahead_ms: int = 7 * DAY_MS
    max_behind_ms: int = 30 * DAY_MS
    reference_min_events: int = 50
    reference_block_events: int = 1_000

    def __post_init__(self) -> None:
        for name in ("max_ahead_ms", "max_behind_ms", "reference_min_events", "reference_block_events"):
            if int(getattr(self, name)) < 1:
                raise ConfigurationError(f"plausibility limit {name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class BatchReference:
    """What the rule knows of the stream when a micro-batch runs.

    Attributes:
        watermark_ms: Spark's watermark in force for the batch (ms; 0 before the first one).
        timestamp_ms: the batch's timestamp (ms since the epoch), or None outside a streaming
            query (the "in the future" rule is then off).
    """

    watermark_ms: int = 0
    timestamp_ms: int | None = None


def read_batch_reference(checkpoint_dir: str | Path, batch_id: int) -> BatchReference:
    """The watermark and timestamp Spark recorded for `batch_id` in its offset log (read by the
    driver: a local folder or a Hadoop URI, `keyshift.checkpoint_files`).

    `offsets/<batch_id>` holds a version line (`v1`), one JSON line of batch metadata
    (`batchWatermarkMs`, `batchTimestampMs`, `conf`) and one line per source.

    Raises:
        JobError: the file is missing or unreadable (the checkpoint is not the query's: pass the
            query's `checkpointLocation` to the pipeline).
    """
    path = join(checkpoint_dir, "offsets", str(int(batch_id)))
    try:
        metadata = json.loads(CheckpointFiles(checkpoint_dir).read_text(f"offsets/{int(batch_id)}").splitlines()[1])
        return BatchReference(int(metadata.get("batchWatermarkMs", 0)), int(metadata["batchTimestampMs"]))
    except (OSError, IndexError, KeyError, ValueError) as error:
        raise JobError(
            f"cannot read batch {batch_id}'s watermark from {path} ({error}); the driver reads it from the query's "
            "checkpoint location before the batch runs"
        ) from error


def lower_median(values: np.ndarray) -> float:
    """The lower median of a non-empty array: an element of it, so no rounding between two."""
    return float(np.partition(values, (len(values) - 1) // 2)[(len(values) - 1) // 2])


def block_medians(event_times_ms: np.ndarray, block_events: int, min_events: int) -> np.ndarray:
    """Each event's reference m: the lower median of its block (module docstring).

    Args:
        event_times_ms: float64 event times (ms) of one chunk, in offset order.
        block_events: K, events per block.
        min_events: S; a last block of fewer than S events joins the one before it, and a block
            (then the whole chunk) of fewer than S events has no median.

    Returns:
        float64 array of the same length: the median of the event's block, NaN where undefined.
    """
    count = len(event_times_ms)
    medians = np.full(count, np.nan)
    starts = list(range(0, count, block_events))
    if len(starts) > 1 and count - starts[-1] < min_events:
        starts.pop()
    for start, end in zip(starts, starts[1:] + [count]):
        if end - start >= min_events:
            medians[start:end] = lower_median(event_times_ms[start:end])
    return medians


def implausible_reasons(
    event_times_ms: np.ndarray,
    checked: np.ndarray,
    reference: BatchReference,
    bound_ms: int,
    limits: PlausibilityLimits,
) -> np.ndarray:
    """The plausibility rule (module docstring) over one chunk.

    Args:
        event_times_ms: event times (ms since the epoch, UTC), one per row; compared as float64,
            exact up to 2^53 ms (year 287,396), so any time beyond is still far ahead.
        checked: bool array of the same length: which rows are events to judge (the others, e.g.
            rejected records or end-of-input markers, get None and are not in the median).
        reference: the batch's watermark and timestamp.
        bound_ms: B, the watermark bound (ms).
        limits: A, H and S.

    Returns:
        An object array: None for a plausible event (or an unchecked row), else its reason, one
        of `REASONS`.
    """
    times = np.asarray(event_times_ms, dtype=np.float64)
    checked = np.asarray(checked, dtype=bool)
    reasons = np.full(len(times), None, dtype=object)
    events = times[checked]
    if not len(events):
        return reasons
    medians = block_medians(events, limits.reference_block_events, limits.reference_min_events)
    if reference.watermark_ms > 0:
        ahead_anchor = np.fmax(medians, float(reference.watermark_ms + bound_ms))
        behind_anchor = np.full(len(events), float(reference.watermark_ms))
    else:
        ahead_anchor = behind_anchor = medians

    found = np.full(len(events), None, dtype=object)
    # assigned from the last rule to the first, so the first rule that holds wins; NaN = no anchor
    with np.errstate(invalid="ignore"):
        found[events < behind_anchor - limits.max_behind_ms] = TOO_FAR_BEHIND
        found[events > ahead_anchor + limits.max_ahead_ms] = TOO_FAR_AHEAD
    if reference.timestamp_ms is not None:
        found[events > reference.timestamp_ms + limits.max_ahead_ms] = TOO_FAR_IN_THE_FUTURE
    reasons[checked] = found
    return reasons

"""The driver's side of the partition clocks: prepare each batch's clocks before it runs, seal them after.

A `foreachBatch` function wrapped by `ClockedBatches` first makes sure the clocks in force for the
batch are on disk (`keyshift.eventtime.partition_clocks.PartitionClockStore.prepare`: written once,
read back unchanged when Spark replays the batch) and publishes them, with the batch's Spark
watermark and timestamp from the offset log, on the run's batch channel
(`keyshift.eventtime.batch_channel`); then it lets the job's sink run the batch (the ingest tasks
read that context and report what they read while the sink's actions run), then folds the
reports into the clocks after the batch (`seal`) before Spark commits it. A batch the sink
refuses (a switch's or a stop's barrier) is not sealed: it never ran.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from keyshift.checkpoint_files import checkpoint_name
from keyshift.eventtime.batch_channel import BatchChannel
from keyshift.eventtime.partition_clocks import PartitionClockStore, listed_partitions
from keyshift.eventtime.plausibility import read_batch_reference

log = logging.getLogger(__name__)


class ClockedBatches:
    """A `foreachBatch` function that keeps the run's partition clocks around `inner`.

    Args:
        inner: the job's `foreachBatch` function, `(DataFrame, query batch id) -> None`.
        run_dir: `runs/<run_id>/` (the clocks live in its `partition-clocks/`).
        checkpoint: the query's checkpoint location, a path or a Hadoop URI (its offset log lists
            the input's partitions and gives the batch's watermark; its last name tags the ingest
            tasks' reports).
        batch_base: the run-wide id of the query's batch 0.
        idle_timeout_s: seconds of processing time after which a partition without records is idle.
        end_offsets: returns a bounded run's input end (partition -> first offset past it) as the
            driver knows it now, None while unknown or without `--limit`; fixed in each batch's
            clocks when it is prepared (`PartitionClocks.end_offsets`).
        channel: the run's batch channel, which the job's ingest tasks read (`job_stream`'s
            `batch_channel`).
    """

    def __init__(self, inner: Callable, run_dir: Path, checkpoint: Path, batch_base: int, idle_timeout_s: float,
                 end_offsets: Callable[[], dict[int, int] | None], channel: BatchChannel) -> None:
        self.inner = inner
        self.end_offsets = end_offsets
        self.channel = channel
        self.store = PartitionClockStore(run_dir)
        self.checkpoint = checkpoint
        self.batch_base = int(batch_base)
        self.idle_timeout_ms = int(round(float(idle_timeout_s) * 1000))

    def __call__(self, batch, query_batch_id: int) -> None:
        """Prepare, publish, run and seal one micro-batch (module docstring).

        Raises:
            JobError: the offset log lacks the batch, or a clocks file or a task report is not valid.
            StackError: Redis failed (the batch is not committed; Spark replays it on restart).
        """
        batch_id = self.batch_base + int(query_batch_id)
        clocks = self.store.prepare(batch_id, int(time.time() * 1000), self.idle_timeout_ms,
                                    listed_partitions(self.checkpoint, query_batch_id), self.end_offsets())
        self.channel.publish(batch_id, clocks, read_batch_reference(self.checkpoint, query_batch_id))
        idle = clocks.idle()
        reference = clocks.reference_ms()
        log.debug("batch %d: partition clocks: reference %s, drift %.1f h, idle partitions %s", batch_id,
                  _when(reference), clocks.drift_ms() / 3_600_000, idle or "none")
        if idle:
            log.info("batch %d: partitions %s idle (no records for more than %.0f s): left out of the watermark until their "
                     "next record", batch_id, idle, self.idle_timeout_ms / 1000)
        self.inner(batch, query_batch_id)
        query = checkpoint_name(self.checkpoint)
        self.store.seal(batch_id, query, self.channel.reports(batch_id, query))
        if batch_id > self.batch_base:
            self.channel.forget(batch_id - 1, query)


def partition_clock_summary(run_dir: Path) -> dict:
    """The run's partition clocks for its summary: `max_partition_drift_ms` (the largest
    event-time spread between active partitions at any batch start, ms), `idle_partition_batches`
    (batches that started with at least one idle partition) and `partition_clocks_batches`."""
    history = PartitionClockStore(run_dir).history()
    return {"max_partition_drift_ms": max((c.drift_ms() for c in history), default=0),
            "idle_partition_batches": sum(1 for c in history if c.idle()), "partition_clocks_batches": len(history)}


def _when(ms: float) -> str:
    """An event time (ms) as ISO 8601 UTC, or 'none' / 'unknown' for +inf / -inf."""
    if ms == float("inf"):
        return "none (no active partition)"
    if ms == float("-inf"):
        return "unknown (a partition has no event yet)"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")

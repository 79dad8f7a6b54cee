"""Where the keyed window processor's output goes, batch by batch (`foreachBatch`).

Topics, the windows table's columns and the alert rule come from the job's spec
(`keyshift.jobs.spec.JobSpec`); the flights' names below are one example.

Per micro-batch the sink collects the processor's output (windows, late events, dead letters and
per-slot loads: small next to the input) to the driver once, then
- writes the final windows to one Parquet file `runs/<run_id>/windows/part-<batch>.parquet`
  (rewritten, not appended, if Spark replays the batch), with exactly the columns
  `WINDOW_COLUMNS` and UTC timestamps;
- sends alerts to `flight-delay-alerts`, late events to `flights-late` and dead letters with their
  reason to `flights-dead-letter` (JSON values) in one Kafka transaction per batch, exactly once
  for `read_committed` consumers (`keyshift.processing.outputs.side_outputs`);
- records the batch's counts in `runs/<run_id>/batches/` (`keyshift.processing.outputs.ledger`), so the
  run's totals survive a crash of the driver and a replayed batch is never counted twice;
- for a spec with `redis_windows` (YSB), also writes each final window's count and update time
  to Redis (`keyshift.processing.outputs.redis_windows`), right after the windows file.

Rows in the dead-letter lane with reason `filtered` (`keyshift.processing.operators.records.FILTERED`)
stand for `count` records a spec's `keep` rule left out: they are counted as `filtered_events`,
never sent or counted as dead letters.

A key that hot_split spread over several slots closes each window on every slot that holds a
piece of it, all in the same micro-batch (the watermark, and so every event-time timer, is one
per batch). `merge_split_windows` folds those pieces into one window (counts and sums add, max
maxes, mean and alert recomputed) before anything is written or alerted, so the windows table is
what a single-slot placement gives.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from keyshift.checkpoint_files import CheckpointFiles
from keyshift.errors import JobError
from keyshift.processing.failpoints import failpoint, hold, hold_here
from keyshift.processing.outputs.ledger import BatchCounts, RunLedger, run_totals
from keyshift.processing.outputs.pieces import PieceAssembler, merge_window_rows
from keyshift.processing.operators.processor import KIND_DEAD_LETTER, KIND_LATE, KIND_LOAD, KIND_WATERMARK, KIND_WINDOW
from keyshift.processing.operators.records import FILTERED
from keyshift.jobs.spec import JobSpec, window_table_schema
from keyshift.names import RunDir

log = logging.getLogger(__name__)



def window_row_columns(spec: JobSpec) -> tuple[str, ...]:
    """The columns of the processor's output (`keyshift.processing.operators.processor.output_schema`) that a
    `window` row uses: slot, the key, window_start_ms, window_end_ms, count, the aggregates and the
    outputs. The sink keeps only these for windows: the other kinds' columns are all NULL in window
    rows, and pandas' `concat` of frames with all-NULL columns checks them value by value (290 ms
    per `concat` on a frame of 36,000 window rows shaped like a P = 32 hot_split batch, against 4 ms
    without them)."""
    return ("slot", spec.key, "window_start_ms", "window_end_ms", "count", *spec.aggregate_names, *spec.outputs)


def merge_split_windows(windows: pd.DataFrame, spec: JobSpec) -> tuple[pd.DataFrame, int]:
    """Merge the pieces of split keys' windows: one row per (key, window_start_ms).

    Args:
        windows: `window` rows of one micro-batch (`keyshift.processing.operators.processor.output_schema`
            columns); a window of a key split over k slots appears up to k times, one per slot.
        spec: the job.

    Returns:
        (windows with one row per window, pieces merged away: input rows - output rows); see
        `merge_window_rows`. Rows of unsplit windows are returned unchanged.
    """
    if windows.empty:
        return windows, 0
    duplicated = windows.duplicated([spec.key, "window_start_ms"], keep=False).to_numpy()
    if not duplicated.any():
        return windows, 0
    merged = merge_window_rows(windows[duplicated], spec)
    result = pd.concat([windows[~duplicated], merged], ignore_index=True)
    return result, int(duplicated.sum()) - len(merged)


class BatchRefused(RuntimeError):
    """Raised by the sink for a micro-batch past the cut where its query stops (a switch or a
    stop request, `stop_at_batch_boundary`): nothing of the batch is run or written, and Spark
    does not commit it."""


class RefusedBatchLogFilter(logging.Filter):
    """Drop py4j's ERROR record with traceback for a `BatchRefused`, logging one INFO line instead.

    A refused batch is the expected end of a query stopped at a batch boundary, not a failure:
    py4j's callback server logs every exception a Python `foreachBatch` raises with its full
    traceback (`py4j.clientserver`, "There was an exception while executing the Python Proxy"),
    which on a terminal reads as a crash after a clean Ctrl-C. Other exceptions pass unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) for a record carrying a `BatchRefused`; True otherwise."""
        refused = record.exc_info[1] if record.exc_info else None
        if isinstance(refused, BatchRefused):
            log.info("%s; Spark ends the query on it (its \"terminated with error\" line is this refusal): nothing of the "
                     "batch is written or committed, and a resume reads it again", refused)
            return False
        return True


_REFUSED_BATCH_FILTER = RefusedBatchLogFilter()


def quiet_refused_batches() -> None:
    """Install `RefusedBatchLogFilter` on py4j's callback-server logger (once per process)."""
    py4j_log = logging.getLogger("py4j.clientserver")
    if _REFUSED_BATCH_FILTER not in py4j_log.filters:
        py4j_log.addFilter(_REFUSED_BATCH_FILTER)


def stop_at_batch_boundary(query, sink: "KeyedWindowSink", checkpoint: Path, timeout_s: float = 300.0) -> None:
    """Stop `query` at a batch boundary: refuse every batch that has not reached the sink (the
    sink's barrier), let the one in the sink finish and be committed, then stop.

    `StreamingQuery.stop()` alone interrupts whatever batch runs: one stopped after the sink
    wrote its outputs and ledger but before Spark's commit leaves the ledger and the windows
    table a batch ahead of the checkpoint (whose state then counts that batch's events as not
    yet read). Used by a switch (the cut) and by a stop request.

    Args:
        query: the running `StreamingQuery`. sink: its foreachBatch sink (or the sink a
            `GlobalMergeSink` wraps). checkpoint: the query's checkpoint folder.
        timeout_s: seconds to wait for the batch in the sink to be committed.

    Raises:
        JobError: the batch in the sink was not committed within `timeout_s`.
    """
    sink.close_barrier()
    deadline = time.monotonic() + timeout_s
    files = CheckpointFiles(checkpoint)
    while True:
        if query.exception() is not None and not query.isActive:
            break  # it stopped on the barrier (or failed: the cut is read from the checkpoint all the same)
        last = sink.last_query_batch
        if not sink.in_flight and (last is None or files.exists(f"commits/{last}")):
            break
        if time.monotonic() > deadline:
            raise JobError(f"the batch in the sink was not committed within {timeout_s:.0f} s; the query cannot stop at a batch boundary")
        time.sleep(0.05)
    query.stop()


class KeyedWindowSink:
    """The `foreachBatch` function of a keyed window job.

    Per micro-batch, in this order, each step safe to repeat when Spark replays the batch after
    a crash: the windows file (rewritten whole), the side outputs (one Kafka transaction that
    skips a batch already committed, `keyshift.processing.outputs.side_outputs`), the batch's counts
    (`keyshift.processing.outputs.ledger`, rewritten). Spark commits the batch after this returns.

    Args:
        spec: the job (key, windows table, alert rule, topics).
        run_dir: `runs/<run_id>/`; windows go to `run_dir/windows/`, counts to `run_dir/batches/`.
        run_id: written into alert, late and dead-letter records.
        epoch: assignment epoch, the windows table's `epoch` column.
        partitions: P slots, the length of `per_slot_events`.
        side_outputs: a `TransactionalSideOutputs` for alerts, late events and dead letters, or
            None to skip the Kafka side outputs (tests of the windows alone).
        batch_base: the run-wide id of this query's batch 0: a run that a switch carried over
            several queries (segments) numbers its batches on, so the ledger, the windows files
            and the side-output transactions see one sequence (`keyshift.migration.switch`).
        pieces: in a per-key watermark mode, the `PieceAssembler` that holds split keys' window
            pieces until every piece has closed the window; None (global mode): the pieces of a
            window all close in one batch and `merge_split_windows` folds them there.

    Attributes:
        counters: the run's totals so far, including batches recorded before a crash (read back
            from the ledger at construction).
    """

    TABLE = RunDir.WINDOWS
    """The output table's folder under the run's folder."""

    def __init__(self, spec: JobSpec, run_dir: Path, run_id: str, epoch: int, partitions: int, side_outputs=None, batch_base: int = 0,
                 pieces: PieceAssembler | None = None, redis_windows=None) -> None:
        self.spec = spec
        self._table_schema = window_table_schema(spec)
        self.run_dir = Path(run_dir)
        self.windows_dir = Path(run_dir) / self.TABLE
        self.windows_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.epoch = epoch
        self.partitions = partitions
        self.side_outputs = side_outputs
        self.ledger = RunLedger(run_dir)
        self._batches = {batch.batch_id: batch for batch in self.ledger.batches()}
        self.counters = run_totals(self._batches.values(), partitions)
        self.batch_slot_events: dict[int, list[int]] = {b: list(c.per_slot_events) for b, c in self._batches.items()}
        self.last_batch_id = max(self._batches, default=-1)
        self.batch_base = batch_base
        self.pieces = pieces
        if spec.redis_windows and redis_windows is None:
            import redis

            from keyshift.processing.outputs.redis_windows import RedisWindowWriter
            from keyshift.settings import Settings

            redis_windows = RedisWindowWriter(redis.Redis.from_url(Settings().redis_url, socket_timeout=30), run_id, spec.key)
        self.redis_windows = redis_windows
        self.barrier = threading.Event()
        self.in_flight = False
        self.hold_until_barrier: Callable[[], bool] | None = None  # a test's failpoint (`driver_switch.hold_markers_batch`)
        self.hold_after_outputs_of: int | None = None  # a test's failpoint (`driver_switch.hold_new_query_batch`)
        self.last_query_batch: int | None = None
        self.handover_batch: int | None = None  # the query batch that hands the state over (a switch's barrier batch)
        self._handover_next = False
        self._handover_switch: str | None = None
        self._lock = threading.Lock()
        self._gate = threading.Lock()

    def __call__(self, batch: DataFrame, query_batch_id: int) -> None:
        """Route one micro-batch of processor output; called by Spark on the driver.

        Raises:
            BatchRefused: the barrier was set (`close_barrier`) before this batch reached the
                sink: nothing of it is run or written and Spark does not commit it.
        """
        if self.hold_until_barrier is not None and self.hold_until_barrier():
            self.barrier.wait(timeout=300)
        self.admit(query_batch_id)
        try:
            self._route(batch, self.batch_base + query_batch_id)
        finally:
            self.release(query_batch_id)

    def admit(self, query_batch_id: int) -> None:
        """Let query batch `query_batch_id` into the sink (`in_flight`), unless the barrier is set.

        Raises:
            BatchRefused: the barrier is set (`close_barrier`).
        """
        with self._gate:  # with close_barrier: a batch is either in flight or refused, never in between
            if self.barrier.is_set():
                raise BatchRefused(f"batch {query_batch_id} refused: the query stops at the batch boundary before it (a switch or a stop)")
            self.in_flight = True
            if self._handover_next:  # the switch's barrier batch: the last this query runs
                self._handover_next = False
                self.handover_batch = query_batch_id
                quiet_refused_batches()
                self.barrier.set()

    def release(self, query_batch_id: int) -> None:
        """Query batch `query_batch_id` has left the sink (written, or failed)."""
        self.last_query_batch = query_batch_id
        self.in_flight = False

    def request_handover(self, switch_id: str) -> bool:
        """Make the next batch admitted switch `switch_id`'s barrier batch: it runs whole, its
        processor hands every slot token's state over (`keyshift.processing.operators.handover`,
        written to `RunDir.handover(switch_id, batch)`), and every batch after it is refused.
        Returns False (nothing asked) when the barrier is already set."""
        with self._gate:
            if self.barrier.is_set():
                return False
            self._handover_next = True
            self._handover_switch = switch_id
            return True

    def withdraw_handover(self) -> bool:
        """Withdraw `request_handover` if no batch was admitted for it yet; returns whether it was
        withdrawn (False: the barrier batch is admitted already, or nothing was asked)."""
        with self._gate:
            if not self._handover_next:
                return False
            self._handover_next = False
            return True

    def close_barrier(self) -> None:
        """Refuse every batch that has not been admitted yet; one admitted stays `in_flight`
        until it leaves."""
        quiet_refused_batches()
        with self._gate:
            self.barrier.set()

    def _route(self, batch: DataFrame, batch_id: int) -> None:
        failpoint("sink.before_batch", batch_id)
        if self.handover_batch is None or batch_id != self.batch_base + self.handover_batch:
            self.route_rows(batch.toPandas(), batch_id)
            return
        from keyshift.processing.operators.handover import HANDOVER_PROPERTY
        from keyshift.processing.outputs.handover import split_snapshot, write_snapshot

        context = batch.sparkSession.sparkContext
        context.setLocalProperty(HANDOVER_PROPERTY, "1")  # this thread's jobs: the batch's (module handover)
        try:
            out = batch.toPandas()
        finally:
            context.setLocalProperty(HANDOVER_PROPERTY, None)
        out, snapshot = split_snapshot(out)
        if snapshot is None:
            log.warning("batch %d: the barrier batch handed no state over; the switch reads the checkpoint", batch_id)
        else:
            write_snapshot(snapshot, self.spec.key, RunDir(self.run_dir).handover(self._handover_switch, batch_id))
        self.route_rows(out, batch_id)

    def route_rows(self, out: pd.DataFrame, batch_id: int) -> None:
        """Route one batch's processor output rows (`output_schema(spec)` columns, collected),
        run-wide batch id `batch_id`: windows, side outputs, ledger, counters (module docstring)."""
        by_kind = {kind: rows for kind, rows in out.groupby("kind", sort=False)}
        loads = by_kind.get(KIND_LOAD, out.iloc[0:0])
        windows = by_kind.get(KIND_WINDOW, out.iloc[0:0])[list(window_row_columns(self.spec))]
        late = by_kind.get(KIND_LATE, out.iloc[0:0])
        dead = by_kind.get(KIND_DEAD_LETTER, out.iloc[0:0])
        filtered = 0
        if self.spec.keep is not None and len(dead):
            is_filtered = (dead["dead_letter_reason"] == FILTERED).to_numpy()
            filtered = int(dead.loc[is_filtered, "count"].sum())
            dead = dead[~is_filtered]
        if self.pieces is not None:
            marks = by_kind.get(KIND_WATERMARK, out.iloc[0:0])
            fallback = out["global_watermark_ms"].max() if len(out) else None
            fallback = None if fallback is None or pd.isna(fallback) else int(fallback)
            windows, merged_pieces = self.pieces.assemble(windows, marks, fallback, batch_id)
        else:
            windows, merged_pieces = merge_split_windows(windows, self.spec)

        slot_events = [0] * self.partitions
        for slot, count in zip(loads["slot"], loads["count"]):
            slot_events[int(slot)] += int(count)

        if len(windows):
            self._write_windows(windows, batch_id)
            if self.redis_windows is not None:
                self.redis_windows.write(windows)
        if self.side_outputs is not None:
            topics = self.spec.topics
            alerts = windows[windows[self.spec.alert].astype(bool)] if len(windows) and self.spec.alert else windows.iloc[0:0]
            self.side_outputs.send_batch(batch_id, [
                *self._records(topics.alerts, alerts, self._alert_record),
                *self._records(topics.late, late, self._late_record),
                *self._records(topics.dead_letter, dead, self._dead_letter_record),
            ])
        counts = BatchCounts(
            batch_id=batch_id,
            windows_emitted=len(windows),
            sum_window_counts=int(windows["count"].sum()) if len(windows) else 0,
            alerts=int(windows[self.spec.alert].astype(bool).sum()) if len(windows) and self.spec.alert else 0,
            late_events=len(late),
            dead_letters=len(dead),
            filtered_events=filtered,
            merged_window_pieces=merged_pieces,
            per_slot_events=slot_events,
            dead_letters_by_reason={str(r): int(n) for r, n in dead["dead_letter_reason"].value_counts().items()} if len(dead) else {},
        )
        self.ledger.record(counts)
        failpoint("sink.after_outputs", batch_id)
        hold_here("sink.hold_after_outputs", batch_id)
        if batch_id == self.hold_after_outputs_of:
            hold(f"switch.hold_first_batch (batch {batch_id})")

        with self._lock:
            replayed = batch_id in self._batches
            self._batches[batch_id] = counts
            if replayed:  # a batch recorded before a crash: its counts replace, never add
                self.counters = run_totals(self._batches.values(), self.partitions)
            else:
                self.counters.add(counts)
            self.batch_slot_events[batch_id] = slot_events
            self.last_batch_id = max(self.last_batch_id, batch_id)
        log.info(
            "batch %d: processed %d events, %d windows (%d split pieces merged), %d late, %d dead letters, %d filtered%s",
            batch_id, sum(slot_events), len(windows), merged_pieces, len(late), len(dead), filtered, " (replayed)" if replayed else "",
        )

    def _write_windows(self, windows: pd.DataFrame, batch_id: int) -> None:
        columns = {
            self.spec.key: windows[self.spec.key].astype(str).to_numpy(),
            "window_start": pd.to_datetime(windows["window_start_ms"].astype(np.int64), unit="ms", utc=True),
            "window_end": pd.to_datetime(windows["window_end_ms"].astype(np.int64), unit="ms", utc=True),
            **{c: windows[c].to_numpy() for c in self.spec.table_columns},
            "slot": windows["slot"].astype(np.int32).to_numpy(),
            "epoch": np.full(len(windows), self.epoch, dtype=np.int64),
        }
        table = pa.table({name: pa.array(columns[name], type=field.type) if name not in ("window_start", "window_end") else columns[name]
                          for name, field in zip(self._table_schema.names, self._table_schema)}, schema=self._table_schema)
        final = self.windows_dir / f"part-{batch_id:08d}.parquet"
        partial = final.with_suffix(".tmp")
        pq.write_table(table, partial)
        partial.replace(final)

    @staticmethod
    def _records(topic: str, rows: pd.DataFrame, to_record) -> list[tuple[str, bytes | None, bytes]]:
        return [(topic, *to_record(row)) for row in rows.itertuples(index=False)]

    def _plain(self, column: str, value):
        """A window column's value as JSON wants it, by its declared type: the processor's output
        reaches pandas with NULLs in other kinds' rows, so a long arrives as a float."""
        kind = "long" if column == "count" or column in self.spec.aggregate_names else self.spec.outputs.get(column)
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return None
        return {"long": int, "double": float, "boolean": bool}.get(kind, lambda v: v)(value)

    def _alert_record(self, row) -> tuple[bytes, bytes]:
        key = getattr(row, self.spec.key)
        value = {
            self.spec.key: key,
            "window_start_ms": int(row.window_start_ms),
            "window_end_ms": int(row.window_end_ms),
            **{c: self._plain(c, getattr(row, c)) for c in self.spec.alert_record_columns},
            "run_id": self.run_id,
            "epoch": self.epoch,
        }
        return key.encode(), json.dumps(value).encode()

    def _event_fields(self, row) -> dict:
        """The event's own fields (key and payload) of a late or duplicated event's row."""
        return {self.spec.key: getattr(row, self.spec.key),
                **{f.col: (int(getattr(row, f.col)) if f.dtype == "long" else getattr(row, f.col)) for f in self.spec.payload}}

    def _late_record(self, row) -> tuple[bytes, bytes]:
        value = {
            "event_id": int(row.event_id),
            **self._event_fields(row),
            "event_time": int(row.event_time_ms),
            "window_end_ms": int(row.window_end_ms),
            "watermark_ms": int(row.watermark_ms),
            "run_id": self.run_id,
        }
        return getattr(row, self.spec.key).encode(), json.dumps(value).encode()

    def _dead_letter_record(self, row) -> tuple[bytes | None, bytes]:
        """A dead letter's Kafka value: reason, raw bytes, where it was read, and the run.

        `raw_value` is the value as text when it was valid UTF-8 (`raw_encoding` = `utf-8`);
        otherwise `raw_value_base64` holds its bytes (`raw_encoding` = `base64`); a tombstone has
        `raw_encoding` null and neither field. `raw_key_base64` is the Kafka key's bytes (null
        without a key). A record rejected after parsing (a duplicated event id) carries no raw
        bytes but its `event_id` and `event` fields; its raw bytes are at its Kafka offset.
        """
        value = {"reason": row.dead_letter_reason, "raw_encoding": row.raw_encoding}
        if row.raw_encoding == "base64":
            value["raw_value_base64"] = row.raw_value
        elif row.raw_encoding == "utf-8":
            value["raw_value"] = row.raw_value
        value["raw_key_base64"] = row.raw_key_base64
        if row.event_id is not None and not pd.isna(row.event_id):
            value["event_id"] = int(row.event_id)
            value["event"] = {**self._event_fields(row), "event_time": int(row.event_time_ms)}
        value.update(kafka_partition=int(row.kafka_partition), kafka_offset=int(row.kafka_offset), run_id=self.run_id)
        return None, json.dumps(value).encode()

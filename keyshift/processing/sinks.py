"""Where the flight delay processor's output goes, batch by batch (`foreachBatch`).

Per micro-batch the sink collects the processor's output (windows, late events, dead letters and
per-slot loads: small next to the input) to the driver once, then
- writes the final windows to one Parquet file `runs/<run_id>/windows/part-<batch>.parquet`
  (rewritten, not appended, if Spark replays the batch), with exactly the columns
  `WINDOW_COLUMNS` and UTC timestamps;
- sends alerts to `flight-delay-alerts`, late events to `flights-late` and dead letters with their
  reason to `flights-dead-letter` (JSON values) in one Kafka transaction per batch, exactly once
  for `read_committed` consumers (`keyshift.processing.side_outputs`);
- records the batch's counts in `runs/<run_id>/batches/` (`keyshift.processing.ledger`), so the
  run's totals survive a crash of the driver and a replayed batch is never counted twice.

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
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from keyshift.names import ALERTS_TOPIC, DEAD_LETTER_TOPIC, LATE_TOPIC
from keyshift.processing.failpoints import failpoint
from keyshift.processing.ledger import BatchCounts, RunLedger, run_totals
from keyshift.processing.pieces import PieceAssembler
from keyshift.processing.processor import KIND_DEAD_LETTER, KIND_LATE, KIND_LOAD, KIND_WATERMARK, KIND_WINDOW, window_alerts

log = logging.getLogger(__name__)

WINDOW_COLUMNS = (
    "origin",
    "window_start",
    "window_end",
    "count",
    "sum_delay_min",
    "mean_delay_min",
    "max_delay_min",
    "alert",
    "slot",
    "epoch",
)
"""Columns of the windows table, in order."""

WINDOW_TABLE_SCHEMA = pa.schema(
    [
        ("origin", pa.string()),
        ("window_start", pa.timestamp("us", tz="UTC")),
        ("window_end", pa.timestamp("us", tz="UTC")),
        ("count", pa.int64()),
        ("sum_delay_min", pa.int64()),
        ("mean_delay_min", pa.float64()),
        ("max_delay_min", pa.int64()),
        ("alert", pa.bool_()),
        ("slot", pa.int32()),
        ("epoch", pa.int64()),
    ]
)


def merge_split_windows(windows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Merge the pieces of split keys' windows: one row per (origin, window_start_ms).

    Args:
        windows: `window` rows of one micro-batch (`keyshift.processing.processor.OUTPUT_SCHEMA`
            columns); a window of a key split over k slots appears up to k times, one per slot.

    Returns:
        (windows with one row per window, pieces merged away: input rows - output rows). A merged
        window has count and sum_delay_min summed, max_delay_min the max, mean_delay_min and
        alert recomputed (`window_alerts`), and `slot` the lowest slot that held a piece; the
        other columns come from that piece. Rows of unsplit windows are returned unchanged.
    """
    if windows.empty:
        return windows, 0
    duplicated = windows.duplicated(["origin", "window_start_ms"], keep=False).to_numpy()
    if not duplicated.any():
        return windows, 0
    pieces = windows[duplicated].sort_values(["origin", "window_start_ms", "slot"], kind="stable")
    grouped = pieces.groupby(["origin", "window_start_ms"], sort=False)
    merged = grouped.first().reset_index()
    merged["count"] = grouped["count"].sum().to_numpy()
    merged["sum_delay_min"] = grouped["sum_delay_min"].sum().to_numpy()
    merged["max_delay_min"] = grouped["max_delay_min"].max().to_numpy()
    merged["mean_delay_min"] = merged["sum_delay_min"] / merged["count"]
    merged["alert"] = window_alerts(merged["mean_delay_min"].to_numpy(), merged["count"].to_numpy())
    result = pd.concat([windows[~duplicated], merged[windows.columns]], ignore_index=True)
    return result, len(pieces) - len(merged)


class SwitchBarrier(RuntimeError):
    """Raised by the sink for a micro-batch past a switch's cut (it is never run)."""


class FlightDelaySink:
    """The `foreachBatch` function of the flight delay job.

    Per micro-batch, in this order, each step safe to repeat when Spark replays the batch after
    a crash: the windows file (rewritten whole), the side outputs (one Kafka transaction that
    skips a batch already committed, `keyshift.processing.side_outputs`), the batch's counts
    (`keyshift.processing.ledger`, rewritten). Spark commits the batch after this returns.

    Args:
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

    def __init__(self, run_dir: Path, run_id: str, epoch: int, partitions: int, side_outputs=None, batch_base: int = 0,
                 pieces: PieceAssembler | None = None) -> None:
        self.windows_dir = Path(run_dir) / "windows"
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
        self.barrier = threading.Event()
        self.in_flight = False
        self.last_query_batch: int | None = None
        self._lock = threading.Lock()

    def __call__(self, batch: DataFrame, query_batch_id: int) -> None:
        """Route one micro-batch of processor output; called by Spark on the driver.

        Raises:
            SwitchBarrier: a switch's cut was set (`barrier`) before this batch reached the
                sink: nothing of it is run or written and Spark does not commit it.
        """
        if self.barrier.is_set():
            raise SwitchBarrier(f"batch {query_batch_id} refused: a switch stops the query at the batch before it")
        self.in_flight = True
        try:
            self._route(batch, self.batch_base + query_batch_id)
        finally:
            self.last_query_batch = query_batch_id
            self.in_flight = False

    def _route(self, batch: DataFrame, batch_id: int) -> None:
        failpoint("sink.before_batch", batch_id)
        out = batch.toPandas()
        by_kind = {kind: rows for kind, rows in out.groupby("kind", sort=False)}
        loads = by_kind.get(KIND_LOAD, out.iloc[0:0])
        windows = by_kind.get(KIND_WINDOW, out.iloc[0:0])
        late = by_kind.get(KIND_LATE, out.iloc[0:0])
        dead = by_kind.get(KIND_DEAD_LETTER, out.iloc[0:0])
        if self.pieces is not None:
            marks = by_kind.get(KIND_WATERMARK, out.iloc[0:0])
            fallback = out["global_watermark_ms"].max() if len(out) else None
            fallback = None if fallback is None or pd.isna(fallback) else int(fallback)
            windows, merged_pieces = self.pieces.assemble(windows, marks, fallback, batch_id)
        else:
            windows, merged_pieces = merge_split_windows(windows)

        slot_events = [0] * self.partitions
        for slot, count in zip(loads["slot"], loads["count"]):
            slot_events[int(slot)] += int(count)

        if len(windows):
            self._write_windows(windows, batch_id)
        if self.side_outputs is not None:
            alerts = windows[windows["alert"].astype(bool)] if len(windows) else windows
            self.side_outputs.send_batch(batch_id, [
                *self._records(ALERTS_TOPIC, alerts, self._alert_record),
                *self._records(LATE_TOPIC, late, self._late_record),
                *self._records(DEAD_LETTER_TOPIC, dead, self._dead_letter_record),
            ])
        counts = BatchCounts(
            batch_id=batch_id,
            windows_emitted=len(windows),
            sum_window_counts=int(windows["count"].sum()) if len(windows) else 0,
            alerts=int(windows["alert"].astype(bool).sum()) if len(windows) else 0,
            late_events=len(late),
            dead_letters=len(dead),
            merged_window_pieces=merged_pieces,
            per_slot_events=slot_events,
            dead_letters_by_reason={str(r): int(n) for r, n in dead["dead_letter_reason"].value_counts().items()} if len(dead) else {},
        )
        self.ledger.record(counts)
        failpoint("sink.after_outputs", batch_id)

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
            "batch %d: processed %d events, %d windows (%d split pieces merged), %d late, %d dead letters%s",
            batch_id, sum(slot_events), len(windows), merged_pieces, len(late), len(dead), " (replayed)" if replayed else "",
        )

    def _write_windows(self, windows: pd.DataFrame, batch_id: int) -> None:
        table = pa.table(
            {
                "origin": windows["origin"].astype(str).to_numpy(),
                "window_start": pd.to_datetime(windows["window_start_ms"].astype(np.int64), unit="ms", utc=True),
                "window_end": pd.to_datetime(windows["window_end_ms"].astype(np.int64), unit="ms", utc=True),
                "count": windows["count"].astype(np.int64).to_numpy(),
                "sum_delay_min": windows["sum_delay_min"].astype(np.int64).to_numpy(),
                "mean_delay_min": windows["mean_delay_min"].astype(np.float64).to_numpy(),
                "max_delay_min": windows["max_delay_min"].astype(np.int64).to_numpy(),
                "alert": windows["alert"].astype(bool).to_numpy(),
                "slot": windows["slot"].astype(np.int32).to_numpy(),
                "epoch": np.full(len(windows), self.epoch, dtype=np.int64),
            },
            schema=WINDOW_TABLE_SCHEMA,
        )
        final = self.windows_dir / f"part-{batch_id:08d}.parquet"
        partial = final.with_suffix(".tmp")
        pq.write_table(table, partial)
        partial.replace(final)

    @staticmethod
    def _records(topic: str, rows: pd.DataFrame, to_record) -> list[tuple[str, bytes | None, bytes]]:
        return [(topic, *to_record(row)) for row in rows.itertuples(index=False)]

    def _alert_record(self, row) -> tuple[bytes, bytes]:
        value = {
            "origin": row.origin,
            "window_start_ms": int(row.window_start_ms),
            "window_end_ms": int(row.window_end_ms),
            "count": int(row.count),
            "mean_delay_min": float(row.mean_delay_min),
            "max_delay_min": int(row.max_delay_min),
            "run_id": self.run_id,
            "epoch": self.epoch,
        }
        return row.origin.encode(), json.dumps(value).encode()

    def _late_record(self, row) -> tuple[bytes, bytes]:
        value = {
            "event_id": int(row.event_id),
            "origin": row.origin,
            "destination": row.destination,
            "delay_min": int(row.delay_min),
            "distance_mi": int(row.distance_mi),
            "event_time": int(row.event_time_ms),
            "window_end_ms": int(row.window_end_ms),
            "watermark_ms": int(row.watermark_ms),
            "run_id": self.run_id,
        }
        return row.origin.encode(), json.dumps(value).encode()

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
            value["event"] = {
                "origin": row.origin,
                "destination": row.destination,
                "delay_min": int(row.delay_min),
                "distance_mi": int(row.distance_mi),
                "event_time": int(row.event_time_ms),
            }
        value.update(kafka_partition=int(row.kafka_partition), kafka_offset=int(row.kafka_offset), run_id=self.run_id)
        return None, json.dumps(value).encode()

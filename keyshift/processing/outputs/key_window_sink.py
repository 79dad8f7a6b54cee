"""Where a key-window job's output goes, batch by batch: the key_windows table and the side outputs.

The `foreachBatch` function of a spec with `window="key_windows"` (`keyshift.processing.operators.key_window_stream`).
Per micro-batch it collects `KeyWindowProcessor`'s rows to the driver once, then, each step safe to
repeat when Spark replays the batch (as `keyshift.processing.outputs.sinks.KeyedWindowSink`, whose
ledger, barrier and counters it shares):
- writes the key window updates to `runs/<run_id>/key_windows/part-<batch>.parquet` (rewritten
  whole): `KEY_WINDOW_TABLE_COLUMNS`; `keyshift.eventtime.key_windows.expand_updates` turns the
  whole table back into Spark's native sliding-window rows (count, sum, max);
- sends late events and dead letters to the job's topics in one Kafka transaction (no alerts);
- records the batch's counts in `runs/<run_id>/batches/` (`keyshift.processing.outputs.ledger`), with the
  key-window meaning of its fields: `windows_emitted` = updates, `sum_window_counts` = events
  retired (every window holding them final and emitted), `per_slot_events` = events (late
  included) + dead letters per slot. So, as for tumbling windows: events read = retired + late +
  dead letters + pending, pending being the events still kept in the state (`kept_events`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from keyshift.eventtime.key_windows import SlidingWindow
from keyshift.processing.failpoints import failpoint
from keyshift.processing.operators.key_window_processor import (
    KIND_DEAD_LETTER, KIND_KEY_WINDOW, KIND_LATE, KIND_LOAD, KIND_RETIRED, STATE_BYTES_PER_EVENT, STATE_HEADER_BYTES, WINDOW_STATE_NAME,
)
from keyshift.processing.outputs.ledger import BatchCounts, run_totals
from keyshift.processing.outputs.sinks import KeyedWindowSink
from keyshift.jobs.spec import JobSpec
from keyshift.names import RunDir

log = logging.getLogger(__name__)

KEY_WINDOW_TABLE_COLUMNS = ("start_ms", "count", "sum", "max", "watermark_ms", "slot", "epoch", "run_id")
"""Columns of the key_windows table after the key: `start_ms` (ms of event time: the first window
start the result holds for, until the key's next update), `count`, `sum`, `max` (of the spec's
value field; max NULL when count is 0), `watermark_ms` (the key's watermark that made it final),
`slot`, `epoch`, `run_id`."""


def key_window_table_schema(spec: JobSpec) -> pa.Schema:
    """Arrow schema of the key_windows table: the key (string), then `KEY_WINDOW_TABLE_COLUMNS`."""
    return pa.schema([(spec.key, pa.string()), ("start_ms", pa.int64()), ("count", pa.int64()), ("sum", pa.int64()),
                      ("max", pa.int64()), ("watermark_ms", pa.int64()), ("slot", pa.int32()), ("epoch", pa.int64()),
                      ("run_id", pa.string())])


def native_window_rows(updates: pd.DataFrame, key: str, slide_ms: int) -> int:
    """The rows Spark's native sliding-window aggregation would output for these updates, counted
    without building them: Σ over updates with count > 0 of (next update's start − start) / s.

    Args:
        updates: a key's complete updates (columns `key`, `start_ms`, `count`), any order.
        key: the key column. slide_ms: s, ms of event time.
    """
    if updates.empty:
        return 0
    ordered = updates.sort_values([key, "start_ms"], kind="stable")
    keys, starts, counts = ordered[key].to_numpy(object), ordered["start_ms"].to_numpy(np.int64), ordered["count"].to_numpy(np.int64)
    same = keys[1:] == keys[:-1]
    runs = np.where(same, starts[1:] - starts[:-1], 0) // slide_ms
    return int(runs[counts[:-1] > 0].sum())


def kept_events(spark, checkpoint: Path, batch_id: int | None = None) -> int:
    """Events kept in a key-window query's state at its last committed batch (or `batch_id`),
    read with Spark's state data source (MapState `key_window_state`: 48 + 16·n bytes per key).
    0 when the query committed no batch."""
    from keyshift.processing.spark_checkpoint import read_state_variable

    state = read_state_variable(spark, checkpoint, WINDOW_STATE_NAME, batch_id)
    if state is None:
        return 0
    states = state.select("user_map_value.state").toPandas()["state"]
    return int(sum((len(data) - STATE_HEADER_BYTES) // STATE_BYTES_PER_EVENT for data in states))


class KeyWindowSink(KeyedWindowSink):
    """The `foreachBatch` function of a key-window job (module docstring).

    Args:
        spec: a key-window job spec. window: its sliding window (size and slide, ms of event
            time): a late record's `window_end_ms` is the end of the event's first window.
        Others as `KeyedWindowSink` (no `pieces`: split keys are refused for key windows).

    Attributes:
        counters: the run's totals (`keyshift.processing.outputs.ledger.RunCounters`, module docstring).
    """

    TABLE = RunDir.KEY_WINDOWS

    def __init__(self, spec: JobSpec, window: SlidingWindow, run_dir: Path, run_id: str, epoch: int, partitions: int,
                 side_outputs=None, batch_base: int = 0) -> None:
        super().__init__(spec, run_dir, run_id, epoch, partitions, side_outputs, batch_base)
        self.window = window
        self._table_schema = key_window_table_schema(spec)

    def _route(self, batch, batch_id: int) -> None:
        failpoint("sink.before_batch", batch_id)
        out = batch.toPandas()
        by_kind = {kind: rows for kind, rows in out.groupby("kind", sort=False)}
        empty = out.iloc[0:0]
        loads, retired = by_kind.get(KIND_LOAD, empty), by_kind.get(KIND_RETIRED, empty)
        updates, late, dead = by_kind.get(KIND_KEY_WINDOW, empty), by_kind.get(KIND_LATE, empty), by_kind.get(KIND_DEAD_LETTER, empty)
        slot_events = [0] * self.partitions
        for slot, count in [*zip(loads["slot"], loads["count"]), *((s, 1) for s in dead["slot"])]:
            slot_events[int(slot)] += int(count)
        if len(updates):
            self._write_updates(updates, batch_id)
        if self.side_outputs is not None:
            topics = self.spec.topics
            self.side_outputs.send_batch(batch_id, [*self._records(topics.late, late, self._late_update_record),
                                                    *self._records(topics.dead_letter, dead, self._dead_letter_record)])
        counts = BatchCounts(
            batch_id=batch_id, windows_emitted=len(updates), sum_window_counts=int(retired["count"].sum()) if len(retired) else 0,
            late_events=len(late), dead_letters=len(dead), per_slot_events=slot_events,
            dead_letters_by_reason={str(r): int(n) for r, n in dead["dead_letter_reason"].value_counts().items()} if len(dead) else {},
        )
        self.ledger.record(counts)
        failpoint("sink.after_outputs", batch_id)
        with self._lock:
            replayed = batch_id in self._batches
            self._batches[batch_id] = counts
            if replayed:
                self.counters = run_totals(self._batches.values(), self.partitions)
            else:
                self.counters.add(counts)
            self.batch_slot_events[batch_id] = slot_events
            self.last_batch_id = max(self.last_batch_id, batch_id)
        log.info("batch %d: processed %d records, %d key window updates, %d events retired, %d late, %d dead letters%s", batch_id,
                 sum(slot_events), len(updates), counts.sum_window_counts, len(late), len(dead), " (replayed)" if replayed else "")

    def _write_updates(self, updates: pd.DataFrame, batch_id: int) -> None:
        maxes = updates["max"]
        columns = {
            self.spec.key: updates[self.spec.key].astype(str).to_numpy(),
            "start_ms": updates["start_ms"].astype(np.int64).to_numpy(),
            "count": updates["count"].astype(np.int64).to_numpy(),
            "sum": updates["sum"].astype(np.int64).to_numpy(),
            "max": pa.array(maxes.fillna(0).astype(np.int64).to_numpy(), mask=maxes.isna().to_numpy()),
            "watermark_ms": updates["watermark_ms"].astype(np.int64).to_numpy(),
            "slot": updates["slot"].astype(np.int32).to_numpy(),
            "epoch": np.full(len(updates), self.epoch, dtype=np.int64),
            "run_id": [self.run_id] * len(updates),
        }
        table = pa.table({name: pa.array(columns[name], type=field.type) if not isinstance(columns[name], pa.Array) else columns[name]
                          for name, field in zip(self._table_schema.names, self._table_schema)}, schema=self._table_schema)
        final = self.windows_dir / f"part-{batch_id:08d}.parquet"
        partial = final.with_suffix(".tmp")
        pq.write_table(table, partial)
        partial.replace(final)

    def _late_update_record(self, row) -> tuple[bytes, bytes]:
        """A late event's Kafka value: id, key, value field, event time, the end of its first
        window (ms), the watermark it was late against, the run."""
        key = getattr(row, self.spec.key)
        value = {
            "event_id": int(row.event_id), self.spec.key: key, self.spec.value_field: int(getattr(row, self.spec.value_field)),
            "event_time": int(row.event_time_ms), "window_end_ms": int(self.window.leave_ms(int(row.event_time_ms))),
            "watermark_ms": int(row.watermark_ms), "run_id": self.run_id,
        }
        return key.encode(), json.dumps(value).encode()

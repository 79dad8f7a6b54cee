"""The flight delay stateful processor: hourly windows per origin, grouped by slot token.

It runs inside `groupBy("token").transformWithStateInPandas(...)`: Spark calls it once per slot
token per micro-batch with all of that slot's rows (DESIGN.md: group by slot token, aggregate the
batch vectorized, touch state per key per batch, never per event). Per key (origin) it keeps the
pending, not yet final windows in a MapState keyed by the origin; one `getValue` and one
`updateValue` per touched key per batch.

Output rows are tagged by `kind`:
- `window`: a final window [start, start + 1 h) of an origin, emitted once when the watermark
  passes its end (an event-time timer at `end - 1`, since Spark fires timers at expiry < watermark);
- `late`: an event whose window had already closed when it arrived (window end <= watermark);
- `dead_letter`: a record that failed validation, passed through with its reason;
- `load`: one row per slot per batch: events the slot processed in the batch (`count`).
So that for every batch: input rows = Σ `load.count` and, over a run, events read =
Σ window counts + late + dead letters.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pandas as pd
from pyspark import TaskContext
from pyspark.sql import types as T
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from keyshift.eventtime.windows import HOUR_MS, window_starts_ms

KIND_WINDOW = "window"
KIND_LATE = "late"
KIND_DEAD_LETTER = "dead_letter"
KIND_LOAD = "load"

ALERT_MIN_MEAN_DELAY_MIN = 30.0
"""An origin-hour alerts when its mean delay is at least this many minutes ..."""
ALERT_MIN_COUNT = 5
"""... over at least this many flights."""

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("kind", T.StringType(), False),
        T.StructField("slot", T.IntegerType(), True),
        T.StructField("partition_id", T.IntegerType(), True),
        T.StructField("origin", T.StringType(), True),
        T.StructField("window_start_ms", T.LongType(), True),
        T.StructField("window_end_ms", T.LongType(), True),
        T.StructField("count", T.LongType(), True),
        T.StructField("sum_delay_min", T.LongType(), True),
        T.StructField("max_delay_min", T.LongType(), True),
        T.StructField("mean_delay_min", T.DoubleType(), True),
        T.StructField("alert", T.BooleanType(), True),
        T.StructField("event_id", T.LongType(), True),
        T.StructField("destination", T.StringType(), True),
        T.StructField("delay_min", T.LongType(), True),
        T.StructField("distance_mi", T.LongType(), True),
        T.StructField("event_time_ms", T.LongType(), True),
        T.StructField("watermark_ms", T.LongType(), True),
        T.StructField("dead_letter_reason", T.StringType(), True),
        T.StructField("raw_value", T.StringType(), True),
        T.StructField("kafka_partition", T.IntegerType(), True),
        T.StructField("kafka_offset", T.LongType(), True),
    ]
)
"""Schema of every row the processor emits (columns a kind does not use are NULL)."""

_OUTPUT_COLUMNS = [field.name for field in OUTPUT_SCHEMA.fields]

PENDING_KEY_SCHEMA = T.StructType([T.StructField("origin", T.StringType(), False)])
PENDING_VALUE_SCHEMA = T.StructType(
    [
        T.StructField("window_start_ms", T.ArrayType(T.LongType(), False), False),
        T.StructField("count", T.ArrayType(T.LongType(), False), False),
        T.StructField("sum_delay_min", T.ArrayType(T.LongType(), False), False),
        T.StructField("max_delay_min", T.ArrayType(T.LongType(), False), False),
    ]
)
"""MapState `pending_windows`: origin -> parallel arrays of its open windows' partial aggregates."""

PENDING_STATE_NAME = "pending_windows"


def _partition_id() -> int:
    """The Spark partition this code runs in (-1 outside a Spark task, e.g. in TwsTester)."""
    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _frame(kind: str, n: int, columns: dict[str, Any]) -> pd.DataFrame:
    """An output frame of `n` rows of `kind`; columns not given are NULL."""
    data = {name: columns.get(name, [None] * n) for name in _OUTPUT_COLUMNS}
    data["kind"] = [kind] * n
    return pd.DataFrame(data, columns=_OUTPUT_COLUMNS)


def merge_partials(
    starts: np.ndarray, counts: np.ndarray, sums: np.ndarray, maxes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge partial window aggregates that share a window start (count and sum add, max maxes).

    Args:
        starts, counts, sums, maxes: int64 arrays of equal length, one partial per element.

    Returns:
        The same four arrays with one element per distinct start, sorted by start.
    """
    unique_starts, inverse = np.unique(starts, return_inverse=True)
    merged_counts = np.zeros(len(unique_starts), dtype=np.int64)
    merged_sums = np.zeros(len(unique_starts), dtype=np.int64)
    merged_maxes = np.full(len(unique_starts), np.iinfo(np.int64).min, dtype=np.int64)
    np.add.at(merged_counts, inverse, counts)
    np.add.at(merged_sums, inverse, sums)
    np.maximum.at(merged_maxes, inverse, maxes)
    return unique_starts, merged_counts, merged_sums, merged_maxes


class FlightDelayProcessor(StatefulProcessor):
    """Hourly delay windows per origin with alerts; one instance per slot token and batch.

    Args:
        tokens: the slot tokens in force (`tokens[slot]`), to name each group's slot.
        window_ms: tumbling window size in milliseconds of event time (default one hour).
    """

    def __init__(self, tokens: tuple[int, ...], window_ms: int = HOUR_MS) -> None:
        self._slot_of_token = {token: slot for slot, token in enumerate(tokens)}
        self._window_ms = window_ms
        self._closed_at: tuple[int, int] | None = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the MapState of pending windows (origin -> partial aggregates)."""
        self._handle = handle
        self._pending = handle.getMapState(PENDING_STATE_NAME, PENDING_KEY_SCHEMA, PENDING_VALUE_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        """Fold one slot's batch into its keys' pending windows; emit late, dead, load rows."""
        token = int(key[0])
        slot = self._slot_of_token.get(token, -1)
        partition_id = _partition_id()
        watermark_ms = timerValues.getCurrentWatermarkInMs()
        batch = pd.concat(list(rows), ignore_index=True)
        yield _frame(KIND_LOAD, 1, {"slot": [slot], "partition_id": [partition_id], "count": [len(batch)], "watermark_ms": [watermark_ms]})

        rejected = batch["dead_letter_reason"].notna().to_numpy()
        if rejected.any():
            dead = batch[rejected]
            yield _frame(
                KIND_DEAD_LETTER,
                len(dead),
                {
                    "slot": [slot] * len(dead),
                    "dead_letter_reason": dead["dead_letter_reason"].tolist(),
                    "raw_value": dead["raw_value"].tolist(),
                    "kafka_partition": dead["kafka_partition"].tolist(),
                    "kafka_offset": dead["kafka_offset"].tolist(),
                },
            )
            batch = batch[~rejected]
        if batch.empty:
            return

        event_times = batch["event_time_ms"].to_numpy(dtype=np.int64)
        starts = window_starts_ms(event_times, self._window_ms)
        late = starts + self._window_ms <= watermark_ms
        if late.any():
            late_rows = batch[late]
            yield _frame(
                KIND_LATE,
                len(late_rows),
                {
                    "slot": [slot] * len(late_rows),
                    "origin": late_rows["origin"].tolist(),
                    "destination": late_rows["destination"].tolist(),
                    "event_id": late_rows["event_id"].tolist(),
                    "delay_min": late_rows["delay_min"].tolist(),
                    "distance_mi": late_rows["distance_mi"].tolist(),
                    "event_time_ms": late_rows["event_time_ms"].tolist(),
                    "window_start_ms": starts[late].tolist(),
                    "window_end_ms": (starts[late] + self._window_ms).tolist(),
                    "watermark_ms": [watermark_ms] * len(late_rows),
                    "kafka_partition": late_rows["kafka_partition"].tolist(),
                    "kafka_offset": late_rows["kafka_offset"].tolist(),
                },
            )
            batch = batch[~late]
            starts = starts[~late]
            if batch.empty:
                return

        # Vectorized batch aggregate per (origin, window start), then one state read/write per origin.
        partials = (
            pd.DataFrame(
                {
                    "origin": batch["origin"].to_numpy(),
                    "start": starts,
                    "delay": batch["delay_min"].to_numpy(dtype=np.int64),
                }
            )
            .groupby(["origin", "start"], sort=True)["delay"]
            .agg(["count", "sum", "max"])
            .reset_index()
        )
        for origin, group in partials.groupby("origin", sort=False):
            new = (
                group["start"].to_numpy(np.int64),
                group["count"].to_numpy(np.int64),
                group["sum"].to_numpy(np.int64),
                group["max"].to_numpy(np.int64),
            )
            existing = self._pending.getValue((origin,))
            if existing is not None:
                new = merge_partials(*(np.concatenate([np.asarray(old, np.int64), fresh]) for old, fresh in zip(existing, new)))
            self._pending.updateValue((origin,), tuple(array.tolist() for array in new))
        registered = set(self._handle.listTimers())  # one state call per slot and batch
        for end in np.unique(partials["start"].to_numpy(np.int64)) + self._window_ms:
            # fires once the watermark passes end - 1, i.e. reaches end; a timer at or below the
            # current watermark cannot be registered, so the one window ending at watermark + 1
            # gets `end` (it then closes with the next watermark step past its end)
            expiry = int(end) - 1 if int(end) - 1 > watermark_ms else int(end)
            if expiry not in registered:
                self._handle.registerTimer(expiry)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        """Emit every pending window of this slot whose end the watermark has reached."""
        token = int(key[0])
        watermark_ms = timerValues.getCurrentWatermarkInMs()
        if self._closed_at == (token, watermark_ms):
            return  # an earlier timer of this slot at this watermark already closed everything
        self._closed_at = (token, watermark_ms)
        slot = self._slot_of_token.get(token, -1)
        partition_id = _partition_id()
        origins, starts_out, counts_out, sums_out, maxes_out = [], [], [], [], []
        for (origin,), value in list(self._pending.iterator()):
            starts, counts, sums, maxes = (np.asarray(array, np.int64) for array in value)
            closed = starts + self._window_ms <= watermark_ms
            if not closed.any():
                continue
            origins.extend([origin] * int(closed.sum()))
            starts_out.append(starts[closed])
            counts_out.append(counts[closed])
            sums_out.append(sums[closed])
            maxes_out.append(maxes[closed])
            if closed.all():
                self._pending.removeKey((origin,))
            else:
                keep = ~closed
                self._pending.updateValue(
                    (origin,), (starts[keep].tolist(), counts[keep].tolist(), sums[keep].tolist(), maxes[keep].tolist())
                )
        if not origins:
            return
        starts = np.concatenate(starts_out)
        counts = np.concatenate(counts_out)
        sums = np.concatenate(sums_out)
        means = sums / counts
        n = len(origins)
        yield _frame(
            KIND_WINDOW,
            n,
            {
                "slot": [slot] * n,
                "partition_id": [partition_id] * n,
                "origin": origins,
                "window_start_ms": starts,
                "window_end_ms": starts + self._window_ms,
                "count": counts,
                "sum_delay_min": sums,
                "max_delay_min": np.concatenate(maxes_out),
                "mean_delay_min": means,
                "alert": (means >= ALERT_MIN_MEAN_DELAY_MIN) & (counts >= ALERT_MIN_COUNT),
                "watermark_ms": [watermark_ms] * n,
            },
        )

    def close(self) -> None:
        """Nothing to release."""

"""The keyed window engine's stateful processor: tumbling windows per key, grouped by slot token.

What it computes comes from the job's spec (`keyshift.jobs.spec.JobSpec`): the key, the
aggregates, the output rule. The flights' names (origin, delays) below are one example.

It runs inside `groupBy("token").transformWithStateInPandas(...)`: Spark calls it once per slot
token per micro-batch with all of that slot's rows (DESIGN.md: group by slot token, aggregate the
batch vectorized, touch state per key per batch, never per event). Its input is partial
aggregates per (origin, window) made before the shuffle (`keyshift.processing.operators.local_merge`).
Per key (origin) it keeps the pending, not yet final windows in a MapState keyed by the origin,
with the ids of their events; per slot and batch one `keys()` listing of each map (so a key without
state costs no read: Spark's state server logs a warning for every read of a missing key), then
one `getValue` per touched key that has state and one `updateValue` per touched key. Each such call
is a round trip to the JVM's state server, about 0.3-0.6 ms on 2 busy cores, so the number of
calls per slot and batch is what this design keeps small: in `key` and `dynamic` mode the key's
watermark clock is a field of the same value, read and written with its windows.

Duplicated event ids. A duplicate is an event whose `event_id` the same key has already
delivered inside the dedup horizon: an earlier micro-batch's event still in one of the key's
open windows (its ids are in the MapState), or another event of the same micro-batch. It is not
counted in any window; it goes out as a `dead_letter` row with reason `duplicate event_id`
carrying the event's id and fields and its Kafka coordinates (its raw bytes are not carried
through the shuffle; read them at that offset). Within a batch, the copy with the lowest
(Kafka partition, offset) is kept, whatever order the shuffle delivers rows in, so a replayed
batch makes the same choice. The horizon is the key's open windows: an id is remembered until
the watermark closes the window of the event that carried it. A copy arriving after that is
late (its window is closed) and goes to the late output like any late event, so no window ever
counts an event twice. Cost in state: 8 bytes per event in an open window (a 2-day bound over
flights-3m keeps about 33,000 ids, 264 KB, over all keys), read and written with the key's
windows, no extra state call. The key is the origin and the Kafka key must equal it
(`keyshift.processing.operators.records`), so every copy of an event reaches the same key and slot (for
a key split by hot_split, the piece is a function of the event id, so copies meet there too).

Output rows are tagged by `kind`:
- `window`: a final window [start, start + size) of a key, with count, the aggregates and the
  outputs of the spec's rule, emitted once when the watermark passes its end;
- `late`: an event whose window had already closed when it arrived (window end <= watermark);
- `dead_letter`: a record that failed validation, passed through with its reason and raw payload,
  or a duplicated event (reason `duplicate event_id`, with its fields);
- `load`: one row per slot per batch: events the slot processed in the batch (`count`);
- `watermark` (per-key modes only): a key's watermark on its slot after the batch, one row per key
  the batch touched or whose windows closed (for a hot_split key: per piece), so the sink knows
  when every piece of a split key has closed a window.
Every row carries `global_watermark_ms`, the fallback (Spark's watermark, never below the floor).

Watermark modes (`keyshift.eventtime.watermarks`): in `global` mode a window closes when Spark's
watermark passes its end (timers); in `key`, `nkey` and `dynamic` mode lateness is decided per key
(or group) against the watermark its clock (in the key's `pending_windows` value; nkey groups in
MapState `key_clocks`) held before the batch, the
clocks then advance with the batch's events, and the key's windows its new watermark passes close
in the same call; timers close what the fallback passes (silent keys, end of input).

Timers: each slot keeps **one** event-time timer, at its earliest wake-up: the smallest end of
its pending windows, or in a per-key mode the earliest watermark at which a clock becomes
redundant, if sooner (Spark fires a timer once its watermark W > expiry, so the timer is at
wake-up - 1). A timer pass closes everything due on the slot and sets the next timer; new windows
set an earlier one only when they end before every timer pending. A timer per window end (one
per hour of event time a batch spans, about 700 per slot per 250,000-flight batch, each
registered, listed, fired and deleted over the state server) cost more than the windows' state.
So that for every batch: input rows = Σ `load.count` and, over a run, events read =
Σ window counts + late + dead letters.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
from pyspark import TaskContext
from pyspark.sql import types as T
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from keyshift.eventtime.watermarks import KeyClock, WatermarkPolicy, advance_clock, close_clock, is_group_clock, merge_clocks, watermark_key
from keyshift.processing.operators.handover import drop_barrier_rows, handover_requested, snapshot_rows
from keyshift.processing.operators.state_variables import MapStateVariable, restore_initial_state
from keyshift.processing.operators.output_rows import OutputRows, one_frame
from keyshift.jobs.spec import SPARK_TYPES, JobSpec, list_column
from keyshift.deferred_import import deferred_module

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)

KIND_WINDOW = "window"
KIND_LATE = "late"
KIND_DEAD_LETTER = "dead_letter"
KIND_LOAD = "load"
KIND_WATERMARK = "watermark"

DUPLICATE_EVENT_ID = "duplicate event_id"
"""Dead-letter reason of an event whose id its key already delivered inside the dedup horizon."""


def output_schema(spec: JobSpec) -> T.StructType:
    """Schema of every row the processor emits for `spec` (columns a kind does not use are NULL):
    kind, slot, partition_id, the key, window_start_ms, window_end_ms, count, the aggregates, the
    outputs, event_id, the payload fields, event_time_ms, watermark_ms, the dead-letter columns,
    kafka_partition, kafka_offset, global_watermark_ms, and the state handover's state_variable,
    state_value, handover_seq (`keyshift.processing.operators.handover`)."""
    return T.StructType(
        [
            T.StructField("kind", T.StringType(), False),
            T.StructField("slot", T.IntegerType(), True),
            T.StructField("partition_id", T.IntegerType(), True),
            T.StructField(spec.key, T.StringType(), True),
            T.StructField("window_start_ms", T.LongType(), True),
            T.StructField("window_end_ms", T.LongType(), True),
            T.StructField("count", T.LongType(), True),
            *[T.StructField(a.name, T.LongType(), True) for a in spec.aggregates],
            *[T.StructField(name, SPARK_TYPES[dtype], True) for name, dtype in spec.outputs.items()],
            T.StructField("event_id", T.LongType(), True),
            *[T.StructField(f.col, f.spark_type, True) for f in spec.payload],
            T.StructField("event_time_ms", T.LongType(), True),
            T.StructField("watermark_ms", T.LongType(), True),
            T.StructField("dead_letter_reason", T.StringType(), True),
            T.StructField("raw_value", T.StringType(), True),
            T.StructField("raw_encoding", T.StringType(), True),
            T.StructField("raw_key_base64", T.StringType(), True),
            T.StructField("kafka_partition", T.IntegerType(), True),
            T.StructField("kafka_offset", T.LongType(), True),
            T.StructField("global_watermark_ms", T.LongType(), True),
            # a switch's state handover (`keyshift.processing.operators.handover`): barrier batch only
            T.StructField("state_variable", T.StringType(), True),
            T.StructField("state_value", T.BinaryType(), True),
            T.StructField("handover_seq", T.LongType(), True),
        ]
    )


PENDING_STATE_NAME = "pending_windows"
PENDING_VALUE_SCHEMA = T.StructType(
    [
        T.StructField("partials", T.BinaryType(), False),
        T.StructField("event_ids", T.BinaryType(), False),
        T.StructField("clock", T.BinaryType(), False),
    ]
)
"""MapState `pending_windows`: key -> its open windows' partial aggregates, packed by
`pack_pending` (a (2 + aggregates) x n int64 array: window_start_ms, count, then each aggregate of
the spec in order, windows sorted by start), the ids of their events (int64 bytes, window by
window in that order, `count` ids each: the dedup horizon), and in `key` and `dynamic` mode the
key's watermark clock (`KeyClock.pack`, 32 bytes + 8 per remembered time; empty in `global` and
`nkey` mode, and for a key whose clock was freed). A key whose windows all closed but whose clock
still raises it above the fallback keeps a value with no windows. Bytes instead of arrays:
pyspark serializes array elements one by one in Python."""

NO_CLOCK = b""
"""The `clock` field of a pending-windows value without a clock."""


def pending_key_schema(spec: JobSpec) -> T.StructType:
    """The pending windows' map key: one string field named after the spec's key."""
    return T.StructType([T.StructField(spec.key, T.StringType(), False)])


CLOCK_STATE_NAME = "key_clocks"
CLOCK_KEY_SCHEMA = T.StructType([T.StructField("clock", T.StringType(), False)])
CLOCK_VALUE_SCHEMA = T.StructType(
    [
        T.StructField("max_event_time_ms", T.LongType(), False),
        T.StructField("closed_through_ms", T.LongType(), False),
        T.StructField("last_seen_ms", T.LongType(), False),
        T.StructField("bound_ms", T.LongType(), False),
        T.StructField("recent", T.BinaryType(), False),
    ]
)
"""MapState `key_clocks` (`nkey` mode): a group `#<group>` -> its
`keyshift.eventtime.watermarks.KeyClock`, 40 bytes per group. (`key` and `dynamic` mode keep a
key's clock in its `pending_windows` value instead, so touching a key costs one read and one
write of state, not two of each; the map is declared in every mode so every run has one layout.)"""


def pack_pending(starts: np.ndarray, counts: np.ndarray, aggregates: np.ndarray) -> bytes:
    """Pack open windows into the MapState value: a C-order (2 + a) x n int64 array's bytes.

    Args:
        starts, counts: int64 arrays of n windows. aggregates: an a x n int64 array (the
            spec's aggregates in order).

    No window packs to b"" (a key that keeps only its clock).
    """
    if not len(starts):
        return b""
    return np.vstack([starts, counts, np.asarray(aggregates, np.int64).reshape(-1, len(starts))]).astype(np.int64).tobytes()


def unpack_pending(blob: bytes, aggregates: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of `pack_pending` for a spec with `aggregates` aggregates: (window_start_ms,
    count, an aggregates x n array). Also what to apply to the state data source's
    `user_map_value.partials` to read the state."""
    if not blob:  # a key that keeps only its clock
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty((aggregates, 0), np.int64)
    rows = np.frombuffer(blob, dtype=np.int64).reshape(2 + aggregates, -1)
    return rows[0], rows[1], rows[2:]


def merge_partials(
    spec: JobSpec, starts: np.ndarray, counts: np.ndarray, aggregates: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge partial window aggregates that share a window start (counts add, each aggregate by
    its op: sum adds, max maxes, min mins).

    Args:
        spec: the job. starts, counts: int64 arrays of n partials. aggregates: a x n int64.

    Returns:
        (starts, counts, aggregates) with one element per distinct start, sorted by start.
    """
    unique_starts, inverse = np.unique(starts, return_inverse=True)
    merged_counts = np.zeros(len(unique_starts), dtype=np.int64)
    np.add.at(merged_counts, inverse, counts)
    merged = np.empty((len(spec.aggregates), len(unique_starts)), dtype=np.int64)
    for i, aggregate in enumerate(spec.aggregates):
        merged[i] = aggregate.identity
        aggregate.merge.at(merged[i], inverse, aggregates[i])
    return unique_starts, merged_counts, merged


def state_variables(spec: JobSpec) -> tuple[MapStateVariable, ...]:
    """The state a job keeps, declared for a switch to read, re-key and restore
    (`keyshift.migration.state`): its pending windows and its key clocks. Timers are carried by
    the switch too (one per open window end)."""
    n = len(spec.aggregates)

    def merge_pending_values(values: list[tuple[bytes, bytes, bytes]]) -> tuple[bytes, bytes, bytes]:
        """Fold the `pending_windows` values of one key held on several slots (the pieces of a
        key hot_split spread) into one: windows merged by start (`merge_partials`), event ids
        kept window by window, the pieces' clocks merged by `merge_clocks` (none if no piece
        has one)."""
        starts, counts, aggregates, ids, clocks = [], [], [], [], []
        for partials, event_ids, clock in values:
            s, c, a = unpack_pending(partials, n)
            starts.append(s), counts.append(c), aggregates.append(a)
            ids.append(np.frombuffer(event_ids, dtype=np.int64))
            if clock:
                clocks.append(KeyClock.unpack(clock))
        all_ids = np.concatenate(ids)
        id_starts = np.repeat(np.concatenate(starts), np.concatenate(counts))
        merged = merge_partials(spec, np.concatenate(starts), np.concatenate(counts), np.concatenate(aggregates, axis=1))
        clock = merge_clocks(clocks).pack() if clocks else NO_CLOCK
        return pack_pending(*merged), all_ids[np.argsort(id_starts, kind="stable")].tobytes(), clock

    return (
        MapStateVariable(PENDING_STATE_NAME, pending_key_schema(spec), PENDING_VALUE_SCHEMA, merge=merge_pending_values),
        MapStateVariable(CLOCK_STATE_NAME, CLOCK_KEY_SCHEMA, CLOCK_VALUE_SCHEMA, merge=merge_clock_values, broadcast=is_group_clock),
    )


def merge_clock_values(values: list[tuple]) -> tuple:
    """Fold the `key_clocks` values of one nkey group held on several slots into one for a
    switch (`merge_clocks`)."""
    return merge_clocks([KeyClock.from_value(v) for v in values]).as_value()


def _partition_id() -> int:
    """The Spark partition this code runs in (-1 outside a Spark task, e.g. in TwsTester)."""
    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _flat(partials: pd.DataFrame, order: np.ndarray, column: str, dtype=np.int64) -> np.ndarray:
    """A list column of `partials`, its lists concatenated in `order` (one element per event)."""
    values = partials[column].to_numpy(object)[order]
    if not len(values):
        return np.empty(0, dtype=dtype)
    return np.concatenate([np.asarray(v, dtype=dtype) for v in values])


class KeyedWindowProcessor(StatefulProcessor):
    """Tumbling windows per key of a job spec; one instance per slot token and batch.

    Args:
        spec: the job (key, aggregates, output rule, payload fields).
        tokens: the slot tokens in force (`tokens[slot]`), to name each group's slot.
        window_ms: tumbling window size in milliseconds of event time (default: the spec's).
        watermark_floor_ms: the watermark this query starts from, ms of event time: after a
            switch, the old query's watermark for its next batch (`nextBatchWatermarkMs` of its
            last commit). A new checkpoint starts Spark's watermark at 0; lateness and window
            closing use max(Spark's watermark, this floor), so an event late before the switch
            is late after it, as in a run without the switch. 0: no floor.
        policy: the watermark mode and its parameters (`keyshift.eventtime.watermarks`);
            default `global` with a one-hour bound. In a per-key mode Spark's watermark (the
            query's `withWatermark`) must use `policy.spark_delay_ms`: it is the fallback.
    """

    def __init__(
        self, spec: JobSpec, tokens: tuple[int, ...], window_ms: int | None = None, watermark_floor_ms: int = 0,
        policy: WatermarkPolicy | None = None,
    ) -> None:
        self._spec = spec
        self._key = spec.key
        self._n = len(spec.aggregates)
        self._variables = state_variables(spec)
        self._output_columns = output_schema(spec).fieldNames()
        self._slot_of_token = {token: slot for slot, token in enumerate(tokens)}
        self._window_ms = int(window_ms or spec.window_ms)
        self._watermark_floor_ms = int(watermark_floor_ms)
        self._closed_at: tuple[int, int] | None = None
        self._policy = policy or WatermarkPolicy()
        self._dynamic = None
        if self._policy.mode == "dynamic":
            from keyshift.eventtime.disorder import DynamicBound

            self._dynamic = DynamicBound(k=self._policy.history, max_bound_ms=self._policy.bound_ms)
        self._clock_keys: dict[str, str] = {}
        self._clock_in_pending = self._policy.per_key and self._policy.mode != "nkey"
        self._staged: dict[str, tuple[bytes, bytes] | None] = {}
        self._swept_at: dict[int, float] = {}
        self._closing: list[tuple] = []

    def __setstate__(self, state: dict) -> None:
        """Unpickled on a Python worker (before it reads any input): put transformWithStateInPandas'
        column-wise input in place (`keyshift.processing.operators.tws_input.install`), then restore."""
        from keyshift.processing.operators.tws_input import install

        install()
        self.__dict__.update(state)

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the MapStates: pending windows (key -> partial aggregates) and the key clocks
        (used by the per-key watermark modes only, declared always so every run has one layout)."""
        self._handle = handle
        self._pending = handle.getMapState(PENDING_STATE_NAME, pending_key_schema(self._spec), PENDING_VALUE_SCHEMA)
        self._clocks = handle.getMapState(CLOCK_STATE_NAME, CLOCK_KEY_SCHEMA, CLOCK_VALUE_SCHEMA)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:
        """Restore state a switch migrated onto this slot token (first batch of a new query only):
        pending windows per key, key clocks, and the timers that close the windows."""
        restore_initial_state(
            initialState, {PENDING_STATE_NAME: self._pending, CLOCK_STATE_NAME: self._clocks}, self._handle.registerTimer, self._variables
        )

    # --- rows out (`OutputRows`; a handler call yields them all as one frame, `one_frame`) ----

    def _windows(self, slot, partition_id, keys, starts, counts, aggregates, watermarks, global_watermark_ms) -> OutputRows:
        """`window` rows: one per element of `keys`, `starts`, `counts`, `watermarks`, with
        `aggregates` an a x n array, plus the spec's outputs."""
        n = len(keys)
        values = self._spec.window_values(counts, dict(zip(self._spec.aggregate_names, aggregates)))
        return OutputRows(
            KIND_WINDOW,
            n,
            {
                "slot": [slot] * n,
                "partition_id": [partition_id] * n,
                self._key: keys,
                "window_start_ms": starts,
                "window_end_ms": starts + self._window_ms,
                **values,
                "watermark_ms": watermarks,
                "global_watermark_ms": [global_watermark_ms] * n,
            },
        )

    def _closed_windows(self, slot: int, partition_id: int, fallback_ms: int) -> OutputRows:
        """`window` rows for what `self._closing` collected: (key, starts, counts, aggregates, watermark)."""
        closing, self._closing = self._closing, []
        keys = [k for k, starts, *_ in closing for _ in range(len(starts))]
        watermarks = [w for _k, starts, _c, _a, w in closing for _ in range(len(starts))]
        return self._windows(
            slot, partition_id, keys, np.concatenate([c[1] for c in closing]), np.concatenate([c[2] for c in closing]),
            np.concatenate([c[3] for c in closing], axis=1), watermarks, fallback_ms,
        )

    def _watermark_rows(self, slot: int, partition_id: int, keys: list, watermarks: list, fallback_ms: int) -> OutputRows:
        """`watermark` rows: each key's watermark on this slot (ms of event time)."""
        n = len(keys)
        return OutputRows(KIND_WATERMARK, n, {"slot": [slot] * n, "partition_id": [partition_id] * n, self._key: keys,
                                              "watermark_ms": watermarks, "global_watermark_ms": [fallback_ms] * n})

    def _load(self, slot: int, partition_id: int, processed: int, watermark_ms: int) -> OutputRows:
        return OutputRows(KIND_LOAD, 1, {"slot": [slot], "partition_id": [partition_id], "count": [processed],
                                         "watermark_ms": [watermark_ms], "global_watermark_ms": [watermark_ms]})

    # --- input ------------------------------------------------------------------------------

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        """Fold one slot's partials into its keys' pending windows; emit late, dead, load rows.

        `rows` are `keyshift.processing.operators.local_merge.partial_schema(spec)` chunks: partial
        aggregates per (key, window) and single dead letters. A partial whose window the
        watermark has closed goes out as late events; duplicated event ids go out as dead
        letters (see the module docstring); the rest is merged into the MapState, one read and
        one write per key touched, never per event. All of it as one frame of
        `output_schema(spec)` rows.
        """
        yield from one_frame(self._handing_over(key, timerValues, self._input_rows(key, drop_barrier_rows(rows), timerValues)),
                             self._output_columns)

    def _input_rows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[OutputRows]:
        token = int(key[0])
        slot = self._slot_of_token.get(token, -1)
        spark_watermark_ms = timerValues.getCurrentWatermarkInMs()
        watermark_ms = max(spark_watermark_ms, self._watermark_floor_ms)
        if self._policy.per_key:
            yield from self._key_level_input(token, slot, rows, spark_watermark_ms, watermark_ms)
            return
        processed = 0
        open_partials = []
        for chunk in rows:
            processed += int(chunk["count"].sum())
            rejected = chunk["dead_letter_reason"].notna().to_numpy()
            if rejected.any():
                yield self._dead_letters(chunk[rejected], slot)
                chunk = chunk[~rejected]
            if chunk.empty:
                continue
            late = chunk["window_start_ms"].to_numpy(np.int64) + self._window_ms <= watermark_ms
            if late.any():
                yield self._late_events(chunk[late], slot, watermark_ms)
                chunk = chunk[~late]
            if len(chunk):  # a batch whose every partial is late touches no state (issue 8)
                open_partials.append(chunk)
        yield self._load(slot, _partition_id(), processed, watermark_ms)
        if not open_partials:
            return
        partials = open_partials[0] if len(open_partials) == 1 else pd.concat(open_partials, ignore_index=True)
        touched_starts, duplicates = self._fold(partials)
        if duplicates is not None:
            yield self._duplicates(partials, duplicates, slot)
        self._schedule(int(touched_starts.min()) + self._window_ms if len(touched_starts) else None, spark_watermark_ms)

    def _schedule(self, wake_ms: int | None, spark_watermark_ms: int) -> None:
        """Keep an event-time timer of this slot at or before `wake_ms` (module docstring).

        Args:
            wake_ms: the earliest watermark (ms of event time) at which something on this slot
                becomes due (a window end, a clock's own watermark); None: nothing pending.
            spark_watermark_ms: Spark's current watermark W: a timer fires once W > its expiry,
                and one at or below W cannot be registered, so the timer is at wake_ms - 1, or
                W + 1 when that is not above W.

        One `listTimers` call; nothing is registered when a timer in (W, expiry] is pending.
        """
        if wake_ms is None:
            return
        expiry = max(int(wake_ms) - 1, spark_watermark_ms + 1)
        if any(spark_watermark_ms < t <= expiry for t in self._handle.listTimers()):
            return
        self._handle.registerTimer(expiry)

    @staticmethod
    def _earliest(*candidates: int | None) -> int | None:
        """The smallest of the candidates that are not None (None if all are)."""
        present = [c for c in candidates if c is not None]
        return min(present) if present else None

    def _clock_key(self, key: str) -> str:
        """The clock holding `key`'s watermark (itself, or its nkey group), cached."""
        name = self._clock_keys.get(key)
        if name is None:
            name = self._clock_keys[key] = watermark_key(key, self._policy)
        return name

    def _store_clock(self, name: str, clock: KeyClock, fallback_ms: int, existed: bool) -> bool:
        """Write a clock back, or free it when it no longer raises its key above the fallback.
        Returns whether it was kept."""
        if clock.redundant(fallback_ms):
            if existed:
                self._clocks.removeKey((name,))
            return False
        self._clocks.updateValue((name,), clock.as_value())
        return True

    def _read_clocks(self, names) -> tuple[dict[str, KeyClock | None], dict[str, tuple | None] | None]:
        """The clocks named `names` before the batch (None: no clock yet), read with one listing
        of the map that holds them (so a name without state costs no read) and one `getValue`
        per name that has state.

        Returns:
            (name -> clock; in `key`/`dynamic` mode also name -> its whole `pending_windows`
            value as read, or None, for `_fold` and `_store_key_state` to use without a second
            read; None in `nkey` mode, whose group clocks have their own map).
        """
        if self._clock_in_pending:
            present = {k for (k,) in self._pending.keys()}
            values = {name: (self._pending.getValue((name,)) if name in present else None) for name in names}
            return {name: (KeyClock.unpack(v[2]) if v is not None else None) for name, v in values.items()}, values
        present = {name for (name,) in self._clocks.keys()}
        clocks: dict[str, KeyClock | None] = {}
        for name in names:
            value = self._clocks.getValue((name,)) if name in present else None
            clocks[name] = KeyClock.from_value(value) if value is not None else None
        return clocks, None

    def _store_key_state(self, key: str, clock: KeyClock, fallback_ms: int, values: dict[str, tuple | None]) -> bool:
        """`key`/`dynamic` mode: write a touched key's pending-windows value once, with its
        windows after the batch (staged by `_fold`, or as read when `_fold` left them alone) and
        its clock, which is dropped when it no longer raises the key above the fallback; a key
        left with neither is removed. Returns whether the clock was kept."""
        keep_clock = not clock.redundant(fallback_ms)
        old = values.get(key)
        windows = self._staged[key] if key in self._staged else ((old[0], old[1]) if old is not None else None)
        if windows is not None and len(windows[0]):
            self._pending.updateValue((key,), (windows[0], windows[1], clock.pack() if keep_clock else NO_CLOCK))
        elif keep_clock:
            self._pending.updateValue((key,), (b"", b"", clock.pack()))  # no windows: packed empty arrays are b""
        elif old is not None:
            self._pending.removeKey((key,))
        return keep_clock

    def _key_level_input(
        self, token: int, slot: int, rows: Iterator[pd.DataFrame], spark_watermark_ms: int, fallback_ms: int
    ) -> Iterator[OutputRows]:
        """`handleInputRows` in a per-key watermark mode (module docstring).

        Per touched clock (key, or nkey group): one `getValue` and at most one write. Lateness of
        a partial is decided against its clock's watermark before the batch (as Spark judges a
        batch against the watermark of the batch before); the clocks then advance with the
        batch's events (late ones included, in Kafka order); the windows the new watermarks pass
        close at once; the rest get a timer for the fallback.
        """
        processed, chunks = 0, []
        for chunk in rows:
            processed += int(chunk["count"].sum())
            rejected = chunk["dead_letter_reason"].notna().to_numpy()
            if rejected.any():
                yield self._dead_letters(chunk[rejected], slot)
                chunk = chunk[~rejected]
            if len(chunk):
                chunks.append(chunk)
        partition_id = _partition_id()
        yield self._load(slot, partition_id, processed, fallback_ms)
        now_ms = int(time.time() * 1000)
        self._closing = []
        if chunks:
            partials = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
            keys = partials[self._key].to_numpy(object)
            names = np.array([self._clock_key(k) for k in keys], dtype=object)
            codes, distinct = pd.factorize(names)
            clocks, values = self._read_clocks(distinct)
            existed = {name: clock is not None for name, clock in clocks.items()}
            before = np.array([c.watermark_ms(fallback_ms) if c is not None else fallback_ms for c in clocks.values()], np.int64)
            row_watermarks = before[codes]
            late = partials["window_start_ms"].to_numpy(np.int64) + self._window_ms <= row_watermarks
            if late.any():
                yield self._late_events(partials[late], slot, row_watermarks[late])

            counts = partials["count"].to_numpy(np.int64)
            identity = np.arange(len(partials))
            times = _flat(partials, identity, "event_times_ms")
            arrival = np.lexsort((_flat(partials, identity, "kafka_offsets"), np.repeat(partials["kafka_partition"].to_numpy(np.int64), counts),
                                  np.repeat(codes, counts)))
            times = times[arrival]
            bounds = np.searchsorted(np.repeat(codes, counts)[arrival], np.arange(len(distinct) + 1))
            after: dict[str, int] = {}
            for code, name in enumerate(distinct):
                clocks[name] = advance_clock(clocks[name], times[bounds[code]:bounds[code + 1]], now_ms, self._policy, self._dynamic)
                after[name] = clocks[name].watermark_ms(fallback_ms)

            open_partials = partials[~late]
            self._staged = {}
            if len(open_partials):
                close_at = {k: after[self._clock_key(k)] for k in pd.unique(open_partials[self._key].to_numpy(object))}
                touched_starts, duplicates = self._fold(open_partials, close_at, values)
                if duplicates is not None:
                    yield self._duplicates(open_partials, duplicates, slot)
                wake = int(touched_starts.min()) + self._window_ms if len(touched_starts) else None
            else:
                wake = None
            for k, starts, *_ in self._closing:
                name = self._clock_key(k)
                clocks[name] = close_clock(clocks[name], int(starts.max()) + self._window_ms)
            for name, clock in clocks.items():
                kept = self._store_key_state(name, clock, fallback_ms, values) if values is not None else \
                    self._store_clock(name, clock, fallback_ms, existed[name])
                if kept:
                    wake = self._earliest(wake, clock.own_watermark_ms())
            self._schedule(wake, spark_watermark_ms)
            touched = list(pd.unique(keys))
            yield self._watermark_rows(slot, partition_id, touched, [after[self._clock_key(k)] for k in touched], fallback_ms)
        if self._closing:
            yield self._closed_windows(slot, partition_id, fallback_ms)
        if self._policy.idle_fallback == "timeout":
            yield from self._close_silent(token, slot, partition_id, now_ms, fallback_ms)

    def _slot_clocks(self) -> dict[str, KeyClock]:
        """Every clock of this slot (one MapState iteration)."""
        return {name: KeyClock.from_value(value) for (name,), value in list(self._clocks.iterator())}

    def _close_pending(self, watermark_of, fallback_ms: int | None = None) -> int | None:
        """Close, in `self._closing`, every pending window of this slot whose key's watermark
        (`watermark_of(key, clock)`, ms; `clock` is the key's `KeyClock` in `key`/`dynamic` mode,
        else None) has reached its end; what stays open is written back. In `key`/`dynamic`
        mode the key's clock is closed with its windows and freed once it is redundant against
        `fallback_ms`; a value is written only when it changed.

        Returns:
            The earliest wake-up (ms of event time): the smallest end of the windows that stay
            open, or an inline clock's own watermark if sooner; None if nothing stays.
        """
        wake = None
        for (key,), value in list(self._pending.iterator()):
            blob, id_blob = value[0], value[1]
            clock = KeyClock.unpack(value[2]) if self._clock_in_pending else None
            watermark = watermark_of(key, clock)
            starts, counts, aggregates = unpack_pending(blob, self._n)
            closed = starts + self._window_ms <= watermark
            keep = ~closed
            if keep.any():
                wake = self._earliest(wake, int(starts[keep].min()) + self._window_ms)
            if closed.any():
                self._closing.append((key, starts[closed], counts[closed], aggregates[:, closed], watermark))
            new_clock = clock
            if clock is not None:
                if closed.any():
                    new_clock = close_clock(clock, int(starts[closed].max()) + self._window_ms)
                if new_clock.redundant(fallback_ms):
                    new_clock = None
                else:
                    wake = self._earliest(wake, new_clock.own_watermark_ms())
            if not closed.any() and new_clock == clock:
                continue
            if not keep.any() and new_clock is None:
                self._pending.removeKey((key,))
                continue
            ids = np.frombuffer(id_blob, dtype=np.int64)[np.repeat(keep, counts)]
            self._pending.updateValue((key,), (pack_pending(starts[keep], counts[keep], aggregates[:, keep]), ids.tobytes(),
                                               new_clock.pack() if new_clock is not None else NO_CLOCK))
        return wake

    def _close_by_fallback(self, slot: int, spark_watermark_ms: int, fallback_ms: int) -> Iterator[OutputRows]:
        """A timer fired: Spark's watermark (the fallback) passed a window end. Close every
        pending window of this slot its key's watermark has reached, free the clocks the
        fallback made redundant, set the slot's next timer."""
        partition_id = _partition_id()
        self._closing = []
        if self._clock_in_pending:
            wake = self._close_pending(lambda _key, clock: clock.watermark_ms(fallback_ms) if clock is not None else fallback_ms, fallback_ms)
        else:
            clocks = self._slot_clocks()
            wake = self._close_pending(lambda key, _clock: self._group_watermark(clocks, key, fallback_ms))
            ends: dict[str, int] = {}
            for k, starts, *_ in self._closing:
                name = self._clock_key(k)
                ends[name] = max(ends.get(name, 0), int(starts.max()) + self._window_ms)
            for name, clock in clocks.items():
                clock = close_clock(clock, ends[name]) if name in ends else clock
                if self._store_clock(name, clock, fallback_ms, True):
                    wake = self._earliest(wake, clock.own_watermark_ms())
        self._schedule(wake, spark_watermark_ms)
        if self._closing:
            marks = {k: w for k, *_rest, w in self._closing}  # each closed key's watermark (it closed at)
            yield self._closed_windows(slot, partition_id, fallback_ms)
            yield self._watermark_rows(slot, partition_id, list(marks), list(marks.values()), fallback_ms)

    def _group_watermark(self, clocks: dict[str, KeyClock], key: str, fallback_ms: int) -> int:
        """`nkey` mode: the watermark of `key`'s group clock in `clocks` (the fallback without one)."""
        clock = clocks.get(self._clock_key(key))
        return clock.watermark_ms(fallback_ms) if clock is not None else fallback_ms

    def _close_silent(self, token: int, slot: int, partition_id: int, now_ms: int, fallback_ms: int) -> Iterator[OutputRows]:
        """`timeout` fallback: close every window of the keys whose clock saw no event for
        `idle_timeout_s` seconds of processing time (checked at most 4 times per timeout)."""
        timeout_ms = int(self._policy.idle_timeout_s * 1000)
        if now_ms - self._swept_at.get(token, 0) < timeout_ms // 4:
            return
        self._swept_at[token] = now_ms
        self._closing = []
        everything, nothing = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        if self._clock_in_pending:
            before: dict[str, KeyClock] = {}

            def silent_watermark(key: str, clock: KeyClock | None) -> int:
                if clock is None or now_ms - clock.last_seen_ms < timeout_ms:
                    return nothing
                before[key] = clock
                return everything

            self._close_pending(silent_watermark, fallback_ms)
            if not self._closing:
                return
            after = {k: close_clock(before[k], int(starts.max()) + self._window_ms).watermark_ms(fallback_ms) for k, starts, *_ in self._closing}
        else:
            clocks = self._slot_clocks()
            silent = {name for name, clock in clocks.items() if now_ms - clock.last_seen_ms >= timeout_ms}
            if not silent:
                return
            self._close_pending(lambda k, _clock: everything if self._clock_key(k) in silent else nothing)
            for k, starts, *_ in self._closing:
                name = self._clock_key(k)
                clocks[name] = close_clock(clocks[name], int(starts.max()) + self._window_ms)
                self._store_clock(name, clocks[name], fallback_ms, True)
            if not self._closing:
                return
            after = {k: clocks[self._clock_key(k)].watermark_ms(fallback_ms) for k, *_ in self._closing}
        # the windows' watermark: the key's after closing
        self._closing = [(*entry[:4], after[entry[0]]) for entry in self._closing]
        closed_keys = [k for k, *_ in self._closing]
        yield self._closed_windows(slot, partition_id, fallback_ms)
        yield self._watermark_rows(slot, partition_id, closed_keys, [after[k] for k in closed_keys], fallback_ms)

    def _fold(
        self, partials: pd.DataFrame, close_at: dict[str, int] | None = None, values: dict[str, tuple | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Merge open-window partials into the MapState, dropping duplicated event ids.

        Args:
            partials: `partial_schema(spec)` rows of open windows (no dead letter, none late), any order.
            close_at: per-key modes: key -> its watermark after this batch (ms of event time);
                the key's windows ending at or before it close now: they are collected in
                `self._closing` as (key, starts, counts, aggregates, watermark) and leave the
                state. None (global mode): nothing closes here.
            values: `key`/`dynamic` mode: every touched key's pending-windows value as
                `_read_clocks` read it (None: no state). The keys' new windows are then staged in
                `self._staged` (key -> (partials, event_ids), None when none stays open) for
                `_store_key_state` to write with the clock, not written here. None: read and
                write the MapState here (`global` and `nkey` mode).

        Returns:
            (window starts that stay open and received events, int64 ms; per-event indices of
            duplicates into the flattened events of `partials` in their `_flat_order`, or None).
        """
        spec = self._spec
        order = self._flat_order(partials)
        keys = partials[self._key].to_numpy(object)[order]
        counts = partials["count"].to_numpy(np.int64)[order]
        starts = partials["window_start_ms"].to_numpy(np.int64)[order]
        aggregates = np.array([partials[name].to_numpy(np.int64)[order] for name in spec.aggregate_names], np.int64).reshape(self._n, len(order))
        events = _flat(partials, order, "event_ids")
        event_starts = np.repeat(starts, counts)
        boundary = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        group_starts = np.concatenate(([0], boundary))
        group_ends = np.concatenate((boundary, [len(order)]))
        event_bounds = np.concatenate(([0], np.cumsum(counts)))

        # the same id twice in this batch for one key: keep the lowest (partition, offset)
        code = np.repeat(np.searchsorted(group_starts, np.arange(len(order)), side="right") - 1, counts)
        partitions = np.repeat(partials["kafka_partition"].to_numpy(np.int64)[order], counts)
        offsets = _flat(partials, order, "kafka_offsets")
        by_copy = np.lexsort((offsets, partitions, events, code))
        repeated = np.zeros(len(events), dtype=bool)
        same = (np.diff(code[by_copy]) == 0) & (np.diff(events[by_copy]) == 0)
        repeated[by_copy[1:][same]] = True

        touched, duplicate_indices = [], []
        values_of_events = None  # the aggregated fields per event, flattened only when some key has a duplicate
        # one listing of the slot's keys, so a key without pending windows costs no read (Spark's
        # state server logs a warning for every read of a missing key)
        present = {k for (k,) in self._pending.keys()} if values is None else None
        for lo, hi in zip(group_starts, group_ends):
            key = keys[lo]
            e_lo, e_hi = event_bounds[lo], event_bounds[hi]
            ids = events[e_lo:e_hi]
            if values is not None:
                existing = values.get(key)
            else:
                existing = self._pending.getValue((key,)) if key in present else None
            old = unpack_pending(existing[0], self._n) if existing is not None else None
            old_ids = np.frombuffer(existing[1], dtype=np.int64) if existing is not None else np.empty(0, np.int64)
            duplicate = repeated[e_lo:e_hi] | np.isin(ids, old_ids)
            if duplicate.any():
                keep = ~duplicate
                duplicate_indices.append(e_lo + np.flatnonzero(duplicate))
                if values_of_events is None:
                    values_of_events = {f: _flat(partials, order, list_column(f)) for f in {a.field for a in spec.aggregates}}
                per_event = np.array([values_of_events[a.field][e_lo:e_hi][keep] for a in spec.aggregates], np.int64).reshape(self._n, int(keep.sum()))
                new = merge_partials(spec, event_starts[e_lo:e_hi][keep], np.ones(int(keep.sum()), np.int64), per_event)
                ids, id_starts = ids[keep], event_starts[e_lo:e_hi][keep]
            else:
                new = (starts[lo:hi], counts[lo:hi], aggregates[:, lo:hi])
                id_starts = event_starts[e_lo:e_hi]
            if not len(ids):
                continue  # every event of this key was a duplicate: its state stays as it was
            if old is not None:
                new = (np.concatenate([old[0], new[0]]), np.concatenate([old[1], new[1]]), np.concatenate([old[2], new[2]], axis=1))
                ids = np.concatenate([old_ids, ids])
                id_starts = np.concatenate([np.repeat(old[0], old[1]), id_starts])
            by_window = np.argsort(id_starts, kind="stable")  # ids window by window, as merge_partials sorts windows
            merged, ids = merge_partials(spec, *new), ids[by_window]
            if close_at is not None:
                closed = merged[0] + self._window_ms <= close_at[key]
                if closed.any():
                    self._closing.append((key, merged[0][closed], merged[1][closed], merged[2][:, closed], close_at[key]))
                    keep = ~closed
                    ids = ids[np.repeat(keep, merged[1])]
                    merged = (merged[0][keep], merged[1][keep], merged[2][:, keep])
                    if not len(merged[0]):
                        if values is not None:
                            self._staged[key] = None
                        elif old is not None:
                            self._pending.removeKey((key,))
                        continue
            touched.append(merged[0])
            if values is not None:
                self._staged[key] = (pack_pending(*merged), ids.tobytes())
            else:
                self._pending.updateValue((key,), (pack_pending(*merged), ids.tobytes(), NO_CLOCK))
        touched_starts = np.concatenate(touched) if touched else np.empty(0, np.int64)
        return touched_starts, (np.concatenate(duplicate_indices) if duplicate_indices else None)

    def _flat_order(self, partials: pd.DataFrame) -> np.ndarray:
        """The order `_fold` visits partials in: by key, stable (so each key's events are
        contiguous once flattened)."""
        return np.argsort(partials[self._key].to_numpy(object), kind="stable")

    def _payload(self, partials: pd.DataFrame, order: np.ndarray, indices: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The payload fields per event of `partials` (flattened in `order`, optionally at `indices`)."""
        out = {}
        for f in self._spec.payload:
            values = _flat(partials, order, list_column(f.col), np.int64 if f.dtype == "long" else object)
            out[f.col] = values if indices is None else values[indices]
        return out

    def _duplicates(self, partials: pd.DataFrame, indices: np.ndarray, slot: int) -> OutputRows:
        """Dead-letter rows for the events at `indices` of the flattened `partials` (see `_fold`)."""
        order = self._flat_order(partials)
        counts = partials["count"].to_numpy(np.int64)[order]
        n = len(indices)
        return OutputRows(
            KIND_DEAD_LETTER,
            n,
            {
                "slot": [slot] * n,
                "dead_letter_reason": [DUPLICATE_EVENT_ID] * n,
                self._key: np.repeat(partials[self._key].to_numpy(object)[order], counts)[indices],
                "event_id": _flat(partials, order, "event_ids")[indices],
                **self._payload(partials, order, indices),
                "event_time_ms": _flat(partials, order, "event_times_ms")[indices],
                "kafka_partition": np.repeat(partials["kafka_partition"].to_numpy(np.int64)[order], counts)[indices],
                "kafka_offset": _flat(partials, order, "kafka_offsets")[indices],
            },
        )

    def _dead_letters(self, dead: pd.DataFrame, slot: int) -> OutputRows:
        return OutputRows(
            KIND_DEAD_LETTER,
            len(dead),
            {
                "slot": [slot] * len(dead),
                "count": dead["count"].tolist(),  # 1, or the records a `filtered` row stands for
                "dead_letter_reason": dead["dead_letter_reason"].tolist(),
                "raw_value": dead["raw_value"].tolist(),
                "raw_encoding": dead["raw_encoding"].tolist(),
                "raw_key_base64": dead["raw_key_base64"].tolist(),
                "kafka_partition": dead["kafka_partition"].tolist(),
                "kafka_offset": [int(offsets[0]) for offsets in dead["kafka_offsets"]],
            },
        )

    def _late_events(self, late: pd.DataFrame, slot: int, watermark_ms) -> OutputRows:
        """One output row per event of late partials (their window had closed); `watermark_ms`
        is the watermark they were late against (ms), one for all or an array per partial."""
        repeats = late["count"].to_numpy(np.int64)
        watermark_ms = np.repeat(np.broadcast_to(np.asarray(watermark_ms, np.int64), len(late)), repeats)
        starts = np.repeat(late["window_start_ms"].to_numpy(np.int64), repeats)
        n = len(starts)
        identity = np.arange(len(late))
        return OutputRows(
            KIND_LATE,
            n,
            {
                "slot": [slot] * n,
                self._key: np.repeat(late[self._key].to_numpy(object), repeats),
                "event_id": _flat(late, identity, "event_ids"),
                **self._payload(late, identity),
                "event_time_ms": _flat(late, identity, "event_times_ms"),
                "window_start_ms": starts,
                "window_end_ms": starts + self._window_ms,
                "watermark_ms": watermark_ms,
                "kafka_partition": np.repeat(late["kafka_partition"].to_numpy(np.int64), repeats),
                "kafka_offset": _flat(late, identity, "kafka_offsets"),
            },
        )

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        """Emit every pending window of this slot whose end the watermark has reached and set
        the slot's next timer (module docstring); as one frame, like `handleInputRows`."""
        yield from one_frame(self._handing_over(key, timerValues, self._expired_timer_rows(key, timerValues)), self._output_columns)

    def _handing_over(self, key: Any, timerValues: TimerValues, pieces: Iterator[OutputRows]) -> Iterator[OutputRows]:
        """`pieces`, then, in a switch's barrier batch, this slot token's state as it is after
        them (`keyshift.processing.operators.handover.snapshot_rows`). Its timers are those that
        outlive the batch: Spark fires (and then deletes) every timer below the batch's watermark
        W, after the input and while `handleExpiredTimer` runs, so those are left out."""
        yield from pieces
        if handover_requested():
            token = int(key[0])
            watermark_ms = timerValues.getCurrentWatermarkInMs()
            yield from snapshot_rows(self._slot_of_token.get(token, -1), _partition_id(), self._key,
                                     ((PENDING_STATE_NAME, self._pending), (CLOCK_STATE_NAME, self._clocks)),
                                     (t for t in self._handle.listTimers() if t >= watermark_ms))

    def _expired_timer_rows(self, key: Any, timerValues: TimerValues) -> Iterator[OutputRows]:
        token = int(key[0])
        spark_watermark_ms = timerValues.getCurrentWatermarkInMs()
        watermark_ms = max(spark_watermark_ms, self._watermark_floor_ms)
        if self._closed_at == (token, watermark_ms):
            return  # an earlier timer of this slot at this watermark already closed everything
        self._closed_at = (token, watermark_ms)
        slot = self._slot_of_token.get(token, -1)
        if self._policy.per_key:
            yield from self._close_by_fallback(slot, spark_watermark_ms, watermark_ms)
            return
        self._closing = []
        self._schedule(self._close_pending(lambda _key, _clock: watermark_ms), spark_watermark_ms)
        if self._closing:
            yield self._closed_windows(slot, _partition_id(), watermark_ms)

    def close(self) -> None:
        """Nothing to release."""

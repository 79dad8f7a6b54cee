"""Key windows in a Structured Streaming query: a stateful processor grouped by slot token.

Sliding windows of size p and slide s per key (e.g. 1 h every 1 min), computed with key windows
(paper 003, Cheng 2023, §4; `keyshift.eventtime.key_windows`): a key's result is emitted only
where it changes, when an event enters or leaves the key's window, so n events give at most 2n
updates instead of Spark's up to p·n/s (key, window) rows. Expanded with
`keyshift.eventtime.key_windows.expand_updates`, the updates are exactly the rows of Spark's native
`groupBy(window(ts, p, s), key).agg(count, sum, max)` over the same (on-time) events.

It runs inside `df.groupBy("token").transformWithStateInPandas(KeyWindowProcessor(...),
outputStructType=processor.output_schema, outputMode="Append", timeMode="EventTime")` (DESIGN.md,
"How a strategy reaches Spark's stateful stage"): Spark calls it once per slot token per
micro-batch with all rows of that slot; each key's state lives in a MapState keyed by the real key.

Input: one row per event, columns (names from `KeyWindowColumns`; types as in Spark):
    key (string), event time (long, epoch ms UTC), value (long), event id (long),
    source partition (int) and offset (long) (Kafka coordinates, or any per-source sequence:
    they give the arrival order a key's clock sees), and the slot token (int, the grouping key).
A row whose key is NULL is an end-of-input marker (below): skipped, not counted. A NULL event
time or value in an event is a `DataError` (validate records before this stage).
Drop the event-time timestamp column (the `withWatermark` one) before `groupBy("token")`: the
processor decides lateness itself and sends late events out; Spark must not filter them first.

State (declared in `KEY_WINDOW_STATE_VARIABLES` so `keyshift.migration` can move it):
- MapState `key_window_state`: real key -> (`state`: binary), the key's packed
  `keyshift.eventtime.key_windows.KeyWindowState`: a 48-byte header (version, the key's
  final-through watermark, its last emitted count/sum/max, n) and its kept events (time and
  value, 16 bytes each): the events still inside a window that is not final. Bytes per key =
  48 + 16·n, with n about the key's events in the last p + s (plus the bound) of event time.
  A key with no kept event has no entry.
- MapState `key_window_clocks` (modes `key`, `nkey`, `dynamic`): clock name (the key, or `#g` for
  an nkey group) -> `keyshift.eventtime.watermarks.KeyClock` (4 longs + `recent` bytes): 40 bytes
  per key, + 8 per remembered time in `dynamic` mode. A clock is freed as soon as it no longer
  lifts its key above the fallback.
Per batch and map: one `keys()` listing of the slot's map keys (so that a key without state costs
no read: Spark's state server logs a warning for every read of a missing key), one `getValue`
per touched key that has state and at most one `updateValue`/`removeKey` per touched key, never
per event; a timer pass iterates the slot's maps once.

Watermarks (`keyshift.eventtime.watermarks.WatermarkPolicy`; the query's `withWatermark` delay
must be `policy.spark_delay_ms`, all in ms of event time):
- `global`: a key's watermark is Spark's watermark W (never below `watermark_floor_ms`).
- `key` / `nkey` / `dynamic`: wm_k = max(max event time of k (or its group) - bound,
  fallback W) as in `watermarks.py`; W is Spark's watermark with the idle lag as its delay.
An event at t is **late** when its first window [enter(t), leave(t)) ends at or before its key's
watermark before the batch (leave(t) = floor(t/s)·s + s <= wm_k): some of its windows were
already final. Late events are never dropped silently: they go out as rows of kind `late`, whole
(key windows do not count them in any window; Spark's native aggregation would count them in
their still-open windows: route them to a side output either way). The key's updates become
final, and are emitted, once its watermark after the batch reaches start + p.

Timers close what the fallback passes: after each batch and each timer pass, the slot keeps one
event-time timer at its earliest wake-up (the next pending update point + p of any key, or a
clock's own watermark, when a clock could be freed); Spark fires it once W passes it, and the
pass advances every key of the slot to its watermark. **End of input**: a marker row (NULL key)
with a far-future event time (e.g. 9999-12-31, `END_OF_INPUT_EVENT_TIME_MS`, as
`keyshift.processing.sources.kafka_input.send_end_of_input` writes) passes the query's `withWatermark`, is
skipped here, and pushes W past every window; in the next (no-data) batch the timers fire and
every key is flushed (all updates final, as `key_windows.FLUSH_MS` would, all state and clocks
freed). One marker anywhere suffices; one per token is harmless.

Output rows (`key_window_output_schema`), tagged by `kind`:
- `key_window`: key, `start_ms`, `count`, `sum`, `max` (NULL when count is 0): the result of the
  window [start_ms, start_ms + p) and of every later aligned window start until the key's next
  update; one row per change, final; `watermark_ms` = the key's watermark that made it final.
- `late`: one row per late event with its key, time, value, id, partition, offset and the
  `watermark_ms` it was late against.
- `load`: one row per slot per batch: `count` = events the slot processed (late ones included;
  dead letters not).
- `retired`: `count` = events that left the slot's state for good in this call: every window
  holding them is final and its updates are emitted (one row per call that retired any).
- `dead_letter` (only with `KeyWindowColumns(dead_letters=True)`): an input row whose
  `dead_letter_reason` is set, passed through whole (reason, raw payload, partition, offset),
  never counted as an event, as `KeyedWindowProcessor` passes them.
Every row carries `slot`, `partition_id` (the Spark partition: `TaskContext`) and
`global_watermark_ms` (W, after the floor). Over a run: events = Σ load.count = Σ retired.count
+ late rows + events still kept in state (`key_window_state`'s n per key; 0 once drained); the
updates count each retired event in every window that held it.

Not supported (ConfigurationError at construction): the `timeout` idle fallback. A key split
over several slots (hot_split) cannot be migrated (its pieces' emitted results do not merge).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from pyspark import TaskContext
from pyspark.sql import types as T
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from keyshift.errors import ConfigurationError, DataError
from keyshift.eventtime.key_windows import STATE_BYTES_PER_EVENT, STATE_HEADER_BYTES, KeyWindowState, SlidingWindow, advance_keys
from keyshift.eventtime.watermarks import KeyClock, WatermarkPolicy, advance_clock, is_group_clock, watermark_key
from keyshift.processing.operators.state_variables import MapStateVariable, restore_initial_state
from keyshift.processing.operators.output_rows import OutputRows, one_frame
from keyshift.deferred_import import deferred_module

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)

KIND_KEY_WINDOW = "key_window"
KIND_LATE = "late"
KIND_LOAD = "load"
KIND_RETIRED = "retired"
KIND_DEAD_LETTER = "dead_letter"

DEAD_LETTER_COLUMNS = ("dead_letter_reason", "raw_value", "raw_encoding", "raw_key_base64")
"""Input and output columns (strings) of a dead letter, with `KeyWindowColumns(dead_letters=True)`
(as `keyshift.processing.operators.records.with_dead_letter_payload` makes them)."""

END_OF_INPUT_EVENT_TIME_MS = 253_402_300_799_000
"""9999-12-31T23:59:59Z: the event time of an end-of-input marker (the same as the Kafka jobs'
`keyshift.processing.sources.kafka_input.END_OF_INPUT_EVENT_TIME_MS`): past every real event."""

WINDOW_STATE_NAME = "key_window_state"
WINDOW_KEY_SCHEMA = T.StructType([T.StructField("key", T.StringType(), False)])
WINDOW_VALUE_SCHEMA = T.StructType([T.StructField("state", T.BinaryType(), False)])
"""MapState `key_window_state`: real key -> its packed `KeyWindowState` (48 + 16·n bytes)."""

CLOCK_STATE_NAME = "key_window_clocks"
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
"""MapState `key_window_clocks`: clock name -> `KeyClock.as_value()` (40 bytes + 8 per recent time)."""


def merge_clocks(values: list[tuple]) -> tuple:
    """Fold one clock held on several old slots (an nkey group) into one for a switch: the
    smallest max event time (nothing a slot still waited for becomes late), the largest
    closed-through, the latest last-seen time, the largest bound, the recent times seen last."""
    clocks = [KeyClock.from_value(v) for v in values]
    latest = max(clocks, key=lambda c: c.last_seen_ms)
    return KeyClock(min(c.max_event_time_ms for c in clocks), max(c.closed_through_ms for c in clocks),
                    latest.last_seen_ms, max(c.bound_ms for c in clocks), latest.recent).as_value()


KEY_WINDOW_STATE_VARIABLES = (
    MapStateVariable(WINDOW_STATE_NAME, WINDOW_KEY_SCHEMA, WINDOW_VALUE_SCHEMA, merge=None),
    MapStateVariable(CLOCK_STATE_NAME, CLOCK_KEY_SCHEMA, CLOCK_VALUE_SCHEMA, merge=merge_clocks, broadcast=is_group_clock),
)
"""The state `KeyWindowProcessor` keeps, for a switch to read, re-key and restore
(`keyshift.migration.state`); its timers move with the keys too. The window state declares no
merge: a key found on several slots is a JobError."""

_FIXED_OUTPUT = ("kind", "slot", "partition_id", "start_ms", "count", "sum", "max", "watermark_ms", "global_watermark_ms")


@dataclass(frozen=True)
class KeyWindowColumns:
    """Column names of the processor's input (and of the matching output columns).

    Attributes:
        key: the real key (string), e.g. `origin`.
        event_time_ms: event time, epoch ms UTC (long).
        value: the aggregated value (long), e.g. `delay_min`.
        event_id: the event's id (long), carried to `late` rows.
        partition, offset: source coordinates (int, long): Kafka partition and offset, or a
            file index and row number; a key's events are fed to its clock in this order.
        token: the grouping column (int slot token); input only.
        dead_letters: the input also has the string columns `DEAD_LETTER_COLUMNS`; a row with
            `dead_letter_reason` set is a dead letter, passed out as kind `dead_letter` (its key,
            time and value may be NULL); the output schema gets those columns too.

    Raises:
        ConfigurationError: names repeat, or collide with the fixed output columns
            (`kind`, `slot`, `partition_id`, `start_ms`, `count`, `sum`, `max`, `watermark_ms`,
            `global_watermark_ms`).
    """

    key: str = "key"
    event_time_ms: str = "event_time_ms"
    value: str = "value"
    event_id: str = "event_id"
    partition: str = "kafka_partition"
    offset: str = "kafka_offset"
    token: str = "token"
    dead_letters: bool = False

    def __post_init__(self) -> None:
        names = [self.key, self.event_time_ms, self.value, self.event_id, self.partition, self.offset, self.token]
        if self.dead_letters:
            names += list(DEAD_LETTER_COLUMNS)
        if len(set(names)) != len(names):
            raise ConfigurationError(f"key window input columns must be distinct, got {names}")
        if clash := [n for n in names if n in _FIXED_OUTPUT]:
            raise ConfigurationError(f"column name(s) {clash} collide with the processor's output columns {list(_FIXED_OUTPUT)}")


def key_window_output_schema(columns: KeyWindowColumns = KeyWindowColumns()) -> T.StructType:
    """Schema of every row `KeyWindowProcessor` emits (columns a kind does not use are NULL):
    kind, slot, partition_id, <key>, start_ms, count, sum, max, <event_time_ms>, <value>,
    <event_id>, <partition>, <offset>, watermark_ms, global_watermark_ms (ms are event time), and
    with `columns.dead_letters` the `DEAD_LETTER_COLUMNS` (strings)."""
    dead = [T.StructField(name, T.StringType(), True) for name in DEAD_LETTER_COLUMNS] if columns.dead_letters else []
    return T.StructType(
        [
            T.StructField("kind", T.StringType(), False),
            T.StructField("slot", T.IntegerType(), True),
            T.StructField("partition_id", T.IntegerType(), True),
            T.StructField(columns.key, T.StringType(), True),
            T.StructField("start_ms", T.LongType(), True),
            T.StructField("count", T.LongType(), True),
            T.StructField("sum", T.LongType(), True),
            T.StructField("max", T.LongType(), True),
            T.StructField(columns.event_time_ms, T.LongType(), True),
            T.StructField(columns.value, T.LongType(), True),
            T.StructField(columns.event_id, T.LongType(), True),
            T.StructField(columns.partition, T.IntegerType(), True),
            T.StructField(columns.offset, T.LongType(), True),
            T.StructField("watermark_ms", T.LongType(), True),
            T.StructField("global_watermark_ms", T.LongType(), True),
            *dead,
        ]
    )


def _partition_id() -> int:
    """The Spark partition this code runs in (-1 outside a Spark task, e.g. in TwsTester)."""
    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _kept(states) -> int:
    """Events kept in packed `KeyWindowState`s (None: no state), from their byte lengths."""
    return sum((len(data) - STATE_HEADER_BYTES) // STATE_BYTES_PER_EVENT for data in states if data is not None)


def _int64(name: str, series: pd.Series) -> np.ndarray:
    if series.isna().any():
        raise DataError(f"{int(series.isna().sum())} event(s) have no {name}; validate records before the key window stage")
    return series.to_numpy(np.int64)


class KeyWindowProcessor(StatefulProcessor):
    """Sliding windows per key as key window updates (module docstring); Spark ships it to its
    Python workers and calls it per slot token and batch.

    Args:
        tokens: slot -> token (`keyshift.placement.tokens.slot_tokens(P, S)`), to name each group's slot.
        window: the sliding window (size p, slide s, ms of event time).
        policy: watermark mode and parameters (default `global` with a one-hour bound); the
            query's `withWatermark` delay must be `policy.spark_delay_ms`.
        columns: input column names (`KeyWindowColumns`), e.g. key="origin", value="delay_min".
        watermark_floor_ms: after a switch, the old query's next watermark (ms of event time):
            W is taken as max(Spark's watermark, floor), since a new checkpoint starts at 0.

    Attributes:
        output_schema: `key_window_output_schema(columns)`, the `outputStructType` to pass.

    Raises:
        ConfigurationError: the `timeout` idle fallback (not supported), or bad column names.
    """

    def __init__(self, tokens: tuple[int, ...] | list[int], window: SlidingWindow, policy: WatermarkPolicy | None = None,
                 columns: KeyWindowColumns = KeyWindowColumns(), watermark_floor_ms: int = 0) -> None:
        self._slot_of_token = {int(token): slot for slot, token in enumerate(tokens)}
        self._window = window
        self._policy = policy or WatermarkPolicy()
        if self._policy.idle_fallback != "global":
            raise ConfigurationError(f"key windows support the 'global' idle fallback only, got {self._policy.idle_fallback!r}")
        self._columns = columns
        self._floor_ms = int(watermark_floor_ms)
        self.output_schema = key_window_output_schema(columns)
        self._output_columns = self.output_schema.fieldNames()
        self._dynamic = None
        if self._policy.mode == "dynamic":
            from keyshift.eventtime.disorder import DynamicBound

            self._dynamic = DynamicBound(k=self._policy.history, max_bound_ms=self._policy.bound_ms)
        self._clock_names: dict[str, str] = {}
        self._passed_at: tuple[int, int] | None = None

    # ---------------------------------------------------------------------------- Spark's calls

    def __setstate__(self, state: dict) -> None:
        """Unpickled on a Python worker (before it reads any input): put transformWithStateInPandas'
        column-wise input in place (`keyshift.processing.operators.tws_input.install`), then restore."""
        from keyshift.processing.operators.tws_input import install

        install()
        self.__dict__.update(state)

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare both MapStates (the clocks are used by per-key modes only, declared always so
        every run has one state layout)."""
        self._handle = handle
        self._windows = handle.getMapState(WINDOW_STATE_NAME, WINDOW_KEY_SCHEMA, WINDOW_VALUE_SCHEMA)
        self._clocks = handle.getMapState(CLOCK_STATE_NAME, CLOCK_KEY_SCHEMA, CLOCK_VALUE_SCHEMA)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:
        """Restore the state and timers a switch migrated onto this token (first batch only)."""
        restore_initial_state(initialState, {WINDOW_STATE_NAME: self._windows, CLOCK_STATE_NAME: self._clocks},
                              self._handle.registerTimer, KEY_WINDOW_STATE_VARIABLES)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        """One slot's micro-batch: late events out, the rest into the keys' windows, final updates out.

        Per touched key: its state and clock are read once; lateness is judged against its
        watermark before the batch; the clock advances with all the key's events (late ones
        too, in source order); `advance_keys` adds the on-time events and emits the updates the
        key's new watermark makes final; state and clock are written once (or removed). All of
        it as one frame of `output_schema` rows.
        """
        yield from one_frame(self._input_rows(key, rows, timerValues), self._output_columns)

    def _input_rows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[OutputRows]:
        c = self._columns
        token = int(key[0])
        slot = self._slot_of_token.get(token, -1)
        partition_id = _partition_id()
        fallback = max(int(timerValues.getCurrentWatermarkInMs()), self._floor_ms)
        chunks = []
        for chunk in rows:
            if c.dead_letters:
                rejected = chunk["dead_letter_reason"].notna()
                if rejected.any():
                    yield self._dead_letter_rows(chunk[rejected], slot, partition_id, fallback)
                    chunk = chunk[~rejected]
            chunk = chunk[chunk[c.key].notna()]  # NULL key: an end-of-input marker
            if len(chunk):
                chunks.append(chunk)
        events = (chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)) if chunks else None
        n = 0 if events is None else len(events)
        yield OutputRows(KIND_LOAD, 1, {"slot": [slot], "partition_id": [partition_id], "count": [n], "global_watermark_ms": [fallback]})
        if not n:
            return

        keys = events[c.key].to_numpy(object)
        times = _int64(c.event_time_ms, events[c.event_time_ms])
        values = _int64(c.value, events[c.value])
        codes, distinct = pd.factorize(keys)
        distinct = list(distinct)
        old: dict[Hashable, bytes | None] = {}
        before = np.empty(len(distinct), dtype=np.int64)  # each key's watermark before the batch
        present = {k for (k,) in self._windows.keys()}  # one listing, so no read misses
        for i, k in enumerate(distinct):  # one read per touched key that has state
            value = self._windows.getValue((k,)) if k in present else None
            old[k] = bytes(value[0]) if value is not None else None
            before[i] = KeyWindowState.unpack(old[k]).final_through_ms if old[k] is not None else fallback
        now_ms = int(time.time() * 1000)
        after, clocks, existed = self._advance_clocks(distinct, codes, times, events, fallback, before, now_ms)

        late = self._window.leave_ms(times) <= before[codes]
        if late.any():
            yield self._late_rows(events[late], slot, partition_id, before[codes][late], fallback)
        on_time = ~late
        final = dict(zip(distinct, after.tolist()))
        new, updates = advance_keys(old, keys[on_time], times[on_time], values[on_time], final, self._window)
        retired = _kept(old.values()) + int(on_time.sum()) - _kept(new.values())
        if retired:
            yield self._retired(retired, slot, partition_id, fallback)
        for k in distinct:  # one write per touched key, none when nothing changed
            if new[k] is None:
                if old[k] is not None:
                    self._windows.removeKey((k,))
            elif new[k] != old[k]:
                self._windows.updateValue((k,), (new[k],))
        self._store_clocks(clocks, existed, fallback)
        self._schedule(list(new.values()), clocks.values(), fallback)
        if len(updates):
            yield self._update_rows(updates, final, slot, partition_id, fallback)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        """Spark's watermark W passed the slot's wake-up: advance every key of the slot to its
        watermark (W in global mode, max(own, W) per clock), emit what became final, free the
        state and clocks W made redundant, schedule the next wake-up. Several timers of one slot
        due at one W make one pass. As one frame, like `handleInputRows`."""
        yield from one_frame(self._expired_timer_rows(key, timerValues), self._output_columns)

    def _expired_timer_rows(self, key: Any, timerValues: TimerValues) -> Iterator[OutputRows]:
        token = int(key[0])
        fallback = max(int(timerValues.getCurrentWatermarkInMs()), self._floor_ms)
        if self._passed_at == (token, fallback):
            return
        self._passed_at = (token, fallback)
        slot = self._slot_of_token.get(token, -1)
        old = {k: bytes(v[0]) for (k,), v in self._windows.iterator()}
        clocks: dict[str, KeyClock] = {}
        if self._policy.per_key:
            clocks = {name: KeyClock.from_value(v) for (name,), v in self._clocks.iterator()}
        final = {k: (clocks[name].watermark_ms(fallback) if (name := self._clock_name(k)) in clocks else fallback) for k in old}
        updates = None
        if old:
            new, updates = advance_keys(old, np.empty(0, dtype=object), np.empty(0, np.int64), np.empty(0, np.int64), final, self._window)
            for k, data in new.items():
                if data is None:
                    self._windows.removeKey((k,))
                elif data != old[k]:
                    self._windows.updateValue((k,), (data,))
            remaining = list(new.values())
            retired = _kept(old.values()) - _kept(remaining)
            if retired:
                yield self._retired(retired, slot, _partition_id(), fallback)
        else:
            remaining = []
        kept = {}
        for name, clock in clocks.items():
            if clock.redundant(fallback):
                self._clocks.removeKey((name,))
            else:
                kept[name] = clock
        self._schedule(remaining, kept.values(), fallback)
        if updates is not None and len(updates):
            yield self._update_rows(updates, final, slot, _partition_id(), fallback)

    def close(self) -> None:
        """Nothing to release."""

    # ---------------------------------------------------------------------------- helpers

    def _clock_name(self, key: str) -> str:
        """The clock holding `key`'s watermark (itself, or its nkey group), cached."""
        name = self._clock_names.get(key)
        if name is None:
            name = self._clock_names[key] = watermark_key(key, self._policy)
        return name

    def _advance_clocks(self, distinct: list, codes: np.ndarray, times: np.ndarray, events: pd.DataFrame, fallback: int,
                        before: np.ndarray, now_ms: int) -> tuple[np.ndarray, dict[str, KeyClock], dict[str, bool]]:
        """Raise `before` (per touched key, from its window state) to the key's watermark before the
        batch, advance the touched clocks with the batch's events; return each key's watermark
        after the batch, the new clocks and which of them existed. Global mode: W for both."""
        if not self._policy.per_key:
            np.maximum(before, fallback, out=before)
            return before.copy(), {}, {}
        c = self._columns
        names = [self._clock_name(k) for k in distinct]
        name_codes, clock_names = pd.factorize(np.asarray(names, dtype=object))
        clocks: dict[str, KeyClock | None] = {}
        present = {name for (name,) in self._clocks.keys()}
        for name in clock_names:  # one read per touched clock that exists
            value = self._clocks.getValue((name,)) if name in present else None
            clocks[name] = KeyClock.from_value(value) if value is not None else None
        existed = {name: clock is not None for name, clock in clocks.items()}
        wm_before = np.array([cl.watermark_ms(fallback) if cl is not None else fallback for cl in clocks.values()], np.int64)
        np.maximum(before, wm_before[name_codes], out=before)
        event_clock = name_codes[codes]
        arrival = np.lexsort((events[c.offset].to_numpy(np.int64), events[c.partition].to_numpy(np.int64), event_clock))
        bounds = np.searchsorted(event_clock[arrival], np.arange(len(clock_names) + 1))
        ordered = times[arrival]
        for i, name in enumerate(clock_names):
            clocks[name] = advance_clock(clocks[name], ordered[bounds[i]:bounds[i + 1]], now_ms, self._policy, self._dynamic)
        wm_after = np.array([clocks[name].watermark_ms(fallback) for name in clock_names], np.int64)
        return np.maximum(before, wm_after[name_codes]), clocks, existed

    def _store_clocks(self, clocks: dict[str, KeyClock], existed: dict[str, bool], fallback: int) -> None:
        """Write the touched clocks back, or free those that no longer lift a key above W."""
        for name, clock in list(clocks.items()):
            if clock.redundant(fallback):
                if existed[name]:
                    self._clocks.removeKey((name,))
                del clocks[name]
            else:
                self._clocks.updateValue((name,), clock.as_value())

    def _schedule(self, states: list[bytes | None], clocks, fallback: int) -> None:
        """Keep an event-time timer at the slot's earliest wake-up among `states` and `clocks`.

        A key's next wake-up is when its next pending update point w (the smallest enter or
        leave point of its kept events above final-through - p) becomes final: W >= w + p; a
        clock's is when W reaches its own watermark (it becomes redundant). Spark fires a timer
        when W > expiry, so the timer is at wake-up - 1 (at wake-up when that is not above W).
        One `listTimers` call; nothing is registered when a timer at or before it is pending.
        """
        size = self._window.size_ms
        wake = []
        for data in states:
            if data is None:
                continue
            state = KeyWindowState.unpack(data)
            enter = self._window.enter_ms(state.times_ms)
            points = np.where(enter > state.final_through_ms - size, enter, self._window.leave_ms(state.times_ms))
            wake.append(int(points.min()) + size)
        wake.extend(clock.own_watermark_ms() for clock in clocks)
        if not wake:
            return
        expiry = min(wake) - 1
        if expiry <= fallback:
            expiry = fallback + 1
        if any(fallback < t <= expiry for t in self._handle.listTimers()):
            return
        self._handle.registerTimer(int(expiry))

    def _update_rows(self, updates: pd.DataFrame, final: dict, slot: int, partition_id: int, fallback: int) -> OutputRows:
        n = len(updates)
        keys = updates["key"].to_numpy(object)
        maxes = updates["max"]
        return OutputRows(KIND_KEY_WINDOW, n, {
            "slot": [slot] * n, "partition_id": [partition_id] * n, self._columns.key: keys,
            "start_ms": updates["start_ms"].to_numpy(np.int64), "count": updates["count"].to_numpy(np.int64),
            "sum": updates["sum"].to_numpy(np.int64),
            "max": np.where(maxes.isna().to_numpy(), None, maxes.fillna(0).to_numpy(np.int64).astype(object)),
            "watermark_ms": np.array([final[k] for k in keys], dtype=np.int64), "global_watermark_ms": [fallback] * n,
        })

    def _retired(self, events: int, slot: int, partition_id: int, fallback: int) -> OutputRows:
        """One `retired` row: `events` left the slot's state for good in this call."""
        return OutputRows(KIND_RETIRED, 1, {"slot": [slot], "partition_id": [partition_id], "count": [int(events)],
                                            "global_watermark_ms": [fallback]})

    def _dead_letter_rows(self, dead: pd.DataFrame, slot: int, partition_id: int, fallback: int) -> OutputRows:
        """`dead_letter` rows: the rejected input rows with their reason, raw payload and coordinates."""
        c, n = self._columns, len(dead)
        return OutputRows(KIND_DEAD_LETTER, n, {
            "slot": [slot] * n, "partition_id": [partition_id] * n,
            **{name: dead[name].tolist() for name in DEAD_LETTER_COLUMNS},
            c.partition: dead[c.partition].tolist(), c.offset: dead[c.offset].tolist(), "global_watermark_ms": [fallback] * n,
        })

    def _late_rows(self, late: pd.DataFrame, slot: int, partition_id: int, watermarks: np.ndarray, fallback: int) -> OutputRows:
        c, n = self._columns, len(late)
        return OutputRows(KIND_LATE, n, {
            "slot": [slot] * n, "partition_id": [partition_id] * n, c.key: late[c.key].to_numpy(object),
            c.event_time_ms: late[c.event_time_ms].to_numpy(np.int64), c.value: late[c.value].to_numpy(np.int64),
            c.event_id: late[c.event_id].to_numpy(), c.partition: late[c.partition].to_numpy(),
            c.offset: late[c.offset].to_numpy(), "watermark_ms": watermarks, "global_watermark_ms": [fallback] * n,
        })

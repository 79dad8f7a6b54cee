"""Key windows for dense sliding windows (paper 003, Cheng 2023, §4).

A sliding window of size p and slide s (both in ms of event time, p a multiple of s) gives each
event up to p / s windows. Spark's native `window(ts, size, slide)` aggregation keeps and emits a
row for every (key, window) that holds an event: up to p·n/s rows for n events (paper 003 §4.3).
Yet a key's result, seen as a function of the window start, only changes where an event enters
or leaves the window (§4.1, Fig. 5: the left key window of an event is where it enters, the right
key window where it leaves, §4.2). Key windows emit one update per change: at most 2n for n
events, whatever p / s is.

**Alignment (exactly Spark's).** Window starts w are the multiples of s from the UTC epoch (Spark's
default startTime 0); the window [w, w + p) holds the events with w <= t < w + p. With
`floor` the floor division (also below 1970):

* an event at t is in the windows whose start w runs over the aligned starts from
  `enter(t) = floor(t / s)·s + s − p` (the first aligned start > t − p) through `floor(t / s)·s`
  (the last aligned start <= t), i.e. the half-open range [enter(t), leave(t)) with
  `leave(t) = floor(t / s)·s + s` (the first aligned start at which the event is gone);
* so a key's result at window start w comes from its events with w <= floor(t / s)·s < w + p,
  and it can only change at an `enter` or a `leave` point.

**A key window update** is a row (key, `start_ms`, `count`, `sum`, `max`): the result of the
window starting at `start_ms` and of every later aligned window start until the key's next
update. A key's updates are the run-length encoding of its result as a function of the window
start: an update is emitted only where the result differs from the one before it (before a key's
first update the result is empty). An empty result (no event in the window: Spark emits no row)
is an update with count 0, sum 0 and max missing (`pd.NA`); the last update of a key always is one.
`expand_updates` turns updates back into the rows Spark's native aggregation gives.

Aggregates: count, sum and max of one int64 value column (for the flights: `delay_min`), as
Spark's count, sum and max of a long column give them (sums exact while they fit in int64). Max cannot be undone when an event leaves; since the state keeps the events still inside a window
anyway (§4.2 stores no more than that), max is recomputed over them vectorized (a range-maximum
query per update over the events sorted by time).

Everything is vectorized with numpy: no Python loop per event (there is one per key only where
bytes of one key's state are packed or unpacked).

**Incremental use** (a streaming stateful processor that sees a key's events micro-batch by
micro-batch): `advance` / `advance_keys` keep per key the events still inside some open window
plus the last emitted result, packed to bytes (`KeyWindowState.pack`) for a binary field of a
Spark `MapState`, and emit the updates that became final under the key's watermark. See
`advance_keys` for the precondition that makes the concatenated updates equal the batch result.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from keyshift.errors import ConfigurationError, DataError
from keyshift.deferred_import import deferred_module

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)

UPDATE_COLUMNS: tuple[str, ...] = ("start_ms", "count", "sum", "max")
"""Columns of an updates frame (after the key column, when there is one)."""

EXPANDED_COLUMNS: tuple[str, ...] = ("window_start_ms", "window_end_ms", "count", "sum", "max")
"""Columns of `expand_updates`' output (after the key column, when there is one)."""

FLUSH_MS = np.iinfo(np.int64).max
"""A `final_through_ms` that finalizes every update (the end of the input: all windows closed)."""

STATE_VERSION = 1
"""Format version of a packed `KeyWindowState` (the first int64 of its bytes)."""

STATE_HEADER_BYTES = 48
"""Bytes of a packed state before its events: six little-endian int64 (see `KeyWindowState.pack`)."""

STATE_BYTES_PER_EVENT = 16
"""Bytes per kept event in a packed state: its time (int64 ms) and its value (int64)."""

_NO_BOUND = np.iinfo(np.int64).min
_INT64 = np.dtype("<i8")


class LateEventError(DataError):
    """An event given to `advance` belongs only to windows already final for its key.

    Its updates would correct results already emitted. Route such events to the late output
    before calling `advance` (`late_events` finds them).
    """


@dataclass(frozen=True)
class SlidingWindow:
    """A sliding event-time window: size p and slide s in ms of event time, Spark-aligned.

    Attributes:
        size_ms: p, the window length in ms (> 0, a multiple of `slide_ms`).
        slide_ms: s, the distance between consecutive window starts in ms (> 0). `size_ms ==
            slide_ms` is a tumbling window.

    Raises:
        ConfigurationError: if either is not a positive integer or the size is not a multiple of
            the slide.
    """

    size_ms: int
    slide_ms: int

    def __post_init__(self) -> None:
        for name in ("size_ms", "slide_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ConfigurationError(f"window {name} must be an integer number of ms, got {value!r}")
            if value <= 0:
                raise ConfigurationError(f"window {name} must be > 0 ms, got {value}")
            object.__setattr__(self, name, int(value))
        if self.size_ms % self.slide_ms:
            raise ConfigurationError(
                f"window size {self.size_ms} ms is not a multiple of its slide {self.slide_ms} ms; "
                f"use a size of {self.size_ms // self.slide_ms * self.slide_ms or self.slide_ms} or "
                f"{(self.size_ms // self.slide_ms + 1) * self.slide_ms} ms"
            )

    @property
    def windows_per_event(self) -> int:
        """p / s: the number of windows that hold one event."""
        return self.size_ms // self.slide_ms

    def last_start_ms(self, times_ms: np.ndarray | int) -> np.ndarray:
        """floor(t / s)·s: the start of the last window holding each event (int64, same shape)."""
        times = np.asarray(times_ms, dtype=np.int64)
        return times - np.mod(times, self.slide_ms)

    def enter_ms(self, times_ms: np.ndarray | int) -> np.ndarray:
        """floor(t / s)·s + s − p: the first aligned window start holding each event (int64)."""
        return self.last_start_ms(times_ms) + (self.slide_ms - self.size_ms)

    def leave_ms(self, times_ms: np.ndarray | int) -> np.ndarray:
        """floor(t / s)·s + s: the first aligned window start past each event (int64)."""
        return self.last_start_ms(times_ms) + self.slide_ms

    def native_window_bound(self, events: int) -> int:
        """p·n/s: the most (key, window) rows Spark's native way creates for `events` events."""
        return events * self.windows_per_event


# --------------------------------------------------------------------------------------------
# the vectorized core


def _as_int64(name: str, values: Iterable | np.ndarray | pd.Series) -> np.ndarray:
    """A 1-D int64 numpy array of `values`; ConfigurationError on nulls, floats with fractions, or 2-D."""
    if isinstance(values, pd.Series) and values.hasnans:
        raise ConfigurationError(f"{name} holds {int(values.isna().sum())} missing values; drop them first")
    array = np.asarray(values)
    if array.ndim != 1:
        raise ConfigurationError(f"{name} must be 1-D, got shape {array.shape}")
    if array.dtype.kind == "f":
        if np.isnan(array).any() or not np.array_equal(array, np.floor(array)):
            raise ConfigurationError(f"{name} must hold whole numbers (int64), got floats with NaN or fractions")
    elif array.dtype.kind not in "iub" and array.size:
        raise ConfigurationError(f"{name} must be integers (int64), got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _minus(marks: np.ndarray, ms: int) -> np.ndarray:
    """marks − ms without wrapping below int64's minimum (the "no watermark" value stays minimal)."""
    return np.where(marks < _NO_BOUND + ms, _NO_BOUND, marks - ms)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i]:hi[i]]) for every i, 0 where the range is empty.

    A sparse table built one level at a time (level k holds the max of 2^k consecutive values),
    answering each query at its level floor(log2(hi − lo)) from two overlapping blocks, so memory
    stays O(n) and time O((n + q) · log(longest range)).
    """
    out = np.zeros(len(lo), dtype=np.int64)
    length = hi - lo
    query = np.flatnonzero(length > 0)
    if query.size == 0:
        return out
    level = np.frexp(length[query].astype(np.float64))[1] - 1  # floor(log2(length)), exact below 2**53
    order = np.argsort(level, kind="stable")
    query, level = query[order], level[order]
    bounds = np.searchsorted(level, np.arange(int(level[-1]) + 2))
    table = values
    for k in range(int(level[-1]) + 1):
        if k:
            half = 1 << (k - 1)
            table = np.maximum(table[:-half], table[half:])
        at = query[bounds[k]:bounds[k + 1]]
        if at.size:
            out[at] = np.maximum(table[lo[at]], table[hi[at] - (1 << k)])
    return out


@dataclass(frozen=True)
class _Points:
    """Every change point of every key, one row per distinct (key code, window start), sorted."""

    codes: np.ndarray  # int64 key code
    starts: np.ndarray  # int64 window start, ms
    counts: np.ndarray  # int64
    sums: np.ndarray  # int64
    maxes: np.ndarray  # int64, 0 where count == 0


def _change_points(codes: np.ndarray, times: np.ndarray, values: np.ndarray, window: SlidingWindow) -> _Points:
    """The result of every key at each of its enter and leave points (no run-length step yet).

    A sweep: +1 at each event's enter point, −1 at its leave point, sorted by (key, point). With
    the events sorted by (key, time), the events inside key k's window at point w are a contiguous
    slice [lo, hi): hi = events entered by w, lo = events left by w, both counted globally (all of
    an earlier key's events have entered and left before key k's first point), so count, sum
    (prefix sums) and max (`_range_max`) come from that slice.
    """
    order = np.lexsort((times, codes))
    codes, times, values = codes[order], times[order], values[order]
    n = len(times)
    point_codes = np.concatenate([codes, codes])
    points = np.concatenate([window.enter_ms(times), window.leave_ms(times)])
    entering = np.zeros(2 * n, dtype=bool)
    entering[:n] = True
    by_point = np.lexsort((points, point_codes))
    point_codes, points, entering = point_codes[by_point], points[by_point], entering[by_point]
    hi = np.cumsum(entering, dtype=np.int64)
    lo = np.arange(1, 2 * n + 1, dtype=np.int64) - hi
    last = np.ones(2 * n, dtype=bool)  # the last row of each (key, point) group holds the result
    last[:-1] = (point_codes[1:] != point_codes[:-1]) | (points[1:] != points[:-1])
    hi, lo = hi[last], lo[last]
    prefix = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(values, out=prefix[1:])
    return _Points(
        codes=point_codes[last],
        starts=points[last],
        counts=hi - lo,
        sums=prefix[hi] - prefix[lo],
        maxes=_range_max(values, lo, hi),
    )


def _changed(codes: np.ndarray, counts: np.ndarray, sums: np.ndarray, maxes: np.ndarray,
             before: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Mask of the points whose result differs from the point before it of the same key.

    The first point of a key is compared with `before` (per point: the key's result before it;
    default: empty). Results are equal when count, sum and max are (max ignored when count is 0).
    """
    n = len(codes)
    if before is None:
        prev_counts, prev_sums, prev_maxes = (np.zeros(n, dtype=np.int64) for _ in range(3))
    else:
        prev_counts, prev_sums, prev_maxes = (array.copy() for array in before)
    follows = np.zeros(n, dtype=bool)
    follows[1:] = codes[1:] == codes[:-1]
    shifted = np.flatnonzero(follows)
    prev_counts[shifted], prev_sums[shifted], prev_maxes[shifted] = counts[shifted - 1], sums[shifted - 1], maxes[shifted - 1]
    return (counts != prev_counts) | (sums != prev_sums) | ((maxes != prev_maxes) & (counts > 0))


def _updates_frame(starts: np.ndarray, counts: np.ndarray, sums: np.ndarray, maxes: np.ndarray) -> pd.DataFrame:
    """An updates frame from aligned arrays; `max` becomes nullable Int64, NA where count is 0."""
    return pd.DataFrame(
        {
            "start_ms": starts.astype(np.int64, copy=False),
            "count": counts.astype(np.int64, copy=False),
            "sum": sums.astype(np.int64, copy=False),
            "max": pd.arrays.IntegerArray(maxes.astype(np.int64, copy=False), counts == 0),
        }
    )


def empty_updates(key: str | None = None, key_dtype: object = object) -> pd.DataFrame:
    """An updates frame with no rows (with a `key` column first when `key` is given)."""
    frame = _updates_frame(*(np.zeros(0, dtype=np.int64) for _ in range(4)))
    if key is not None:
        frame.insert(0, key, pd.Series([], dtype=key_dtype))
    return frame


def key_window_updates(times_ms: Iterable | np.ndarray, values: Iterable | np.ndarray, window: SlidingWindow) -> pd.DataFrame:
    """The key window updates of ONE key's events (paper 003 §4.1–4.2), in a batch.

    Args:
        times_ms: event times, epoch ms UTC, int64, shape (n,), in any order (ties allowed).
        values: the aggregated value of each event, int64, shape (n,) (flights: delay in minutes).
        window: the sliding window.

    Returns:
        A DataFrame, one row per update, sorted by `start_ms` (strictly increasing): `start_ms`
        (int64, ms: the first aligned window start at which the result holds; it holds up to the
        next update), `count` (int64), `sum` (int64), `max` (Int64, `pd.NA` when count is 0).
        At most 2n rows; none for n = 0; the last row has count 0. See the module docstring.

    Raises:
        ConfigurationError: shapes differ, or times/values are not whole numbers.
    """
    times = _as_int64("times_ms", times_ms)
    vals = _as_int64("values", values)
    if times.shape != vals.shape:
        raise ConfigurationError(f"{len(times)} times but {len(vals)} values")
    points = _change_points(np.zeros(len(times), dtype=np.int64), times, vals, window)
    keep = _changed(points.codes, points.counts, points.sums, points.maxes)
    return _updates_frame(points.starts[keep], points.counts[keep], points.sums[keep], points.maxes[keep])


def key_window_updates_by_key(frame: pd.DataFrame, window: SlidingWindow, key: str = "origin",
                              time: str = "event_time_ms", value: str = "delay_min") -> pd.DataFrame:
    """The key window updates of every key of a frame, vectorized over keys and events.

    Args:
        frame: one row per event, any order, with columns `key` (any hashable values, no nulls),
            `time` (event time, epoch ms UTC, int64) and `value` (int64).
        window: the sliding window.
        key, time, value: the column names.

    Returns:
        A DataFrame sorted by (key, start_ms): the column `key` (the frame's values and dtype),
        then `start_ms`, `count`, `sum`, `max` as in `key_window_updates`; each key's rows equal
        `key_window_updates` of its events.

    Raises:
        ConfigurationError: a column is missing, a key is null, or times/values are not whole numbers.
    """
    missing = [name for name in (key, time, value) if name not in frame.columns]
    if missing:
        raise ConfigurationError(f"frame has no column(s) {missing}; it has {list(frame.columns)}")
    if frame[key].isna().any():
        raise ConfigurationError(f"key column {key!r} holds {int(frame[key].isna().sum())} nulls")
    codes, labels = pd.factorize(frame[key], sort=True)
    points = _change_points(codes.astype(np.int64), _as_int64(time, frame[time]), _as_int64(value, frame[value]), window)
    keep = _changed(points.codes, points.counts, points.sums, points.maxes)
    updates = _updates_frame(points.starts[keep], points.counts[keep], points.sums[keep], points.maxes[keep])
    updates.insert(0, key, labels.take(points.codes[keep]))
    if isinstance(frame[key].dtype, pd.CategoricalDtype) or frame[key].dtype != object:
        updates[key] = updates[key].astype(frame[key].dtype)
    return updates


# --------------------------------------------------------------------------------------------
# expanding updates into Spark's native rows


def _key_column(updates: pd.DataFrame) -> str | None:
    others = [name for name in updates.columns if name not in UPDATE_COLUMNS]
    if missing := [name for name in UPDATE_COLUMNS if name not in updates.columns]:
        raise ConfigurationError(f"updates have no column(s) {missing}; they have {list(updates.columns)}")
    if len(others) > 1:
        raise ConfigurationError(f"updates have more than one key column: {others}")
    return others[0] if others else None


def expand_updates(updates: pd.DataFrame, window: SlidingWindow, starts: Iterable | np.ndarray | None = None) -> pd.DataFrame:
    """The rows Spark's native sliding-window aggregation outputs, rebuilt from key window updates.

    Args:
        updates: complete updates, of one key (`key_window_updates`) or of many (with a key
            column, `key_window_updates_by_key`), sorted by (key, start_ms) as those return them.
        window: the window they were computed with.
        starts: None for every window start where a key's result is non-empty; else aligned
            window starts (int64 ms, multiples of the slide) to evaluate every key at.

    Returns:
        One row per (key, window start) with a non-empty result, sorted by (key,
        window_start_ms): the key column (if any), `window_start_ms`, `window_end_ms` (= start +
        size), `count`, `sum`, `max` (all int64). With n events this has at most n·p/s rows.

    Raises:
        ConfigurationError: columns are wrong, a start is not aligned, or a key's updates end
            with a non-empty result (an incomplete sequence: pass every update).
    """
    key = _key_column(updates)
    step = window.slide_ms
    counts = updates["count"].to_numpy(np.int64)
    starts_of = updates["start_ms"].to_numpy(np.int64)
    codes = (pd.factorize(updates[key], sort=False)[0].astype(np.int64) if key is not None
             else np.zeros(len(updates), dtype=np.int64))
    ends = np.full(len(updates), _NO_BOUND, dtype=np.int64)  # exclusive end of each update's run
    same_next = np.zeros(len(updates), dtype=bool)
    same_next[:-1] = codes[1:] == codes[:-1]
    ends[:-1][same_next[:-1]] = starts_of[1:][same_next[:-1]]
    if np.any((counts > 0) & ~same_next):
        bad = updates[(counts > 0) & ~same_next].iloc[0]
        raise ConfigurationError(f"updates of key {bad[key] if key else '(single)'} end with a non-empty "
                                 f"result at {int(bad['start_ms'])}; pass the complete updates")
    sums = updates["sum"].to_numpy(np.int64)
    maxes = updates["max"].fillna(0).to_numpy(np.int64)
    if starts is None:
        runs = np.flatnonzero(counts > 0)
        lengths = (ends[runs] - starts_of[runs]) // step
        rows = np.repeat(runs, lengths)
        first = np.repeat(np.cumsum(lengths) - lengths, lengths)
        window_starts = starts_of[rows] + (np.arange(len(rows), dtype=np.int64) - first) * step
    else:
        wanted = np.unique(_as_int64("starts", starts))
        if np.any(np.mod(wanted, step)):
            raise ConfigurationError(f"window starts must be multiples of the slide {step} ms")
        rows_list, starts_list = [], []
        boundaries = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1], True])
        for a, b in zip(boundaries[:-1], boundaries[1:]):  # one step per key, vectorized within
            at = np.searchsorted(starts_of[a:b], wanted, side="right") - 1
            hit = at >= 0
            rows_list.append(a + at[hit])
            starts_list.append(wanted[hit])
        rows = np.concatenate(rows_list) if rows_list else np.zeros(0, dtype=np.int64)
        window_starts = np.concatenate(starts_list) if starts_list else np.zeros(0, dtype=np.int64)
        nonempty = counts[rows] > 0
        rows, window_starts = rows[nonempty], window_starts[nonempty]
    out = pd.DataFrame(
        {
            "window_start_ms": window_starts,
            "window_end_ms": window_starts + window.size_ms,
            "count": counts[rows],
            "sum": sums[rows],
            "max": maxes[rows],
        }
    )
    if key is not None:
        out.insert(0, key, updates[key].to_numpy()[rows])
    return out


# --------------------------------------------------------------------------------------------
# incremental: per-key state for a streaming stateful processor


@dataclass(frozen=True)
class KeyWindowState:
    """What `advance` keeps of one key between micro-batches.

    Attributes:
        final_through_ms: the key's watermark of the last call: every window ending at or before
            it is final, and so is every update starting at or before `final_through_ms − size`.
        last_count, last_sum, last_max: the key's result at its last final change point (the
            last emitted update's result; max 0 when count is 0).
        times_ms: the kept events' times, int64 ms, sorted ascending: the events with
            `leave(t) + size > final_through_ms`, i.e. still inside a window not yet final.
        values: their values, int64, same order.
    """

    final_through_ms: int
    last_count: int
    last_sum: int
    last_max: int
    times_ms: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)

    def pack(self) -> bytes:
        """Little-endian int64s: version, final_through_ms, last_count, last_sum, last_max, n,
        then n times and n values: `STATE_HEADER_BYTES + 16·n` bytes."""
        header = np.array([STATE_VERSION, self.final_through_ms, self.last_count, self.last_sum, self.last_max,
                           len(self.times_ms)], dtype=_INT64)
        return b"".join((header.tobytes(), np.asarray(self.times_ms, _INT64).tobytes(), np.asarray(self.values, _INT64).tobytes()))

    @classmethod
    def unpack(cls, data: bytes) -> KeyWindowState:
        """The state `pack` wrote.

        Raises:
            DataError: the bytes are not a packed state of this version (wrong length or version).
        """
        if len(data) < STATE_HEADER_BYTES or (len(data) - STATE_HEADER_BYTES) % STATE_BYTES_PER_EVENT:
            raise DataError(f"key window state of {len(data)} bytes is not {STATE_HEADER_BYTES} + 16·n bytes")
        header = np.frombuffer(data, dtype=_INT64, count=6)
        version, final_through, count, total, maximum, n = (int(x) for x in header)
        if version != STATE_VERSION or len(data) != STATE_HEADER_BYTES + STATE_BYTES_PER_EVENT * n:
            raise DataError(f"key window state has version {version} and {n} events in {len(data)} bytes; "
                            f"expected version {STATE_VERSION} and {STATE_HEADER_BYTES} + 16·n bytes")
        times = np.frombuffer(data, dtype=_INT64, count=n, offset=STATE_HEADER_BYTES).astype(np.int64)
        values = np.frombuffer(data, dtype=_INT64, count=n, offset=STATE_HEADER_BYTES + 8 * n).astype(np.int64)
        return cls(final_through, count, total, maximum, times, values)


def packed_state_bytes(events: int | np.ndarray) -> int | np.ndarray:
    """Bytes of a packed state holding `events` events: 48 + 16·events."""
    return STATE_HEADER_BYTES + STATE_BYTES_PER_EVENT * events


def late_events(state: bytes | None, times_ms: Iterable | np.ndarray, window: SlidingWindow) -> np.ndarray:
    """Mask of the events `advance` refuses as late for this key's state (bool, shape (m,)).

    An event at t is late when its first window [enter(t), enter(t) + size), which ends at
    leave(t) = floor(t / s)·s + s, ends at or before the state's `final_through_ms` (the key's
    watermark of the previous call): some of its windows are final already, so counting it would
    change results already emitted. An event with t >= that watermark is never late. (Spark's
    native aggregation drops only the closed windows of such an event and counts it in the
    others; key windows refuse it whole, so the caller routes it to the late output.) With no
    state, nothing is late.
    """
    times = _as_int64("times_ms", times_ms)
    if state is None:
        return np.zeros(len(times), dtype=bool)
    final_through = KeyWindowState.unpack(state).final_through_ms
    return window.leave_ms(times) <= final_through


def advance(state: bytes | None, new_times_ms: Iterable | np.ndarray, new_values: Iterable | np.ndarray,
            final_through_ms: int, window: SlidingWindow) -> tuple[bytes | None, pd.DataFrame]:
    """One micro-batch of one key: add its events, emit the updates now final, keep the rest.

    Args:
        state: the key's packed `KeyWindowState` from the previous call, or None (no state).
        new_times_ms: this batch's events of the key, epoch ms UTC, int64, shape (m,), any order.
        new_values: their values, int64, shape (m,).
        final_through_ms: the key's watermark (ms): every window [w, w + size) with
            w + size <= final_through_ms is final, so is every update with start_ms + size <=
            final_through_ms. A smaller value than the previous call's is taken as the previous
            one. `FLUSH_MS` emits everything (end of input).
        window: the same window at every call.

    Returns:
        (new state bytes, or None when no event of the key is inside a window that is not final;
        the updates now final, an updates frame as `key_window_updates` returns, sorted by start_ms).

    Precondition: no event given to a call is late against the key's watermark of the earlier
    calls: floor(t / s)·s + s > final_through_ms of every earlier call (`late_events`; implied by
    t >= that watermark, so a processor that sends events behind the key's watermark to its late
    output meets it). Then the concatenation of every call's updates, ending with a call at
    `FLUSH_MS`, equals `key_window_updates` of all the events. A late event raises while the key
    has state; once the state is None the watermark is forgotten and the caller must filter.

    Raises:
        LateEventError: an event's windows are all final already.
        ConfigurationError: as `key_window_updates`; DataError: unreadable state bytes.
    """
    states, updates = advance_keys({0: state}, np.zeros(len(np.asarray(new_times_ms)), dtype=np.int64),
                                   new_times_ms, new_values, final_through_ms, window)
    return states[0], updates.drop(columns="key")


def advance_keys(states: Mapping[Hashable, bytes | None], keys: Iterable | np.ndarray | pd.Series,
                 times_ms: Iterable | np.ndarray, values: Iterable | np.ndarray,
                 final_through_ms: int | Mapping[Hashable, int], window: SlidingWindow,
                 ) -> tuple[dict[Hashable, bytes | None], pd.DataFrame]:
    """`advance` for many keys at once, vectorized over keys and events (one slot's micro-batch).

    Args:
        states: key -> packed state (or None) of the keys the caller holds state for; every
            one of them is advanced (its watermark may have moved without new events).
        keys, times_ms, values: this batch's events, shape (m,) each: key (hashable), event time
            (epoch ms UTC, int64), value (int64).
        final_through_ms: the watermark, one int for every key or a mapping key -> watermark
            (key-level watermarks; a key missing from it keeps its previous one).
        window: the same window at every call.

    Returns:
        (key -> new packed state or None, for every key in `states` or in `keys`; the updates now
        final, a frame with columns `key`, `start_ms`, `count`, `sum`, `max`, sorted by (key
        order of first appearance in `states` then `keys`, start_ms)).

    How: the kept events and the new ones of all keys are swept together (`_change_points`); the
    change points at or before `previous final_through − size` were emitted by earlier calls
    (their values, computed from kept events only, would be wrong and are skipped); the points
    with start + size <= final_through are final: they are run-length encoded against the key's
    last emitted result and emitted; the others stay pending and are computed again next time.
    Events with leave(t) + size <= final_through can no longer change a pending point and are
    dropped. This is correct because an event arriving later is not late, floor(t/s)·s + s >
    final_through, so its enter point floor(t/s)·s + s − size is > final_through − size: it only
    touches pending points.

    Raises:
        LateEventError, ConfigurationError, DataError: as `advance`.
    """
    times = _as_int64("times_ms", times_ms)
    vals = _as_int64("values", values)
    key_array = np.asarray(keys, dtype=object) if not isinstance(keys, np.ndarray) else keys
    if not (len(key_array) == len(times) == len(vals)):
        raise ConfigurationError(f"{len(key_array)} keys, {len(times)} times and {len(vals)} values")
    labels = pd.Index(list(dict.fromkeys([*states.keys(), *pd.unique(pd.Series(key_array, dtype=object))])), dtype=object)
    n_keys = len(labels)
    new_codes = labels.get_indexer(pd.Series(key_array, dtype=object)).astype(np.int64)
    previous = np.full(n_keys, _NO_BOUND, dtype=np.int64)
    last = np.zeros((3, n_keys), dtype=np.int64)
    kept_codes, kept_times, kept_values = [], [], []
    for code, label in enumerate(labels[: len(states)]):  # one unpack per key
        data = states[label]
        if data is None:
            continue
        state = KeyWindowState.unpack(data)
        previous[code] = state.final_through_ms
        last[:, code] = state.last_count, state.last_sum, state.last_max
        kept_codes.append(np.full(len(state.times_ms), code, dtype=np.int64))
        kept_times.append(state.times_ms)
        kept_values.append(state.values)
    if isinstance(final_through_ms, Mapping):
        given = np.array([int(final_through_ms.get(label, _NO_BOUND)) for label in labels], dtype=np.int64)
    else:
        given = np.full(n_keys, int(final_through_ms), dtype=np.int64)
    final = np.maximum(given, previous)

    has_previous = previous[new_codes] != _NO_BOUND
    late = has_previous & (window.leave_ms(times) <= previous[new_codes])
    if late.any():
        first = int(np.flatnonzero(late)[0])
        raise LateEventError(
            f"{int(late.sum())} event(s) are late: e.g. key {labels[new_codes[first]]!r} at {int(times[first])} ms, "
            f"whose windows all end at or before the key's watermark {int(previous[new_codes[first]])} ms; "
            "route them to the late output (late_events) before advance"
        )
    codes = np.concatenate(kept_codes + [new_codes])
    all_times = np.concatenate(kept_times + [times])
    all_values = np.concatenate(kept_values + [vals])
    points = _change_points(codes, all_times, all_values, window)

    size = window.size_ms
    previous_less, final_less = _minus(previous, size), _minus(final, size)  # "no watermark" stays the minimum
    pending = points.starts > previous_less[points.codes]
    emit = pending & (points.starts <= final_less[points.codes])
    at = np.flatnonzero(emit)
    c, s, cnt, sm, mx = points.codes[at], points.starts[at], points.counts[at], points.sums[at], points.maxes[at]
    changed = _changed(c, cnt, sm, mx, before=(last[0, c], last[1, c], last[2, c]))
    updates = _updates_frame(s[changed], cnt[changed], sm[changed], mx[changed])
    updates.insert(0, "key", labels.take(c[changed]))
    if at.size:  # each key's result at its last final point becomes its last emitted result
        tail = np.flatnonzero(np.r_[c[1:] != c[:-1], True])
        last[:, c[tail]] = cnt[tail], sm[tail], mx[tail]

    order = np.lexsort((all_times, codes))
    codes, all_times, all_values = codes[order], all_times[order], all_values[order]
    keep = window.leave_ms(all_times) > final_less[codes]
    codes, all_times, all_values = codes[keep], all_times[keep], all_values[keep]
    bounds = np.searchsorted(codes, np.arange(n_keys + 1))
    out: dict[Hashable, bytes | None] = {}
    for code, label in enumerate(labels):  # one pack per key
        a, b = bounds[code], bounds[code + 1]
        if a == b:
            out[label] = None
            continue
        out[label] = KeyWindowState(int(final[code]), int(last[0, code]), int(last[1, code]), int(last[2, code]),
                                    all_times[a:b], all_values[a:b]).pack()
    return out, updates

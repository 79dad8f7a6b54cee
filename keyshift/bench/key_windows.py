"""Key window benchmark (paper 003): updates emitted and state kept, against Spark's native way.

On the real flights (default all 3,000,000, keyed by origin, sliding windows of 1 h every 1 min)
it reports, per watermark bound b (one JSON row each):

* `events` n, `updates`: key window updates emitted (`key_window_updates_by_key`; at most 2n),
  `native_windows_bound` = p·n/s (paper 003 §4.3) and `native_windows`: the (origin, window)
  rows Spark's native `groupBy(window(ts, p, s), origin)` outputs, i.e. the non-empty windows.
* The state each way keeps in a streaming run fed in event-time order (file order) under the
  watermark W = max event time so far − b:
  - native: the (origin, window) rows the state store holds: a window exists from its first
    event until the watermark passes its end (w + p <= W, then Spark emits and evicts it);
  - key windows: the events `advance_keys` keeps (those with floor(t/s)·s + s + p > W) plus one
    header per key that has any (`keyshift.eventtime.key_windows.KeyWindowState`).
* `peak_*`: the peaks of both, computed analytically, vectorized, at every event (the limit of
  one event per micro-batch): with the events sorted by time, index j, W_j = t_j − b,
  - native windows alive(j) = created(j) − evicted(j). Event i of key k creates the windows
    [max(enter_i, leave of k's previous event), leave_i) (its windows no earlier event of k
    created; enter/leave as in the key window module), so created(j) is a cumulative sum; the
    windows evicted by j are every created window with start <= W_j − p (all of them were created
    by then: their events have t < w + p <= t_j), counted from the intervals' sorted starts and
    ends with prefix sums (searchsorted), with no per-window or per-event Python loop;
  - key window events kept(j) = (j + 1) − #{i: leave_i + p <= W_j} (searchsorted), keys with
    state(j) from each key's merged intervals [i, first j' with W_j' >= leave_i + p).
* `batch_*`: the same two states measured at micro-batch boundaries of a real incremental run
  (`advance_keys` over batches of `batch_rows` events, with the watermark Spark gives a batch:
  the previous batches' max event time − b), the key window bytes being the actual packed states;
  the run's concatenated updates are checked equal to the batch updates.

Bytes, counted the same way both ways (what Spark's RocksDB state store writes per row: the key
UnsafeRow + the value UnsafeRow + its 1-byte encoding version before each; RocksDB's per-entry
overhead, transformWithState's column-family prefix and compression not counted):

* native window: key (origin string, window struct<start, end>) = 8 null bits + 2·8 fixed +
  roundup8(len(origin)) + 24 (the struct: 8 + 2·8); value (the count, sum, max buffers) = 8 + 3·8;
  +2 version bytes: 90 bytes for a 3-letter airport;
* key window state of a key: `packed_state_bytes` = 48 + 16 per event kept (`*_packed_bytes`);
  as a MapState row (`*_row_bytes`): key (origin) = 16 + roundup8(len) plus value (one binary
  field) = 16 + packed, +2 version bytes: packed + 42 for a 3-letter airport.

Timings are wall-clock seconds on this machine (2 cores, shared).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from keyshift.data.replay import event_time_ms
from keyshift.errors import ConfigurationError
from keyshift.eventtime.key_windows import (
    FLUSH_MS,
    STATE_BYTES_PER_EVENT,
    STATE_HEADER_BYTES,
    SlidingWindow,
    advance_keys,
    key_window_updates_by_key,
)

log = logging.getLogger(__name__)

FLIGHTS = 3_000_000
SIZE_MS = 3_600_000
SLIDE_MS = 60_000
BOUNDS_MS: tuple[int, ...] = (0, 600_000, 3_600_000, 86_400_000)
"""Watermark bounds of the rows: none, 10 minutes, 1 hour, 1 day."""
BATCH_ROWS = 250_000
"""Events per micro-batch of the incremental run (the DESIGN baseline's records per trigger)."""


def _roundup8(n: np.ndarray | int) -> np.ndarray | int:
    return (n + 7) // 8 * 8


def native_row_bytes(key_bytes: np.ndarray | int) -> np.ndarray | int:
    """Bytes of one native (key, window) state row for a key of `key_bytes` UTF-8 bytes (see module)."""
    return (8 + 2 * 8 + _roundup8(key_bytes) + 24) + (8 + 3 * 8) + 2


def key_window_row_bytes(packed: np.ndarray | int, key_bytes: np.ndarray | int) -> np.ndarray | int:
    """Bytes of one key's key window MapState row: its key, its packed state (see module)."""
    return (8 + 8 + _roundup8(key_bytes)) + (8 + 8 + _roundup8(packed)) + 2


def load_flights(path: Path, limit: int | None = None) -> pd.DataFrame:
    """The flights as events in file (event-time) order: origin, event_time_ms (int64 ms UTC), delay_min (int64)."""
    table = pq.read_table(path, columns=["date", "delay", "origin"])
    if limit is not None:
        table = table.slice(0, limit)
    frame = pd.DataFrame({
        "origin": table.column("origin").to_pandas().astype(object),
        "event_time_ms": event_time_ms(table.column("date")),
        "delay_min": table.column("delay").to_numpy().astype(np.int64),
    })
    if np.any(np.diff(frame["event_time_ms"].to_numpy()) < 0):
        frame = frame.sort_values("event_time_ms", kind="stable", ignore_index=True)
    return frame


@dataclass(frozen=True)
class Stream:
    """The events sorted by time (index j) with what both ways need, all int64 arrays of length n."""

    codes: np.ndarray  # key code
    times: np.ndarray  # ms
    leave: np.ndarray  # leave(t), ms
    new_from: np.ndarray  # first window start event j creates (native), ms
    created: np.ndarray  # windows event j creates (native)
    key_bytes: np.ndarray  # per key code: UTF-8 bytes of the key
    labels: pd.Index

    @classmethod
    def of(cls, frame: pd.DataFrame, window: SlidingWindow, key: str = "origin", time: str = "event_time_ms") -> Stream:
        """The stream of `frame`'s events (one row each, sorted by `time`, ms of event time) under
        `window`: per event its key code, leave time and the native windows it creates (paper
        003's eager sliding windows, counted in slide units).

        Raises:
            ConfigurationError: the events are not sorted by time.
        """
        times = frame[time].to_numpy(np.int64)
        if np.any(np.diff(times) < 0):
            raise ConfigurationError("events must be sorted by time")
        codes, labels = pd.factorize(frame[key], sort=True)
        codes = codes.astype(np.int64)
        enter, leave = window.enter_ms(times), window.leave_ms(times)
        by_key = np.lexsort((np.arange(len(times)), codes))  # each key's events in time order
        previous_leave = np.full(len(times), np.iinfo(np.int64).min, dtype=np.int64)
        same = np.r_[False, codes[by_key][1:] == codes[by_key][:-1]]
        previous_leave[by_key[same]] = leave[by_key][np.flatnonzero(same) - 1]
        new_from = np.maximum(enter, previous_leave)
        created = np.maximum(leave - new_from, 0) // window.slide_ms
        key_bytes = np.array([len(str(label).encode()) for label in labels], dtype=np.int64)
        return cls(codes, times, leave, new_from, created, key_bytes, labels)

    @property
    def native_windows(self) -> int:
        """Windows the native (one window per slide) computation creates over the whole stream."""
        return int(self.created.sum())


def native_alive(stream: Stream, window: SlidingWindow, watermarks: np.ndarray, upto: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Native windows in state, and their bytes, after the events [0, upto[q]] under watermarks[q].

    created(upto) minus the created windows whose start is <= watermark − p (evicted); each
    event's created windows are the aligned starts [new_from, leave), counted in slide units.
    """
    s, p = window.slide_ms, window.size_ms
    row_bytes = native_row_bytes(stream.key_bytes)[stream.codes]
    created_windows = np.cumsum(stream.created)[upto]
    created_bytes = np.cumsum(stream.created * row_bytes)[upto]
    has = stream.created > 0
    a = stream.new_from[has] // s  # interval [a, b) of window starts, in slides
    b = stream.leave[has] // s
    weight = row_bytes[has]
    no_mark = np.iinfo(np.int64).min + p  # no watermark yet: nothing is evicted
    q = np.floor_divide(np.maximum(watermarks, no_mark) - p, s)  # evicted: starts w with w / s <= q

    def evicted(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Σ over intervals with start <= q of (q + 1 − start), in windows and in bytes."""
        order = np.argsort(starts, kind="stable")
        sorted_starts, sorted_weight = starts[order], weight[order]
        k = np.searchsorted(sorted_starts, q, side="right")
        total = np.r_[0, np.cumsum(sorted_starts)][k]
        count_w = np.r_[0, np.cumsum(sorted_weight)][k]
        total_w = np.r_[0, np.cumsum(sorted_starts * sorted_weight)][k]
        return k * (q + 1) - total, count_w * (q + 1) - total_w

    from_a, from_a_bytes = evicted(a)
    from_b, from_b_bytes = evicted(b)
    return created_windows - (from_a - from_b), created_bytes - (from_a_bytes - from_b_bytes)


def key_window_kept(stream: Stream, window: SlidingWindow, watermarks: np.ndarray, upto: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Key window state after the events [0, upto[q]] under watermarks[q] (nondecreasing in q).

    Returns (events kept, keys with state, packed bytes, MapState row bytes), int64 arrays.
    An event is kept while leave + p > watermark; a key has state while one of its events is.
    """
    drop_at = stream.leave + window.size_ms  # dropped once the watermark reaches it
    kept = (upto + 1) - np.searchsorted(np.sort(drop_at), watermarks, side="right")
    # per key: merged index intervals [i, end_i) during which the key holds state
    end = np.searchsorted(watermarks, drop_at, side="left")  # first q whose watermark drops event i
    begin = np.searchsorted(upto, np.arange(len(stream.times)), side="left")  # first q that includes event i
    by_key = np.lexsort((np.arange(len(stream.times)), stream.codes))
    codes, begin, end = stream.codes[by_key], begin[by_key], end[by_key]
    live = end > begin
    codes, begin, end = codes[live], begin[live], end[live]
    # a key's drop times grow with its event times, so its ends are nondecreasing: a new run starts
    # at its first event and wherever an event begins at or after the previous one's end
    new_run = np.r_[True, (codes[1:] != codes[:-1]) | (begin[1:] >= end[:-1])]
    starts_q = begin[new_run]
    last_of_run = np.r_[np.flatnonzero(new_run)[1:] - 1, len(begin) - 1]
    ends_q = end[last_of_run]
    run_codes = codes[new_run]
    steps = np.zeros(len(upto) + 1, dtype=np.int64)
    np.add.at(steps, starts_q, 1)
    np.add.at(steps, ends_q, -1)
    keys_with_state = np.cumsum(steps)[:-1]
    key_row = (8 + 8 + _roundup8(stream.key_bytes))[run_codes]
    key_steps = np.zeros(len(upto) + 1, dtype=np.int64)
    np.add.at(key_steps, starts_q, key_row + 8 + 8 + 2)
    np.add.at(key_steps, ends_q, -(key_row + 8 + 8 + 2))
    packed = STATE_HEADER_BYTES * keys_with_state + STATE_BYTES_PER_EVENT * kept
    rows = packed + np.cumsum(key_steps)[:-1]  # packed is a multiple of 8: roundup8 is a no-op
    return kept, keys_with_state, packed, rows


def incremental_run(frame: pd.DataFrame, stream: Stream, window: SlidingWindow, bound_ms: int, batch_rows: int) -> dict[str, object]:
    """Feed the events to `advance_keys` in micro-batches; measure the states at batch ends.

    Batch k gets the watermark Spark would give it: max event time of batches < k − bound (none
    for batch 0); the end of input flushes. Returns the peaks and the emitted updates.
    """
    states: dict = {}
    emitted = []
    watermark = None
    peaks = {"batches": 0, "batch_key_window_events": 0, "batch_key_window_packed_bytes": 0, "batch_native_windows": 0,
             "batch_native_bytes": 0}
    keys = frame["origin"].to_numpy()
    values = frame["delay_min"].to_numpy(np.int64)
    started = time.perf_counter()
    ends, marks = [], []
    for start in range(0, len(frame), batch_rows):
        stop = min(start + batch_rows, len(frame))
        final = np.iinfo(np.int64).min if watermark is None else watermark
        states, updates = advance_keys(states, keys[start:stop], stream.times[start:stop],
                                       values[start:stop], final, window)
        emitted.append(updates)
        held = [data for data in states.values() if data is not None]
        events = sum((len(data) - STATE_HEADER_BYTES) // STATE_BYTES_PER_EVENT for data in held)
        packed = sum(len(data) for data in held)
        peaks["batches"] += 1
        peaks["batch_key_window_events"] = max(peaks["batch_key_window_events"], events)
        peaks["batch_key_window_packed_bytes"] = max(peaks["batch_key_window_packed_bytes"], packed)
        ends.append(stop - 1)
        marks.append(final)
        watermark = int(stream.times[stop - 1]) - bound_ms
    states, updates = advance_keys(states, [], [], [], FLUSH_MS, window)
    emitted.append(updates)
    seconds = time.perf_counter() - started
    native, native_bytes = native_alive(stream, window, np.array(marks, dtype=np.int64), np.array(ends, dtype=np.int64))
    peaks["batch_native_windows"] = int(native.max())
    peaks["batch_native_bytes"] = int(native_bytes.max())
    peaks["seconds_incremental"] = round(seconds, 3)
    peaks["left_in_state"] = sum(data is not None for data in states.values())
    return {"peaks": peaks, "updates": pd.concat(emitted, ignore_index=True)}


def bound_row(stream: Stream, window: SlidingWindow, bound_ms: int) -> tuple[dict[str, object], pd.DataFrame]:
    """The analytic peaks of both states under one bound, and their daily maxima for the plot."""
    started = time.perf_counter()
    upto = np.arange(len(stream.times), dtype=np.int64)
    watermarks = stream.times - bound_ms
    native, native_bytes = native_alive(stream, window, watermarks, upto)
    kept, keys, packed, rows = key_window_kept(stream, window, watermarks, upto)
    seconds = time.perf_counter() - started
    peak = int(np.argmax(native))
    peak_kw = int(np.argmax(packed))
    row = {
        "bound_ms": bound_ms,
        "peak_native_state_windows": int(native.max()),
        "peak_native_state_bytes": int(native_bytes.max()),
        "peak_native_at": pd.Timestamp(int(stream.times[peak]), unit="ms").isoformat(),
        "peak_key_window_state_events": int(kept.max()),
        "peak_key_window_keys_with_state": int(keys.max()),
        "peak_key_window_packed_bytes": int(packed.max()),
        "peak_key_window_row_bytes": int(rows.max()),
        "peak_key_window_at": pd.Timestamp(int(stream.times[peak_kw]), unit="ms").isoformat(),
        "mean_native_state_windows": round(float(native.mean()), 1),
        "mean_key_window_state_events": round(float(kept.mean()), 1),
        "state_windows_ratio": round(int(native.max()) / max(int(kept.max()), 1), 2),
        "state_bytes_ratio": round(int(native_bytes.max()) / max(int(rows.max()), 1), 2),
        "seconds_state_peaks": round(seconds, 3),
    }
    day = stream.times // 86_400_000
    series = pd.DataFrame({"day": day, "native": native, "key_window": kept}).groupby("day").max()
    return row, series


def plot_key_windows(report: dict[str, object], series: dict[int, pd.DataFrame], path: Path) -> Path:
    """Two panels: counts (events, updates, native rows and bound) and state over event time per bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    first = report["rows"][0]
    names = ["events n", "key window\nupdates", "2n", "native windows\n(non-empty)", "native bound\np·n/s"]
    values = [first["events"], first["updates"], 2 * first["events"], first["native_windows"], first["native_windows_bound"]]
    left.bar(names, values, color=["grey", "tab:green", "lightgreen", "tab:red", "salmon"])
    left.set_yscale("log")
    left.set_title(f"{first['events']:,} flights, {report['window']['size_ms'] // 60_000} min windows every "
                   f"{report['window']['slide_ms'] // 1000} s, per origin")
    for i, v in enumerate(values):
        left.text(i, v, f"{v:,}", ha="center", va="bottom", fontsize=8)
    for (bound, frame), color in zip(series.items(), ["tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:olive"]):
        label = f"b = {bound / 60_000:g} min"
        when = pd.to_datetime(frame.index * 86_400_000, unit="ms")
        right.plot(when, frame["native"], color=color, lw=0.8, label=f"native windows, {label}")
        right.plot(when, frame["key_window"], color=color, lw=0.8, ls="--", label=f"key window events, {label}")
    right.set_yscale("log")
    right.set_ylabel("kept in state (daily max)")
    right.set_title("state over event time, watermark = max event time − b")
    right.legend(fontsize=7, ncol=2, loc="lower right")
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def run_key_windows_bench(path: Path, out: Path, flights: int = FLIGHTS, size_ms: int = SIZE_MS, slide_ms: int = SLIDE_MS,
                          bounds_ms: tuple[int, ...] = BOUNDS_MS, batch_rows: int = BATCH_ROWS, progress: bool = False) -> dict[str, object]:
    """Run the benchmark on the flights file at `path`; write the JSON to `out` and the PNG beside it.

    `progress`: a tqdm bar (stderr) of the bounds measured, one step per bound (the updates and
    native windows are computed first, once).

    Raises:
        ConfigurationError: a bad window or bound; DataError: the flights cannot be read.
    """
    window = SlidingWindow(size_ms, slide_ms)
    if any(b < 0 for b in bounds_ms):
        raise ConfigurationError(f"watermark bounds must be >= 0 ms, got {list(bounds_ms)}")
    started = time.perf_counter()
    frame = load_flights(path, flights)
    seconds_load = time.perf_counter() - started

    started = time.perf_counter()
    updates = key_window_updates_by_key(frame, window)
    seconds_updates = time.perf_counter() - started

    started = time.perf_counter()
    stream = Stream.of(frame, window)
    native_windows = stream.native_windows
    seconds_native = time.perf_counter() - started

    n = len(frame)
    base = {
        "events": n,
        "keys": len(stream.labels),
        "size_ms": size_ms,
        "slide_ms": slide_ms,
        "updates": len(updates),
        "updates_per_event": round(len(updates) / max(n, 1), 4),
        "native_windows_bound": window.native_window_bound(n),
        "native_windows": native_windows,
        "native_windows_per_update": round(native_windows / max(len(updates), 1), 2),
    }
    rows, series = [], {}
    from tqdm import tqdm

    for bound in tqdm(bounds_ms, desc="key windows: bounds", unit="bound", disable=not progress):
        row, hourly = bound_row(stream, window, bound)
        run = incremental_run(frame, stream, window, bound, batch_rows)
        emitted = run["updates"].rename(columns={"key": "origin"}).sort_values(["origin", "start_ms"], kind="stable", ignore_index=True)
        equal = emitted.equals(updates)
        log.info("bound %d ms: native peak %s windows, key window peak %s events; incremental == batch: %s",
                 bound, f"{row['peak_native_state_windows']:,}", f"{row['peak_key_window_state_events']:,}", equal)
        rows.append({**base, **row, **run["peaks"], "incremental_equals_batch": bool(equal)})
        series[bound] = hourly
    report: dict[str, object] = {
        "rows": rows,
        "window": {"size_ms": size_ms, "slide_ms": slide_ms, "windows_per_event": window.windows_per_event},
        "flights": n,
        "batch_rows": batch_rows,
        "timings": {
            "seconds_load": round(seconds_load, 3),
            "seconds_key_window_updates": round(seconds_updates, 3),
            "seconds_native_windows_count": round(seconds_native, 3),
            "key_window_updates_per_s": round(n / max(seconds_updates, 1e-9)),
        },
        "counting": {
            "native_row_bytes": "key UnsafeRow (origin, window struct) + value UnsafeRow (count, sum, max) + 1 version byte each: "
                                f"{native_row_bytes(3)} bytes for a 3-letter origin",
            "key_window_packed_bytes": f"{STATE_HEADER_BYTES} + {STATE_BYTES_PER_EVENT} per kept event, per key with state",
            "key_window_row_bytes": "packed + key UnsafeRow (origin) + value UnsafeRow (binary) + 1 version byte each "
                                    f"(packed + {key_window_row_bytes(0, 3)} for a 3-letter origin)",
            "peaks": "analytic at every event (watermark = that event's time − bound); batch_*: measured at micro-batch ends",
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_key_windows(report, series, out.with_suffix(".png")))
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report

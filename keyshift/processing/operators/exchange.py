"""The engine's keyed exchange strategies (paper 000 §4.3) and Local Merge's emit modes.

How a job's events travel from the source stage (one Spark task per Kafka partition, or per
range of them, `JobConfig.source_tasks`) to the
place where a key's windows are kept. `JobConfig.exchange` picks one:

| exchange | what crosses | where windows are kept |
| --- | --- | --- |
| `local_merge` (default) | Local Merge's partials: per (key, window, slot token) of a task's input, emitted as `emit` says; a partial carries the largest event time it merged | the stateful processor's state (Spark shuffle to `groupBy(token)`) |
| `plain` | every event, as a partial of one event (Flink's KeyBy, the paper's baseline) | the same |
| `global_merge` | nothing: no shuffle. Each task merges its partials into one global state in Redis (`keyshift.processing.operators.global_merge`), once per micro-batch | Redis |

Ahead KeyBy (paper 000 §4.3 (3)) is not an engine setting: it is the topic's placement. With a
key-affine strategy (`keyshift replay … --strategy hash`), every record of a key is in one Kafka
partition, so each key's events of a micro-batch meet in one source task and Local Merge leaves
one partial per (key, window) per micro-batch; on a `round_robin` topic a key's events are in
every partition and each task sends its own partial of it (up to P per key and window).

Local Merge's emit modes (paper 000 Table 7: periodic, quantitative, fixed-point). The source
stage is stateless per micro-batch, so whatever the mode every partial leaves by the end of its
task: the modes decide how a task's input (Kafka offset order) is cut into merge segments, each
merged and emitted on its own:
- `batch`: one segment, the whole task input of the micro-batch (the periodic mode, with the
  trigger as the period): the fewest partials.
- `count:N`: a segment per N events of the task's input in offset order (the quantitative
  mode): a partial merges at most N events, so the task's merge buffer is bounded.
- `window`: a key's partial ends when its next event is in another window (the fixed-point mode
  with window boundaries as the points): a partial never spans a window boundary of its key's
  arrival order, so a key's closed window is never held back behind its later events.

Every mode gives identical results: partials are associative and the processor merges partials
of a window whatever their number or order; only the number of rows that cross changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from keyshift.errors import ConfigurationError

EXCHANGES = ("local_merge", "plain", "global_merge")
"""The exchange strategies of `JobConfig.exchange` (module docstring)."""

EMIT_MODES = ("batch", "count", "window")
"""Local Merge's emit modes (module docstring); `count` is written `count:N`."""


@dataclass(frozen=True)
class Emit:
    """A Local Merge emit mode: `mode` in `EMIT_MODES`, `count` = N for `count` (events)."""

    mode: str = "batch"
    count: int | None = None

    def __str__(self) -> str:
        return f"count:{self.count}" if self.mode == "count" else self.mode


def parse_emit(text: str) -> Emit:
    """`batch`, `window` or `count:N` (N >= 1 events) -> an `Emit`.

    Raises:
        ConfigurationError: anything else.
    """
    value = (text or "").strip()
    if value in ("batch", "window"):
        return Emit(value)
    if value.startswith("count:"):
        try:
            n = int(value.split(":", 1)[1])
        except ValueError:
            n = 0
        if n >= 1:
            return Emit("count", n)
    raise ConfigurationError(f"Local Merge emit mode {text!r} is not one of batch, window, count:N (N >= 1 events)")


def check_exchange(name: str) -> str:
    """Return `name` if it is one of `EXCHANGES`.

    Raises:
        ConfigurationError: otherwise.
    """
    if name not in EXCHANGES:
        raise ConfigurationError(f"unknown exchange strategy {name!r}; use one of {', '.join(EXCHANGES)}")
    return name


def merge_segments(emit: Emit | None, key_codes: np.ndarray, starts: np.ndarray) -> np.ndarray | None:
    """The merge segment of each event of one task's input (events in Kafka offset order).

    Events merge into one partial only if they share key, window, slot token and segment.

    Args:
        emit: the emit mode; None means `plain` (no merging: every event its own segment).
        key_codes: int array, one key code per event. starts: int64 array, each event's window
            start (ms of event time).

    Returns:
        An int64 array of segment numbers (one per event), or None for `batch` (one segment).
        `count:N`: event i is in segment i // N. `window`: a key's segment number is how many
        times, in arrival order, its window changed before event i (so the count is per key).
    """
    n = len(key_codes)
    if emit is None:
        return np.arange(n, dtype=np.int64)
    if emit.mode == "batch":
        return None
    if emit.mode == "count":
        return np.arange(n, dtype=np.int64) // int(emit.count)
    order = np.lexsort((np.arange(n), key_codes))  # by key, then arrival
    codes, begins = key_codes[order], starts[order]
    same_key = np.concatenate(([False], codes[1:] == codes[:-1]))
    changed = np.concatenate(([False], begins[1:] != begins[:-1])) & same_key
    # a cumulative count of window changes that restarts at every key
    running = np.cumsum(changed)
    key_first = np.flatnonzero(~same_key)
    restart = np.repeat(running[key_first], np.diff(np.concatenate((key_first, [n]))))
    segments = np.empty(n, dtype=np.int64)
    segments[order] = running - restart
    return segments

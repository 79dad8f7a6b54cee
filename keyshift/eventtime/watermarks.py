"""Watermark modes of the keyed window engine: global, key, nkey, dynamic (paper 000 §4.1, paper 004).

A watermark says up to which event time a stream is complete: a window [start, end) is final once
the watermark reaches its end, and an event is late when its window is already final. Spark keeps
one watermark per query (`global`): max event time seen over every partition minus a bound. In a
backfill Spark reads the Kafka partitions at different speeds, so one partition's events can be
hours of event time behind another's and a global watermark either makes them late or needs a
bound of days. Paper 000 §4.1 gives each key its own watermark instead; this module holds the
rules, `keyshift.processing.operators.processor` applies them per slot and batch.

Modes (`WatermarkPolicy.mode`):
- `global`: wm = max(Spark's watermark, floor), Spark's watermark = max event time of the query
  - `bound_ms`. What Spark does; the baseline.
- `partition`: one watermark per query, as `global`, but from per-partition clocks: wm = the
  minimum over the active Kafka partitions of their max event time - `bound_ms`, idle partitions
  left out (Flink's per-split watermarks, `keyshift.eventtime.partition_clocks`). A backfill whose
  partitions drift apart in event time loses nothing to the drift.
- `key`: per key k, wm_k = max(max event time seen for k - bound_ms, closed_k, fallback). An event of
  k is late only against wm_k; k's windows close as soon as wm_k passes them. A key that hot_split
  spreads over several slots keeps one watermark per piece (each piece is a key on its own slot).
- `nkey`: keys share a watermark per group g = murmur2(key) mod `groups` on each slot (the paper's
  N-key level): wm_g = max(max event time of the group's keys on the slot - bound_ms, closed_g,
  fallback). State is one clock per (slot, group) instead of per key.
- `dynamic`: as `key`, but each key's bound follows the disorder of its last k event times
  (`keyshift.eventtime.disorder`, paper 004), between 0 and a maximum M = `bound_ms`.

Silent keys (`idle_fallback`). Under `key`, `nkey` and `dynamic` every watermark is at least the
*fallback*: Spark's own watermark computed with the idle lag as its bound, which in every mode but
`global` follows the slowest active Kafka partition (`keyshift.eventtime.partition_clocks`):
fallback = min over the active partitions of their max event time - `idle_lag_ms` (one batch
behind; never below the switch floor). The fallback is never the fastest partition's time, so a
partition that a backfill reads months behind another keeps its keys' events on time. So
- `global` fallback (default): a key that falls silent closes its windows once every active
  partition is `idle_lag_ms` of event time past them, and its state is freed; a key's events are
  late at the latest when they are `idle_lag_ms` behind the slowest active partition.
- `timeout` fallback: besides, a key that received no event for `idle_timeout_s` seconds of
  processing time closes all its open windows at once; its clock stays (so that a later event of
  a closed window is late, never a second window) until the fallback passes it.
A clock is removed as soon as it no longer raises a key above the fallback, so memory does not
grow with keys that stopped. The end of a bounded run sends markers whose event time pushes
Spark's watermark far ahead: every window closes through the fallback.

Clocks are the engine's state, so a switch migrates them with the windows. In `key` and `dynamic`
mode a key's clock lives in the key's own pending-windows value (`KeyClock.pack`), read and
written with its windows: one state read and one write per touched key and batch. In `nkey` mode a
group's clock is shared by many keys and has its own map (`CLOCK_VALUE_SCHEMA`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from keyshift.errors import ConfigurationError
from keyshift.eventtime.windows import HOUR_MS
from keyshift.placement.murmur2 import murmur2, to_positive

WATERMARK_MODES = ("global", "partition", "key", "nkey", "dynamic")
"""The watermark modes of the engine (module docstring)."""

IDLE_FALLBACKS = ("global", "timeout")
"""How a silent key's windows close: by the global fallback watermark alone, or also on a
processing-time timeout."""

DAY_MS = 24 * HOUR_MS

GROUP_PREFIX = "#"
"""An nkey clock's map key is `#<group>`; a real key never starts with it in the flights, and a
switch replicates such clocks to every slot (`keyshift.processing.operators.state_variables.MapStateVariable.broadcast`)."""


BACKFILL_IDLE_LAG_MS = 8 * DAY_MS
"""The idle lag (ms of event time) the demo and the throughput bench run with: in a backfill of
all 3,000,000 flights Spark's Kafka source lets the partitions drift apart by up to 37 h at P = 8
and about a week with hot_split at P = 32, and a silent key's fallback watermark must stay behind
the slowest partition. Only silent keys wait for it; the job's own default stays two days."""


@dataclass(frozen=True)
class WatermarkPolicy:
    """How a job decides lateness and closes windows.

    Attributes:
        mode: one of `WATERMARK_MODES`.
        bound_ms: B, ms of event time: wm = max event time seen - B (global, key, nkey); in
            `dynamic` mode the maximum bound M a key's disorder can raise its bound to.
        groups: N, the number of watermark groups of `nkey` mode (>= 1).
        history: k, event times per key the `dynamic` mode measures disorder over (>= 2).
        idle_fallback: one of `IDLE_FALLBACKS` (module docstring).
        idle_lag_ms: ms of event time: the fallback watermark is the query's max event time minus
            this; default two days (a backfill of the flights drifts up to 37 h between partitions).
        idle_timeout_s: seconds of processing time without events after which a key closes all
            its windows (`timeout` fallback only).

    Raises:
        ConfigurationError: for an unknown mode or fallback, or a value out of range.
    """

    mode: str = "global"
    bound_ms: int = HOUR_MS
    groups: int = 64
    history: int = 32
    idle_fallback: str = "global"
    idle_lag_ms: int = 2 * DAY_MS
    idle_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.mode not in WATERMARK_MODES:
            raise ConfigurationError(f"unknown watermark mode {self.mode!r}; use one of {', '.join(WATERMARK_MODES)}")
        if self.idle_fallback not in IDLE_FALLBACKS:
            raise ConfigurationError(f"unknown idle fallback {self.idle_fallback!r}; use one of {', '.join(IDLE_FALLBACKS)}")
        if self.bound_ms < 0 or self.idle_lag_ms < 0:
            raise ConfigurationError(f"watermark bound and idle lag must be >= 0 ms, got {self.bound_ms} and {self.idle_lag_ms}")
        if self.groups < 1 or self.history < 2 or self.idle_timeout_s <= 0:
            raise ConfigurationError(
                f"need groups >= 1, history >= 2 and idle timeout > 0 s, got {self.groups}, {self.history}, {self.idle_timeout_s}"
            )

    @property
    def per_key(self) -> bool:
        """Whether watermarks are kept below the query level (`key`, `nkey`, `dynamic`)."""
        return self.mode not in ("global", "partition")

    @property
    def caps_event_time(self) -> bool:
        """Whether Spark's watermark follows the slowest active Kafka partition (every mode but
        `global`, `keyshift.eventtime.partition_clocks`) rather than the fastest."""
        return self.mode != "global"

    @property
    def spark_delay_ms(self) -> int:
        """The delay of the query's `withWatermark`: the bound in `global` mode, else the idle lag
        (Spark's watermark is then the fallback every key's watermark is held above)."""
        return self.idle_lag_ms if self.per_key else self.bound_ms


def watermark_key(key: str, policy: WatermarkPolicy) -> str:
    """The map key of the clock that holds `key`'s watermark: the key itself, or for `nkey` its
    group `#<murmur2(utf-8 key) mod N>` (Kafka's murmur2, so a group is stable across processes)."""
    if policy.mode != "nkey":
        return key
    return f"{GROUP_PREFIX}{to_positive(murmur2(key.encode())) % policy.groups}"


def is_group_clock(name: str) -> bool:
    """Whether a clock's map key names an nkey group rather than a real key."""
    return name.startswith(GROUP_PREFIX)


@dataclass(frozen=True)
class KeyClock:
    """The watermark state of one key (or nkey group) on one slot.

    Attributes:
        max_event_time_ms: the largest event time seen (ms of event time).
        closed_through_ms: the largest window end this key has closed (ms of event time): its
            watermark never goes below it, so a closed window is never opened again.
        last_seen_ms: processing time of its last event (ms since the epoch, wall clock).
        bound_ms: the bound in force (B, or the dynamic bound).
        recent: `dynamic` mode's last k event times (int64 bytes, arrival order); empty otherwise.
    """

    max_event_time_ms: int
    closed_through_ms: int
    last_seen_ms: int
    bound_ms: int
    recent: bytes = b""

    def own_watermark_ms(self) -> int:
        """max(max event time - bound, closed through), ms of event time, before the fallback."""
        return max(self.max_event_time_ms - self.bound_ms, self.closed_through_ms)

    def watermark_ms(self, fallback_ms: int) -> int:
        """The key's watermark: `own_watermark_ms` held at or above the fallback (ms)."""
        return max(self.own_watermark_ms(), fallback_ms)

    def redundant(self, fallback_ms: int) -> bool:
        """Whether the clock no longer raises its key above the fallback (it can be freed)."""
        return self.own_watermark_ms() <= fallback_ms

    def as_value(self) -> tuple[int, int, int, int, bytes]:
        """The MapState value (`CLOCK_VALUE_SCHEMA` field order)."""
        return (int(self.max_event_time_ms), int(self.closed_through_ms), int(self.last_seen_ms), int(self.bound_ms), bytes(self.recent))

    @classmethod
    def from_value(cls, value) -> "KeyClock":
        """Inverse of `as_value` (a MapState value tuple or row)."""
        return cls(int(value[0]), int(value[1]), int(value[2]), int(value[3]), bytes(value[4] or b""))

    def pack(self) -> bytes:
        """The clock as one binary field (the `clock` field of a key's pending-windows value in
        `key` and `dynamic` mode): max event time, closed through, last seen and bound as four
        little-endian int64 (32 bytes), then `recent`."""
        return np.array([self.max_event_time_ms, self.closed_through_ms, self.last_seen_ms, self.bound_ms], "<i8").tobytes() + bytes(self.recent)

    @classmethod
    def unpack(cls, blob: bytes | None) -> "KeyClock | None":
        """Inverse of `pack`; None for an empty field (a key without a clock)."""
        if not blob:
            return None
        head = np.frombuffer(blob[:32], "<i8")
        return cls(int(head[0]), int(head[1]), int(head[2]), int(head[3]), bytes(blob[32:]))


def merge_clocks(clocks: list[KeyClock]) -> KeyClock:
    """Fold the clocks one key (or nkey group) holds on several slots into one, for a switch:
    the smallest max event time (so that nothing a piece still waited for becomes late), the
    largest closed-through end (so that no closed window opens again), the latest last-seen
    time, the largest bound, and the recent times of the piece seen last.

    Raises:
        ValueError: for an empty list.
    """
    if not clocks:
        raise ValueError("merge_clocks needs at least one clock")
    latest = max(clocks, key=lambda c: c.last_seen_ms)
    return KeyClock(
        min(c.max_event_time_ms for c in clocks), max(c.closed_through_ms for c in clocks),
        latest.last_seen_ms, max(c.bound_ms for c in clocks), latest.recent,
    )


def advance_clock(
    clock: KeyClock | None, event_times_ms: np.ndarray, now_ms: int, policy: WatermarkPolicy, dynamic=None
) -> KeyClock:
    """A key's clock after a micro-batch of its events.

    Args:
        clock: the clock before the batch, or None for a key without one.
        event_times_ms: int64 array, the key's events of the batch in arrival order (Kafka
            partition, offset), late ones included (they are disorder evidence); non-empty.
        now_ms: processing time of the batch (ms since the epoch).
        policy: the job's watermark policy.
        dynamic: `dynamic` mode's `keyshift.eventtime.disorder.DynamicBound` (None otherwise).

    Returns:
        The new clock: max event time raised, last seen = now, and in `dynamic` mode the last k
        times and the bound they give (paper 004).
    """
    times = np.asarray(event_times_ms, dtype=np.int64)
    top = int(times.max())
    closed = clock.closed_through_ms if clock is not None else np.iinfo(np.int64).min // 2
    max_time = max(top, clock.max_event_time_ms) if clock is not None else top
    if policy.mode == "dynamic":
        recent = dynamic.unpack(clock.recent) if clock is not None and clock.recent else np.empty(0, np.int64)
        recent, bound = dynamic.update(recent, times)
        return KeyClock(max_time, closed, now_ms, int(bound), dynamic.pack(recent))
    return KeyClock(max_time, closed, now_ms, policy.bound_ms)


def close_clock(clock: KeyClock, window_end_ms: int) -> KeyClock:
    """The clock after its key closed windows up to `window_end_ms` (ms of event time)."""
    return KeyClock(clock.max_event_time_ms, max(clock.closed_through_ms, int(window_end_ms)), clock.last_seen_ms, clock.bound_ms, clock.recent)

"""Event-time disorder by whole sources: late sources, as sensors behind slow links or with skewed clocks.

Paper 000 (§3.2, §6.4.2, Table 10) measures key-level against subtask-level watermarks on streams
whose sources are each in order while the merged stream is not ("数据乱序比例" 25 %, 50 %, 75 %):
sensors behind slower links arrive late, sensors with a skewed local clock stamp shifted times.
This module turns an in-order stream (the flights in file order) into such a stream, reproducibly.
Pure functions over numpy arrays (Arrow only to factorize source ids): no I/O, no clock, no
global random state. (Not to be confused with
`keyshift.eventtime.disorder`, which *measures* local disorder for paper 004's dynamic bound.)

Definitions (all times int64 milliseconds of event time, epoch UTC; the options that set them are
seconds of the data's own timeline, not of the replay's wall clock):

* **source**: what emits events in its own order; for the flights, the origin airport.
* **out of order**: in an arrival sequence x_0, x_1, ... of event times, x_i is out of order when
  some earlier arrival has a *larger* event time: max(x_0 .. x_{i-1}) > x_i. Ties are in order;
  the first event never is. The **out-of-order fraction** is the share of such events (0 for an
  empty sequence). It is what a subtask-level watermark with bound 0 would find late.
* **late sources**: the set L of sources the plan disorders; every other source is on time, with
  an exact clock. Each late source s gets two seeded draws (`source_draws`), fixed by (seed, name)
  alone, so a source keeps its draws whatever other sources or how many events a replay has:

  - **delay model**: arrival delay d_s, a uniform integer in [ceil(D / 2), D] ms, D the source
    delay (`source_delay_s` * 1000). The source's event of true time t arrives at a_e = t + d_s,
    an on-time event at a_e = t. A spread rather than one value, so late sources also disorder
    each other; at least D / 2, so a late source is late by a known minimum.
  - **skew model**: clock offset o_s, a uniform integer in [-K, +K] ms, K the clock skew
    (`clock_skew_s` * 1000). The source stamps its events with its own clock: the **written
    event time is shifted**, t_w = t + o_s, because that is the time a real sensor sends and the
    only one a consumer sees (windows are computed on it; tests recompute windows from the
    written times that Kafka holds, and recover t = t_w - o_s from the plan). K <= D / 2, so
    d_s - o_s >= 0: a late source never runs ahead of the on-time stream (a source stamping
    the future would put every other source's events out of order, and no fraction could be
    aimed at).

* **arrival order**: the events sorted by a_e, ties in input order (a stable sort). The input
  must be in event-time order; then each source keeps its own order (its a_e and t_w grow with
  t, since d_s and o_s are constants) and FRACTION 0 (no late source) is the input order exactly.

* **search** (`plan_disorder`): which sources are late. Sources are visited in a seeded order
  (their priority draw); first fit takes a source when the event shares taken so far plus its own
  stay within a goal. A late source's events are nearly all out of order when its delay exceeds
  the data's time resolution (one minute for the flights), so the goal starts at FRACTION; the
  fraction is then measured exactly and the goal moved by the miss (goal += FRACTION - achieved),
  up to `SEARCH_ROUNDS` times, stopping early within `_CLOSE_ENOUGH` or when a set comes back.
  The plan with the smallest miss wins (the earliest on a tie). The set is chosen, never the
  delays, so the draws stay those of (seed, name).

A source holds whole events, so the achieved fraction can miss FRACTION by up to about the event
share of one source. Measured on the 3,000,000 flights (229 origins, ORD 5.5 %), D = 600 s, seed
0: 0.250001, 0.499973 and 0.749979 for 0.25, 0.5 and 0.75 (74, 115 and 159 late origins); with
K = 300 s 0.249996, 0.500003, 0.750006. Delays shorter than the gaps between event times disorder
nothing (the flights' times are whole minutes: D = 60 s gives 0).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keyshift.errors import ConfigurationError, DataError

PAPER_FRACTIONS = (0.25, 0.5, 0.75)
"""Out-of-order fractions of paper 000, Table 10 (key-level vs subtask-level watermarks)."""

DEFAULT_SOURCE_DELAY_S = 600.0
"""Default source delay D (s of event time): late sources arrive 5 to 10 minutes late."""

MAX_SECONDS = 1e9
"""Largest source delay or clock skew accepted (s, about 31 years): keeps t + d_s within int64 ms."""

SEARCH_ROUNDS = 12
"""Most exact measurements the search makes (each one stable sort of the events)."""

_CLOSE_ENOUGH = 1e-4
"""The search stops once the achieved fraction is this close to the target."""


@dataclass(frozen=True)
class DisorderPlan:
    """Which sources are late, by how much, and the disorder that makes.

    Attributes:
        fraction: the target out-of-order fraction, in [0, 1).
        source_delay_s: D, the source delay (s of event time); each late source's arrival
            delay is drawn in [D / 2, D].
        clock_skew_s: K, the clock skew (s of event time); each late source's clock offset is
            drawn in [-K, +K].
        seed: the seed of the draws (int >= 0).
        delay_ms: late source -> its arrival delay d_s (int ms, > 0).
        offset_ms: late source -> its clock offset o_s (int ms; the written event time is the
            true one plus it). Same keys as `delay_ms`.
        events: events the plan was measured on.
        out_of_order_events: of these, out of order in arrival order (written times).
        out_of_order: the achieved out-of-order fraction, out_of_order_events / events (0 when
            there are no events).
    """

    fraction: float
    source_delay_s: float
    clock_skew_s: float
    seed: int
    delay_ms: dict[str, int] = field(default_factory=dict)
    offset_ms: dict[str, int] = field(default_factory=dict)
    events: int = 0
    out_of_order_events: int = 0
    out_of_order: float = 0.0

    @property
    def late_sources(self) -> list[str]:
        """The late sources, sorted by name."""
        return sorted(self.delay_ms)

    def delays_for(self, names: Sequence[str]) -> np.ndarray:
        """Arrival delay (int64 ms) of each of `names`: d_s for a late source, else 0."""
        return np.fromiter((self.delay_ms.get(n, 0) for n in names), dtype=np.int64, count=len(names))

    def offsets_for(self, names: Sequence[str]) -> np.ndarray:
        """Clock offset (int64 ms) of each of `names`: o_s for a late source, else 0."""
        return np.fromiter((self.offset_ms.get(n, 0) for n in names), dtype=np.int64, count=len(names))

    def apply(
        self, event_times_ms: np.ndarray, source_codes: np.ndarray, source_names: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The arrival order and written event times of events under this plan.

        Args:
            event_times_ms: int64 array (n,), true event times (ms), non-decreasing.
            source_codes: int array (n,), each event's index into `source_names`.
            source_names: the distinct sources (str); names the plan does not list are on time.

        Returns:
            (order, written): `order` an int64 permutation of 0..n-1, the input positions in
            arrival order (`arrival_order`); `written` int64 (n,), each event's written event
            time in input order, t + o_s (`stamped_times`).

        Raises:
            DataError: arrays of other shapes or dtypes, codes outside `source_names`, or times
                out of event-time order.
        """
        times, codes = _events(event_times_ms, source_codes, len(source_names))
        order = arrival_order(times, codes, self.delays_for(source_names))
        return order, stamped_times(times, codes, self.offsets_for(source_names))

    def to_json(self) -> dict[str, object]:
        """The plan as a JSON-ready dict (`from_json` reads it back)."""
        return asdict(self)

    @classmethod
    def from_json(cls, fields: dict[str, object]) -> DisorderPlan:
        """The plan from `to_json`'s dict."""
        return cls(**fields)


def validate_disorder(fraction: float, source_delay_s: float, clock_skew_s: float, seed: int) -> None:
    """Check the disorder settings; return None when they are usable.

    Args:
        fraction: target out-of-order fraction, a finite float in [0, 1) (paper 000 Table 10:
            0.25, 0.5, 0.75); 0 = no late source.
        source_delay_s: D, seconds of event time, in [0.001, `MAX_SECONDS`] (at least 1 ms).
        clock_skew_s: K, seconds of event time, in [0, D / 2]; with fraction 0 it
            must be 0 (no source is late, so no clock would be skewed).
        seed: an int >= 0 (not a bool).

    Raises:
        ConfigurationError: naming the bad value and the allowed range.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ConfigurationError(f"disorder must be a fraction in [0, 1) of events out of order, got {fraction!r}")
    _check_draw_settings(source_delay_s, clock_skew_s, seed)
    if fraction == 0 and clock_skew_s > 0:
        raise ConfigurationError(
            f"clock skew {clock_skew_s!r} s applies to late sources only, and disorder 0 makes none; "
            "set a disorder fraction > 0 or drop the clock skew"
        )


def _check_draw_settings(source_delay_s: float, clock_skew_s: float, seed: int) -> None:
    """ConfigurationError unless D, K and the seed are usable (`validate_disorder`)."""
    if isinstance(source_delay_s, bool) or not isinstance(source_delay_s, (int, float)) or not (
        math.isfinite(source_delay_s) and 0.001 <= source_delay_s <= MAX_SECONDS
    ):
        raise ConfigurationError(
            f"source delay must be in [0.001, {MAX_SECONDS:.0e}] seconds of event time, got {source_delay_s!r}"
        )
    if isinstance(clock_skew_s, bool) or not isinstance(clock_skew_s, (int, float)) or not (
        math.isfinite(clock_skew_s) and 0 <= clock_skew_s <= MAX_SECONDS
    ):
        raise ConfigurationError(
            f"clock skew must be in [0, {MAX_SECONDS:.0e}] seconds of event time, got {clock_skew_s!r}"
        )
    if _ms(clock_skew_s) * 2 > _ms(source_delay_s):
        raise ConfigurationError(
            f"clock skew {clock_skew_s!r} s exceeds half the source delay {source_delay_s!r} s: a late source "
            "whose clock runs ahead of its delay would stamp the future and put every other source out of "
            "order; lower the clock skew or raise the source delay"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigurationError(f"seed must be an int >= 0, got {seed!r}")


def encode_sources(sources: pa.Array | pa.ChunkedArray | Sequence[str] | np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Factorize source ids: (codes, names) with `names[codes[i]] == sources[i]`.

    Args:
        sources: n source ids (str), as an Arrow (chunked) string array, a numpy array or a
            sequence; Arrow is fastest (3,000,000 origins in well under a second).

    Returns:
        (codes, names): codes an int64 array (n,), names the distinct ids (list of str) in
        order of first appearance.

    Raises:
        DataError: a null source id.
    """
    column = sources if isinstance(sources, (pa.Array, pa.ChunkedArray)) else pa.array(list(sources), pa.string())
    if column.null_count:
        raise DataError(f"{column.null_count} events have no source id")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    encoded = pc.dictionary_encode(column)
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def out_of_order_mask(event_times_ms: np.ndarray) -> np.ndarray:
    """Which events of an arrival sequence are out of order.

    Args:
        event_times_ms: int array (n,), event times (ms) in arrival order.

    Returns:
        bool array (n,): True at i when max(event_times_ms[:i]) > event_times_ms[i] (ties are in
        order; position 0 never is).

    Raises:
        DataError: not a 1-D integer array.
    """
    times = _times(event_times_ms)
    mask = np.zeros(times.size, dtype=bool)
    if times.size > 1:
        mask[1:] = np.maximum.accumulate(times)[:-1] > times[1:]
    return mask


def out_of_order_fraction(event_times_ms: np.ndarray) -> float:
    """The out-of-order fraction of an arrival sequence (`out_of_order_mask`'s mean; 0.0 when empty).

    Args:
        event_times_ms: int array (n,), event times (ms) in arrival order.

    Raises:
        DataError: not a 1-D integer array.
    """
    mask = out_of_order_mask(event_times_ms)
    return float(mask.mean()) if mask.size else 0.0


def source_draws(
    source_names: Sequence[str], source_delay_s: float, clock_skew_s: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each source's seeded draws: search priority, arrival delay if late, clock offset if late.

    Each source's draws come from its own generator, seeded by (seed, BLAKE2b-64 of its UTF-8
    name), so they depend on the seed and the name only (not on Python's salted `hash`, the
    order of `source_names`, or which other sources exist).

    Args:
        source_names: S distinct source ids (str).
        source_delay_s: D (s of event time, > 0). clock_skew_s: K (s, in [0, D / 2]).
        seed: int >= 0.

    Returns:
        (priority, delay_ms, offset_ms): float64 (S,) in [0, 1), the order the search visits
        sources in; int64 (S,) in [ceil(D / 2), D] ms; int64 (S,) in [-K, +K] ms.

    Raises:
        ConfigurationError: bad delay, skew or seed (`validate_disorder`).
    """
    _check_draw_settings(source_delay_s, clock_skew_s, seed)
    delay, skew = _ms(source_delay_s), _ms(clock_skew_s)
    count = len(source_names)
    priority = np.empty(count, dtype=np.float64)
    delay_ms = np.empty(count, dtype=np.int64)
    offset_ms = np.empty(count, dtype=np.int64)
    for index, name in enumerate(source_names):
        digest = int.from_bytes(hashlib.blake2b(str(name).encode("utf-8"), digest_size=8).digest(), "little")
        rng = np.random.default_rng([int(seed), digest])
        priority[index] = rng.random()
        delay_ms[index] = rng.integers(-(-delay // 2), delay, endpoint=True)
        offset_ms[index] = rng.integers(-skew, skew, endpoint=True)
    return priority, delay_ms, offset_ms


def arrival_order(event_times_ms: np.ndarray, source_codes: np.ndarray, delay_ms_by_source: np.ndarray) -> np.ndarray:
    """The arrival order: positions sorted by t + d_s, ties in input order.

    Args:
        event_times_ms: int64 array (n,), true event times (ms), non-decreasing.
        source_codes: int array (n,), each event's source index into `delay_ms_by_source`.
        delay_ms_by_source: int64 array (S,), each source's arrival delay (ms, >= 0; 0 = on time).

    Returns:
        int64 array (n,), a permutation of 0..n-1: the input position of the i-th arrival. All
        delays 0 gives 0..n-1. Each source's positions stay increasing.

    Raises:
        DataError: shapes or dtypes wrong, codes outside 0..S-1, a negative delay, or times out
            of order.
    """
    delays = _times(delay_ms_by_source, "delay_ms_by_source")
    times, codes = _events(event_times_ms, source_codes, delays.size)
    if delays.size and delays.min() < 0:
        raise DataError(f"arrival delays must be >= 0 ms, got {int(delays.min())}")
    if not delays.any():
        return np.arange(times.size, dtype=np.int64)
    return np.argsort(times + delays[codes], kind="stable").astype(np.int64, copy=False)


def stamped_times(event_times_ms: np.ndarray, source_codes: np.ndarray, offset_ms_by_source: np.ndarray) -> np.ndarray:
    """The written event times: each event's true time plus its source's clock offset.

    Args:
        event_times_ms: int64 array (n,), true event times (ms).
        source_codes: int array (n,), each event's source index into `offset_ms_by_source`.
        offset_ms_by_source: int64 array (S,), each source's clock offset (ms; 0 = exact clock).

    Returns:
        int64 array (n,), t + o_s in input order.

    Raises:
        DataError: shapes or dtypes wrong, or codes outside 0..S-1.
    """
    offsets = _times(offset_ms_by_source, "offset_ms_by_source")
    times, codes = _events(event_times_ms, source_codes, offsets.size, sorted_times=False)
    return times + offsets[codes] if offsets.any() else times.copy()


def plan_disorder(
    event_times_ms: np.ndarray,
    source_codes: np.ndarray,
    source_names: Sequence[str],
    fraction: float,
    source_delay_s: float = DEFAULT_SOURCE_DELAY_S,
    clock_skew_s: float = 0.0,
    seed: int = 0,
) -> DisorderPlan:
    """Choose the late sources so that about `fraction` of the events arrive out of order.

    See the module docstring for the delay, skew and out-of-order definitions and the search.
    Deterministic: the same arguments give the same plan. Costs up to `SEARCH_ROUNDS` stable
    sorts of the events (measured: 0.4 to 0.8 s in all for the 3,000,000 flights).

    Args:
        event_times_ms: int64 array (n,), true event times (ms), non-decreasing (the input order is
            the on-time order, e.g. the flights file).
        source_codes: int array (n,), each event's index into `source_names` (`encode_sources`).
        source_names: S distinct source ids (str), e.g. origin airport codes.
        fraction: target out-of-order fraction in [0, 1) (paper 000 Table 10: 0.25, 0.5, 0.75).
            0 gives no late source: the arrival order is the input order and times are unchanged.
        source_delay_s: D (s of event time, > 0): late sources arrive d_s in [D / 2, D] late.
        clock_skew_s: K (s of event time, in [0, D / 2]): late sources' clocks are off by
            o_s in [-K, +K].
        seed: int >= 0 for the draws (`source_draws`).

    Returns:
        A `DisorderPlan` with the late sources' delays and offsets and the achieved fraction.

    Raises:
        ConfigurationError: bad fraction, delay, skew or seed (`validate_disorder`).
        DataError: arrays of other shapes or dtypes, codes outside `source_names`, or times out
            of event-time order.
    """
    validate_disorder(fraction, source_delay_s, clock_skew_s, seed)
    names = [str(name) for name in source_names]
    times, codes = _events(event_times_ms, source_codes, len(names))
    plan = DisorderPlan(float(fraction), float(source_delay_s), float(clock_skew_s), int(seed), events=int(times.size))
    if fraction == 0 or times.size == 0:
        return plan
    priority, delays, offsets = source_draws(names, source_delay_s, clock_skew_s, seed)
    counts = np.bincount(codes, minlength=len(names))
    visit = [s for s in sorted(range(len(names)), key=lambda s: (priority[s], names[s])) if counts[s]]
    goal, best, tried = float(fraction), None, set()
    for _ in range(SEARCH_ROUNDS):
        late = _first_fit(visit, counts, round(goal * times.size))
        if late in tried:
            break
        tried.add(late)
        chosen = np.zeros(len(names), dtype=bool)
        chosen[list(late)] = True
        order = arrival_order(times, codes, np.where(chosen, delays, 0))
        written = stamped_times(times, codes, np.where(chosen, offsets, 0))
        missed = int(out_of_order_mask(written[order]).sum())
        if best is None or abs(missed - fraction * times.size) < abs(best[1] - fraction * times.size):
            best = (late, missed)
        if abs(missed / times.size - fraction) <= _CLOSE_ENOUGH:
            break
        goal = min(1.0, max(0.0, goal + fraction - missed / times.size))
    late, missed = best
    return DisorderPlan(
        fraction=float(fraction),
        source_delay_s=float(source_delay_s),
        clock_skew_s=float(clock_skew_s),
        seed=int(seed),
        delay_ms={names[s]: int(delays[s]) for s in sorted(late, key=names.__getitem__)},
        offset_ms={names[s]: int(offsets[s]) for s in sorted(late, key=names.__getitem__)},
        events=int(times.size),
        out_of_order_events=missed,
        out_of_order=missed / times.size,
    )


def _first_fit(visit: list[int], counts: np.ndarray, goal_events: int) -> frozenset[int]:
    """Sources taken in `visit` order while their events stay within `goal_events`."""
    taken, total = [], 0
    for source in visit:
        if total + counts[source] <= goal_events:
            taken.append(source)
            total += int(counts[source])
    return frozenset(taken)


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds (rounded half to even)."""
    return int(round(seconds * 1000))


def _times(values: np.ndarray, name: str = "event_times_ms") -> np.ndarray:
    """`values` as a 1-D int64 array; DataError unless 1-D and integer."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise DataError(f"{name} must be a 1-D array, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{name} must hold integer milliseconds, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _events(
    event_times_ms: np.ndarray, source_codes: np.ndarray, sources: int, sorted_times: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(times, codes) checked: same length, integer, codes in 0..sources-1, times non-decreasing."""
    times = _times(event_times_ms)
    codes = np.asarray(source_codes)
    if codes.ndim != 1 or codes.size != times.size:
        raise DataError(f"source_codes must be a 1-D array of {times.size} codes, got shape {codes.shape}")
    if codes.size and not np.issubdtype(codes.dtype, np.integer):
        raise DataError(f"source_codes must hold integer indices, got dtype {codes.dtype}")
    codes = codes.astype(np.int64, copy=False)
    if codes.size and (codes.min() < 0 or codes.max() >= sources):
        raise DataError(f"source codes must lie in 0..{sources - 1}, got {int(codes.min())}..{int(codes.max())}")
    if sorted_times and times.size > 1:
        backwards = np.flatnonzero(times[1:] < times[:-1])
        if backwards.size:
            raise DataError(
                f"event times must be non-decreasing (the on-time order), but position {int(backwards[0]) + 1} "
                f"({int(times[backwards[0] + 1])} ms) follows {int(times[backwards[0]])} ms"
            )
    return times, codes

"""Placement strategies: the rule that sends each key to one of P slots, behind one interface.

A **slot** is one of P parallel places (a Kafka partition of the input topic and the matching
Spark stateful partition), numbered 0 <= slot <= P - 1. A **strategy** maps a key to a slot; the
map it builds is the **assignment**, versioned by an **epoch**.

The contract every strategy keeps (`Strategy` below):

* `slot_of(key)` returns an int in [0, P - 1] for any `str` key (hashed from its UTF-8 bytes);
  round_robin, which places events rather than keys, refuses it (`slot_for_event` instead).
* Key-affine strategies (`key_affine = True`: hash, modulo, least_key, least_count, weight)
  send a key to the same slot for as long as `epoch` stays the same; a new assignment (from the
  Redis assignment store) comes with a new epoch. That is what lets `SlotCache` reduce the hot
  path to one dict lookup per record. A strategy that spreads one key over several slots
  (hot_split, round_robin) sets `key_affine = False` and is never cached.
* Strategies that learn from history (least_key, least_count, weight with random landing,
  hot_split) hold a **history assignment map** (paper 000, Algorithm 1): a key already in it
  keeps its slot; a new key is placed once, by the strategy's rule, and recorded. Placing a new
  key never moves a known one, so it does not change the epoch. These maps live in this process
  only: several producers agree on them only through the Redis assignment store
  (`keyshift.placement.assignment_store`; `keyshift.placement.learning.learn_and_publish` builds
  one from the flights' counts and publishes it), or by building them from the same counts.

The strategies and the source of each rule:

| name | rule | source |
| --- | --- | --- |
| `hash` | `toPositive(murmur2(utf8(key))) % P` | Kafka `BuiltInPartitioner.partitionForKey` |
| `modulo` | `int(key) mod P` (floor modulo) | paper 000 §4.2.1 (1) Modulo |
| `least_key` | new key -> slot holding the fewest keys | paper 000 §4.2.1 (2), Algorithm 1 |
| `least_count` | new key -> slot holding the fewest events | paper 000 §4.2.1 (3), Algorithm 1 |
| `weight` | landing R in [0, 100) -> slot of the WeightTable interval holding R | paper 000 §4.2.1 (4), Algorithm 2 |
| `hot_split` | least_count, with a key above 1/P of the events spread over d slots | ours (DESIGN.md, "beyond") |
| `round_robin` | event number n -> slot n mod P, whatever its key | Kafka's `RoundRobinPartitioner`; the keyless baseline |

Ties between equally loaded slots always go to the lowest slot index, so every assignment is a
deterministic function of its inputs.

Bucket (key group) arithmetic, for strategies that assign and migrate whole buckets:
`bucket_of(key, B) = toPositive(murmur2(utf8(key))) % B` with B >> P (e.g. `DEFAULT_BUCKETS` =
4096); the `hash` strategy is that function with B = P. The learning strategies take
`buckets=B` to assign buckets instead of keys (`buckets=None`, the default, assigns keys).
"""

from __future__ import annotations

import bisect
import itertools
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from keyshift.errors import PlacementError
from keyshift.placement.murmur2 import murmur2, to_positive


@runtime_checkable
class Strategy(Protocol):
    """The interface of every placement strategy: key -> slot for P slots at one epoch.

    Attributes:
        name: the registry name (`"hash"`, later `"modulo"`, `"least_count"`, ...).
        partitions: P, the number of slots, P >= 1.
        epoch: version of the assignment in force, epoch >= 0; it changes whenever any key may
            change slot, so every record can be traced to the epoch that placed it.
        key_affine: True when a key keeps its slot for the whole epoch (cacheable).
    """

    name: str
    partitions: int
    epoch: int
    key_affine: bool

    def slot_of(self, key: str) -> int:
        """The slot for `key`, 0 <= slot <= partitions - 1."""
        ...


def check_partitions(partitions: int) -> int:
    """Validate P, the slot count: an int with P >= 1.

    Returns:
        `partitions` unchanged.

    Raises:
        PlacementError: if `partitions` is not an int (bool is refused) or is < 1.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise PlacementError(f"partitions must be an int >= 1, got {partitions!r}")
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    return partitions


def bucket_of(key: str, buckets: int) -> int:
    """The bucket (key group) of `key` among B buckets: `toPositive(murmur2(utf8(key))) % B`.

    Source of the rule: Kafka's `BuiltInPartitioner.partitionForKey` applied with B in place of
    the partition count, so `bucket_of(key, P)` is the partition Kafka's producer would choose.

    Args:
        key: any string; hashed from its UTF-8 bytes (never Python's salted `hash()`).
        buckets: B >= 1.

    Returns:
        An int in [0, B - 1].

    Raises:
        PlacementError: if `buckets` < 1.
    """
    if buckets < 1:
        raise PlacementError(f"buckets must be >= 1, got {buckets}")
    return to_positive(murmur2(key.encode("utf-8"))) % buckets


@dataclass(frozen=True)
class HashStrategy:
    """Kafka's default placement for keyed records: slot = toPositive(murmur2(utf8(key))) % P.

    Source: Kafka's Java producer `BuiltInPartitioner.partitionForKey` (formerly
    `DefaultPartitioner`), and kafka-python's `DefaultPartitioner`. It needs no history and no
    stored assignment; `epoch` is carried only so records can be traced (default 0).

    Attributes:
        partitions: P >= 1.
        epoch: assignment version, >= 0.

    Raises:
        PlacementError: on construction with P < 1 or a negative epoch.
    """

    name: ClassVar[str] = "hash"
    key_affine: ClassVar[bool] = True

    partitions: int
    epoch: int = 0

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        check_epoch(self.epoch)

    def slot_of(self, key: str) -> int:
        """The slot of `key`: `bucket_of(key, partitions)`, in [0, P - 1]."""
        return bucket_of(key, self.partitions)


def check_epoch(epoch: int) -> int:
    """Validate an assignment epoch: an int >= 0 (bool refused).

    Returns:
        `epoch` unchanged.

    Raises:
        PlacementError: naming the bad value.
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise PlacementError(f"epoch must be an int >= 0, got {epoch!r}")
    return epoch


def check_buckets(buckets: int | None) -> int | None:
    """Validate the assignment unit: None (assign keys) or B >= 1 (assign buckets `bucket_of(key, B)`).

    Raises:
        PlacementError: if `buckets` is not None and not an int >= 1.
    """
    if buckets is None:
        return None
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise PlacementError(f"buckets must be None (per key) or an int >= 1, got {buckets!r}")
    return buckets


def unit_of(key: str, buckets: int | None) -> str | int:
    """The assignment unit of `key`: the key itself (`buckets=None`) or its bucket `bucket_of(key, B)`."""
    return key if buckets is None else bucket_of(key, buckets)


def least_loaded(loads: Sequence[int], exclude: Iterable[int] = ()) -> int:
    """The index of the smallest load; ties go to the lowest index (paper 000, Algorithm 1 line 3).

    Args:
        loads: one load per slot, P >= 1 entries.
        exclude: slots not to choose (hot_split: slots already holding a piece of the same key).

    Returns:
        A slot in [0, P - 1].

    Raises:
        PlacementError: if every slot is excluded.
    """
    banned = set(exclude)
    best = -1
    for slot, load in enumerate(loads):
        if slot not in banned and (best < 0 or load < loads[best]):
            best = slot
    if best < 0:
        raise PlacementError(f"no slot left among {len(loads)} (all excluded)")
    return best


def _check_weight(weight: int) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise PlacementError(f"weight must be an int >= 0 (events), got {weight!r}")
    return weight


_INTEGER_KEY = re.compile(r"[+-]?[0-9]+")


def integer_key(key: str) -> int:
    """The integer a Modulo key spells: optional sign, ASCII decimal digits, nothing else.

    Stricter than `int()`: surrounding spaces, `_` separators and non-ASCII digits are refused, so
    two different key strings never land as the same integer by accident (`"7"` vs `" 7"`).

    Raises:
        PlacementError: naming the key when it is not such an integer.
    """
    if not isinstance(key, str) or _INTEGER_KEY.fullmatch(key) is None:
        raise PlacementError(
            f"modulo places integer keys only; key {key!r} is not an integer (use hash or least_count)"
        )
    return int(key)


@dataclass(frozen=True)
class ModuloStrategy:
    """Modulo placement for integer keys: slot = int(key) mod P (paper 000 §4.2.1 (1), Table 5).

    The paper's rule for integer keys (e.g. numeric IDs) when keys and data are both uniformly
    distributed. The modulo is a floor modulo (Java `Math.floorMod`, Python `%`), so a negative
    key still lands in [0, P - 1]: `-1 mod 8 = 7`. Needs no history; computed locally.

    Attributes:
        partitions: P >= 1.
        epoch: assignment version, >= 0.

    Raises:
        PlacementError: on construction with P < 1 or a bad epoch; from `slot_of`, for a key
            that is not an integer (`integer_key`), naming it.
    """

    name: ClassVar[str] = "modulo"
    key_affine: ClassVar[bool] = True

    partitions: int
    epoch: int = 0

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        check_epoch(self.epoch)

    def slot_of(self, key: str) -> int:
        """`integer_key(key) mod P`, in [0, P - 1]; PlacementError for a non-integer key."""
        return integer_key(key) % self.partitions


@dataclass(frozen=True, eq=False)
class _LeastStrategy:
    """Paper 000 Algorithm 1 ("Least"): a history assignment map plus a per-slot load S.

    `assign(key)`: (1-2) a key (or bucket) in the history map returns its slot; (3) else choose
    the slot with the least load S, ties to the lowest index; (4) increase that slot's load;
    (5) record the choice; (6) return it. Subclasses define S (`_load_of_new`, `_load_of_known`).
    The paper keeps S in a skip list for O(1) minimum lookup; here a linear scan over P slots
    gives the same answer, exactly, in O(P) per new key (P is at most a few hundred).

    Attributes:
        partitions: P >= 1.
        epoch: assignment version, >= 0.
        buckets: None to assign keys, or B >= 1 to assign buckets `bucket_of(key, B)`.
        assignment: the history assignment map, unit (key or bucket) -> slot.
        loads: S, one int per slot (keys or events, by subclass).
    """

    name: ClassVar[str]
    key_affine: ClassVar[bool] = True

    partitions: int
    epoch: int = 0
    buckets: int | None = None
    assignment: dict[str | int, int] = field(default_factory=dict, repr=False)
    loads: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        check_epoch(self.epoch)
        check_buckets(self.buckets)
        if not self.loads:
            object.__setattr__(self, "loads", [0] * self.partitions)
        if len(self.loads) != self.partitions:
            raise PlacementError(f"loads has {len(self.loads)} entries for {self.partitions} slots")
        for unit, slot in self.assignment.items():
            if not 0 <= slot < self.partitions:
                raise PlacementError(f"assignment puts {unit!r} on slot {slot}, outside 0..{self.partitions - 1}")

    @classmethod
    def from_counts(
        cls, counts: Mapping[str, int], partitions: int, *, epoch: int = 0, buckets: int | None = None
    ) -> _LeastStrategy:
        """Build the assignment of every key in `counts` by running Algorithm 1 over them.

        Keys are merged into their buckets first when `buckets` is set. The order in which units
        meet Algorithm 1 is the subclass's (`_order`): least_key takes them in the mapping's
        order (arrival order, when the mapping was filled as keys first appeared); least_count
        takes the heaviest first (ties: mapping order), Graham's LPT rule.

        Args:
            counts: key -> observed event count (>= 0); its order matters for least_key.
            partitions: P >= 1.
            epoch: the epoch of the built assignment, >= 0.
            buckets: None (per key) or B >= 1 (per bucket).

        Returns:
            A strategy whose history map holds every key (or bucket) of `counts`.

        Raises:
            PlacementError: bad P, epoch or buckets; a negative or non-int count.
        """
        strategy = cls(partitions=partitions, epoch=epoch, buckets=buckets)
        per_unit: dict[str | int, int] = {}
        for key, count in counts.items():
            _check_weight(count)
            unit = unit_of(key, buckets)
            per_unit[unit] = per_unit.get(unit, 0) + count
        for unit in strategy._order(per_unit):
            strategy._assign_unit(unit, per_unit[unit])
        return strategy

    def _order(self, per_unit: dict[str | int, int]) -> list[str | int]:
        return list(per_unit)

    def _load_of_new(self, weight: int) -> int:  # pragma: no cover - subclasses define S
        raise NotImplementedError

    def _load_of_known(self, weight: int) -> int:  # pragma: no cover - subclasses define S
        raise NotImplementedError

    def _assign_unit(self, unit: str | int, weight: int) -> int:
        slot = self.assignment.get(unit)
        if slot is None:
            slot = self.assignment[unit] = least_loaded(self.loads)
            self.loads[slot] += self._load_of_new(weight)
        else:
            self.loads[slot] += self._load_of_known(weight)
        return slot

    def assign(self, key: str, weight: int = 1) -> int:
        """Algorithm 1 for one observation of `key` carrying `weight` events; returns its slot.

        A new key (or bucket) is placed on the least-loaded slot and recorded; a known one keeps
        its slot. Either way the slot's load S is updated (see the subclass for which S).

        Raises:
            PlacementError: if `weight` is not an int >= 0.
        """
        return self._assign_unit(unit_of(key, self.buckets), _check_weight(weight))

    def slot_of(self, key: str) -> int:
        """The slot of `key`: its recorded slot, or `assign(key)` (one event) for a new key."""
        slot = self.assignment.get(unit_of(key, self.buckets))
        return self.assign(key) if slot is None else slot


@dataclass(frozen=True, eq=False)
class LeastKeyStrategy(_LeastStrategy):
    """LeastKey (paper 000 §4.2.1 (2), Algorithm 1, Table 5): S = number of keys on the slot.

    A new key (or bucket, with `buckets=B`: S then counts buckets) goes to the slot that holds
    the fewest; ties to the lowest slot index. Event counts are ignored, so it balances when
    keys are uneven but data per key is even. `from_counts` takes keys in the mapping's order.
    """

    name: ClassVar[str] = "least_key"

    def _load_of_new(self, weight: int) -> int:
        return 1

    def _load_of_known(self, weight: int) -> int:
        return 0


@dataclass(frozen=True, eq=False)
class LeastCountStrategy(_LeastStrategy):
    """LeastCount (paper 000 §4.2.1 (3), Algorithm 1, Table 5): S = events observed on the slot.

    S(slot) is the sum of the observed event counts of the keys assigned to it; every `assign`
    adds its `weight` (new or known key), and a new key goes to the slot with the least S, ties
    to the lowest slot index. `from_counts` (the paper's "with history") places the heaviest
    keys first (LPT, ties in mapping order), which is what brings flights by origin at P = 8 to
    a balance degree near 1.00.
    """

    name: ClassVar[str] = "least_count"

    def _order(self, per_unit: dict[str | int, int]) -> list[str | int]:
        return sorted(per_unit, key=lambda unit: -per_unit[unit])  # stable: ties keep mapping order

    def _load_of_new(self, weight: int) -> int:
        return weight

    def _load_of_known(self, weight: int) -> int:
        return weight


WEIGHT_TOTAL = 100
"""Algorithm 2's weights split [0, 100): they must sum to exactly this."""


@dataclass(frozen=True)
class WeightTable:
    """Per-slot integer weights summing to 100 (paper 000 Algorithm 2's WeightTable).

    Slot n owns the half-open interval [c(n-1), c(n)) of [0, 100), where c is the cumulative
    sum (`cumulative`): {20, 50, 30} owns [0, 20), [20, 70), [70, 100). A slot of weight 0 owns
    nothing and never receives a key.

    Attributes:
        weights: one int >= 0 per slot, summing to 100.
        cumulative: the running sums, e.g. (20, 70, 100); computed.

    Raises:
        PlacementError: an empty table, a weight that is not an int >= 0, or a sum other than
            100 (the message names the sum).
    """

    weights: tuple[int, ...]
    cumulative: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        weights = tuple(self.weights)
        if not weights:
            raise PlacementError("a weight table needs at least one slot")
        for weight in weights:
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
                raise PlacementError(f"weights must be ints >= 0, got {weight!r} in {list(weights)}")
        total = sum(weights)
        if total != WEIGHT_TOTAL:
            raise PlacementError(f"weights must sum to {WEIGHT_TOTAL}, got sum {total} for {list(weights)}")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "cumulative", tuple(itertools.accumulate(weights)))

    @classmethod
    def even(cls, partitions: int) -> WeightTable:
        """Weights as even as integers allow: 100 // P each, the first 100 % P slots one more.

        P = 8 gives (13, 13, 13, 13, 12, 12, 12, 12). With P > 100 the last P - 100 slots get 0.

        Raises:
            PlacementError: if P < 1.
        """
        check_partitions(partitions)
        base, extra = divmod(WEIGHT_TOTAL, partitions)
        return cls(tuple(base + (1 if slot < extra else 0) for slot in range(partitions)))

    def slot_for(self, landing: int) -> int:
        """The slot whose interval holds `landing` (0 <= landing < 100), by binary search.

        Equal to Algorithm 2's lines 3-6 (`while R >= W[N]: R -= W[N]; N += 1`): the first slot
        whose cumulative sum exceeds R, i.e. `bisect_right(cumulative, R)`; O(log P).

        Raises:
            PlacementError: if `landing` is outside [0, 100).
        """
        if not 0 <= landing < WEIGHT_TOTAL:
            raise PlacementError(f"landing must be in [0, {WEIGHT_TOTAL}), got {landing!r}")
        return bisect.bisect_right(self.cumulative, landing)


WEIGHT_LANDINGS: tuple[str, ...] = ("hash", "random")
"""Algorithm 2's two ways to draw R: from the key's hash (local) or a random number (coordinator)."""


@dataclass(frozen=True, eq=False)
class WeightStrategy:
    """Weight placement (paper 000 §4.2.1 (4), Algorithm 2, Table 5): slots get keys by weight.

    Landing R in [0, 100) picks the slot whose WeightTable interval holds it (`slot_for`).
    * `landing="hash"`: R = toPositive(murmur2(utf8(key))) % 100. Deterministic, computed
      locally, so the history map is not needed (a key always lands on the same R).
    * `landing="random"`: R = a seeded `random.Random(seed).randrange(100)` draw, made once per
      new key (or bucket) and kept in the history map (Algorithm 2 lines 1-2 and 7); the same
      seed and the same order of new keys give the same assignment.

    Attributes:
        partitions: P >= 1.
        weights: a `WeightTable` or P ints summing to 100; None means `WeightTable.even(P)`.
        landing: "hash" or "random".
        seed: the random landing's seed (int).
        epoch: assignment version, >= 0.
        buckets: None (per key) or B >= 1 (per bucket), for the random landing's history map.
        assignment: the history map (random landing only).

    Raises:
        PlacementError: bad P or epoch, weights not summing to 100 (naming the sum), a table
            whose length is not P, an unknown landing.
    """

    name: ClassVar[str] = "weight"
    key_affine: ClassVar[bool] = True

    partitions: int
    weights: WeightTable | Sequence[int] | None = None
    landing: str = "hash"
    seed: int = 0
    epoch: int = 0
    buckets: int | None = None
    assignment: dict[str | int, int] = field(default_factory=dict, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        check_epoch(self.epoch)
        check_buckets(self.buckets)
        table = self.weights
        if table is None:
            table = WeightTable.even(self.partitions)
        elif not isinstance(table, WeightTable):
            table = WeightTable(tuple(table))
        if len(table.weights) != self.partitions:
            raise PlacementError(f"weight table has {len(table.weights)} weights for {self.partitions} slots")
        if self.landing not in WEIGHT_LANDINGS:
            raise PlacementError(f"unknown weight landing {self.landing!r}; known: {', '.join(WEIGHT_LANDINGS)}")
        object.__setattr__(self, "weights", table)
        object.__setattr__(self, "_rng", random.Random(self.seed))

    def landing_of(self, key: str) -> int:
        """R for the hash landing: `toPositive(murmur2(utf8(key))) % 100`, in [0, 100)."""
        return bucket_of(key, WEIGHT_TOTAL)

    def slot_of(self, key: str) -> int:
        """The slot of `key` by Algorithm 2 (hash landing: pure; random: drawn once, then recorded)."""
        table: WeightTable = self.weights  # type: ignore[assignment]
        if self.landing == "hash":
            return table.slot_for(self.landing_of(key))
        unit = unit_of(key, self.buckets)
        slot = self.assignment.get(unit)
        if slot is None:
            slot = self.assignment[unit] = table.slot_for(self._rng.randrange(WEIGHT_TOTAL))
        return slot


@dataclass(frozen=True, eq=False)
class HotSplitStrategy:
    """hot_split (ours, DESIGN.md "beyond the papers"): least_count, with hot keys split.

    Rule, from per-key event counts (`from_counts`): a key (or bucket) is **hot** when its share
    of the events exceeds a slot's fair share, `count * P > total`. A hot key is cut into
    k = min(P, count, max(d, ceil(count * P / total))) pieces (d defaults to 2, the "two
    choices"; more when two pieces would still exceed the fair share), piece i holding the events whose per-key
    sequence number is i mod k (round-robin), i.e. `count // k` events plus one for i < count % k.
    Then all pieces (a cold key is one piece) are placed heaviest first, each on the least-loaded
    slot that holds no other piece of the same key (ties to the lowest index): least_count's LPT
    over pieces. So a hot key's pieces go to its k least-loaded candidate slots.

    Records: `slots_of(key)` gives a key's slots (one for a cold key); `slot_for_event(key, n)`
    places the key's n-th event on `slots_of(key)[n % k]`, a deterministic round-robin that
    reproduces the piece sizes exactly when n counts the key's events. `slot_of(key)` is the
    key's first slot (its only slot when cold). A key missing from the counts is placed whole on
    the least-loaded slot when first seen (as least_count); it is split only by a new epoch.

    The strategy is not key-affine (`key_affine = False`: never cache it per key). A job that
    uses it must merge a split key's partial aggregates across its slots before output, and
    only associative aggregates (count, sum, max ...) can be split. The replayer and the flight
    delay job use the event id (row number in the flights) as the sequence number:
    `slots[event_id % k]`, so a record's Kafka partition is its Spark slot.

    Attributes:
        partitions: P >= 1.
        d: the least number of slots a hot key is spread over, 2 <= d (capped at P).
        epoch: assignment version, >= 0.
        buckets: None (per key) or B >= 1 (per bucket).
        assignment: unit -> its slots (a tuple, piece i on slot i).
        loads: events per slot expected from the counts, plus `assign` weights.

    Raises:
        PlacementError: bad P, epoch, buckets or d (< 2).
    """

    name: ClassVar[str] = "hot_split"
    key_affine: ClassVar[bool] = False

    partitions: int
    d: int = 2
    epoch: int = 0
    buckets: int | None = None
    assignment: dict[str | int, tuple[int, ...]] = field(default_factory=dict, repr=False)
    loads: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        check_epoch(self.epoch)
        check_buckets(self.buckets)
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 2:
            raise PlacementError(f"d (slots per hot key) must be an int >= 2, got {self.d!r}")
        if not self.loads:
            object.__setattr__(self, "loads", [0] * self.partitions)
        if len(self.loads) != self.partitions:
            raise PlacementError(f"loads has {len(self.loads)} entries for {self.partitions} slots")

    def pieces_for(self, count: int, total: int) -> int:
        """k, the number of slots for a unit of `count` events out of `total`: 1 unless hot.

        Hot means `count * P > total`; then k = min(P, count, max(d, ceil(count * P / total)))
        (never more pieces than events, so no piece is empty).
        """
        if total <= 0 or count * self.partitions <= total:
            return 1
        return min(self.partitions, count, max(self.d, -(-count * self.partitions // total)))

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int],
        partitions: int,
        *,
        d: int = 2,
        epoch: int = 0,
        buckets: int | None = None,
    ) -> HotSplitStrategy:
        """Build the split assignment of every key in `counts` (see the class docstring).

        Args:
            counts: key -> observed event count (>= 0); ties between equal pieces keep its order.
            partitions: P >= 1. d: least slots per hot key, >= 2. epoch: >= 0.
            buckets: None (per key) or B >= 1 (hot buckets are split instead of hot keys).

        Raises:
            PlacementError: bad P, d, epoch or buckets; a negative or non-int count.
        """
        strategy = cls(partitions=partitions, d=d, epoch=epoch, buckets=buckets)
        per_unit: dict[str | int, int] = {}
        for key, count in counts.items():
            _check_weight(count)
            unit = unit_of(key, buckets)
            per_unit[unit] = per_unit.get(unit, 0) + count
        total = sum(per_unit.values())
        pieces: list[tuple[int, int, int, str | int]] = []  # (-size, unit order, piece index, unit)
        shape: dict[str | int, int] = {}
        for order, (unit, count) in enumerate(per_unit.items()):
            k = shape[unit] = strategy.pieces_for(count, total)
            base, extra = divmod(count, k)
            pieces.extend((-(base + (1 if i < extra else 0)), order, i, unit) for i in range(k))
        pieces.sort()
        slots: dict[str | int, list[int]] = {unit: [-1] * k for unit, k in shape.items()}
        for negative_size, _, index, unit in pieces:
            slot = least_loaded(strategy.loads, exclude=slots[unit])
            slots[unit][index] = slot
            strategy.loads[slot] -= negative_size
        strategy.assignment.update((unit, tuple(chosen)) for unit, chosen in slots.items())
        return strategy

    def slots_of(self, key: str) -> tuple[int, ...]:
        """The slots of `key`, piece i on element i; a new key is first placed by `assign`."""
        unit = unit_of(key, self.buckets)
        slots = self.assignment.get(unit)
        if slots is None:
            self.assign(key)
            slots = self.assignment[unit]
        return slots

    def is_split(self, key: str) -> bool:
        """True when `key` is spread over more than one slot (its aggregates need a merge)."""
        return len(self.slots_of(key)) > 1

    def slot_of(self, key: str) -> int:
        """The key's first slot (its only one unless split); use `slot_for_event` for records."""
        return self.slots_of(key)[0]

    def slot_for_event(self, key: str, sequence: int) -> int:
        """The slot of the key's event number `sequence` (>= 0): `slots_of(key)[sequence % k]`.

        Raises:
            PlacementError: for a negative sequence number.
        """
        if sequence < 0:
            raise PlacementError(f"event sequence must be >= 0, got {sequence}")
        slots = self.slots_of(key)
        return slots[sequence % len(slots)]

    def assign(self, key: str, weight: int = 1) -> tuple[int, ...]:
        """Observe `weight` events of `key`: a new key goes whole to the least-loaded slot.

        A known key's weight is spread over its slots as its round-robin would (the first
        `weight % k` slots take one more). Returns the key's slots.

        Raises:
            PlacementError: if `weight` is not an int >= 0.
        """
        _check_weight(weight)
        unit = unit_of(key, self.buckets)
        slots = self.assignment.get(unit)
        if slots is None:
            slots = self.assignment[unit] = (least_loaded(self.loads),)
        base, extra = divmod(weight, len(slots))
        for index, slot in enumerate(slots):
            self.loads[slot] += base + (1 if index < extra else 0)
        return slots


@dataclass(frozen=True)
class RoundRobinStrategy:
    """round_robin: the n-th event goes to slot n mod P, whatever its key (not key-affine).

    The baseline a key-aware placement is compared against: every slot gets the same number of
    events (within one), and every key's events are spread over all P slots, so a keyed job must
    shuffle (or merge) every key. Source of the rule: Kafka's `RoundRobinPartitioner` (records in
    send order cycle over the partitions), with the event's sequence number in place of the
    producer's counter so that the placement is a pure function of the event.

    In the common interface it is a key split over every slot: `slots_of(key)` is (0, ..., P - 1)
    for every key, and `slot_for_event(key, n)` = `slots_of(key)[n % P]` = n mod P, the per-event
    rule the replayers apply (`place_events` with the event id as n). A key has no single slot,
    so `slot_of` refuses (a per-key cache or partitioner cannot place it).

    Attributes:
        partitions: P >= 1.
        epoch: assignment version, >= 0 (carried for tracing only; the rule never changes).

    Raises:
        PlacementError: on construction with P < 1 or a bad epoch; from `slot_of`, always.
    """

    name: ClassVar[str] = "round_robin"
    key_affine: ClassVar[bool] = False

    partitions: int
    epoch: int = 0

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        check_epoch(self.epoch)

    def slots_of(self, key: str) -> tuple[int, ...]:
        """Every slot, (0, 1, ..., P - 1), for any key: piece i of the key on slot i."""
        return tuple(range(self.partitions))

    def slot_for_event(self, key: str, sequence: int) -> int:
        """The slot of event number `sequence` (>= 0, counted over the whole stream): sequence mod P.

        Raises:
            PlacementError: for a negative sequence number.
        """
        if sequence < 0:
            raise PlacementError(f"event sequence must be >= 0, got {sequence}")
        return sequence % self.partitions

    def slot_of(self, key: str) -> int:
        """Refused: round_robin places events, not keys.

        Raises:
            PlacementError: always, naming `slot_for_event` and the per-event replay path.
        """
        raise PlacementError(
            f"round_robin places events, not keys: key {key!r} has no single slot; "
            "use slot_for_event(key, n) (n mod P), as the replayers do"
        )


def _learned(cls: type) -> Callable[..., Strategy]:
    """A registry factory: `cls.from_counts(counts, P, ...)` when `counts=` is given, else empty history."""

    def build(partitions: int, counts: Mapping[str, int] | None = None, **options: object) -> Strategy:
        if counts is None:
            return cls(partitions=partitions, **options)
        return cls.from_counts(counts, partitions, **options)

    build.__name__ = f"build_{cls.name}"
    build.__doc__ = f"Build {cls.__name__}: from `counts` (key -> events) if given, else with an empty history."
    return build


_REGISTRY: dict[str, Callable[..., Strategy]] = {
    HashStrategy.name: HashStrategy,
    ModuloStrategy.name: ModuloStrategy,
    LeastKeyStrategy.name: _learned(LeastKeyStrategy),
    LeastCountStrategy.name: _learned(LeastCountStrategy),
    WeightStrategy.name: WeightStrategy,
    HotSplitStrategy.name: _learned(HotSplitStrategy),
    RoundRobinStrategy.name: RoundRobinStrategy,
}

STRATEGY_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""Names `strategy_by_name` accepts: hash, modulo, least_key, least_count, weight, hot_split, round_robin."""


def strategy_by_name(name: str, partitions: int, **options: object) -> Strategy:
    """Build the strategy registered as `name` for P = `partitions` slots.

    Args:
        name: one of `STRATEGY_NAMES`.
        partitions: P >= 1.
        **options: strategy-specific keyword arguments. All take `epoch: int >= 0`. least_key,
            least_count, hot_split take `counts` (key -> events: build with history through
            `from_counts`; without it the history starts empty and keys are placed as they come)
            and `buckets` (None or B >= 1); hot_split takes `d`; weight takes `weights`,
            `landing` ("hash" or "random"), `seed`, `buckets`.

    Returns:
        A `Strategy`.

    Raises:
        PlacementError: for an unknown name (the message lists the known ones), P < 1, or an
            option the strategy does not take.
    """
    check_partitions(partitions)
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(STRATEGY_NAMES)
        raise PlacementError(f"unknown placement strategy {name!r}; known: {known}") from None
    try:
        return factory(partitions=partitions, **options)
    except TypeError as exc:
        raise PlacementError(f"strategy {name!r} does not take options {sorted(options)}: {exc}") from exc


def place_events(
    codes: np.ndarray, event_ids: np.ndarray, per_key: np.ndarray, pieces: Mapping[int, Sequence[int]]
) -> np.ndarray:
    """hot_split's per-event rule over a batch, vectorized: the one rule replay and job share.

    A key placed whole gives every event its value; a split key with k pieces gives event
    `event_id` the value of piece `event_id mod k` (`HotSplitStrategy.slot_for_event` with the
    event id as the sequence number). The values are slots (the replay's Kafka partitions) or
    the slots' tokens (the job's grouping values), so a record's partition is its Spark slot.

    Args:
        codes: int array, each event's key index (into `per_key`).
        event_ids: int array, each event's id (>= 0; the flights' row number).
        per_key: array of one value per key index (its slot, or its slot's token).
        pieces: key index -> the values of its pieces (two or more; piece i on element i), for
            the split keys only; empty when no key is split.

    Returns:
        An array of `per_key`'s dtype, one value per event.
    """
    per_key = np.asarray(per_key)
    if not pieces:
        return per_key[codes]
    width = max(len(values) for values in pieces.values())
    table = np.repeat(per_key[:, None], width, axis=1)  # a whole key: its value in every column
    k = np.ones(len(per_key), dtype=np.int64)
    for code, values in pieces.items():
        table[code, : len(values)] = values
        k[code] = len(values)
    return table[codes, np.asarray(event_ids, dtype=np.int64) % k[codes]]


class SlotCache:
    """Per-key memo of a key-affine strategy, so placing a record is one dict lookup.

    The cache is valid for one epoch of the strategy: call `refresh()` after the strategy may
    have moved to a new epoch (e.g. a reloaded assignment); it clears the memo when the epoch
    changed. Memory: one entry per distinct key (229 for the flights' origins).

    Args:
        strategy: a `Strategy` with `key_affine = True`.

    Raises:
        PlacementError: if the strategy is not key-affine (its slots cannot be memoized).
    """

    def __init__(self, strategy: Strategy) -> None:
        if not strategy.key_affine:
            raise PlacementError(
                f"strategy {strategy.name!r} is not key-affine; its slots cannot be cached per key"
            )
        self.strategy = strategy
        self._epoch = strategy.epoch
        self._slots: dict[str, int] = {}

    @property
    def partitions(self) -> int:
        """P of the wrapped strategy."""
        return self.strategy.partitions

    def slot_of(self, key: str) -> int:
        """The slot of `key` (memoized), in [0, P - 1].

        Raises:
            PlacementError: if the strategy returned a slot outside [0, P - 1].
        """
        try:
            return self._slots[key]
        except KeyError:
            pass
        slot = self.strategy.slot_of(key)
        if not 0 <= slot < self.strategy.partitions:
            raise PlacementError(
                f"strategy {self.strategy.name!r} placed key {key!r} on slot {slot}, "
                f"outside 0..{self.strategy.partitions - 1}"
            )
        self._slots[key] = slot
        return slot

    def slots_of(self, keys: Iterable[str]) -> list[int]:
        """The slot of each key, in order (use on the distinct keys of a batch, then broadcast)."""
        return [self.slot_of(key) for key in keys]

    def refresh(self) -> bool:
        """Clear the memo if the strategy's epoch moved on; return True when it was cleared."""
        if self.strategy.epoch == self._epoch:
            return False
        self._slots.clear()
        self._epoch = self.strategy.epoch
        return True

    def __len__(self) -> int:
        """Number of keys memoized."""
        return len(self._slots)

"""Placement strategies: the rule that sends each key to one of P slots, behind one interface.

A **slot** is one of P parallel places (a Kafka partition of the input topic and the matching
Spark stateful partition), numbered 0 <= slot <= P - 1. A **strategy** maps a key to a slot; the
map it builds is the **assignment**, versioned by an **epoch**.

The contract every strategy keeps (`Strategy` below):

* `slot_of(key)` returns an int in [0, P - 1] for any `str` key (hashed from its UTF-8 bytes).
* Key-affine strategies (`key_affine = True`: hash, modulo, least_key, least_count, weight)
  send a key to the same slot for as long as `epoch` stays the same; a new assignment (from the
  Redis assignment store) comes with a new epoch. That is what lets `SlotCache` reduce the hot
  path to one dict lookup per record. A strategy that spreads one key over several slots
  (hot_split) sets `key_affine = False` and is never cached.
* Strategies that learn from history (least_count, weight) read their counts and assignment map
  from the store when they are built; `slot_of` stays a pure lookup for a known key.

Only `hash` exists today: Kafka's default for keyed records,
`toPositive(murmur2(utf8(key))) % P` (`BuiltInPartitioner.partitionForKey`), so records placed by
keyshift's `hash` land exactly where a plain Kafka producer would put them.

Bucket (key group) arithmetic, for strategies that assign and migrate whole buckets:
`bucket_of(key, B) = toPositive(murmur2(utf8(key))) % B` with B >> P (e.g. 4096); the `hash`
strategy is that function with B = P.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from kafka.partitioner import Partitioner

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
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise PlacementError(f"epoch must be an int >= 0, got {self.epoch!r}")

    def slot_of(self, key: str) -> int:
        """The slot of `key`: `bucket_of(key, partitions)`, in [0, P - 1]."""
        return bucket_of(key, self.partitions)


_REGISTRY: dict[str, Callable[..., Strategy]] = {
    HashStrategy.name: HashStrategy,
}

STRATEGY_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""Names `strategy_by_name` accepts today."""


def strategy_by_name(name: str, partitions: int, **options: object) -> Strategy:
    """Build the strategy registered as `name` for P = `partitions` slots.

    Args:
        name: one of `STRATEGY_NAMES` (today: `"hash"`).
        partitions: P >= 1.
        **options: strategy-specific keyword arguments (all strategies take `epoch: int >= 0`).

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


class KafkaPartitioner(Partitioner):
    """Adapter: a keyshift strategy as kafka-python's producer `partitioner=`.

    kafka-python 3.0.12 calls `partition(topic, key, serialized_key, value, serialized_value,
    cluster)` for each record sent without an explicit partition (`kafka.partitioner.Partitioner`;
    the older `partitioner(key_bytes, all_partitions, available)` callable form is deprecated).
    The key is decoded from its serialized UTF-8 bytes, so placement follows the bytes on the wire
    exactly as Kafka's own partitioner does; results are memoized per serialized key.

    Args:
        strategy: a key-affine `Strategy`; its P must equal the topic's partition count.

    Raises (from `partition`, surfaced by `KafkaProducer.send`):
        PlacementError: a record without a key, a key that is not UTF-8, or a topic whose
            partition count differs from the strategy's P.
        ValueError: a topic missing from the producer's metadata (as kafka-python's default).
    """

    def __init__(self, strategy: Strategy) -> None:
        self.cache = SlotCache(strategy)
        self._by_bytes: dict[bytes, int] = {}

    def partition(self, topic, key, serialized_key, value, serialized_value, cluster) -> int:  # noqa: D102
        all_partitions = cluster.partitions_for_topic(topic)
        if all_partitions is None:
            raise ValueError(f"Topic {topic} not found in ClusterMetadata")
        if len(all_partitions) != self.cache.partitions:
            raise PlacementError(
                f"topic {topic!r} has {len(all_partitions)} partitions but strategy "
                f"{self.cache.strategy.name!r} places over {self.cache.partitions} slots; "
                "recreate the topic or build the strategy with the topic's partition count"
            )
        if type(serialized_key) is bytes:
            slot = self._by_bytes.get(serialized_key)
            if slot is not None:
                return slot
        elif serialized_key is None:
            raise PlacementError(f"record for topic {topic!r} has no key; keyshift places keyed records only")
        key_bytes = bytes(serialized_key)
        try:
            text = key_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlacementError(f"key {key_bytes!r} is not UTF-8: {exc}") from exc
        slot = self._by_bytes[key_bytes] = self.cache.slot_of(text)
        return slot

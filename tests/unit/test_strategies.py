"""The strategy interface, the registry, the per-key cache and the kafka-python adapter."""

from __future__ import annotations

import random
import string

import pytest
from kafka.partitioner import DefaultPartitioner

from keyshift.errors import PlacementError
from keyshift.placement.strategies import (
    STRATEGY_NAMES,
    HashStrategy,
    KafkaPartitioner,
    SlotCache,
    Strategy,
    bucket_of,
    strategy_by_name,
)


class FakeCluster:
    """The part of kafka-python's ClusterMetadata a partitioner reads."""

    def __init__(self, topic: str, partitions: int) -> None:
        self._topics = {topic: set(range(partitions))}

    def topics(self) -> set[str]:
        return set(self._topics)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._topics.get(topic)

    def available_partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._topics.get(topic)


def airport_codes(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_uppercase, k=3)) for _ in range(count)]


@pytest.mark.parametrize(
    ("keys", "partitions", "expected"),
    [
        ([], 8, []),  # zero keys: nothing to place
        (["ORD"], 8, [3]),  # one key (Java BuiltInPartitioner.partitionForKey value)
        (["ORD", "ATL", "DFW", "LAX"], 8, [3, 3, 1, 4]),  # a collision: ORD and ATL share slot 3
        (["ORD", "ATL"], 1, [0, 0]),  # one slot: every key on slot 0
        (["ORD", "ATL", "DFW"], 64, [51, 35, 41]),  # more slots than keys: most slots stay empty
        ([""], 8, [1]),  # empty key: 275646681 % 8
        (["Zürich", "東京"], 8, [1, 3]),  # non-ASCII keys hash their UTF-8 bytes
    ],
)
def test_hash_slots(keys: list[str], partitions: int, expected: list[int]) -> None:
    strategy = strategy_by_name("hash", partitions)
    assert [strategy.slot_of(key) for key in keys] == expected


@pytest.mark.parametrize(
    ("name", "partitions", "options", "message"),
    [
        ("least_count", 8, {}, "unknown placement strategy 'least_count'; known: hash"),  # not yet built
        ("HASH", 8, {}, "known: hash"),  # names are case-sensitive
        ("hash", 0, {}, "partitions must be >= 1, got 0"),  # zero slots
        ("hash", -3, {}, "partitions must be >= 1, got -3"),  # negative slots
        ("hash", True, {}, "partitions must be an int"),  # bool is not a count
        ("hash", 8.0, {}, "partitions must be an int"),  # float refused, not truncated
        ("hash", 8, {"epoch": -1}, "epoch must be an int >= 0"),  # epochs count up from 0
        ("hash", 8, {"buckets": 4096}, "does not take options"),  # unknown option named
    ],
)
def test_strategy_by_name_refuses(name: str, partitions: int, options: dict, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        strategy_by_name(name, partitions, **options)


def test_registry_lists_hash() -> None:
    assert STRATEGY_NAMES == ("hash",)
    strategy = strategy_by_name("hash", 8, epoch=5)
    assert isinstance(strategy, Strategy)
    assert (strategy.name, strategy.partitions, strategy.epoch, strategy.key_affine) == ("hash", 8, 5, True)


def test_hash_strategy_is_frozen() -> None:
    strategy = HashStrategy(partitions=8)
    with pytest.raises(AttributeError):
        strategy.partitions = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "buckets", "expected"),
    [
        ("ORD", 1, 0),  # one bucket holds everything
        ("ORD", 8, 3),  # B = P: the hash strategy's slot
        ("ORD", 4096, 1930652851 % 4096),  # B >> P: murmur2("ORD") is positive already
        ("ATL", 4096, (-1647261917 & 0x7FFFFFFF) % 4096),  # negative hash masked, not abs()
    ],
)
def test_bucket_of(key: str, buckets: int, expected: int) -> None:
    assert bucket_of(key, buckets) == expected


def test_bucket_of_refuses_zero_buckets() -> None:
    with pytest.raises(PlacementError, match="buckets must be >= 1"):
        bucket_of("ORD", 0)


def test_bucket_mod_p_equals_slot_when_p_divides_b() -> None:
    # A bucket never straddles hash slots when P divides B: slot(k) == bucket(k, B) % P.
    strategy = HashStrategy(partitions=8)
    for key in airport_codes(500):
        assert bucket_of(key, 4096) % 8 == strategy.slot_of(key)


class CountingStrategy:
    """A key-affine strategy that counts how often it is asked (for the cache tests)."""

    name = "counting"
    key_affine = True

    def __init__(self, partitions: int, slot: int = 0) -> None:
        self.partitions = partitions
        self.epoch = 0
        self.slot = slot
        self.calls = 0

    def slot_of(self, key: str) -> int:
        self.calls += 1
        return self.slot


def test_slot_cache_asks_the_strategy_once_per_key() -> None:
    strategy = CountingStrategy(partitions=4, slot=2)
    cache = SlotCache(strategy)
    assert [cache.slot_of(key) for key in ["a", "b", "a", "a", "b"]] == [2] * 5
    assert strategy.calls == 2
    assert len(cache) == 2


def test_slot_cache_clears_on_a_new_epoch() -> None:
    strategy = CountingStrategy(partitions=4, slot=1)
    cache = SlotCache(strategy)
    assert cache.slot_of("a") == 1
    assert cache.refresh() is False  # same epoch: memo kept
    strategy.epoch, strategy.slot = 1, 3
    assert cache.refresh() is True
    assert cache.slot_of("a") == 3
    assert cache.slots_of(["a", "b"]) == [3, 3]


@pytest.mark.parametrize(
    ("slot", "partitions"),
    [
        (4, 4),  # one past the last slot
        (-1, 4),  # negative slot
    ],
)
def test_slot_cache_refuses_slots_out_of_range(slot: int, partitions: int) -> None:
    cache = SlotCache(CountingStrategy(partitions=partitions, slot=slot))
    with pytest.raises(PlacementError, match="outside 0..3"):
        cache.slot_of("a")


def test_slot_cache_refuses_a_strategy_that_splits_keys() -> None:
    strategy = CountingStrategy(partitions=4)
    strategy.key_affine = False
    with pytest.raises(PlacementError, match="not key-affine"):
        SlotCache(strategy)


@pytest.mark.parametrize("partitions", [1, 3, 8, 32])
def test_kafka_partitioner_agrees_with_kafka_pythons_default(partitions: int) -> None:
    cluster = FakeCluster("flights", partitions)
    ours = KafkaPartitioner(strategy_by_name("hash", partitions))
    default = DefaultPartitioner()
    rng = random.Random(partitions)
    keys = airport_codes(300) + ["".join(rng.choices(string.printable, k=rng.randrange(40))) for _ in range(300)]
    for key in keys:
        key_bytes = key.encode("utf-8")
        expected = default.partition("flights", key, key_bytes, b"{}", b"{}", cluster)
        assert ours.partition("flights", key, key_bytes, b"{}", b"{}", cluster) == expected
        # second call comes from the memo and must agree too
        assert ours.partition("flights", key, key_bytes, b"{}", b"{}", cluster) == expected


@pytest.mark.parametrize(
    ("serialized_key", "topic_partitions", "error", "message"),
    [
        (None, 8, PlacementError, "has no key"),  # keyshift places keyed records only
        (b"\xff\xfe", 8, PlacementError, "is not UTF-8"),  # keys are UTF-8 strings
        (b"ORD", 4, PlacementError, "has 4 partitions but strategy 'hash' places over 8"),  # P mismatch
    ],
)
def test_kafka_partitioner_refuses(serialized_key, topic_partitions: int, error: type, message: str) -> None:
    partitioner = KafkaPartitioner(strategy_by_name("hash", 8))
    with pytest.raises(error, match=message):
        partitioner.partition("flights", None, serialized_key, b"{}", b"{}", FakeCluster("flights", topic_partitions))


def test_kafka_partitioner_unknown_topic_is_a_value_error() -> None:
    partitioner = KafkaPartitioner(strategy_by_name("hash", 8))
    with pytest.raises(ValueError, match="not found"):
        partitioner.partition("other", None, b"ORD", b"{}", b"{}", FakeCluster("flights", 8))


def test_kafka_partitioner_accepts_bytearray_keys() -> None:
    partitioner = KafkaPartitioner(strategy_by_name("hash", 8))
    assert partitioner.partition("flights", None, bytearray(b"ORD"), b"{}", b"{}", FakeCluster("flights", 8)) == 3

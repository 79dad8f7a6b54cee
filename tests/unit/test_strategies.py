"""The strategy interface, the registry, the per-key cache and the kafka-python adapter."""

from __future__ import annotations

import random
import string

import numpy as np
import pytest
from kafka.partitioner import DefaultPartitioner

from keyshift.errors import PlacementError
from keyshift.placement.kafka_partitioner import KafkaPartitioner
from keyshift.placement.strategies import (
    STRATEGY_NAMES,
    HashStrategy,
    HotSplitStrategy,
    LeastCountStrategy,
    LeastKeyStrategy,
    ModuloStrategy,
    RoundRobinStrategy,
    SlotCache,
    Strategy,
    WeightStrategy,
    WeightTable,
    bucket_of,
    integer_key,
    least_loaded,
    place_events,
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
        (  # not a strategy: the message lists every known name
            "random",
            8,
            {},
            "unknown placement strategy 'random'; known: hash, modulo, least_key, least_count, weight, hot_split, "
            "round_robin",
        ),
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


def test_registry_lists_every_strategy() -> None:
    assert STRATEGY_NAMES == ("hash", "modulo", "least_key", "least_count", "weight", "hot_split", "round_robin")
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



def test_kafka_partitioner_forgets_its_memo_on_a_new_epoch() -> None:
    strategy = CountingStrategy(partitions=4, slot=1)
    partitioner = KafkaPartitioner(strategy)
    cluster = FakeCluster("flights", 4)
    place = lambda key: partitioner.partition("flights", None, key, b"{}", b"{}", cluster)  # noqa: E731
    assert [place(b"ORD"), place(b"ORD"), place(b"ATL")] == [1, 1, 1]
    assert strategy.calls == 2 and partitioner.epoch == 0  # one call per key within an epoch
    strategy.slot = 3  # without a new epoch the memo stands (a key-affine strategy promised so)
    assert place(b"ORD") == 1 and strategy.calls == 2
    strategy.epoch = 1  # a new assignment is in force: every key is asked again
    assert [place(b"ORD"), place(b"ATL"), place(b"ORD")] == [3, 3, 3]
    assert strategy.calls == 4 and partitioner.epoch == 1 and len(partitioner.cache) == 2


def test_kafka_partitioner_refuses_an_epoch_that_is_no_longer_key_affine() -> None:
    strategy = CountingStrategy(partitions=4, slot=2)
    partitioner = KafkaPartitioner(strategy)
    cluster = FakeCluster("flights", 4)
    assert partitioner.partition("flights", None, b"ORD", b"{}", b"{}", cluster) == 2
    strategy.epoch, strategy.key_affine, strategy.name = 5, False, "hot_split"
    with pytest.raises(PlacementError, match="epoch 5 of strategy 'hot_split', which is not key-affine"):
        partitioner.partition("flights", None, b"ORD", b"{}", b"{}", cluster)


# ---------------------------------------------------------------------------------------------
# modulo (paper 000 §4.2.1 (1)): slot = int(key) mod P, floor modulo


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        ("0", 8, 0),  # zero
        ("7", 8, 7),  # last slot
        ("8", 8, 0),  # wraps to slot 0
        ("100005", 60, 45),  # the paper's numeric IDs
        ("-1", 8, 7),  # negative: floor modulo (Math.floorMod), never a negative slot
        ("+9", 8, 1),  # explicit plus sign
        ("0042", 8, 2),  # leading zeros are the same integer
        ("123456789012345678901234567890", 7, 123456789012345678901234567890 % 7),  # beyond 64 bits
        ("5", 1, 0),  # one slot
        ("3", 64, 3),  # more slots than keys: identity below P
    ],
)
def test_modulo_slots(key: str, partitions: int, expected: int) -> None:
    assert ModuloStrategy(partitions=partitions).slot_of(key) == expected


@pytest.mark.parametrize(
    "key",
    [
        "ORD",  # letters
        "",  # empty
        " 7",  # surrounding space: int() would accept it, we do not
        "1_000",  # separator: int() would accept it, we do not
        "1.0",  # decimal point
        "٣",  # a non-ASCII digit (Arabic-Indic three)
    ],
)
def test_modulo_refuses_non_integer_keys(key: str) -> None:
    with pytest.raises(PlacementError, match=f"key {key!r} is not an integer"):
        strategy_by_name("modulo", 8).slot_of(key)
    with pytest.raises(PlacementError, match="modulo places integer keys only"):
        integer_key(key)


# ---------------------------------------------------------------------------------------------
# least_key / least_count (paper 000 Algorithm 1): history map + least-loaded slot, ties lowest


@pytest.mark.parametrize(
    ("loads", "exclude", "expected"),
    [
        ([0], (), 0),  # a single slot
        ([3, 1, 2], (), 1),  # the unique minimum
        ([2, 1, 1, 5], (), 1),  # a tie: lowest index wins
        ([0, 0, 0], (), 0),  # all equal: slot 0
        ([0, 0, 0], (0,), 1),  # excluded slots are skipped, tie still to the lowest left
        ([1, 5, 9], (0, 1), 2),  # only one slot left, however heavy
    ],
)
def test_least_loaded(loads: list[int], exclude: tuple[int, ...], expected: int) -> None:
    assert least_loaded(loads, exclude) == expected


def test_least_loaded_with_every_slot_excluded() -> None:
    with pytest.raises(PlacementError, match="no slot left"):
        least_loaded([1, 2], exclude=(0, 1))


@pytest.mark.parametrize(
    ("counts", "partitions", "assignment", "loads"),
    [
        ({}, 4, {}, [0, 0, 0, 0]),  # no keys: empty map, empty slots
        ({"a": 9}, 4, {"a": 0}, [1, 0, 0, 0]),  # a single key: slot 0 (tie among empty slots)
        ({"a": 9, "b": 1, "c": 5}, 8, {"a": 0, "b": 1, "c": 2}, [1, 1, 1, 0, 0, 0, 0, 0]),  # more slots than keys
        # counts ignored, mapping order kept: round-robin over keys as they came
        ({"a": 100, "b": 1, "c": 1, "d": 1, "e": 1}, 2, {"a": 0, "b": 1, "c": 0, "d": 1, "e": 0}, [3, 2]),
        ({"a": 1, "b": 1}, 1, {"a": 0, "b": 0}, [2]),  # one slot takes everything
    ],
)
def test_least_key_from_counts(counts, partitions, assignment, loads) -> None:
    strategy = LeastKeyStrategy.from_counts(counts, partitions)
    assert strategy.assignment == assignment
    assert strategy.loads == loads


@pytest.mark.parametrize(
    ("counts", "partitions", "assignment", "loads"),
    [
        ({}, 3, {}, [0, 0, 0]),  # no keys
        ({"a": 9}, 3, {"a": 0}, [9, 0, 0]),  # a single key: slot 0
        ({"a": 5, "b": 3, "c": 3, "d": 1}, 3, {"a": 0, "b": 1, "c": 2, "d": 1}, [5, 4, 3]),  # heaviest first
        # b and c tie at 3: mapping order decides (c before b), then d joins the lighter one
        ({"c": 3, "a": 5, "b": 3, "d": 1}, 3, {"a": 0, "c": 1, "b": 2, "d": 1}, [5, 4, 3]),
        ({"a": 4, "b": 4}, 2, {"a": 0, "b": 1}, [4, 4]),  # equal keys spread evenly
        ({"a": 1, "b": 2}, 5, {"b": 0, "a": 1}, [2, 1, 0, 0, 0]),  # more slots than keys
        ({"a": 0, "b": 0}, 2, {"a": 0, "b": 0}, [0, 0]),  # zero counts add no load: both on slot 0
        ({"a": 10, "b": 6, "c": 5, "d": 1}, 2, {"a": 0, "b": 1, "c": 1, "d": 0}, [11, 11]),  # LPT, perfect here
    ],
)
def test_least_count_from_counts(counts, partitions, assignment, loads) -> None:
    strategy = LeastCountStrategy.from_counts(counts, partitions)
    assert strategy.assignment == assignment
    assert strategy.loads == loads


def test_least_key_online_follows_algorithm_1() -> None:
    strategy = LeastKeyStrategy(partitions=3)
    # new keys fill slots 0, 1, 2 in turn; a known key keeps its slot and adds no key-load
    assert [strategy.assign(key) for key in ["a", "b", "a", "c", "d", "b"]] == [0, 1, 0, 2, 0, 1]
    assert strategy.loads == [2, 1, 1]
    assert strategy.slot_of("e") == 1  # a new key asked through slot_of is assigned too
    assert strategy.assignment == {"a": 0, "b": 1, "c": 2, "d": 0, "e": 1}


def test_least_count_online_weighs_by_events() -> None:
    strategy = LeastCountStrategy(partitions=2)
    assert strategy.assign("a", weight=10) == 0
    assert strategy.assign("b", weight=3) == 1
    assert strategy.assign("c", weight=3) == 1  # 3 < 10: still the lighter slot
    assert strategy.assign("a", weight=5) == 0  # known key: keeps slot 0, its load grows
    assert strategy.loads == [15, 6]
    assert strategy.slot_of("b") == 1  # a known key through slot_of: pure lookup
    assert strategy.loads == [15, 6]


def test_least_count_learns_from_history_then_places_new_keys() -> None:
    strategy = strategy_by_name("least_count", 2, counts={"a": 7, "b": 2}, epoch=3)
    assert strategy.epoch == 3
    assert (strategy.slot_of("a"), strategy.slot_of("b")) == (0, 1)
    assert strategy.slot_of("z") == 1  # new key: slot 1 has 2 events against 7
    assert strategy.loads == [7, 3]


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (-1, "weight must be an int >= 0"),  # a negative count
        (1.5, "weight must be an int >= 0"),  # counts are whole events
        (True, "weight must be an int >= 0"),  # bool is not a count
    ],
)
def test_least_count_refuses_bad_weights(weight, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        LeastCountStrategy(partitions=2).assign("a", weight=weight)
    with pytest.raises(PlacementError, match=message):
        LeastCountStrategy.from_counts({"a": weight}, 2)


def test_least_count_per_bucket_keeps_keys_of_a_bucket_together() -> None:
    buckets = 16
    keys = airport_codes(200)
    counts = {key: 1 + index % 7 for index, key in enumerate(keys)}
    strategy = LeastCountStrategy.from_counts(counts, 4, buckets=buckets)
    assert set(strategy.assignment) <= set(range(buckets))  # the map holds buckets, not keys
    for key in keys:
        assert strategy.slot_of(key) == strategy.assignment[bucket_of(key, buckets)]
    assert sum(strategy.loads) == sum(counts.values())


def test_least_strategies_are_deterministic() -> None:
    counts = {key: (index * 37) % 101 for index, key in enumerate(airport_codes(300))}
    for cls in (LeastKeyStrategy, LeastCountStrategy, HotSplitStrategy):
        first, second = cls.from_counts(counts, 8), cls.from_counts(counts, 8)
        assert first.assignment == second.assignment


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("least_count", {"buckets": 0}, "buckets must be None"),  # zero buckets
        ("least_key", {"buckets": 4096.0}, "buckets must be None"),  # a float is no bucket count
        ("least_count", {"epoch": -2}, "epoch must be an int >= 0"),  # epochs count from 0
        ("least_count", {"counts": {"a": -1}}, "weight must be an int >= 0"),  # a negative count
        ("hot_split", {"d": 1}, "d \\(slots per hot key\\) must be an int >= 2"),  # d = 1 splits nothing
        ("modulo", {"buckets": 8}, "does not take options"),  # modulo has no buckets
        ("weight", {"landing": "round"}, "unknown weight landing 'round'; known: hash, random"),  # typo
    ],
)
def test_learned_strategies_refuse_bad_options(name: str, options: dict, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        strategy_by_name(name, 4, **options)


# ---------------------------------------------------------------------------------------------
# weight (paper 000 Algorithm 2): WeightTable summing to 100, landing R in [0, 100)


@pytest.mark.parametrize(
    ("weights", "landing", "expected"),
    [
        ((20, 50, 30), 0, 0),  # first point of [0, 20)
        ((20, 50, 30), 19, 0),  # last point of [0, 20)
        ((20, 50, 30), 20, 1),  # boundary belongs to the next slot (R >= W[0] moves on)
        ((20, 50, 30), 69, 1),  # last point of [20, 70)
        ((20, 50, 30), 70, 2),  # cumulative {20, 70, 100}: the paper's example
        ((20, 50, 30), 99, 2),  # last landing
        ((100,), 57, 0),  # a single slot owns everything
        ((0, 100), 0, 1),  # a zero-weight slot owns nothing, not even its boundary
        ((50, 0, 50), 50, 2),  # a zero weight in the middle is skipped
    ],
)
def test_weight_table_slot_for(weights: tuple[int, ...], landing: int, expected: int) -> None:
    assert WeightTable(weights).slot_for(landing) == expected


def walk_algorithm_2(weights: tuple[int, ...], landing: int) -> int:
    """Algorithm 2 lines 3-6 literally: subtract weights until R falls inside one."""
    slot = 0
    while landing >= weights[slot]:
        landing -= weights[slot]
        slot += 1
    return slot


@pytest.mark.parametrize("weights", [(20, 50, 30), (1,) * 100, (0, 0, 99, 1), (13, 13, 13, 13, 12, 12, 12, 12)])
def test_weight_binary_search_equals_the_papers_walk(weights: tuple[int, ...]) -> None:
    table = WeightTable(weights)
    assert [table.slot_for(r) for r in range(100)] == [walk_algorithm_2(weights, r) for r in range(100)]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ((20, 50, 31), "weights must sum to 100, got sum 101"),  # one too many
        ((20, 50), "weights must sum to 100, got sum 70"),  # too few
        ((), "at least one slot"),  # empty table
        ((120, -20), "weights must be ints >= 0, got -20"),  # sums to 100 but negative
        ((50.0, 50), "weights must be ints >= 0, got 50.0"),  # floats refused
    ],
)
def test_weight_table_refuses(weights: tuple, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        WeightTable(weights)


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [
        (1, (100,)),  # one slot
        (3, (34, 33, 33)),  # remainder to the first slots
        (8, (13, 13, 13, 13, 12, 12, 12, 12)),  # P = 8
        (100, (1,) * 100),  # one point each
    ],
)
def test_weight_table_even(partitions: int, expected: tuple[int, ...]) -> None:
    assert WeightTable.even(partitions).weights == expected


def test_weight_strategy_refuses_a_table_of_another_length() -> None:
    with pytest.raises(PlacementError, match="3 weights for 4 slots"):
        strategy_by_name("weight", 4, weights=[20, 50, 30])
    with pytest.raises(PlacementError, match="got sum 99"):
        strategy_by_name("weight", 3, weights=[33, 33, 33])


def test_weight_hash_landing_uses_murmur2_mod_100() -> None:
    strategy = WeightStrategy(partitions=3, weights=(20, 50, 30))
    for key in airport_codes(200):
        assert strategy.slot_of(key) == walk_algorithm_2((20, 50, 30), bucket_of(key, 100))
    assert strategy.assignment == {}  # hash landing needs no history map


def test_weight_random_landing_is_seeded_and_remembered() -> None:
    keys = airport_codes(500)
    first = WeightStrategy(partitions=3, weights=(20, 50, 30), landing="random", seed=11)
    second = WeightStrategy(partitions=3, weights=(20, 50, 30), landing="random", seed=11)
    slots = [first.slot_of(key) for key in keys]
    assert slots == [second.slot_of(key) for key in keys]  # same seed, same order: same map
    assert [first.slot_of(key) for key in keys] == slots  # history map: asked again, same answer
    shares = [slots.count(slot) / len(set(keys)) for slot in range(3)]
    assert shares == pytest.approx([0.2, 0.5, 0.3], abs=0.07)  # keys follow the weights
    zero = WeightStrategy(partitions=2, weights=(0, 100), landing="random")
    assert {zero.slot_of(key) for key in keys} == {1}  # a zero weight never gets a key


# ---------------------------------------------------------------------------------------------
# hot_split (ours): a key above 1/P of the events is spread over d least-loaded slots


@pytest.mark.parametrize(
    ("count", "total", "partitions", "d", "pieces"),
    [
        (10, 40, 4, 2, 1),  # exactly the fair share 1/P: not hot
        (11, 40, 4, 2, 2),  # just above: d = 2 pieces
        (30, 40, 4, 2, 3),  # 75 % at P = 4: ceil(3.0) = 3 pieces, more than d
        (40, 40, 4, 2, 4),  # a single key: all P slots
        (40, 40, 1, 2, 1),  # one slot: nothing to split
        (11, 40, 4, 3, 3),  # d = 3
        (5, 0, 4, 2, 1),  # no events at all: nothing is hot
        (3, 4, 8, 2, 3),  # would need 6 pieces, but 3 events make at most 3 non-empty ones
    ],
)
def test_hot_split_pieces_for(count: int, total: int, partitions: int, d: int, pieces: int) -> None:
    assert HotSplitStrategy(partitions=partitions, d=d).pieces_for(count, total) == pieces


@pytest.mark.parametrize(
    ("counts", "partitions", "assignment", "loads"),
    [
        ({}, 2, {}, [0, 0]),  # no keys
        # a single key is hot at P = 3: one piece per slot, round-robin sizes 4, 3, 3
        ({"a": 10}, 3, {"a": (0, 1, 2)}, [4, 3, 3]),
        # a = 10 of 17 > 17 / 3: two pieces of 5 on slots 0 and 1, then b, c, d by LPT
        ({"a": 10, "b": 3, "c": 3, "d": 1}, 3, {"a": (0, 1), "b": (2,), "c": (2,), "d": (0,)}, [6, 5, 6]),
        ({"a": 2, "b": 2}, 2, {"a": (0,), "b": (1,)}, [2, 2]),  # no key above 1/P: plain least_count
        # more slots than events: a (3 of 4) gets 3 one-event pieces, never an empty one; b stays whole
        ({"a": 3, "b": 1}, 8, {"a": (0, 1, 2), "b": (3,)}, [1, 1, 1, 1, 0, 0, 0, 0]),
    ],
)
def test_hot_split_from_counts(counts, partitions, assignment, loads) -> None:
    strategy = HotSplitStrategy.from_counts(counts, partitions)
    assert strategy.assignment == assignment
    assert strategy.loads == loads


def test_hot_split_spreads_a_hot_keys_events_round_robin() -> None:
    strategy = HotSplitStrategy.from_counts({"ORD": 90, "ATL": 45, "DFW": 45}, 4)
    assert strategy.key_affine is False
    assert strategy.slots_of("ORD") == (0, 1)  # 90 of 180 > 1/4: spread over d = 2 slots
    assert strategy.is_split("ORD") and not strategy.is_split("ATL")
    events = [strategy.slot_for_event("ORD", n) for n in range(90)]
    assert events.count(0) == events.count(1) == 45  # round-robin: equal halves
    assert strategy.slot_of("ORD") == 0  # first slot
    assert sorted(strategy.loads) == [45, 45, 45, 45]
    with pytest.raises(PlacementError, match="not key-affine"):
        SlotCache(strategy)
    with pytest.raises(PlacementError, match="sequence must be >= 0"):
        strategy.slot_for_event("ORD", -1)


def test_hot_split_places_unknown_keys_whole_and_online() -> None:
    strategy = strategy_by_name("hot_split", 2, counts={"a": 6, "b": 2})
    assert strategy.slots_of("a") == (0, 1)  # 6 of 8 > 1/2
    assert strategy.loads == [5, 3]  # pieces 3 + 3, then b on slot 0
    assert strategy.slots_of("new") == (1,)  # placed whole on the lighter slot, one event
    assert strategy.assign("a", weight=3) == (0, 1)  # 3 events over 2 slots: 2 + 1
    assert strategy.loads == [7, 5]


@pytest.mark.parametrize(
    ("name", "key_affine"),
    [
        ("hash", True),  # Kafka's default
        ("modulo", True),  # integer keys
        ("least_key", True),  # Algorithm 1, S = keys
        ("least_count", True),  # Algorithm 1, S = events
        ("weight", True),  # Algorithm 2
        ("hot_split", False),  # a hot key has several slots: never cached per key
    ],
)
def test_every_registered_strategy_keeps_the_interface(name: str, key_affine: bool) -> None:
    strategy = strategy_by_name(name, 8, epoch=2)
    assert isinstance(strategy, Strategy)
    assert (strategy.name, strategy.partitions, strategy.epoch, strategy.key_affine) == (name, 8, 2, key_affine)
    keys = [str(number) for number in range(50)]  # integers, so modulo can place them too
    slots = [strategy.slot_of(key) for key in keys]
    assert all(0 <= slot < 8 for slot in slots)
    assert [strategy.slot_of(key) for key in keys] == slots  # asked again: same slots in one epoch


# round_robin: event n -> slot n mod P, whatever its key (the keyless baseline)
@pytest.mark.parametrize(
    ("partitions", "sequences", "slots"),
    [
        (1, [0, 1, 7], [0, 0, 0]),  # one slot takes everything
        (4, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1]),  # cycles over the slots in order
        (8, [7, 8, 2**40 + 3], [7, 0, 3]),  # wraps at P; large sequence numbers
    ],
)
def test_round_robin_slot_for_event(partitions: int, sequences: list[int], slots: list[int]) -> None:
    strategy = strategy_by_name("round_robin", partitions, epoch=3)
    assert isinstance(strategy, RoundRobinStrategy) and isinstance(strategy, Strategy)
    assert (strategy.name, strategy.partitions, strategy.epoch, strategy.key_affine) == ("round_robin", partitions, 3, False)
    assert [strategy.slot_for_event("any", n) for n in sequences] == slots
    assert [strategy.slot_for_event("other", n) for n in sequences] == slots  # the key plays no part


def test_round_robin_is_every_key_split_over_every_slot() -> None:
    strategy = RoundRobinStrategy(partitions=4)
    assert strategy.slots_of("ORD") == strategy.slots_of("") == (0, 1, 2, 3)
    # the replayers' per-event rule (place_events over slots_of) gives the same slots
    codes = np.array([0, 1, 0, 1, 0, 0, 1], dtype=np.int64)
    ids = np.arange(7, dtype=np.int64)
    placed = place_events(codes, ids, np.array([0, 0]), {0: strategy.slots_of("a"), 1: strategy.slots_of("b")})
    assert placed.tolist() == [strategy.slot_for_event("a", n) for n in range(7)] == [0, 1, 2, 3, 0, 1, 2]
    assert np.bincount(placed, minlength=4).tolist() == [2, 2, 2, 1]  # even within one event


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.slot_of("ORD"), "round_robin places events, not keys: key 'ORD' has no single slot"),
        (lambda s: s.slot_for_event("ORD", -1), "event sequence must be >= 0, got -1"),  # no negative numbers
        (lambda s: SlotCache(s), "not key-affine"),  # never cached per key
    ],
)
def test_round_robin_refuses(call, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        call(RoundRobinStrategy(partitions=4))


@pytest.mark.parametrize(
    ("partitions", "epoch", "message"),
    [
        (0, 0, "partitions must be >= 1, got 0"),  # zero slots
        (4, -1, "epoch must be an int >= 0"),  # epochs count up from 0
    ],
)
def test_round_robin_construction_refuses(partitions: int, epoch: int, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        RoundRobinStrategy(partitions=partitions, epoch=epoch)

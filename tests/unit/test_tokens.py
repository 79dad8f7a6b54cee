"""Slot tokens: Spark's Murmur3 for INT columns and the token of every slot."""

import pytest

from keyshift.errors import PlacementError
from keyshift.placement.tokens import (
    default_max_stateful_partitions, slot_tokens, spark_hash_int, spark_partition_of_token, stateful_partition_of_slot,
)

# Vectors from Spark 4.2.0: SELECT hash(CAST(v AS INT)).
SPARK_HASH_VECTORS = [
    (0, 933211791),
    (1, -559580957),
    (2, 1765031574),
    (3, -1823081949),
    (-1, -1604776387),
]


@pytest.mark.parametrize(("value", "expected"), SPARK_HASH_VECTORS)
def test_spark_hash_int_matches_spark(value, expected):
    assert spark_hash_int(value) == expected


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_spark_hash_int_rejects_non_int32(value):
    with pytest.raises(ValueError, match="32-bit"):
        spark_hash_int(value)


@pytest.mark.parametrize("partitions", [1, 2, 3, 8, 16, 32, 200])
def test_every_slot_gets_its_smallest_token(partitions):
    tokens = slot_tokens(partitions)
    assert len(tokens) == partitions
    assert len(set(tokens)) == partitions
    for slot, token in enumerate(tokens):
        assert spark_partition_of_token(token, partitions) == slot
        # no smaller int lands on this slot
        assert all(spark_partition_of_token(t, partitions) != slot for t in range(token))


def test_tokens_for_eight_slots():
    # pinned: a change here moves every key's state to another partition
    assert slot_tokens(8) == (12, 6, 5, 1, 25, 15, 2, 0)


@pytest.mark.parametrize("partitions", [0, -1])
def test_partitions_must_be_positive(partitions):
    with pytest.raises(PlacementError, match="partitions"):
        slot_tokens(partitions)


def test_tokens_match_spark_sql(spark):
    """The tokens land where Spark's own hash partitioning puts them, for several P."""
    for partitions in (3, 8, 32):
        tokens = slot_tokens(partitions)
        rows = spark.createDataFrame([(t,) for t in tokens], "token INT").selectExpr(
            "token", f"pmod(hash(token), {partitions}) AS partition"
        ).collect()
        assert [row.partition for row in rows] == list(range(partitions))


def test_learned_assignment_tokens_follow_the_published_map():
    """A learned assignment's keys get their published slot's token, without Redis."""
    from keyshift.placement.spark_tokens import assignment_token_lookup

    token_of, tokens = assignment_token_lookup({"ORD": 3, "LGA": 0}, 8, "redis://127.0.0.1:1/0", "flights")
    assert token_of("ORD") == slot_tokens(8)[3]
    assert token_of("LGA") == slot_tokens(8)[0]
    assert list(tokens) == list(slot_tokens(8))


# --- P slots over S < P stateful partitions (Flink's KeyGroupRangeAssignment) ------------------

def test_stateful_partition_of_slot_is_flinks_range_assignment():
    # computeOperatorIndexForKeyGroup(maxParallelism=P, parallelism=S, keyGroupId=slot) = slot * S / P
    assert [stateful_partition_of_slot(s, 32, 8) for s in range(32)] == [s // 4 for s in range(32)]
    assert [stateful_partition_of_slot(s, 8, 3) for s in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [stateful_partition_of_slot(s, 5, 5) for s in range(5)] == [0, 1, 2, 3, 4]
    assert {stateful_partition_of_slot(s, 7, 1) for s in range(7)} == {0}


@pytest.mark.parametrize(("partitions", "stateful"), [(32, 8), (8, 3), (16, 16), (200, 7), (5, 1)])
def test_slot_tokens_over_fewer_stateful_partitions(partitions, stateful):
    tokens = slot_tokens(partitions, stateful)
    assert len(tokens) == partitions and len(set(tokens)) == partitions  # every slot keeps a grouping key of its own
    for slot, token in enumerate(tokens):
        assert spark_partition_of_token(token, stateful) == stateful_partition_of_slot(slot, partitions, stateful)
    # each partition's slots take, in slot order, the smallest ints that land on it
    for part in range(stateful):
        own = [tokens[s] for s in range(partitions) if stateful_partition_of_slot(s, partitions, stateful) == part]
        landing = [t for t in range(max(own) + 1) if spark_partition_of_token(t, stateful) == part]
        assert own == landing


@pytest.mark.parametrize("partitions", [1, 3, 8, 32])
def test_one_slot_per_stateful_partition_keeps_the_old_tokens(partitions):
    assert slot_tokens(partitions, partitions) == slot_tokens(partitions) == slot_tokens(partitions, None)


@pytest.mark.parametrize(("partitions", "stateful"), [(8, 0), (8, 9), (0, 1)])
def test_stateful_partitions_must_be_between_one_and_p(partitions, stateful):
    with pytest.raises(PlacementError, match="partitions"):
        slot_tokens(partitions, stateful)
    with pytest.raises(PlacementError, match="partitions"):
        stateful_partition_of_slot(0, partitions, stateful)


def test_slot_outside_the_slots_is_refused():
    with pytest.raises(PlacementError, match="slot 8"):
        stateful_partition_of_slot(8, 8, 2)


def test_default_cap_is_one_stateful_partition_per_core():
    assert default_max_stateful_partitions(2) == 2
    assert default_max_stateful_partitions(16) == 16
    assert default_max_stateful_partitions(0) == 1


def test_fewer_stateful_partitions_match_spark_sql(spark):
    """With S < P, Spark's hash partitioning over S puts each slot's token on its range partition."""
    for partitions, stateful in ((32, 8), (8, 3)):
        tokens = slot_tokens(partitions, stateful)
        rows = spark.createDataFrame([(t,) for t in tokens], "token INT").selectExpr(
            f"pmod(hash(token), {stateful}) AS partition"
        ).collect()
        assert [row.partition for row in rows] == [stateful_partition_of_slot(s, partitions, stateful) for s in range(partitions)]


def test_token_lookup_steers_to_the_stateful_partitions():
    from keyshift.placement.spark_tokens import token_lookup
    from keyshift.placement.strategies import HashStrategy

    token_of, tokens = token_lookup("hash", 32, 8)
    assert list(tokens) == list(slot_tokens(32, 8))
    strategy = HashStrategy(partitions=32)
    for key in ("ORD", "LGA", "SFO", "ATL", "DEN"):
        slot = strategy.slot_of(key)
        assert token_of(key) == slot_tokens(32, 8)[slot]
        assert spark_partition_of_token(token_of(key), 8) == slot // 4


def test_capped_stateful_partitions():
    from keyshift.placement.tokens import capped_stateful_partitions

    assert capped_stateful_partitions(32, 8) == 8
    assert capped_stateful_partitions(4, 8) == 4
    assert capped_stateful_partitions(12, None) == 12
    with pytest.raises(PlacementError, match="max_stateful_partitions"):
        capped_stateful_partitions(8, 0)

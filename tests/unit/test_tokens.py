"""Slot tokens: Spark's Murmur3 for INT columns and the token of every slot."""

import pytest

from keyshift.errors import PlacementError
from keyshift.placement.tokens import slot_tokens, spark_hash_int, spark_partition_of_token

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

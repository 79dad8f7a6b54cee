"""Slot tokens: integers that steer a group to a chosen Spark stateful partition.

Spark places the rows of a stateful operator grouped by column `token` on shuffle partition
`pmod(Murmur3_x86_32(token, seed=42), P)` (HashPartitioning; the same value SQL's `hash(token)`
returns for an INT column). To place slot s's keys on partition s, the job groups by
`tokens[s]`, the smallest non-negative int whose partition is s (DESIGN.md, "How a strategy
reaches Spark's stateful stage"). The token column must be INT (32-bit) both here and in the
job: a LONG hashes differently.
"""

from __future__ import annotations

from functools import lru_cache

from keyshift.errors import PlacementError

SPARK_HASH_SEED = 42
"""Seed of Spark's `Murmur3Hash` expression and of `HashPartitioning`."""

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _to_int32(x: int) -> int:
    x &= _MASK32
    return x - (1 << 32) if x & 0x80000000 else x


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `Murmur3_x86_32.hashInt(value, seed)`: the hash of a 32-bit INT column.

    Args:
        value: a Java int, -2**31 <= value < 2**31.
        seed: 32-bit seed; Spark uses 42 for `hash()` and for hash partitioning.

    Returns:
        The signed 32-bit hash, as Spark SQL's `hash(CAST(value AS INT))` returns it.

    Raises:
        ValueError: if `value` is outside the Java int range.
    """
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"value {value} is not a 32-bit int")
    k1 = (value & _MASK32) * _C1 & _MASK32
    k1 = _rotl32(k1, 15)
    k1 = k1 * _C2 & _MASK32
    h1 = (seed & _MASK32) ^ k1
    h1 = _rotl32(h1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK32
    # fmix with length 4 bytes
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK32
    h1 ^= h1 >> 16
    return _to_int32(h1)


def spark_partition_of_token(token: int, partitions: int) -> int:
    """Shuffle partition Spark gives a row grouped by INT `token`: `pmod(hash(token), P)`.

    Raises:
        PlacementError: if `partitions` < 1.
    """
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    return spark_hash_int(token) % partitions  # Python's % is pmod for a positive divisor


@lru_cache(maxsize=64)
def slot_tokens(partitions: int, search_limit: int = 1 << 20) -> tuple[int, ...]:
    """The token of every slot: `tokens[s]` is the smallest int t >= 0 Spark places on slot s.

    Args:
        partitions: P, the number of slots (= spark.sql.shuffle.partitions), 1 <= P.
        search_limit: how many candidate ints to try before giving up.

    Returns:
        A tuple of P distinct non-negative ints, index = slot.

    Raises:
        PlacementError: if `partitions` < 1, or some slot has no token below `search_limit`.
    """
    if partitions < 1:
        raise PlacementError(f"partitions must be >= 1, got {partitions}")
    tokens: list[int | None] = [None] * partitions
    missing = partitions
    for candidate in range(search_limit):
        slot = spark_partition_of_token(candidate, partitions)
        if tokens[slot] is None:
            tokens[slot] = candidate
            missing -= 1
            if missing == 0:
                return tuple(tokens)  # type: ignore[arg-type]
    raise PlacementError(
        f"no token below {search_limit} for {missing} of {partitions} slots; raise search_limit"
    )

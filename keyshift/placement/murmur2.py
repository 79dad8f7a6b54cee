"""Kafka's murmur2 key hash, bit for bit as the Java client computes it.

Source of the rule: `org.apache.kafka.common.utils.Utils.murmur2` and `Utils.toPositive`, used by
the Java producer's `BuiltInPartitioner.partitionForKey` (formerly `DefaultPartitioner`) to place a
keyed record:

    partition = toPositive(murmur2(serialized_key)) % numPartitions

Java computes in signed 32-bit `int` arithmetic that wraps on overflow; here every step is masked
to 32 bits and the result is converted to a signed value at the end, so `murmur2` returns exactly
the `int` Java returns (in [-2**31, 2**31 - 1]). kafka-python's own `kafka.partitioner.murmur2`
returns the same 32 bits as an unsigned value; after `to_positive` the two agree.

Never use Python's built-in `hash()` for placement: it is salted per process.
"""

from __future__ import annotations

import struct

SEED = 0x9747B28C
"""Java's `int seed = 0x9747b28c` (as the unsigned 32-bit pattern)."""

M = 0x5BD1E995
"""Mixing multiplier `m` of MurmurHash2."""

R = 24
"""Mixing shift `r` of MurmurHash2."""

_MASK32 = 0xFFFFFFFF
_WORDS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit MurmurHash2 of `data`, as Java's `Utils.murmur2(byte[])` returns it.

    Args:
        data: the serialized key (for keyshift: the key's UTF-8 bytes); any length >= 0.

    Returns:
        The hash as a signed 32-bit integer, -2**31 <= h <= 2**31 - 1, equal to Java's `int`.
        Known values from Kafka's `UtilsTest.testMurmur2`: `murmur2(b"21") == -973932308`,
        `murmur2(b"abc") == 479470107`.

    Raises:
        TypeError: if `data` is not bytes-like.
    """
    length = len(data)
    h = (SEED ^ length) & _MASK32
    tail_start = length & ~3
    # Body: little-endian 4-byte words, k *= m; k ^= k >>> r; k *= m; h *= m; h ^= k.
    for (k,) in _WORDS.iter_unpack(memoryview(data)[:tail_start]):
        k = (k * M) & _MASK32
        k ^= k >> R
        k = (k * M) & _MASK32
        h = ((h * M) & _MASK32) ^ k
    # Tail: Java's switch (length % 4) falls through case 3 -> 2 -> 1.
    remainder = length & 3
    if remainder == 3:
        h ^= data[tail_start + 2] << 16
    if remainder >= 2:
        h ^= data[tail_start + 1] << 8
    if remainder >= 1:
        h ^= data[tail_start]
        h = (h * M) & _MASK32
    # Final avalanche: h ^= h >>> 13; h *= m; h ^= h >>> 15.
    h ^= h >> 13
    h = (h * M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Java's `Utils.toPositive(int)`: clear the sign bit, `number & 0x7fffffff`.

    Not `abs()`: `to_positive(-2**31) == 0` and `to_positive(-1) == 2**31 - 1`, as in Java.

    Args:
        number: a signed 32-bit integer (e.g. a `murmur2` result).

    Returns:
        An integer in [0, 2**31 - 1].
    """
    return number & 0x7FFFFFFF


def partition_for_key(serialized_key: bytes, num_partitions: int) -> int:
    """The partition Kafka's Java producer picks for a keyed record (no explicit partition).

    Rule: `toPositive(murmur2(serialized_key)) % numPartitions`, from
    `BuiltInPartitioner.partitionForKey` (Kafka >= 3.3; `DefaultPartitioner` before it).
    kafka-python's `DefaultPartitioner` applies the same rule to the sorted partition ids.

    Args:
        serialized_key: the key bytes as sent on the wire.
        num_partitions: P, the partition count of the topic, P >= 1.

    Returns:
        A partition id in [0, P - 1].

    Raises:
        ValueError: if `num_partitions` < 1.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return to_positive(murmur2(serialized_key)) % num_partitions

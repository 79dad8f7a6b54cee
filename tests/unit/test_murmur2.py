"""keyshift's murmur2 against Kafka's Java values and kafka-python's implementation."""

from __future__ import annotations

import random

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from keyshift.placement.murmur2 import murmur2, partition_for_key, to_positive


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # Kafka's own vectors, clients/.../common/utils/UtilsTest.java testMurmur2:
        (b"21", -973932308),  # 2 bytes: tail only
        (b"foobar", -790332482),  # one word + 2-byte tail
        (b"a-little-bit-long-string", -985981536),  # 24 bytes: words only, no tail
        (b"a-little-bit-longer-string", -1486304829),  # 26 bytes: words + 2-byte tail
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),  # 48 bytes
        (b"abc", 479470107),  # 3-byte tail, the case-3 fall-through
        # Computed with kafka-clients 4.3.0 Utils.murmur2 (UTF-8 bytes of the string):
        (b"", 275646681),  # empty key: seed ^ 0 through the final avalanche only
        (b"ORD", 1930652851),  # the flights' hottest origin
        (b"ATL", -1647261917),  # negative hash of a 3-letter airport
        ("Zürich".encode(), -1551140815),  # multi-byte UTF-8
        ("東京".encode(), -1368386005),  # 6 bytes of CJK
        ("key-with-emoji-🙂".encode(), -1631842140),  # 4-byte UTF-8 sequence in the tail
    ],
)
def test_murmur2_matches_java(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (0, 0),  # zero stays zero
        (1, 1),  # positive unchanged
        (2**31 - 1, 2**31 - 1),  # Integer.MAX_VALUE unchanged
        (-1, 2**31 - 1),  # all bits set: sign cleared, not abs()
        (-(2**31), 0),  # Integer.MIN_VALUE: only the sign bit, which is cleared
        (-790332482, 1357151166),  # murmur2("foobar")
    ],
)
def test_to_positive_masks_like_java(number: int, expected: int) -> None:
    assert to_positive(number) == expected


@pytest.mark.parametrize(
    ("key", "partitions", "expected"),
    [
        # Java BuiltInPartitioner.partitionForKey(utf8(key), P), kafka-clients 4.3.0:
        (b"ORD", 8, 3),
        (b"ATL", 8, 3),
        (b"DFW", 8, 1),
        (b"LAX", 8, 4),
        ("Zürich".encode(), 8, 1),
        (b"foobar", 1, 0),  # one partition: everything on 0
        (b"foobar", 10, 6),  # 1357151166 % 10
    ],
)
def test_partition_for_key_matches_java(key: bytes, partitions: int, expected: int) -> None:
    assert partition_for_key(key, partitions) == expected


@pytest.mark.parametrize("partitions", [0, -1])
def test_partition_for_key_refuses_no_partitions(partitions: int) -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_key(b"ORD", partitions)


def test_murmur2_agrees_with_kafka_python_on_random_keys() -> None:
    rng = random.Random(20010101)
    for _ in range(5000):
        data = rng.randbytes(rng.randrange(0, 64))
        ours = murmur2(data)
        assert -(2**31) <= ours < 2**31
        # kafka-python returns the same 32 bits unsigned.
        assert ours & 0xFFFFFFFF == kafka_python_murmur2(data)


def test_murmur2_accepts_bytearray_and_memoryview() -> None:
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == -790332482

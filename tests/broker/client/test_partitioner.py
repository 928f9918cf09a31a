"""Kafka's murmur2 partitioner bit for bit, and the KIP-794 sticky
partitioner for records without a key."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.client.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

# UtilsTest.testMurmur2 (apache/kafka clients/src/test/.../utils/UtilsTest.java).
UTILS_TEST = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), UTILS_TEST.items())
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


# Partitions of 1000 that Kafka's Java partitioner gives these keys (the
# vectors kafka-python's test_partitioner.py checks against Java's output):
# with UTILS_TEST, every tail length (0-3 bytes after the 4-byte words).
JAVA_PARTITIONS_OF_1000 = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}


@pytest.mark.parametrize(("key", "expected"), JAVA_PARTITIONS_OF_1000.items())
def test_partition_for_key_matches_the_java_producer(key: bytes, expected: int) -> None:
    assert partition_for_key(key, 1000) == expected


def test_the_vectors_cover_every_tail_length() -> None:
    keys = [*UTILS_TEST, *JAVA_PARTITIONS_OF_1000]
    assert {len(k) % 4 for k in keys} == {0, 1, 2, 3}


def test_murmur2_of_empty_and_high_bytes() -> None:
    # Bytes >= 0x80 are unsigned in Java's (b & 0xff): the hash stays a
    # signed 32-bit int.
    for data in (b"", b"\xff", b"\x80\x81\x82", bytes(range(256))):
        h = murmur2(data)
        assert -(2**31) <= h < 2**31


def test_to_positive_clears_the_sign_bit() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # abs() would overflow in Java
    assert to_positive(5) == 5


def test_partition_for_key_as_the_java_producer() -> None:
    # toPositive(murmur2("foobar")) % 10: -790332482 & 0x7fffffff = 1357151166.
    assert partition_for_key(b"foobar", 10) == 1357151166 % 10 == 6
    assert partition_for_key(b"21", 3) == ((-973932308) & 0x7FFFFFFF) % 3
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for_key(b"k", 0)


@given(st.binary(max_size=64), st.integers(1, 1000))
def test_the_same_key_always_lands_on_one_partition(key: bytes, partitions: int) -> None:
    p = partition_for_key(key, partitions)
    assert 0 <= p < partitions
    assert partition_for_key(key, partitions) == p


def test_murmur2_refuses_a_string() -> None:
    with pytest.raises(TypeError, match="bytes"):
        murmur2("foobar")  # type: ignore[arg-type]


def test_sticky_partition_stays_until_batch_size_then_switches() -> None:
    sticky = StickyPartitioner("t", 100, random.Random(1))
    first = sticky.partition(8, range(8))
    switched = []
    for _ in range(9):
        switched.append(sticky.record_appended(10, 8, range(8)))
        assert sticky.partition(8, range(8)) == first
    # The tenth record brings it to 100 bytes: the switch.
    assert sticky.record_appended(10, 8, range(8))
    assert switched == [False] * 9


def test_sticky_switch_held_back_until_twice_batch_size() -> None:
    sticky = StickyPartitioner("t", 100, random.Random(2))
    sticky.partition(4, range(4))
    assert not sticky.record_appended(150, 4, range(4), enable_switch=False)
    assert sticky.record_appended(50, 4, range(4), enable_switch=False)


def test_sticky_skips_partitions_without_a_leader() -> None:
    rng = random.Random(3)
    sticky = StickyPartitioner("t", 1, rng)
    seen = set()
    for _ in range(200):
        seen.add(sticky.partition(6, [1, 4]))
        sticky.record_appended(1, 6, [1, 4])
    assert seen == {1, 4}


def test_sticky_uses_all_partitions_when_none_has_a_leader() -> None:
    sticky = StickyPartitioner("t", 1, random.Random(4))
    seen = set()
    for _ in range(200):
        seen.add(sticky.partition(3, []))
        sticky.record_appended(1, 3, [])
    assert seen == {0, 1, 2}


def test_sticky_chooses_again_when_the_topic_shrinks() -> None:
    sticky = StickyPartitioner("t", 1000, random.Random(5))
    while sticky.partition(10, range(10)) < 5:
        sticky.record_appended(1000, 10, range(10))
    assert sticky.partition(5, range(5)) < 5


def test_sticky_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="sticky_batch_size"):
        StickyPartitioner("t", 0, random.Random(0))
    sticky = StickyPartitioner("t", 10, random.Random(0))
    with pytest.raises(ValueError, match="no sticky partition"):
        sticky.record_appended(1, 3, [0])
    with pytest.raises(ValueError, match="0 partitions"):
        sticky.partition(0, [])


class FixedBits(random.Random):
    """Gives the 32-bit values it is told, in turn."""

    def __init__(self, values: list[int]) -> None:
        super().__init__(0)
        self.values = values

    def getrandbits(self, k: int) -> int:
        return self.values.pop(0)


def test_adaptive_weights_follow_kafkas_cumulative_table() -> None:
    # BuiltInPartitioner's own example: queue sizes 0 3 1 invert to 4 1 3,
    # the running sum 4 5 8; draws 0-3 pick the first, 4 the second, 5-7
    # the third.
    rng = FixedBits([*range(8), 0])  # a last draw for the last switch
    sticky = StickyPartitioner("t", 1, rng)
    sticky.update_load_stats([0, 3, 1], [10, 11, 12])
    picks = []
    for _ in range(8):
        picks.append(sticky.partition(13, range(13)))
        sticky.record_appended(1, 13, range(13))
    assert picks == [10, 10, 10, 10, 11, 12, 12, 12]


def test_equal_queues_or_one_partition_give_uniform_choices() -> None:
    sticky = StickyPartitioner("t", 1, FixedBits([5]))
    sticky.update_load_stats([2, 2, 2], [0, 1, 2])
    assert sticky._load is None
    sticky.update_load_stats([4], [1])
    assert sticky._load is None
    assert sticky.partition(3, [0, 1, 2]) == 5 % 3
    with pytest.raises(ValueError, match="2 queue sizes for 1 partitions"):
        sticky.update_load_stats([1, 2], [0])

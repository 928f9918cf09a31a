"""The bytes of the offsets topic's records (broker/group/codec.py): every
record type round-trips, keys and values are deterministic (compaction
compares key bytes), and bad bytes or bad records raise GroupRecordError
naming the record type and field, never another exception."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from broker.group.codec import (
    VALUE_VERSION,
    GroupRecordError,
    decode,
    encode,
    encode_key,
    encode_value,
)
from broker.group.records import (
    CoordinatorRecord,
    CurrentAssignmentKey,
    CurrentAssignmentValue,
    GroupMetadataKey,
    GroupMetadataValue,
    Key,
    MemberMetadataKey,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordType,
    SubscriptionMetadataKey,
    SubscriptionMetadataValue,
    TargetAssignmentMemberKey,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataKey,
    TargetAssignmentMetadataValue,
    Value,
)
from broker.group.types import MemberState, Partitions

ROOT = Path(__file__).resolve().parents[3]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

P1: Partitions = frozenset({("t-b", 2), ("t-a", 0), ("t-b", 0), ("t-a", 7)})

# (key, a value with every optional field set, one with the optional fields
# None or empty), one pair per record type.
EXAMPLES: dict[RecordType, tuple[Key, Value, Value]] = {
    RecordType.OFFSET_COMMIT: (
        OffsetCommitKey("group-1", "orders", 3),
        OffsetCommitValue(42, 5, "checkpoint", 1_700_000_000_000),
        OffsetCommitValue(0, -1, "", 0),
    ),
    RecordType.GROUP_METADATA: (
        GroupMetadataKey("group-1"),
        GroupMetadataValue(17),
        GroupMetadataValue(0),
    ),
    RecordType.SUBSCRIPTION_METADATA: (
        SubscriptionMetadataKey("group-1"),
        SubscriptionMetadataValue((("id-o", "orders", 6), ("id-p", "payments", 1))),
        SubscriptionMetadataValue(()),
    ),
    RecordType.MEMBER_METADATA: (
        MemberMetadataKey("group-1", "member-1"),
        MemberMetadataValue(
            instance_id="instance-1",
            rack_id="rack-a",
            client_id="client-1",
            client_host="/127.0.0.1",
            subscribed_topic_names=("orders", "payments"),
            subscribed_topic_regex="ord.*",
            rebalance_timeout_ms=45_000,
            server_assignor="uniform",
        ),
        MemberMetadataValue(None, None, "", "", (), None, 0, None),
    ),
    RecordType.TARGET_ASSIGNMENT_METADATA: (
        TargetAssignmentMetadataKey("group-1"),
        TargetAssignmentMetadataValue(17),
        TargetAssignmentMetadataValue(0),
    ),
    RecordType.TARGET_ASSIGNMENT_MEMBER: (
        TargetAssignmentMemberKey("group-1", "member-1"),
        TargetAssignmentMemberValue(P1),
        TargetAssignmentMemberValue(frozenset()),
    ),
    RecordType.CURRENT_ASSIGNMENT: (
        CurrentAssignmentKey("group-1", "member-1"),
        CurrentAssignmentValue(
            member_epoch=18,
            previous_member_epoch=17,
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=frozenset({("t-a", 0)}),
            pending_revocation=frozenset({("t-b", 1), ("t-b", 4)}),
        ),
        CurrentAssignmentValue(0, -1, MemberState.STABLE, frozenset(), frozenset()),
    ),
}


def test_every_record_type_has_examples() -> None:
    assert set(EXAMPLES) == set(RecordType)


def round_trip(record: CoordinatorRecord) -> None:
    key, value = encode(record)
    assert decode(key, value) == record
    # Decoding and encoding again gives the same bytes.
    assert encode(decode(key, value)) == (key, value)


@pytest.mark.parametrize("record_type", list(RecordType), ids=lambda t: t.name)
def test_every_type_round_trips(record_type: RecordType) -> None:
    key, full, sparse = EXAMPLES[record_type]
    for value in (full, sparse, None):
        round_trip(CoordinatorRecord(key, value))


@pytest.mark.parametrize("record_type", list(RecordType), ids=lambda t: t.name)
def test_a_tombstone_has_no_value_bytes(record_type: RecordType) -> None:
    key = EXAMPLES[record_type][0]
    key_bytes, value_bytes = encode(CoordinatorRecord(key, None))
    assert value_bytes is None
    assert key_bytes == encode_key(key)
    # The key's bytes begin with its type: a tombstone says whose state went.
    assert struct.unpack_from(">h", key_bytes)[0] == record_type
    assert decode(key_bytes, None) == CoordinatorRecord(key, None)


@pytest.mark.parametrize("record_type", list(RecordType), ids=lambda t: t.name)
def test_a_value_begins_with_its_version(record_type: RecordType) -> None:
    _, full, _ = EXAMPLES[record_type]
    assert encode_value(full)[:2] == struct.pack(">h", VALUE_VERSION) == b"\x00\x00"


def test_unicode_strings_round_trip() -> None:
    record = CoordinatorRecord(
        MemberMetadataKey("gruppe-ü-群組", "成员-🙂"),
        MemberMetadataValue(
            "instance-é",
            "rack-ß",
            "client-Ω",
            "host-\u0000-nul",
            ("тема", "話題", "🙂"),
            "^t.*ö$",
            1,
            "ünïform",
        ),
    )
    round_trip(record)
    # Lengths are of the UTF-8 bytes, not of the characters.
    assert encode_key(GroupMetadataKey("ü")) == b"\x00\x03\x00\x02\xc3\xbc"


def test_the_layout_of_an_offset_commit() -> None:
    """The bytes the module's docstring describes, written out by hand."""
    key = OffsetCommitKey("g", "orders", 3)
    value = OffsetCommitValue(offset=42, leader_epoch=5, metadata="m", commit_timestamp_ms=9)
    assert encode_key(key) == (
        b"\x00\x01"  # record type 1
        b"\x00\x01g"  # group
        b"\x00\x06orders"  # topic
        b"\x00\x00\x00\x03"  # partition
    )
    assert encode_value(value) == (
        b"\x00\x00"  # version 0
        b"\x00\x00\x00\x00\x00\x00\x00\x2a"  # offset int64
        b"\x00\x00\x00\x05"  # leader epoch int32
        b"\x00\x01m"  # metadata
        b"\x00\x00\x00\x00\x00\x00\x00\x09"  # commit timestamp int64
    )


def test_the_layout_of_a_current_assignment() -> None:
    value = CurrentAssignmentValue(
        member_epoch=3,
        previous_member_epoch=-1,
        state=MemberState.UNRELEASED_PARTITIONS,
        assigned=frozenset({("b", 9), ("a", 1), ("b", 2)}),
        pending_revocation=frozenset(),
    )
    assert encode_value(value) == (
        b"\x00\x00"  # version
        b"\x00\x00\x00\x03"  # member epoch
        b"\xff\xff\xff\xff"  # previous member epoch
        b"\x02"  # state int8
        b"\x00\x00\x00\x02"  # assigned: 2 topics, sorted by id
        b"\x00\x01a\x00\x00\x00\x01\x00\x00\x00\x01"  # a: [1]
        b"\x00\x01b\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x09"  # b: [2, 9], sorted
        b"\x00\x00\x00\x00"  # pending revocation: no topic
    )


def test_the_layout_of_member_metadata_nulls() -> None:
    value = MemberMetadataValue(None, "r", "c", "h", ("x",), None, 7, None)
    assert encode_value(value) == (
        b"\x00\x00"
        b"\xff\xff"  # instance id: null
        b"\x00\x01r"
        b"\x00\x01c"
        b"\x00\x01h"
        b"\x00\x00\x00\x01\x00\x01x"  # [x]
        b"\xff\xff"  # regex: null
        b"\x00\x00\x00\x07"
        b"\xff\xff"  # server assignor: null
    )


# -- determinism --------------------------------------------------------------


def test_equal_partition_sets_built_in_different_orders_encode_equally() -> None:
    pairs = [(f"topic-{t}", p) for t in range(30) for p in range(20)]
    encodings = set()
    for seed in range(10):
        order = pairs[:]
        random.Random(seed).shuffle(order)
        built: set[tuple[str, int]] = set()
        for pair in order:
            built.add(pair)
        value = TargetAssignmentMemberValue(frozenset(built))
        encodings.add(encode_value(value))
    assert len(encodings) == 1


@given(st.lists(st.tuples(st.text(max_size=4), st.integers(0, 50)), max_size=40), st.randoms())
def test_partition_sets_encode_whatever_their_order(
    pairs: list[tuple[str, int]], rng: random.Random
) -> None:
    shuffled = pairs[:]
    rng.shuffle(shuffled)
    a = CurrentAssignmentValue(1, 0, MemberState.STABLE, frozenset(pairs), frozenset(shuffled))
    b = CurrentAssignmentValue(1, 0, MemberState.STABLE, frozenset(shuffled), frozenset(pairs))
    assert encode_value(a) == encode_value(b)


_ENCODE_IN_A_PROCESS = """
from broker.group.codec import encode
from broker.group.records import CoordinatorRecord, TargetAssignmentMemberKey
from broker.group.records import TargetAssignmentMemberValue
parts = frozenset((f"topic-{t}", p) for t in range(40) for p in range(8))
key, value = encode(CoordinatorRecord(TargetAssignmentMemberKey("g", "m"),
                                      TargetAssignmentMemberValue(parts)))
print(key.hex(), value.hex())
"""


def test_bytes_do_not_depend_on_the_processes_hash_seed() -> None:
    """Strings hash differently in each process (PYTHONHASHSEED), so a set's
    iteration order does too: the bytes must not follow it."""
    outputs = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _ENCODE_IN_A_PROCESS],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0].strip()


# -- generated records --------------------------------------------------------

texts = st.text(max_size=12)
int32s = st.integers(-(2**31), INT32_MAX)
int64s = st.integers(-(2**63), INT64_MAX)
partition_numbers = st.one_of(st.integers(0, 8), st.integers(0, INT32_MAX))
partition_sets = st.frozensets(st.tuples(st.text(max_size=4), partition_numbers), max_size=12)

KEYS: dict[RecordType, st.SearchStrategy[Any]] = {
    RecordType.OFFSET_COMMIT: st.builds(OffsetCommitKey, texts, texts, partition_numbers),
    RecordType.GROUP_METADATA: st.builds(GroupMetadataKey, texts),
    RecordType.SUBSCRIPTION_METADATA: st.builds(SubscriptionMetadataKey, texts),
    RecordType.MEMBER_METADATA: st.builds(MemberMetadataKey, texts, texts),
    RecordType.TARGET_ASSIGNMENT_METADATA: st.builds(TargetAssignmentMetadataKey, texts),
    RecordType.TARGET_ASSIGNMENT_MEMBER: st.builds(TargetAssignmentMemberKey, texts, texts),
    RecordType.CURRENT_ASSIGNMENT: st.builds(CurrentAssignmentKey, texts, texts),
}

VALUES: dict[RecordType, st.SearchStrategy[Any]] = {
    RecordType.OFFSET_COMMIT: st.builds(OffsetCommitValue, int64s, int32s, texts, int64s),
    RecordType.GROUP_METADATA: st.builds(GroupMetadataValue, int32s),
    RecordType.SUBSCRIPTION_METADATA: st.builds(
        SubscriptionMetadataValue,
        st.lists(st.tuples(texts, texts, st.integers(0, INT32_MAX)), max_size=6).map(tuple),
    ),
    RecordType.MEMBER_METADATA: st.builds(
        MemberMetadataValue,
        st.none() | texts,
        st.none() | texts,
        texts,
        texts,
        st.lists(texts, max_size=6).map(tuple),
        st.none() | texts,
        int32s,
        st.none() | texts,
    ),
    RecordType.TARGET_ASSIGNMENT_METADATA: st.builds(TargetAssignmentMetadataValue, int32s),
    RecordType.TARGET_ASSIGNMENT_MEMBER: st.builds(TargetAssignmentMemberValue, partition_sets),
    RecordType.CURRENT_ASSIGNMENT: st.builds(
        CurrentAssignmentValue,
        int32s,
        int32s,
        st.sampled_from(MemberState),
        partition_sets,
        partition_sets,
    ),
}


def test_strategies_cover_every_record_type() -> None:
    assert set(KEYS) == set(VALUES) == set(RecordType)


records = st.one_of(
    *(st.builds(CoordinatorRecord, KEYS[t], st.none() | VALUES[t]) for t in sorted(RecordType))
)


@given(records)
def test_generated_records_round_trip(record: CoordinatorRecord) -> None:
    round_trip(record)


def decodes_or_refuses(key: bytes, value: bytes | None) -> None:
    """Bytes either raise GroupRecordError or are a record whose encoding is
    those very bytes (decoding takes nothing encoding would not write)."""
    try:
        record = decode(key, value)
    except GroupRecordError:
        return
    assert encode(record) == (key, value)


def mutate(data: bytes, draw: Callable[[st.SearchStrategy[Any]], Any]) -> bytes:
    how = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "append"]))
    if how == "append":
        return data + draw(st.binary(min_size=1, max_size=4))
    if not data:
        return draw(st.binary(max_size=4))
    i = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:i]
    if how == "flip":
        mask = draw(st.integers(1, 255))
        return data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]
    if how == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=4)) + data[i:]
    return data[:i] + data[i + 1 :]


@given(records, st.data())
def test_mutated_bytes_raise_only_group_record_errors(
    record: CoordinatorRecord, data: st.DataObject
) -> None:
    key, value = encode(record)
    for _ in range(data.draw(st.integers(1, 3))):
        if value is None or data.draw(st.booleans()):
            key = mutate(key, data.draw)
        else:
            value = mutate(value, data.draw)
    decodes_or_refuses(key, value)


@given(
    st.sampled_from(sorted(RecordType)).map(lambda t: struct.pack(">h", t)),
    st.binary(max_size=40),
    st.none() | st.binary(max_size=60).map(lambda b: b"\x00\x00" + b),
)
def test_random_bytes_raise_only_group_record_errors(
    key_type: bytes, key_rest: bytes, value: bytes | None
) -> None:
    decodes_or_refuses(key_type + key_rest, value)
    decodes_or_refuses(key_rest, value)


@given(records, records)
def test_a_value_under_another_types_key_is_refused_or_identical(
    a: CoordinatorRecord, b: CoordinatorRecord
) -> None:
    """The value bytes of one type under the key of another: refused, or (if
    the shapes happen to agree, as GROUP_METADATA's and
    TARGET_ASSIGNMENT_METADATA's do) read as the key's own type."""
    key, _ = encode(a)
    _, value = encode(b)
    decodes_or_refuses(key, value)


# -- decoding errors ----------------------------------------------------------

GOOD_KEY = encode_key(CurrentAssignmentKey("g", "m"))
GOOD_VALUE = encode_value(EXAMPLES[RecordType.CURRENT_ASSIGNMENT][1])


def refused(key: Any, value: Any) -> str:
    with pytest.raises(GroupRecordError) as info:
        decode(key, value)
    return str(info.value)


def test_an_unknown_record_type_is_refused() -> None:
    message = refused(b"\x00\x02" + GOOD_KEY[2:], None)
    assert "unknown record type 2" in message
    assert "'record type'" in message and "at byte 0" in message
    assert "unknown record type 9" in refused(b"\x00\x09", GOOD_VALUE)
    assert "unknown record type -1" in refused(b"\xff\xff", None)


def test_an_unknown_value_version_is_refused() -> None:
    message = refused(GOOD_KEY, b"\x00\x01" + GOOD_VALUE[2:])
    assert message.startswith("CURRENT_ASSIGNMENT value")
    assert "'version'" in message and "unknown value version 1" in message


# GOOD_KEY: type @0, group length @2, "g" @4, member length @5, "m" @7: a
# key cut anywhere fails at the start of the field it cut.
@pytest.mark.parametrize(
    ("cut", "field", "at"),
    [
        (0, "record type", 0),
        (1, "record type", 0),
        (2, "group_id", 2),
        (3, "group_id", 2),
        (4, "group_id", 4),
        (5, "member_id", 5),
        (6, "member_id", 5),
        (7, "member_id", 7),
    ],
)
def test_a_truncated_key_is_refused(cut: int, field: str, at: int) -> None:
    message = refused(GOOD_KEY[:cut], None)
    assert f"field {field!r}: truncated" in message and message.endswith(f"at byte {at}")


def test_a_truncated_key_names_its_field() -> None:
    message = refused(GOOD_KEY[:-1], None)
    assert message.startswith("CURRENT_ASSIGNMENT key, field 'member_id'")
    assert "at byte 7" in message


@pytest.mark.parametrize("cut", range(len(GOOD_VALUE)))
def test_a_truncated_value_is_refused(cut: int) -> None:
    message = refused(GOOD_KEY, GOOD_VALUE[:cut])
    assert message.startswith("CURRENT_ASSIGNMENT value")
    assert "truncated" in message or "count" in message


def test_a_truncated_value_names_its_field() -> None:
    # version 2 + member epoch 4 + previous 4 = 10: the state is missing.
    message = refused(GOOD_KEY, GOOD_VALUE[:10])
    assert "field 'state'" in message and "truncated" in message and "at byte 10" in message


def test_trailing_bytes_are_refused() -> None:
    message = refused(GOOD_KEY + b"\x00", None)
    assert "CURRENT_ASSIGNMENT key" in message and "1 trailing bytes" in message
    message = refused(GOOD_KEY, GOOD_VALUE + b"\x00\x00")
    assert "CURRENT_ASSIGNMENT value" in message and "2 trailing bytes" in message
    assert f"at byte {len(GOOD_VALUE)}" in message


def test_a_value_of_another_shape_is_refused() -> None:
    offset_key = encode_key(OffsetCommitKey("g", "t", 0))
    group_value = encode_value(GroupMetadataValue(5))
    message = refused(offset_key, group_value)
    assert message.startswith("OFFSET_COMMIT value, field 'offset'") and "truncated" in message
    member_value = encode_value(EXAMPLES[RecordType.MEMBER_METADATA][1])
    message = refused(encode_key(GroupMetadataKey("g")), member_value)
    assert message.startswith("GROUP_METADATA value") and "trailing bytes" in message


def test_invalid_utf8_is_refused() -> None:
    key = b"\x00\x03\x00\x03a\xff\xfe"
    message = refused(key, None)
    assert "GROUP_METADATA key, field 'group_id'" in message
    assert "invalid UTF-8" in message and "at byte 5" in message
    # An encoded surrogate is not UTF-8 either.
    assert "invalid UTF-8" in refused(b"\x00\x03\x00\x03\xed\xa0\x80", None)


def test_negative_string_lengths_are_refused() -> None:
    message = refused(b"\x00\x03\xff\xfe", None)
    assert "field 'group_id'" in message and "negative string length" in message
    # -1 is None, and a group id is not nullable.
    message = refused(b"\x00\x03\xff\xff", None)
    assert "field 'group_id'" in message and "not nullable" in message
    # A nullable string takes -1, and no other negative length.
    value = encode_value(MemberMetadataValue(None, None, "c", "h", (), None, 1, None))
    bad = value[:2] + b"\xff\xfd" + value[4:]
    message = refused(encode_key(MemberMetadataKey("g", "m")), bad)
    assert "MEMBER_METADATA value, field 'instance_id'" in message
    assert "negative string length -3" in message


def test_negative_counts_are_refused() -> None:
    key = encode_key(TargetAssignmentMemberKey("g", "m"))
    message = refused(key, b"\x00\x00\xff\xff\xff\xff")
    assert "TARGET_ASSIGNMENT_MEMBER value, field 'partitions'" in message
    assert "negative int32 count -1" in message and "at byte 2" in message
    key = encode_key(SubscriptionMetadataKey("g"))
    value = encode_value(SubscriptionMetadataValue((("i", "n", 3),)))
    message = refused(key, value[:-4] + struct.pack(">i", -3))
    assert "field 'topics[0].partition_count'" in message and "negative" in message


def test_a_count_larger_than_the_bytes_is_refused_before_reading() -> None:
    key = encode_key(TargetAssignmentMemberKey("g", "m"))
    message = refused(key, b"\x00\x00\x7f\xff\xff\xff")
    assert "field 'partitions'" in message and "count 2147483647" in message


def test_a_member_state_out_of_range_is_refused() -> None:
    bad = GOOD_VALUE[:10] + b"\x03" + GOOD_VALUE[11:]
    message = refused(GOOD_KEY, bad)
    assert "CURRENT_ASSIGNMENT value, field 'state'" in message
    assert "3 is not a MemberState" in message and "at byte 10" in message
    assert "is not a MemberState" in refused(GOOD_KEY, GOOD_VALUE[:10] + b"\xff" + GOOD_VALUE[11:])


def partitions_value(body: bytes) -> bytes:
    return b"\x00\x00" + body


TA_KEY = encode_key(TargetAssignmentMemberKey("g", "m"))


def test_partitions_must_be_sorted_and_unique() -> None:
    topic = b"\x00\x01a"
    unsorted = partitions_value(b"\x00\x00\x00\x01" + topic + struct.pack(">iii", 2, 5, 3))
    message = refused(TA_KEY, unsorted)
    assert "field \"partitions['a']\"" in message and "partition 3 is not after 5" in message
    twice = partitions_value(b"\x00\x00\x00\x01" + topic + struct.pack(">iii", 2, 5, 5))
    assert "partition 5 is not after 5" in refused(TA_KEY, twice)


def test_topics_must_be_sorted_and_unique() -> None:
    b = b"\x00\x01b" + struct.pack(">ii", 1, 0)
    a = b"\x00\x01a" + struct.pack(">ii", 1, 0)
    message = refused(TA_KEY, partitions_value(b"\x00\x00\x00\x02" + b + a))
    assert "field 'partitions'" in message and "topic 'a' is not after 'b'" in message
    assert "is not after" in refused(TA_KEY, partitions_value(b"\x00\x00\x00\x02" + a + a))


def test_a_topic_without_partitions_is_refused() -> None:
    # Followed by four bytes that could be a partition.
    empty = b"\x00\x01a" + struct.pack(">ii", 0, 0)
    message = refused(TA_KEY, partitions_value(b"\x00\x00\x00\x01" + empty))
    assert "field \"partitions['a']\": a topic with no partitions at byte 9" in message


def raw_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


# Forms random lists seldom reach: a topic with no partitions among
# well-formed ones, and the canonical form itself.
@example([("a", []), ("b", [0, 1])])
@example([("a", [0, 3]), ("b", [1])])
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.lists(st.integers(-2, 5), max_size=6)), max_size=4
    )
)
def test_only_the_one_encoding_of_a_partition_set_decodes(
    topics: list[tuple[str, list[int]]],
) -> None:
    """Partition sets written by hand in any order, with repeats, empty
    topics or negative partitions: only the sorted, duplicate-free form
    decodes (so a decoded set re-encodes to its bytes)."""
    body = struct.pack(">i", len(topics))
    for topic_id, numbers in topics:
        body += raw_string(topic_id) + struct.pack(f">i{len(numbers)}i", len(numbers), *numbers)
    ids = [topic_id for topic_id, _ in topics]
    canonical = ids == sorted(set(ids)) and all(
        numbers and numbers == sorted(set(numbers)) and numbers[0] >= 0 for _, numbers in topics
    )
    try:
        record = decode(TA_KEY, partitions_value(body))
    except GroupRecordError:
        assert not canonical
        return
    assert canonical
    assert record.value == TargetAssignmentMemberValue(
        frozenset((topic_id, n) for topic_id, numbers in topics for n in numbers)
    )
    assert record.value is not None and encode_value(record.value) == partitions_value(body)


def test_negative_partitions_are_refused() -> None:
    body = b"\x00\x00\x00\x01\x00\x01a" + struct.pack(">ii", 1, -4)
    assert "negative int32 partition -4" in refused(TA_KEY, partitions_value(body))
    key = encode_key(OffsetCommitKey("g", "t", 0))[:-4] + struct.pack(">i", -1)
    message = refused(key, None)
    assert "OFFSET_COMMIT key, field 'partition'" in message and "negative" in message


@pytest.mark.parametrize("key", ["text", 12, None, [0, 3]])
def test_keys_that_are_not_bytes_are_refused(key: Any) -> None:
    assert "is not bytes" in refused(key, None)


def test_a_value_that_is_not_bytes_is_refused() -> None:
    assert "record value: str is not bytes" in refused(GOOD_KEY, "text")


def test_bytearray_and_memoryview_are_read() -> None:
    record = decode(bytearray(GOOD_KEY), memoryview(GOOD_VALUE))  # type: ignore[arg-type]
    assert record == CoordinatorRecord(
        CurrentAssignmentKey("g", "m"), EXAMPLES[RecordType.CURRENT_ASSIGNMENT][1]
    )


# -- encoding errors ----------------------------------------------------------


def encode_refused(record: CoordinatorRecord) -> str:
    with pytest.raises(GroupRecordError) as info:
        encode(record)
    return str(info.value)


def with_value(value: Any) -> CoordinatorRecord:
    """``value`` under its own type's key."""
    for key, full, _ in EXAMPLES.values():
        if type(full) is type(value):
            return CoordinatorRecord(key, value)
    raise AssertionError(value)


@pytest.mark.parametrize(
    ("record", "field", "problem"),
    [
        (
            CoordinatorRecord(OffsetCommitKey("g", "t", INT32_MAX + 1), None),
            "OFFSET_COMMIT key, field 'partition'",
            "out of range of int32 partition",
        ),
        (
            CoordinatorRecord(OffsetCommitKey("g", "t", -1), None),
            "OFFSET_COMMIT key, field 'partition'",
            "-1 is out of range",
        ),
        (
            with_value(OffsetCommitValue(INT64_MAX + 1, 0, "", 0)),
            "OFFSET_COMMIT value, field 'offset'",
            "out of range of int64",
        ),
        (
            with_value(OffsetCommitValue(0, -(2**31) - 1, "", 0)),
            "OFFSET_COMMIT value, field 'leader_epoch'",
            "out of range of int32",
        ),
        (
            with_value(OffsetCommitValue(0, 0, "", -(2**63) - 1)),
            "OFFSET_COMMIT value, field 'commit_timestamp_ms'",
            "out of range of int64",
        ),
        (
            with_value(GroupMetadataValue(2**31)),
            "GROUP_METADATA value, field 'epoch'",
            "out of range of int32",
        ),
        (
            with_value(
                CurrentAssignmentValue(0, 0, MemberState.STABLE, frozenset({("t", 2**31)}), P1)
            ),
            "CURRENT_ASSIGNMENT value, field \"assigned['t']\"",
            "out of range of int32 partition",
        ),
        (
            with_value(SubscriptionMetadataValue((("i", "n", -1),))),
            "SUBSCRIPTION_METADATA value, field 'topics[0].partition_count'",
            "out of range of int32 count",
        ),
        (
            with_value(OffsetCommitValue(0, 0, "m" * 32768, 0)),
            "OFFSET_COMMIT value, field 'metadata'",
            "32768 bytes of UTF-8",
        ),
        (
            CoordinatorRecord(GroupMetadataKey("é" * 16384), None),
            "GROUP_METADATA key, field 'group_id'",
            "32768 bytes of UTF-8",
        ),
        (
            CoordinatorRecord(MemberMetadataKey("g", "\ud800"), None),
            "MEMBER_METADATA key, field 'member_id'",
            "not encodable as UTF-8",
        ),
        (
            CoordinatorRecord(GroupMetadataKey(None), None),  # type: ignore[arg-type]
            "GROUP_METADATA key, field 'group_id'",
            "None is not a string",
        ),
        (
            with_value(GroupMetadataValue("5")),  # type: ignore[arg-type]
            "GROUP_METADATA value, field 'epoch'",
            "'5' is not an int",
        ),
        (
            with_value(GroupMetadataValue(True)),
            "GROUP_METADATA value, field 'epoch'",
            "True is not an int",
        ),
        (
            with_value(CurrentAssignmentValue(0, 0, 3, frozenset(), frozenset())),  # type: ignore[arg-type]
            "CURRENT_ASSIGNMENT value, field 'state'",
            "3 is not a MemberState",
        ),
        (
            with_value(
                CurrentAssignmentValue(0, 0, MemberState.STABLE, frozenset({"t"}), frozenset())  # type: ignore[arg-type]
            ),
            "CURRENT_ASSIGNMENT value, field 'assigned'",
            "'t' is not a (topic id, partition) pair",
        ),
        (
            with_value(
                CurrentAssignmentValue(0, 0, MemberState.STABLE, frozenset(), [("t", 1)])  # type: ignore[arg-type]
            ),
            "CURRENT_ASSIGNMENT value, field 'pending_revocation'",
            "is not a set",
        ),
        (
            with_value(MemberMetadataValue(None, None, "c", "h", ("a", 3), None, 0, None)),  # type: ignore[arg-type]
            "MEMBER_METADATA value, field 'subscribed_topic_names[1]'",
            "3 is not a string",
        ),
        (
            with_value(SubscriptionMetadataValue((("i", "n"),))),  # type: ignore[arg-type]
            "SUBSCRIPTION_METADATA value, field 'topics[0]'",
            "is not a (topic id, topic name, partition count)",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_records_are_refused_naming_the_field(
    record: CoordinatorRecord, field: str, problem: str
) -> None:
    message = encode_refused(record)
    assert message.startswith(field), message
    assert problem in message, message


def test_the_widest_values_are_written() -> None:
    """The ends of each range are inside it (the checks are not off by one)."""
    round_trip(with_value(OffsetCommitValue(INT64_MAX, INT32_MAX, "m" * 32767, -(2**63))))
    round_trip(with_value(OffsetCommitValue(-(2**63), -(2**31), "", INT64_MAX)))
    round_trip(CoordinatorRecord(OffsetCommitKey("g" * 32767, "t", INT32_MAX), None))
    round_trip(with_value(TargetAssignmentMemberValue(frozenset({("t", 0), ("t", INT32_MAX)}))))


def test_a_value_of_another_type_under_a_key_is_refused() -> None:
    message = encode_refused(
        CoordinatorRecord(GroupMetadataKey("g"), TargetAssignmentMetadataValue(3))
    )
    assert message.startswith("GROUP_METADATA value")
    assert "TargetAssignmentMetadataValue under a GroupMetadataKey" in message


def test_things_that_are_not_records_are_refused() -> None:
    with pytest.raises(GroupRecordError, match="str is not a key type"):
        encode_key("g")  # type: ignore[arg-type]
    with pytest.raises(GroupRecordError, match="int is not a value type"):
        encode_value(3)  # type: ignore[arg-type]

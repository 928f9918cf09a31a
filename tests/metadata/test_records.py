"""Metadata records: encoding, decoding and the errors of bad ones
(metadata/records.py)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.state_machine import encode_cas, encode_delete, encode_put, encode_put_many
from metadata.acls import AclOperation, AclPermission, AclResourceType, PatternType
from metadata.records import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    AccessControlEntryRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    Endpoint,
    FeatureLevelRecord,
    FeatureRange,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MalformedRecordError,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RecordType,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnknownRecordError,
    UnregisterBrokerRecord,
    decode_record,
    encode_record,
    is_metadata_record,
)

# -- strategies, one per record type ---------------------------------------------

ints = st.integers(-(2**63), 2**63 - 1)
ids = st.integers(-1, 2**31 - 1)
texts = st.text(max_size=20)
id_tuples = st.lists(st.integers(0, 2**31 - 1), max_size=6).map(tuple)
opt_id_tuples = st.none() | id_tuples
recovery = st.sampled_from(LeaderRecoveryState)

endpoints_ = st.builds(Endpoint, texts, texts, st.integers(0, 65535), texts)
features_ = st.builds(FeatureRange, texts, st.integers(0, 2**15), st.integers(0, 2**15))

RECORDS: dict[type[Any], st.SearchStrategy[Any]] = {
    RegisterBrokerRecord: st.builds(
        RegisterBrokerRecord,
        ids,
        ints,
        texts,
        st.lists(endpoints_, max_size=3).map(tuple),
        st.none() | texts,
        st.lists(features_, max_size=3).map(tuple),
        st.booleans(),
        st.booleans(),
        st.lists(texts, max_size=3).map(tuple),
    ),
    UnregisterBrokerRecord: st.builds(UnregisterBrokerRecord, ids, ints),
    FenceBrokerRecord: st.builds(FenceBrokerRecord, ids, ints),
    UnfenceBrokerRecord: st.builds(UnfenceBrokerRecord, ids, ints),
    BrokerRegistrationChangeRecord: st.builds(
        BrokerRegistrationChangeRecord,
        ids,
        ints,
        st.none() | st.booleans(),
        st.none() | st.booleans(),
    ),
    TopicRecord: st.builds(TopicRecord, texts, texts),
    PartitionRecord: st.builds(
        PartitionRecord,
        texts,
        ids,
        id_tuples,
        id_tuples,
        id_tuples,
        id_tuples,
        ids,
        recovery,
        ids,
        ids,
    ),
    PartitionChangeRecord: st.builds(
        PartitionChangeRecord,
        texts,
        ids,
        st.sampled_from([NO_LEADER, NO_LEADER_CHANGE]) | ids,
        opt_id_tuples,
        opt_id_tuples,
        opt_id_tuples,
        opt_id_tuples,
        st.none() | recovery,
    ),
    RemoveTopicRecord: st.builds(RemoveTopicRecord, texts),
    ConfigRecord: st.builds(ConfigRecord, st.integers(0, 2), texts, texts, st.none() | texts),
    ProducerIdsRecord: st.builds(ProducerIdsRecord, ids, ints, ints),
    FeatureLevelRecord: st.builds(FeatureLevelRecord, texts, st.integers(0, 2**15)),
    AccessControlEntryRecord: st.builds(
        AccessControlEntryRecord,
        texts,
        st.sampled_from(AclResourceType),
        texts,
        st.sampled_from(PatternType),
        texts,
        texts,
        st.sampled_from(AclOperation),
        st.sampled_from(AclPermission),
    ),
    RemoveAccessControlEntryRecord: st.builds(RemoveAccessControlEntryRecord, texts),
    NoOpRecord: st.just(NoOpRecord()),
}

any_record: st.SearchStrategy[Record] = st.one_of(*RECORDS.values())


def test_every_record_type_has_a_strategy() -> None:
    assert set(RECORDS) == set(Record.__args__)


@pytest.mark.parametrize("record_type", list(RECORDS), ids=lambda t: t.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(record_type: type[Any], data: st.DataObject) -> None:
    record = data.draw(RECORDS[record_type])
    encoded = encode_record(record)
    decoded = decode_record(encoded)
    assert decoded == record
    assert type(decoded) is record_type
    assert is_metadata_record(encoded)
    # Encoding is a function of the record: replicas write equal bytes.
    assert encode_record(decoded) == encoded


@settings(max_examples=200, deadline=None)
@given(any_record)
def test_any_record_round_trips(record: Record) -> None:
    assert decode_record(encode_record(record)) == record


def test_enums_decode_as_enums() -> None:
    p = decode_record(encode_record(PartitionRecord("t", 0, (1,), (1,), leader=1)))
    assert isinstance(p, PartitionRecord)
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERED
    c = decode_record(
        encode_record(
            PartitionChangeRecord("t", 0, leader_recovery_state=LeaderRecoveryState.RECOVERING)
        )
    )
    assert isinstance(c, PartitionChangeRecord)
    assert c.leader_recovery_state is LeaderRecoveryState.RECOVERING


def test_a_registration_names_its_log_dirs_from_version_1() -> None:
    # Version 0 as before when it names none; version 1 adds the list.
    plain = RegisterBrokerRecord(1, 5, "inc", (), None, ())
    assert msgpack.unpackb(encode_record(plain))[:2] == [0, 0]
    dirs = RegisterBrokerRecord(1, 5, "inc", (), None, (), log_dirs=("a", "b"))
    wire = msgpack.unpackb(encode_record(dirs))
    assert wire[:2] == [0, 1] and wire[-1] == ["a", "b"]
    assert decode_record(encode_record(dirs)) == dirs
    assert decode_record(encode_record(plain)) == plain and plain.log_dirs == ()


def test_the_wire_form() -> None:
    # [type, version, fields...] with Kafka's record type numbers.
    assert msgpack.unpackb(encode_record(TopicRecord("orders", "id1"))) == [2, 0, "orders", "id1"]
    assert msgpack.unpackb(encode_record(NoOpRecord())) == [20, 0]
    assert msgpack.unpackb(encode_record(FeatureLevelRecord("metadata.version", 1))) == [
        12,
        0,
        "metadata.version",
        1,
    ]


# -- unknown records ---------------------------------------------------------------


def raw(*items: Any) -> bytes:
    return bytes(msgpack.packb(list(items)))


@pytest.mark.parametrize("rtype", [6, 10, 11, 99, 127, 1000, -1])
def test_unknown_type(rtype: int) -> None:
    with pytest.raises(UnknownRecordError) as info:
        decode_record(raw(rtype, 0, "x"))
    message = str(info.value)
    assert f"type {rtype}" in message
    assert "version 0" in message


@pytest.mark.parametrize("version", [1, 7, -1])
def test_unknown_version(version: int) -> None:
    with pytest.raises(UnknownRecordError) as info:
        decode_record(raw(int(RecordType.TOPIC), version, "t", "id"))
    message = str(info.value)
    assert "TOPIC" in message
    assert f"version {version}" in message
    # ... and the versions this build reads.
    assert "reads versions 0" in message


def test_unknown_is_not_malformed() -> None:
    # A reader must be able to tell "too new" from "broken".
    with pytest.raises(UnknownRecordError) as info:
        decode_record(raw(99, 0))
    assert not isinstance(info.value, MalformedRecordError)


# -- malformed records ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "does not decode"),
        (b"\xc1", "does not decode"),  # a byte msgpack never uses
        (b"\x92\x02", "does not decode"),  # truncated
        (encode_record(NoOpRecord()) + b"\x00", "does not decode"),  # trailing bytes
        (bytes(msgpack.packb({"type": 2})), "[type, version, ...]"),
        (bytes(msgpack.packb([2])), "[type, version, ...]"),
        (bytes(msgpack.packb("TopicRecord")), "[type, version, ...]"),
        (raw("2", 0, "t", "id"), "must be integers"),
        (raw(2, True, "t", "id"), "must be integers"),
        (raw(2, 0.0, "t", "id"), "must be integers"),
    ],
)
def test_not_a_record(data: bytes, fragment: str) -> None:
    with pytest.raises(MalformedRecordError) as info:
        decode_record(data)
    assert fragment in str(info.value)


SAMPLES: list[Record] = [
    RegisterBrokerRecord(
        1, 5, "inc", (Endpoint("PLAINTEXT", "h", 9092),), "r1", (FeatureRange("f", 1, 2),)
    ),
    RegisterBrokerRecord(1, 5, "inc", (), None, (), log_dirs=("dir-a", "dir-b")),
    UnregisterBrokerRecord(1, 5),
    FenceBrokerRecord(1, 5),
    UnfenceBrokerRecord(1, 5),
    BrokerRegistrationChangeRecord(1, 5, fenced=False),
    TopicRecord("t", "id"),
    PartitionRecord("id", 0, (1, 2), (1,), leader=1),
    PartitionChangeRecord("id", 0, isr=(1,)),
    RemoveTopicRecord("id"),
    ConfigRecord(2, "t", "retention.ms", "1"),
    ProducerIdsRecord(1, 5, 1000),
    FeatureLevelRecord("metadata.version", 1),
    AccessControlEntryRecord(
        "acl-1",
        AclResourceType.TOPIC,
        "orders",
        PatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermission.ALLOW,
    ),
    RemoveAccessControlEntryRecord("acl-1"),
    NoOpRecord(),
]


def test_samples_cover_every_type() -> None:
    assert {type(r) for r in SAMPLES} == set(RECORDS)


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_wrong_field_count(record: Record) -> None:
    items = msgpack.unpackb(encode_record(record))
    count = len(items) - 2
    wrongs = [items + [None]]
    if count:
        wrongs.append(items[:-1])
    for wrong in wrongs:
        with pytest.raises(MalformedRecordError) as info:
            decode_record(bytes(msgpack.packb(wrong)))
        message = str(info.value)
        assert f"expected {count}" in message
        assert RecordType(items[0]).name in message


@pytest.mark.parametrize(
    "items",
    [
        [0, 0, "1", 5, "inc", [], None, [], True, False],  # broker id a string
        [0, 0, 1, 5, 7, [], None, [], True, False],  # incarnation an int
        [0, 0, 1, 5, "inc", "eps", None, [], True, False],  # endpoints not a list
        [0, 0, 1, 5, "inc", [["n", "h", 1]], None, [], True, False],  # short endpoint
        [0, 0, 1, 5, "inc", [["n", "h", "port", "P"]], None, [], True, False],
        [0, 0, 1, 5, "inc", [], 3, [], True, False],  # rack an int
        [0, 0, 1, 5, "inc", [], None, [["f", 1]], True, False],  # short feature
        [0, 0, 1, 5, "inc", [], None, [], 1, False],  # fenced an int
        [0, 0, 1, 5, "inc", [], None, [], True, None],
        [0, 1, 1, 5, "inc", [], None, [], True, False, "d"],  # log dirs not a list
        [0, 1, 1, 5, "inc", [], None, [], True, False, ["d", 2]],  # a log dir an int
        [1, 0, 1, True],  # a boolean is not an integer
        [1, 0, 1, 1.5],
        [2, 0, "t", 7],
        [3, 0, "t", 0, [1], [1], [], [], 1, 0, 0, "0"],
        [3, 0, "t", 0, [1, "2"], [1], [], [], 1, 0, 0, 0],  # replica a string
        [3, 0, "t", 0, 1, [1], [], [], 1, 0, 0, 0],  # replicas not a list
        [3, 0, "t", 0, [1], [1], [], [], 1, 5, 0, 0],  # recovery state 5
        [5, 0, "t", 0, -2, [1], None, None, None, 9],
        [5, 0, "t", 0, -2, "1", None, None, None, None],
        [4, 0, 2, "t", "k", 5],  # config value an int
        [4, 0, "2", "t", "k", None],
        [9, 0, None],
        [12, 0, "f", "1"],
        [15, 0, 1, 1, "1000"],
        [17, 0, 1, 1, "yes", None],
    ],
)
def test_wrong_field_type(items: list[Any]) -> None:
    with pytest.raises(MalformedRecordError):
        decode_record(bytes(msgpack.packb(items)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_arbitrary_bytes_decode_or_fail_cleanly(data: bytes) -> None:
    try:
        record = decode_record(data)
    except (UnknownRecordError, MalformedRecordError):
        return
    assert decode_record(encode_record(record)) == record


@settings(max_examples=300, deadline=None)
@given(any_record, st.data())
def test_corrupted_fields_fail_cleanly(record: Record, data: st.DataObject) -> None:
    # Replace one field by a value of another kind: never a crash of
    # another sort, never a record that is not what was written.
    items = msgpack.unpackb(encode_record(record))
    if len(items) == 2:
        return
    index = data.draw(st.integers(2, len(items) - 1))
    items[index] = data.draw(
        st.sampled_from([None, "text", 1.5, True, [1, 2], {"a": 1}, b"\x00", -7])
    )
    try:
        decoded = decode_record(bytes(msgpack.packb(items)))
    except MalformedRecordError:
        return
    # Some replacements are valid values of the field (None for an optional one).
    assert type(decoded) is type(record)


# -- metadata and key-value records share the log ----------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        encode_put("k", b"v"),
        encode_put("a-much-longer-key-than-most" * 3, b"x" * 300),
        encode_put_many([("a", b"1"), ("b", b"2")]),
        encode_cas("k", None, b"v"),
        encode_cas("k", b"old", b"new"),
        encode_delete("k"),
        b"",
        b"\x90",
    ],
)
def test_key_value_records_are_not_metadata(data: bytes) -> None:
    assert not is_metadata_record(data)


@settings(max_examples=200, deadline=None)
@given(any_record)
def test_metadata_records_are_metadata(record: Record) -> None:
    assert is_metadata_record(encode_record(record))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=30), st.binary(max_size=50))
def test_any_key_value_put_is_not_metadata(key: str, value: bytes) -> None:
    assert not is_metadata_record(encode_put(key, value))
    assert not is_metadata_record(encode_delete(key))

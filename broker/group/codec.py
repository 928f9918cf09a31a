"""The bytes of the offsets topic's records (:mod:`broker.group.records`).

The layout follows Kafka's coordinator records
(``group-coordinator/src/main/resources/common/message/*Key.json`` and
``*Value.json``; KIP-848 for the consumer group's): a key is its record type
then its fields, a value is its version then its fields.  Everything is
big-endian (``struct``'s ``>``):

- ``int8``/``int16``/``int32``/``int64``: signed, of that width;
- ``string``: an int16 length then that many bytes of UTF-8; a
  ``nullable string`` is ``-1`` (no bytes) for ``None``;
- ``[T]``: an int32 count then that many ``T``;
- ``partitions``: ``[string topic id, [int32 partition]]``, the topics
  sorted by id, each topic's partitions sorted, no topic without
  partitions: a set has one encoding, so equal sets give equal bytes.

Keys (record type int16, then):

==  ==========================  =============================================
 1  OFFSET_COMMIT               group string, topic string, partition int32
 3  GROUP_METADATA              group string
 4  SUBSCRIPTION_METADATA       group string
 5  MEMBER_METADATA             group string, member string
 6  TARGET_ASSIGNMENT_METADATA  group string
 7  TARGET_ASSIGNMENT_MEMBER    group string, member string
 8  CURRENT_ASSIGNMENT          group string, member string
==  ==========================  =============================================

Values (version int16, 0 for every type, then):

==========================  ==================================================
OFFSET_COMMIT               offset int64, leader epoch int32, metadata
                            string, commit timestamp int64
GROUP_METADATA              epoch int32
SUBSCRIPTION_METADATA       [topic id string, topic name string,
                            partition count int32]
MEMBER_METADATA             instance id nullable string, rack id nullable
                            string, client id string, client host string,
                            [subscribed topic name string], subscribed
                            regex nullable string, rebalance timeout int32,
                            server assignor nullable string
TARGET_ASSIGNMENT_METADATA  assignment epoch int32
TARGET_ASSIGNMENT_MEMBER    partitions
CURRENT_ASSIGNMENT          member epoch int32, previous member epoch
                            int32, state int8 (MemberState), assigned
                            partitions, pending revocation partitions
==========================  ==================================================

A tombstone (value ``None``) is allowed for every type.  Kafka names
topics of assignments by a 16-byte UUID; kq's topic ids are strings, so
they are written as strings.  Kafka's values use flexible versions (tagged
fields, compact strings); kq's version 0 has neither, and a later version
is a new number here.

Keys must be deterministic: compaction keeps the last record of each key
*bytes*, so two encodings of one key would keep two states of it.  Values
are deterministic too (the same state, the same bytes), which lets a test
compare a replayed log with its compaction byte for byte.  Decoding
accepts only what encoding writes (a sorted, duplicate-free partition set,
no trailing bytes, ...), so a record that decodes re-encodes to the same
bytes; anything else raises :class:`GroupRecordError`, never another
exception.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Final

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
from broker.record_bytes import (
    INT8,
    INT16,
    INT32,
    INT64,
    STRING_MAX,
    IntType,
    Reader,
    Writer,
    as_bytes,
)

__all__ = [
    "VALUE_VERSION",
    "GroupRecordError",
    "decode",
    "encode",
    "encode_key",
    "encode_value",
]

# The only value version there is (every type's).
VALUE_VERSION: Final = 0


class GroupRecordError(ValueError):
    """Bytes that are not a record of the offsets topic, or a record that
    cannot be written as bytes; the message names the record type (when it
    is known), the field and, on decoding, the byte offset."""


class _Kind(enum.Enum):
    """How one field is written."""

    STRING = "string"
    NULLABLE_STRING = "nullable string"
    INT32 = "int32"
    # An int32 that counts something: never negative.
    COUNT = "int32 count"
    # A partition index: an int32, never negative.
    PARTITION = "int32 partition"
    INT64 = "int64"
    STATE = "int8 MemberState"
    STRINGS = "[string]"
    TOPICS = "[topic id, topic name, partition count]"
    PARTITIONS = "partitions"


@dataclass(frozen=True, slots=True)
class _Schema:
    """A record type's key and value classes and the kinds of their fields,
    in the order they are written (the dataclasses' field order)."""

    key_class: type[Any]
    key_fields: tuple[tuple[str, _Kind], ...]
    value_class: type[Any]
    value_fields: tuple[tuple[str, _Kind], ...]


_GROUP = ("group_id", _Kind.STRING)
_MEMBER = ("member_id", _Kind.STRING)

_SCHEMAS: Final[dict[RecordType, _Schema]] = {
    # OffsetCommitKey.json / OffsetCommitValue.json
    RecordType.OFFSET_COMMIT: _Schema(
        OffsetCommitKey,
        (_GROUP, ("topic", _Kind.STRING), ("partition", _Kind.PARTITION)),
        OffsetCommitValue,
        (
            ("offset", _Kind.INT64),
            ("leader_epoch", _Kind.INT32),
            ("metadata", _Kind.STRING),
            ("commit_timestamp_ms", _Kind.INT64),
        ),
    ),
    # ConsumerGroupMetadataKey.json / ConsumerGroupMetadataValue.json
    RecordType.GROUP_METADATA: _Schema(
        GroupMetadataKey, (_GROUP,), GroupMetadataValue, (("epoch", _Kind.INT32),)
    ),
    # ConsumerGroupPartitionMetadataKey.json / ...Value.json
    RecordType.SUBSCRIPTION_METADATA: _Schema(
        SubscriptionMetadataKey,
        (_GROUP,),
        SubscriptionMetadataValue,
        (("topics", _Kind.TOPICS),),
    ),
    # ConsumerGroupMemberMetadataKey.json / ...Value.json
    RecordType.MEMBER_METADATA: _Schema(
        MemberMetadataKey,
        (_GROUP, _MEMBER),
        MemberMetadataValue,
        (
            ("instance_id", _Kind.NULLABLE_STRING),
            ("rack_id", _Kind.NULLABLE_STRING),
            ("client_id", _Kind.STRING),
            ("client_host", _Kind.STRING),
            ("subscribed_topic_names", _Kind.STRINGS),
            ("subscribed_topic_regex", _Kind.NULLABLE_STRING),
            ("rebalance_timeout_ms", _Kind.INT32),
            ("server_assignor", _Kind.NULLABLE_STRING),
        ),
    ),
    # ConsumerGroupTargetAssignmentMetadataKey.json / ...Value.json
    RecordType.TARGET_ASSIGNMENT_METADATA: _Schema(
        TargetAssignmentMetadataKey,
        (_GROUP,),
        TargetAssignmentMetadataValue,
        (("assignment_epoch", _Kind.INT32),),
    ),
    # ConsumerGroupTargetAssignmentMemberKey.json / ...Value.json
    RecordType.TARGET_ASSIGNMENT_MEMBER: _Schema(
        TargetAssignmentMemberKey,
        (_GROUP, _MEMBER),
        TargetAssignmentMemberValue,
        (("partitions", _Kind.PARTITIONS),),
    ),
    # ConsumerGroupCurrentMemberAssignmentKey.json / ...Value.json
    RecordType.CURRENT_ASSIGNMENT: _Schema(
        CurrentAssignmentKey,
        (_GROUP, _MEMBER),
        CurrentAssignmentValue,
        (
            ("member_epoch", _Kind.INT32),
            ("previous_member_epoch", _Kind.INT32),
            ("state", _Kind.STATE),
            ("assigned", _Kind.PARTITIONS),
            ("pending_revocation", _Kind.PARTITIONS),
        ),
    ),
}

_TYPE_OF_KEY: Final = {schema.key_class: t for t, schema in _SCHEMAS.items()}
_TYPE_OF_VALUE: Final = {schema.value_class: t for t, schema in _SCHEMAS.items()}

# The fewest bytes one element of an array can take: a count larger than
# the bytes left divided by it is refused before anything is read.
_MIN_ELEMENT_BYTES: Final = {
    _Kind.STRINGS: 2,  # an empty string
    _Kind.TOPICS: 2 + 2 + 4,
    _Kind.PARTITIONS: 2 + 4 + 4,  # a topic has at least one partition
}

# The int kinds, named in messages by their kind ("negative int32 count -1").
_INT_TYPES: Final = {
    _Kind.INT32: IntType(INT32, -(2**31), _Kind.INT32.value),
    _Kind.COUNT: IntType(INT32, 0, _Kind.COUNT.value),
    _Kind.PARTITION: IntType(INT32, 0, _Kind.PARTITION.value),
    _Kind.INT64: IntType(INT64, -(2**63), _Kind.INT64.value),
}
_COUNT: Final = _INT_TYPES[_Kind.COUNT]


# -- encoding -----------------------------------------------------------------


class _Writer(Writer):
    """Appends fields to a bytearray; ``where`` names the record type and
    part (key or value) for errors."""

    __slots__ = ()

    # The offsets topic's messages say which limit ("a string's 32767").
    string_limit = f"a string's {STRING_MAX}"

    def __init__(self, where: str) -> None:
        super().__init__(GroupRecordError, where)

    def sequence(self, field: str, value: object) -> tuple[object, ...]:
        if not isinstance(value, tuple | list):
            raise self.fail(field, f"{value!r} is not a tuple")
        self.int_(field, _COUNT, len(value))
        return tuple(value)

    def partitions(self, field: str, value: object) -> None:
        if not isinstance(value, frozenset | set):
            raise self.fail(field, f"{value!r} is not a set of (topic id, partition)")
        by_topic: dict[str, list[int]] = {}
        for element in value:
            if (
                not isinstance(element, tuple)
                or len(element) != 2
                or not isinstance(element[0], str)
            ):
                raise self.fail(field, f"{element!r} is not a (topic id, partition) pair")
            by_topic.setdefault(element[0], []).append(element[1])
        self.int_(field, _COUNT, len(by_topic))
        for topic_id in sorted(by_topic):
            self.string(f"{field}[{topic_id!r}]", topic_id)
            numbers = by_topic[topic_id]
            self.int_(f"{field}[{topic_id!r}]", _COUNT, len(numbers))
            for number in numbers:
                # Checked before sorting: a non-int cannot be compared.
                self._check_int(f"{field}[{topic_id!r}]", _INT_TYPES[_Kind.PARTITION], number)
            for number in sorted(numbers):
                self.out += INT32.pack(number)

    def _check_int(self, field: str, kind: IntType, value: object) -> None:
        mark = len(self.out)
        self.int_(field, kind, value)
        del self.out[mark:]

    def field(self, field: str, kind: _Kind, value: object) -> None:
        if kind in _INT_TYPES:
            self.int_(field, _INT_TYPES[kind], value)
        elif kind is _Kind.STRING:
            self.string(field, value)
        elif kind is _Kind.NULLABLE_STRING:
            self.string(field, value, nullable=True)
        elif kind is _Kind.STATE:
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.fail(field, f"{value!r} is not a MemberState")
            try:
                state = MemberState(value)
            except ValueError:
                raise self.fail(field, f"{value} is not a MemberState") from None
            self.out += INT8.pack(state)
        elif kind is _Kind.STRINGS:
            for i, name in enumerate(self.sequence(field, value)):
                self.string(f"{field}[{i}]", name)
        elif kind is _Kind.TOPICS:
            for i, entry in enumerate(self.sequence(field, value)):
                if not isinstance(entry, tuple) or len(entry) != 3:
                    raise self.fail(
                        f"{field}[{i}]",
                        f"{entry!r} is not a (topic id, topic name, partition count)",
                    )
                topic_id, name, count = entry
                self.string(f"{field}[{i}].topic_id", topic_id)
                self.string(f"{field}[{i}].topic_name", name)
                self.int_(f"{field}[{i}].partition_count", _COUNT, count)
        else:
            assert kind is _Kind.PARTITIONS, kind
            self.partitions(field, value)


def _write_fields(writer: _Writer, record: object, layout: tuple[tuple[str, _Kind], ...]) -> bytes:
    for name, kind in layout:
        writer.field(name, kind, getattr(record, name))
    return bytes(writer.out)


def encode_key(key: Key) -> bytes:
    """The key's bytes: its record type (int16), then its fields."""
    record_type = _TYPE_OF_KEY.get(type(key))
    if record_type is None:
        raise GroupRecordError(f"record key: {type(key).__name__} is not a key type")
    writer = _Writer(f"{record_type.name} key")
    writer.out += INT16.pack(record_type)
    return _write_fields(writer, key, _SCHEMAS[record_type].key_fields)


def encode_value(value: Value) -> bytes:
    """The value's bytes: its version (int16, :data:`VALUE_VERSION`), then
    its fields."""
    record_type = _TYPE_OF_VALUE.get(type(value))
    if record_type is None:
        raise GroupRecordError(f"record value: {type(value).__name__} is not a value type")
    writer = _Writer(f"{record_type.name} value")
    writer.out += INT16.pack(VALUE_VERSION)
    return _write_fields(writer, value, _SCHEMAS[record_type].value_fields)


def encode(record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
    """The record's key and value bytes (``None`` for a tombstone).  The
    value must be of its key's type: a GroupMetadataKey with an
    OffsetCommitValue would be read back as garbage, or not at all."""
    key = encode_key(record.key)
    if record.value is None:
        return key, None
    record_type = _TYPE_OF_KEY[type(record.key)]
    wanted = _SCHEMAS[record_type].value_class
    if type(record.value) is not wanted:
        raise GroupRecordError(
            f"{record_type.name} value: a {type(record.value).__name__} under a "
            f"{type(record.key).__name__} (wants a {wanted.__name__})"
        )
    return key, encode_value(record.value)


# -- decoding -----------------------------------------------------------------


class _Reader(Reader):
    """Reads fields from ``data`` from the start; every failure is a
    :class:`GroupRecordError` naming ``where``, the field and the offset."""

    __slots__ = ()

    # Some of its strings are nullable: a -1 length elsewhere says why not.
    not_nullable_note = " (the field is not nullable)"

    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(GroupRecordError, data, where)

    def count_of(self, field: str, kind: _Kind) -> int:
        return self.count(field, _COUNT, _MIN_ELEMENT_BYTES[kind])

    def partitions(self, field: str) -> Partitions:
        out: list[tuple[str, int]] = []
        previous_topic: str | None = None
        for _ in range(self.count_of(field, _Kind.PARTITIONS)):
            at = self.pos
            topic_id = self.text(f"{field}[topic id]")
            if previous_topic is not None and topic_id <= previous_topic:
                # Sorted and unique: one set, one encoding.
                raise self.fail(field, f"topic {topic_id!r} is not after {previous_topic!r}", at)
            previous_topic = topic_id
            where = f"{field}[{topic_id!r}]"
            at = self.pos
            count = self.count(where, _COUNT, 4)
            if count == 0:
                raise self.fail(where, "a topic with no partitions", at)
            previous = -1
            for _ in range(count):
                at = self.pos
                number = self.int_(where, _INT_TYPES[_Kind.PARTITION])
                if number <= previous:
                    raise self.fail(where, f"partition {number} is not after {previous}", at)
                previous = number
                out.append((topic_id, number))
        return frozenset(out)

    def field(self, field: str, kind: _Kind) -> object:
        if kind in _INT_TYPES:
            return self.int_(field, _INT_TYPES[kind])
        if kind is _Kind.STRING:
            return self.text(field)
        if kind is _Kind.NULLABLE_STRING:
            return self.string(field, nullable=True)
        if kind is _Kind.STATE:
            at = self.pos
            raw = self.fixed(field, INT8)
            try:
                return MemberState(raw)
            except ValueError:
                states = ", ".join(f"{s.value} {s.name}" for s in MemberState)
                raise self.fail(field, f"{raw} is not a MemberState ({states})", at) from None
        if kind is _Kind.STRINGS:
            count = self.count_of(field, kind)
            return tuple(self.text(f"{field}[{i}]") for i in range(count))
        if kind is _Kind.TOPICS:
            count = self.count_of(field, kind)
            return tuple(
                (
                    self.text(f"{field}[{i}].topic_id"),
                    self.text(f"{field}[{i}].topic_name"),
                    self.int_(f"{field}[{i}].partition_count", _COUNT),
                )
                for i in range(count)
            )
        assert kind is _Kind.PARTITIONS, kind
        return self.partitions(field)

    def record(self, cls: Callable[..., Any], layout: tuple[tuple[str, _Kind], ...]) -> Any:
        values = {name: self.field(name, kind) for name, kind in layout}
        self.end("the bytes do not fit the record type's layout")
        return cls(**values)


def decode(key: bytes, value: bytes | None) -> CoordinatorRecord:
    """The record of a key's and value's bytes (``value`` ``None`` for a
    tombstone).  Raises :class:`GroupRecordError` for anything
    :func:`encode` would not have written."""
    key_reader = _Reader(as_bytes(key, GroupRecordError, "record key"), "record key")
    raw_type = key_reader.fixed("record type", INT16)
    try:
        record_type = RecordType(raw_type)
    except ValueError:
        known = ", ".join(f"{t.value} {t.name}" for t in RecordType)
        raise key_reader.fail(
            "record type", f"unknown record type {raw_type} ({known})", 0
        ) from None
    schema = _SCHEMAS[record_type]
    key_reader.where = f"{record_type.name} key"
    decoded_key: Key = key_reader.record(schema.key_class, schema.key_fields)
    if value is None:
        return CoordinatorRecord(decoded_key, None)
    value_reader = _Reader(
        as_bytes(value, GroupRecordError, "record value"), f"{record_type.name} value"
    )
    version = value_reader.fixed("version", INT16)
    if version != VALUE_VERSION:
        raise value_reader.fail(
            "version", f"unknown value version {version} (known: {VALUE_VERSION})", 0
        )
    decoded_value: Value = value_reader.record(schema.value_class, schema.value_fields)
    return CoordinatorRecord(decoded_key, decoded_value)


def _check_schemas() -> None:
    """Every field of every record class is written, in its order: a field
    added to :mod:`broker.group.records` without a layout here fails at
    import, not as a record that silently loses it."""
    for record_type, schema in _SCHEMAS.items():
        for cls, layout in (
            (schema.key_class, schema.key_fields),
            (schema.value_class, schema.value_fields),
        ):
            names = tuple(f.name for f in fields(cls))
            if names != tuple(name for name, _ in layout):
                raise AssertionError(f"{record_type.name}: {cls.__name__} has fields {names}")


_check_schemas()

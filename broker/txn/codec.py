"""The bytes of the transaction log's records (:mod:`broker.txn.records`).

The layout follows Kafka's ``TransactionLogKey.json`` and
``TransactionLogValue.json``: a key is its version then the transactional
id, a value is its version then its fields.  Big-endian throughout:

- ``int8``/``int16``/``int32``/``int64``: signed, of that width;
- ``string``: an int16 length then that many bytes of UTF-8;
- ``partitions``: an int32 count of topics, then per topic its name
  (string), an int32 count and that many int32 partitions; topics sorted
  by name, partitions sorted, no topic without partitions, so that a set
  has one encoding.

==========  ===================================================================
key         version int16 (0), transactional id string
value       version int16 (0), producer id int64, previous producer id int64,
            next producer id int64, producer epoch int16, last producer epoch
            int16, timeout ms int32, state int8 (TransactionState),
            partitions, last update ms int64, start ms int64, client
            transaction version int16
==========  ===================================================================

A tombstone (value ``None``) deletes the id.  Kafka's value version 1 is
flexible (compact strings, the KIP-890 fields as tagged fields) and has no
last producer epoch; kq's version 0 writes every field plainly, and a later
layout is a new version number here.

Decoding accepts only what encoding writes (sorted, duplicate-free
partitions, a known state, no trailing bytes, ...), so a record that
decodes re-encodes to the same bytes; anything else raises
:class:`TxnRecordError` naming the field and the byte offset, never another
exception.
"""

from __future__ import annotations

import struct
from typing import Final

from broker.txn.records import TransactionLogKey, TransactionLogValue, TxnRecord
from broker.txn.types import TopicPartition, TransactionState

__all__ = [
    "KEY_VERSION",
    "VALUE_VERSION",
    "TxnRecordError",
    "decode",
    "encode",
    "encode_key",
    "encode_value",
]

KEY_VERSION: Final = 0
VALUE_VERSION: Final = 0

_INT8: Final = struct.Struct(">b")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")
_STRING_MAX: Final = 2**15 - 1

# (field, struct, lowest allowed value) of the value's integers, in order,
# around the partitions (which come between timeout/state and the
# timestamps).
_BEFORE_PARTITIONS: Final = (
    ("producer_id", _INT64, -1),
    ("previous_producer_id", _INT64, -1),
    ("next_producer_id", _INT64, -1),
    ("producer_epoch", _INT16, -1),
    ("last_producer_epoch", _INT16, -1),
    ("timeout_ms", _INT32, 0),
)
_AFTER_PARTITIONS: Final = (
    ("last_update_ms", _INT64, -1),
    ("start_ms", _INT64, -1),
    ("client_transaction_version", _INT16, 0),
)


class TxnRecordError(ValueError):
    """Bytes that are not a record of the transaction log, or a record that
    cannot be written as bytes; the message names the part (key or value),
    the field and, on decoding, the byte offset."""


# -- encoding -----------------------------------------------------------------


class _Writer:
    __slots__ = ("out", "where")

    def __init__(self, where: str) -> None:
        self.out = bytearray()
        self.where = where

    def fail(self, field: str, problem: str) -> TxnRecordError:
        return TxnRecordError(f"transaction log {self.where}, field {field!r}: {problem}")

    def int_(self, field: str, codec: struct.Struct, low: int, value: object) -> None:
        # bool is an int to Python but never a field of these records.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(field, f"{value!r} is not an int")
        high = 2 ** (8 * codec.size - 1) - 1
        if not low <= value <= high:
            raise self.fail(field, f"{value} is out of range [{low}, {high}]")
        self.out += codec.pack(value)

    def string(self, field: str, value: object) -> None:
        if not isinstance(value, str):
            raise self.fail(field, f"{value!r} is not a string")
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise self.fail(field, f"not encodable as UTF-8 ({e.reason})") from None
        if len(data) > _STRING_MAX:
            raise self.fail(field, f"{len(data)} bytes of UTF-8, more than {_STRING_MAX}")
        self.out += _INT16.pack(len(data))
        self.out += data


def encode_key(key: TransactionLogKey) -> bytes:
    """The key's bytes: :data:`KEY_VERSION` (int16), the transactional id."""
    if not isinstance(key, TransactionLogKey):
        raise TxnRecordError(f"transaction log key: {type(key).__name__} is not a key")
    writer = _Writer("key")
    writer.out += _INT16.pack(KEY_VERSION)
    writer.string("transactional_id", key.transactional_id)
    return bytes(writer.out)


def encode_value(value: TransactionLogValue) -> bytes:
    """The value's bytes: :data:`VALUE_VERSION` (int16), then its fields."""
    if not isinstance(value, TransactionLogValue):
        raise TxnRecordError(f"transaction log value: {type(value).__name__} is not a value")
    writer = _Writer("value")
    writer.out += _INT16.pack(VALUE_VERSION)
    for name, codec, low in _BEFORE_PARTITIONS:
        writer.int_(name, codec, low, getattr(value, name))
    state = value.state
    if not isinstance(state, TransactionState):
        raise writer.fail("state", f"{state!r} is not a TransactionState")
    writer.out += _INT8.pack(state)
    partitions = value.partitions
    if not isinstance(partitions, frozenset | set):
        raise writer.fail("partitions", f"{partitions!r} is not a set of TopicPartition")
    topics: dict[str, list[int]] = {}
    for tp in partitions:
        if not isinstance(tp, TopicPartition) or not isinstance(tp.topic, str):
            raise writer.fail("partitions", f"{tp!r} is not a TopicPartition of a topic name")
        topics.setdefault(tp.topic, []).append(tp.partition)
    writer.int_("partitions", _INT32, 0, len(topics))
    for topic in sorted(topics):
        where = f"partitions[{topic!r}]"
        writer.string(where, topic)
        numbers = topics[topic]
        for number in numbers:
            # Checked before sorting: a non-int cannot be compared.
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise writer.fail(where, f"partition {number!r} is not an int >= 0")
        writer.int_(where, _INT32, 0, len(numbers))
        for number in sorted(numbers):
            writer.int_(where, _INT32, 0, number)
    for name, codec, low in _AFTER_PARTITIONS:
        writer.int_(name, codec, low, getattr(value, name))
    return bytes(writer.out)


def encode(record: TxnRecord) -> tuple[bytes, bytes | None]:
    """The record's key and value bytes (``None`` for a tombstone)."""
    key = encode_key(record.key)
    return key, None if record.value is None else encode_value(record.value)


# -- decoding -----------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos", "where")

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.pos = 0
        self.where = where

    def fail(self, field: str, problem: str, at: int | None = None) -> TxnRecordError:
        offset = self.pos if at is None else at
        return TxnRecordError(
            f"transaction log {self.where}, field {field!r}: {problem} at byte {offset}"
        )

    def take(self, field: str, size: int) -> bytes:
        left = len(self.data) - self.pos
        if size > left:
            raise self.fail(field, f"truncated ({size} bytes needed, {left} left)")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def int_(self, field: str, codec: struct.Struct, low: int) -> int:
        at = self.pos
        value: int = codec.unpack(self.take(field, codec.size))[0]
        if value < low:
            raise self.fail(field, f"{value} is below {low}", at)
        return value

    def string(self, field: str) -> str:
        at = self.pos
        length = self.int_(field, _INT16, -(2**15))
        if length < 0:
            raise self.fail(field, f"negative string length {length}", at)
        data = self.take(field, length)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(field, f"invalid UTF-8 ({e.reason})", at + 2 + e.start) from None

    def count(self, field: str, min_element_bytes: int) -> int:
        at = self.pos
        count = self.int_(field, _INT32, 0)
        left = len(self.data) - self.pos
        if count * min_element_bytes > left:
            raise self.fail(field, f"count {count} is more than the {left} bytes left can hold", at)
        return count

    def end(self) -> None:
        left = len(self.data) - self.pos
        if left:
            raise TxnRecordError(
                f"transaction log {self.where}: {left} trailing bytes at byte {self.pos}"
            )


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TxnRecordError(f"transaction log {what}: {type(data).__name__} is not bytes")


def _version(reader: _Reader, known: int) -> None:
    version = reader.int_("version", _INT16, -(2**15))
    if version != known:
        raise reader.fail("version", f"unknown version {version} (known: {known})", 0)


def decode_value(data: bytes) -> TransactionLogValue:
    reader = _Reader(_as_bytes(data, "value"), "value")
    _version(reader, VALUE_VERSION)
    fields: dict[str, object] = {}
    for name, codec, low in _BEFORE_PARTITIONS:
        fields[name] = reader.int_(name, codec, low)
    at = reader.pos
    raw_state = reader.int_("state", _INT8, -(2**7))
    try:
        fields["state"] = TransactionState(raw_state)
    except ValueError:
        known = ", ".join(f"{s.value} {s.name}" for s in TransactionState)
        raise reader.fail("state", f"{raw_state} is not a TransactionState ({known})", at) from None
    partitions: list[TopicPartition] = []
    previous_topic: str | None = None
    # A topic is at least its empty name, a count and one partition.
    for _ in range(reader.count("partitions", 2 + 4 + 4)):
        at = reader.pos
        topic = reader.string("partitions[topic]")
        if previous_topic is not None and topic <= previous_topic:
            raise reader.fail("partitions", f"topic {topic!r} is not after {previous_topic!r}", at)
        previous_topic = topic
        where = f"partitions[{topic!r}]"
        at = reader.pos
        count = reader.count(where, 4)
        if count == 0:
            raise reader.fail(where, "a topic with no partitions", at)
        previous = -1
        for _ in range(count):
            at = reader.pos
            number = reader.int_(where, _INT32, 0)
            if number <= previous:
                raise reader.fail(where, f"partition {number} is not after {previous}", at)
            previous = number
            partitions.append(TopicPartition(topic, number))
    fields["partitions"] = frozenset(partitions)
    for name, codec, low in _AFTER_PARTITIONS:
        fields[name] = reader.int_(name, codec, low)
    reader.end()
    return TransactionLogValue(**fields)  # type: ignore[arg-type]


def decode_key(data: bytes) -> TransactionLogKey:
    reader = _Reader(_as_bytes(data, "key"), "key")
    _version(reader, KEY_VERSION)
    key = TransactionLogKey(reader.string("transactional_id"))
    reader.end()
    return key


def decode(key: bytes, value: bytes | None) -> TxnRecord:
    """The record of a key's and value's bytes (``value`` ``None`` for a
    tombstone).  Raises :class:`TxnRecordError` for anything :func:`encode`
    would not have written."""
    decoded_key = decode_key(key)
    return TxnRecord(decoded_key, None if value is None else decode_value(value))

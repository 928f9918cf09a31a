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

from typing import Final

from broker.record_bytes import INT8, INT16, INT32, INT64, IntType, Reader, Writer, as_bytes
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

# (field, its int type) of the value's integers, in order, around the
# partitions (which come between timeout/state and the timestamps).
_BEFORE_PARTITIONS: Final = (
    ("producer_id", IntType(INT64, -1)),
    ("previous_producer_id", IntType(INT64, -1)),
    ("next_producer_id", IntType(INT64, -1)),
    ("producer_epoch", IntType(INT16, -1)),
    ("last_producer_epoch", IntType(INT16, -1)),
    ("timeout_ms", IntType(INT32, 0)),
)
_AFTER_PARTITIONS: Final = (
    ("last_update_ms", IntType(INT64, -1)),
    ("start_ms", IntType(INT64, -1)),
    ("client_transaction_version", IntType(INT16, 0)),
)
# Counts and partition numbers: int32s, never negative.
_NATURAL: Final = IntType(INT32, 0)


class TxnRecordError(ValueError):
    """Bytes that are not a record of the transaction log, or a record that
    cannot be written as bytes; the message names the part (key or value),
    the field and, on decoding, the byte offset."""


# -- encoding -----------------------------------------------------------------


def encode_key(key: TransactionLogKey) -> bytes:
    """The key's bytes: :data:`KEY_VERSION` (int16), the transactional id."""
    if not isinstance(key, TransactionLogKey):
        raise TxnRecordError(f"transaction log key: {type(key).__name__} is not a key")
    writer = Writer(TxnRecordError, "transaction log key")
    writer.out += INT16.pack(KEY_VERSION)
    writer.string("transactional_id", key.transactional_id)
    return bytes(writer.out)


def encode_value(value: TransactionLogValue) -> bytes:
    """The value's bytes: :data:`VALUE_VERSION` (int16), then its fields."""
    if not isinstance(value, TransactionLogValue):
        raise TxnRecordError(f"transaction log value: {type(value).__name__} is not a value")
    writer = Writer(TxnRecordError, "transaction log value")
    writer.out += INT16.pack(VALUE_VERSION)
    for name, kind in _BEFORE_PARTITIONS:
        writer.int_(name, kind, getattr(value, name))
    state = value.state
    if not isinstance(state, TransactionState):
        raise writer.fail("state", f"{state!r} is not a TransactionState")
    writer.out += INT8.pack(state)
    partitions = value.partitions
    if not isinstance(partitions, frozenset | set):
        raise writer.fail("partitions", f"{partitions!r} is not a set of TopicPartition")
    topics: dict[str, list[int]] = {}
    for tp in partitions:
        if not isinstance(tp, TopicPartition) or not isinstance(tp.topic, str):
            raise writer.fail("partitions", f"{tp!r} is not a TopicPartition of a topic name")
        topics.setdefault(tp.topic, []).append(tp.partition)
    writer.int_("partitions", _NATURAL, len(topics))
    for topic in sorted(topics):
        where = f"partitions[{topic!r}]"
        writer.string(where, topic)
        numbers = topics[topic]
        for number in numbers:
            # Checked before sorting: a non-int cannot be compared.
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise writer.fail(where, f"partition {number!r} is not an int >= 0")
        writer.int_(where, _NATURAL, len(numbers))
        for number in sorted(numbers):
            writer.int_(where, _NATURAL, number)
    for name, kind in _AFTER_PARTITIONS:
        writer.int_(name, kind, getattr(value, name))
    return bytes(writer.out)


def encode(record: TxnRecord) -> tuple[bytes, bytes | None]:
    """The record's key and value bytes (``None`` for a tombstone)."""
    key = encode_key(record.key)
    return key, None if record.value is None else encode_value(record.value)


# -- decoding -----------------------------------------------------------------


def _version(reader: Reader, known: int) -> None:
    version = reader.fixed("version", INT16)
    if version != known:
        raise reader.fail("version", f"unknown version {version} (known: {known})", 0)


def decode_value(data: bytes) -> TransactionLogValue:
    where = "transaction log value"
    reader = Reader(TxnRecordError, as_bytes(data, TxnRecordError, where), where)
    _version(reader, VALUE_VERSION)
    fields: dict[str, object] = {}
    for name, kind in _BEFORE_PARTITIONS:
        fields[name] = reader.int_(name, kind)
    at = reader.pos
    raw_state = reader.fixed("state", INT8)
    try:
        fields["state"] = TransactionState(raw_state)
    except ValueError:
        known = ", ".join(f"{s.value} {s.name}" for s in TransactionState)
        raise reader.fail("state", f"{raw_state} is not a TransactionState ({known})", at) from None
    partitions: list[TopicPartition] = []
    previous_topic: str | None = None
    # A topic is at least its empty name, a count and one partition.
    for _ in range(reader.count("partitions", _NATURAL, 2 + 4 + 4)):
        at = reader.pos
        topic = reader.text("partitions[topic]")
        if previous_topic is not None and topic <= previous_topic:
            raise reader.fail("partitions", f"topic {topic!r} is not after {previous_topic!r}", at)
        previous_topic = topic
        where = f"partitions[{topic!r}]"
        at = reader.pos
        count = reader.count(where, _NATURAL, 4)
        if count == 0:
            raise reader.fail(where, "a topic with no partitions", at)
        previous = -1
        for _ in range(count):
            at = reader.pos
            number = reader.int_(where, _NATURAL)
            if number <= previous:
                raise reader.fail(where, f"partition {number} is not after {previous}", at)
            previous = number
            partitions.append(TopicPartition(topic, number))
    fields["partitions"] = frozenset(partitions)
    for name, kind in _AFTER_PARTITIONS:
        fields[name] = reader.int_(name, kind)
    reader.end()
    return TransactionLogValue(**fields)  # type: ignore[arg-type]


def decode_key(data: bytes) -> TransactionLogKey:
    where = "transaction log key"
    reader = Reader(TxnRecordError, as_bytes(data, TxnRecordError, where), where)
    _version(reader, KEY_VERSION)
    key = TransactionLogKey(reader.text("transactional_id"))
    reader.end()
    return key


def decode(key: bytes, value: bytes | None) -> TxnRecord:
    """The record of a key's and value's bytes (``value`` ``None`` for a
    tombstone).  Raises :class:`TxnRecordError` for anything :func:`encode`
    would not have written."""
    decoded_key = decode_key(key)
    return TxnRecord(decoded_key, None if value is None else decode_value(value))

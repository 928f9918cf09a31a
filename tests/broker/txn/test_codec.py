"""The bytes of the transaction log's records (broker/txn/codec.py): keys
and values round-trip and are deterministic (compaction compares key
bytes), and bad bytes or bad records raise TxnRecordError naming the field
and offset, never another exception."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.txn.codec import (
    KEY_VERSION,
    VALUE_VERSION,
    TxnRecordError,
    decode,
    encode,
    encode_key,
    encode_value,
)
from broker.txn.records import TransactionLogKey, TransactionLogValue, TxnRecord
from broker.txn.types import TopicPartition, TransactionState

INT16_MAX = 2**15 - 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

VALUE = TransactionLogValue(
    producer_id=7,
    previous_producer_id=-1,
    next_producer_id=-1,
    producer_epoch=3,
    last_producer_epoch=2,
    timeout_ms=60_000,
    state=TransactionState.ONGOING,
    partitions=frozenset({TopicPartition("b", 2), TopicPartition("a", 1), TopicPartition("b", 0)}),
    last_update_ms=10,
    start_ms=5,
    client_transaction_version=2,
)
KEY = TransactionLogKey("txn-1")

partitions = st.frozensets(
    st.builds(TopicPartition, st.text(max_size=8), st.integers(0, INT32_MAX)), max_size=12
)
values = st.builds(
    TransactionLogValue,
    producer_id=st.integers(-1, INT64_MAX),
    previous_producer_id=st.integers(-1, INT64_MAX),
    next_producer_id=st.integers(-1, INT64_MAX),
    producer_epoch=st.integers(-1, INT16_MAX),
    last_producer_epoch=st.integers(-1, INT16_MAX),
    timeout_ms=st.integers(0, INT32_MAX),
    state=st.sampled_from(TransactionState),
    partitions=partitions,
    last_update_ms=st.integers(-1, INT64_MAX),
    start_ms=st.integers(-1, INT64_MAX),
    client_transaction_version=st.integers(0, INT16_MAX),
)
records = st.builds(
    TxnRecord, st.builds(TransactionLogKey, st.text(max_size=20)), st.none() | values
)


@given(records)
def test_round_trip(record: TxnRecord) -> None:
    key, value = encode(record)
    assert decode(key, value) == record
    # Deterministic: the same record, the same bytes.
    assert encode(decode(key, value)) == (key, value)


@given(st.binary(max_size=80), st.none() | st.binary(max_size=120))
def test_any_bytes_decode_or_raise_the_codec_error(key: bytes, value: bytes | None) -> None:
    try:
        record = decode(key, value)
    except TxnRecordError:
        return
    # Whatever decodes re-encodes to the same bytes.
    assert encode(record) == (key, value)


def test_layout() -> None:
    key, value = encode(TxnRecord(KEY, VALUE))
    assert key == struct.pack(">hh", KEY_VERSION, 5) + b"txn-1"
    assert value is not None
    head = struct.pack(">hqqqhhib", VALUE_VERSION, 7, -1, -1, 3, 2, 60_000, 1)
    parts = (
        struct.pack(">ih", 2, 1)
        + b"a"
        + struct.pack(">ii", 1, 1)
        # Topics sorted, partitions sorted.
        + struct.pack(">h", 1)
        + b"b"
        + struct.pack(">iii", 2, 0, 2)
    )
    tail = struct.pack(">qqh", 10, 5, 2)
    assert value == head + parts + tail


def test_tombstone() -> None:
    assert encode(TxnRecord(KEY, None)) == (encode_key(KEY), None)
    assert decode(encode_key(KEY), None) == TxnRecord(KEY, None)


def _value_bytes() -> bytes:
    return encode_value(VALUE)


@pytest.mark.parametrize(
    ("data", "field", "offset"),
    [
        # A cut anywhere names the field being read.
        (lambda b: b[:20], "next_producer_id", 18),
        (lambda b: b[:-1], "client_transaction_version", 81),
        # An unknown version.
        (lambda b: struct.pack(">h", 9) + b[2:], "version", 0),
        # A state outside TransactionState (the byte after the timeout).
        (lambda b: b[:34] + struct.pack(">b", 8) + b[35:], "state", 34),
        # Partitions out of order.
        (
            lambda b: (
                b[:35] + struct.pack(">ih", 1, 1) + b"a" + struct.pack(">iii", 2, 3, 1) + b[-18:]
            ),
            "partitions['a']",
            50,
        ),
        # Topics out of order ("b" before "a").
        (
            lambda b: (
                b[:35]
                + struct.pack(">ih", 2, 1)
                + b"b"
                + struct.pack(">ii", 1, 0)
                + struct.pack(">h", 1)
                + b"a"
                + struct.pack(">ii", 1, 0)
                + b[-18:]
            ),
            "partitions",
            50,
        ),
        # A topic with no partitions.
        (
            lambda b: b[:35] + struct.pack(">ih", 1, 1) + b"a" + struct.pack(">i", 0) + b[-18:],
            "partitions['a']",
            42,
        ),
        # A producer epoch below -1.
        (lambda b: b[:26] + struct.pack(">h", -2) + b[28:], "producer_epoch", 26),
        # A count larger than the bytes left.
        (lambda b: b[:35] + struct.pack(">i", 1000) + b[39:], "partitions", 35),
    ],
)
def test_bad_value_names_field_and_offset(data: object, field: str, offset: int) -> None:
    assert callable(data)
    with pytest.raises(TxnRecordError) as caught:
        decode(encode_key(KEY), data(_value_bytes()))
    message = str(caught.value)
    assert f"field {field!r}" in message and f"at byte {offset}" in message, message


def test_trailing_bytes() -> None:
    with pytest.raises(TxnRecordError, match="2 trailing bytes at byte 83"):
        decode(encode_key(KEY), _value_bytes() + b"xx")
    with pytest.raises(TxnRecordError, match="key: 1 trailing bytes"):
        decode(encode_key(KEY) + b"x", None)


def test_bad_key() -> None:
    with pytest.raises(TxnRecordError, match=r"field 'version': unknown version 1 .* at byte 0"):
        decode(struct.pack(">hh", 1, 0), None)
    with pytest.raises(TxnRecordError, match=r"'transactional_id': invalid UTF-8 .* at byte 4"):
        decode(struct.pack(">hh", 0, 1) + b"\xff", None)
    with pytest.raises(TxnRecordError, match="str is not bytes"):
        decode("key", None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"producer_epoch": INT16_MAX + 1}, "producer_epoch"),
        ({"producer_id": -2}, "producer_id"),
        ({"timeout_ms": True}, "timeout_ms"),
        ({"state": 3}, "state"),
        ({"partitions": frozenset({TopicPartition("t", -1)})}, "partitions['t']"),
        ({"partitions": [TopicPartition("t", 1)]}, "partitions"),
    ],
)
def test_bad_value_is_refused_on_encoding(change: dict[str, object], field: str) -> None:
    import dataclasses

    bad = dataclasses.replace(VALUE, **change)  # type: ignore[arg-type]
    with pytest.raises(TxnRecordError, match=re.escape(f"field {field!r}")):
        encode_value(bad)

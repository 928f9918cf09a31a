"""The records inside a v2 record batch (Kafka's ``DefaultRecord.java``).

A record is::

    Length varint | Attributes int8 | TimestampDelta varlong | OffsetDelta varint |
    KeyLength varint | Key | ValueLength varint | Value | HeadersCount varint |
    [HeaderKeyLength varint | HeaderKey | HeaderValueLength varint | HeaderValue]...

Varints are zigzag-encoded base-128 as Kafka's ``ByteUtils.writeVarint`` /
``writeVarlong``: at most 5 bytes for an int32, 10 for an int64.  A length of
-1 is null (a null value is a tombstone); header keys are UTF-8 strings and
never null.  Brokers move batches as opaque bytes: these functions serve
compaction, timestamps, consumers and tools.

Malformed bytes raise :class:`~partition_log.errors.PartitionLogError` with
``CORRUPT_MESSAGE`` naming the record, the field and its position, never an
``IndexError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import partition_log.speedups as speedups
from partition_log.errors import Errors, PartitionLogError

__all__ = [
    "Header",
    "Record",
    "check_records_section",
    "decode_varint",
    "decode_records_section",
    "encode_records_section",
    "encode_varint",
]

# The compiled record walk, or None for the Python one (partition_log/speedups.py).
_compiled_records_fit = speedups.records_fit

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: A record header: a UTF-8 key and a value that may be null (Kafka's ``Header``).
Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch, with its absolute offset and timestamp (Kafka's
    ``Record``: ``offset()`` is the batch's base offset plus the record's offset
    delta, ``timestamp()`` its base timestamp plus the timestamp delta, or the
    batch's max timestamp under ``LOG_APPEND_TIME``)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()

    @property
    def is_tombstone(self) -> bool:
        """A null value deletes its key under compaction (design.html §4.8)."""
        return self.value is None


class _Malformed(Exception):
    """Raised inside the decoder; the caller adds which record and where."""


# -- varints (ByteUtils) ------------------------------------------------------

# Encodings of every zigzag value below 2**14 (one or two bytes): the lengths,
# offset deltas and timestamp deltas of typical records, without a loop.
_SMALL_VARINTS: tuple[bytes, ...] = tuple(
    bytes((z,)) if z < 0x80 else bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(1 << 14)
)


def encode_varint(value: int) -> bytes:
    """Zigzag base-128 encoding of a signed integer (``ByteUtils.writeVarlong``;
    for an int32 the same bytes as ``writeVarint``)."""
    z = (value << 1) ^ (value >> 63)
    if z < 0x4000:
        return _SMALL_VARINTS[z]
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def decode_varint(
    data: bytes | bytearray | memoryview, pos: int, end: int, max_bytes: int = 5
) -> tuple[int, int]:
    """The signed integer whose zigzag varint starts at ``data[pos]`` and the
    position after it.  ``max_bytes`` is 5 for a varint, 10 for a varlong, as
    ``ByteUtils.readVarint``/``readVarlong`` refuse longer ones."""
    if pos >= end:
        raise _Malformed(f"a varint at position {pos} runs past the end")
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    if pos + 1 < end and data[pos + 1] < 0x80:  # two bytes: values up to 8191
        z = (b & 0x7F) | (data[pos + 1] << 7)
        return (z >> 1) ^ -(z & 1), pos + 2
    z = b & 0x7F
    shift = 7
    i = pos + 1
    while True:
        if i >= end:
            raise _Malformed(f"a varint at position {pos} runs past the end")
        if i - pos >= max_bytes:
            raise _Malformed(f"a varint at position {pos} is longer than {max_bytes} bytes")
        b = data[i]
        z |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    value = (z >> 1) ^ -(z & 1)
    return value, i


# -- records section ----------------------------------------------------------


def _bad_bytes(index: int, field: str, value: object) -> PartitionLogError:
    return PartitionLogError(
        Errors.INVALID_RECORD,
        f"record {index}: a record's {field} must be bytes or None, not {type(value)!r}",
    )


def _encode_headers(index: int, headers: tuple[Header, ...]) -> bytes:
    parts = [encode_varint(len(headers))]
    for header in headers:
        key, value = header
        if not isinstance(key, str):
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"record {index}: a header key must be a str, not {type(key)!r}",
            )
        raw_key = key.encode("utf-8")
        parts.append(encode_varint(len(raw_key)))
        parts.append(raw_key)
        if value is None:
            parts.append(b"\x01")
        elif isinstance(value, bytes):
            parts.append(encode_varint(len(value)))
            parts.append(value)
        else:
            raise _bad_bytes(index, "header value", value)
    return b"".join(parts)


def encode_records_section(
    records: Sequence[Record], base_offset: int, base_timestamp: int
) -> bytes:
    """The records, each with its deltas from ``base_offset`` and
    ``base_timestamp``, concatenated as a batch holds them (uncompressed).

    Offsets must increase and their deltas fit an int32; the caller checks the
    batch-level fields.  Speed: one list of parts joined once, so a key or
    value is copied only into the result, and one- or two-byte varints come
    from a table."""
    small = _SMALL_VARINTS
    varint = encode_varint
    parts: list[bytes] = []
    append = parts.append
    previous = base_offset - 1
    for index, record in enumerate(records):
        offset = record.offset
        offset_delta = offset - base_offset
        if offset <= previous or offset_delta > INT32_MAX:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"record {index} has offset {offset}: offsets must increase from the "
                f"base offset {base_offset} and stay within {INT32_MAX} of it "
                f"(previous {previous})",
            )
        previous = offset
        timestamp_delta = record.timestamp - base_timestamp
        if not INT64_MIN <= timestamp_delta <= INT64_MAX:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"record {index} has timestamp {record.timestamp}, out of range of the base "
                f"timestamp {base_timestamp}",
            )
        # Record attributes (unused, 0) and the two deltas.
        head = b"\x00" + varint(timestamp_delta) + varint(offset_delta)
        size = len(head)
        key = record.key
        if key is None:
            key_size = b"\x01"  # zigzag(-1): null
            key = b""
        elif isinstance(key, bytes):
            n = len(key)
            key_size = small[n << 1] if n < 0x2000 else varint(n)
            size += n
        else:
            raise _bad_bytes(index, "key", key)
        value = record.value
        if value is None:
            value_size = b"\x01"
            value = b""
        elif isinstance(value, bytes):
            n = len(value)
            value_size = small[n << 1] if n < 0x2000 else varint(n)
            size += n
        else:
            raise _bad_bytes(index, "value", value)
        headers = _encode_headers(index, record.headers) if record.headers else b"\x00"
        size += len(key_size) + len(value_size) + len(headers)
        append(small[size << 1] if size < 0x2000 else varint(size))
        append(head)
        append(key_size)
        append(key)
        append(value_size)
        append(value)
        append(headers)
    return b"".join(parts)


def decode_records_section(
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp: int,
    last_offset_delta: int,
    log_append_time: int | None = None,
) -> tuple[Record, ...]:
    """Decode ``count`` records that fill ``data`` exactly.

    Checks each record's length against its fields, that offset deltas
    increase within ``[0, last_offset_delta]`` (compaction may remove records,
    so they need not be dense), and that no bytes remain after the last
    record.  ``log_append_time`` replaces every record's timestamp
    (``LOG_APPEND_TIME`` batches, ``DefaultRecordBatch.iterator``)."""
    records: list[Record] = []
    append = records.append
    pos = 0
    end = len(data)
    previous_delta = -1
    index = 0
    # Speed: the common one-byte varints are read inline (a byte below 0x80),
    # the rest by decode_varint; every read is bounded by the record's end.
    try:
        for index in range(count):
            if pos >= end:
                raise _Malformed(f"the records section ends after {index} records")
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = decode_varint(data, pos, end)
            if length < 0 or length > end - pos:
                raise _Malformed(
                    f"its length {length} at position {pos} does not fit the {end - pos} bytes left"
                )
            record_end = pos + length
            if pos >= record_end:
                raise _Malformed("it has no attributes byte")
            pos += 1  # attributes: unused
            if pos < record_end and data[pos] < 0x80:
                b = data[pos]
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                timestamp_delta, pos = decode_varint(data, pos, record_end, 10)
            if pos < record_end and data[pos] < 0x80:
                b = data[pos]
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = decode_varint(data, pos, record_end)
            if offset_delta <= previous_delta or offset_delta > last_offset_delta:
                raise _Malformed(
                    f"offset delta {offset_delta} after {previous_delta}: expected an increasing "
                    f"delta of at most the last offset delta {last_offset_delta}"
                )
            previous_delta = offset_delta
            key, pos = _decode_bytes("key", data, pos, record_end)
            value, pos = _decode_bytes("value", data, pos, record_end)
            if pos < record_end and data[pos] == 0:
                headers: tuple[Header, ...] = ()
                pos += 1
            else:
                headers, pos = _decode_headers(data, pos, record_end)
            if pos != record_end:
                raise _Malformed(
                    f"its length says {length} bytes but its fields take "
                    f"{length + pos - record_end}"
                )
            append(
                Record(
                    base_offset + offset_delta,
                    base_timestamp + timestamp_delta
                    if log_append_time is None
                    else log_append_time,
                    key,
                    value,
                    headers,
                )
            )
    except _Malformed as problem:
        raise PartitionLogError(
            Errors.CORRUPT_MESSAGE,
            f"batch at base offset {base_offset}: record {index} of {count} is malformed: "
            f"{problem}",
        ) from None
    if pos != end:
        raise PartitionLogError(
            Errors.CORRUPT_MESSAGE,
            f"batch at base offset {base_offset}: {end - pos} bytes remain after its "
            f"{count} records (record count {count} is wrong or the records are damaged)",
        )
    return tuple(records)


def check_records_section(
    data: bytes | bytearray | memoryview,
    count: int,
    base_offset: int,
    base_timestamp: int,
    last_offset_delta: int,
) -> None:
    """Accept exactly what :func:`decode_records_section` accepts, without
    building the records: a leader checks every record of a batch it appends
    (``LogValidator``'s record iteration) and keeps none of them.

    Speed: the walk below only reads varints and skips keys and values
    (no ``Record``, no slices of the data); whenever it meets what it does
    not handle inline (headers) or anything wrong, the decoder runs and
    raises its own error naming the record, so both give the same answers
    and messages.

    ``data`` may be any bytes-like object (a view of an uncompressed batch,
    not a copy of its records).  The walk is compiled when
    ``partition_log/_speedups.c`` is built (:mod:`partition_log.speedups`),
    accepting exactly what the decoder accepts (headers included, which the
    Python walk leaves to the decoder); a refusal still comes from the
    decoder, so the messages are the same."""
    fit = _compiled_records_fit
    if fit is not None:
        if fit(data, count, last_offset_delta):
            return
    elif _records_fit(data, count, last_offset_delta):
        return
    decode_records_section(
        data if isinstance(data, bytes) else bytes(data),
        count,
        base_offset,
        base_timestamp,
        last_offset_delta,
    )


def _records_fit(data: bytes | bytearray | memoryview, count: int, last_offset_delta: int) -> bool:
    """Whether the records are well formed as the decoder checks them, for
    records without headers; ``False`` means "ask the decoder" (a record with
    headers, or damage).

    Speed: one- and two-byte varints (every length below 8 KiB and most
    deltas) are read inline, a call per field costing more than the rest of
    the walk; and a field is not checked against its record's end as it is
    read: positions only grow, so a field running past the end leaves the
    position past it, which the check that the record ends right after its
    (empty) headers refuses, and a read past the whole section raises
    IndexError, refused too."""
    varint = decode_varint
    pos = 0
    end = len(data)
    previous_delta = -1
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = varint(data, pos, end)
            if length < 3 or length > end - pos:
                # Under 3 bytes (attributes, two deltas) only the decoder
                # knows which field is missing.
                return False
            record_end = pos + length
            # Attributes (unused), then the timestamp delta, which has no
            # constraint: only its bytes are skipped.
            pos += 1
            if data[pos] < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                pos += 2
            else:
                _, pos = varint(data, pos, end, 10)
            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                offset_delta = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                offset_delta, pos = varint(data, pos, end)
            if offset_delta <= previous_delta or offset_delta > last_offset_delta:
                return False
            previous_delta = offset_delta
            # The key, then the value: a length (-1 for null) and its bytes.
            b = data[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                size = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                size, pos = varint(data, pos, end)
            if size > 0:
                pos += size
            elif size < -1:
                return False
            b = data[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                z = (b & 0x7F) | (data[pos + 1] << 7)
                size = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                size, pos = varint(data, pos, end)
            if size > 0:
                pos += size
            elif size < -1:
                return False
            # No headers (a count of zero) ending the record exactly.
            if pos + 1 != record_end or data[pos]:
                return False
            pos = record_end
    except (_Malformed, IndexError):
        return False
    return pos == end


def _decode_bytes(field: str, data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos < end and data[pos] < 0x80:
        b = data[pos]
        size = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        size, pos = decode_varint(data, pos, end)
    if size == -1:
        return None, pos
    if size < -1 or size > end - pos:
        raise _Malformed(
            f"{field} length {size} at position {pos} does not fit the {end - pos} bytes "
            "left of the record"
        )
    return data[pos : pos + size], pos + size


def _decode_headers(data: bytes, pos: int, end: int) -> tuple[tuple[Header, ...], int]:
    header_count, pos = decode_varint(data, pos, end)
    if header_count < 0:
        raise _Malformed(f"header count {header_count}")
    headers: list[Header] = []
    for _ in range(header_count):
        key_size, pos = decode_varint(data, pos, end)
        if key_size < 0 or key_size > end - pos:
            raise _Malformed(
                f"header key length {key_size} at position {pos} does not fit the "
                f"{end - pos} bytes left of the record"
            )
        try:
            header_key = data[pos : pos + key_size].decode("utf-8")
        except UnicodeDecodeError as error:
            raise _Malformed(f"header key at position {pos} is not UTF-8") from error
        pos += key_size
        header_value, pos = _decode_bytes("header value", data, pos, end)
        headers.append((header_key, header_value))
    return tuple(headers), pos

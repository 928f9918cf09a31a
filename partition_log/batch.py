"""Kafka's v2 record batch, byte for byte (``DefaultRecordBatch.java``, magic 2).

The 61-byte header (big-endian)::

    offset size field
         0    8 BaseOffset            int64
         8    4 Length                int32  bytes after this field
        12    4 PartitionLeaderEpoch  int32  outside the CRC
        16    1 Magic                 int8   = 2
        17    4 CRC                   uint32 CRC-32C of bytes 21 to the end
        21    2 Attributes            int16
        23    4 LastOffsetDelta       int32
        27    8 BaseTimestamp         int64
        35    8 MaxTimestamp          int64
        43    8 ProducerId            int64
        51    2 ProducerEpoch         int16
        53    4 BaseSequence          int32
        57    4 RecordsCount          int32
        61      Records (partition_log/records.py), compressed as a whole

The base offset and the partition leader epoch lie outside the CRC, so a
leader assigns offsets and stamps its epoch on every batch it appends without
recomputing it (:func:`set_base_offset`, :func:`set_leader_epoch`).  Brokers
move batches as these bytes; :func:`decode_records` is for compaction,
timestamps, consumers and tools.

Every malformed batch raises :class:`~partition_log.errors.PartitionLogError`
(``CORRUPT_MESSAGE``) naming the field, the batch's base offset and the
expected and actual values.  Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from crc32c import crc32c

from partition_log.errors import Errors, PartitionLogError
from partition_log.records import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    Record,
    check_records_section,
    decode_records_section,
    encode_records_section,
)

# LZ4 frames as Kafka's KafkaLZ4BlockOutputStream writes them, and zstd frames:
# dependencies of kq, refused clearly (UNSUPPORTED_COMPRESSION_TYPE) without them.
try:
    import lz4.frame as _lz4

    HAVE_LZ4 = True
except ImportError:  # pragma: no cover - depends on the installation
    HAVE_LZ4 = False
try:
    import zstandard as _zstd

    HAVE_ZSTD = True
except ImportError:  # pragma: no cover - depends on the installation
    HAVE_ZSTD = False
# Raw snappy blocks (cramjam), in xerial's framing as Kafka's snappy-java
# writes them (see _snappy_compress).
try:
    from cramjam import DecompressionError as _SnappyError
    from cramjam import snappy as _snappy

    HAVE_SNAPPY = True
except ImportError:  # pragma: no cover - depends on the installation
    HAVE_SNAPPY = False

__all__ = [
    "DEFAULT_MAX_RECORDS_BYTES",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "BatchHeader",
    "BatchScanner",
    "Compression",
    "ScanEnd",
    "ScannedBatch",
    "TimestampType",
    "build_batch",
    "first_transactional_producer",
    "recompressed",
    "decode_records",
    "records_section",
    "set_base_offset",
    "set_leader_epoch",
    "control_batch_bytes",
    "split_batches",
    "verify",
]

MAGIC = 2
HEADER_SIZE = 61  # RECORD_BATCH_OVERHEAD
LOG_OVERHEAD = 12  # BaseOffset and Length: the bytes Length does not count
# The smallest Length a batch can have: its header without the first 12 bytes.
MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD
# The first bytes of a batch up to its magic (Records.HEADER_SIZE_UP_TO_MAGIC):
# fewer left at the end of a buffer are a truncated tail.
HEADER_SIZE_UP_TO_MAGIC = 17

NO_PARTITION_LEADER_EPOCH = -1  # RecordBatch.NO_PARTITION_LEADER_EPOCH
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qiibI")  # BaseOffset .. CRC: the part outside the CRC
_CRC_COVERED = struct.Struct(">hiqqqhii")  # Attributes .. RecordsCount
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
assert _HEADER.size == HEADER_SIZE
_new_tuple = tuple.__new__
_HEADER_UNPACK = _HEADER.unpack_from

_BASE_OFFSET_AT = 0
_LENGTH_AT = 8
_EPOCH_AT = 12
_MAGIC_AT = 16
_CRC_AT = 17
_ATTRIBUTES_AT = 21

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40


class Compression(enum.IntEnum):
    """Attribute bits 0-2 (Kafka's ``CompressionType`` ids)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    """Attribute bit 3: the producer's timestamps, or the leader's clock at
    append (``LOG_APPEND_TIME``: every record's timestamp is the batch's max
    timestamp)."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


def _corrupt(message: str) -> PartitionLogError:
    return PartitionLogError(Errors.CORRUPT_MESSAGE, message)


class BatchHeader(NamedTuple):
    """The 61-byte header of a batch, every field as stored.

    A named tuple rather than the frozen dataclass the package uses
    elsewhere: one is built per batch on every scan (recovery, reads by
    offset, the epoch cache and producer state rebuilds), and a tuple is
    built in C from ``struct.unpack_from`` in a quarter of the time a frozen
    dataclass's ``__init__`` takes."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @classmethod
    def parse(cls, buffer: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
        """The header at ``position``, read with one ``struct.unpack_from``;
        checks only that the buffer holds it (see :func:`verify`)."""
        if position < 0 or len(buffer) - position < HEADER_SIZE:
            raise _corrupt(
                f"a batch header takes {HEADER_SIZE} bytes, only "
                f"{max(0, len(buffer) - position)} at position {position}"
            )
        return _new_tuple(cls, _HEADER.unpack_from(buffer, position))

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        """Raises ``CORRUPT_MESSAGE`` for ids 5-7, which no codec has."""
        code = self.attributes & COMPRESSION_MASK
        try:
            return Compression(code)
        except ValueError:
            raise _corrupt(
                f"batch at base offset {self.base_offset}: attributes 0x{self.attributes:04x} "
                f"name compression id {code}, which is none of Kafka's (0-4)"
            ) from None

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & TIMESTAMP_TYPE_FLAG else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When set, compaction stored the tombstones' delete horizon in the base
        timestamp (KIP-534, ``DefaultRecordBatch.deleteHorizonMs``)."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

    @property
    def last_sequence(self) -> int:
        """The sequence of the batch's last offset, wrapping past int32 as
        ``DefaultRecordBatch.incrementSequence`` does; -1 without a producer."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (INT32_MAX + 1)


# -- compression (the records section only, as Kafka's) -----------------------


def _unsupported(compression: Compression, why: str) -> PartitionLogError:
    return PartitionLogError(
        Errors.UNSUPPORTED_COMPRESSION_TYPE, f"compression {compression.name}: {why}"
    )


def _compress(compression: Compression, data: bytes) -> bytes:
    if compression is Compression.NONE:
        return data
    if compression is Compression.GZIP:
        # GZIPOutputStream's format (gzip wrapper, wbits 31), level 6 as Deflater's default.
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        return compressor.compress(data) + compressor.flush()
    if compression is Compression.LZ4:
        if not HAVE_LZ4:
            raise _unsupported(compression, "the lz4 package is not installed")
        # KafkaLZ4BlockOutputStream: 64 KiB independent blocks, no block or
        # content checksum, no content size (its reader decodes each block alone).
        return bytes(
            _lz4.compress(
                data,
                block_size=_lz4.BLOCKSIZE_MAX64KB,
                block_linked=False,
                content_checksum=False,
                store_size=False,
            )
        )
    if compression is Compression.ZSTD:
        if not HAVE_ZSTD:
            raise _unsupported(compression, "the zstandard package is not installed")
        return _zstd.ZstdCompressor(level=3).compress(data)  # zstd-jni's default level
    if compression is Compression.SNAPPY:
        return _snappy_compress(data)
    raise _unsupported(compression, "no such codec")


# snappy-java's SnappyOutputStream, which Kafka's producer and broker write
# snappy batches with: xerial's header (magic, version 1, compatible version
# 1), then blocks of at most 32 KiB of input, each a big-endian int32 length
# and a raw snappy block.  SnappyInputStream reads a section without the
# magic as one raw block, and so does kq.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024


def _snappy_compress(data: bytes) -> bytes:
    if not HAVE_SNAPPY:
        raise _unsupported(Compression.SNAPPY, "the cramjam package is not installed")
    parts = [_XERIAL_HEADER]
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = bytes(_snappy.compress_raw(data[start : start + _XERIAL_BLOCK]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_length(block: bytes, where: str) -> int:
    """The uncompressed length a raw snappy block starts with (a
    little-endian base-128 varint of at most 32 bits), read before the block
    is decompressed so that a decompression bomb is refused first."""
    value = 0
    for i, byte in enumerate(block[:5]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value <= 0xFFFFFFFF:
                return value
            break
    raise _corrupt(f"{where}: a snappy block's length is malformed or cut short")


def _snappy_decompress(data: bytes, where: str, limit: int) -> bytes:
    if not HAVE_SNAPPY:
        raise _unsupported(Compression.SNAPPY, "the cramjam package is not installed")
    if data[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        blocks = [data]
    else:
        if len(data) < len(_XERIAL_HEADER):
            raise _corrupt(f"{where}: the xerial snappy header is cut short")
        blocks = []
        position = len(_XERIAL_HEADER)
        while position < len(data):
            if position + 4 > len(data):
                raise _corrupt(f"{where}: a snappy block's length at {position} is cut short")
            (size,) = _INT32.unpack_from(data, position)
            position += 4
            if size < 0 or position + size > len(data):
                raise _corrupt(
                    f"{where}: a snappy block of {size} bytes at {position} does not fit the "
                    f"{len(data)} bytes of the section"
                )
            blocks.append(data[position : position + size])
            position += size
    parts: list[bytes] = []
    total = 0
    for block in blocks:
        total += _snappy_length(block, where)
        if total > limit:
            raise _too_large(where, limit)
        try:
            parts.append(bytes(_snappy.decompress_raw(block)))
        except _SnappyError as error:
            raise _corrupt(f"{where} do not decompress: {error}") from None
    return b"".join(parts)


# Decompressed records sections larger than this are refused: a guard against
# a small batch that expands without bound (a decompression bomb), not a
# Kafka limit (Kafka streams records out of the codec).  Callers may pass
# their own.
DEFAULT_MAX_RECORDS_BYTES = 1 << 28
# zstd's decompressobj takes no output limit: it is fed this much at a time,
# so it overshoots the limit by at most what one step can expand to (zstd
# blocks of at most 128 KiB from a few bytes each: tens of MiB).
_ZSTD_STEP = 1024


def _too_large(where: str, limit: int) -> PartitionLogError:
    return PartitionLogError(
        Errors.MESSAGE_TOO_LARGE, f"{where} decompress to more than {limit} bytes"
    )


def _decompress(compression: Compression, data: bytes, base_offset: int, limit: int) -> bytes:
    if compression is Compression.NONE:
        return data
    where = f"batch at base offset {base_offset}: {compression.name} records"
    if compression is Compression.GZIP:
        gzip = zlib.decompressobj(31)
        try:
            out = gzip.decompress(data, limit + 1)
        except zlib.error as error:
            raise _corrupt(f"{where} do not decompress: {error}") from None
        if len(out) > limit:
            raise _too_large(where, limit)
        if not gzip.eof or gzip.unused_data:
            raise _corrupt(f"{where}: the gzip stream is cut short or followed by other bytes")
        return out
    if compression is Compression.LZ4:
        if not HAVE_LZ4:
            raise _unsupported(compression, "the lz4 package is not installed")
        frame = _lz4.LZ4FrameDecompressor()
        try:
            out = frame.decompress(data, max_length=limit + 1)
        except RuntimeError as error:
            raise _corrupt(f"{where} do not decompress: {error}") from None
        if len(out) > limit:
            raise _too_large(where, limit)
        if not frame.eof or frame.unused_data:
            raise _corrupt(f"{where}: the LZ4 frame is cut short or followed by other bytes")
        return bytes(out)
    if compression is Compression.ZSTD:
        if not HAVE_ZSTD:
            raise _unsupported(compression, "the zstandard package is not installed")
        # A stream decoder: a producer's frames need not carry their content size.
        stream = _zstd.ZstdDecompressor().decompressobj()
        parts: list[bytes] = []
        total = 0
        fed = 0  # bytes of data given to the decoder
        try:
            while fed < len(data) and not stream.eof:
                part = stream.decompress(data[fed : fed + _ZSTD_STEP])
                fed += _ZSTD_STEP
                total += len(part)
                if total > limit:
                    raise _too_large(where, limit)
                parts.append(part)
        except _zstd.ZstdError as error:
            raise _corrupt(f"{where} do not decompress: {error}") from None
        if not stream.eof or stream.unused_data or fed < len(data):
            raise _corrupt(f"{where}: the zstd frame is cut short or followed by other bytes")
        return b"".join(parts)
    if compression is Compression.SNAPPY:
        return _snappy_decompress(data, where, limit)
    raise _unsupported(compression, "no such codec")


# -- building -----------------------------------------------------------------


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise PartitionLogError(
            Errors.INVALID_RECORD, f"{name} {value!r} is outside its field's range [{low}, {high}]"
        )


_PRODUCER = struct.Struct(">qh")  # ProducerId, ProducerEpoch
_PRODUCER_AT = 43


def first_transactional_producer(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """The producer id and epoch of the first transactional data batch in
    ``data`` (concatenated batches), None if there is none.  For a produce
    path that must know before the append: it reads each batch's length and
    attributes only (no parse, no CRC), and stops at bytes that do not walk
    as batches, which the append then refuses with the reason."""
    view = memoryview(data)
    position, end = 0, len(view)
    while position + HEADER_SIZE <= end:
        attributes = _INT16.unpack_from(view, position + _ATTRIBUTES_AT)[0]
        if attributes & TRANSACTIONAL_FLAG and not attributes & CONTROL_FLAG:
            producer_id, epoch = _PRODUCER.unpack_from(view, position + _PRODUCER_AT)
            return producer_id, epoch
        length = _INT32.unpack_from(view, position + _LENGTH_AT)[0]
        if length <= 0:
            return None
        position += LOG_OVERHEAD + length
    return None


def recompressed(
    batch: bytes | bytearray | memoryview,
    compression: Compression,
    *,
    max_records_bytes: int = DEFAULT_MAX_RECORDS_BYTES,
) -> bytes:
    """A verified data batch with its records section in ``compression``
    instead of its own (a leader under a topic's ``compression.type``,
    ``LogValidator`` building the batch anew): every other field as it was,
    the codec bits, the length and the CRC made to match."""
    header = BatchHeader.parse(batch)
    view = memoryview(batch)
    section = _decompress(
        header.compression, bytes(view[HEADER_SIZE:]), header.base_offset, max_records_bytes
    )
    packed = _compress(compression, section)
    out = bytearray(view[:HEADER_SIZE])
    out += packed
    length = len(out) - LOG_OVERHEAD
    _check_range("batch length", length, MIN_LENGTH, INT32_MAX)
    _INT32.pack_into(out, _LENGTH_AT, length)
    attributes = (header.attributes & ~COMPRESSION_MASK) | Compression(compression)
    _INT16.pack_into(out, _ATTRIBUTES_AT, attributes)
    _UINT32.pack_into(out, _CRC_AT, crc32c(memoryview(out)[_ATTRIBUTES_AT:]))
    return bytes(out)


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    last_offset_delta: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """The bytes of a v2 batch holding ``records`` (their offsets absolute,
    increasing from ``base_offset``), as ``MemoryRecordsBuilder`` writes it.

    Defaults as Kafka's builder: the base timestamp is the first record's, the
    max timestamp the largest (required under ``LOG_APPEND_TIME``: the append
    time), the last offset delta the last record's (compaction passes the
    original, larger one; an empty batch must give it).  ``delete_horizon_ms``
    takes the base timestamp's place and sets attribute bit 6 (KIP-534)."""
    count = len(records)
    if delete_horizon_ms is not None:
        if base_timestamp is not None and base_timestamp != delete_horizon_ms:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"base timestamp {base_timestamp} and delete horizon {delete_horizon_ms}: "
                "the delete horizon is stored as the base timestamp",
            )
        base_timestamp = delete_horizon_ms
    if base_timestamp is None:
        base_timestamp = records[0].timestamp if count else NO_TIMESTAMP
    if max_timestamp is None:
        if timestamp_type is TimestampType.LOG_APPEND_TIME:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                "a LOG_APPEND_TIME batch needs its max timestamp (the append time)",
            )
        max_timestamp = max(r.timestamp for r in records) if count else NO_TIMESTAMP
    if last_offset_delta is None:
        if not count:
            raise PartitionLogError(
                Errors.INVALID_RECORD, "an empty batch needs its last offset delta"
            )
        last_offset_delta = records[-1].offset - base_offset
    elif count and last_offset_delta < records[-1].offset - base_offset:
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"last offset delta {last_offset_delta} is below the last record's "
            f"{records[-1].offset - base_offset}",
        )
    # The records first: their offsets explain a bad last offset delta best.
    _check_range("base offset", base_offset, INT64_MIN, INT64_MAX)
    _check_range("base timestamp", base_timestamp, INT64_MIN, INT64_MAX)
    records_section = encode_records_section(records, base_offset, base_timestamp)
    _check_range("partition leader epoch", partition_leader_epoch, INT32_MIN, INT32_MAX)
    _check_range("last offset delta", last_offset_delta, 0, INT32_MAX)
    _check_range("max timestamp", max_timestamp, INT64_MIN, INT64_MAX)
    _check_range("producer id", producer_id, INT64_MIN, INT64_MAX)
    _check_range("producer epoch", producer_epoch, -(1 << 15), (1 << 15) - 1)
    _check_range("base sequence", base_sequence, INT32_MIN, INT32_MAX)
    attributes = (
        Compression(compression)
        | (TIMESTAMP_TYPE_FLAG if timestamp_type is TimestampType.LOG_APPEND_TIME else 0)
        | (TRANSACTIONAL_FLAG if transactional else 0)
        | (CONTROL_FLAG if control else 0)
        | (DELETE_HORIZON_FLAG if delete_horizon_ms is not None else 0)
    )
    section = _compress(compression, records_section)
    covered = _CRC_COVERED.pack(
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    length = HEADER_SIZE - LOG_OVERHEAD + len(section)
    _check_range("batch length", length, MIN_LENGTH, INT32_MAX)
    crc = crc32c(section, crc32c(covered))
    prefix = _PREFIX.pack(base_offset, length, partition_leader_epoch, MAGIC, crc)
    return b"".join((prefix, covered, section))


# -- patching the fields outside the CRC --------------------------------------


def set_base_offset(batch: bytearray | memoryview, base_offset: int, position: int = 0) -> None:
    """Assign the batch at ``position`` its base offset in place; the CRC stays
    valid (the field is outside it), as a leader does on append."""
    _check_range("base offset", base_offset, INT64_MIN, INT64_MAX)
    _INT64.pack_into(batch, position + _BASE_OFFSET_AT, base_offset)


def set_leader_epoch(batch: bytearray | memoryview, epoch: int, position: int = 0) -> None:
    """Stamp the partition leader epoch of the batch at ``position`` in place;
    the CRC stays valid (DefaultRecordBatch: the field is outside it "to avoid
    the need to recompute the CRC")."""
    _check_range("partition leader epoch", epoch, INT32_MIN, INT32_MAX)
    _INT32.pack_into(batch, position + _EPOCH_AT, epoch)


# -- checking and decoding ----------------------------------------------------


def _check_fields(header: BatchHeader, where: str) -> None:
    """The header-level consistency every stored batch must have."""
    if header.records_count < 0:
        raise _corrupt(f"{where}: record count {header.records_count} is negative")
    if header.last_offset_delta < 0:
        raise _corrupt(f"{where}: last offset delta {header.last_offset_delta} is negative")
    if header.records_count > header.last_offset_delta + 1:
        raise _corrupt(
            f"{where}: record count {header.records_count} exceeds the "
            f"{header.last_offset_delta + 1} offsets its last offset delta "
            f"{header.last_offset_delta} spans"
        )
    if header.records_count * 7 > header.length - MIN_LENGTH and not header.attributes & 0x07:
        # An uncompressed record takes at least 7 bytes (length, attributes, two
        # deltas, null key, null value, no headers): a cheap bound on the count.
        raise _corrupt(
            f"{where}: record count {header.records_count} cannot fit in "
            f"{header.length - MIN_LENGTH} bytes of records"
        )


def _header_of(batch: bytes | bytearray | memoryview, check_crc: bool) -> BatchHeader:
    size = len(batch)
    if size < HEADER_SIZE:
        raise _corrupt(f"a batch of {size} bytes is shorter than the {HEADER_SIZE}-byte header")
    header = _new_tuple(BatchHeader, _HEADER_UNPACK(batch, 0))
    # Speed: the message naming the batch is built only for a refusal (this
    # runs on every leader append).
    if header.length != size - LOG_OVERHEAD:
        raise _corrupt(
            f"batch at base offset {header.base_offset}: length field {header.length}, "
            f"expected {size - LOG_OVERHEAD} (the {size}-byte batch less {LOG_OVERHEAD})"
        )
    if header.magic != MAGIC:
        raise _corrupt(
            f"batch at base offset {header.base_offset}: magic {header.magic}, expected {MAGIC}"
        )
    if check_crc:
        computed = crc32c(memoryview(batch)[_ATTRIBUTES_AT:])
        if computed != header.crc:
            raise _corrupt(
                f"batch at base offset {header.base_offset}: CRC stored 0x{header.crc:08x}, "
                f"computed 0x{computed:08x}"
            )
    count, delta = header.records_count, header.last_offset_delta
    if (
        count < 0
        or delta < 0
        or count > delta + 1
        or (count * 7 > header.length - MIN_LENGTH and not header.attributes & 0x07)
    ):
        _check_fields(header, f"batch at base offset {header.base_offset}")
    return header


def _records_of(
    batch: bytes | bytearray | memoryview, header: BatchHeader, limit: int
) -> tuple[Record, ...]:
    section = _decompress(header.compression, bytes(batch[HEADER_SIZE:]), header.base_offset, limit)
    return decode_records_section(
        section,
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        header.last_offset_delta,
        header.max_timestamp if header.attributes & TIMESTAMP_TYPE_FLAG else None,
    )


def decode_records(
    batch: bytes | bytearray | memoryview, *, max_records_bytes: int = DEFAULT_MAX_RECORDS_BYTES
) -> tuple[Record, ...]:
    """The records of one batch, decompressed, with absolute offsets and
    timestamps.  Checks the batch's structure but not its CRC (call
    :func:`verify` for bytes that came from outside).  A compressed section
    that expands past ``max_records_bytes`` is refused (``MESSAGE_TOO_LARGE``)."""
    return _records_of(batch, _header_of(batch, check_crc=False), max_records_bytes)


def records_section(
    batch: bytes | bytearray | memoryview, *, max_records_bytes: int = DEFAULT_MAX_RECORDS_BYTES
) -> bytes:
    """The records section of one batch, decompressed, undecoded: for
    compaction, which reads only each record's key and whether it has a
    value.  Checks the batch's structure as :func:`decode_records` does."""
    header = _header_of(batch, check_crc=False)
    return _decompress(
        header.compression, bytes(batch[HEADER_SIZE:]), header.base_offset, max_records_bytes
    )


def verify(
    batch: bytes | bytearray | memoryview,
    *,
    records: bool = True,
    max_records_bytes: int = DEFAULT_MAX_RECORDS_BYTES,
) -> BatchHeader:
    """Check one batch and return its header: the length field against the
    buffer, the magic, the CRC-32C over attributes..end, the record count and
    last offset delta against each other, and with ``records`` (decompressing
    them) the count and offset deltas against the records themselves
    (``DefaultRecordBatch.ensureValid`` and its iterator's checks)."""
    header = _header_of(batch, check_crc=True)
    if records:
        # The same checks as decoding, without building records nobody keeps;
        # an uncompressed section is checked where it lies, not copied.
        if header.attributes & COMPRESSION_MASK:
            section: bytes | memoryview = _decompress(
                header.compression,
                bytes(batch[HEADER_SIZE:]),
                header.base_offset,
                max_records_bytes,
            )
        else:
            section = memoryview(batch)[HEADER_SIZE:]
        check_records_section(
            section,
            header.records_count,
            header.base_offset,
            header.base_timestamp,
            header.last_offset_delta,
        )
    return header


# -- splitting a buffer of concatenated batches (a segment's bytes) -----------


class ScanEnd(enum.Enum):
    """Why a :class:`BatchScanner` stopped."""

    COMPLETE = "complete"  # the last batch ends where the buffer ends
    TRUNCATED = "truncated"  # the buffer ends inside a batch (a torn write)
    CORRUPT = "corrupt"  # a batch's length, magic, CRC or counts do not hold


class ScannedBatch(NamedTuple):
    """A whole, valid batch at ``position`` of the scanned buffer (a named
    tuple, as :class:`BatchHeader`, being one per batch scanned)."""

    position: int
    header: BatchHeader

    @property
    def end(self) -> int:
        return self.position + self.header.size


class BatchScanner:
    """Iterates the batches of a buffer of concatenated batches, as a segment
    file holds them (``FileLogInputStream.nextBatch`` with ``ensureValid``).

    It stops at the first batch that is not whole and valid.  Afterwards
    ``position`` is the first byte not part of a valid batch (where recovery
    cuts, ``LogSegment.recover``), ``end`` says why it stopped and ``error``
    names what was wrong and where (``None`` for a complete buffer).  A damaged
    length that points past the end of the buffer cannot be told from a torn
    tail; ``max_batch_bytes`` (``message.max.bytes``) makes a length above it
    corrupt instead.  Records are not decoded: only the header fields and the
    CRC over the rest are checked, which is what covers them."""

    def __init__(
        self,
        buffer: bytes | bytearray | memoryview,
        *,
        start: int = 0,
        check_crc: bool = True,
        max_batch_bytes: int | None = None,
    ) -> None:
        self._view = memoryview(buffer)
        self._check_crc = check_crc
        self._max = max_batch_bytes
        self.position = start
        self.end: ScanEnd | None = None
        self.error: PartitionLogError | None = None

    def __iter__(self) -> Iterator[ScannedBatch]:
        return self

    def _stop(self, end: ScanEnd, message: str | None) -> ScannedBatch:
        self.end = end
        self.error = None if message is None else _corrupt(message)
        raise StopIteration

    def __next__(self) -> ScannedBatch:
        if self.end is not None:
            raise StopIteration
        view = self._view
        pos = self.position
        left = len(view) - pos
        if left == 0:
            return self._stop(ScanEnd.COMPLETE, None)
        if left < HEADER_SIZE_UP_TO_MAGIC:
            return self._stop(
                ScanEnd.TRUNCATED,
                f"at position {pos}: the last {left} bytes are a partial batch header",
            )
        length = _INT32.unpack_from(view, pos + _LENGTH_AT)[0]
        if length < MIN_LENGTH:
            return self._stop(
                ScanEnd.CORRUPT,
                f"at position {pos}: length field {length} is below the minimum {MIN_LENGTH}",
            )
        size = length + LOG_OVERHEAD
        if self._max is not None and size > self._max:
            return self._stop(
                ScanEnd.CORRUPT,
                f"at position {pos}: a batch of {size} bytes exceeds the largest allowed, "
                f"{self._max}",
            )
        if size > left:
            return self._stop(
                ScanEnd.TRUNCATED,
                f"at position {pos}: a batch of {size} bytes but only {left} left "
                "(a partial batch)",
            )
        magic = view[pos + _MAGIC_AT]
        if magic != MAGIC:
            return self._stop(
                ScanEnd.CORRUPT, f"at position {pos}: magic {magic}, expected {MAGIC}"
            )
        # The buffer holds the whole header (size > left was refused above),
        # so it is unpacked without parse's bounds check; the message naming
        # the batch is built only for a refusal (this runs once per batch of
        # every scan).
        header = _new_tuple(BatchHeader, _HEADER_UNPACK(view, pos))
        if self._check_crc:
            computed = crc32c(view[pos + _ATTRIBUTES_AT : pos + size])
            if computed != header.crc:
                return self._stop(
                    ScanEnd.CORRUPT,
                    f"at position {pos}, batch at base offset {header.base_offset}: "
                    f"CRC stored 0x{header.crc:08x}, computed 0x{computed:08x}",
                )
        count, delta = header.records_count, header.last_offset_delta
        if (
            count < 0
            or delta < 0
            or count > delta + 1
            or (count * 7 > length - MIN_LENGTH and not header.attributes & 0x07)
        ):
            try:
                _check_fields(
                    header, f"at position {pos}, batch at base offset {header.base_offset}"
                )
            except PartitionLogError as error:
                return self._stop(ScanEnd.CORRUPT, str(error.args[0]))
        self.position = pos + size
        return _new_tuple(ScannedBatch, (pos, header))


def control_batch_bytes(
    buffer: bytes | bytearray | memoryview, position: int, header: BatchHeader
) -> bytes | None:
    """A copy of the batch at ``position`` of ``buffer`` (whose header is
    ``header``) if it is a control batch, whose transaction marker a reader
    of headers needs; None for any other batch, which costs no copy."""
    if not header.attributes & CONTROL_FLAG:
        return None
    return bytes(buffer[position : position + header.size])


def split_batches(buffer: bytes | bytearray | memoryview) -> list[memoryview]:
    """The batches of ``buffer`` as views of it; raises ``CORRUPT_MESSAGE``
    naming the position if any part of it is not a whole valid batch."""
    view = memoryview(buffer)
    scanner = BatchScanner(view)
    batches = [view[b.position : b.end] for b in scanner]
    if scanner.error is not None:
        raise scanner.error
    return batches

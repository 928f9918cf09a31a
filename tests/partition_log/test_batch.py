"""The v2 record batch, byte for byte (DefaultRecordBatch.java, DefaultRecord.java).

The known-answer batch is laid out here field by field from Kafka's format
with ``struct``, independently of the encoder.
"""

from __future__ import annotations

import gzip
import struct

import cramjam
import lz4.frame
import pytest
import zstandard
from crc32c import crc32c

import partition_log.batch as batch_module
from partition_log.batch import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    TimestampType,
    build_batch,
    decode_records,
    set_base_offset,
    set_leader_epoch,
    verify,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.records import Record, decode_varint, encode_varint

# -- helpers ------------------------------------------------------------------


def recrc(batch: bytearray) -> bytearray:
    """Give a patched batch a valid CRC again, so the check under test is the
    one that fires."""
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return batch


def with_records_section(
    section: bytes, count: int, last_offset_delta: int, attributes: int = 0
) -> bytes:
    """A batch with the given records section and a valid CRC and length."""
    covered = struct.pack(">hiqqqhii", attributes, last_offset_delta, 0, 0, -1, -1, -1, count)
    body = covered + section
    return struct.pack(">qiibI", 0, 49 + len(section), 0, 2, crc32c(body)) + body


def with_section(plain: bytes, section: bytes, compression: Compression) -> bytes:
    """``plain``'s header over another records section (compressed by another
    writer), with the length, attributes and CRC made to match."""
    batch = bytearray(plain[:HEADER_SIZE] + section)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, compression)
    return bytes(recrc(batch))


def corrupt(batch: bytes | bytearray, *, records: bool = True) -> str:
    with pytest.raises(PartitionLogError) as caught:
        verify(bytes(batch), records=records)
    assert caught.value.code is Errors.CORRUPT_MESSAGE, caught.value
    return str(caught.value)


# -- known answers --------------------------------------------------------------


def test_crc_is_castagnoli() -> None:
    # The CRC-32C check value (RFC 3720 B.4): not zlib's CRC-32.
    assert crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        # Kafka's ByteUtilsTest.testVarintSerde / testVarlongSerde.
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (-65, b"\x81\x01"),
        (8191, b"\xfe\x7f"),
        (-8192, b"\xff\x7f"),
        (8192, b"\x80\x80\x01"),
        (-8193, b"\x81\x80\x01"),
        (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
        (-(2**31), b"\xff\xff\xff\xff\x0f"),
        (2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (-(2**63), b"\xff" * 9 + b"\x01"),
    ],
)
def test_varints_are_kafkas(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0, len(encoded), 10) == (value, len(encoded))


def known_batch() -> bytes:
    """Two records laid out by hand from the format: a keyed record with a
    header, then a tombstone with a null key 300 ms later."""
    record0 = (
        b"\x00"  # attributes
        + b"\x00"  # timestamp delta 0
        + b"\x00"  # offset delta 0
        + b"\x02k"  # key length 1 (zigzag 2), key
        + b"\x04v1"  # value length 2, value
        + b"\x02"  # one header
        + b"\x02h"  # header key length 1, "h"
        + b"\x02x"  # header value length 1, "x"
    )
    record1 = (
        b"\x00"
        + b"\xd8\x04"  # timestamp delta 300: zigzag 600 = 0x258
        + b"\x02"  # offset delta 1
        + b"\x01"  # null key (-1)
        + b"\x01"  # null value (-1): a tombstone
        + b"\x00"  # no headers
    )
    assert len(record0) == 13 and len(record1) == 7
    records = b"\x1a" + record0 + b"\x0e" + record1  # lengths 13 and 7, zigzag
    covered = (
        struct.pack(
            ">hiqqqhii",
            0x0010,  # attributes: transactional, no compression, create time
            1,  # last offset delta
            1_700_000_000_000,  # base timestamp
            1_700_000_000_300,  # max timestamp
            4242,  # producer id
            3,  # producer epoch
            17,  # base sequence
            2,  # records count
        )
        + records
    )
    length = 4 + 1 + 4 + len(covered)  # leader epoch, magic, CRC, the rest
    prefix = struct.pack(">qiibI", 1000, length, 7, 2, crc32c(covered))
    return prefix + covered


KNOWN_RECORDS = (
    Record(1000, 1_700_000_000_000, b"k", b"v1", (("h", b"x"),)),
    Record(1001, 1_700_000_000_300, None, None),
)


def test_encoder_produces_the_known_bytes() -> None:
    expected = known_batch()
    built = build_batch(
        KNOWN_RECORDS,
        base_offset=1000,
        partition_leader_epoch=7,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        transactional=True,
    )
    assert built.hex() == expected.hex()
    assert len(built) == HEADER_SIZE + 22
    assert struct.unpack_from(">I", built, 17)[0] == crc32c(built[21:])


@pytest.mark.parametrize(
    ("records", "kwargs", "crc"),
    [
        ([], {"last_offset_delta": 0, "base_timestamp": 0, "max_timestamp": 0}, 0x595FB7DD),
        ([], {"last_offset_delta": 0, "base_timestamp": 0, "max_timestamp": 0, "control": True},
         0x512E43D9),
        ([Record(0, 1_479_847_795_005, b"\x01\x02\x03\x04", b"\x05\x06\x07",
                 (("\x08\t\n", b"\x0b\x0c"),))],
         {"base_timestamp": 1_479_847_795_000, "max_timestamp": 0}, 0x547961FD),
    ],
)  # fmt: skip
def test_crcs_match_another_clients_published_batches(
    records: list[Record], kwargs: dict[str, int], crc: int
) -> None:
    """The CRCs that Sarama's record batch tests (record_test.go: "empty
    record", "control batch", "uncompressed record") give for the same fields,
    with producer id, epoch and base sequence 0."""
    batch = build_batch(records, producer_id=0, producer_epoch=0, base_sequence=0,
                        partition_leader_epoch=0, **kwargs)  # type: ignore[arg-type]  # fmt: skip
    header = verify(batch)
    assert header.crc == crc
    assert header.length == 49 + (21 if records else 0)
    assert decode_records(batch) == tuple(records)


def test_header_view_reads_every_field() -> None:
    header = verify(known_batch())
    assert header == BatchHeader(
        base_offset=1000,
        length=len(known_batch()) - 12,
        partition_leader_epoch=7,
        magic=2,
        crc=crc32c(known_batch()[21:]),
        attributes=0x10,
        last_offset_delta=1,
        base_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_300,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        records_count=2,
    )
    assert header.size == len(known_batch())
    assert (header.last_offset, header.next_offset) == (1001, 1002)
    assert header.compression is Compression.NONE
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert header.is_transactional and not header.is_control
    assert header.delete_horizon_ms is None
    assert header.last_sequence == 18


def test_decoder_reads_the_known_records() -> None:
    records = decode_records(known_batch())
    assert records == KNOWN_RECORDS
    assert records[1].is_tombstone and not records[0].is_tombstone


def test_attribute_bits() -> None:
    batch = build_batch(
        [Record(0, 5, b"k", b"v")],
        compression=Compression.ZSTD,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        max_timestamp=9,
        control=True,
        delete_horizon_ms=3,
    )
    header = verify(batch)
    # zstd 4 | log append time 0x08 | control 0x20 | delete horizon 0x40
    assert header.attributes == 0x04 | 0x08 | 0x20 | 0x40
    assert header.delete_horizon_ms == 3 == header.base_timestamp
    assert header.is_control and not header.is_transactional
    # Under LOG_APPEND_TIME a record's timestamp is the batch's max timestamp.
    assert decode_records(batch) == (Record(0, 9, b"k", b"v"),)


def test_last_sequence_wraps_past_int32() -> None:
    batch = build_batch(
        [Record(i, 0, None, b"v") for i in range(3)],
        base_sequence=2**31 - 2,
        producer_id=1,
        producer_epoch=0,
    )
    assert verify(batch).last_sequence == 0
    assert verify(build_batch([Record(0, 0, None, b"")])).last_sequence == -1


# -- compression: the records section only, in the codecs' standard framing ----

RECORDS = [Record(10 + i, 1_000 + i, b"key-%d" % i, b"value " * 20, ()) for i in range(50)]


def section(batch: bytes) -> bytes:
    return batch[HEADER_SIZE:]


def test_gzip_section_is_a_gzip_stream() -> None:
    plain = build_batch(RECORDS, base_offset=10)
    packed = build_batch(RECORDS, base_offset=10, compression=Compression.GZIP)
    assert gzip.decompress(section(packed)) == section(plain)
    assert decode_records(packed) == tuple(RECORDS)


def test_lz4_section_is_a_frame_as_kafka_writes_it() -> None:
    plain = build_batch(RECORDS, base_offset=10)
    packed = build_batch(RECORDS, base_offset=10, compression=Compression.LZ4)
    frame = section(packed)
    # Magic 0x184D2204; FLG 0x60: version 01, independent blocks, no checksums,
    # no content size; BD 0x40: 64 KiB blocks (KafkaLZ4BlockOutputStream).
    assert frame[:6] == b"\x04\x22\x4d\x18\x60\x40"
    assert lz4.frame.decompress(frame) == section(plain)
    assert decode_records(packed) == tuple(RECORDS)


def test_zstd_section_is_a_zstd_frame() -> None:
    plain = build_batch(RECORDS, base_offset=10)
    packed = build_batch(RECORDS, base_offset=10, compression=Compression.ZSTD)
    assert section(packed)[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(section(packed)) == section(plain)
    assert decode_records(packed) == tuple(RECORDS)


def test_zstd_frame_without_content_size_decodes() -> None:
    # A producer streams its frames: they need not say their size.
    plain = build_batch(RECORDS, base_offset=10)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(section(plain))
    batch = with_section(plain, frame, Compression.ZSTD)
    assert verify(batch).compression is Compression.ZSTD
    assert decode_records(batch) == tuple(RECORDS)


def snappy_literal(data: bytes) -> bytes:
    """A raw snappy block of ``data`` (at most 256 bytes) as one literal, by
    the format's description: the length as a varint, then a literal tag
    (``(n - 1) << 2`` up to 60 bytes, else ``60 << 2`` and ``n - 1``)."""
    assert 0 < len(data) <= 256
    n = len(data)
    length = bytes([n]) if n < 128 else bytes([(n & 0x7F) | 0x80, n >> 7])
    tag = bytes([(n - 1) << 2]) if n <= 60 else bytes([60 << 2, n - 1])
    return length + tag + data


XERIAL_HEADER = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01"


def test_snappy_section_is_framed_as_snappy_java_writes_it() -> None:
    plain = build_batch(RECORDS, base_offset=10)
    packed = build_batch(RECORDS, base_offset=10, compression=Compression.SNAPPY)
    framed = section(packed)
    # xerial's magic, version 1, compatible version 1, then length-prefixed
    # raw blocks of at most 32 KiB of input.
    assert framed[:16] == XERIAL_HEADER
    (size,) = struct.unpack_from(">i", framed, 16)
    assert 20 + size == len(framed)
    assert bytes(cramjam.snappy.decompress_raw(framed[20:])) == section(plain)
    assert decode_records(packed) == tuple(RECORDS)


def test_snappy_sections_of_another_writer_decode() -> None:
    # Written by hand from the formats' descriptions: two xerial blocks of
    # literals, and one raw block without xerial's header (which
    # SnappyInputStream reads as a whole raw block).
    records = [Record(0, 0, b"k", b"v" * 100), Record(1, 0, None, b"w" * 90)]
    plain = build_batch(records)
    body = section(plain)
    half = len(body) // 2
    framed = XERIAL_HEADER
    for part in (body[:half], body[half:]):
        block = snappy_literal(part)
        framed += struct.pack(">i", len(block)) + block
    assert decode_records(with_section(plain, framed, Compression.SNAPPY)) == tuple(records)
    raw = cramjam.snappy.compress_raw(body)
    assert decode_records(with_section(plain, bytes(raw), Compression.SNAPPY)) == tuple(records)


def test_a_large_section_is_cut_in_32_kib_blocks() -> None:
    records = [Record(i, 0, None, bytes(range(256)) * 40) for i in range(10)]  # 100 KiB
    framed = section(build_batch(records, compression=Compression.SNAPPY))
    sizes, position = [], 16
    while position < len(framed):
        (size,) = struct.unpack_from(">i", framed, position)
        sizes.append(size)
        position += 4 + size
    assert position == len(framed) and len(sizes) == 4
    assert decode_records(build_batch(records, compression=Compression.SNAPPY)) == tuple(records)


@pytest.mark.parametrize("compression", list(Compression)[1:])
def test_damaged_compressed_records_are_corrupt(compression: Compression) -> None:
    packed = build_batch(RECORDS, base_offset=10, compression=compression)
    damaged = bytearray(packed)
    damaged[HEADER_SIZE + 12 : HEADER_SIZE + 20] = b"\xff" * 8
    message = corrupt(recrc(damaged))
    assert compression.name in message and "base offset 10" in message
    # Cut short, and followed by stray bytes.
    for section_bytes in (section(packed)[:-3], section(packed) + b"\x00\x01"):
        batch = with_records_section(section_bytes, len(RECORDS), 59, int(compression))
        assert compression.name in corrupt(batch)


@pytest.mark.parametrize(
    ("compression", "flag", "package"),
    [
        (Compression.LZ4, "HAVE_LZ4", "lz4"),
        (Compression.ZSTD, "HAVE_ZSTD", "zstandard"),
        (Compression.SNAPPY, "HAVE_SNAPPY", "cramjam"),
    ],
)
def test_a_missing_codec_package_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch, compression: Compression, flag: str, package: str
) -> None:
    packed = build_batch(RECORDS, base_offset=10, compression=compression)
    monkeypatch.setattr(batch_module, flag, False)
    for call in (lambda: build_batch(RECORDS, compression=compression), lambda: verify(packed)):
        with pytest.raises(PartitionLogError) as caught:
            call()
        assert caught.value.code is Errors.UNSUPPORTED_COMPRESSION_TYPE
        assert f"the {package} package is not installed" in str(caught.value)


def test_unknown_compression_id_is_corrupt() -> None:
    batch = bytearray(build_batch(RECORDS, base_offset=10))
    struct.pack_into(">h", batch, 21, 6)
    assert "compression id 6" in corrupt(recrc(batch))


# -- the fields outside the CRC -----------------------------------------------


def test_leader_stamps_offset_and_epoch_without_recomputing_the_crc() -> None:
    batch = bytearray(build_batch(RECORDS, base_offset=10, partition_leader_epoch=-1))
    crc_before = batch[17:21]
    set_base_offset(batch, 5_000_000_000)
    set_leader_epoch(batch, 12)
    assert batch[17:21] == crc_before
    header = verify(bytes(batch))
    assert (header.base_offset, header.partition_leader_epoch) == (5_000_000_000, 12)
    assert [r.offset for r in decode_records(batch)] == [5_000_000_000 + i for i in range(50)]


def test_patching_at_a_position_in_a_larger_buffer() -> None:
    first = build_batch(RECORDS[:1], base_offset=10)
    buffer = bytearray(first + build_batch(RECORDS[1:2], base_offset=11))
    set_base_offset(buffer, 99, position=len(first))
    set_leader_epoch(buffer, 4, position=len(first))
    second = verify(bytes(buffer[len(first) :]))
    assert (second.base_offset, second.partition_leader_epoch) == (99, 4)
    assert verify(bytes(buffer[: len(first)])).base_offset == 10


def test_patch_values_out_of_range_are_refused() -> None:
    batch = bytearray(build_batch(RECORDS[:1], base_offset=10))
    with pytest.raises(PartitionLogError, match="partition leader epoch"):
        set_leader_epoch(batch, 2**31)
    with pytest.raises(PartitionLogError, match="base offset"):
        set_base_offset(batch, 2**63)
    assert verify(bytes(batch)).base_offset == 10


def test_every_bit_flip_in_the_crc_covered_region_is_detected() -> None:
    batch = build_batch(
        KNOWN_RECORDS, base_offset=1000, producer_id=1, producer_epoch=0, base_sequence=0
    )
    for byte in range(17, len(batch)):  # the CRC itself and everything it covers
        for bit in range(8):
            flipped = bytearray(batch)
            flipped[byte] ^= 1 << bit
            message = corrupt(flipped, records=False)
            assert "CRC stored" in message, (byte, bit, message)


def test_flips_outside_the_crc_are_caught_by_their_own_checks() -> None:
    batch = build_batch(KNOWN_RECORDS, base_offset=1000)
    for bit in range(8):
        flipped = bytearray(batch)
        flipped[16] ^= 1 << bit
        assert "magic" in corrupt(flipped)
    for byte in range(8, 12):
        for bit in range(8):
            flipped = bytearray(batch)
            flipped[byte] ^= 1 << bit
            assert "length field" in corrupt(flipped)
    # The base offset and the leader epoch are free to change: no check.
    for byte in [*range(8), *range(12, 16)]:
        flipped = bytearray(batch)
        flipped[byte] ^= 0xFF
        verify(bytes(flipped))


# -- malformed input: a clear error naming what, never IndexError/struct.error --


@pytest.mark.parametrize("size", [0, 1, 12, 17, 60])
def test_short_buffer(size: int) -> None:
    message = corrupt(known_batch()[:size])
    assert f"batch of {size} bytes is shorter than the 61-byte header" in message


def test_wrong_magic() -> None:
    batch = bytearray(known_batch())
    batch[16] = 1
    assert "magic 1, expected 2" in corrupt(batch)
    assert "base offset 1000" in corrupt(batch)


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 48, 2**31 - 1])
def test_bad_length_field(length: int) -> None:
    batch = bytearray(known_batch())
    struct.pack_into(">i", batch, 8, length)
    message = corrupt(batch)
    assert f"length field {length}, expected {len(batch) - 12}" in message


def test_buffer_longer_than_its_batch() -> None:
    message = corrupt(known_batch() + b"\x00")
    assert f"length field {len(known_batch()) - 12}, expected {len(known_batch()) - 11}" in message


def test_bad_crc_names_stored_and_computed() -> None:
    batch = bytearray(known_batch())
    struct.pack_into(">I", batch, 17, 0xDEADBEEF)
    message = corrupt(batch)
    assert f"CRC stored 0xdeadbeef, computed 0x{crc32c(known_batch()[21:]):08x}" in message
    assert "base offset 1000" in message


def _with_count(batch: bytes, count: int, last_offset_delta: int | None = None) -> bytearray:
    patched = bytearray(batch)
    struct.pack_into(">i", patched, 57, count)
    if last_offset_delta is not None:
        struct.pack_into(">i", patched, 23, last_offset_delta)
    return recrc(patched)


def test_record_count_above_the_records() -> None:
    message = corrupt(_with_count(known_batch(), 3, 5))
    assert "record 2 of 3" in message and "ends after 2 records" in message


def test_record_count_below_the_records() -> None:
    message = corrupt(_with_count(known_batch(), 1))
    assert "bytes remain after its 1 records" in message


def test_negative_record_count() -> None:
    assert "record count -1 is negative" in corrupt(_with_count(known_batch(), -1))


def test_record_count_beyond_the_offsets_it_spans() -> None:
    message = corrupt(_with_count(known_batch(), 5, 2), records=False)
    assert "record count 5 exceeds the 3 offsets its last offset delta 2 spans" in message


def test_record_count_that_cannot_fit() -> None:
    message = corrupt(_with_count(known_batch(), 1000, 5000), records=False)
    assert "record count 1000 cannot fit in 22 bytes" in message


def test_negative_last_offset_delta() -> None:
    assert "last offset delta -1 is negative" in corrupt(_with_count(known_batch(), 0, -1))


def test_record_offset_delta_beyond_the_last_offset_delta() -> None:
    batch = with_records_section(b"\x0c\x00\x00\x02\x01\x01\x00", 1, 0)
    assert (
        "offset delta 1 after -1: expected an increasing delta of at most the last "
        "offset delta 0" in corrupt(batch)
    )


def test_offset_deltas_must_increase() -> None:
    record = b"\x00\x00\x02\x01\x01\x00"  # offset delta 1
    batch = with_records_section(b"\x0c" + record + b"\x0c" + record, 2, 3)
    assert "offset delta 1 after 1" in corrupt(batch)


def test_bad_varint() -> None:
    # A record length of six continuation bytes: longer than an int32's five.
    batch = with_records_section(b"\xff" * 6 + b"\x01" + b"\x00" * 10, 1, 0)
    message = corrupt(batch)
    assert "record 0 of 1" in message and "longer than 5 bytes" in message


def test_varint_running_off_the_end() -> None:
    batch = with_records_section(b"\x0c\x00\x00\x00\x01\x01\x80", 1, 0)
    assert "runs past the end" in corrupt(batch)


@pytest.mark.parametrize(
    ("record", "what"),
    [
        (b"\x0a\x00\x00\x00\x01\x01", "runs past the end"),  # headers count missing
        (b"\x0c\x00\x00\x00\x40\x01\x00", "key length 32"),
        (b"\x0c\x00\x00\x00\x01\x03\x00", "value length -2"),
        (b"\x0c\x00\x00\x00\x01\x01\x01", "header count -1"),
        (b"\x10\x00\x00\x00\x01\x01\x02\x01\x01", "header key length -1"),
        (b"\x10\x00\x00\x00\x01\x01\x02\x02\xff\x01", "header key at position 8 is not UTF-8"),
        (b"\x0e\x00\x00\x00\x01\x01\x00\x00", "its length says 7 bytes but its fields take 6"),
        (b"\x00", "has no attributes byte"),
        (b"\x03", "its length -2"),
    ],
)
def test_malformed_record_fields(record: bytes, what: str) -> None:
    # Padded to the 7 bytes of the smallest record, which the header check asks.
    message = corrupt(with_records_section(record.ljust(7, b"\x00"), 1, 0))
    assert what in message and "record 0 of 1" in message and "base offset 0" in message


# -- building: bad arguments are refused naming them ----------------------------


@pytest.mark.parametrize(
    ("records", "kwargs", "what"),
    [
        ([Record(1, 0, None, b""), Record(1, 0, None, b"")], {}, "record 1 has offset 1"),
        ([Record(-1, 0, None, b"")], {}, "record 0 has offset -1"),
        ([Record(2**31, 0, None, b"")], {}, "record 0 has offset 2147483648"),
        ([Record(3, 0, None, b"")], {"last_offset_delta": 2}, "last offset delta 2 is below"),
        ([], {}, "an empty batch needs its last offset delta"),
        ([Record(0, 0, None, b"")], {"timestamp_type": TimestampType.LOG_APPEND_TIME},
         "needs its max timestamp"),
        ([Record(0, 0, None, b"")], {"producer_epoch": 2**15}, "producer epoch 32768"),
        ([Record(0, 0, None, b"")], {"partition_leader_epoch": -(2**31) - 1},
         "partition leader epoch"),
        ([Record(0, 0, None, b"")], {"base_sequence": 2**31}, "base sequence"),
        ([Record(0, 0, None, b"")], {"base_offset": 2**63}, "base offset"),
        ([Record(0, 0, None, b"")], {"base_timestamp": 1, "delete_horizon_ms": 2},
         "stored as the base timestamp"),
        ([Record(0, 2**63 - 1, None, b"")], {"base_timestamp": -1}, "record 0 has timestamp"),
        ([Record(0, 0, None, "text")], {}, "value must be bytes or None"),  # type: ignore[arg-type]
        ([Record(0, 0, None, b"", ((b"k", b""),))], {}, "header key must be a str"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_bad_build_arguments(records: list[Record], kwargs: dict[str, object], what: str) -> None:
    with pytest.raises(PartitionLogError) as caught:
        build_batch(records, **kwargs)  # type: ignore[arg-type]
    assert caught.value.code is Errors.INVALID_RECORD
    assert what in str(caught.value)


def test_empty_batch_keeps_the_offsets_it_spans() -> None:
    # Compaction keeps an empty batch for its producer's sequence numbers.
    batch = build_batch(
        [], base_offset=100, last_offset_delta=9, producer_id=7, producer_epoch=1, base_sequence=40
    )
    header = verify(batch)
    assert (header.records_count, header.last_offset, header.last_sequence) == (0, 109, 49)
    assert header.base_timestamp == header.max_timestamp == -1
    assert decode_records(batch) == ()


def test_compacted_batch_with_gaps_in_its_offsets() -> None:
    kept = [Record(100, 5, b"a", b"1"), Record(104, 9, b"b", None)]
    batch = build_batch(kept, base_offset=100, last_offset_delta=9)
    header = verify(batch)
    assert (header.records_count, header.last_offset_delta) == (2, 9)
    assert decode_records(batch) == tuple(kept)


# -- decompression bombs ---------------------------------------------------------


@pytest.mark.parametrize("compression", list(Compression)[1:])
def test_a_section_that_expands_past_the_limit_is_refused(compression: Compression) -> None:
    records = [Record(i, 0, None, bytes(10_000)) for i in range(100)]  # about 1 MB of zeros
    batch = build_batch(records, compression=compression)
    plain_size = len(build_batch(records)) - HEADER_SIZE
    # snappy's copies are at most 64 bytes per 3: it expands about 21 times.
    assert len(batch) < plain_size // (20 if compression is Compression.SNAPPY else 50)
    with pytest.raises(PartitionLogError) as caught:
        verify(batch, max_records_bytes=100_000)
    assert caught.value.code is Errors.MESSAGE_TOO_LARGE
    assert f"base offset 0: {compression.name} records decompress to more than 100000" in str(
        caught.value
    )
    with pytest.raises(PartitionLogError, match="more than"):
        decode_records(batch, max_records_bytes=plain_size - 1)
    # Exactly at the limit it decodes.
    assert decode_records(batch, max_records_bytes=plain_size) == tuple(records)


def test_a_zstd_frame_without_its_size_is_bounded_too() -> None:
    records = [Record(i, 0, None, bytes(10_000)) for i in range(100)]
    plain = build_batch(records)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(section(plain))
    batch = with_section(plain, frame, Compression.ZSTD)
    with pytest.raises(PartitionLogError) as caught:
        verify(batch, max_records_bytes=50_000)
    assert caught.value.code is Errors.MESSAGE_TOO_LARGE
    assert len(decode_records(batch)) == 100


def test_a_zstd_section_followed_by_another_frame_is_corrupt() -> None:
    packed = build_batch(RECORDS, base_offset=10, compression=Compression.ZSTD)
    doubled = with_records_section(section(packed) * 2, len(RECORDS), 59, Compression.ZSTD)
    assert "cut short or followed by other bytes" in corrupt(doubled)


@pytest.mark.parametrize(
    "options",
    [
        {"block_linked": True},
        {"content_checksum": True, "block_size": lz4.frame.BLOCKSIZE_MAX4MB},
        {"store_size": True, "block_checksum": True},
    ],
    ids=["linked-blocks", "content-checksum-4MiB", "content-size-block-checksum"],
)
def test_lz4_frames_as_other_clients_write_them_decode(options: dict[str, object]) -> None:
    # Other clients set other frame flags (a content checksum, 4 MiB blocks):
    # any valid LZ4 frame decodes.
    plain = build_batch(RECORDS, base_offset=10)
    frame = lz4.frame.compress(section(plain), **options)
    batch = with_section(plain, frame, Compression.LZ4)
    assert verify(batch).compression is Compression.LZ4
    assert decode_records(batch) == tuple(RECORDS)


def test_first_transactional_producer_reads_only_lengths_and_attributes() -> None:
    plain = build_batch([Record(0, 0, None, b"a")], producer_id=3, producer_epoch=1)
    control = build_batch(
        [Record(1, 0, b"\x00\x00\x00\x00", b"")],
        base_offset=1,
        producer_id=4,
        producer_epoch=2,
        transactional=True,
        control=True,
    )
    txn = build_batch(
        [Record(2, 0, None, b"b")], base_offset=2, producer_id=5, producer_epoch=6,
        transactional=True,
    )  # fmt: skip
    assert batch_module.first_transactional_producer(plain + control + txn) == (5, 6)
    assert batch_module.first_transactional_producer(plain + control) is None
    assert batch_module.first_transactional_producer(b"") is None
    damaged = bytearray(plain + txn)
    struct.pack_into(">i", damaged, 8, 0)  # a length that does not walk on
    assert batch_module.first_transactional_producer(damaged) is None

"""Property tests of the v2 record batch: every batch decodes to what was
encoded, and no bytes whatever make the decoder fail with anything but a
clear PartitionLogError."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partition_log.batch import (
    BatchScanner,
    Compression,
    ScanEnd,
    TimestampType,
    build_batch,
    decode_records,
    set_base_offset,
    set_leader_epoch,
    verify,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.records import (
    Record,
    _records_fit,
    check_records_section,
    decode_records_section,
    encode_records_section,
)

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TIMESTAMP = st.integers(-1, 2**45)
OPTIONAL_BYTES = st.none() | st.binary(max_size=40)
HEADERS = st.lists(st.tuples(st.text(max_size=8), OPTIONAL_BYTES), max_size=3).map(tuple)
CODECS = st.sampled_from([Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD])


@dataclass(frozen=True)
class Spec:
    records: list[Record]
    kwargs: dict[str, Any]


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    base_offset = draw(st.integers(0, 2**62))
    gaps = draw(st.lists(st.integers(1, 3), max_size=12))
    records = []
    offset = base_offset - 1
    for gap in gaps:
        offset += gap
        records.append(
            Record(
                offset, draw(TIMESTAMP), draw(OPTIONAL_BYTES), draw(OPTIONAL_BYTES), draw(HEADERS)
            )
        )
    last_delta = (records[-1].offset - base_offset if records else 0) + draw(st.integers(0, 3))
    kwargs: dict[str, Any] = {
        "base_offset": base_offset,
        "partition_leader_epoch": draw(INT32),
        "compression": draw(CODECS),
        "timestamp_type": draw(st.sampled_from(TimestampType)),
        "last_offset_delta": last_delta,
        "producer_id": draw(INT64),
        "producer_epoch": draw(INT16),
        "base_sequence": draw(INT32),
        "transactional": draw(st.booleans()),
        "control": draw(st.booleans()),
    }
    if kwargs["timestamp_type"] is TimestampType.LOG_APPEND_TIME or draw(st.booleans()):
        kwargs["max_timestamp"] = draw(TIMESTAMP)
    if draw(st.booleans()):
        kwargs["delete_horizon_ms"] = draw(TIMESTAMP)
    return Spec(records, kwargs)


def expected_records(spec: Spec) -> tuple[Record, ...]:
    if spec.kwargs["timestamp_type"] is TimestampType.LOG_APPEND_TIME:
        append_time = spec.kwargs["max_timestamp"]
        return tuple(Record(r.offset, append_time, r.key, r.value, r.headers) for r in spec.records)
    return tuple(spec.records)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_decode_of_encode_is_identity(spec: Spec) -> None:
    batch = build_batch(spec.records, **spec.kwargs)
    header = verify(batch)
    assert decode_records(batch) == expected_records(spec)
    kw = spec.kwargs
    assert header.base_offset == kw["base_offset"]
    assert header.partition_leader_epoch == kw["partition_leader_epoch"]
    assert header.compression is kw["compression"]
    assert header.timestamp_type is kw["timestamp_type"]
    assert header.last_offset_delta == kw["last_offset_delta"]
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        kw["producer_id"],
        kw["producer_epoch"],
        kw["base_sequence"],
    )
    assert header.is_transactional == kw["transactional"]
    assert header.is_control == kw["control"]
    assert header.records_count == len(spec.records)
    assert header.delete_horizon_ms == kw.get("delete_horizon_ms")
    if "max_timestamp" in kw:
        assert header.max_timestamp == kw["max_timestamp"]
    elif spec.records:
        assert header.max_timestamp == max(r.timestamp for r in spec.records)
    assert header.size == len(batch)


@settings(max_examples=150)
@given(specs(), st.integers(0, 2**62), INT32)
def test_stamping_offset_and_epoch_keeps_the_batch_valid(
    spec: Spec, base_offset: int, epoch: int
) -> None:
    batch = bytearray(build_batch(spec.records, **spec.kwargs))
    set_base_offset(batch, base_offset)
    set_leader_epoch(batch, epoch)
    header = verify(bytes(batch))
    assert (header.base_offset, header.partition_leader_epoch) == (base_offset, epoch)
    shift = base_offset - spec.kwargs["base_offset"]
    assert [r.offset for r in decode_records(batch)] == [r.offset + shift for r in spec.records]


@settings(max_examples=150)
@given(specs(), st.data())
def test_any_bit_flip_under_the_crc_is_detected(spec: Spec, data: st.DataObject) -> None:
    batch = build_batch(spec.records, **spec.kwargs)
    position = data.draw(st.integers(17, len(batch) - 1))
    flipped = bytearray(batch)
    flipped[position] ^= 1 << data.draw(st.integers(0, 7))
    try:
        verify(bytes(flipped), records=False)
    except PartitionLogError as error:
        assert error.code is Errors.CORRUPT_MESSAGE
        assert "CRC stored" in str(error)
    else:
        raise AssertionError(f"a flip at byte {position} went unnoticed")


def _recrc(batch: bytearray) -> bytes:
    if len(batch) >= 21:
        struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


@settings(max_examples=400)
@given(specs(), st.data())
def test_mutated_batches_with_a_good_crc_fail_only_clearly(spec: Spec, data: st.DataObject) -> None:
    """Damage that the CRC does not see (a writer's bug, or a CRC recomputed
    over bad bytes): decoding either succeeds or raises PartitionLogError,
    never IndexError or struct.error."""
    batch = bytearray(build_batch(spec.records, **spec.kwargs))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["set", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(0, len(batch) - 1)))
        if kind == "set" and batch:
            batch[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del batch[at:]
        elif kind == "insert":
            batch[at:at] = data.draw(st.binary(min_size=1, max_size=6))
        elif batch:
            del batch[at : at + data.draw(st.integers(1, 6))]
    fixed = data.draw(st.booleans())
    if fixed and len(batch) >= 12:
        struct.pack_into(">i", batch, 8, len(batch) - 12)
    candidate = _recrc(batch)
    try:
        verify(candidate)
        decode_records(candidate)
    except PartitionLogError as error:
        assert error.code in (Errors.CORRUPT_MESSAGE, Errors.UNSUPPORTED_COMPRESSION_TYPE)
        assert str(error.args[0])


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_fail_only_clearly(data: bytes) -> None:
    for candidate in (data, _recrc(bytearray(data))):
        try:
            verify(candidate)
        except PartitionLogError as error:
            assert error.code in (Errors.CORRUPT_MESSAGE, Errors.UNSUPPORTED_COMPRESSION_TYPE)
        scanner = BatchScanner(candidate)
        for scanned in scanner:
            assert scanned.end <= len(candidate)
        assert scanner.end is not None
        assert (scanner.error is None) == (scanner.end is ScanEnd.COMPLETE)


@settings(max_examples=100)
@given(st.lists(specs(), min_size=1, max_size=4), st.data())
def test_scanner_cuts_exactly_at_a_damaged_or_torn_batch(
    specs_: list[Spec], data: st.DataObject
) -> None:
    parts = [build_batch(s.records, **s.kwargs) for s in specs_]
    buffer = bytearray(b"".join(parts))
    starts = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    victim = data.draw(st.integers(0, len(parts) - 1))
    if data.draw(st.booleans()):
        # A flipped bit under the victim's CRC.
        at = starts[victim] + data.draw(st.integers(17, len(parts[victim]) - 1))
        buffer[at] ^= 1 << data.draw(st.integers(0, 7))
        expected_end = ScanEnd.CORRUPT
    else:
        # A torn write inside the victim: everything after it is gone.
        del buffer[starts[victim] + data.draw(st.integers(1, len(parts[victim]) - 1)) :]
        expected_end = ScanEnd.TRUNCATED
    scanner = BatchScanner(buffer)
    scanned = list(scanner)
    assert [bytes(buffer[b.position : b.end]) for b in scanned] == parts[:victim]
    assert (scanner.end, scanner.position) == (expected_end, starts[victim])


@st.composite
def sections(draw: st.DrawFn) -> tuple[bytes, int, int, int, bool]:
    """An uncompressed records section (lengths of one, two and more varint
    bytes, some records with headers), then its count, base timestamp, last
    offset delta and whether it is valid without headers."""
    # Mostly short, so damage often hits a field rather than a value's bytes.
    sizes = st.sampled_from([0, 0, 1, 1, 2, 63, 64, 100, 9000])
    count = draw(st.integers(0, 6))
    base_timestamp = draw(TIMESTAMP)
    records, offset = [], 0
    for _ in range(count):
        offset += draw(st.integers(1, 200))
        key = draw(st.none() | sizes.map(bytes))
        value = draw(st.none() | sizes.map(lambda n: b"v" * n))
        headers = draw(st.just(()) | HEADERS)
        delta = draw(st.sampled_from([0, 1, 100, 10_000, 2**40, -5]))
        records.append(Record(offset, base_timestamp + delta, key, value, headers))
    section = encode_records_section(records, 0, base_timestamp)
    # Sometimes below the last record's delta, which decoding refuses.
    last_delta = max(0, offset + draw(st.integers(-2, 2)))
    whole = last_delta >= offset and not any(r.headers for r in records)
    return section, len(records), base_timestamp, last_delta, whole


def _outcome(call: Any) -> tuple[str, Any]:
    """("ok", None) or ("error", (code, message))."""
    try:
        call()
    except PartitionLogError as error:
        return "error", (error.code, str(error.args[0]))
    return "ok", None


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(sections(), st.data())
def test_the_record_check_accepts_exactly_what_the_decoder_accepts(
    section: tuple[bytes, int, int, int, bool], data: st.DataObject
) -> None:
    """verify() walks the records without building them (check_records_section):
    on whole and on damaged sections it answers as decoding does, with the
    decoder's message, and its fast walk never accepts what decoding refuses."""
    raw, count, base_timestamp, last_delta, whole = section
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 3))):
        kind = data.draw(st.sampled_from(["set", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(0, len(damaged) - 1)))
        if kind == "set" and damaged:
            # Small values and the varint continuation bit most often.
            damaged[at] = data.draw(
                st.sampled_from([0, 1, 2, 3, 0x7F, 0x80, 0xFF]) | st.integers(0, 255)
            )
        elif kind == "cut":
            del damaged[at:]
        elif kind == "insert":
            damaged[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif damaged:
            del damaged[at : at + data.draw(st.integers(1, 3))]
    count += data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    candidate = bytes(damaged)
    decoded = _outcome(
        lambda: decode_records_section(candidate, count, 7, base_timestamp, last_delta)
    )
    checked = _outcome(
        lambda: check_records_section(candidate, count, 7, base_timestamp, last_delta)
    )
    assert checked == decoded
    fits = _records_fit(candidate, count, last_delta)
    if fits:
        assert decoded[0] == "ok"
    if candidate == raw and count == section[1] and whole:
        # The fast walk takes every whole section without headers.
        assert fits


def test_the_record_check_answers_as_the_decoder_for_every_byte_damaged() -> None:
    # Every byte of a small section set to each of a few telling values
    # (zero, small, the varint continuation bit), with the count and last
    # offset delta right and off by one.
    records = [
        Record(0, 5, None, b"", ()),
        Record(1, 70, b"k" * 70, b"v" * 3, ()),
        Record(3, 6, b"", None, ()),
    ]
    section = encode_records_section(records, 0, 5)
    for at in range(len(section)):
        for value in (0, 1, 2, 3, 0x40, 0x7F, 0x80, 0xFF):
            damaged = bytearray(section)
            damaged[at] = value
            candidate = bytes(damaged)
            for count, last_delta in ((3, 3), (2, 3), (4, 3), (3, 2)):
                args = (candidate, count, 0, 5, last_delta)
                decoded = _outcome(lambda a=args: decode_records_section(*a))
                checked = _outcome(lambda a=args: check_records_section(*a))
                assert checked == decoded, (at, value, count, last_delta)
                assert not _records_fit(candidate, count, last_delta) or decoded[0] == "ok"

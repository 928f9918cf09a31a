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
from partition_log.records import Record

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

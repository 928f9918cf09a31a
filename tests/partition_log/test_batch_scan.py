"""Splitting a buffer of concatenated batches, as a segment file holds them
(FileLogInputStream.nextBatch; LogSegment.recover cuts at the first bad byte)."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from partition_log.batch import (
    BatchScanner,
    ScanEnd,
    build_batch,
    split_batches,
    verify,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.records import Record


def batches(count: int = 4) -> list[bytes]:
    out = []
    offset = 0
    for i in range(count):
        records = [Record(offset + j, 1000 + j, b"k%d" % j, b"v" * (i + 1)) for j in range(i + 1)]
        out.append(build_batch(records, base_offset=offset, partition_leader_epoch=i))
        offset += i + 1
    return out


def ends(parts: list[bytes]) -> list[int]:
    positions = []
    total = 0
    for part in parts:
        total += len(part)
        positions.append(total)
    return positions


def test_whole_buffer_splits_into_its_batches() -> None:
    parts = batches()
    buffer = b"".join(parts)
    scanner = BatchScanner(buffer)
    scanned = list(scanner)
    assert [b.position for b in scanned] == [0, *ends(parts)[:-1]]
    assert [b.end for b in scanned] == ends(parts)
    assert [b.header.base_offset for b in scanned] == [0, 1, 3, 6]
    assert [b.header.partition_leader_epoch for b in scanned] == [0, 1, 2, 3]
    assert (scanner.end, scanner.error, scanner.position) == (ScanEnd.COMPLETE, None, len(buffer))
    assert [bytes(b) for b in split_batches(buffer)] == parts
    # Iterating again after the end yields nothing more.
    assert list(scanner) == []


def test_empty_buffer_is_complete() -> None:
    scanner = BatchScanner(b"")
    assert list(scanner) == []
    assert (scanner.end, scanner.position) == (ScanEnd.COMPLETE, 0)
    assert split_batches(b"") == []


def test_start_position() -> None:
    parts = batches()
    buffer = b"".join(parts)
    scanner = BatchScanner(buffer, start=ends(parts)[1])
    assert [b.header.base_offset for b in scanner] == [3, 6]


def test_every_truncated_tail_is_cut_at_the_last_whole_batch() -> None:
    parts = batches()
    buffer = b"".join(parts)
    boundaries = [0, *ends(parts)]
    for cut in range(len(buffer)):
        scanner = BatchScanner(buffer[:cut])
        scanned = list(scanner)
        last_whole = max(b for b in boundaries if b <= cut)
        assert scanner.position == last_whole, cut
        assert len(scanned) == boundaries.index(last_whole)
        if cut == last_whole:
            assert scanner.end is ScanEnd.COMPLETE and scanner.error is None
        else:
            assert scanner.end is ScanEnd.TRUNCATED, cut
            assert scanner.error is not None
            assert scanner.error.code is Errors.CORRUPT_MESSAGE
            assert f"at position {last_whole}" in str(scanner.error)
            assert "partial batch" in str(scanner.error)
            with pytest.raises(PartitionLogError, match=f"at position {last_whole}"):
                split_batches(buffer[:cut])


def test_damage_in_the_middle_stops_at_the_damaged_batch() -> None:
    parts = batches()
    buffer = b"".join(parts)
    starts = [0, *ends(parts)[:-1]]
    for index, start in enumerate(starts):
        for at in range(start + 17, start + len(parts[index])):  # CRC and what it covers
            damaged = bytearray(buffer)
            damaged[at] ^= 0x10
            scanner = BatchScanner(damaged)
            assert len(list(scanner)) == index
            assert (scanner.end, scanner.position) == (ScanEnd.CORRUPT, start), at
            assert scanner.error is not None
            assert f"at position {start}, batch at base offset" in str(scanner.error)
            assert "CRC stored" in str(scanner.error)


def test_wrong_magic_in_the_middle() -> None:
    parts = batches()
    damaged = bytearray(b"".join(parts))
    damaged[ends(parts)[0] + 16] = 1
    scanner = BatchScanner(damaged)
    assert len(list(scanner)) == 1
    assert scanner.end is ScanEnd.CORRUPT and scanner.position == ends(parts)[0]
    assert f"at position {ends(parts)[0]}: magic 1, expected 2" in str(scanner.error)


@pytest.mark.parametrize("length", [-5, 0, 48])
def test_length_below_the_minimum_is_corrupt(length: int) -> None:
    parts = batches()
    damaged = bytearray(b"".join(parts))
    struct.pack_into(">i", damaged, ends(parts)[1] + 8, length)
    scanner = BatchScanner(damaged)
    assert len(list(scanner)) == 2
    assert scanner.end is ScanEnd.CORRUPT and scanner.position == ends(parts)[1]
    assert f"length field {length} is below the minimum 49" in str(scanner.error)


def test_oversized_length_is_a_tail_or_corrupt_with_a_limit() -> None:
    parts = batches()
    damaged = bytearray(b"".join(parts))
    struct.pack_into(">i", damaged, ends(parts)[0] + 8, 1_000_000)
    # Without a limit it cannot be told from a torn write.
    scanner = BatchScanner(damaged)
    assert len(list(scanner)) == 1
    assert scanner.end is ScanEnd.TRUNCATED and scanner.position == ends(parts)[0]
    # With message.max.bytes it is corrupt.
    scanner = BatchScanner(damaged, max_batch_bytes=1024)
    assert len(list(scanner)) == 1
    assert scanner.end is ScanEnd.CORRUPT
    assert "a batch of 1000012 bytes exceeds the largest allowed, 1024" in str(scanner.error)


def test_header_fields_that_disagree_are_corrupt_even_with_a_good_crc() -> None:
    parts = batches()
    damaged = bytearray(b"".join(parts))
    start = ends(parts)[0]
    struct.pack_into(">i", damaged, start + 57, -3)  # records count
    end = ends(parts)[1]
    struct.pack_into(">I", damaged, start + 17, crc32c(bytes(damaged[start + 21 : end])))
    scanner = BatchScanner(damaged)
    assert len(list(scanner)) == 1
    assert scanner.end is ScanEnd.CORRUPT and scanner.position == start
    assert "record count -3 is negative" in str(scanner.error)
    assert f"at position {start}" in str(scanner.error)


def test_crc_check_can_be_skipped() -> None:
    parts = batches()
    damaged = bytearray(b"".join(parts))
    damaged[ends(parts)[0] + 70] ^= 1
    assert len(list(BatchScanner(damaged, check_crc=False))) == 4
    assert len(list(BatchScanner(damaged))) == 1


def test_scanned_views_are_the_batches() -> None:
    parts = batches()
    for view, part in zip(split_batches(bytearray(b"".join(parts))), parts, strict=True):
        assert bytes(view) == part
        verify(view)

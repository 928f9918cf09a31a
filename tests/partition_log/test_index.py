"""The offset and time indexes (partition_log/index.py; Kafka's OffsetIndex and
TimeIndex): entry bytes, lookups, truncation, the sanity check and the rule
that adds entries, shared by appends and rebuilds."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partition_log.batch import BatchScanner, build_batch
from partition_log.errors import Errors, PartitionLogError
from partition_log.index import (
    IndexBuilder,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
    sanity_check,
)
from partition_log.records import Record


def test_offset_entry_bytes() -> None:
    index = OffsetIndex(base_offset=1000)
    index.append(1005, 4200)
    index.append(1000 + 0x01020304, 0x7FFFFFFF)
    # Relative offset (int32 big-endian), then the position.
    assert index.encode() == bytes.fromhex("00000005 00001068 01020304 7fffffff")
    assert OffsetIndex.decode(1000, index.encode()).encode() == index.encode()
    assert index.entry(1) == OffsetPosition(1000 + 0x01020304, 0x7FFFFFFF)


def test_time_entry_bytes() -> None:
    index = TimeIndex(base_offset=50)
    assert index.maybe_append(0x0102030405, 57)
    # Timestamp (int64 big-endian), then the relative offset.
    assert index.encode() == bytes.fromhex("0000000102030405 00000007")
    assert TimeIndex.decode(50, index.encode()).last == TimestampOffset(0x0102030405, 57)


def test_lookup_empty_gives_the_base() -> None:
    assert OffsetIndex(7).lookup(100) == OffsetPosition(7, 0)
    assert TimeIndex(7).lookup(100) == TimestampOffset(-1, 7)


def test_lookup_known_answers() -> None:
    index = OffsetIndex(0)
    for offset, position in [(10, 100), (20, 200), (30, 300)]:
        index.append(offset, position)
    assert index.lookup(5) == OffsetPosition(0, 0)
    assert index.lookup(10) == OffsetPosition(10, 100)
    assert index.lookup(19) == OffsetPosition(10, 100)
    assert index.lookup(35) == OffsetPosition(30, 300)


@given(
    st.lists(st.integers(1, 1000), min_size=0, max_size=60),
    st.integers(-10, 70_000),
)
def test_lookup_is_the_largest_entry_at_most_the_target(gaps: list[int], target: int) -> None:
    base = 17
    index = OffsetIndex(base)
    entries = []
    offset = base
    for i, gap in enumerate(gaps):
        offset += gap
        entries.append((offset, (i + 1) * 64))
        index.append(offset, (i + 1) * 64)
    below = [e for e in entries if e[0] <= target]
    expected = OffsetPosition(*below[-1]) if below else OffsetPosition(base, 0)
    assert index.lookup(target) == expected
    times = TimeIndex(base)
    for i, (offset, _) in enumerate(entries):
        times.maybe_append(1000 + 10 * i, offset)
    stamps = [(1000 + 10 * i, o) for i, (o, _) in enumerate(entries) if 1000 + 10 * i <= target]
    assert times.lookup(target) == (
        TimestampOffset(*stamps[-1]) if stamps else TimestampOffset(-1, base)
    )


def test_truncate_drops_entries_at_or_past_the_offset() -> None:
    index = OffsetIndex(0)
    times = TimeIndex(0)
    for offset in (10, 20, 30):
        index.append(offset, offset * 10)
        times.maybe_append(offset * 100, offset)
    index.truncate_to(20)
    times.truncate_to(20)
    assert [index.entry(i).offset for i in range(len(index))] == [10]
    assert [times.entry(i).offset for i in range(len(times))] == [10]
    index.truncate_to(0)
    assert len(index) == 0


def test_appends_must_increase() -> None:
    index = OffsetIndex(0)
    index.append(10, 100)
    for offset, position in [(10, 200), (9, 200), (11, 100), (11, 50)]:
        with pytest.raises(PartitionLogError, match="does not follow") as e:
            index.append(offset, position)
        assert e.value.code is Errors.CORRUPT_MESSAGE
    assert len(index) == 1
    with pytest.raises(PartitionLogError, match="does not fit"):
        index.append(2**31, 300)
    with pytest.raises(PartitionLogError, match="does not fit"):
        OffsetIndex(5).append(4, 0)


def test_time_index_adds_only_larger_timestamps() -> None:
    times = TimeIndex(0)
    assert not times.maybe_append(-1, 3)  # no timestamp: nothing to index
    assert times.maybe_append(100, 3)
    assert not times.maybe_append(100, 5)
    assert not times.maybe_append(90, 5)
    assert times.maybe_append(101, 5)
    with pytest.raises(PartitionLogError, match="goes back"):
        times.maybe_append(102, 4)
    assert len(times) == 2


def test_full_index() -> None:
    index = OffsetIndex(0, max_index_bytes=16)
    index.append(1, 1)
    index.append(2, 2)
    assert index.is_full
    with pytest.raises(PartitionLogError, match="full"):
        index.append(3, 3)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\0" * 7, "not whole 8-byte entries"),
        (struct.pack(">iiii", 5, 10, 5, 20), "does not follow"),
        (struct.pack(">iiii", 5, 10, 6, 10), "does not follow"),
        (struct.pack(">ii", 5, -1), "does not follow"),
        (b"\0" * 24, "exceeds"),
    ],
)
def test_decode_refuses_a_bad_offset_index(data: bytes, why: str) -> None:
    with pytest.raises(PartitionLogError, match=why):
        OffsetIndex.decode(0, data, max_index_bytes=16)


def test_load_refused_leaves_the_entries() -> None:
    index = OffsetIndex(0)
    index.append(3, 30)
    with pytest.raises(PartitionLogError):
        index.load(b"\0" * 9)
    assert index.encode() == struct.pack(">ii", 3, 30)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\0" * 13, "not whole 12-byte entries"),
        (struct.pack(">qiqi", 5, 1, 5, 2), "does not follow"),
        (struct.pack(">qiqi", 5, 2, 6, 2), "does not follow"),
        (struct.pack(">qi", 5, -1), "does not follow"),
    ],
)
def test_decode_refuses_a_bad_time_index(data: bytes, why: str) -> None:
    with pytest.raises(PartitionLogError, match=why):
        TimeIndex.decode(0, data)


def test_sanity_check() -> None:
    offsets = OffsetIndex(0)
    times = TimeIndex(0)
    assert sanity_check(offsets, times, 0, 0) is None
    offsets.append(10, 5000)
    times.maybe_append(77, 10)
    assert sanity_check(offsets, times, 6000, 11) is None
    assert "past the log's 5000 bytes" in str(sanity_check(offsets, times, 5000, 11))
    assert "offset 10 is past the log's end 10" in str(sanity_check(offsets, times, 6000, 10))
    offsets.truncate_to(0)
    assert "time index entry at offset 10" in str(sanity_check(offsets, times, 6000, 10))


def _batches(sizes: list[int], stamps: list[int]) -> bytes:
    out = []
    offset = 0
    for size, stamp in zip(sizes, stamps, strict=True):
        records = [Record(offset + i, stamp + i, None, b"v" * size) for i in range(1 + size % 3)]
        out.append(build_batch(records, base_offset=offset))
        offset += len(records)
    return b"".join(out)


@given(
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 10_000)), min_size=0, max_size=40),
    st.integers(1, 8192),
)
def test_rebuild_in_one_pass_equals_the_incremental_index(
    spec: list[tuple[int, int]], interval: int
) -> None:
    log = _batches([s for s, _ in spec], [t for _, t in spec])
    incremental = IndexBuilder(OffsetIndex(0), TimeIndex(0), interval)
    position = 0
    for batch in BatchScanner(log):
        incremental.add(position, batch.header)
        position += batch.header.size
    rebuilt = IndexBuilder(OffsetIndex(0), TimeIndex(0), interval)
    rebuilt.offsets.append(999_999, 999_999)  # stale entries, dropped by reset
    rebuilt.reset()
    for batch in BatchScanner(log):
        rebuilt.add(batch.position, batch.header)
    assert rebuilt.offsets.encode() == incremental.offsets.encode()
    assert rebuilt.times.encode() == incremental.times.encode()
    # Every entry is sane against the log, one entry per interval at most.
    next_offset = max((b.header.next_offset for b in BatchScanner(log)), default=0)
    assert sanity_check(rebuilt.offsets, rebuilt.times, len(log), next_offset) is None
    assert len(rebuilt.offsets) <= len(log) // interval + 1


def test_builder_adds_an_entry_after_the_interval() -> None:
    # LogSegment.append: the entry comes when more than the interval was
    # appended since the last, for the batch then appended, at its position.
    log = _batches([100, 100, 100, 100], [5, 9, 7, 20])
    builder = IndexBuilder(OffsetIndex(0), TimeIndex(0), index_interval_bytes=500)
    scanned = list(BatchScanner(log))
    for batch in scanned:
        builder.add(batch.position, batch.header)
    assert [builder.offsets.entry(i).position for i in range(len(builder.offsets))] == [
        scanned[2].position
    ]
    assert builder.offsets.entry(0).offset == scanned[2].header.last_offset
    # The time entry is the largest timestamp so far and the offset that set it.
    assert builder.times.entry(0) == TimestampOffset(
        scanned[1].header.max_timestamp, scanned[1].header.last_offset
    )
    assert builder.max_timestamp == scanned[3].header.max_timestamp


def test_an_offset_entry_position_outside_int32_is_refused() -> None:
    # The entries live in int32 arrays, as in the file: a position past
    # int32 is refused by name, and the index is unchanged.
    index = OffsetIndex(0)
    index.append(1, 100)
    with pytest.raises(PartitionLogError, match="position 2147483648 does not fit an int32"):
        index.append(2, 2**31)
    assert index.encode() == bytes.fromhex("00000001 00000064")

"""A segment (partition_log/segment.py; Kafka's LogSegment): names, appends
and reads, timestamps, truncation, rolling, reopening, and recovery after a
power loss on the twin and after damage to real files."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import BatchHeader, ScanEnd, build_batch
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory, MemoryFile
from partition_log.index import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE
from partition_log.os_files import OsDirectory
from partition_log.records import Record
from partition_log.segment import Segment, file_name, parse_log_name

Make = Callable[[], FileDirectory]


@pytest.fixture(params=["os", "memory"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    if request.param == "os":
        return lambda: OsDirectory(tmp_path)
    directory = MemoryDirectory()
    return lambda: directory


def batch(base: int, count: int = 1, size: int = 10, stamp: int = 1000) -> bytes:
    records = [Record(base + i, stamp + i, b"k", b"v" * size) for i in range(count)]
    return build_batch(records, base_offset=base)


def batches(specs: list[tuple[int, int]], base: int = 0, stamp: int = 1000) -> list[bytes]:
    """Batches following on from ``base``, each (records, value size)."""
    out = []
    offset = base
    for count, size in specs:
        out.append(batch(offset, count, size, stamp + offset))
        offset += count
    return out


def offsets_of(data: bytes) -> list[int]:
    out = []
    position = 0
    while position < len(data):
        header = BatchHeader.parse(data, position)
        out.append(header.base_offset)
        position += header.size
    return out


def file_bytes(d: FileDirectory, name: str) -> bytes:
    f = d.open(name)
    try:
        return f.read(0, f.size)
    finally:
        f.close()


# -- names ----------------------------------------------------------------------


def test_file_names_are_twenty_digits() -> None:
    assert file_name(0, ".log") == "00000000000000000000.log"
    assert file_name(42, ".timeindex") == "00000000000000000042.timeindex"
    assert parse_log_name("00000000000000000042.log") == 42
    with pytest.raises(PartitionLogError, match="not a non-negative int64"):
        file_name(-1, ".log")


@pytest.mark.parametrize(
    "name",
    [
        "42.log",
        "0000000000000000004x.log",
        "00000000000000000042.index",
        "99999999999999999999.log",
    ],
)
def test_a_name_that_is_not_a_segment_is_refused_by_name(make: Make, name: str) -> None:
    d = make()
    with pytest.raises(PartitionLogError, match="not a segment file name") as e:
        Segment.open(d, name, now_ms=0)
    assert name in str(e.value)


def test_create_makes_four_durable_files() -> None:
    d = MemoryDirectory()
    segment = Segment.create(d, 5, now_ms=0)
    assert d.durable_names() == [
        "00000000000000000005.index",
        "00000000000000000005.log",
        "00000000000000000005.timeindex",
        "00000000000000000005.txnindex",
    ]
    assert segment.next_offset == 5 and segment.size == 0
    with pytest.raises(PartitionLogError, match="00000000000000000005.log already exists"):
        Segment.create(d, 5, now_ms=0)


# -- appends and reads ------------------------------------------------------------


def test_append_then_read(make: Make) -> None:
    d = make()
    segment = Segment.create(d, 100, now_ms=0)
    parts = batches([(3, 10), (1, 10), (5, 10)], base=100)
    for part in parts:
        segment.append(part)
    assert segment.next_offset == 109
    assert segment.size == sum(map(len, parts))
    assert segment.read(100, 10**6) == b"".join(parts)
    # From an offset inside a batch: the whole batch holding it.
    assert segment.read(101, 10**6) == b"".join(parts)
    assert segment.read(103, 10**6) == b"".join(parts[1:])
    assert segment.read(104, 10**6) == parts[2]
    assert segment.read(109, 10**6) == b""
    # Within max_bytes, but at least one whole batch.
    assert segment.read(100, len(parts[0]) + len(parts[1])) == parts[0] + parts[1]
    assert segment.read(100, len(parts[0]) + len(parts[1]) - 1) == parts[0]
    assert segment.read(100, 0) == parts[0]
    for outside in (99, 110):
        with pytest.raises(PartitionLogError, match=f"offset {outside} outside") as e:
            segment.read(outside, 100)
        assert e.value.code is Errors.OFFSET_OUT_OF_RANGE
    segment.close()


def test_several_batches_in_one_append() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    parts = batches([(2, 5), (2, 5)])
    segment.append(b"".join(parts))
    assert segment.next_offset == 4
    assert segment.read(2, 1) == parts[1]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (batch(6), "batch base offset 6, expected the next offset 5"),
        (batch(4), "batch base offset 4, expected the next offset 5"),
        (batch(5) + batch(7), "batch base offset 7, expected the next offset 6"),
        (batch(5)[:-1], "not whole batches"),
        (b"", "no batch"),
        (batch(5, size=10) + b"junk", "not whole batches"),
    ],
)
def test_a_refused_append_names_why_and_changes_nothing(make: Make, data: bytes, why: str) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0)
    for part in batches([(5, 10)]):
        segment.append(part)
    before = file_bytes(d, segment.name)
    with pytest.raises(PartitionLogError, match=why) as e:
        segment.append(data)
    assert segment.name in str(e.value)
    assert file_bytes(d, segment.name) == before
    assert segment.next_offset == 5 and segment.size == len(before)
    segment.close()


def test_an_offset_past_the_relative_range_is_refused() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    # A batch spanning offsets 0 .. 2^31-2 (a compacted one), then one
    # reaching 2^31: past an int32 relative to base 0.
    segment.append(
        build_batch([Record(0, 0, None, b"")], base_offset=0, last_offset_delta=2**31 - 2)
    )
    assert segment.next_offset == 2**31 - 1
    big = build_batch([Record(2**31 - 1, 0, None, b"")], base_offset=2**31 - 1, last_offset_delta=1)
    with pytest.raises(PartitionLogError, match="does not fit relative to base 0"):
        segment.append(big)
    assert segment.next_offset == 2**31 - 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3000)), min_size=1, max_size=25),
    st.integers(0, 20_000),
    st.data(),
)
def test_reads_return_exactly_what_was_appended(
    specs: list[tuple[int, int]], max_bytes: int, data: st.DataObject
) -> None:
    base = 1_000
    segment = Segment.create(MemoryDirectory(), base, now_ms=0, index_interval_bytes=1024)
    parts = batches(specs, base=base)
    starts = []
    offset = base
    for part, (count, _) in zip(parts, specs, strict=True):
        segment.append(part)
        starts.append(offset)
        offset += count
    start = data.draw(st.integers(base, offset - 1))
    first = max(i for i, s in enumerate(starts) if s <= start)
    expected = parts[first]
    for part in parts[first + 1 :]:
        if len(expected) + len(part) > max_bytes:
            break
        expected += part
    assert segment.read(start, max_bytes) == expected
    assert segment.read(base, 10**9) == b"".join(parts)


def test_index_entries_follow_the_interval() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0, index_interval_bytes=4096)
    for part in batches([(1, 1000)] * 40):
        segment.append(part)
    # One entry per 4096 bytes appended, never one per batch.
    assert 0 < len(segment.offsets) <= segment.size // 4096
    for i in range(len(segment.offsets)):
        entry = segment.offsets.entry(i)
        assert offsets_of(segment.read(entry.offset, 0)) == [entry.offset]


# -- timestamps ---------------------------------------------------------------------


def test_find_offset_for_timestamp() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0, index_interval_bytes=100)
    # Stamps out of order across batches (CreateTime): the first offset whose
    # record is at least the target, in offset order.
    stamps = [100, 300, 200, 400, 250, 500]
    for offset, stamp in enumerate(stamps):
        segment.append(build_batch([Record(offset, stamp, None, b"x" * 50)], base_offset=offset))
    assert len(segment.times) > 0
    for target in range(0, 600, 10):
        expected = next((o for o, s in enumerate(stamps) if s >= target), None)
        assert segment.find_offset_for_timestamp(target) == expected, target
    assert segment.max_timestamp == 500 and segment.offset_of_max_timestamp == 5


def test_timestamp_inside_a_batch() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    segment.append(batch(0, count=5, stamp=1000))  # stamps 1000..1004
    assert segment.find_offset_for_timestamp(1003) == 3
    assert segment.find_offset_for_timestamp(1005) is None


# -- truncation ------------------------------------------------------------------


def test_truncate_cuts_at_the_batch_boundary(make: Make) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=200)
    parts = batches([(3, 100)] * 10)
    for part in parts:
        segment.append(part)
    # Offset 13 is inside the batch 12-14: that batch goes whole.
    removed = segment.truncate_to(13)
    assert removed == sum(map(len, parts[4:]))
    assert segment.next_offset == 12
    assert file_bytes(d, segment.name) == b"".join(parts[:4])
    assert segment.read(0, 10**6) == b"".join(parts[:4])
    assert all(segment.offsets.entry(i).offset < 12 for i in range(len(segment.offsets)))
    # Appends follow on from the cut, and the indexes equal a rebuilt one.
    for part in batches([(3, 100)] * 3, base=12):
        segment.append(part)
    incremental = (segment.offsets.encode(), segment.times.encode(), segment.max_timestamp)
    segment.recover()
    assert (segment.offsets.encode(), segment.times.encode(), segment.max_timestamp) == (
        incremental
    )
    assert segment.truncate_to(100) == 0
    size = segment.size
    assert segment.truncate_to(0) == size
    assert segment.size == 0 and segment.next_offset == 0 and len(segment.offsets) == 0
    segment.close()


# -- rolling -------------------------------------------------------------------------


def test_should_roll_rules() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=1_000)
    # Empty: never by age.
    assert not segment.should_roll(1000, 10, now_ms=10**9, age_limit_ms=100)
    segment.append(batch(0, size=100, stamp=5_000))
    size = segment.size
    # Size: when the segment would pass segment.bytes.
    assert not segment.should_roll(size + 10, 10, now_ms=5_000, age_limit_ms=10**6)
    assert segment.should_roll(size + 9, 10, now_ms=5_000, age_limit_ms=10**6)
    # Age, from the first batch's timestamp, less the jitter.
    assert not segment.should_roll(10**6, 10, now_ms=5_100, age_limit_ms=100)
    assert segment.should_roll(10**6, 10, now_ms=5_101, age_limit_ms=100)
    assert segment.should_roll(10**6, 10, now_ms=5_051, age_limit_ms=100, jitter_ms=50)
    # Relative offset overflow.
    assert not segment.should_roll(10**6, 10, 5_000, 10**6, incoming_last_offset=2**31 - 1)
    assert segment.should_roll(10**6, 10, 5_000, 10**6, incoming_last_offset=2**31)


def test_should_roll_by_creation_time_without_timestamps() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=1_000)
    segment.append(build_batch([Record(0, -1, None, b"")], base_offset=0, max_timestamp=-1))
    assert not segment.should_roll(10**6, 0, now_ms=1_100, age_limit_ms=100)
    assert segment.should_roll(10**6, 0, now_ms=1_101, age_limit_ms=100)


@pytest.mark.parametrize("stamp", [-1, 1000])
def test_should_roll_when_an_index_is_full(stamp: int) -> None:
    # 16 bytes hold two offset entries and one time entry. Without
    # timestamps no time entry is added and the offset index fills on the
    # third append; with them the time index fills on the second.
    segment = Segment.create(
        MemoryDirectory(), 0, now_ms=0, index_interval_bytes=1, max_index_bytes=16
    )
    appends = 3 if stamp == -1 else 2
    for offset in range(appends):
        assert not segment.should_roll(10**6, 0, 0, 10**6)
        segment.append(
            build_batch([Record(offset, stamp + offset, None, b"x")], base_offset=offset)
            if stamp != -1
            else build_batch([Record(offset, -1, None, b"x")], base_offset=offset, max_timestamp=-1)
        )
    assert segment.offsets.is_full if stamp == -1 else segment.times.is_full
    assert segment.should_roll(10**6, 0, 0, 10**6)
    with pytest.raises(PartitionLogError, match="an index is full"):
        segment.append(batch(appends))


# -- reopening ------------------------------------------------------------------------


def test_reopen_uses_the_index_files(make: Make) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=500)
    parts = batches([(2, 300)] * 20)
    for part in parts:
        segment.append(part)
    segment.flush()
    offsets, times = segment.offsets.encode(), segment.times.encode()
    segment.close()
    assert file_bytes(d, segment.index_name) == offsets
    assert len(offsets) % OFFSET_ENTRY_SIZE == 0 and len(times) % TIME_ENTRY_SIZE == 0
    assert file_bytes(d, segment.time_index_name) == times
    again, recovered = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=500)
    assert recovered is None
    assert again.next_offset == 40 and again.max_timestamp == segment.max_timestamp
    assert again.read(0, 10**6) == b"".join(parts)
    # Appends after reopening index as if never closed.
    more = batches([(2, 300)] * 5, base=40)
    for part in more:
        again.append(part)
    built = again.offsets.encode(), again.times.encode()
    again.recover()
    assert (again.offsets.encode(), again.times.encode()) == built
    again.close()


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b"",  # missing entries
        lambda b: b[:-3],  # not whole entries
        lambda b: b[:8] + b[:8] + b[16:],  # an entry repeated
        lambda b: b + (2**30).to_bytes(4, "big") + (2**30).to_bytes(4, "big"),  # past the log
    ],
)
def test_a_suspect_index_file_is_rebuilt_from_the_log(
    make: Make, damage: Callable[[bytes], bytes]
) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=500)
    for part in batches([(2, 300)] * 20):
        segment.append(part)
    segment.close()
    good = file_bytes(d, segment.index_name)
    assert len(good) >= 16
    d.delete(segment.index_name)
    f = d.create(segment.index_name)
    f.append(damage(good))
    f.close()
    again, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=500)
    assert again.offsets.encode() == good
    again.flush()  # the log only
    again.close()
    assert file_bytes(d, segment.index_name) == good


def test_a_missing_index_file_is_rebuilt(make: Make) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=500)
    for part in batches([(2, 300)] * 20):
        segment.append(part)
    segment.close()
    good = file_bytes(d, segment.time_index_name)
    d.delete(segment.time_index_name)
    again, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=500)
    assert again.times.encode() == good
    again.close()
    assert file_bytes(d, segment.time_index_name) == good


def test_open_refuses_a_damaged_log_and_leaves_it(make: Make) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0)
    for part in batches([(1, 10)] * 3):
        segment.append(part)
    segment.close()
    f = d.open(segment.name)
    f.append(b"garbage that is not a batch")
    f.close()
    before = {name: file_bytes(d, name) for name in d.list()}
    with pytest.raises(PartitionLogError, match=r"00000000000000000000.log: at position \d+") as e:
        Segment.open(d, segment.name, now_ms=0)
    assert e.value.code is Errors.CORRUPT_MESSAGE
    assert {name: file_bytes(d, name) for name in d.list()} == before


def test_a_file_of_garbage_is_not_a_segment(make: Make) -> None:
    d = make()
    f = d.create("00000000000000000000.log")
    f.append(bytes(random.Random(1).randbytes(5000)))
    f.close()
    with pytest.raises(PartitionLogError, match="00000000000000000000.log: at position 0"):
        Segment.open(d, "00000000000000000000.log", now_ms=0)
    segment, result = Segment.open(d, "00000000000000000000.log", now_ms=0, recover=True)
    assert result is not None and result.valid_bytes == 0 and result.truncated_bytes == 5000
    assert segment.size == 0 and segment.next_offset == 0


# -- recovery -------------------------------------------------------------------------


def test_recover_after_a_power_loss_keeps_every_synced_batch() -> None:
    rng = random.Random(3)
    for round_ in range(40):
        d = MemoryDirectory()
        segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=256)
        appended: list[bytes] = []
        synced = 0
        offset = 0
        for _ in range(rng.randint(1, 15)):
            part = batch(offset, rng.randint(1, 3), rng.randint(0, 200))
            segment.append(part)
            appended.append(part)
            offset = BatchHeader.parse(part).next_offset
            if rng.random() < 0.3:
                segment.flush()
                synced = len(appended)
        d.crash(rng if round_ % 2 else None)
        again, result = Segment.open(d, segment.name, now_ms=0, recover=True)
        assert result is not None
        data = again.read(0, 10**9) if again.size else b""
        # Every synced batch survives; after it, only whole batches that were
        # appended, in order, and no partial one.
        kept = offsets_of(data)
        assert len(kept) >= synced
        assert data == b"".join(appended[: len(kept)])
        assert again.size == len(data) == result.valid_bytes
        assert again.next_offset == (
            BatchHeader.parse(appended[len(kept) - 1]).next_offset if kept else 0
        )
        if round_ % 2 == 0:
            assert len(kept) == synced and result.truncated_bytes == 0


def _write_segment(path: Path, parts: list[bytes]) -> OsDirectory:
    d = OsDirectory(path)
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=300)
    for part in parts:
        segment.append(part)
    segment.close()
    return d


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_recover_cuts_exactly_at_a_bit_flip(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("flip")
    parts = batches([(2, 40), (1, 300), (3, 10), (2, 120), (1, 500), (2, 60)])
    d = _write_segment(path, parts)
    log = path / "00000000000000000000.log"
    raw = bytearray(log.read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= 1 << data.draw(st.integers(0, 7))
    log.write_bytes(bytes(raw))
    ends = [0]
    for part in parts:
        ends.append(ends[-1] + len(part))
    # The damaged batch is the one holding the flipped byte.
    hit = max(i for i in range(len(parts)) if ends[i] <= at)
    segment, result = Segment.open(d, log.name, now_ms=0, recover=True)
    assert result is not None
    field = at - ends[hit]
    if 12 <= field < 16:
        # The leader epoch is outside the CRC (a leader sets it in place): a
        # flip there is not damage that recovery can see.
        assert result.valid_bytes == ends[-1]
    elif field < 8:
        # So is the base offset: a lowered one goes back and is cut at once, a
        # raised one is seen at the next batch, whose offsets then go back
        # (and not at all in the last batch). No batch after it is kept.
        assert result.valid_bytes in (ends[hit], ends[hit + 1])
        if result.valid_bytes == ends[hit + 1] and hit + 1 < len(parts):
            assert "below the expected" in str(result.reason)
    else:
        assert result.valid_bytes == ends[hit]
        assert result.end in (ScanEnd.CORRUPT, ScanEnd.TRUNCATED)
        assert result.reason is not None and f"at position {ends[hit]}" in result.reason
        assert log.stat().st_size == ends[hit]
        assert segment.read(0, 10**9) == b"".join(parts[:hit]) if hit else segment.size == 0
    segment.close()


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_recover_cuts_a_torn_tail_at_the_last_whole_batch(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("torn")
    parts = batches([(2, 40), (1, 300), (3, 10), (2, 120)])
    d = _write_segment(path, parts)
    log = path / "00000000000000000000.log"
    raw = log.read_bytes()
    cut = data.draw(st.integers(0, len(raw)))
    log.write_bytes(raw[:cut])
    ends = [0]
    for part in parts:
        ends.append(ends[-1] + len(part))
    whole = max(e for e in ends if e <= cut)
    segment, result = Segment.open(d, log.name, now_ms=0, recover=True)
    assert result is not None
    assert result.valid_bytes == whole and result.truncated_bytes == cut - whole
    assert (result.end is ScanEnd.COMPLETE) == (cut == whole)
    if cut != whole:
        assert f"at position {whole}" in str(result.reason)
    assert log.stat().st_size == whole
    segment.close()


def test_recover_reads_in_chunks_across_a_large_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import partition_log.segment as segment_module

    # A chunk smaller than a batch: recovery must read on across chunk ends.
    monkeypatch.setattr(segment_module, "RECOVERY_CHUNK_BYTES", 100)
    parts = batches([(1, 250), (2, 30), (1, 700), (3, 5)] * 3)
    d = _write_segment(tmp_path, parts)
    log = tmp_path / "00000000000000000000.log"
    raw = log.read_bytes()
    log.write_bytes(raw + raw[:30])
    segment, result = Segment.open(d, log.name, now_ms=0, recover=True)
    assert result is not None
    assert result.valid_bytes == len(raw) and result.truncated_bytes == 30
    assert f"at position {len(raw)}" in str(result.reason)
    assert segment.read(0, 10**9) == raw
    segment.close()


def test_recover_cuts_at_a_batch_that_goes_back(tmp_path: Path) -> None:
    parts = batches([(2, 10), (2, 10)])
    d = _write_segment(tmp_path, parts)
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(log.read_bytes() + batch(1))
    segment, result = Segment.open(d, log.name, now_ms=0, recover=True)
    assert result is not None and result.end is ScanEnd.CORRUPT
    assert "base offset 1 below the expected 4" in str(result.reason)
    assert segment.size == sum(map(len, parts))
    segment.close()


def test_recover_with_a_batch_limit_calls_a_huge_length_damage(tmp_path: Path) -> None:
    parts = batches([(2, 10)])
    d = _write_segment(tmp_path, parts)
    log = tmp_path / "00000000000000000000.log"
    forged = bytearray(batch(2))
    forged[8:12] = (10**6).to_bytes(4, "big")
    log.write_bytes(log.read_bytes() + bytes(forged))
    segment, result = Segment.open(d, log.name, now_ms=0, recover=True, max_batch_bytes=1000)
    assert result is not None and result.end is ScanEnd.CORRUPT
    assert "exceeds the largest allowed" in str(result.reason)
    segment.close()


# -- more refusals and index files ----------------------------------------------------


def test_a_segment_past_int32_positions_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import partition_log.segment as segment_module

    # Positions in the index are int32: a segment never grows past them. A
    # lower limit stands in for 2 GiB.
    d = MemoryDirectory()
    segment = Segment.create(d, 0, now_ms=0)
    first = batch(0, size=100)
    monkeypatch.setattr(segment_module, "INT32_MAX", len(first) + 50)
    segment.append(first)
    with pytest.raises(PartitionLogError, match="exceed a segment's int32 positions") as e:
        segment.append(batch(1, size=100))
    assert e.value.code is Errors.MESSAGE_TOO_LARGE
    assert segment.size == len(first) and segment.next_offset == 1


def test_negative_max_bytes_is_refused() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    segment.append(batch(0))
    with pytest.raises(PartitionLogError, match="max_bytes -1 is negative"):
        segment.read(0, -1)


def test_closed_segment_is_refused() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    segment.close()
    with pytest.raises(PartitionLogError, match="00000000000000000000.log is closed"):
        segment.append(batch(0))


def test_index_files_follow_truncation_and_outside_cuts(make: Make) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=300)
    for part in batches([(2, 200)] * 12):
        segment.append(part)
    segment.close()
    segment, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=300)
    assert file_bytes(d, segment.index_name) == segment.offsets.encode()
    # After a truncation the files are cut to the entries kept.
    segment.truncate_to(10)
    assert len(file_bytes(d, segment.index_name)) > len(segment.offsets.encode())
    segment.close()
    assert file_bytes(d, segment.index_name) == segment.offsets.encode()
    assert file_bytes(d, segment.time_index_name) == segment.times.encode()
    # A file cut behind the segment's back (a power loss) is rewritten whole.
    segment, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=300)
    f = d.open(segment.index_name)
    f.truncate(3)
    f.close()
    for part in batches([(2, 200)] * 4, base=segment.next_offset):
        segment.append(part)
    segment.close()
    assert file_bytes(d, segment.index_name) == segment.offsets.encode()


class _OpensDirectory(MemoryDirectory):
    """The twin, recording the names opened."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    def open(self, name: str) -> MemoryFile:
        self.opened.append(name)
        return super().open(name)


def test_flush_syncs_the_log_and_close_the_index_files() -> None:
    # flush.messages=1 pays one fsync an append: the index files are written
    # and synced on close, and a power loss before it loses them, which
    # recovery repairs by rebuilding the indexes from the synced log.
    d = _OpensDirectory()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=300)
    for part in batches([(2, 200)] * 12):
        segment.append(part)
        segment.flush()
    assert len(segment.offsets) > 0
    assert d.durable_bytes(segment.name) == segment.read(0, 10**9)
    assert d.durable_bytes(segment.index_name) == b""
    built = segment.offsets.encode(), segment.times.encode()
    d.crash()
    again, result = Segment.open(d, segment.name, now_ms=0, recover=True, index_interval_bytes=300)
    assert result is not None and result.truncated_bytes == 0
    assert (again.offsets.encode(), again.times.encode()) == built
    again.close()
    assert d.durable_bytes(again.index_name) == built[0]
    assert d.durable_bytes(again.time_index_name) == built[1]
    # A segment only read opens no index file on close.
    reader, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=300)
    d.opened.clear()
    reader.close()
    assert d.opened == []


@pytest.mark.parametrize("which", ["not at a batch", "time past the end"])
def test_index_entries_that_disagree_with_the_log_are_rebuilt(make: Make, which: str) -> None:
    d = make()
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=300)
    for part in batches([(2, 200)] * 12):
        segment.append(part)
    segment.close()
    offsets, times = file_bytes(d, segment.index_name), file_bytes(d, segment.time_index_name)
    name = segment.index_name if which == "not at a batch" else segment.time_index_name
    if which == "not at a batch":
        # The last entry's position moved one byte into its batch.
        last = int.from_bytes(offsets[-4:], "big")
        damaged = offsets[:-4] + (last + 1).to_bytes(4, "big")
    else:
        # One more time entry, at an offset past the log's end.
        damaged = times + (2**40).to_bytes(8, "big") + (1000).to_bytes(4, "big")
    d.delete(name)
    f = d.create(name)
    f.append(damaged)
    f.close()
    again, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=300)
    assert (again.offsets.encode(), again.times.encode()) == (offsets, times)
    again.close()


# -- random histories against a model ------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_random_histories_on_the_twin(seed: int) -> None:
    # Appends, reads, truncations, flushes, clean reopenings and power losses
    # with recovery: reads always equal the model, the indexes always equal
    # the ones rebuilt from the log, and nothing synced is lost.
    rng = random.Random(seed)
    d = MemoryDirectory()
    base = rng.choice([0, 12345])
    interval = rng.choice([64, 512, 4096])
    segment = Segment.create(d, base, now_ms=0, index_interval_bytes=interval)
    model: list[bytes] = []  # the batches in the segment
    synced: list[bytes] = []  # the batches of the log as last synced

    def next_offset() -> int:
        return BatchHeader.parse(model[-1]).next_offset if model else base

    for _ in range(rng.randint(1, 30)):
        op = rng.random()
        if op < 0.5:
            part = batch(next_offset(), rng.randint(1, 4), rng.randint(0, 400), rng.randint(0, 99))
            segment.append(part)
            model.append(part)
        elif op < 0.6 and model:
            cut_batch = rng.randrange(len(model))
            header = BatchHeader.parse(model[cut_batch])
            segment.truncate_to(rng.randint(header.base_offset, header.last_offset))
            del model[cut_batch:]
        elif op < 0.75:
            segment.flush()
            synced = list(model)
        elif op < 0.85:
            # A clean close writes the indexes but does not sync the log.
            segment.close()
            segment, result = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=interval)
            assert result is None
        else:
            d.crash()
            segment, result = Segment.open(
                d, segment.name, now_ms=0, recover=True, index_interval_bytes=interval
            )
            # Exactly the log as last synced: every synced batch, nothing
            # appended since, and a truncation since undone.
            assert result is not None and result.truncated_bytes == 0
            model = list(synced)
        assert segment.next_offset == next_offset()
        assert (segment.read(base, 10**9) if model else b"") == b"".join(model)
        built = (segment.offsets.encode(), segment.times.encode(), segment.max_timestamp)
        segment.recover()
        assert (segment.offsets.encode(), segment.times.encode(), segment.max_timestamp) == built


class _CountingDirectory(MemoryDirectory):
    """The twin, recording the largest single read of any file and the
    sizes of the reads since ``reads`` was last emptied."""

    largest_read = 0

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    def open(self, name: str) -> MemoryFile:
        directory = self

        class Counting(MemoryFile):
            def read(self, position: int, size: int) -> bytes:
                data = super().read(position, size)
                directory.largest_read = max(directory.largest_read, len(data))
                directory.reads.append(len(data))
                return data

        inner = super().open(name)
        return Counting(self, name, inner._inode)


def test_recovery_and_opening_read_a_bounded_part_of_the_log() -> None:
    import partition_log.segment as segment_module

    d = _CountingDirectory()
    segment = Segment.create(d, 0, now_ms=0)
    for part in batches([(4, 1000)] * 800):  # about 3.3 MB
        segment.append(part)
    segment.flush()
    segment.close()
    d.largest_read = 0
    again, result = Segment.open(d, segment.name, now_ms=0, recover=True)
    assert result is not None and result.valid_bytes == again.size > 3 * (1 << 20)
    assert d.largest_read <= segment_module.RECOVERY_CHUNK_BYTES
    again.close()
    # Opening a cleanly closed segment reads its index files and the tail
    # past the last entry only.
    d.largest_read = 0
    again, _ = Segment.open(d, segment.name, now_ms=0)
    assert d.largest_read <= max(len(again.offsets.encode()), len(again.times.encode()), 4096 * 2)
    again.close()


@pytest.mark.parametrize("interval", [0, 300, 4096, 10**6])
def test_reads_stop_at_the_byte_limit_and_max_offset_and_read_once(interval: int) -> None:
    # Against a model: from the batch holding the start, at least one batch,
    # then every whole batch within max_bytes, none whose last offset
    # reaches max_offset; and the bytes returned are exactly one read of the
    # file (where the batches end is found before reading, from the index).
    d = _CountingDirectory()
    rng = random.Random(interval)
    # Values up to 6000 bytes: batches larger than a chunk of the walk, which
    # reads find from the next index entry when it is that far.
    sizes = [0, 50, 400, 2000, 6000]
    parts = batches([(rng.randint(1, 4), rng.choice(sizes)) for _ in range(40)])
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=interval)
    for part in parts:
        segment.append(part)
    segment.close()  # reopened to read through the counting files
    segment, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=interval)
    headers = [BatchHeader.parse(p) for p in parts]
    end = segment.next_offset
    for _ in range(300):
        start = rng.randrange(end + 1)
        max_bytes = rng.choice([0, 1, 100, 1000, 5000, 10**6])
        max_offset = rng.choice([None, rng.randrange(end + 2)])
        expected = b""
        for part, header in zip(parts, headers, strict=True):
            if header.last_offset < start:
                continue
            if max_offset is not None and header.last_offset >= max_offset:
                break
            if expected and len(expected) + len(part) > max_bytes:
                break
            expected += part
        d.reads = []
        assert segment.read(start, max_bytes, max_offset) == expected
        if expected:
            assert len(expected) in d.reads
            assert max(d.reads) <= max(len(expected), 2 * interval, 8192)
    segment.close()


def test_a_read_continuing_where_the_last_ended_skips_the_lookup() -> None:
    # The walk to a read's end reads the next batch's header: the next read
    # from that batch's offsets starts there, one read of the file in place of
    # a walk from the index entry and then the read.
    d = _CountingDirectory()
    parts = batches([(4, 1000)] * 12)
    segment = Segment.create(d, 0, now_ms=0, index_interval_bytes=4096)
    for part in parts:
        segment.append(part)
    segment.close()
    segment, _ = Segment.open(d, segment.name, now_ms=0, index_interval_bytes=4096)
    max_bytes = 3 * len(parts[0]) + 200
    offset = 0
    reads_per_call = []
    while offset < segment.next_offset:
        d.reads = []
        data = segment.read(offset, max_bytes)
        assert data == b"".join(parts[offset // 4 : offset // 4 + 3])
        reads_per_call.append(len(d.reads))
        offset += 12
    # The first looks its start up; the others walk only to their end.
    assert reads_per_call == [3] + [2] * (len(reads_per_call) - 1)
    # Any offset inside the remembered batch starts there too.
    segment.read(0, max_bytes)
    assert segment.read(14, 0) == parts[3]
    segment.close()


def test_a_truncation_forgets_where_the_last_read_ended() -> None:
    parts = batches([(4, 1000)] * 6)
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0, index_interval_bytes=4096)
    for part in parts:
        segment.append(part)
    assert segment.read(0, 2 * len(parts[0]) + 200) == parts[0] + parts[1]  # remembers batch 2
    segment.truncate_to(4)
    # Offsets 4.. again, in batches of other sizes: batch 2's old position
    # now holds other bytes.
    again = batches([(2, 50), (6, 300), (4, 700)], base=4)
    for part in again:
        segment.append(part)
    assert segment.read(8, 0) == again[1]
    assert segment.read(4, 10**6) == b"".join(again)

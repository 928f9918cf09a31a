"""partition_log.inspect: the dump of a log written by PartitionLog on real
files equals what was appended, and check names each kind of damage (a bit
flipped in a batch, a torn tail, an index entry off its batch, an epoch
checkpoint that disagrees with the batches, offsets that go back or leave a
gap, a damaged snapshot, a stray file), with the files unchanged."""

from __future__ import annotations

import hashlib
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import BatchHeader, build_batch, split_batches
from partition_log.cleaner import LogCleaner
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, EpochEntry, encode_checkpoint
from partition_log.errors import PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.inspect import (
    Finding,
    FindingKind,
    check,
    dump,
    dump_segment,
    readable_bytes,
)
from partition_log.log import AppendOrigin, LogConfig, PartitionLog
from partition_log.log_config import CleanupPolicy
from partition_log.log_files import (
    CLEANER_OFFSET_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    read_whole,
)
from partition_log.os_files import OsDirectory
from partition_log.records import Record
from partition_log.segment import file_name
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch
from partition_log.txn_index import AbortedTxn, encode_entry

CONFIG = LogConfig(segment_bytes=600, index_interval_bytes=100)


def _records(i: int) -> list[Record]:
    value = b"\xff\x00%d" % i if i % 3 == 0 else b"value-%d" % i
    headers = (("h", b"x"),) if i % 2 else ()
    return [Record(j, 1000 + i, b"key-%d" % j, value, headers) for j in range(3)]


def write_log(path: Path, batches: int = 20) -> list[tuple[int, bytes, list[Record]]]:
    """A log of ``batches`` leader appends (epochs 1 to 3, one idempotent
    producer), closed cleanly: each appended batch's offset, the bytes as the
    log holds them, and its records."""
    path.mkdir(exist_ok=True)
    log = PartitionLog.open(OsDirectory(path), CONFIG, now_ms=0)
    written = []
    for i in range(batches):
        records = _records(i)
        data = build_batch(records, producer_id=9, producer_epoch=0, base_sequence=3 * i)
        info = log.append_as_leader(data, 1 + i // 8, 1000 + i)
        stored = log.read(info.first_offset, 1)
        written.append((info.first_offset, stored, records))
    log.close()
    return written


def file_digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    write_log(tmp_path / "p-0")
    return tmp_path / "p-0"


def test_dump_is_what_was_appended_and_check_finds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "p-0"
    written = write_log(path)
    before = file_digests(path)
    result = dump(OsDirectory(path), records=True, indexes=True, state=True)
    batches = [b for s in result.segments for b in s.batches]
    assert len(result.segments) > 2
    assert [b.header.base_offset for b in batches] == [offset for offset, _, _ in written]
    for info, (offset, stored, records) in zip(batches, written, strict=True):
        assert info.header == BatchHeader.parse(stored)
        assert info.crc_valid and info.records is not None
        assert [(r.offset, r.key, r.value, r.headers) for r in info.records] == [
            (offset + j, r.key, r.value, r.headers) for j, r in enumerate(records)
        ]
        assert info.header.partition_leader_epoch == 1 + (offset // 3) // 8
        assert info.header.producer_id == 9 and info.header.base_sequence == offset
    for segment in result.segments:
        assert segment.reason is None and segment.stop_position == segment.size
        assert segment.indexes is not None
        assert segment.indexes.offset_index and segment.indexes.time_index
    assert result.epoch_checkpoint == (EpochEntry(1, 0), EpochEntry(2, 24), EpochEntry(3, 48))
    assert result.snapshots and all(error is None for _, _, error in result.snapshots)
    as_json = result.to_dict()
    first = as_json["segments"][0]["batches"][0]  # type: ignore[index]
    assert first["records"][0]["value"] == {"hex": "ff0030"}
    assert first["records"][0]["key"] == {"utf8": "key-0"}
    assert check(OsDirectory(path)) == []
    assert file_digests(path) == before


def test_readable_bytes() -> None:
    assert readable_bytes(None) is None
    assert readable_bytes(b"abc") == {"utf8": "abc"}
    assert readable_bytes(b"a\nb") == {"hex": "610a62"}
    assert readable_bytes(b"\xc3\x28") == {"hex": "c328"}


def _flip(path: Path, position: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def _only(findings: list[Finding], kind: FindingKind) -> list[Finding]:
    assert findings, "nothing found"
    assert {f.kind for f in findings} == {kind}, [str(f) for f in findings]
    return findings


def test_a_flipped_bit_in_a_batch_is_named_and_the_walk_goes_on(log_dir: Path) -> None:
    segment = log_dir / file_name(0, ".log")
    second = dump_segment(OsDirectory(log_dir), segment.name).batches[1]
    _flip(segment, second.position + 70)
    before = file_digests(log_dir)
    findings = _only(check(OsDirectory(log_dir)), FindingKind.CORRUPT_BATCH)
    assert len(findings) == 1
    assert findings[0].file == segment.name and findings[0].position == second.position
    assert findings[0].offset == second.header.base_offset and "CRC" in findings[0].what
    batches = dump_segment(OsDirectory(log_dir), segment.name).batches
    # The batch is shown invalid and the ones after it are still read.
    assert [b.crc_valid for b in batches][:3] == [True, False, True]
    assert file_digests(log_dir) == before


def test_a_torn_tail_is_named_with_its_position(log_dir: Path) -> None:
    names = sorted(p.name for p in log_dir.glob("*.log"))
    last = log_dir / names[-1]
    batches = dump_segment(OsDirectory(log_dir), last.name).batches
    # As a crash without a flush leaves it: the recovery point at the roll.
    (log_dir / RECOVERY_POINT_FILE).write_bytes(b"0\n%d\n" % int(last.name[:20]))
    cut = batches[-1].position + 30
    with last.open("r+b") as f:
        f.truncate(cut)
    findings = check(OsDirectory(log_dir))
    torn = findings[0]
    assert torn.kind is FindingKind.TORN_TAIL and torn.file == last.name
    assert torn.position == batches[-1].position
    assert torn.offset == batches[-1].header.base_offset
    assert "30 bytes" in torn.what
    # The index entries of the batch cut (here the index was written whole
    # before the cut) point past the data left.
    assert {f.kind for f in findings[1:]} <= {FindingKind.INDEX}
    assert all("past the last whole batch" in f.what for f in findings[1:])
    segment = dump_segment(OsDirectory(log_dir), last.name)
    assert (
        segment.stop_position == batches[-1].position and len(segment.batches) == len(batches) - 1
    )


def test_an_index_entry_off_its_batch_is_named(log_dir: Path) -> None:
    index = log_dir / file_name(0, ".index")
    data = bytearray(index.read_bytes())
    assert len(data) >= 16
    relative, position = struct.unpack_from(">ii", data, 0)
    struct.pack_into(">ii", data, 0, relative, position + 1)
    index.write_bytes(bytes(data))
    findings = _only(check(OsDirectory(log_dir)), FindingKind.INDEX)
    assert findings[0].file == index.name and findings[0].position == position + 1
    assert "does not point at the start of a batch" in findings[0].what
    # The right position with the wrong offset.
    struct.pack_into(">ii", data, 0, relative - 1, position)
    index.write_bytes(bytes(data))
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.INDEX)
    assert finding.offset == relative - 1 and f"whose last offset is {relative}" in finding.what


def test_a_time_index_entry_that_disagrees_is_named(log_dir: Path) -> None:
    index = log_dir / file_name(0, ".timeindex")
    data = bytearray(index.read_bytes())
    timestamp, relative = struct.unpack_from(">qi", data, 0)
    struct.pack_into(">qi", data, 0, timestamp - 1, relative)
    index.write_bytes(bytes(data))
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.INDEX)
    assert finding.file == index.name and finding.offset == relative
    assert f"max timestamp {timestamp}" in finding.what


def test_an_index_that_does_not_decode_is_named(log_dir: Path) -> None:
    index = log_dir / file_name(0, ".index")
    index.write_bytes(index.read_bytes() + b"\x00")
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.INDEX)
    assert finding.file == index.name and "whole" in finding.what


def test_an_epoch_checkpoint_that_disagrees_with_the_batches_is_named(log_dir: Path) -> None:
    checkpoint = log_dir / CHECKPOINT_FILE_NAME
    checkpoint.write_bytes(encode_checkpoint((EpochEntry(1, 0), EpochEntry(2, 25))))
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.EPOCH_CHECKPOINT)
    assert finding.offset == 25
    assert "epoch 2 from 25" in finding.what and "epoch 2 from 24" in finding.what
    # A new leader's entry at the log end, before any batch of its epoch, is
    # not a disagreement (KIP-279).
    entries = (EpochEntry(1, 0), EpochEntry(2, 24), EpochEntry(3, 48), EpochEntry(5, 60))
    checkpoint.write_bytes(encode_checkpoint(entries))
    assert check(OsDirectory(log_dir)) == []
    checkpoint.write_bytes(b"0\n2\n1 0\n")
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.EPOCH_CHECKPOINT)
    assert "line" in finding.what
    checkpoint.unlink()
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.EPOCH_CHECKPOINT)
    assert "missing" in finding.what


def test_offsets_that_leave_a_gap_between_segments(log_dir: Path) -> None:
    names = sorted(p.name for p in log_dir.glob("*.log"))

    def remove(name: str) -> None:
        for suffix in (".log", ".index", ".timeindex"):
            (log_dir / (name[:20] + suffix)).unlink()

    # Offsets 27 to 38, inside epoch 2.
    remove(names[2])
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.OFFSETS)
    assert finding.file == names[3] and finding.offset == 39 and "gap" in finding.what
    # A compacted log may leave gaps (the cleaner removed whole batches),
    # also where an epoch started (the cache keeps its start).
    (log_dir / CLEANER_OFFSET_FILE).write_bytes(b"0\n0\n")
    assert check(OsDirectory(log_dir)) == []
    remove(names[1])
    assert check(OsDirectory(log_dir)) == []
    # Not one outside its epoch's span.
    checkpoint = log_dir / CHECKPOINT_FILE_NAME
    checkpoint.write_bytes(encode_checkpoint((EpochEntry(1, 0), EpochEntry(2, 10))))
    (finding,) = _only(check(OsDirectory(log_dir)), FindingKind.EPOCH_CHECKPOINT)


def test_offsets_that_go_back_are_named(log_dir: Path) -> None:
    segment = log_dir / file_name(0, ".log")
    second = dump_segment(OsDirectory(log_dir), segment.name).batches[1]
    data = bytearray(segment.read_bytes())
    # The base offset is outside the CRC: only the offsets show it.
    struct.pack_into(">q", data, second.position, 0)
    segment.write_bytes(bytes(data))
    findings = check(OsDirectory(log_dir))
    offsets = [f for f in findings if f.kind is FindingKind.OFFSETS]
    assert offsets[0].position == second.position and "below the expected 3" in offsets[0].what


def test_a_damaged_snapshot_and_a_stray_file_are_named(log_dir: Path) -> None:
    snapshot = sorted(log_dir.glob("*.snapshot"))[0]
    _flip(snapshot, 10)
    (log_dir / "notes.txt").write_text("hello")
    findings = check(OsDirectory(log_dir))
    kinds = {f.kind: f for f in findings}
    assert set(kinds) == {FindingKind.SNAPSHOT, FindingKind.UNKNOWN_FILE}
    assert kinds[FindingKind.SNAPSHOT].file == snapshot.name
    assert "CRC" in kinds[FindingKind.SNAPSHOT].what
    assert kinds[FindingKind.UNKNOWN_FILE].file == "notes.txt"


def test_pending_files_of_deletion_and_compaction_are_part_of_a_log(log_dir: Path) -> None:
    for name in (
        file_name(0, ".log.deleted"),
        file_name(0, ".log.cleaned"),
        file_name(0, ".log.swap"),
        "leader-epoch-checkpoint.tmp",
    ):
        (log_dir / name).write_bytes(b"")
    assert check(OsDirectory(log_dir)) == []
    assert file_name(0, ".log.swap") in dump(OsDirectory(log_dir)).other_files


def test_a_single_segment_is_checked_with_its_indexes(log_dir: Path) -> None:
    name = file_name(0, ".log")
    assert check(OsDirectory(log_dir), name) == []
    _flip(log_dir / name, 40)
    (finding,) = check(OsDirectory(log_dir), name)
    assert finding.kind is FindingKind.CORRUPT_BATCH and finding.position == 0


def test_what_is_not_a_log_is_refused(tmp_path: Path, log_dir: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for call in (lambda: check(OsDirectory(empty)), lambda: dump(OsDirectory(empty))):
        with pytest.raises(PartitionLogError, match="not a partition directory"):
            call()
    for name in ("leader-epoch-checkpoint", "00000000000000000000.index", "1.log"):
        with pytest.raises(PartitionLogError, match="not a segment file"):
            dump_segment(OsDirectory(log_dir), name)
    with pytest.raises(PartitionLogError, match="not a segment file"):
        check(OsDirectory(log_dir), file_name(999, ".log"))


def test_a_segment_read_in_chunks_gives_the_same_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p-0"
    write_log(path, batches=6)
    whole = dump(OsDirectory(path))
    import partition_log.inspect as inspect_module

    # Chunks smaller than a batch: each batch crosses a chunk's end.
    monkeypatch.setattr(inspect_module, "CHUNK_BYTES", 50)
    assert dump(OsDirectory(path)) == whole
    assert check(OsDirectory(path)) == []
    damaged = path / file_name(0, ".log")
    _flip(damaged, 106 + 70)
    (finding,) = check(OsDirectory(path))
    assert finding.kind is FindingKind.CORRUPT_BATCH and finding.position == 106


# -- no finding on any log the log itself leaves ---------------------------------

HISTORY = st.lists(
    st.one_of(
        st.tuples(st.just("leader"), st.integers(1, 4), st.booleans(), st.integers(0, 60)),
        st.tuples(st.just("follower"), st.integers(1, 4), st.booleans(), st.integers(0, 60)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("new_leader")),
        st.tuples(st.just("delete_records"), st.floats(0, 1), st.booleans()),
        st.tuples(st.just("reopen"), st.booleans()),
        st.tuples(st.just("crash"), st.integers(0, 2**32)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(HISTORY, st.booleans())
def test_check_finds_nothing_in_any_log_the_log_leaves(
    history: list[tuple[object, ...]], flush: bool
) -> None:
    """Appends (leader and follower, new epochs), a new leader's epoch at the
    log end, DeleteRecords, truncations, rolls, clean reopenings and power losses with torn
    writes, on the twin: once the log is closed, check finds nothing and dump
    shows exactly the batches the log reads (no false finding on a log the
    log wrote)."""
    config = LogConfig(
        segment_bytes=400, index_interval_bytes=90, flush_messages=1 if flush else None
    )
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, config, now_ms=0)
    now = 0
    for operation in history:
        now += 10
        kind = operation[0]
        if kind in ("leader", "follower"):
            _, count, new_epoch, size = operation
            epoch = max(log.epoch_cache.latest_epoch, 0) + int(bool(new_epoch))
        if kind == "leader":
            records = [Record(i, now, b"k", b"v" * int(str(size))) for i in range(int(str(count)))]
            log.append_as_leader(build_batch(records), epoch, now_ms=now)
        elif kind == "follower":
            base = log.log_end_offset
            records = [
                Record(base + i, now, None, b"f" * int(str(size))) for i in range(int(str(count)))
            ]
            data = build_batch(records, base_offset=base, partition_leader_epoch=epoch)
            log.append_as_follower(data, now_ms=now)
        elif kind == "truncate":
            start, end = log.log_start_offset, log.log_end_offset
            log.truncate_to(start + int(float(str(operation[1])) * (end - start)))
        elif kind == "new_leader":
            # KIP-279: the epoch's entry at the log end, before any batch.
            log.maybe_assign_epoch_start_offset(max(log.epoch_cache.latest_epoch, 0) + 1)
        elif kind == "delete_records":
            # DeleteRecords up to the high watermark, maybe inside a batch;
            # the files of deleted segments removed now or left .deleted.
            target = int(float(str(operation[1])) * log.log_end_offset)
            log.maybe_increment_high_watermark(target)
            log.delete_records(target, now_ms=now)
            if operation[2]:
                log.maybe_remove_deleted(now + 10**9)
        elif kind == "reopen":
            log.close()
            log = PartitionLog.open(directory, config, now_ms=now)
        elif kind == "crash":
            directory.crash(random.Random(str(operation[1])))
            log = PartitionLog.open(directory, config, now_ms=now)
    batches: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        views = split_batches(log.read(offset, 1 << 20))
        batches.extend(bytes(v) for v in views)
        offset = BatchHeader.parse(views[-1]).next_offset
    log.close()
    assert check(directory) == [], [str(f) for f in check(directory)]
    dumped = dump(directory, records=True, indexes=True, state=True)
    # The log reads from the batch holding its start; batches wholly below it
    # may still be in the first segment.
    headers = [b.header for s in dumped.segments for b in s.batches]
    visible = [h for h in headers if h.next_offset > log.log_start_offset]
    assert visible == [BatchHeader.parse(b) for b in batches]
    assert all(b.crc_valid and b.records is not None for s in dumped.segments for b in s.batches)


def test_offset_checkpoints_that_do_not_decode_or_pass_the_end(log_dir: Path) -> None:
    end = sum(1 for _ in range(20)) * 3
    (log_dir / LOG_START_OFFSET_FILE).write_bytes(b"0\n%d\n" % (end + 1))
    (log_dir / RECOVERY_POINT_FILE).write_bytes(b"0\n%d\n" % (end + 5))
    (log_dir / CLEANER_OFFSET_FILE).write_bytes(b"1\n0\n")
    findings = _only(check(OsDirectory(log_dir)), FindingKind.CHECKPOINT)
    named = {f.file: f for f in findings}
    assert set(named) == {LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE, CLEANER_OFFSET_FILE}
    assert named[RECOVERY_POINT_FILE].what == f"offset {end + 5} is past the log end {end}"
    assert named[LOG_START_OFFSET_FILE].offset == end + 1
    assert "not an offset checkpoint" in named[CLEANER_OFFSET_FILE].what
    (log_dir / CLEANER_OFFSET_FILE).unlink()
    (log_dir / LOG_START_OFFSET_FILE).write_bytes(b"0\n0\n")
    (log_dir / RECOVERY_POINT_FILE).write_bytes(b"0\n%d\n" % end)
    assert check(OsDirectory(log_dir)) == []


def test_a_log_compacted_by_the_cleaner_has_no_finding(tmp_path: Path) -> None:
    """Compaction leaves gaps in the offsets and may remove an epoch's first
    batches; check takes both as a compacted log's (the cleaner checkpoint
    says it is one), and still finds a gap where offsets are missing."""
    path = tmp_path / "p-0"
    path.mkdir()
    config = LogConfig(
        segment_bytes=200,
        index_interval_bytes=90,
        cleanup_policy=CleanupPolicy.COMPACT,
        file_delete_delay_ms=0,
    )
    log = PartitionLog.open(OsDirectory(path), config, now_ms=0)
    for i in range(24):
        records = [Record(0, i, b"a", b"%d" % i), Record(1, i, b"b%d" % (i % 3), b"x")]
        log.append_as_leader(build_batch(records), i // 5, now_ms=i)
        log.maybe_increment_high_watermark(log.log_end_offset)
    assert LogCleaner({"p": log}).maybe_clean(1000)
    log.close()
    segments = dump(OsDirectory(path)).segments
    offsets = [b.header.base_offset for s in segments for b in s.batches]
    assert offsets and offsets != list(range(0, 2 * len(offsets), 2))  # gaps
    assert check(OsDirectory(path)) == []
    assert [f.kind for f in check(OsDirectory(path), compacted=False)].count(FindingKind.OFFSETS)


def _txn_log(directory: MemoryDirectory) -> tuple[int, int]:
    """A log of one aborted transaction and a later segment; its marker's
    offset and the second segment's base."""
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    data = build_batch(
        _records(0), producer_id=7, producer_epoch=0, base_sequence=0, transactional=True
    )
    log.append_as_leader(data, 0, 1000)
    end = build_marker_batch(7, 0, EndTxnMarker(ControlType.ABORT, 0), 1000)
    marker = log.append_as_leader(end, 0, 1000, origin=AppendOrigin.COORDINATOR).first_offset
    while len(log.segment_base_offsets) < 2:
        log.append_as_leader(build_batch(_records(1)), 0, 1000)
    log.close()
    return marker, log.segment_base_offsets[1]


def _rewrite(directory: MemoryDirectory, name: str, data: bytes) -> None:
    directory.delete(name)
    handle = directory.create(name)
    handle.append(data)
    handle.close()


def test_a_damaged_txn_index_is_named() -> None:
    directory = MemoryDirectory()
    marker, second = _txn_log(directory)
    assert check(directory) == []
    name = file_name(0, ".txnindex")
    good = read_whole(directory, name)
    assert len(good) == 34
    _rewrite(directory, name, good[:-1])
    (finding,) = _only(check(directory), FindingKind.INDEX)
    assert finding.file == name and "whole number of 34-byte entries" in finding.what
    # An entry whose marker lies past the segment, then one in the next
    # segment's index below its base.
    past = encode_entry(AbortedTxn(7, 0, second, second + 1))
    _rewrite(directory, name, good + past)
    (finding,) = _only(check(directory), FindingKind.INDEX)
    assert finding.file == name and finding.offset == second
    assert f"outside the segment's offsets [0, {second})" in finding.what
    _rewrite(directory, name, good)
    later = file_name(second, ".txnindex")
    _rewrite(directory, later, encode_entry(AbortedTxn(7, 0, marker, marker + 1)))
    (finding,) = _only(check(directory), FindingKind.INDEX)
    assert finding.file == later and finding.offset == marker

"""Opening after an unclean shutdown reads each recovered batch once: the
epoch cache and the producer state are rebuilt from the headers the
recovery scan hands over (Kafka's ``LogSegment.recover`` with the producer
state manager and the epoch cache), and they equal what the separate
derivations (from the batches, from a snapshot plus the batches after it)
give, whichever snapshot, checkpoint and log start the directory holds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from partition_log.batch import HEADER_SIZE, BatchHeader, build_batch
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, LeaderEpochCache, derive
from partition_log.files import MemoryDirectory, MemoryFile
from partition_log.log import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    SNAPSHOT_SUFFIX,
    LogConfig,
    PartitionLog,
)
from partition_log.log_files import encode_offset
from partition_log.producer_state import ProducerStateManager
from partition_log.records import Record
from partition_log.segment import LOG_SUFFIX, file_name

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def _batch(base: int, epoch: int, producer: int, sequence: int, count: int = 3) -> bytes:
    records = [Record(base + i, 1000 + base, b"k%d" % (base + i), b"v" * 20) for i in range(count)]
    return build_batch(
        records,
        base_offset=base,
        partition_leader_epoch=epoch,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=sequence if producer >= 0 else -1,
    )


def _fill(log: PartitionLog, batches: int, *, first_epoch: int = 0) -> None:
    """Follower appends: epochs changing every 7 batches, two idempotent
    producers and batches without one taking turns."""
    sequences = {7: 0, 8: 0}
    for i in range(batches):
        producer = (7, 8, -1)[i % 3]
        sequence = sequences.get(producer, -1)
        end = log.log_end_offset
        log.append_as_follower(_batch(end, first_epoch + i // 7, producer, sequence))
        if producer >= 0:
            sequences[producer] += 3


def _crash_state(directory: MemoryDirectory, recovery_point: int | None = None) -> None:
    """As after kill -9 (the bytes stay; the marker is absent), with the
    recovery point moved down if given."""
    if directory.exists(CLEAN_SHUTDOWN_FILE):
        directory.delete(CLEAN_SHUTDOWN_FILE)
    if recovery_point is not None:
        handle = directory.create(RECOVERY_POINT_FILE + ".new")
        handle.append(encode_offset(recovery_point))
        handle.close()
        directory.rename(RECOVERY_POINT_FILE + ".new", RECOVERY_POINT_FILE)


def _open(directory: MemoryDirectory) -> PartitionLog:
    return PartitionLog.open(directory, CONFIG, now_ms=0)


def _assert_derivations(log: PartitionLog) -> None:
    # The cache derived from every batch in the segments, cut at the log
    # start (LeaderEpochFileCache.truncateFromStart moves the entry holding
    # it up to it).
    headers = log._headers_from(log.segments[0].base_offset)
    entries = derive((h.base_offset, h.partition_leader_epoch) for h in headers).entries
    derived = LeaderEpochCache(entries).truncate_from_start(log.log_start_offset)
    assert log.epoch_cache == derived
    assert log.producer_state == log._rebuild_producer_state(log.log_end_offset)


@pytest.fixture
def log_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Bytes read from each ``.log`` file while the fixture is in use."""
    counts: dict[str, int] = {}
    original = MemoryFile.read

    def read(self: MemoryFile, position: int, size: int) -> bytes:
        data = original(self, position, size)
        if self.name.endswith(LOG_SUFFIX):
            counts[self.name] = counts.get(self.name, 0) + len(data)
        return data

    monkeypatch.setattr(MemoryFile, "read", read)
    yield counts


def test_a_recovery_from_the_start_reads_each_batch_once(log_reads: dict[str, int]) -> None:
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 120)
    log.flush(0)
    end, cache = log.log_end_offset, log.epoch_cache
    producers = log.producer_state
    sizes = {file_name(s.base_offset, LOG_SUFFIX): s.size for s in log.segments}
    assert len(sizes) > 5
    # Nothing to start from: recovery point 0, no snapshot, no checkpoint.
    _crash_state(directory, 0)
    for name in directory.list():
        if name.endswith(SNAPSHOT_SUFFIX) or name == CHECKPOINT_FILE_NAME:
            directory.delete(name)
    log_reads.clear()
    reopened = _open(directory)
    assert not reopened.recovery.clean and reopened.recovery.recovered_from == 0
    # Each segment's log read once, whole, and its first header again for
    # the segment's age (three times before: recovery, then the epoch
    # cache, then the producer state).
    assert log_reads == {name: size + HEADER_SIZE for name, size in sizes.items()}
    assert reopened.log_end_offset == end
    assert reopened.epoch_cache == cache
    assert reopened.producer_state == producers
    _assert_derivations(reopened)


def test_segments_below_the_recovery_point_are_not_rescanned(log_reads: dict[str, int]) -> None:
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 120)
    # The roll's snapshot and the epoch checkpoint cover the older segments.
    bases = log.segment_base_offsets
    log_reads.clear()
    _crash_state(directory)
    reopened = _open(directory)
    assert reopened.recovery.recovered_from == bases[-1]
    active = file_name(bases[-1], LOG_SUFFIX)
    older = {name: n for name, n in log_reads.items() if name != active}
    # An older segment is opened from its index: only the tail past its
    # last entry is read (at most an index interval and a batch).
    assert all(n < 2 * CONFIG.index_interval_bytes + 200 for n in older.values()), older
    assert log_reads[active] == reopened.segments[-1].size + HEADER_SIZE
    _assert_derivations(reopened)


def test_a_snapshot_inside_the_active_segment_is_the_replay_start() -> None:
    # Close (snapshot at the end, recovery point there), reopen, append on,
    # crash: the snapshot lies inside the segment recovered.
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 40)
    log.close()
    log = _open(directory)
    _fill(log, 5, first_epoch=9)
    end, producers = log.log_end_offset, log.producer_state
    _crash_state(directory)
    reopened = _open(directory)
    assert reopened.recovery.recovered_from < reopened.recovery_point
    assert reopened.log_end_offset == end
    assert reopened.producer_state == producers
    _assert_derivations(reopened)


def test_a_log_start_inside_a_batch_is_where_the_replay_starts() -> None:
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 60)
    log.maybe_increment_high_watermark(log.log_end_offset)
    log.delete_records(log.segment_base_offsets[2] + 4)
    _crash_state(directory, 0)
    for name in directory.list():
        if name.endswith(SNAPSHOT_SUFFIX) or name == CHECKPOINT_FILE_NAME:
            directory.delete(name)
    reopened = _open(directory)
    assert reopened.log_start_offset == log.log_start_offset
    _assert_derivations(reopened)


def test_a_readable_snapshot_past_the_recovery_point_is_still_the_one_used() -> None:
    # A truncation lowers the recovery point before it removes the snapshots
    # past its end: a crash between leaves a snapshot above the recovery
    # point, which the open uses if the log still reaches it (as
    # _rebuild_producer_state chooses). This one, written by hand, holds no
    # producer, so starting from any earlier one would give another state.
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 40)
    log.close()
    log = _open(directory)
    _fill(log, 6)
    at = log.log_end_offset - 6
    handle = directory.create(file_name(at, SNAPSHOT_SUFFIX))
    handle.append(ProducerStateManager(map_end_offset=at).snapshot())
    handle.close()
    _crash_state(directory)
    reopened = _open(directory)
    assert reopened.recovery_point == reopened.log_end_offset
    expected = ProducerStateManager(map_end_offset=at)
    for header in [h for h in _all_headers(reopened) if h.base_offset >= at]:
        from partition_log.log import _producer_batch

        expected.update(_producer_batch(header))
    assert reopened.producer_state == expected
    _assert_derivations(reopened)


def test_a_cut_below_the_log_start_derives_both_again() -> None:
    # The unflushed tail holding the log start is lost: the start comes down
    # to the end, and the cache and producer state are derived from there.
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 30)
    log.flush(0)
    _fill(log, 3)
    log.maybe_increment_high_watermark(log.log_end_offset)
    log.delete_records(log.log_end_offset - 1)
    directory.crash()
    reopened = _open(directory)
    assert reopened.log_start_offset == reopened.log_end_offset
    _assert_derivations(reopened)


def _all_headers(log: PartitionLog) -> list[BatchHeader]:
    from tests.partition_log.test_log import all_batches

    return all_batches(log)


@pytest.mark.parametrize("remove", [CHECKPOINT_FILE_NAME, SNAPSHOT_SUFFIX])
def test_without_a_checkpoint_or_snapshot_the_older_segments_are_replayed(remove: str) -> None:
    # The recovery point in the active segment, but the epoch checkpoint or
    # every snapshot gone: the batches of the segments not recovered are
    # read for them before the recovered ones.
    directory = MemoryDirectory()
    log = _open(directory)
    _fill(log, 90)
    end, cache, producers = log.log_end_offset, log.epoch_cache, log.producer_state
    _crash_state(directory)
    for name in directory.list():
        if name.endswith(remove):
            directory.delete(name)
    reopened = _open(directory)
    assert reopened.recovery.recovered_from == log.segment_base_offsets[-1] > 0
    assert reopened.log_end_offset == end
    assert reopened.epoch_cache == cache
    assert reopened.producer_state == producers
    _assert_derivations(reopened)

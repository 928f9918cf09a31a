"""Retention and DeleteRecords (Kafka's ``UnifiedLog.deleteOldSegments`` and
``deleteRecords``): by time, by size and by log start offset, never at or
above the high watermark; the log start offset inside a segment,
checkpointed and clamped on open; deletion in two phases that a restart
completes, with a crash at every step; the cleaner's checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.log_files import (
    CLEANER_OFFSET_FILE,
    LOG_START_OFFSET_FILE,
    decode_offset,
    encode_offset,
    read_whole,
    write_atomically,
)
from partition_log.os_files import OsDirectory
from partition_log.segment import file_name
from tests.partition_log.log_util import (
    Crash,
    CrashingDirectory,
    batch,
    files,
    offsets_of,
    read_batches,
)

DAY = 24 * 3600 * 1000
SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=1000)


def filled(
    directory: FileDirectory,
    config: LogConfig = SMALL,
    *,
    count: int = 20,
    timestamp: int = 1000,
    step_ms: int = 0,
) -> PartitionLog:
    """A log of ``count`` one-record batches over several segments, the
    i-th with timestamp ``timestamp + i * step_ms``, all committed."""
    log = PartitionLog.open(directory, config, now_ms=0)
    for i in range(count):
        log.append_as_leader(batch(timestamp=timestamp + i * step_ms), 0, 0)
    log.maybe_increment_high_watermark(log.log_end_offset)
    log.flush(0)
    return log


@pytest.fixture(params=["memory", "os"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> FileDirectory:
    if request.param == "memory":
        return MemoryDirectory()
    (tmp_path / "p-0").mkdir()
    return OsDirectory(tmp_path / "p-0")


def deleted_files(directory: FileDirectory) -> list[str]:
    return [name for name in directory.list() if name.endswith(".deleted")]


# -- retention by time -----------------------------------------------------------


def test_time_retention_deletes_segments_past_retention_ms(directory: FileDirectory) -> None:
    config = LogConfig(
        segment_bytes=400, index_interval_bytes=100, retention_ms=DAY, file_delete_delay_ms=1000
    )
    # One batch a minute: each segment's largest timestamp is its last batch's.
    log = filled(directory, config, step_ms=60_000)
    segments = log.segments
    assert len(segments) >= 4
    before = read_batches(log)
    # At exactly retention.ms past the second segment's largest timestamp it
    # stays (Kafka: strictly more than retention.ms).
    now = segments[1].max_timestamp + DAY
    assert log.maybe_delete_segments(now)
    assert log.segment_base_offsets[0] == segments[1].base_offset
    assert log.log_start_offset == segments[1].base_offset
    assert decode_offset(LOG_START_OFFSET_FILE, read_whole(directory, LOG_START_OFFSET_FILE)) == (
        segments[1].base_offset
    )
    assert not log.maybe_delete_segments(now)
    assert log.maybe_delete_segments(now + 1)
    assert log.log_start_offset == segments[2].base_offset
    # What is left reads as before; below the start is out of range.
    start = log.log_start_offset
    assert read_batches(log) == before[start:]
    with pytest.raises(PartitionLogError) as raised:
        log.read(start - 1, 1000)
    assert raised.value.code is Errors.OFFSET_OUT_OF_RANGE
    # Two phases: renamed .deleted, removed file.delete.delay.ms later.
    gone = [file_name(s.base_offset, ".log") for s in segments[:2]]
    assert all(name not in directory.list() for name in gone)
    assert sorted(deleted_files(directory)) == sorted(log.pending_deletions)
    assert {name + ".deleted" for name in gone} <= set(deleted_files(directory))
    assert not log.maybe_remove_deleted(now + 999)
    assert log.maybe_remove_deleted(now + 1001)
    assert deleted_files(directory) == []
    assert log.pending_deletions == []


def test_time_retention_off_or_without_delete_policy_keeps_old_segments() -> None:
    for config in (
        LogConfig(segment_bytes=400, retention_ms=-1),
        LogConfig(segment_bytes=400, retention_ms=1, cleanup_policy=CleanupPolicy.COMPACT),
    ):
        log = filled(MemoryDirectory(), config)
        count = len(log.segments)
        assert not log.maybe_delete_segments(10 * DAY)
        assert len(log.segments) == count
        assert log.log_start_offset == 0


def test_compact_and_delete_policy_deletes_by_time() -> None:
    config = LogConfig(
        segment_bytes=400,
        retention_ms=DAY,
        cleanup_policy=CleanupPolicy.COMPACT | CleanupPolicy.DELETE,
    )
    log = filled(MemoryDirectory(), config, step_ms=60_000)
    first = log.segments[0]
    assert log.maybe_delete_segments(first.max_timestamp + DAY + 1)
    assert log.log_start_offset == log.segments[0].base_offset > first.base_offset


def test_retention_never_deletes_at_or_above_the_high_watermark() -> None:
    config = LogConfig(segment_bytes=400, retention_ms=DAY)
    log = PartitionLog.open(MemoryDirectory(), config, now_ms=0)
    for _ in range(20):
        log.append_as_leader(batch(), 0, 0)
    segments = log.segments
    # The high watermark inside the third segment: only the first two go.
    log.maybe_increment_high_watermark(segments[2].base_offset + 1)
    assert log.maybe_delete_segments(100 * DAY)
    assert log.segment_base_offsets[0] == segments[2].base_offset
    # At the third's end (the fourth's base) it may go too.
    log.maybe_increment_high_watermark(segments[3].base_offset)
    assert log.maybe_delete_segments(100 * DAY)
    assert log.segment_base_offsets[0] == segments[3].base_offset
    assert not log.maybe_delete_segments(100 * DAY)


def test_retention_rolls_before_deleting_every_segment() -> None:
    config = LogConfig(segment_bytes=400, retention_ms=DAY)
    log = filled(MemoryDirectory(), config)
    end = log.log_end_offset
    before = log.segment_base_offsets
    assert log.maybe_delete_segments(100 * DAY)
    # Kafka's rule: a log keeps one segment, so an empty one is rolled first.
    assert log.segment_base_offsets == [end]
    assert log.log_start_offset == log.log_end_offset == end
    assert log.size == 0
    assert all(file_name(b, ".log") not in log.directory.list() for b in before)
    # An empty active segment is never deleted.
    assert not log.maybe_delete_segments(200 * DAY)
    assert log.segment_base_offsets == [end]
    log.append_as_leader(batch(), 0, 0)
    assert log.log_end_offset == end + 1


def test_an_empty_active_segment_is_kept_and_not_rolled_again() -> None:
    # Truncated to the active segment's base: older segments and an empty
    # active one. retention.bytes=0 takes every older segment, and the empty
    # active one stays (no roll: it would be at the same offset).
    config = LogConfig(segment_bytes=400, retention_bytes=0, retention_ms=-1)
    log = filled(MemoryDirectory(), config)
    bases = log.segment_base_offsets
    log.truncate_to(bases[-1])
    assert log.segments[-1].size == 0
    assert log.maybe_delete_segments(0)
    assert log.segment_base_offsets == [bases[-1]]
    assert log.log_start_offset == log.log_end_offset == bases[-1]
    assert not log.maybe_delete_segments(0)


def test_a_compacted_log_still_deletes_segments_below_its_start() -> None:
    directory = MemoryDirectory()
    config = LogConfig(segment_bytes=400, cleanup_policy=CleanupPolicy.COMPACT, retention_ms=1)
    log = filled(directory, config)
    bases = log.segment_base_offsets
    log.close()
    # A start checkpointed past two segments whose deletion did not happen.
    write_atomically(directory, LOG_START_OFFSET_FILE, encode_offset(bases[2] + 1))
    log = PartitionLog.open(directory, config, now_ms=0, high_watermark=20)
    assert log.segment_base_offsets == bases
    assert log.maybe_delete_segments(100 * DAY)
    assert log.segment_base_offsets == bases[2:]
    assert log.log_start_offset == bases[2] + 1
    assert not log.maybe_delete_segments(100 * DAY)


def test_a_segment_without_timestamps_is_kept_by_time_retention() -> None:
    config = LogConfig(segment_bytes=400, retention_ms=DAY)
    log = filled(MemoryDirectory(), config, timestamp=-1)
    assert log.segments[0].max_timestamp == -1
    assert not log.maybe_delete_segments(100 * DAY)


# -- retention by size -----------------------------------------------------------


def test_size_retention_keeps_at_least_retention_bytes() -> None:
    probe = filled(MemoryDirectory())
    sizes = [s.size for s in probe.segments]
    total = sum(sizes)
    # A byte more than all but the first two: only the first goes.
    limit = total - sizes[0] - sizes[1] + 1
    config = LogConfig(segment_bytes=400, retention_bytes=limit, retention_ms=-1)
    log = filled(MemoryDirectory(), config)
    assert log.maybe_delete_segments(0)
    assert log.segment_base_offsets == probe.segment_base_offsets[1:]
    assert log.size >= limit
    assert log.size - log.segments[0].size < limit
    assert not log.maybe_delete_segments(0)
    # Exactly the size left after two: both go.
    config = LogConfig(segment_bytes=400, retention_bytes=limit - 1, retention_ms=-1)
    log = filled(MemoryDirectory(), config)
    assert log.maybe_delete_segments(0)
    assert log.segment_base_offsets == probe.segment_base_offsets[2:]
    assert log.size == limit - 1


def test_size_retention_off_or_not_exceeded_deletes_nothing() -> None:
    for limit in (-1, 1 << 40):
        config = LogConfig(segment_bytes=400, retention_bytes=limit, retention_ms=-1)
        log = filled(MemoryDirectory(), config)
        assert not log.maybe_delete_segments(0)


# -- DeleteRecords and the log start offset --------------------------------------


def test_delete_records_inside_a_segment(directory: FileDirectory) -> None:
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for i in range(20):
        log.append_as_leader(batch(producer=7 if i < 2 else 8, producer_epoch=0, sequence=i), 0, 0)
    log.maybe_assign_epoch_start_offset(3)
    for _ in range(2):
        log.append_as_leader(batch(), 3, 0)
    log.maybe_increment_high_watermark(log.log_end_offset)
    before = read_batches(log)
    bases = log.segment_base_offsets
    assert log.delete_records(2) == 2
    assert log.log_start_offset == 2
    assert log.segment_base_offsets == bases  # the first segment still holds 2
    assert read_batches(log) == before[2:]
    with pytest.raises(PartitionLogError) as raised:
        log.read(1, 1000)
    assert raised.value.code is Errors.OFFSET_OUT_OF_RANGE
    assert "[2, 22]" in str(raised.value)
    # The epoch cache and the producer state follow the start.
    assert log.epoch_cache.entries[0].start_offset == 2
    assert log.producer_state.entry(7) is None
    assert log.producer_state.entry(8) is not None
    # An offset at or below the start changes nothing.
    assert log.delete_records(1) == 2
    # Kept across a clean and an unclean reopening.
    log.close()
    log = PartitionLog.open(directory, SMALL, now_ms=0, high_watermark=22)
    assert log.log_start_offset == 2
    assert read_batches(log) == before[2:]
    assert log.epoch_cache.entries[0].start_offset == 2
    assert log.producer_state.entry(7) is None
    log.flush(0)
    if isinstance(directory, MemoryDirectory):
        directory.crash()
        log = PartitionLog.open(directory, SMALL, now_ms=0)
        assert log.log_start_offset == 2
        assert read_batches(log) == before[2:]
        assert log.producer_state.entry(7) is None


def test_delete_records_across_segments_deletes_the_segments_below() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    before = read_batches(log)
    segments = log.segments
    target = segments[2].base_offset + 1
    assert log.delete_records(target, now_ms=5000) == target
    assert log.segment_base_offsets[0] == segments[2].base_offset
    assert read_batches(log) == before[target:]
    assert len(deleted_files(directory)) >= 6  # two segments' three files
    assert not log.maybe_remove_deleted(5999)
    assert log.maybe_remove_deleted(6000)
    assert deleted_files(directory) == []
    # Retention finds nothing more below the start.
    assert not log.maybe_delete_segments(6000)


def test_delete_records_never_above_the_high_watermark() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    for _ in range(10):
        log.append_as_leader(batch(), 0, 0)
    log.maybe_increment_high_watermark(6)
    before = files(directory)
    with pytest.raises(PartitionLogError) as raised:
        log.delete_records(7)
    assert raised.value.code is Errors.OFFSET_OUT_OF_RANGE
    assert "7" in str(raised.value) and "high watermark 6" in str(raised.value)
    with pytest.raises(PartitionLogError, match="negative"):
        log.delete_records(-1)
    assert files(directory) == before
    assert log.log_start_offset == 0
    assert log.delete_records(6) == 6


def test_the_log_start_checkpoint_is_clamped_into_the_log_on_open() -> None:
    directory = MemoryDirectory()
    log = filled(directory, count=10)
    end = log.log_end_offset
    log.close()
    write_atomically(directory, LOG_START_OFFSET_FILE, encode_offset(end + 50))
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    assert log.log_start_offset == end
    log.close()
    # Below the first segment (its segments deleted since): the first base.
    write_atomically(directory, LOG_START_OFFSET_FILE, encode_offset(0))
    log = PartitionLog.open(directory, SMALL, now_ms=0, high_watermark=end)
    assert log.log_start_offset == 0
    first = log.segments[1].base_offset
    log.delete_records(first + 1)
    log.close()
    write_atomically(directory, LOG_START_OFFSET_FILE, encode_offset(0))
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    assert log.log_start_offset == first
    log.close()
    write_atomically(directory, LOG_START_OFFSET_FILE, b"nonsense")
    with pytest.raises(PartitionLogError, match=LOG_START_OFFSET_FILE):
        PartitionLog.open(directory, SMALL, now_ms=0)


def test_truncation_below_the_start_lowers_it_to_the_new_end() -> None:
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    log.append_as_leader(batch(), 0, 0)
    log.append_as_leader(batch(3), 0, 0)  # offsets 1..3
    log.maybe_increment_high_watermark(4)
    log.delete_records(2)
    # The batch holding the start goes whole (UnifiedLog.truncateTo).
    assert log.truncate_to(2) == 1
    assert log.log_start_offset == 1
    assert (
        decode_offset(LOG_START_OFFSET_FILE, read_whole(log.directory, LOG_START_OFFSET_FILE)) == 1
    )
    with pytest.raises(PartitionLogError, match="below the log start offset 1"):
        log.truncate_to(0)


# -- the two phases across restarts ----------------------------------------------


def test_deleted_files_left_at_close_are_removed_on_open() -> None:
    directory = MemoryDirectory()
    config = LogConfig(segment_bytes=400, retention_ms=DAY, file_delete_delay_ms=DAY)
    log = filled(directory, config, step_ms=60_000)
    log.maybe_delete_segments(log.segments[1].max_timestamp + DAY + 1)
    assert deleted_files(directory)
    kept = read_batches(log)
    log.close()
    log = PartitionLog.open(directory, config, now_ms=0)
    assert deleted_files(directory) == []
    assert log.recovery.interrupted.removed
    assert read_batches(log) == kept


def test_a_crash_at_every_step_of_retention_leaves_the_old_or_the_new_log() -> None:
    config = LogConfig(
        segment_bytes=400, index_interval_bytes=100, retention_ms=DAY, file_delete_delay_ms=0
    )

    def attempt(budget: int) -> tuple[bool, PartitionLog, list[bytes], int, int]:
        memory = MemoryDirectory()
        crashing = CrashingDirectory(memory)
        log = filled(crashing, config, step_ms=60_000)
        before = read_batches(log)
        old_start = log.log_start_offset
        now = log.segments[2].max_timestamp + DAY + 1
        crashing.arm(budget)
        try:
            log.maybe_delete_segments(now)
            done = True
        except Crash:
            done = False
        new_start = log.segments[0].base_offset if done else -1
        memory.crash(random.Random(budget))  # with a torn unsynced tail
        reopened = PartitionLog.open(memory, config, now_ms=now)
        assert all(not n.endswith((".deleted", ".tmp")) for n in memory.list())
        assert reopened.log_start_offset >= old_start
        # The same batches from wherever it starts, offsets unchanged.
        assert read_batches(reopened) == before[reopened.log_start_offset :]
        # Retention run again finishes the job.
        reopened.maybe_increment_high_watermark(reopened.log_end_offset)
        reopened.maybe_delete_segments(now)
        return done, reopened, before, old_start, new_start

    budget = 0
    while True:
        done, reopened, before, _, new_start = attempt(budget)
        expected_start = reopened.log_start_offset
        assert read_batches(reopened) == before[expected_start:]
        if done:
            assert expected_start == new_start
            break
        budget += 1
    assert budget > 5


def test_a_crash_at_every_step_of_delete_records() -> None:
    def attempt(budget: int) -> bool:
        memory = MemoryDirectory()
        crashing = CrashingDirectory(memory)
        log = filled(crashing)
        before = read_batches(log)
        target = log.segments[2].base_offset + 1
        crashing.arm(budget)
        try:
            log.delete_records(target, now_ms=0)
            done = True
        except Crash:
            done = False
        memory.crash(random.Random(budget))  # with a torn unsynced tail
        reopened = PartitionLog.open(memory, SMALL, now_ms=0)
        start = reopened.log_start_offset
        # The old start or the new one, never a lost batch above it.
        assert start in (0, target)
        assert read_batches(reopened) == before[start:]
        assert offsets_of(read_batches(reopened)) == offsets_of(before[start:])
        if done:
            assert start == target
        return done

    budget = 0
    while not attempt(budget):
        budget += 1
    assert budget > 3


# -- the cleaner's checkpoint ----------------------------------------------------


def test_the_cleaner_offset_is_checkpointed_and_clamped() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    assert log.cleaner_offset is None
    log.cleaner_offset = 7
    assert log.cleaner_offset == 7
    assert decode_offset(CLEANER_OFFSET_FILE, read_whole(directory, CLEANER_OFFSET_FILE)) == 7
    with pytest.raises(PartitionLogError, match=r"cleaner offset 99 is outside"):
        log.set_cleaner_offset(99)
    log.close()
    log = PartitionLog.open(directory, SMALL, now_ms=0, high_watermark=20)
    assert log.cleaner_offset == 7
    # A start past it clamps it (LogCleanerManager resets it to the start).
    log.delete_records(9)
    assert log.cleaner_offset == 9
    log.close()
    write_atomically(directory, CLEANER_OFFSET_FILE, encode_offset(1000))
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    assert log.cleaner_offset == log.log_end_offset


@pytest.mark.parametrize(
    "name", ["00000000000000000000.log.junk", "00000000000000000000.snapshot.swap"]
)
def test_unknown_suffixes_still_refuse_the_open(name: str) -> None:
    directory = MemoryDirectory()
    PartitionLog.open(directory, SMALL, now_ms=0).close()
    directory.create(name).close()
    with pytest.raises(PartitionLogError, match="not part of a log"):
        PartitionLog.open(directory, SMALL, now_ms=0)


def test_the_producer_state_follows_the_start_across_a_power_loss() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    # Producer 7 only below offset 3; producer 8's batch 3..5 will straddle
    # the start; producer 9 later. Snapshots taken at the rolls hold all.
    log.append_as_leader(batch(3, producer=7, producer_epoch=0, sequence=0), 0, 0)
    log.append_as_leader(batch(3, producer=8, producer_epoch=0, sequence=0), 0, 0)
    for i in range(12):
        log.append_as_leader(batch(producer=9, producer_epoch=0, sequence=i), 0, 0)
    log.maybe_increment_high_watermark(log.log_end_offset)
    log.flush(0)
    assert len(log.segments) > 2
    log.delete_records(4)
    assert log.producer_state.entry(7) is None
    assert log.producer_state.entry(8) is not None
    expected = dict(log.producer_state.producers)
    directory.crash()
    # Rebuilt from a roll's snapshot, which still held producer 7.
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    assert log.log_start_offset == 4
    assert log.producer_state.producers == expected
    # With no snapshot at or above the start: rebuilt from the batch
    # holding the start, which keeps producer 8.
    log.close()
    for name in directory.list():
        if name.endswith(".snapshot"):
            directory.delete(name)
    directory.sync_directory()
    log = PartitionLog.open(directory, SMALL, now_ms=0)
    assert log.producer_state.entry(7) is None
    entry = log.producer_state.entry(8)
    assert entry is not None and entry.batches[-1].first_offset == 3


def test_a_stop_at_every_step_of_retention_on_real_files(tmp_path: Path) -> None:
    """As a kill -9 at each change: the reopened log starts at the old start
    or later, reads the same batches from there, and finishes the delete."""
    config = LogConfig(segment_bytes=400, index_interval_bytes=100, retention_ms=DAY)
    budget = 0
    while True:
        path = tmp_path / f"p-{budget}"
        path.mkdir()
        crashing = CrashingDirectory(OsDirectory(path))
        log = filled(crashing, config, step_ms=60_000)
        before = read_batches(log)
        now = log.segments[2].max_timestamp + DAY + 1
        crashing.arm(budget)
        try:
            log.maybe_delete_segments(now)
            done = True
        except Crash:
            done = False
        reopened = PartitionLog.open(OsDirectory(path), config, now_ms=now, high_watermark=20)
        assert deleted_files(OsDirectory(path)) == []
        assert read_batches(reopened) == before[reopened.log_start_offset :]
        reopened.maybe_delete_segments(now)
        assert reopened.segment_base_offsets[0] == reopened.log_start_offset > 0
        assert read_batches(reopened) == before[reopened.log_start_offset :]
        reopened.close()
        if done:
            break
        budget += 1
    assert budget > 5

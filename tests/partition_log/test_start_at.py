"""A log emptied and restarted at an offset past its end (Kafka's
``UnifiedLog.truncateFullyAndStartAt``, a follower whose leader's log starts
past its whole log): one empty segment at the offset, the epoch cache and
producer state emptied, the log start, recovery point and HW at the offset;
an offset below the end refused; and a crash at every step, after which
the reopened log is the old one whole or the new empty one."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, EpochEntry, decode_checkpoint
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.log import SNAPSHOT_SUFFIX, PartitionLog
from partition_log.log_config import LogConfig
from partition_log.log_files import (
    CLEANER_OFFSET_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    SWAP_SUFFIX,
    SuffixedDirectory,
    decode_offset,
    read_whole,
)
from partition_log.os_files import OsDirectory
from partition_log.segment import Segment
from tests.partition_log.log_util import Crash, CrashingDirectory, batch, files, read_batches

CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=1000)
PRODUCER = 7


def filled(directory: FileDirectory, count: int = 20) -> PartitionLog:
    """A log over several segments: two leader epochs, an idempotent
    producer's batches, a log start moved by DeleteRecords, all committed,
    a snapshot at each roll."""
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    for i in range(count):
        epoch = 0 if i < count // 2 else 3
        if i % 2:
            data = batch(producer=PRODUCER, producer_epoch=0, sequence=i // 2, value=b"%d" % i)
        else:
            data = batch(value=b"%d" % i)
        log.append_as_leader(data, epoch, 0)
    log.maybe_increment_high_watermark(log.log_end_offset)
    log.delete_records(2, now_ms=0)
    log.set_cleaner_offset(4)
    log.flush(0)
    return log


@pytest.fixture(params=["memory", "os"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> FileDirectory:
    if request.param == "memory":
        return MemoryDirectory()
    (tmp_path / "p-0").mkdir()
    return OsDirectory(tmp_path / "p-0")


def offset_file(directory: FileDirectory, name: str) -> int:
    return decode_offset(name, read_whole(directory, name))


def snapshots(directory: FileDirectory) -> list[str]:
    return [n for n in directory.list() if n.endswith(SNAPSHOT_SUFFIX)]


def operation_files(directory: FileDirectory) -> list[str]:
    return [n for n in directory.list() if n.endswith((".cleaned", ".swap", ".deleted"))]


@dataclass(frozen=True)
class Seen:
    """What a log holds, to compare two logs by."""

    start: int
    end: int
    batches: tuple[bytes, ...]
    epochs: tuple[EpochEntry, ...]
    producers: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, log: PartitionLog) -> Seen:
        producers = tuple(
            sorted(
                (pid, entry.last_seq, entry.last_offset)
                for pid, entry in log.producer_state.producers.items()
            )
        )
        return cls(
            log.log_start_offset,
            log.log_end_offset,
            tuple(read_batches(log)),
            log.epoch_cache.entries,
            producers,
        )


def restarted(offset: int) -> Seen:
    return Seen(offset, offset, (), (), ())


def check_restarted_files(directory: FileDirectory, offset: int) -> None:
    """The small files of a log restarted at ``offset``."""
    assert decode_checkpoint(read_whole(directory, CHECKPOINT_FILE_NAME)) == ()
    assert offset_file(directory, LOG_START_OFFSET_FILE) == offset
    assert offset_file(directory, RECOVERY_POINT_FILE) == offset
    assert offset_file(directory, CLEANER_OFFSET_FILE) == offset
    assert snapshots(directory) == []


def test_the_log_restarts_empty_at_the_offset(directory: FileDirectory) -> None:
    log = filled(directory)
    old_bases = log.segment_base_offsets
    assert len(old_bases) > 2 and snapshots(directory)
    assert log.producer_state.producers and log.epoch_cache.entries
    log.truncate_fully_and_start_at(50, now_ms=100)
    assert Seen.of(log) == restarted(50)
    assert log.segment_base_offsets == [50]
    assert (log.high_watermark, log.recovery_point, log.cleaner_offset) == (50, 50, 50)
    check_restarted_files(directory, 50)
    # Below the new start nothing is readable; at it, nothing yet.
    with pytest.raises(PartitionLogError) as refused:
        log.read(49, 1 << 20)
    assert refused.value.code is Errors.OFFSET_OUT_OF_RANGE
    assert log.read(50, 1 << 20) == b""
    # The old segments wait for file.delete.delay.ms, then go.
    assert len(log.pending_deletions) == 4 * len(old_bases)
    assert log.maybe_remove_deleted(100 + CONFIG.file_delete_delay_ms)
    assert operation_files(directory) == []
    # The leader's batches from there append, in a new epoch, and the
    # producer's next sequence is no duplicate of what went.
    log.append_as_follower(batch(2, base=50, epoch=5))
    data = batch(producer=PRODUCER, producer_epoch=0, sequence=0, base=52, epoch=5)
    log.append_as_follower(data)
    assert log.log_end_offset == 53
    assert log.epoch_cache.entries == (EpochEntry(5, 50),)
    assert log.producer_state.producers[PRODUCER].last_offset == 52
    log.close()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=200, high_watermark=0)
    assert reopened.log_start_offset == 50 and reopened.log_end_offset == 53
    # A HW checkpoint from the old log is clamped to the new start.
    assert reopened.high_watermark == 50
    assert reopened.epoch_cache.entries == (EpochEntry(5, 50),)
    assert reopened.producer_state.producers[PRODUCER].last_offset == 52


def test_a_restart_survives_a_close_and_reopen_before_any_append(
    directory: FileDirectory,
) -> None:
    log = filled(directory)
    log.truncate_fully_and_start_at(40, now_ms=0)
    log.close()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0, high_watermark=17)
    assert Seen.of(reopened) == restarted(40)
    assert reopened.high_watermark == 40 and reopened.cleaner_offset == 40
    # The close's own snapshot at the new end is the only one.
    assert snapshots(directory) == [f"{40:020d}{SNAPSHOT_SUFFIX}"]


def test_an_offset_below_the_log_end_is_refused_with_the_files_unchanged() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    before, seen = files(directory), Seen.of(log)
    for offset in (log.log_end_offset - 1, log.log_start_offset, 0):
        with pytest.raises(PartitionLogError) as refused:
            log.truncate_fully_and_start_at(offset, now_ms=0)
        assert refused.value.code is Errors.OFFSET_OUT_OF_RANGE
        assert f"cannot restart the log at offset {offset}" in str(refused.value)
        assert f"below the log end offset {log.log_end_offset}" in str(refused.value)
    assert files(directory) == before and Seen.of(log) == seen


def test_a_restart_at_the_log_end_drops_every_record() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    end = log.log_end_offset
    log.truncate_fully_and_start_at(end, now_ms=0)
    assert Seen.of(log) == restarted(end)
    assert log.high_watermark == end


def test_a_restart_of_an_empty_log_at_its_own_segment_base() -> None:
    # The new segment has the old active segment's name: the swap keeps
    # them apart by suffix.
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    log.truncate_fully_and_start_at(0, now_ms=0)
    assert Seen.of(log) == restarted(0) and log.segment_base_offsets == [0]
    log.append_as_leader(batch(), 1, 0)
    log.close()
    assert PartitionLog.open(directory, CONFIG, now_ms=0).log_end_offset == 1


def crash_at_every_step(offset: int, torn: bool) -> int:
    """Restart a log at ``offset`` with a power loss before each change in
    turn; after reopening, the log is the old one whole or the new empty
    one with the new small files, never a mix. The number of steps."""
    outcomes: set[str] = set()
    budget = 0
    while True:
        memory = MemoryDirectory()
        crashing = CrashingDirectory(memory)
        log = filled(crashing)
        old = Seen.of(log)
        crashing.arm(budget)
        try:
            log.truncate_fully_and_start_at(offset, now_ms=0)
            done = True
        except Crash:
            done = False
        memory.crash(random.Random(budget) if torn else None)
        reopened = PartitionLog.open(memory, CONFIG, now_ms=0, high_watermark=old.end)
        got = Seen.of(reopened)
        assert operation_files(memory) == [], f"budget {budget}"
        assert got in (old, restarted(offset)), f"budget {budget}: a mix of old and new"
        if got == old:
            outcomes.add("old")
            assert reopened.high_watermark == old.end
        else:
            outcomes.add("new")
            assert reopened.segment_base_offsets == [offset]
            assert reopened.high_watermark == offset
            check_restarted_files(memory, offset)
        # Either way the log goes on: the leader's next batch appends.
        reopened.append_as_follower(batch(base=reopened.log_end_offset, epoch=4))
        if done:
            assert got == restarted(offset)
            assert outcomes == {"old", "new"}
            return budget
        budget += 1


@pytest.mark.parametrize("torn", [False, True])
def test_a_crash_at_every_step_leaves_the_old_log_or_the_new_one(torn: bool) -> None:
    assert crash_at_every_step(60, torn) > 15


def test_a_crash_at_every_step_of_a_restart_at_the_log_end() -> None:
    # The old log's batches all go, but its end is the new start.
    assert crash_at_every_step(20, torn=False) > 15


def test_a_stop_at_every_step_on_real_files(tmp_path: Path) -> None:
    """As a kill -9 at each change: every call made reached the OS (renames
    of one step part-done included), and the reopened log is the old one
    or the new one."""
    budget = 0
    while True:
        path = tmp_path / f"p-{budget}"
        path.mkdir()
        crashing = CrashingDirectory(OsDirectory(path))
        log = filled(crashing)
        old = Seen.of(log)
        crashing.arm(budget)
        try:
            log.truncate_fully_and_start_at(60, now_ms=0)
            done = True
        except Crash:
            done = False
        directory = OsDirectory(path)
        reopened = PartitionLog.open(directory, CONFIG, now_ms=0)
        got = Seen.of(reopened)
        assert got in (old, restarted(60)), f"budget {budget}"
        if got == restarted(60):
            check_restarted_files(directory, 60)
        assert operation_files(directory) == []
        reopened.close()
        if done:
            assert got == restarted(60)
            break
        budget += 1
    assert budget > 15


def test_an_empty_compaction_swap_below_the_active_segment_is_no_restart() -> None:
    # The first segment cleaned away, the swap stopped before its renames:
    # the empty .swap segment replaces only its range, the later segments
    # and the small files stay.
    directory = MemoryDirectory()
    log = filled(directory)
    bases = log.segment_base_offsets
    tail = read_batches(log, bases[1])
    epochs = log.epoch_cache.entries
    log.close()
    segment = Segment.create(SuffixedDirectory(directory, SWAP_SUFFIX), bases[0], now_ms=0)
    segment.flush()
    segment.close()
    directory.sync_directory()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert reopened.recovery.interrupted.restarted_at is None
    assert reopened.recovery.interrupted.completed_swaps
    assert reopened.segment_base_offsets == bases
    assert read_batches(reopened, bases[1]) == tail
    assert reopened.epoch_cache.entries == epochs
    assert snapshots(directory)


def test_an_empty_swap_at_or_above_the_last_segment_restarts_the_log() -> None:
    # What a restart leaves once its swap is committed: opening finishes it.
    directory = MemoryDirectory()
    log = filled(directory)
    log.close()
    segment = Segment.create(SuffixedDirectory(directory, SWAP_SUFFIX), 70, now_ms=0)
    segment.flush()
    segment.close()
    directory.sync_directory()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0, high_watermark=20)
    assert reopened.recovery.interrupted.restarted_at == 70
    assert Seen.of(reopened) == restarted(70) and reopened.high_watermark == 70
    check_restarted_files(directory, 70)


def test_an_empty_log_may_restart_below_its_end() -> None:
    """A follower restarted at a leader's log start inside a batch is served
    the whole batch: with nothing in the log, it restarts at the batch's
    first offset (below its end), and that survives a reopen; a log that
    holds records still refuses (above)."""
    directory = MemoryDirectory()
    log = filled(directory)
    log.truncate_fully_and_start_at(log.log_end_offset + 5, now_ms=0)
    start = log.log_start_offset
    log.truncate_fully_and_start_at(start - 3, now_ms=0)
    assert Seen.of(log) == restarted(start - 3)
    log.close()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (start - 3, start - 3)


def test_a_crash_at_every_step_of_a_restart_of_an_empty_log_below_its_end() -> None:
    """The old log is empty (restarted at 60), the new start 55 below it: a
    power loss before each change leaves an empty log, at 60 or at 55 (or,
    the new empty segment kept beside the old, empty at 60 with its start
    where the small files say), never a record; a second restart at 55
    then gives exactly the new log, and the leader's batch appends."""
    budget = 0
    while True:
        memory = MemoryDirectory()
        crashing = CrashingDirectory(memory)
        log = filled(crashing)
        log.truncate_fully_and_start_at(60, now_ms=0)
        crashing.arm(budget)
        try:
            log.truncate_fully_and_start_at(55, now_ms=0)
            done = True
        except Crash:
            done = False
        memory.crash(None)
        reopened = PartitionLog.open(memory, CONFIG, now_ms=0)
        got = Seen.of(reopened)
        assert got.batches == () and got.end in (55, 60), f"budget {budget}: {got}"
        assert operation_files(memory) == [], f"budget {budget}"
        if got != restarted(55):
            reopened.truncate_fully_and_start_at(55, now_ms=0)
        assert Seen.of(reopened) == restarted(55), f"budget {budget}"
        reopened.append_as_follower(batch(base=55, epoch=4))
        assert reopened.log_end_offset == 56
        if done:
            return
        budget += 1

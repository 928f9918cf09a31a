"""The crash-safe segment swap of compaction (Kafka's ``LocalLog.replaceSegments``
and ``LogLoader``'s recovery of it, KAFKA-6264): older segments replaced by
new ones holding exactly the given batches, offsets unchanged; refused bad
input with the files unchanged; and a crash at every step, after which the
log holds the old segments or the new ones, never a mix that loses data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from partition_log.batch import BatchHeader
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.log_config import LogConfig
from partition_log.log_files import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    SuffixedDirectory,
    write_atomically,
)
from partition_log.os_files import OsDirectory
from partition_log.segment import Segment, file_name
from tests.partition_log.log_util import (
    Crash,
    CrashingDirectory,
    batch,
    files,
    offsets_of,
    read_batches,
)

CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=1000)


def filled(directory: FileDirectory, config: LogConfig = CONFIG, count: int = 20) -> PartitionLog:
    log = PartitionLog.open(directory, config, now_ms=0)
    for i in range(count):
        log.append_as_leader(batch(key=b"k%d" % (i % 3)), 0, 0)
    log.maybe_increment_high_watermark(log.log_end_offset)
    log.flush(0)
    return log


def in_range(batches: list[bytes], low: int, high: int) -> list[bytes]:
    return [b for b in batches if low <= BatchHeader.parse(b).base_offset < high]


def compacted(batches: list[bytes], low: int, high: int) -> list[bytes]:
    """Every other batch of the range, keeping its last one (so the new
    segments end where the old ones did)."""
    kept = in_range(batches, low, high)
    return [b for i, b in enumerate(kept) if i % 2 == 1 or i == len(kept) - 1]


@pytest.fixture(params=["memory", "os"])
def directory(request: pytest.FixtureRequest, tmp_path: Path) -> FileDirectory:
    if request.param == "memory":
        return MemoryDirectory()
    (tmp_path / "p-0").mkdir()
    return OsDirectory(tmp_path / "p-0")


def operation_files(directory: FileDirectory) -> list[str]:
    return [n for n in directory.list() if n.endswith((".cleaned", ".swap", ".deleted"))]


def test_replace_two_segments_keeps_offsets_and_the_rest(directory: FileDirectory) -> None:
    log = filled(directory)
    before = read_batches(log)
    bases = log.segment_base_offsets
    low, high = bases[1], bases[3]
    new = compacted(before, low, high)
    log.replace_segments(bases[1:3], new, now_ms=500)
    expected = in_range(before, 0, low) + new + in_range(before, high, 1 << 62)
    assert read_batches(log) == expected
    # The new batches fit one segment, named by the first old base.
    assert log.segment_base_offsets == [0, low, *bases[3:]]
    assert log.log_end_offset == len(before)
    # Offsets in the gaps read from the next batch kept.
    gap = offsets_of(new)[0][0] - 1
    assert BatchHeader.parse(log.read(gap, 1000)).base_offset == offsets_of(new)[0][0]
    # The old files wait as .deleted for file.delete.delay.ms.
    pending = operation_files(directory)
    assert pending and all(n.endswith(".deleted") for n in pending)
    assert log.maybe_remove_deleted(1500)
    assert operation_files(directory) == []
    # Clean and unclean reopenings read the same.
    log.close()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert read_batches(log) == expected
    if isinstance(directory, MemoryDirectory):
        directory.crash()
        log = PartitionLog.open(directory, CONFIG, now_ms=0)
        assert read_batches(log) == expected


def test_new_segments_split_by_segment_bytes_and_named_by_their_first_batch() -> None:
    config = LogConfig(segment_bytes=1000, index_interval_bytes=100)
    log = filled(MemoryDirectory(), config, count=40)
    before = read_batches(log)
    bases = log.segment_base_offsets
    # With a smaller segment.bytes now, the same batches need more segments.
    small = LogConfig(segment_bytes=300, index_interval_bytes=100)
    log.config = small
    new = in_range(before, bases[0], bases[2])
    log.replace_segments(bases[:2], new, now_ms=0)
    after = log.segment_base_offsets
    assert after[0] == 0 and len(after) > len(bases)
    for info in log.segments:
        if info.base_offset < bases[2]:
            assert 0 < info.size <= 300
    assert read_batches(log) == before
    inside = [b for b in after if b < bases[2]]
    assert inside[1:] == [
        o[0] for o in offsets_of(new) if o[0] in inside[1:]
    ]  # each named by a batch's base offset


def test_everything_cleaned_away_leaves_one_empty_segment_at_the_first_base() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    before = read_batches(log)
    bases = log.segment_base_offsets
    log.replace_segments(bases[:2], [], now_ms=0)
    assert log.segment_base_offsets == [0, *bases[2:]]
    assert log.segments[0].size == 0
    assert read_batches(log) == in_range(before, bases[2], 1 << 62)
    log.close()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert log.segment_base_offsets == [0, *bases[2:]]
    assert read_batches(log) == in_range(before, bases[2], 1 << 62)


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("below", Errors.INVALID_RECORD, "below the replaced range"),
        ("past", Errors.INVALID_RECORD, "reaches past the replaced range"),
        ("order", Errors.INVALID_RECORD, "is not after the previous batch"),
        ("torn", Errors.CORRUPT_MESSAGE, "not whole valid batches"),
        ("crc", Errors.CORRUPT_MESSAGE, "not whole valid batches"),
        ("active", Errors.INVALID_RECORD, "is the active segment"),
        ("gap", Errors.INVALID_RECORD, "not consecutive"),
        ("unknown", Errors.INVALID_RECORD, "no older segment has base offset 3"),
        ("none", Errors.INVALID_RECORD, "no old segment"),
    ],
)
def test_bad_input_is_refused_with_the_files_unchanged(
    case: str, code: Errors, message: str
) -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    before = read_batches(log)
    bases = log.segment_base_offsets
    low, high = bases[1], bases[3]
    good = in_range(before, low, high)
    old: list[int] = bases[1:3]
    batches: list[bytes] = good
    if case == "below":
        batches = [before[low - 1], *good]
    elif case == "past":
        batches = [*good, before[high]]
    elif case == "order":
        batches = [good[1], good[0], *good[2:]]
    elif case == "torn":
        batches = [*good[:3], good[3][:-5]]
    elif case == "crc":
        damaged = bytearray(good[2])
        damaged[-1] ^= 1
        batches = [*good[:2], bytes(damaged)]
    elif case == "active":
        old = [bases[-2], bases[-1]]
    elif case == "gap":
        old = [bases[0], bases[2]]
    elif case == "unknown":
        old = [3]
    elif case == "none":
        old = []
    files_before = files(directory)
    with pytest.raises(PartitionLogError) as raised:
        log.replace_segments(old, batches, now_ms=0)
    assert raised.value.code is code
    assert message in str(raised.value)
    assert files(directory) == files_before
    assert log.segment_base_offsets == bases
    assert read_batches(log) == before


def test_batches_can_come_several_to_a_buffer() -> None:
    log = filled(MemoryDirectory())
    before = read_batches(log)
    bases = log.segment_base_offsets
    new = compacted(before, bases[0], bases[2])
    log.replace_segments(bases[:2], [b"".join(new[:3]), memoryview(b"".join(new[3:]))], 0)
    assert read_batches(log, 0)[: len(new)] == new


# -- crashes ---------------------------------------------------------------------


def crash_at_every_step(keep_last: bool, split: bool, empty: bool = False) -> int:
    """Swap two segments with a crash before each change in turn, reopen,
    and check the log holds the old or the new segments; the number of
    steps. With ``split`` the new batches take three segments."""
    budget = 0
    outcomes = set()
    while True:
        memory = MemoryDirectory()
        crashing = CrashingDirectory(memory)
        log = filled(crashing)
        before = read_batches(log)
        bases = log.segment_base_offsets
        low, high = bases[1], bases[3]
        new = compacted(before, low, high)
        if not keep_last:
            new = [] if empty else new[:-2]
        after = in_range(before, 0, low) + new + in_range(before, high, 1 << 62)
        if split:
            log.config = LogConfig(segment_bytes=150, index_interval_bytes=100)
        crashing.arm(budget)
        try:
            log.replace_segments(bases[1:3], new, now_ms=0)
            done = True
        except Crash:
            done = False
        memory.crash(random.Random(budget))  # with a torn unsynced tail
        reopened = PartitionLog.open(memory, CONFIG, now_ms=0)
        assert operation_files(memory) == []
        got = read_batches(reopened)
        assert reopened.log_end_offset == len(before)
        if keep_last or got in (before, after):
            assert got in (before, after), f"budget {budget}: a mix of old and new"
            outcomes.add("new" if got == after else "old")
        else:
            # The new segments end before the old range did: a completed
            # swap may keep an old segment past their end (LogLoader deletes
            # only the range the .swap files cover) - never a lost batch of
            # the new log, never an offset changed.
            assert set(after) <= set(got) <= set(before)
            assert offsets_of(got) == sorted(offsets_of(got))
            outcomes.add("mixed")
        if done:
            assert got == after
            # Two old segments became one, or more when split.
            count = len(log.segment_base_offsets) - (len(bases) - 2)
            assert count > 1 if split and not empty else count == 1
            assert "new" in outcomes or "mixed" in outcomes
            assert "old" in outcomes
            return budget
        budget += 1


@pytest.mark.parametrize("split", [False, True])
def test_a_crash_at_every_step_of_the_swap_leaves_the_old_or_the_new_segments(
    split: bool,
) -> None:
    assert crash_at_every_step(keep_last=True, split=split) > 20


@pytest.mark.parametrize("split", [False, True])
def test_a_crash_at_every_step_when_the_new_segments_end_early_loses_nothing(
    split: bool,
) -> None:
    assert crash_at_every_step(keep_last=False, split=split) > 20


def _cleaned_segment(directory: FileDirectory, suffix: str, batches: list[bytes]) -> None:
    view = SuffixedDirectory(directory, suffix)
    segment = Segment.create(view, BatchHeader.parse(batches[0]).base_offset, now_ms=0)
    for data in batches:
        segment.append(data, allow_gaps=True)
    segment.flush()
    segment.close()


def test_swap_files_above_a_cleaned_file_are_dropped_kafka_6264() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    before = read_batches(log)
    bases = log.segment_base_offsets
    log.close()
    # A split of segment 1 interrupted: its upper half already .swap, its
    # lower half still .cleaned.
    half = (bases[1] + bases[2]) // 2
    _cleaned_segment(directory, CLEANED_SUFFIX, in_range(before, bases[1], half))
    _cleaned_segment(directory, SWAP_SUFFIX, in_range(before, half, bases[2]))
    directory.sync_directory()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert log.recovery.interrupted.dropped_swaps
    assert log.segment_base_offsets == bases
    assert read_batches(log) == before
    assert operation_files(directory) == []


def test_swap_files_without_cleaned_ones_are_completed() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    before = read_batches(log)
    bases = log.segment_base_offsets
    log.close()
    new = compacted(before, bases[1], bases[3])
    # Named by the first old base, as replace_segments names it.
    view = SuffixedDirectory(directory, SWAP_SUFFIX)
    segment = Segment.create(view, bases[1], now_ms=0)
    for data in new:
        segment.append(data, allow_gaps=True)
    segment.flush()
    segment.close()
    directory.sync_directory()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    interrupted = log.recovery.interrupted
    assert file_name(bases[2], ".log") in interrupted.replaced
    assert file_name(bases[1], ".log") + SWAP_SUFFIX in interrupted.completed_swaps
    assert log.segment_base_offsets == [0, bases[1], *bases[3:]]
    assert read_batches(log) == in_range(before, 0, bases[1]) + new + in_range(
        before, bases[3], 1 << 62
    )


def test_the_cleaner_checkpoint_survives_the_swap() -> None:
    directory = MemoryDirectory()
    log = filled(directory)
    bases = log.segment_base_offsets
    before = read_batches(log)
    log.replace_segments(bases[:2], compacted(before, 0, bases[2]), now_ms=0)
    log.set_cleaner_offset(bases[2])
    log.close()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert log.cleaner_offset == bases[2]
    # A start past it clamps it on open.
    write_atomically(directory, "log-start-offset-checkpoint", b"0\n%d\n" % (bases[2] + 2))
    log.close()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert log.cleaner_offset == log.log_start_offset == bases[2] + 2


def test_a_crash_at_every_step_when_everything_was_cleaned_away_loses_nothing() -> None:
    assert crash_at_every_step(keep_last=False, split=False, empty=True) > 20


def test_a_stop_at_every_step_of_the_swap_on_real_files(tmp_path: Path) -> None:
    """As a kill -9 at each change: every call made reached the OS, and the
    reopened log reads the old segments or the new ones."""
    budget = 0
    while True:
        path = tmp_path / f"p-{budget}"
        path.mkdir()
        crashing = CrashingDirectory(OsDirectory(path))
        log = filled(crashing)
        before = read_batches(log)
        bases = log.segment_base_offsets
        new = compacted(before, bases[1], bases[3])
        after = in_range(before, 0, bases[1]) + new + in_range(before, bases[3], 1 << 62)
        log.config = LogConfig(segment_bytes=150, index_interval_bytes=100)
        crashing.arm(budget)
        try:
            log.replace_segments(bases[1:3], new, now_ms=0)
            done = True
        except Crash:
            done = False
        reopened = PartitionLog.open(OsDirectory(path), CONFIG, now_ms=0)
        got = read_batches(reopened)
        assert got in (before, after), f"budget {budget}"
        assert operation_files(OsDirectory(path)) == []
        reopened.close()
        if done:
            assert got == after
            break
        budget += 1
    assert budget > 20

"""The log cleaner over partition logs: which log it picks, what a cleaning
keeps and where it stops (the active segment, the high watermark,
min.compaction.lag.ms, the dedupe budget), tombstones over two cleanings,
and a cleaning on real files surviving a reopening."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from partition_log.batch import BatchHeader, build_batch, decode_records, split_batches, verify
from partition_log.cleaner import CleanerConfig, LogCleaner
from partition_log.compaction import ENTRY_OVERHEAD_BYTES
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.os_files import OsDirectory
from partition_log.records import Record
from tests.partition_log.test_log_properties import PowerLoss, _Budget, _FaultyDirectory

RETENTION = 1_000
CONFIG = LogConfig(
    segment_bytes=200,
    index_interval_bytes=90,
    cleanup_policy=CleanupPolicy.COMPACT,
    delete_retention_ms=RETENTION,
    file_delete_delay_ms=0,
)


def open_log(directory: FileDirectory | None = None, config: LogConfig = CONFIG) -> PartitionLog:
    return PartitionLog.open(directory or MemoryDirectory(), config, now_ms=0)


def put(
    log: PartitionLog,
    pairs: list[tuple[bytes, bytes | None]],
    now: int = 0,
    producer: int = -1,
) -> None:
    records = [Record(i, now, key, value) for i, (key, value) in enumerate(pairs)]
    sequence = -1
    if producer >= 0:
        entry = log.producer_state.entry(producer)
        sequence = 0 if entry is None else entry.last_seq + 1
    batch = build_batch(
        records,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=sequence,
    )
    log.append_as_leader(batch, 0, now_ms=now)
    log.maybe_increment_high_watermark(log.log_end_offset)


def batches(log: PartitionLog) -> list[bytes]:
    out: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        views = split_batches(log.read(offset, 1 << 20))
        out.extend(bytes(v) for v in views)
        offset = BatchHeader.parse(views[-1]).next_offset
    return out


def records(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in batches(log) for r in decode_records(b)]


def fill(log: PartitionLog, rounds: int, now: int = 0) -> None:
    """``rounds`` values of keys a and b, one batch each, then a roll."""
    for i in range(rounds):
        put(log, [(b"a", b"%d" % i), (b"b", b"%d" % i)], now)


def test_nothing_to_clean_without_a_compacted_dirty_log() -> None:
    deleting = open_log(config=LogConfig(segment_bytes=200))
    fill(deleting, 10)
    cleaner = LogCleaner({"d": deleting})
    assert not cleaner.maybe_clean(0)
    fresh = open_log()
    cleaner.add_log("c", fresh)
    assert not cleaner.maybe_clean(0)  # only an active segment


def test_a_cleaning_keeps_the_last_value_per_key_and_every_offset() -> None:
    log = open_log()
    fill(log, 10)
    before = records(log)
    active = log.segment_base_offsets[-1]
    assert len(log.segment_base_offsets) > 3
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(100)
    after = records(log)
    # Below the active segment only the last values mapped stay; the active
    # segment is untouched.
    assert [r for r in after if r[0] >= active] == [r for r in before if r[0] >= active]
    cleaned = [r for r in after if r[0] < active]
    assert len({r[1] for r in cleaned}) == len(cleaned)
    assert set(after) <= set(before)
    assert [r[0] for r in after] == sorted(r[0] for r in after)
    last = {key: (offset, value) for offset, key, value in before}
    assert {key: (offset, value) for offset, key, value in after} == last
    assert log.cleaner_offset == active
    for batch in batches(log):
        verify(batch)
    # Nothing dirty left: the next call cleans nothing.
    assert not cleaner.maybe_clean(200)
    # The segments cleaned are small now: the next cleaning merges them.
    count = len(log.segment_base_offsets)
    fill(log, 10)
    assert cleaner.maybe_clean(300)
    assert cleaner.last_cleaning is not None
    assert cleaner.last_cleaning.segments_after < cleaner.last_cleaning.segments_before
    assert len(log.segment_base_offsets) < count + 5
    assert {r[1]: r[2] for r in records(log)} == {b"a": b"9", b"b": b"9"}


def test_the_dirtiest_log_goes_first() -> None:
    light, heavy = open_log(), open_log()
    fill(light, 6)
    fill(heavy, 12)
    cleaner = LogCleaner({"light": light, "heavy": heavy})
    assert cleaner.maybe_clean(0)
    first = cleaner.last_cleaning
    assert first is not None
    # Both are wholly dirty (ratio 1); the first named wins the tie.
    assert first.name == "light"
    assert cleaner.maybe_clean(0)
    assert cleaner.last_cleaning is not None and cleaner.last_cleaning.name == "heavy"
    # light has a dirty tail now: more appends make it dirtier than heavy.
    fill(light, 12)
    assert cleaner.prospects("light", 0).dirty_ratio > cleaner.prospects("heavy", 0).dirty_ratio
    assert cleaner.maybe_clean(0)
    assert cleaner.last_cleaning is not None and cleaner.last_cleaning.name == "light"


def test_nothing_at_or_above_the_high_watermark_is_cleaned() -> None:
    log = open_log()
    fill(log, 10)
    bases = log.segment_base_offsets
    log_end = log.log_end_offset
    # A new log opened with a lower high watermark.
    directory = log.directory
    log.close()
    log = PartitionLog.open(directory, CONFIG, now_ms=0, high_watermark=bases[2])
    before = records(log)
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(0)
    assert log.cleaner_offset == bases[2]
    after = records(log)
    assert [r for r in after if r[0] >= bases[2]] == [r for r in before if r[0] >= bases[2]]
    assert log.log_end_offset == log_end


def test_min_compaction_lag_keeps_young_segments_dirty() -> None:
    config = LogConfig(
        segment_bytes=200,
        cleanup_policy=CleanupPolicy.COMPACT,
        min_compaction_lag_ms=500,
        file_delete_delay_ms=0,
    )
    log = open_log(config=config)
    fill(log, 4, now=0)
    fill(log, 6, now=800)
    young = next(s.base_offset for s in log.segments if s.max_timestamp > 500)
    assert young < log.segment_base_offsets[-1]
    cleaner = LogCleaner({"p": log})
    prospects = cleaner.prospects("p", 1_000)
    assert prospects.first_uncleanable_offset == young
    before = records(log)
    assert cleaner.maybe_clean(1_000)
    stop = prospects.first_uncleanable_offset
    assert [r for r in records(log) if r[0] >= stop] == [r for r in before if r[0] >= stop]
    assert log.cleaner_offset == stop


def test_a_small_dedupe_buffer_cleans_in_several_steps() -> None:
    # Any dirty part is worth cleaning: the steps go on to the active segment.
    log = open_log(config=dataclasses.replace(CONFIG, min_cleanable_dirty_ratio=0.0))
    for i in range(30):
        put(log, [(b"k%02d" % (i % 12), b"v%d" % i)])
    # Room for about four keys per cleaning.
    config = CleanerConfig(dedupe_buffer_bytes=4 * (3 + ENTRY_OVERHEAD_BYTES))
    cleaner = LogCleaner({"p": log}, config)
    before = records(log)
    ends = []
    while cleaner.maybe_clean(0):
        assert cleaner.last_cleaning is not None
        ends.append(cleaner.last_cleaning.end_offset)
    assert len(ends) > 2 and ends == sorted(ends)
    assert ends[-1] == log.segment_base_offsets[-1]
    last = {key: (offset, value) for offset, key, value in before}
    assert {key: (offset, value) for offset, key, value in records(log)} == last


def test_a_tombstone_stays_until_its_horizon_then_a_later_cleaning_removes_it() -> None:
    log = open_log()
    fill(log, 4)
    put(log, [(b"a", None)], now=0)
    for i in range(4):
        put(log, [(b"b", b"later %d" % i)])
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(100)
    tombstones = [r for r in records(log) if r[1] == b"a"]
    assert [r[2] for r in tombstones] == [None]
    horizon = next(
        verify(b).delete_horizon_ms
        for b in batches(log)
        if BatchHeader.parse(b).records_count and any(r.key == b"a" for r in decode_records(b))
    )
    assert horizon == 100 + RETENTION
    # More appends make the log dirty again; before the horizon it stays.
    for i in range(10):
        put(log, [(b"b", b"again %d" % i)])
    assert cleaner.maybe_clean(100 + RETENTION - 1)
    assert [r[2] for r in records(log) if r[1] == b"a"] == [None]
    for i in range(10):
        put(log, [(b"b", b"more %d" % i)])
    assert cleaner.maybe_clean(100 + RETENTION)
    assert [r for r in records(log) if r[1] == b"a"] == []


def test_a_producers_last_batch_stays_empty() -> None:
    log = open_log()
    put(log, [(b"a", b"1")], producer=7)
    fill(log, 6)
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(0)
    first = verify(batches(log)[0])
    assert (first.producer_id, first.records_count, first.base_offset) == (7, 0, 0)
    # Reopening rebuilds the producer's state from the empty batch.
    directory = log.directory
    log.close()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0)
    entry = reopened.producer_state.entry(7)
    assert entry is not None and entry.last_seq == 0


def test_a_cleaning_on_real_files_survives_reopening(tmp_path: Path) -> None:
    (tmp_path / "p-0").mkdir()
    directory = OsDirectory(tmp_path / "p-0")
    log = open_log(directory)
    fill(log, 10)
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(0)
    kept = batches(log)
    checkpoint = log.cleaner_offset
    log.close()
    reopened = PartitionLog.open(OsDirectory(tmp_path / "p-0"), CONFIG, now_ms=0)
    assert reopened.recovery.clean
    assert batches(reopened) == kept
    assert reopened.cleaner_offset == checkpoint
    assert not any(name.endswith((".cleaned", ".swap")) for name in reopened.directory.list())


def test_bad_settings_and_names_are_refused() -> None:
    with pytest.raises(ValueError, match="dedupe_buffer_bytes=8 cannot hold one entry"):
        CleanerConfig(dedupe_buffer_bytes=8)
    with pytest.raises(ValueError, match="read_bytes=0"):
        CleanerConfig(read_bytes=0)
    cleaner = LogCleaner({"p": open_log()})
    with pytest.raises(ValueError, match="already has a log named 'p'"):
        cleaner.add_log("p", open_log())
    with pytest.raises(ValueError, match="no log named 'q'"):
        cleaner.remove_log("q")
    cleaner.remove_log("p")
    assert not cleaner.maybe_clean(0)


# -- a power loss at every change to the files during a cleaning ---------------


def _faulty_history(directory: FileDirectory) -> PartitionLog:
    log = open_log(directory)
    put(log, [(b"z", b"first")], producer=7)
    for i in range(8):
        put(log, [(b"a", b"%d" % i), (b"b", b"%d" % i)])
        if i == 3:
            put(log, [(b"z", None)])
    return log


def test_a_power_loss_at_every_step_of_a_cleaning_loses_nothing() -> None:
    reference = _faulty_history(MemoryDirectory())
    cleaner = LogCleaner({"p": reference})
    assert cleaner.maybe_clean(10)
    assert cleaner.last_cleaning is not None and cleaner.last_cleaning.segments_after > 2
    expected = records(reference)
    steps = 0
    while True:
        inner = MemoryDirectory()
        budget = _Budget(1 << 30)
        log = _faulty_history(_FaultyDirectory(inner, budget))
        log.flush(0)  # what a power loss may take is the cleaning's alone
        before = records(log)
        budget.calls = steps
        try:
            LogCleaner({"p": log}).maybe_clean(10)
        except PowerLoss:
            pass
        else:
            break
        inner.crash(random.Random(steps))
        reopened = PartitionLog.open(inner, CONFIG, now_ms=10, high_watermark=1 << 40)
        found = records(reopened)
        # The old segments or the new ones, never a mix that loses a record
        # a reader needs: every record is an original one, in order, and
        # every key's last record is still there.
        assert set(found) <= set(before)
        assert [r[0] for r in found] == sorted(r[0] for r in found)
        assert {r[1]: r for r in found} == {r[1]: r for r in before}
        # The checkpoint moves only once every group is swapped in.
        assert reopened.cleaner_offset in (None, reference.cleaner_offset)
        entry = reopened.producer_state.entry(7)
        assert entry is not None and entry.last_seq == 0
        # Cleaning again finishes the job.
        again = LogCleaner({"p": reopened})
        while again.maybe_clean(10):
            pass
        assert records(reopened) == expected
        steps += 1
    assert steps > 20  # every rename, sync and write of several swaps


def test_compact_delete_logs_are_cleaned_too() -> None:
    config = dataclasses.replace(
        CONFIG, cleanup_policy=CleanupPolicy.COMPACT | CleanupPolicy.DELETE
    )
    log = open_log(config=config)
    fill(log, 8)
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(0)
    assert {r[1]: r[2] for r in records(log)} == {b"a": b"7", b"b": b"7"}


def test_a_log_starting_inside_a_segment_is_cleaned_from_its_start() -> None:
    log = open_log()
    fill(log, 8)
    start = log.segment_base_offsets[1] + 1  # inside the second segment
    log.delete_records(start, now_ms=0)
    assert log.log_start_offset == start
    before = [r for r in records(log) if r[0] >= start]
    cleaner = LogCleaner({"p": log})
    assert cleaner.prospects("p", 0).first_dirty_offset == start
    assert cleaner.maybe_clean(0)
    after = records(log)
    assert log.log_start_offset == start
    assert all(r[0] >= start for r in after)
    assert {r[1]: r for r in after} == {r[1]: r for r in before}


def test_a_truncation_below_the_checkpoint_lowers_it() -> None:
    log = open_log()
    put(log, [(b"k", b"old")])
    for i in range(6):
        put(log, [(b"f", b"%d" % i), (b"g", b"%d" % i)])
    cleaner = LogCleaner({"p": log})
    assert cleaner.maybe_clean(0)
    checkpoint = log.cleaner_offset
    assert checkpoint is not None
    # A follower cuts below the checkpoint; the new leader's history deletes k.
    log.truncate_to(checkpoint - 4)
    put(log, [(b"k", None)])
    for i in range(10):
        put(log, [(b"f", b"x%d" % i), (b"g", b"x%d" % i)])
    assert (log.cleaner_offset or 0) <= checkpoint - 4
    now = 0
    for step in range(4):
        now += 2 * RETENTION
        while cleaner.maybe_clean(now):
            pass
        for i in range(3):
            put(log, [(b"f", b"y%d%d" % (step, i)), (b"g", b"y")])
    # The deleted key never comes back.
    assert [r for r in records(log) if r[1] == b"k" and r[2] is not None] == []

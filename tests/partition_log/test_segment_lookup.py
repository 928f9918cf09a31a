"""Finding the segment of an offset: a binary search over the summaries the
log keeps, with nothing built per read that grows with the number of
segments (a log may hold hundreds)."""

from __future__ import annotations

import bisect

import pytest

from partition_log.batch import BatchHeader, build_batch
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.records import Record

CONFIG = LogConfig(segment_bytes=300, index_interval_bytes=100)


def _log(batches: int) -> PartitionLog:
    log = PartitionLog.open(MemoryDirectory(), CONFIG, now_ms=0)
    for _ in range(batches):
        base = log.log_end_offset
        records = [Record(base + j, 1000 + base + j, b"k", b"v" * 30) for j in range(2)]
        log.append_as_follower(build_batch(records, base_offset=base, partition_leader_epoch=0))
    log.maybe_increment_high_watermark(log.log_end_offset)
    return log


def test_the_segment_of_every_offset_is_the_last_based_at_or_below_it() -> None:
    log = _log(120)
    bases = log.segment_base_offsets
    assert len(bases) > 50
    for offset in range(-1, log.log_end_offset + 2):
        assert log._index_of(offset) == max(0, bisect.bisect_right(bases, offset) - 1), offset
    # And after the start moved past whole segments.
    log.delete_records(bases[10] + 1)
    bases = log.segment_base_offsets
    for offset in range(log.log_start_offset, log.log_end_offset + 1):
        assert log._index_of(offset) == max(0, bisect.bisect_right(bases, offset) - 1), offset


def test_reads_and_time_lookups_build_no_list_of_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log(120)
    end = log.log_end_offset

    def refused(self: PartitionLog) -> None:
        raise AssertionError("a read built the list of every segment")

    monkeypatch.setattr(PartitionLog, "segment_base_offsets", property(refused))
    monkeypatch.setattr(PartitionLog, "segments", property(refused))
    for offset in range(end):
        first = BatchHeader.parse(log.read(offset, 1))
        assert first.base_offset <= offset <= first.last_offset
    assert log.offset_for_timestamp(1000 + end - 1) == (end - 1, 1000 + end - 1)
    assert log.offset_for_timestamp(1000 + end) is None

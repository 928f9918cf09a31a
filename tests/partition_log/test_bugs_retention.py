"""B15 of the catalogue: retention deletes segments holding offsets at or
above the high watermark, records that followers may not have yet (a
failover then loses them: lost-write; a consumer never reads them:
unseen). With the bug off, retention stops at the high watermark."""

from __future__ import annotations

import bugs
from bugs import Bug
from partition_log.files import MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.log_config import LogConfig
from tests.partition_log.log_util import batch, offsets_of, read_batches

DAY = 24 * 3600 * 1000
SMALL = LogConfig(
    segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=1000, retention_ms=DAY
)


def _old_log_committed_to(high_watermark: int) -> PartitionLog:
    """20 one-record batches over several segments, a day old, committed up
    to ``high_watermark``."""
    log = PartitionLog.open(MemoryDirectory(), SMALL, now_ms=0)
    for _ in range(20):
        log.append_as_leader(batch(timestamp=1000), 0, 0)
    log.maybe_increment_high_watermark(high_watermark)
    assert len(log.segments) > 3
    return log


def test_retention_keeps_every_segment_holding_an_uncommitted_offset() -> None:
    log = _old_log_committed_to(7)
    assert log.maybe_delete_segments(2 * DAY)
    assert log.log_start_offset <= 7
    kept = [first for first, _ in offsets_of(read_batches(log))]
    assert kept[-1] == 19 and set(range(7, 20)) <= set(kept)


def test_b15_retention_deletes_above_the_high_watermark() -> None:
    log = _old_log_committed_to(7)
    with bugs.injected(Bug.RETENTION_ABOVE_HW):
        assert log.maybe_delete_segments(2 * DAY)
    # Every segment went, the uncommitted offsets 7..19 with them.
    assert log.log_start_offset == 20 > log.high_watermark
    assert read_batches(log) == []

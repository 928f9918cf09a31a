"""A new leader's epoch start (``maybe_assign_epoch_start_offset``)."""

from __future__ import annotations

import pytest

from partition_log import LogConfig, PartitionLog
from partition_log.batch import build_batch
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, decode_checkpoint
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.records import Record


def _batch(value: bytes) -> bytes:
    return build_batch([Record(0, 1, b"k", value)])


def _checkpoint(directory: MemoryDirectory) -> list[tuple[int, int]]:
    handle = directory.open(CHECKPOINT_FILE_NAME)
    try:
        return [(e.epoch, e.start_offset) for e in decode_checkpoint(handle.read(0, handle.size))]
    finally:
        handle.close()


def test_new_leader_records_its_epoch_at_the_log_end_before_any_append() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(_batch(b"a"), 1, now_ms=1)
    log.append_as_leader(_batch(b"b"), 1, now_ms=1)
    assert log.maybe_assign_epoch_start_offset(3)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries] == [(1, 0), (3, 2)]
    # Checkpointed, so a follower's divergence check finds where epoch 1 ends.
    assert _checkpoint(directory) == [(1, 0), (3, 2)]
    assert log.epoch_cache.end_offset_for_epoch(1, log.log_end_offset).end_offset == 2
    # The same epoch again changes nothing.
    assert not log.maybe_assign_epoch_start_offset(3)
    info = log.append_as_leader(_batch(b"c"), 3, now_ms=2)
    assert info.first_offset == 2
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries] == [(1, 0), (3, 2)]


def test_an_older_epoch_is_refused_and_changes_nothing() -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(_batch(b"a"), 4, now_ms=1)
    with pytest.raises(PartitionLogError) as raised:
        log.maybe_assign_epoch_start_offset(3)
    assert raised.value.code is Errors.INVALID_RECORD
    assert "older than the log's latest epoch 4" in str(raised.value)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries] == [(4, 0)]


def test_a_truncation_at_the_end_drops_the_entry_of_a_leader_that_never_appended() -> None:
    # UnifiedLog.truncateTo: "we may have a conflicting epoch entry at the end
    # of the log from the leader... [it] inserted the first start offset
    # entry, but then failed to append any entries before another leader was
    # elected", so a follower truncating to its end drops it.
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, LogConfig(), now_ms=0)
    log.append_as_leader(_batch(b"a"), 1, now_ms=1)
    log.maybe_assign_epoch_start_offset(2)
    assert log.truncate_to(1) == 1
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries] == [(1, 0)]
    assert _checkpoint(directory) == [(1, 0)]

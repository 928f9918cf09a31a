"""Transactions in the partition log: a coordinator's markers appended by
the leader (and a client's control batch refused), the last stable offset
that open transactions and unreplicated markers hold back, and the same
state on a follower, after an unclean reopen and after a truncation."""

from __future__ import annotations

import pytest

import bugs
from bugs import Bug
from partition_log.batch import build_batch
from partition_log.cleaner import LogCleaner
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.log import SNAPSHOT_SUFFIX, AppendOrigin, CleanupPolicy, LogConfig, PartitionLog
from partition_log.records import Record
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch, encode_marker
from tests.partition_log.log_util import files, read_batches

COORDINATOR = AppendOrigin.COORDINATOR
# Small segments, so that rolls (and their producer snapshots) come often.
SMALL = LogConfig(segment_bytes=400, index_interval_bytes=100, flush_messages=1)


class Writer:
    """Appends as a leader: each producer's transactional batches, in
    sequence, and its coordinator's markers."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.sequences: dict[int, int] = {}

    def data(self, pid: int, *, epoch: int = 0, txn: bool = True, count: int = 1) -> int:
        sequence = self.sequences.get(pid, 0)
        records = [Record(i, 1_000, b"k%d" % i, b"v") for i in range(count)]
        data = build_batch(
            records,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            transactional=txn,
        )
        self.sequences[pid] = sequence + count
        return self.log.append_as_leader(data, 0, now_ms=1_000).first_offset

    def end(self, pid: int, kind: ControlType, *, epoch: int = 0, coordinator: int = 1) -> int:
        marker = build_marker_batch(pid, epoch, EndTxnMarker(kind, coordinator), 1_000)
        return self.log.append_as_leader(marker, 0, 1_000, origin=COORDINATOR).first_offset


def _open(directory: MemoryDirectory | None = None) -> PartitionLog:
    return PartitionLog.open(directory or MemoryDirectory(), SMALL, now_ms=0)


def test_a_clients_control_batch_is_refused_and_changes_nothing() -> None:
    log = _open()
    Writer(log).data(7)
    before = files(log.directory)  # type: ignore[arg-type]
    marker = build_marker_batch(7, 0, EndTxnMarker(ControlType.COMMIT, 1), 0)
    with pytest.raises(PartitionLogError, match="clients may not write control batches") as no:
        log.append_as_leader(marker, 0, now_ms=0)
    assert no.value.code is Errors.INVALID_RECORD
    assert files(log.directory) == before  # type: ignore[arg-type]
    assert log.producer_state.ongoing == {0: 7}


def test_a_malformed_marker_is_refused_by_name() -> None:
    log = _open()
    Writer(log).data(7)
    key, _ = encode_marker(EndTxnMarker(ControlType.ABORT, 1))
    bad = build_batch(
        [Record(0, 0, key, b"\x00")],
        producer_id=7,
        producer_epoch=0,
        transactional=True,
        control=True,
    )
    with pytest.raises(PartitionLogError, match="ABORT marker value of 1 bytes"):
        log.append_as_leader(bad, 0, 0, origin=COORDINATOR)
    assert log.log_end_offset == 1 and log.producer_state.ongoing == {0: 7}


def test_the_last_stable_offset_waits_for_the_open_transaction_and_its_marker() -> None:
    log = _open()
    w = Writer(log)
    w.data(9, txn=False)  # 0: an idempotent producer's, no transaction
    first = w.data(7, count=2)  # 1-2
    w.data(9, txn=False)  # 3
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert (log.high_watermark, log.last_stable_offset) == (4, first)
    marker = w.end(7, ControlType.COMMIT)  # 4
    log.maybe_increment_high_watermark(marker)  # the marker not yet below it
    assert log.last_stable_offset == first
    log.maybe_increment_high_watermark(marker + 1)
    assert log.last_stable_offset == log.high_watermark == 5


def test_transactions_of_two_producers_hold_the_stable_offset_in_turn() -> None:
    log = _open()
    w = Writer(log)
    a = w.data(1)
    b = w.data(2)
    w.end(1, ControlType.ABORT)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == b > a
    w.end(2, ControlType.COMMIT)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == log.log_end_offset


def test_a_zombie_coordinators_marker_is_refused() -> None:
    log = _open()
    w = Writer(log)
    w.data(7)
    w.end(7, ControlType.COMMIT, coordinator=5)
    w.data(7)
    with pytest.raises(PartitionLogError) as fenced:
        w.end(7, ControlType.ABORT, coordinator=4)
    assert fenced.value.code is Errors.TRANSACTION_COORDINATOR_FENCED
    assert log.producer_state.ongoing == {2: 7}


def _sample(log: PartitionLog) -> tuple[int, int]:
    """A committed transaction of producer 1 between open ones of producers 2
    and 3, over several segments; returns (first offset of 2's, of 3's)."""
    w = Writer(log)
    w.data(1, count=3)
    two = w.data(2)
    w.data(1)
    w.end(1, ControlType.COMMIT)
    three = w.data(3, count=2)
    w.data(2)
    return two, three


def test_a_follower_keeps_the_leaders_transactions() -> None:
    leader = _open()
    two, three = _sample(leader)
    follower = _open()
    for data in read_batches(leader):
        follower.append_as_follower(data)
    assert follower.producer_state.ongoing == leader.producer_state.ongoing == {two: 2, three: 3}
    follower.maybe_increment_high_watermark(follower.log_end_offset)
    assert follower.last_stable_offset == two


@pytest.mark.parametrize("clean", [True, False])
def test_a_reopened_log_knows_its_open_transactions(clean: bool) -> None:
    directory = MemoryDirectory()
    log = _open(directory)
    two, three = _sample(log)
    assert len(log.segment_base_offsets) >= 2
    if clean:
        log.close()
    else:
        directory.crash()  # every append was synced (flush_messages=1)
        # No snapshot: the state comes from every batch, the marker too
        # (below the recovery point, then in the rescanned segment).
        for name in directory.list():
            if name.endswith(SNAPSHOT_SUFFIX):
                directory.delete(name)
    reopened = _open(directory)
    assert reopened.recovery.clean is clean
    assert reopened.producer_state.ongoing == {two: 2, three: 3}
    reopened.maybe_increment_high_watermark(reopened.log_end_offset)
    assert reopened.last_stable_offset == two


def test_truncating_a_marker_away_opens_its_transaction_again() -> None:
    log = _open()
    w = Writer(log)
    first = w.data(1, count=2)
    marker = w.end(1, ControlType.ABORT)
    w.data(2, txn=False)
    log.maybe_increment_high_watermark(marker)
    assert log.producer_state.ongoing == {}
    # Rebuilt from the log (no snapshot yet): the marker, kept, ends it.
    log.truncate_to(marker + 1)
    assert log.producer_state.ongoing == {}
    log.truncate_to(marker)
    assert log.producer_state.ongoing == {first: 1}
    assert log.last_stable_offset == first


def test_the_cleaner_stops_at_an_open_transaction() -> None:
    log = PartitionLog.open(
        MemoryDirectory(),
        LogConfig(
            segment_bytes=200, index_interval_bytes=100, cleanup_policy=CleanupPolicy.COMPACT
        ),
        now_ms=0,
    )
    w = Writer(log)
    for _ in range(3):
        w.data(9, txn=False, count=2)
    first = w.data(7)
    for _ in range(6):
        w.data(9, txn=False, count=2)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert len(log.segment_base_offsets) > 2 and log.last_stable_offset == first
    cleaner = LogCleaner({"t": log})
    assert cleaner.prospects("t", now_ms=1_000).first_uncleanable_offset == first
    w.end(7, ControlType.COMMIT)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert cleaner.prospects("t", now_ms=1_000).first_uncleanable_offset > first


@pytest.mark.parametrize("how", ["reopen", "truncate"])
def test_reading_the_last_stable_offset_changes_nothing(how: str) -> None:
    """The markers a rebuild replays below the high watermark are forgotten
    when the state is rebuilt, not when the property is read."""
    directory = MemoryDirectory()
    log = _open(directory)
    w = Writer(log)
    w.data(1)
    aborted = w.end(1, ControlType.ABORT)
    open_first = w.data(2)
    w.data(3, txn=False)
    end = log.log_end_offset
    log.maybe_increment_high_watermark(end)
    if how == "reopen":
        # Unclean, without snapshots: the open replays every batch.
        directory.crash()
        for name in directory.list():
            if name.endswith(SNAPSHOT_SUFFIX):
                directory.delete(name)
        log = PartitionLog.open(directory, SMALL, now_ms=0, high_watermark=end)
    else:
        log.truncate_to(end)  # nothing cut; the state is as it was
        log.truncate_to(end - 1)
    # Rebuilt from the batches, the abort below the high watermark is
    # already forgotten: only the open transaction holds the offset back.
    assert aborted < log.high_watermark
    assert log.producer_state.unreplicated == {}
    before = (dict(log.producer_state.ongoing), dict(log.producer_state.unreplicated))
    assert log.last_stable_offset == open_first == log.last_stable_offset
    assert (log.producer_state.ongoing, log.producer_state.unreplicated) == before


def test_b23_the_last_stable_offset_runs_past_an_open_transaction() -> None:
    log = _open()
    w = Writer(log)
    first = w.data(7, count=2)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == first
    with bugs.injected(Bug.LSO_PAST_OPEN_TXN):
        assert log.last_stable_offset == log.high_watermark == 2


def test_a_newer_epochs_batch_may_not_join_a_transaction_whose_marker_is_missing() -> None:
    """An epoch bump comes after the marker that ends the producer's
    transaction here; a batch of a newer epoch while the older one's is
    open would join it (and its later marker would end both), so it is
    refused and changes nothing."""
    log = _open()
    w = Writer(log)
    first = w.data(7, epoch=0)
    end = log.log_end_offset
    w.sequences[7] = 0
    with pytest.raises(PartitionLogError) as caught:
        w.data(7, epoch=2)
    assert caught.value.code is Errors.INVALID_TXN_STATE
    assert f"from offset {first}" in str(caught.value)
    assert log.log_end_offset == end
    # Once the marker is there, the newer epoch starts its own transaction.
    w.end(7, ControlType.ABORT, epoch=1)
    w.sequences[7] = 0
    second = w.data(7, epoch=2)
    log.maybe_increment_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == second

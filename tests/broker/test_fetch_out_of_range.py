"""A follower's fetch the leader answers ``OFFSET_OUT_OF_RANGE`` carries the
leader's log start and end (``docs/brokers.md``: kq's answer in place of
Kafka's ListOffsets round trip), so that the follower takes the right one
of ``fetchOffsetAndTruncate``'s cases; without them it computed a
truncation to -1, which the log refuses, and backed off forever."""

from __future__ import annotations

from broker.errors import Errors
from broker.replica import FollowerStep, MappingBrokerView, PartitionReplica, ReplicaConfig
from metadata.image import PartitionRegistration
from partition_log.batch import build_batch
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.records import Record
from tests.broker.cluster import value_batch
from tests.broker.test_leader import brokers, fetch, make_leader


def leader_from_3(isr: tuple[int, ...] = (0, 1, 2)) -> PartitionReplica:
    """A leader of five records whose log starts at 3 (DeleteRecords)."""
    leader = make_leader(isr, records=5)
    log = leader.log
    assert isinstance(log, PartitionLog)
    log.maybe_increment_high_watermark(5)
    log.delete_records(3)
    return leader


def test_a_fetch_below_the_log_start_is_answered_with_the_logs_bounds() -> None:
    leader = leader_from_3()
    for last_fetched_epoch in (0, -1):  # the divergence check, and the read
        answer = leader.step_fetch(fetch(1, 1, last_fetched_epoch=last_fetched_epoch), 2_000)
        assert answer.answer.error is Errors.OFFSET_OUT_OF_RANGE
        got = answer.answer
        assert (got.high_watermark, got.log_start_offset, got.log_end_offset) == (5, 3, 5)


def test_a_follower_behind_the_leaders_log_start_restarts_there_and_catches_up() -> None:
    leader = leader_from_3(isr=(0, 2))
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    log.append_as_leader(value_batch(b"old"), 0, 0)
    follower = PartitionReplica(1, log, ReplicaConfig(), MappingBrokerView(brokers()))
    follower.become_follower(
        PartitionRegistration((0, 1, 2), (0, 1, 2), leader=0, leader_epoch=1, partition_epoch=5),
        now_ms=1_000,
    )
    request = follower.next_fetch_request(101)
    assert request is not None and request.fetch_offset == 1
    outcome = follower.step_fetch_answer(request, leader.step_fetch(request, 2_000).answer, 2_000)
    # The leader's log starts past ours: ours restarts there (docs/brokers.md).
    assert outcome.step is FollowerStep.FETCH and outcome.start_at == 3
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (3, 3, 3)
    request = follower.next_fetch_request(101)
    assert request is not None and request.fetch_offset == 3
    outcome = follower.step_fetch_answer(request, leader.step_fetch(request, 2_100).answer, 2_100)
    assert outcome.appended_to == 5 and log.read(3, 1 << 20) == leader.log.read(3, 1 << 20)
    # Caught up with the leader's HW: the leader asks to take it back in.
    request = follower.next_fetch_request(101)
    assert request is not None
    alter = leader.step_fetch(request, 2_200).alter_partition
    assert alter is not None and alter.isr == (0, 1, 2)


def test_a_follower_restarted_inside_a_batch_starts_at_the_batchs_first_offset() -> None:
    """DeleteRecords put the leader's log start at 3, inside its one batch
    of offsets 0-4: a follower behind it restarts at 3, and the leader serves
    the whole batch from 0. The follower's log is empty, so it restarts at
    the batch's first offset and appends it (Kafka's answer to
    UnexpectedAppendOffsetException in Partition); then its log start
    follows the leader's up to 3 again."""
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    log.append_as_leader(build_batch([Record(i, 1000, b"k", b"v%d" % i) for i in range(5)]), 0, 0)
    leader = PartitionReplica(0, log, ReplicaConfig(), MappingBrokerView(brokers()))
    leader.become_leader(
        PartitionRegistration((0, 1, 2), (0, 2), leader=0, leader_epoch=1, partition_epoch=5),
        now_ms=1_000,
    )
    log.maybe_increment_high_watermark(5)
    log.delete_records(3)
    mine = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    follower = PartitionReplica(1, mine, ReplicaConfig(), MappingBrokerView(brokers()))
    follower.become_follower(
        PartitionRegistration((0, 1, 2), (0, 2), leader=0, leader_epoch=1, partition_epoch=5),
        now_ms=1_000,
    )
    request = follower.next_fetch_request(101)
    assert request is not None and request.fetch_offset == 0
    outcome = follower.step_fetch_answer(request, leader.step_fetch(request, 2_000).answer, 2_000)
    assert outcome.start_at == 3 and mine.log_end_offset == 3
    request = follower.next_fetch_request(101)
    assert request is not None and request.fetch_offset == 3
    answer = leader.step_fetch(request, 2_100).answer
    assert answer.error is Errors.NONE and answer.records  # the whole batch, from 0
    outcome = follower.step_fetch_answer(request, answer, 2_100)
    assert outcome.step is FollowerStep.FETCH and outcome.start_at == 0
    assert outcome.appended_to == 5 and mine.log_end_offset == 5
    # The log start follows the leader's once the HW passed it.
    assert mine.high_watermark == 5 and mine.log_start_offset == 3
    assert mine.read(3, 1 << 20) == log.read(3, 1 << 20)

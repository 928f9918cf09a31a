"""The follower's rules, one test each (brokers.md §1.4, KIP-101, KIP-279)."""

from __future__ import annotations

from broker.errors import Errors
from broker.replica import (
    DivergingEpoch,
    FetchAnswer,
    FetchRequest,
    FollowerStep,
    MappingBrokerView,
    PartitionReplica,
    ReplicaConfig,
    Restart,
    Role,
    Truncation,
)
from broker.replica.follower import OutOfRange, backs_off, out_of_range
from broker.replica.types import FollowerOutcome
from metadata.image import PartitionRegistration
from partition_log.batch import build_batch
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.records import Record
from tests.broker.cluster import value_batch


def follower_with(
    epochs: list[int], high_watermark: int = 0, leader_epoch: int = 9
) -> PartitionReplica:
    """A follower of broker 1 whose log has one batch per entry of
    ``epochs`` (the epoch each was written in)."""
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    for i, epoch in enumerate(epochs):
        log.append_as_leader(value_batch(b"f%d" % i), epoch, 0)
    log.maybe_increment_high_watermark(high_watermark)
    replica = PartitionReplica(0, log, ReplicaConfig(), MappingBrokerView({}))
    replica.become_follower(
        PartitionRegistration(
            (0, 1), (0, 1), leader=1, leader_epoch=leader_epoch, partition_epoch=3
        ),
        now_ms=0,
    )
    return replica


def request_of(replica: PartitionReplica) -> FetchRequest:
    request = replica.next_fetch_request(broker_epoch=77)
    assert request is not None
    return request


def test_become_follower_never_truncates_to_the_high_watermark() -> None:
    # KIP-101 scenario 1: the tail above the HW may be committed on the leader.
    replica = follower_with([1, 1, 1], high_watermark=1)
    assert replica.log.log_end_offset == 3
    assert replica.role is Role.FOLLOWER


def test_next_fetch_request_from_the_log_end_with_the_latest_epoch() -> None:
    replica = follower_with([1, 2, 2])
    request = request_of(replica)
    assert (request.replica_id, request.replica_epoch) == (0, 77)
    assert (request.fetch_offset, request.last_fetched_epoch, request.current_leader_epoch) == (
        3,
        2,
        9,
    )
    empty = follower_with([])
    assert request_of(empty).last_fetched_epoch == -1


def test_no_fetch_without_a_leader() -> None:
    replica = follower_with([1])
    replica.become_follower(
        PartitionRegistration((0, 1), (0, 1), leader=-1, leader_epoch=10, partition_epoch=4), 0
    )
    assert replica.next_fetch_request(77) is None


def test_an_answer_for_an_older_fetch_state_is_ignored() -> None:
    replica = follower_with([1, 1])
    request = request_of(replica)
    replica.become_follower(
        PartitionRegistration((0, 1), (0, 1), leader=1, leader_epoch=10, partition_epoch=4), 0
    )
    answer = FetchAnswer(Errors.NONE, 0, 0, 2, diverging_epoch=DivergingEpoch(0, 0))
    assert replica.step_fetch_answer(request, answer, 0).step is FollowerStep.STALE
    assert replica.log.log_end_offset == 2


def test_divergence_on_a_known_epoch_truncates_once() -> None:
    replica = follower_with([1, 1, 1, 2])
    request = request_of(replica)
    outcome = replica.step_fetch_answer(
        request, FetchAnswer(Errors.NONE, 0, 0, 5, diverging_epoch=DivergingEpoch(1, 2)), 0
    )
    assert outcome.truncation == Truncation(4, 2, completed=True)
    assert replica.log.log_end_offset == 2


def test_divergence_on_an_unknown_epoch_takes_several_rounds() -> None:
    # KIP-279: our epochs 1, 2, 4; the leader's 1, 3, 5. It answers epoch 3,
    # which we never had: cut at the end of our floor epoch (2) and ask
    # again with epoch 2, which it answers with epoch 1 ending at 2.
    replica = follower_with([1, 1, 2, 4])
    first = replica.step_fetch_answer(
        request_of(replica),
        FetchAnswer(Errors.NONE, 0, 0, 5, diverging_epoch=DivergingEpoch(3, 4)),
        0,
    )
    assert first.truncation == Truncation(4, 3, completed=False)
    second_request = request_of(replica)
    assert second_request.last_fetched_epoch == 2
    second = replica.step_fetch_answer(
        second_request, FetchAnswer(Errors.NONE, 0, 0, 5, diverging_epoch=DivergingEpoch(1, 2)), 0
    )
    assert second.truncation == Truncation(3, 2, completed=True)


def test_records_are_appended_and_the_hw_is_the_leaders_clamped_to_our_end() -> None:
    replica = follower_with([])
    records = build_batch(
        [Record(0, 1, b"k", b"v"), Record(1, 1, b"k", b"w")], partition_leader_epoch=1
    )
    outcome = replica.step_fetch_answer(
        request_of(replica), FetchAnswer(Errors.NONE, 5, 0, 5, records=records), 0
    )
    assert outcome.appended_to == 2 and outcome.high_watermark_moved
    assert replica.log.high_watermark == 2  # min(leader's 5, our LEO 2)
    outcome = replica.step_fetch_answer(request_of(replica), FetchAnswer(Errors.NONE, 1, 0, 5), 0)
    assert replica.log.high_watermark == 2  # never backwards here


def test_out_of_range_cases() -> None:
    assert out_of_range(10, 0, 8) == OutOfRange(truncate_to=8)
    assert out_of_range(10, 12, 20) == OutOfRange(start_at=12)
    assert out_of_range(10, 5, 20) == OutOfRange()


def test_out_of_range_truncates_to_a_shorter_leader() -> None:
    replica = follower_with([1, 1, 1])
    answer = FetchAnswer(Errors.OFFSET_OUT_OF_RANGE, 0, 0, 1)
    outcome = replica.step_fetch_answer(request_of(replica), answer, 0)
    assert outcome.truncation == Truncation(3, 1, completed=True)
    assert outcome.step is FollowerStep.FETCH


def test_out_of_range_past_our_log_restarts_it_at_the_leaders_log_start() -> None:
    # truncateFullyAndStartAt: everything we hold lies below the leader's
    # log start, gone there too; the log restarts there and fetches on.
    replica = follower_with([1, 1, 2], high_watermark=2)
    outcome = replica.step_fetch_answer(
        request_of(replica), FetchAnswer(Errors.OFFSET_OUT_OF_RANGE, 55, 50, 60), 1_000
    )
    assert outcome.step is FollowerStep.FETCH and outcome.error is Errors.OFFSET_OUT_OF_RANGE
    assert outcome.restart == Restart(0, 3, 50) and outcome.start_at == 50
    assert outcome.truncation is None and outcome.high_watermark_moved
    log = replica.log
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (50, 50, 50)
    assert log.epoch_cache.entries == ()
    # The next fetch asks from the new start with no last fetched epoch.
    request = request_of(replica)
    assert (request.fetch_offset, request.last_fetched_epoch) == (50, -1)
    assert request.log_start_offset == 50
    # The leader's records from there append; the HW follows the leader's.
    records = build_batch([Record(50, 1, b"k", b"v")], base_offset=50, partition_leader_epoch=9)
    outcome = replica.step_fetch_answer(
        request, FetchAnswer(Errors.NONE, 51, 50, 60, records=records), 1_100
    )
    assert outcome.appended_to == 51 and log.high_watermark == 51
    assert outcome.restart is None and outcome.start_at is None


def test_out_of_range_restart_that_the_log_refuses_backs_off() -> None:
    replica = follower_with([1])
    log = replica.log
    assert isinstance(log, PartitionLog)
    log.close()
    outcome = replica.step_fetch_answer(
        request_of(replica), FetchAnswer(Errors.OFFSET_OUT_OF_RANGE, 0, 50, 60), 0
    )
    assert outcome.step is FollowerStep.BACKOFF and outcome.restart is None
    assert outcome.error is Errors.KAFKA_STORAGE_ERROR


def test_fenced_leader_epoch_waits_for_newer_metadata() -> None:
    replica = follower_with([1])
    outcome = replica.step_fetch_answer(
        request_of(replica), FetchAnswer(Errors.FENCED_LEADER_EPOCH), 0
    )
    assert outcome.step is FollowerStep.WAIT_FOR_METADATA
    assert replica.next_fetch_request(77) is None
    replica.become_follower(
        PartitionRegistration((0, 1), (0, 1), leader=1, leader_epoch=10, partition_epoch=4), 0
    )
    assert replica.next_fetch_request(77) is not None


def test_retriable_errors_back_off() -> None:
    replica = follower_with([1])
    for error in (Errors.UNKNOWN_LEADER_EPOCH, Errors.NOT_LEADER_OR_FOLLOWER):
        outcome = replica.step_fetch_answer(request_of(replica), FetchAnswer(error), 0)
        assert outcome.step is FollowerStep.BACKOFF and outcome.error is error


def test_a_refused_append_backs_off_with_the_logs_code() -> None:
    # A batch below the log end (past it is a compacted leader's gap, taken).
    replica = follower_with([1, 1, 1])
    misplaced = build_batch([Record(1, 1, b"k", b"v")], base_offset=1, partition_leader_epoch=1)
    outcome = replica.step_fetch_answer(
        request_of(replica), FetchAnswer(Errors.NONE, 0, 0, 6, records=misplaced), 0
    )
    assert outcome.step is FollowerStep.BACKOFF
    assert outcome.error is Errors.OFFSET_OUT_OF_RANGE
    assert replica.log.log_end_offset == 3


def test_the_fetcher_backs_off_where_kafka_delays_the_partition() -> None:
    # processFetchRequest: an error it could not act on, or a local refusal
    # of the answer (partitionsWithError), waits replica.fetch.backoff.ms.
    assert backs_off(Errors.NONE, FollowerOutcome(FollowerStep.BACKOFF))
    assert backs_off(
        Errors.NOT_LEADER_OR_FOLLOWER,
        FollowerOutcome(FollowerStep.BACKOFF, error=Errors.NOT_LEADER_OR_FOLLOWER),
    )
    assert backs_off(
        Errors.FENCED_LEADER_EPOCH,
        FollowerOutcome(FollowerStep.WAIT_FOR_METADATA, error=Errors.FENCED_LEADER_EPOCH),
    )
    # A partition no longer fetched here: the answer's error decides.
    assert backs_off(Errors.UNKNOWN_LEADER_EPOCH, None)
    assert not backs_off(Errors.NONE, None)
    # handleOutOfRangeError resolved it (a truncation or a restart): at once.
    assert not backs_off(
        Errors.OFFSET_OUT_OF_RANGE,
        FollowerOutcome(FollowerStep.FETCH, error=Errors.OFFSET_OUT_OF_RANGE),
    )
    assert not backs_off(Errors.NONE, FollowerOutcome(FollowerStep.FETCH, appended_to=3))
    assert not backs_off(Errors.NONE, FollowerOutcome(FollowerStep.STALE))

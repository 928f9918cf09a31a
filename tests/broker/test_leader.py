"""The leader's rules, one test each (brokers.md §1.3, §1.4, §1.7, §1.8)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.errors import Errors, ReplicaError
from broker.replica import (
    AlterPartitionRequest,
    AlterPartitionResult,
    DivergingEpoch,
    FetchRequest,
    MappingBrokerView,
    PartitionReplica,
    ReplicaConfig,
    ReplicaLog,
)
from broker.replica.leader import (
    AlterPartitionErrorAction,
    RemoteReplica,
    acks_check,
    alter_partition_error_action,
    check_current_leader_epoch,
    fetch_divergence,
    high_watermark_candidate,
    is_broker_epoch_isr_eligible,
    is_follower_in_sync,
    out_of_sync_replicas,
    reset_replica,
    update_fetch_state,
)
from metadata.image import BrokerRegistration, PartitionRegistration
from metadata.records import LeaderRecoveryState
from partition_log.epoch_cache import LeaderEpochCache
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from tests.broker.cluster import value_batch

LAG = 10_000


def registration(
    broker_id: int, epoch: int, *, fenced: bool = False, in_controlled_shutdown: bool = False
) -> BrokerRegistration:
    return BrokerRegistration(broker_id, epoch, "inc", (), None, (), fenced, in_controlled_shutdown)


def brokers() -> dict[int, BrokerRegistration]:
    """Brokers 0..2, unfenced, at broker epochs 100..102."""
    return {b: registration(b, 100 + b) for b in range(3)}


def make_leader(
    isr: tuple[int, ...] = (0, 1, 2),
    *,
    min_isr: int = 1,
    leader_epoch: int = 1,
    view: MappingBrokerView | None = None,
    records: int = 0,
    recovery: LeaderRecoveryState = LeaderRecoveryState.RECOVERED,
) -> PartitionReplica:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    for i in range(records):
        log.append_as_leader(value_batch(b"old%d" % i), 0, 0)
    replica = PartitionReplica(
        0,
        log,
        ReplicaConfig(replica_lag_time_max_ms=LAG, min_insync_replicas=min_isr),
        view or MappingBrokerView(brokers()),
    )
    replica.become_leader(
        PartitionRegistration(
            (0, 1, 2),
            isr,
            leader=0,
            leader_epoch=leader_epoch,
            partition_epoch=5,
            leader_recovery_state=recovery,
        ),
        now_ms=1_000,
    )
    return replica


def fetch(
    replica_id: int,
    offset: int,
    *,
    epoch: int | None = 1,
    last_fetched_epoch: int = -1,
    broker_epoch: int | None = None,
) -> FetchRequest:
    return FetchRequest(
        replica_id,
        100 + replica_id if broker_epoch is None else broker_epoch,
        epoch,
        offset,
        last_fetched_epoch,
        0,
        1 << 20,
    )


# -- epochs ---------------------------------------------------------------------------


def test_current_leader_epoch_older_fenced_newer_unknown_absent_unchecked() -> None:
    assert check_current_leader_epoch(3, 4) is Errors.FENCED_LEADER_EPOCH
    assert check_current_leader_epoch(5, 4) is Errors.UNKNOWN_LEADER_EPOCH
    assert check_current_leader_epoch(4, 4) is Errors.NONE
    assert check_current_leader_epoch(None, 4) is Errors.NONE


@pytest.mark.parametrize(
    ("epoch", "error"), [(0, Errors.FENCED_LEADER_EPOCH), (2, Errors.UNKNOWN_LEADER_EPOCH)]
)
def test_fetch_with_a_wrong_epoch_is_answered_with_the_current_leader(
    epoch: int, error: Errors
) -> None:
    leader = make_leader()
    answer = leader.step_fetch(fetch(1, 0, epoch=epoch), 2_000).answer
    assert answer.error is error
    assert (answer.current_leader, answer.current_leader_epoch) == (0, 1)
    assert leader.remotes[1].log_end_offset == -1  # nothing recorded


def test_unknown_replica_gets_unknown_leader_epoch() -> None:
    answer = make_leader().step_fetch(fetch(7, 0), 2_000).answer
    assert answer.error is Errors.UNKNOWN_LEADER_EPOCH
    assert "replica 7" in answer.message
    # Without a leader epoch (an old follower): not a follower.
    answer = make_leader().step_fetch(fetch(7, 0, epoch=None), 2_000).answer
    assert answer.error is Errors.NOT_LEADER_OR_FOLLOWER


def test_not_leader_answers_not_leader_or_follower() -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    replica = PartitionReplica(0, log, ReplicaConfig(), MappingBrokerView(brokers()))
    assert replica.step_fetch(fetch(1, 0), 0).answer.error is Errors.NOT_LEADER_OR_FOLLOWER


def test_stale_broker_epoch_is_refused_and_minus_one_accepted() -> None:
    leader = make_leader(records=1)
    stale = leader.step_fetch(fetch(1, 1, broker_epoch=50), 2_000)
    assert stale.answer.error is Errors.NOT_LEADER_OR_FOLLOWER
    assert leader.remotes[1].log_end_offset == -1
    ok = leader.step_fetch(fetch(1, 1, broker_epoch=-1), 2_000)
    assert ok.answer.error is Errors.NONE
    assert leader.remotes[1].log_end_offset == 1


# -- divergence (Partition.readRecords) -----------------------------------------------------


def cache(*entries: tuple[int, int]) -> LeaderEpochCache:
    c = LeaderEpochCache()
    for epoch, start in entries:
        c = c.assign(epoch, start)
    return c


def test_divergence_rules() -> None:
    c = cache((1, 0), (3, 10))  # epoch 1 is [0, 10), epoch 3 from 10; LEO 15

    def check(offset: int, last: int, start: int = 0) -> Errors | DivergingEpoch | None:
        return fetch_divergence(
            c,
            log_start_offset=start,
            log_end_offset=15,
            fetch_offset=offset,
            last_fetched_epoch=last,
        )

    assert check(12, -1) is None  # no last fetched epoch: no check
    assert check(12, 3) is None  # same epoch, not past its end
    assert check(8, 1) is None  # inside epoch 1
    # Epoch 2 never existed here: the floor epoch 1 and its end.
    assert check(12, 2) == DivergingEpoch(1, 10)
    # Epoch 1 ended at 10 here; the follower has more of it.
    assert check(12, 1) == DivergingEpoch(1, 10)
    # An epoch newer than any of ours has no end we can tell.
    assert check(12, 4) is Errors.OFFSET_OUT_OF_RANGE
    # Below the log start: out of range before any divergence.
    assert check(3, 1, start=5) is Errors.OFFSET_OUT_OF_RANGE


def test_divergence_answer_carries_no_records_and_leaves_the_follower_state() -> None:
    leader = make_leader(records=3)  # epoch 0 at [0, 3), epoch 1 from 3
    outcome = leader.step_fetch(fetch(1, 5, last_fetched_epoch=0), 2_000)
    assert outcome.answer.diverging_epoch == DivergingEpoch(0, 3)
    assert outcome.answer.records == b""
    assert leader.remotes[1].log_end_offset == -1


# -- the follower's fetch state (Replica.updateFetchStateOrThrow) ----------------------


def test_last_caught_up_time_rules() -> None:
    r = RemoteReplica(1, last_fetch_leader_log_end_offset=10, last_fetch_time_ms=500)
    at_end = update_fetch_state(
        r,
        fetch_offset=12,
        log_start_offset=0,
        fetch_time_ms=900,
        leader_end_offset=12,
        broker_epoch=1,
    )
    assert at_end.last_caught_up_time_ms == 900
    # Behind the current LEO but at the LEO of the previous fetch: caught up
    # at the previous fetch's time.
    at_previous = update_fetch_state(
        r,
        fetch_offset=10,
        log_start_offset=0,
        fetch_time_ms=900,
        leader_end_offset=12,
        broker_epoch=1,
    )
    assert at_previous.last_caught_up_time_ms == 500
    behind = update_fetch_state(
        r,
        fetch_offset=9,
        log_start_offset=0,
        fetch_time_ms=900,
        leader_end_offset=12,
        broker_epoch=1,
    )
    assert behind.last_caught_up_time_ms == 0
    assert behind.last_fetch_leader_log_end_offset == 12 and behind.log_end_offset == 9


def test_reset_replica_new_leader_forgets_the_log_end() -> None:
    r = RemoteReplica(1, log_end_offset=7, broker_epoch=3, last_caught_up_time_ms=5)
    fresh = reset_replica(r, 100, is_new_leader=True, in_sync=True)
    assert (fresh.log_end_offset, fresh.broker_epoch, fresh.last_caught_up_time_ms) == (
        -1,
        None,
        100,
    )
    kept = reset_replica(r, 100, is_new_leader=False, in_sync=False)
    assert (kept.log_end_offset, kept.last_caught_up_time_ms) == (7, 0)


def test_become_leader_records_the_epoch_at_the_log_end_and_holds_the_hw() -> None:
    leader = make_leader(records=4, leader_epoch=2)
    assert leader.log.epoch_cache.latest_entry is not None
    assert (
        leader.log.epoch_cache.latest_epoch,
        leader.log.epoch_cache.latest_entry.start_offset,
    ) == (2, 4)
    assert leader.leader_epoch_start_offset == 4
    # The followers' LEOs are unknown: the HW stays until they fetch.
    assert leader.log.high_watermark == 0
    assert not leader.maybe_increment_leader_hw(2_000)
    leader.step_fetch(fetch(1, 4, epoch=2, last_fetched_epoch=0), 2_000)
    assert leader.log.high_watermark == 0  # 2 has not fetched
    leader.step_fetch(fetch(2, 4, epoch=2, last_fetched_epoch=0), 2_000)
    assert leader.log.high_watermark == 4


def test_stale_registration_is_ignored() -> None:
    leader = make_leader()
    old = PartitionRegistration((0, 1, 2), (0,), leader=0, leader_epoch=1, partition_epoch=4)
    assert not leader.become_leader(old, 2_000)
    assert leader.isr == (0, 1, 2)


# -- the HW ------------------------------------------------------------------------------


def test_hw_is_the_minimum_over_the_maximal_isr_and_caught_up_eligible() -> None:
    remotes = [
        RemoteReplica(1, log_end_offset=7, last_caught_up_time_ms=0, broker_epoch=101),
        RemoteReplica(2, log_end_offset=5, last_caught_up_time_ms=9_000, broker_epoch=102),
    ]
    # 2 is not in the ISR but caught up and eligible: it holds the HW back.
    assert high_watermark_candidate(10, remotes, (0, 1), 10_000, LAG, lambda r: True) == 5
    # Not eligible (fenced, say): it does not.
    assert (
        high_watermark_candidate(10, remotes, (0, 1), 10_000, LAG, lambda r: r.broker_id == 1) == 7
    )
    # Not caught up for longer than the lag: it does not.
    assert high_watermark_candidate(10, remotes, (0, 1), 30_000, LAG, lambda r: True) == 7


def test_hw_frozen_under_min_isr() -> None:
    leader = make_leader(isr=(0,), min_isr=2)
    leader.append_as_leader(value_batch(b"a"), 1, 2_000)
    assert leader.log.high_watermark == 0
    assert not leader.maybe_increment_leader_hw(2_000)
    leader_one = make_leader(isr=(0,), min_isr=1)
    leader_one.append_as_leader(value_batch(b"a"), 1, 2_000)
    assert leader_one.log.high_watermark == 1


# -- ISR expansion ------------------------------------------------------------------------


def test_follower_in_sync_needs_the_hw_and_the_epoch_start() -> None:
    assert is_follower_in_sync(10, 8, 10)
    assert not is_follower_in_sync(9, 8, 10)  # KAFKA-7128: below the epoch start
    assert not is_follower_in_sync(7, 8, 5)  # below the HW
    assert not is_follower_in_sync(10, 8, None)  # not leader


def test_broker_epoch_eligibility() -> None:
    assert is_broker_epoch_isr_eligible(5, 5)
    assert is_broker_epoch_isr_eligible(-1, 5)
    assert not is_broker_epoch_isr_eligible(4, 5)  # a fetch from a previous life
    assert not is_broker_epoch_isr_eligible(None, 5)  # no fetch in this leadership
    assert not is_broker_epoch_isr_eligible(5, None)  # fenced or unregistered


def test_expansion_requests_alter_partition_with_broker_epochs() -> None:
    leader = make_leader(isr=(0, 1))
    outcome = leader.step_fetch(fetch(2, 0), 2_000)
    request = outcome.alter_partition
    assert request is not None
    assert request.isr == (0, 1, 2)
    assert [(m.broker_id, m.broker_epoch) for m in request.new_isr] == [(0, 100), (1, -1), (2, 102)]
    assert (request.leader_epoch, request.partition_epoch) == (1, 5)
    # A pending expansion counts for the HW at once.
    assert leader.maximal_isr == (0, 1, 2) and leader.isr == (0, 1)


@pytest.mark.parametrize("why", ["fenced", "in_controlled_shutdown", "epoch"])
def test_ineligible_replicas_do_not_join(why: str) -> None:
    registrations = brokers()
    registrations[2] = {
        "fenced": registration(2, 102, fenced=True),
        "in_controlled_shutdown": registration(2, 102, in_controlled_shutdown=True),
        "epoch": registration(2, 500),  # re-registered since its fetch
    }[why]
    view = MappingBrokerView(registrations)
    leader = make_leader(isr=(0, 1), view=view)
    outcome = leader.step_fetch(fetch(2, 0, broker_epoch=102), 2_000)
    assert outcome.alter_partition is None


def test_follower_below_epoch_start_does_not_join() -> None:
    leader = make_leader(isr=(0, 1), records=3)  # epoch start 3, HW 0
    assert leader.step_fetch(fetch(2, 2, last_fetched_epoch=0), 2_000).alter_partition is None
    assert leader.step_fetch(fetch(2, 3, last_fetched_epoch=0), 2_000).alter_partition is not None


def test_one_alter_partition_in_flight() -> None:
    leader = make_leader(isr=(0,))
    assert leader.step_fetch(fetch(1, 0), 2_000).alter_partition is not None
    assert leader.step_fetch(fetch(2, 0), 2_000).alter_partition is None
    assert leader.tick_isr(100_000) is None


# -- ISR shrink ------------------------------------------------------------------------------


def test_out_of_sync_replicas() -> None:
    remotes = {
        1: RemoteReplica(1, log_end_offset=10, last_caught_up_time_ms=0),
        2: RemoteReplica(2, log_end_offset=5, last_caught_up_time_ms=0),
    }
    # 1 is at the leader's LEO: caught up whatever the time.
    assert out_of_sync_replicas((0, 1, 2), 0, remotes, 10, 20_000, LAG) == (2,)
    assert out_of_sync_replicas((0, 1, 2), 0, remotes, 10, LAG, LAG) == ()


def test_shrink_counts_for_the_hw_only_once_committed() -> None:
    leader = make_leader(isr=(0, 1, 2))
    leader.step_fetch(fetch(1, 0), 2_000)
    leader.step_fetch(fetch(2, 0), 2_000)
    leader.append_as_leader(value_batch(b"a"), -1, 2_000)
    leader.step_fetch(fetch(1, 1), 3_000)
    assert leader.log.high_watermark == 0  # 2 holds it
    request = leader.tick_isr(3_000 + LAG + 1)
    assert request is not None and request.isr == (0, 1)
    assert leader.check_enough_replicas_reach_offset(1, 1).done is False
    assert not leader.maybe_increment_leader_hw(3_000 + LAG + 1)  # pending shrink: not yet
    moved = leader.step_alter_partition_result(
        request,
        AlterPartitionResult(0, 1, 6, (0, 1), LeaderRecoveryState.RECOVERED),
        3_000 + LAG + 1,
    )
    # KAFKA-13091: the HW is re-checked when the shrink commits.
    assert moved and leader.log.high_watermark == 1
    assert leader.check_enough_replicas_reach_offset(1, 1).done


# -- AlterPartition answers ------------------------------------------------------------------


def test_alter_partition_error_actions() -> None:
    A = AlterPartitionErrorAction
    assert alter_partition_error_action(Errors.OPERATION_NOT_ATTEMPTED) is A.RESET
    assert alter_partition_error_action(Errors.INELIGIBLE_REPLICA) is A.RESET
    for error in (
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.UNKNOWN_TOPIC_ID,
        Errors.FENCED_LEADER_EPOCH,
        Errors.INVALID_UPDATE_VERSION,
        Errors.INVALID_REQUEST,
        Errors.NEW_LEADER_ELECTED,
    ):
        assert alter_partition_error_action(error) is A.WAIT
    assert alter_partition_error_action(Errors.REQUEST_TIMED_OUT) is A.RETRY
    with pytest.raises(ValueError, match="NONE"):
        alter_partition_error_action(Errors.NONE)


def pending_expansion() -> tuple[PartitionReplica, AlterPartitionRequest]:
    leader = make_leader(isr=(0, 1))
    request = leader.step_fetch(fetch(2, 0), 2_000).alter_partition
    assert request is not None
    return leader, request


def test_ineligible_replica_resets_to_the_committed_isr() -> None:
    leader, request = pending_expansion()
    assert leader.step_alter_partition_error(request, Errors.INELIGIBLE_REPLICA) is None
    assert not leader.isr_state.is_inflight and leader.maximal_isr == (0, 1)


def test_fenced_epoch_waits_for_metadata_and_new_metadata_resets() -> None:
    leader, request = pending_expansion()
    assert leader.step_alter_partition_error(request, Errors.FENCED_LEADER_EPOCH) is None
    assert leader.isr_state.is_inflight
    leader.become_leader(
        PartitionRegistration((0, 1, 2), (0, 1), leader=0, leader_epoch=1, partition_epoch=6), 3_000
    )
    assert not leader.isr_state.is_inflight


def test_other_errors_retry_the_same_request() -> None:
    leader, request = pending_expansion()
    assert leader.step_alter_partition_error(request, Errors.REQUEST_TIMED_OUT) == request
    assert leader.isr_state.is_inflight


def test_answers_not_for_the_pending_request_are_ignored() -> None:
    leader, request = pending_expansion()
    other = replace(request, partition_epoch=4)
    ok = AlterPartitionResult(0, 1, 6, (0, 1, 2), LeaderRecoveryState.RECOVERED)
    assert not leader.step_alter_partition_result(other, ok, 3_000)
    assert leader.step_alter_partition_error(other, Errors.INELIGIBLE_REPLICA) is None
    assert leader.isr_state.is_inflight
    # Another leader epoch, or an older partition epoch: ignored.
    leader.step_alter_partition_result(request, replace(ok, leader_epoch=2), 3_000)
    leader.step_alter_partition_result(request, replace(ok, partition_epoch=4), 3_000)
    assert leader.isr_state.is_inflight and leader.isr == (0, 1)
    leader.step_alter_partition_result(request, ok, 3_000)
    assert leader.isr == (0, 1, 2) and leader.partition_epoch == 6


def test_recovering_leader_reports_recovered() -> None:
    # KIP-704: elected uncleanly, the leader's log is the truth; its next
    # AlterPartition says so.
    leader = make_leader(isr=(0,), recovery=LeaderRecoveryState.RECOVERING)
    request = leader.step_fetch(fetch(1, 0), 2_000).alter_partition
    assert request is not None
    assert request.leader_recovery_state is LeaderRecoveryState.RECOVERED


# -- produce ------------------------------------------------------------------------------------


def test_acks_all_refused_before_append_under_min_isr() -> None:
    leader = make_leader(isr=(0, 1), min_isr=3)
    with pytest.raises(ReplicaError) as refused:
        leader.append_as_leader(value_batch(b"a"), -1, 2_000)
    assert refused.value.code is Errors.NOT_ENOUGH_REPLICAS
    assert leader.log.log_end_offset == 0  # nothing written
    leader.append_as_leader(value_batch(b"a"), 1, 2_000)  # acks=1 is taken
    assert leader.log.log_end_offset == 1


def test_acks_values_and_not_leader() -> None:
    leader = make_leader()
    with pytest.raises(ReplicaError) as refused:
        leader.append_as_leader(value_batch(b"a"), 2, 2_000)
    assert refused.value.code is Errors.INVALID_REQUIRED_ACKS
    follower = PartitionReplica(
        0, PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0), ReplicaConfig(),
        MappingBrokerView(brokers()),
    )  # fmt: skip
    with pytest.raises(ReplicaError) as refused:
        follower.append_as_leader(value_batch(b"a"), 1, 2_000)
    assert refused.value.code is Errors.NOT_LEADER_OR_FOLLOWER


def test_acks_check() -> None:
    assert acks_check(5, 5, 2, 2).done and acks_check(5, 5, 2, 2).error is Errors.NONE
    late = acks_check(5, 5, 2, 1)
    assert late.done and late.error is Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert not acks_check(4, 5, 2, 2).done


def test_acks_after_losing_leadership_is_not_leader() -> None:
    leader = make_leader()
    append = leader.append_as_leader(value_batch(b"a"), -1, 2_000)
    leader.become_follower(
        PartitionRegistration((0, 1, 2), (0, 1, 2), leader=1, leader_epoch=2, partition_epoch=6),
        3_000,
    )
    check = leader.check_enough_replicas_reach_offset(
        append.info.last_offset + 1, append.leader_epoch
    )
    assert check.done and check.error is Errors.NOT_LEADER_OR_FOLLOWER


def test_latest_offset_not_available_below_the_epoch_start() -> None:
    leader = make_leader(records=2, leader_epoch=3)
    with pytest.raises(ReplicaError) as refused:
        leader.latest_offset()
    assert refused.value.code is Errors.OFFSET_NOT_AVAILABLE
    leader.step_fetch(fetch(1, 2, epoch=3, last_fetched_epoch=0), 2_000)
    leader.step_fetch(fetch(2, 2, epoch=3, last_fetched_epoch=0), 2_000)
    assert leader.latest_offset() == 2


def test_partition_log_is_a_replica_log() -> None:
    # The seam is structural: mypy checks this assignment (tests are typed).
    log: ReplicaLog = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    assert log.log_end_offset == 0 and log.epoch_cache.latest_epoch == -1


def test_roles_refused_outside_the_replicas_and_for_the_wrong_leader() -> None:
    leader = make_leader()
    moved = PartitionRegistration((1, 2), (1, 2), leader=1, leader_epoch=2, partition_epoch=6)
    with pytest.raises(ValueError, match=r"broker 0 is not a replica .*\[1, 2\]"):
        leader.become_follower(moved, 2_000)
    led_by_1 = PartitionRegistration(
        (0, 1, 2), (0, 1, 2), leader=1, leader_epoch=2, partition_epoch=6
    )
    with pytest.raises(ValueError, match="led by 1"):
        leader.become_leader(led_by_1, 2_000)
    led_by_0 = PartitionRegistration(
        (0, 1, 2), (0, 1, 2), leader=0, leader_epoch=2, partition_epoch=6
    )
    with pytest.raises(ValueError, match="call become_leader"):
        leader.become_follower(led_by_0, 2_000)
    assert leader.leader_epoch == 1  # nothing changed

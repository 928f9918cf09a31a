"""DeleteRecords replicated (brokers.md §1.4): the leader moves its own log
start (``Partition.deleteRecordsOnLeader``), each follower moves its own
from the leader's log start in its fetch answers
(``ReplicaFetcherThread.processPartitionData``), the leader learns the
followers' log starts from their fetches, and the request is done once
the low watermark reached its offset (``Partition.lowWatermarkIfLeader``,
``DelayedDeleteRecords``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.errors import Errors, ReplicaError
from broker.replica import (
    DeleteRecordsCheck,
    DeleteRecordsResult,
    DivergingEpoch,
    FetchAnswer,
    FollowerStep,
    MappingBrokerView,
    PartitionReplica,
    ReplicaConfig,
)
from broker.replica.follower import follower_log_start
from broker.replica.leader import RemoteReplica, low_watermark
from metadata.image import PartitionRegistration
from partition_log.errors import PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.log_config import CleanupPolicy
from tests.broker.cluster import Cluster, value_batch


def filled(n: int = 3, records: int = 6) -> Cluster:
    """``records`` records on every replica, all committed."""
    cluster = Cluster(n)
    for i in range(records):
        assert cluster.produce(b"v%d" % i) is Errors.NONE
    cluster.replicate()
    assert cluster.leader.log.high_watermark == records
    return cluster


def starts(cluster: Cluster) -> list[int]:
    return [node.log.log_start_offset for node in cluster.nodes]


# -- the low watermark (pure) ------------------------------------------------------------


def test_low_watermark_is_the_smallest_log_start_over_live_replicas() -> None:
    remotes = [RemoteReplica(1, log_start_offset=3), RemoteReplica(2, log_start_offset=5)]
    assert low_watermark(6, remotes, lambda b: True) == 3
    # The leader's own start counts.
    assert low_watermark(2, remotes, lambda b: True) == 2
    # A replica on a fenced broker is not waited for (hasAliveBroker).
    assert low_watermark(6, remotes, lambda b: b != 1) == 5
    # A live follower that has not fetched in this leadership holds it at -1.
    assert low_watermark(6, [RemoteReplica(1)], lambda b: True) == -1


def test_follower_log_start_is_the_leaders_never_past_its_own_hw() -> None:
    assert follower_log_start(4, 6) == 4
    assert follower_log_start(9, 6) == 6


# -- the leader ------------------------------------------------------------------------------


def test_delete_moves_only_the_leaders_log_and_waits_for_the_followers() -> None:
    cluster = filled()
    leader = cluster.leader.replica
    result = leader.delete_records(4, cluster.now_ms)
    # The followers last reported log start 0: the low watermark is theirs.
    assert result == DeleteRecordsResult(4, 0)
    assert starts(cluster) == [4, 0, 0]
    assert leader.check_delete_records(4) == DeleteRecordsCheck(False, 0)
    # Follower 1 fetches: its answer carries the leader's start, it moves.
    outcome = cluster.fetch(1)
    assert outcome is not None and outcome.log_start_moved_to == 4
    # The leader learns it from the next fetch, which moves the low
    # watermark only once the last live follower reported 4.
    request = cluster.nodes[1].replica.next_fetch_request(cluster.broker_epoch(1))
    assert request is not None and request.log_start_offset == 4
    assert not leader.step_fetch(request, cluster.now_ms).low_watermark_moved
    assert leader.check_delete_records(4) == DeleteRecordsCheck(False, 0)
    cluster.fetch(2)
    request = cluster.nodes[2].replica.next_fetch_request(cluster.broker_epoch(2))
    assert request is not None
    assert leader.step_fetch(request, cluster.now_ms).low_watermark_moved
    assert leader.check_delete_records(4) == DeleteRecordsCheck(True, 4)
    assert leader.low_watermark() == 4
    assert starts(cluster) == [4, 4, 4]


def test_delete_above_the_hw_is_refused_and_moves_nothing() -> None:
    cluster = filled()
    cluster.produce(b"uncommitted")  # LEO 7, HW 6: no follower fetched it
    with pytest.raises(ReplicaError) as refused:
        cluster.leader.replica.delete_records(7, cluster.now_ms)
    assert refused.value.code is Errors.OFFSET_OUT_OF_RANGE
    with pytest.raises(ReplicaError) as negative:
        cluster.leader.replica.delete_records(-2, cluster.now_ms)
    assert negative.value.code is Errors.OFFSET_OUT_OF_RANGE
    assert starts(cluster) == [0, 0, 0]


def test_a_compacted_topic_refuses_the_delete_and_moves_nothing() -> None:
    cluster = filled()
    for node in cluster.nodes:
        node.log.config = replace(node.log.config, cleanup_policy=CleanupPolicy.COMPACT)
    with pytest.raises(ReplicaError) as refused:
        cluster.leader.replica.delete_records(4, cluster.now_ms)
    assert refused.value.code is Errors.POLICY_VIOLATION
    assert "cleanup.policy" in str(refused.value)
    assert starts(cluster) == [0, 0, 0]
    # compact,delete deletes as delete does (Kafka's LogConfig.delete).
    for node in cluster.nodes:
        node.log.config = replace(
            node.log.config, cleanup_policy=CleanupPolicy.COMPACT | CleanupPolicy.DELETE
        )
    assert cluster.leader.replica.delete_records(4, cluster.now_ms).requested_offset == 4


def test_delete_to_minus_one_deletes_up_to_the_hw() -> None:
    cluster = filled()
    result = cluster.leader.replica.delete_records(-1, cluster.now_ms)
    assert result.requested_offset == 6 and cluster.leader.log.log_start_offset == 6


def test_only_a_leader_deletes_and_a_lost_leadership_ends_the_wait() -> None:
    cluster = filled()
    follower = cluster.nodes[1].replica
    with pytest.raises(ReplicaError) as refused:
        follower.delete_records(2, cluster.now_ms)
    assert refused.value.code is Errors.NOT_LEADER_OR_FOLLOWER
    with pytest.raises(ReplicaError):
        follower.low_watermark()
    assert follower.check_delete_records(2) == DeleteRecordsCheck(
        True, error=Errors.NOT_LEADER_OR_FOLLOWER
    )
    assert starts(cluster) == [0, 0, 0]


def test_a_fenced_followers_log_start_is_not_waited_for() -> None:
    cluster = filled()
    cluster.kill(2)  # fenced, out of the ISR
    leader = cluster.leader.replica
    leader.delete_records(3, cluster.now_ms)
    cluster.replicate()
    assert leader.check_delete_records(3) == DeleteRecordsCheck(True, 3)
    # It learns the start from its first answer once back.
    cluster.restart(2)
    cluster.replicate()
    assert starts(cluster) == [3, 3, 3]


def test_an_elr_member_on_a_fenced_broker_is_waited_for() -> None:
    # KIP-966 may elect it once unfenced, before it fetched: a delete
    # answered NONE must be on it already (kq's addition to
    # lowWatermarkIfLeader, which skips every fenced broker).
    remotes = [RemoteReplica(1, log_start_offset=3), RemoteReplica(2, log_start_offset=0)]
    assert low_watermark(6, remotes, lambda b: b != 2) == 3
    assert low_watermark(6, remotes, lambda b: b != 2, electable=(2,)) == 0
    cluster = filled()
    cluster.nodes[2].alive = False
    cluster.registrations[2] = replace(cluster.registrations[2], fenced=True)
    p = cluster.partition
    cluster.publish(replace(p, isr=(0, 1), elr=(2,), partition_epoch=p.partition_epoch + 1))
    leader = cluster.leader.replica
    leader.delete_records(3, cluster.now_ms)
    cluster.replicate()
    assert leader.check_delete_records(3) == DeleteRecordsCheck(False, 0)
    # Out of the ELR (the controller dropped it), it is no longer waited for.
    p = cluster.partition
    cluster.publish(replace(p, elr=(), partition_epoch=p.partition_epoch + 1))
    assert leader.check_delete_records(3) == DeleteRecordsCheck(True, 3)


def test_the_elr_comes_from_the_image_after_the_leaders_own_shrink() -> None:
    # The leader commits its ISR shrink from the AlterPartition answer
    # (partition epoch and all) before the image of that state arrives; the
    # image, the same epochs again, still gives the ELR the answer lacks.
    cluster = Cluster(3, min_isr=2, lag_ms=100)
    cluster.produce(b"a")
    cluster.replicate()
    cluster.produce(b"b", acks=1)
    cluster.tick(50)
    cluster.fetch(1)
    cluster.fetch(1)  # at the LEO; 2 stops fetching
    cluster.tick(200)
    p = cluster.partition
    assert p.isr == (0, 1)
    leader = cluster.leader.replica
    assert (leader.partition_epoch, leader.elr) == (p.partition_epoch, ())
    assert not leader.become_leader(replace(p, elr=(2,)), cluster.now_ms)
    assert leader.elr == (2,)
    # An older image changes nothing.
    leader.become_leader(replace(p, elr=(), partition_epoch=p.partition_epoch - 1), 0)
    assert leader.elr == (2,)


def test_a_new_leader_waits_for_every_live_follower_to_fetch_again() -> None:
    # A new leader forgets what it knew of its followers (their log start
    # is unknown until they fetch in its epoch): -1 until then.
    cluster = filled()
    cluster.leader.replica.delete_records(2, cluster.now_ms)
    cluster.replicate()
    cluster.elect(1)
    leader = cluster.leader.replica
    assert leader.low_watermark() == -1
    cluster.replicate()
    assert leader.low_watermark() == 2


# -- the follower ---------------------------------------------------------------------------


def follower(records: int, high_watermark: int) -> PartitionReplica:
    """Broker 0 following broker 1 (epoch 9), ``records`` records of epoch 9."""
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    for i in range(records):
        log.append_as_leader(value_batch(b"f%d" % i), 9, 0)
    log.maybe_increment_high_watermark(high_watermark)
    replica = PartitionReplica(0, log, ReplicaConfig(), MappingBrokerView({}))
    replica.become_follower(
        PartitionRegistration((0, 1), (0, 1), leader=1, leader_epoch=9, partition_epoch=3),
        now_ms=0,
    )
    return replica


def answer_with(log_start: int, high_watermark: int = 6) -> FetchAnswer:
    return FetchAnswer(Errors.NONE, high_watermark, log_start, 6)


def test_follower_moves_its_log_start_to_the_leaders_never_backwards() -> None:
    replica = follower(6, 6)
    request = replica.next_fetch_request(77)
    assert request is not None
    outcome = replica.step_fetch_answer(request, answer_with(4), 0)
    assert (outcome.step, outcome.log_start_moved_to) == (FollowerStep.FETCH, 4)
    assert replica.log.log_start_offset == 4
    # The segments wholly below are gone: a read below fails.
    with pytest.raises(PartitionLogError):
        replica.log.read(0, 1 << 20)
    # A leader whose log starts lower (another leader, which had not moved
    # yet) does not move ours back; nor does an unknown start.
    for lower in (2, -1):
        outcome = replica.step_fetch_answer(request, answer_with(lower), 0)
        assert outcome.log_start_moved_to is None
        assert replica.log.log_start_offset == 4
    # Its next fetch reports it to the leader.
    next_request = replica.next_fetch_request(77)
    assert next_request is not None and next_request.log_start_offset == 4


def test_follower_log_start_never_passes_its_own_hw() -> None:
    # An answer whose log start is past what we may call committed: the
    # start stops at our HW (here 3: the leader's HW is 3 in the answer).
    replica = follower(6, 0)
    request = replica.next_fetch_request(77)
    assert request is not None
    outcome = replica.step_fetch_answer(request, answer_with(5, high_watermark=3), 0)
    assert replica.log.high_watermark == 3
    assert outcome.log_start_moved_to == 3 and replica.log.log_start_offset == 3


def test_a_divergence_answer_does_not_move_the_log_start() -> None:
    # Kafka handles a DivergingEpoch answer without processPartitionData:
    # no HW, no log start until the truncation is done.
    replica = follower(6, 6)
    request = replica.next_fetch_request(77)
    assert request is not None
    answer = replace(answer_with(4), diverging_epoch=DivergingEpoch(9, 6))
    outcome = replica.step_fetch_answer(request, answer, 0)
    assert outcome.log_start_moved_to is None and replica.log.log_start_offset == 0


# -- through a failover ------------------------------------------------------------------


def test_deleted_records_stay_deleted_when_a_follower_becomes_leader() -> None:
    # The review's reproduction: delete to 4, elect a follower; its log
    # start was 0 again and the deleted records readable.
    cluster = filled()
    leader = cluster.leader.replica
    leader.delete_records(4, cluster.now_ms)
    cluster.replicate()
    assert leader.check_delete_records(4).done
    cluster.kill(0)
    new = cluster.leader
    assert new.broker_id != 0
    assert new.log.log_start_offset == 4
    with pytest.raises(PartitionLogError) as gone:
        new.log.read(0, 1 << 20)
    assert gone.value.code.name == "OFFSET_OUT_OF_RANGE"
    # The new leader answers its follower's fetches with that start, and
    # reads from 4 give the records 4 and 5 only.
    cluster.replicate()
    assert starts(cluster)[1:] == [4, 4]
    assert cluster.nodes[0].alive is False
    cluster.restart(0)
    cluster.replicate()
    assert starts(cluster) == [4, 4, 4]
    assert sorted(cluster.committed()) == [4, 5]


def test_deleted_records_stay_deleted_when_the_leadership_moves_cleanly() -> None:
    # The same with a preferred-leader style move: every replica alive, the
    # old leader following the new one.
    cluster = filled()
    cluster.leader.replica.delete_records(4, cluster.now_ms)
    cluster.replicate()
    cluster.elect(1)
    assert cluster.leader.log.log_start_offset == 4
    cluster.produce(b"after")
    cluster.replicate()
    assert starts(cluster) == [4, 4, 4]
    assert sorted(cluster.committed()) == [4, 5, 6]
    assert cluster.inconsistent() == {}

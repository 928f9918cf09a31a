"""The deliberate bugs of the brokers' replication (``bugs.Bug`` B1-B10, R2,
R9, R10), each at the line of the real code that keeps its rule: with the
bug on the rule is observably broken, with it off the same steps hold.
The simulator's scenarios (``test_sim_scenarios.py``) show the loss each
one causes; these tests show the broken decision itself, on the broker's
service and replicas."""

from __future__ import annotations

import pytest

import bugs
from broker.errors import Errors, ReplicaError
from broker.replica import (
    AcksCheck,
    AlterPartitionRequest,
    BrokerState,
    DivergingEpoch,
    FetchAnswer,
    MappingBrokerView,
    PartitionReplica,
)
from bugs import Bug
from kqproto import broker_pb2_grpc
from metadata.records import LeaderRecoveryState
from quorum.driver.tls import dial
from tests.broker.cluster import value_batch
from tests.broker.images import topic
from tests.broker.test_leader import LAG, brokers, fetch, make_leader, registration
from tests.broker.test_service import (
    Brokers,
    Certs,
    batch,
    certs,
    part,
    produce,
    run,
    serving,
    values,
)
from tests.broker.test_service import fetch as consumer_fetch
from tests.broker.test_sim_controller import controller as sim_controller

__all__ = ["certs"]

E = Errors


# -- B10: consumers read up to the LEO ----------------------------------------------------


def test_b10_a_consumer_fetch_reads_past_the_hw(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            # acks=1: on the leader, not on the follower, so above the HW.
            one = await stub.Produce(produce("t", 0, batch(b"x", b"y"), acks=1))
            assert part(one).error == E.NONE
            answer = part(await stub.Fetch(consumer_fetch("t", 0, 0)))
            assert answer.high_watermark == 0 and answer.records == b""
            with bugs.injected(Bug.CONSUME_TO_LEO):
                broken = part(await stub.Fetch(consumer_fetch("t", 0, 0)))
            # Records no failover is bound to keep reach the consumer.
            assert broken.high_watermark == 0 and values(broken.records) == [0]
            again = part(await stub.Fetch(consumer_fetch("t", 0, 0)))
            assert again.records == b""

    run(body)


# -- the leader's rules (the replicas of test_leader.py) ----------------------------------


def test_b5_the_hw_is_the_leaders_leo_and_acks_all_is_answered_at_the_append() -> None:
    def append() -> PartitionReplica:
        leader = make_leader(isr=(0, 1, 2), min_isr=2)
        leader.step_fetch(fetch(1, 0), 2_000)
        leader.step_fetch(fetch(2, 0), 2_000)
        leader.append_as_leader(value_batch(b"a"), -1, 2_000)
        return leader

    leader = append()
    assert leader.log.high_watermark == 0  # the followers are at 0
    assert not leader.check_enough_replicas_reach_offset(1, 1).done
    with bugs.injected(Bug.HW_AT_LEADER_LEO):
        broken = append()
        assert broken.log.high_watermark == 1
        assert broken.check_enough_replicas_reach_offset(1, 1) == AcksCheck(True, Errors.NONE)


def test_b7_a_pending_shrink_counts_toward_the_hw() -> None:
    def pending_shrink() -> PartitionReplica:
        leader = make_leader(isr=(0, 1, 2))
        leader.step_fetch(fetch(1, 0), 2_000)
        leader.step_fetch(fetch(2, 0), 2_000)
        leader.append_as_leader(value_batch(b"a"), -1, 2_000)
        leader.step_fetch(fetch(1, 1), 3_000)
        request = leader.tick_isr(3_000 + LAG + 1)
        assert request is not None and request.isr == (0, 1)
        leader.maybe_increment_leader_hw(3_000 + LAG + 1)
        return leader

    leader = pending_shrink()
    assert leader.maximal_isr == (0, 1, 2) and leader.log.high_watermark == 0
    with bugs.injected(Bug.PENDING_SHRINK_COUNTS):
        broken = pending_shrink()
        # 2 still holds it in the committed ISR; the AlterPartition may fail.
        assert broken.isr == (0, 1, 2) and broken.maximal_isr == (0, 1)
        assert broken.log.high_watermark == 1


@pytest.mark.parametrize("why", ["fenced", "in_controlled_shutdown"])
def test_b8_the_leader_proposes_an_ineligible_replica(why: str) -> None:
    def follower_fetch() -> AlterPartitionRequest | None:
        registrations = brokers()
        registrations[2] = {
            "fenced": registration(2, 102, fenced=True),
            "in_controlled_shutdown": registration(2, 102, in_controlled_shutdown=True),
        }[why]
        leader = make_leader(isr=(0, 1), view=MappingBrokerView(registrations))
        return leader.step_fetch(fetch(2, 0, broker_epoch=102), 2_000).alter_partition

    assert follower_fetch() is None
    with bugs.injected(Bug.EXPAND_WITH_INELIGIBLE):
        request = follower_fetch()
    assert request is not None and request.isr == (0, 1, 2)


def test_b8_the_controller_stub_admits_a_stale_broker_epoch() -> None:
    c = sim_controller()
    c.fence(2)
    stale = c.registrations[2].epoch
    c.register(2, 5, unclean_shutdown=True)  # a new broker epoch
    p = c.partitions[0]
    states = (BrokerState(0, c.registrations[0].epoch), BrokerState(1, -1), BrokerState(2, stale))
    request = AlterPartitionRequest(
        p.leader, p.leader_epoch, p.partition_epoch, states, LeaderRecoveryState.RECOVERED
    )
    assert c.alter_partition(0, request) == (None, Errors.INELIGIBLE_REPLICA)
    with bugs.injected(Bug.EXPAND_WITH_INELIGIBLE):
        result, error = c.alter_partition(0, request)
    assert error is Errors.NONE and result is not None and result.isr == (0, 1, 2)


def test_b4_expansion_at_the_hw_below_the_epoch_start() -> None:
    def at_hw() -> AlterPartitionRequest | None:
        leader = make_leader(isr=(0, 1), records=3)  # epoch start 3, HW 0
        return leader.step_fetch(fetch(2, 2, last_fetched_epoch=0), 2_000).alter_partition

    assert at_hw() is None
    with bugs.injected(Bug.EXPAND_WITHOUT_EPOCH_START):
        assert at_hw() is not None


def test_b6_and_r10_the_hw_and_acks_all_under_min_isr() -> None:
    def alone() -> PartitionReplica:
        leader = make_leader(isr=(0,), min_isr=2)
        leader.append_as_leader(value_batch(b"a"), 1, 2_000)
        return leader

    assert alone().log.high_watermark == 0
    with pytest.raises(ReplicaError, match="smaller than min.insync.replicas 2"):
        alone().append_as_leader(value_batch(b"b"), -1, 2_000)
    with bugs.injected(Bug.HW_UNDER_MIN_ISR):
        # KAFKA-15583 undone: the HW moves; acks=all is still refused.
        assert alone().log.high_watermark == 1
        with pytest.raises(ReplicaError, match="min.insync.replicas"):
            alone().append_as_leader(value_batch(b"b"), -1, 2_000)
    with bugs.injected(Bug.IGNORE_MIN_ISR):
        leader = alone()
        assert leader.log.high_watermark == 1 and leader.min_isr == 1
        leader.append_as_leader(value_batch(b"b"), -1, 2_000)
        assert leader.check_enough_replicas_reach_offset(2, 1) == AcksCheck(True, Errors.NONE)


def test_r2_the_leader_reads_at_a_diverging_followers_offset() -> None:
    def diverging() -> FetchAnswer:
        leader = make_leader(isr=(0, 1, 2), records=3, leader_epoch=2)
        # The follower wrote offset 1 in an epoch 1 this leader never had.
        return leader.step_fetch(fetch(1, 2, epoch=2, last_fetched_epoch=1), 2_000).answer

    assert diverging().diverging_epoch == DivergingEpoch(0, 3)
    with bugs.injected(Bug.NO_DIVERGENCE_CHECK):
        answer = diverging()
    # Offset 2 onwards is read and appended after the follower's own offset 1.
    assert answer.error is Errors.NONE and answer.diverging_epoch is None
    assert values(answer.records) == [2]


# -- a new leader's epoch start entry (B3) ------------------------------------------------


def test_b3_a_new_leader_does_not_cache_its_epoch_and_a_later_epoch_is_out_of_range() -> None:
    def follower_of_a_later_epoch() -> tuple[PartitionReplica, FetchAnswer]:
        # The leader wrote epoch 0 up to 2; the follower wrote epoch 1 from
        # 1 under another leader, then this one was elected in epoch 2.
        leader = make_leader(isr=(0, 1, 2), records=2, leader_epoch=2)
        return leader, leader.step_fetch(fetch(1, 4, epoch=2, last_fetched_epoch=1), 2_000).answer

    leader, answer = follower_of_a_later_epoch()
    assert [(e.epoch, e.start_offset) for e in leader.log.epoch_cache.entries] == [(0, 0), (2, 2)]
    # KIP-279: the follower learns that epoch 0 ends at 2 and cuts there.
    assert answer.diverging_epoch == DivergingEpoch(0, 2)
    with bugs.injected(Bug.NO_EPOCH_START_ENTRY):
        leader, answer = follower_of_a_later_epoch()
        assert [(e.epoch, e.start_offset) for e in leader.log.epoch_cache.entries] == [(0, 0)]
        # The leader cannot tell where epoch 1 ends: no divergence point.
        assert answer.error is Errors.OFFSET_OUT_OF_RANGE and answer.diverging_epoch is None
        # Its first write in epoch 2 records the epoch after all.
        leader.append_as_leader(value_batch(b"a"), 1, 2_000)
        assert leader.log.epoch_cache.latest_epoch == 2

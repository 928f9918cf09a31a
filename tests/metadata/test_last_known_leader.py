"""KIP-966's last known leader on the controller: when every ISR and ELR
member of a partition restarted uncleanly (a kill of every replica at once),
the leader the partition had when its ISR became empty is elected, in an
unclean election, once it is unfenced; otherwise the partition would stay
offline for ever.  The rules of one change follow Kafka's
PartitionChangeBuilder (``canElectLastKnownLeader``,
``maybeUpdateLastKnownLeader``) and its PartitionChangeBuilderTest
(``testEligibleLeaderReplicas_IsrCanShrinkToZero``,
``testEligibleLeaderReplicas_ElectLastKnownLeader``,
``testEligibleLeaderReplicas_ElectLastKnownLeaderShouldFail``), with
KAFKA-19522 (Kafka 4.1: a fenced last known leader is not elected); the
controller's, its ReplicationControlManager's unclean shutdown handling."""

from __future__ import annotations

import random
from collections.abc import Iterable

import bugs
from bugs import Bug
from metadata.controller import Controller
from metadata.image import PartitionRegistration
from metadata.partition_change import Election, PartitionChange
from metadata.records import (
    NO_LEADER,
    LeaderRecoveryState,
    PartitionChangeRecord,
)
from metadata.requests import ControllerOptions, HeartbeatRequest
from tests.metadata.controller_model import CLUSTER_ID, Harness, image_violations

RECOVERED = LeaderRecoveryState.RECOVERED
RECOVERING = LeaderRecoveryState.RECOVERING


def change(
    p: PartitionRegistration, live: Iterable[int], **kwargs: object
) -> PartitionChangeRecord | None:
    ids = set(live)
    c = PartitionChange("T", 0, p, lambda b: b in ids)
    for key, value in kwargs.items():
        setattr(c, key, value)
    return c.build()


# -- the rules of one change (Kafka's PartitionChangeBuilderTest) -----------------------


def test_the_isr_shrinking_to_zero_remembers_its_last_leader() -> None:
    # Kafka's testEligibleLeaderReplicas_IsrCanShrinkToZero: every replica
    # is fenced at once, min ISR 3.
    p = PartitionRegistration((1, 2, 3, 4), (1, 2, 3, 4), leader=1, leader_epoch=100)
    record = change(p, [], target_isr=(), min_isr=3)
    assert record is not None
    assert (record.leader, record.isr, record.elr) == (NO_LEADER, (), (1, 2, 3, 4))
    assert record.last_known_elr == (1,)
    p = p.merge(record)
    # An unclean restart of one of them keeps the last known leader.
    record = change(p, [], min_isr=3, unclean_shutdown=(2,))
    assert record is not None and record.elr == (1, 3, 4) and record.last_known_elr is None
    # Without the last known leader, nothing is remembered: every old ISR
    # member is in the ELR.
    record = change(
        PartitionRegistration((1, 2, 3, 4), (1, 2, 3, 4), leader=1),
        [],
        target_isr=(),
        min_isr=3,
        use_last_known_leader=False,
    )
    assert record is not None and record.last_known_elr is None


def test_the_last_known_leader_is_elected_uncleanly() -> None:
    # Kafka's testEligibleLeaderReplicas_ElectLastKnownLeader.
    p = PartitionRegistration(
        (1, 2, 3, 4), (), leader=NO_LEADER, leader_epoch=100, last_known_elr=(1,)
    )
    for election in (Election.ONLINE, Election.PREFERRED):
        record = change(p, [1, 2, 3, 4], election=election, target_isr=(), min_isr=3)
        assert record is not None
        assert (record.leader, record.isr) == (1, (1,))
        assert record.leader_recovery_state is RECOVERING
        assert record.last_known_elr == ()
        new = p.merge(record)
        assert (new.elr, new.last_known_elr, new.leader_epoch) == ((), (), 101)
    # Without the rule the partition stays offline (the finding of a chaos
    # run that killed every broker at once).
    assert change(p, [1, 2, 3, 4], min_isr=3, use_last_known_leader=False) is None


def test_an_elr_member_left_waits_even_when_fenced() -> None:
    # Kafka's testEligibleLeaderReplicas_ElectLastKnownLeaderShouldFail: 3
    # still holds every committed record; the last known leader may not.
    p = PartitionRegistration((1, 2, 3, 4), (), leader=NO_LEADER, elr=(3,), last_known_elr=(1,))
    assert change(p, [1, 2, 4], min_isr=3) is None
    # Once 3 is back, it leads cleanly and the last known leader is forgotten.
    record = change(p, [1, 2, 3, 4], min_isr=3)
    assert record is not None
    assert (record.leader, record.isr, record.leader_recovery_state) == (3, (3,), None)
    assert record.last_known_elr == ()


def test_a_fenced_last_known_leader_is_not_elected() -> None:
    # KAFKA-19522 (Kafka 4.1): before it, canElectLastKnownLeader answered
    # true whether or not the broker was alive.
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, last_known_elr=(1,))
    assert change(p, [2, 3], min_isr=2) is None
    assert change(p, [2, 3], min_isr=2, election=Election.PREFERRED) is None


def test_a_last_known_elr_of_several_replicas_names_no_leader() -> None:
    # Written with the option off, it lists replicas, not a leader (Kafka
    # checks lastKnownElr.length == 1).
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, last_known_elr=(1, 2))
    assert change(p, [1, 2, 3], min_isr=2) is None


def test_an_unclean_election_takes_the_last_known_leader_first() -> None:
    # Kafka's electAnyLeader: the last known leader before any replica.
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, last_known_elr=(3,))
    record = change(p, [1, 2, 3], min_isr=2, election=Election.UNCLEAN)
    assert record is not None and (record.leader, record.isr) == (3, (3,))
    # When it is fenced, any replica.
    record = change(p, [1, 2], min_isr=2, election=Election.UNCLEAN)
    assert record is not None and (record.leader, record.isr) == (1, (1,))
    assert record.leader_recovery_state is RECOVERING and record.last_known_elr == ()


def test_a_leaderless_partition_keeps_its_last_known_leader() -> None:
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, elr=(2, 3), last_known_elr=(3,))
    # 3 and 2 restart uncleanly, one after the other, while 3 is fenced.
    for b in (3, 2):
        record = change(p, [], min_isr=2, unclean_shutdown=(b,))
        assert record is not None and record.last_known_elr is None
        p = p.merge(record)
    assert (p.elr, p.last_known_elr) == ((), (3,))


def test_the_bugs_keep_their_behaviour() -> None:
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, last_known_elr=(3,))
    # R9 (no ELR): no ELR, no last known leader either (Kafka's rule needs
    # the ELR on).
    with bugs.injected(Bug.NO_ELR):
        record = change(p, [1, 2, 3], min_isr=2)
        assert record is not None and p.merge(record).leader == NO_LEADER
    # B9 (unclean election everywhere): its fallback, the first live replica.
    with bugs.injected(Bug.UNCLEAN_ELECTION):
        record = change(p, [1, 2, 3], min_isr=2)
        assert record is not None and (record.leader, record.isr) == (1, (1,))


# -- the controller ---------------------------------------------------------------------


def three_brokers(use_last_known_leader: bool = True) -> Harness:
    h = Harness(use_last_known_leader=use_last_known_leader)
    h.add_brokers(1, 2, 3)
    h.create_topic("t", assignments={0: (1, 2, 3)}, configs={"min.insync.replicas": "2"})
    return h


def sound(h: Harness) -> None:
    assert not image_violations(h.image), image_violations(h.image)


def kill_every_broker_and_restart(h: Harness) -> list[PartitionRegistration]:
    """Every broker killed at once and restarted before its session ends:
    each re-registers without its previous broker epoch (an unclean
    shutdown: Kafka's handleBrokerUncleanShutdown), then catches up and is
    unfenced, 1 first.  The partition after each heartbeat."""
    for b in (1, 2, 3):
        h.register(b)
    states = []
    for b in (1, 2, 3):
        h.heartbeat(b)
        states.append(h.partition("t"))
    return states


def test_every_broker_killed_at_once_elects_the_last_known_leader() -> None:
    h = three_brokers()
    before = h.partition("t")
    after_1, after_2, after_3 = kill_every_broker_and_restart(h)
    # 1's restart moved the leadership to 2, 2's to 3; 3's emptied the ISR
    # with 3 as the leader: the last known leader.  Nobody leads until 3 is
    # back, however many others are.
    assert (after_1.leader, after_1.isr, after_1.elr) == (NO_LEADER, (), ())
    assert after_1.last_known_elr == after_2.last_known_elr == (3,)
    assert after_2.leader == NO_LEADER
    assert (after_3.leader, after_3.isr) == (3, (3,))
    assert after_3.leader_recovery_state is RECOVERING
    assert after_3.last_known_elr == () and after_3.leader_epoch > before.leader_epoch
    sound(h)
    # The leader says its log is consistent (KIP-704), then the others
    # rejoin the ISR.
    assert h.alter_partition("t", 0, [3], recovered=True).error.name == "NONE"
    assert h.partition("t").leader_recovery_state is RECOVERED
    assert h.alter_partition("t", 0, [3, 1, 2]).error.name == "NONE"
    assert h.partition("t").isr == (3, 1, 2)
    sound(h)


def test_without_the_last_known_leader_the_partition_stays_offline() -> None:
    h = three_brokers(use_last_known_leader=False)
    *_, p = kill_every_broker_and_restart(h)
    assert (p.leader, p.isr, p.elr) == (NO_LEADER, (), ())
    # (1 left an ISR still at min ISR: not even last known.)
    assert p.last_known_elr == (2, 3)
    assert all(not h.image.brokers[b].fenced for b in (1, 2, 3))


def test_fenced_by_their_sessions_then_restarted() -> None:
    h = three_brokers()
    # The sessions end one check at a time, as in Kafka: 1, 2, then 3.
    h.advance(9_000)
    fenced = []
    for _ in range(3):
        fenced += h.run(lambda c: c.fence_expired(h.now_ms)).response
    assert fenced == [1, 2, 3]
    p = h.partition("t")
    # 3, fenced last, led last: fencing loses nothing, so 2 and 3, fenced
    # below min ISR 2, are in the ELR (1 left at min ISR), and 3 is the last
    # known leader.
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (NO_LEADER, (), (2, 3), (3,))
    for b in (1, 2, 3):
        h.register(b)
    assert (h.partition("t").elr, h.partition("t").last_known_elr) == ((), (3,))
    for b in (2, 1):
        h.heartbeat(b)
        assert h.partition("t").leader == NO_LEADER
    h.heartbeat(3)
    p = h.partition("t")
    assert (p.leader, p.isr, p.leader_recovery_state) == (3, (3,), RECOVERING)
    sound(h)


def test_a_new_active_controller_elects_the_last_known_leader() -> None:
    h = three_brokers()
    for b in (1, 2, 3):
        h.register(b)
    h.heartbeat(1)
    h.heartbeat(2)
    # 3's unfencing commits, but the election decided with it is lost in a
    # failover (written apart, as elections after an unfencing are).
    result = h.decide(lambda c: c.heartbeat(_heartbeat(h, 3), h.now_ms))
    unfence, election = result.records
    assert isinstance(election, PartitionChangeRecord) and election.leader == 3
    h.write([unfence])
    assert h.partition("t").leader == NO_LEADER
    successor = Controller(ControllerOptions(CLUSTER_ID), random.Random(1))
    records = successor.activate(h.image, h.now_ms)
    elections = [r for r in records if isinstance(r, PartitionChangeRecord)]
    assert [(r.leader, r.isr, r.leader_recovery_state) for r in elections] == [
        (3, (3,), RECOVERING)
    ]
    # With the option off it elects nothing.
    off = Controller(ControllerOptions(CLUSTER_ID, use_last_known_leader=False), random.Random(1))
    assert not [r for r in off.activate(h.image, h.now_ms) if isinstance(r, PartitionChangeRecord)]


def _heartbeat(h: Harness, broker_id: int) -> HeartbeatRequest:
    return HeartbeatRequest(broker_id, h.image.brokers[broker_id].epoch, h.offset - 1)

"""Kafka's historical replication bugs as scenarios (brokers.md §1.12) over
several replicas and a tiny controller (``tests/broker/cluster.py``). Each
runs once with the rules as built, showing no loss, and once with the rule
that prevents it broken on purpose (its deliberate bug, ``bugs.injected``),
showing the loss the rule exists for.
"""

from __future__ import annotations

import bugs
from broker.errors import Errors
from broker.replica import Truncation
from bugs import Bug
from metadata.records import NO_LEADER
from tests.broker.cluster import BatchId, Cluster

LAG = 10_000


# -- R1: KIP-101 scenario 1, truncation to the HW then an election --------------------


def run_r1() -> Cluster:
    """RF 2: the follower fetches m2; before a fetch brings it the HW that
    covers m2, it restarts; then the leader dies and it is elected."""
    c = Cluster(2, min_isr=1)
    c.produce(b"m1")
    c.replicate(2)
    c.produce(b"m2")
    c.fetch(1)  # gets m2; the answer's HW is before m2
    c.fetch(1)  # the leader's HW passes m2: m2 is acknowledged
    assert [a.offset for a in c.acked] == [0, 1]
    assert c.nodes[1].log.high_watermark == 1 < c.nodes[1].log.log_end_offset
    c.bounce(1)
    c.kill(0)
    assert c.partition.leader == 1
    return c


def test_r1_no_truncation_to_the_hw_keeps_m2() -> None:
    c = run_r1()
    assert c.lost_acks() == []


def test_r1_broken_truncation_to_the_hw_loses_m2() -> None:
    with bugs.injected(Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER):
        c = run_r1()
    assert [a.offset for a in c.lost_acks()] == [1]


# -- R3: KIP-279, fast double failover -------------------------------------------------------


def run_r3() -> tuple[Cluster, list[Truncation]]:
    """Leaders alternate 0, 1, 0, 1, 0 with appends nobody replicates; then 1
    follows 0 and must find where their logs part."""
    c = Cluster(2, min_isr=1)
    c.produce(b"a", acks=1)
    c.produce(b"b", acks=1)
    c.replicate(2)
    for leader, values in ((1, [b"x"]), (0, [b"p", b"q"]), (1, [b"y"]), (0, [b"r"])):
        c.elect(leader)
        for value in values:
            c.produce(value, acks=1)
    truncations = []
    for _ in range(6):
        outcome = c.fetch(1)
        if outcome is not None and outcome.truncation is not None:
            truncations.append(outcome.truncation)
    return c, truncations


def test_r3_follower_truncates_in_two_rounds_and_agrees() -> None:
    c, truncations = run_r3()
    # Its epoch 3 is unknown to the leader, whose answer (epoch 2) is unknown
    # to it: cut at its end of epoch 1 and ask again; then epoch 0 ends at 2.
    assert truncations == [Truncation(4, 3, completed=False), Truncation(3, 2, completed=True)]
    assert c.inconsistent() == {}
    assert c.nodes[1].log.log_end_offset == c.nodes[0].log.log_end_offset == 5


def test_r3_broken_truncation_by_offset_diverges() -> None:
    with bugs.injected(Bug.TRUNCATE_BY_OFFSET):
        c, _ = run_r3()
    assert set(c.inconsistent()) == {2, 3}


# -- R4: KAFKA-7128, ISR expansion under a lagging HW ------------------------------------------


def run_r4() -> Cluster:
    """Min ISR 2. Replica 2 stops at offset 5 and leaves the ISR; 5..9 are
    acknowledged by 0 and 1; 0 dies and 1 leads with its HW still 5 (frozen:
    the ISR is {1}). 2 comes back and fetches one batch; then 1 stops."""
    c = Cluster(3, min_isr=2, lag_ms=LAG)
    for i in range(5):
        c.produce(b"r%d" % i)
    c.replicate(3)
    c.kill(2, lose_unsynced=False)
    for i in range(5, 10):
        c.produce(b"r%d" % i)
    c.fetch(1)  # 5..9; the answer's HW is 5
    c.fetch(1)  # the leader's HW is 10: acknowledged
    assert [a.offset for a in c.acked] == list(range(10))
    c.kill(0)
    assert c.partition.leader == 1 and c.partition.isr == (1,)
    assert c.nodes[1].log.high_watermark < 10 == c.nodes[1].replica.leader_epoch_start_offset
    c.restart(2)
    c.fetch(2, max_bytes=1)  # at 5: at the HW, below the epoch start; gets one batch
    c.kill(1, lose_unsynced=False)
    return c


def test_r4_lagging_follower_does_not_join_and_nothing_is_lost() -> None:
    c = run_r4()
    assert 2 not in c.partition.isr
    # No clean leader: the partition waits for 1 rather than lose 6..9.
    assert c.partition.leader == NO_LEADER
    c.restart(1)
    assert c.partition.leader == 1 and c.lost_acks() == []


def test_r4_broken_epoch_start_rule_loses_acknowledged_records() -> None:
    with bugs.injected(Bug.EXPAND_WITHOUT_EPOCH_START):
        c = run_r4()
    assert c.partition.leader == 2
    assert [a.offset for a in c.lost_acks()] == [6, 7, 8, 9]


# -- R5: KAFKA-15583, the HW under min ISR -----------------------------------------------------


def run_r5() -> tuple[Cluster, int, list[Errors]]:
    """Min ISR 2: both followers are cut off and leave the ISR; producers keep
    going with acks=1 and acks=all."""
    c = Cluster(3, min_isr=2, lag_ms=LAG)
    c.produce(b"a")
    c.replicate(2)
    committed = c.leader.log.high_watermark
    c.produce(b"b", acks=1)
    c.tick(LAG + 1)
    assert c.partition.isr == (0,)
    answers = [c.produce(b"c", acks=-1), c.produce(b"d", acks=1), c.produce(b"e", acks=1)]
    return c, committed, answers


def test_r5_hw_frozen_and_acks_all_refused_under_min_isr() -> None:
    c, committed, answers = run_r5()
    assert answers == [Errors.NOT_ENOUGH_REPLICAS, Errors.NONE, Errors.NONE]
    assert c.leader.log.high_watermark == committed == 1
    assert c.leader.log.log_end_offset == 4


def test_r5_broken_strict_min_isr_moves_the_hw() -> None:
    with bugs.injected(Bug.HW_UNDER_MIN_ISR):
        c, committed, _ = run_r5()
    assert c.leader.log.high_watermark == c.leader.log.log_end_offset == 4 > committed


# -- R9: KIP-966, the last replica standing ---------------------------------------------------


def run_r9(elect_elr: bool) -> tuple[Cluster, dict[int, BatchId]]:
    """Min ISR 2. Replica 2 leaves the ISR, then replica 1 (the ISR is now
    below min: 1 is an eligible leader replica, ELR). The leader takes acks=1
    writes alone, then loses power with nothing synced. The controller
    elects the ELR member (KIP-966), or re-elects the leader when it comes
    back (no ELR)."""
    c = Cluster(3, min_isr=2, lag_ms=LAG, elr=elect_elr)
    c.produce(b"r0")
    c.replicate(2)
    c.produce(b"r1")
    c.fetch(1)
    c.fetch(1)
    c.tick(LAG + 1)
    assert c.partition.isr == (0, 1)
    c.produce(b"r2")
    c.fetch(1)
    c.tick(LAG + 1)
    assert c.partition.isr == (0,)
    c.produce(b"r3", acks=1)
    c.produce(b"r4", acks=1)
    committed = c.committed()
    assert c.elr == {1}
    c.kill(0, lose_unsynced=True)
    if elect_elr:
        assert c.partition.leader == 1 and c.partition.isr == (1,)
    else:
        assert c.partition.leader == NO_LEADER
        c.restart(0)
        c.replicate(2)
    return c, committed


def test_r9_hw_frozen_so_the_elr_member_holds_every_committed_record() -> None:
    c, committed = run_r9(elect_elr=True)
    assert sorted(committed) == [0, 1]
    assert c.lost(committed) == {} and c.lost_acks() == []


def test_r9_broken_strict_min_isr_loses_committed_records() -> None:
    with bugs.injected(Bug.HW_UNDER_MIN_ISR):
        c, committed = run_r9(elect_elr=True)
    assert sorted(c.lost(committed)) == [3, 4]  # 1 fetched r2


def test_r9_without_elr_the_last_replica_loses_what_it_never_synced() -> None:
    # The loss KIP-966 describes: the checker sees it (an expected loss
    # without ELR or fsync).
    c, committed = run_r9(elect_elr=False)
    assert c.partition.leader == 0
    assert sorted(c.lost(committed)) == [0, 1]

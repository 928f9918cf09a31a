"""R9 of the catalogue (KIP-966 undone): the controller keeps no eligible
leader replicas and, as Kafka did before KIP-966, never lets the ISR
become empty, so the last ISR member stays in it when fenced and is
elected when it comes back, even after an unclean shutdown that may have
lost its unsynced tail. With the bug off that member goes to the ELR,
and leaves it after the unclean restart; the partition waits for an
eligible replica, or, when none is left, elects its last known leader in
an unclean election (KIP-966) that the exports allow for."""

from __future__ import annotations

import pytest

import bugs
from bugs import Bug
from metadata.image import PartitionRegistration
from metadata.partition_change import PartitionChange
from metadata.records import NO_LEADER, LeaderRecoveryState
from tests.metadata.controller_model import Harness, image_violations
from tests.metadata.test_elr import kip966_example

# The ISR is broker 1 alone, below min ISR 2.
P = PartitionRegistration((1, 2, 3), (1,), leader=1, leader_epoch=4, partition_epoch=7)


def _fence_1() -> PartitionRegistration:
    change = PartitionChange("T", 0, P, lambda b: b in (2, 3), target_isr=(), min_isr=2).build()
    assert change is not None
    return P.merge(change)


def test_fencing_the_last_isr_member_empties_the_isr_into_the_elr() -> None:
    p = _fence_1()
    assert (p.leader, p.isr, p.elr) == (NO_LEADER, (), (1,))


def test_r9_fencing_the_last_isr_member_keeps_it_in_the_isr() -> None:
    with bugs.injected(Bug.NO_ELR):
        p = _fence_1()
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (NO_LEADER, (1,), (), ())


def _unclean_return(bug: bool, use_last_known_leader: bool = True) -> PartitionRegistration:
    """min ISR 1: 1 leads alone (acks=all answered by it alone), loses power
    (its session ends), restarts without its broker epoch and is back."""
    h = Harness(use_last_known_leader=use_last_known_leader)
    h.add_brokers(1, 2, 3)
    h.create_topic("t", assignments={0: (1, 2, 3)}, configs={"min.insync.replicas": "1"})
    h.alter_partition("t", 0, [1])
    with bugs.injected(*([Bug.NO_ELR] if bug else [])):
        h.fence(1)
        h.register(1)  # previous broker epoch -1: an unclean shutdown
        h.heartbeat(1)
    assert not image_violations(h.image), image_violations(h.image)
    return h.partition("t")


def test_the_last_isr_member_back_from_an_unclean_shutdown_leads_only_uncleanly() -> None:
    # KIP-966's last known leader (Kafka's default): with no ISR or ELR
    # member left, 1 leads again, but in an unclean election (RECOVERING),
    # which the exports' truncation check allows for.
    p = _unclean_return(bug=False)
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (1, (1,), (), ())
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERING
    # Without it, the partition waits for an eligible replica.
    p = _unclean_return(bug=False, use_last_known_leader=False)
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (NO_LEADER, (), (), (1,))


def test_r9_the_last_isr_member_back_from_an_unclean_shutdown_leads() -> None:
    p = _unclean_return(bug=True)
    # Elected cleanly (RECOVERED, not an unclean election the exports
    # would allow for), with whatever tail it lost.
    assert (p.leader, p.isr) == (1, (1,))
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERED


def test_r9_kip966_worked_example_elects_the_replica_that_lost_its_tail() -> None:
    kip966_example(Harness())
    with bugs.injected(Bug.NO_ELR), pytest.raises(AssertionError, match="lost its tail"):
        kip966_example(Harness())

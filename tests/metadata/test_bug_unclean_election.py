"""B9 of the catalogue (a positive control): the controller elects an
out-of-sync live replica when no ISR or ELR member can lead, although the
topic does not allow unclean elections. With the bug off the partition
stays without a leader until an in-sync replica is back."""

from __future__ import annotations

import bugs
from bugs import Bug
from metadata.image import PartitionRegistration
from metadata.partition_change import PartitionChange
from metadata.records import NO_LEADER, LeaderRecoveryState
from tests.metadata.controller_model import Harness, image_violations

# The ISR is broker 1 alone; 2 and 3 are live but out of sync.
P = PartitionRegistration((1, 2, 3), (1,), leader=1, leader_epoch=4, partition_epoch=7)


def test_an_online_election_without_an_in_sync_replica_elects_nobody() -> None:
    change = PartitionChange("T", 0, P, lambda b: b in (2, 3)).build()
    assert change is not None and change.leader == NO_LEADER


def test_b9_an_online_election_elects_an_out_of_sync_replica() -> None:
    with bugs.injected(Bug.UNCLEAN_ELECTION):
        change = PartitionChange("T", 0, P, lambda b: b in (2, 3)).build()
    assert change is not None
    p = P.merge(change)
    # Recorded as the unclean election it is (KIP-704), so the exports'
    # truncation check allows it; the lost writes are the clients' to see.
    assert (p.leader, p.isr) == (2, (2,))
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERING


def _fenced_leader(bug: bool) -> PartitionRegistration:
    h = Harness()
    h.add_brokers(1, 2, 3)
    h.create_topic("t", assignments={0: (1, 2, 3)}, configs={"min.insync.replicas": "1"})
    h.alter_partition("t", 0, [1])
    if bug:
        with bugs.injected(Bug.UNCLEAN_ELECTION):
            h.fence(1)
    else:
        h.fence(1)
    assert not image_violations(h.image), image_violations(h.image)
    return h.partition("t")


def test_the_controller_leaves_the_partition_offline_when_its_isr_is_fenced() -> None:
    p = _fenced_leader(bug=False)
    # KIP-966: the fenced last ISR member waits in the ELR; 2 and 3 may not
    # lead.
    assert (p.leader, p.isr, p.elr) == (NO_LEADER, (), (1,))


def test_b9_the_controller_elects_an_out_of_sync_replica_on_fencing() -> None:
    p = _fenced_leader(bug=True)
    assert p.leader in (2, 3) and p.isr == (p.leader,)
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERING

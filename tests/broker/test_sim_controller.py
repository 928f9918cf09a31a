"""The broker simulator's controller stub (``broker/sim/controller.py``):
fencing, elections (ISR, ELR, unclean), unclean shutdowns and each
AlterPartition check, one test each."""

from __future__ import annotations

from dataclasses import replace

import bugs
from broker.errors import Errors
from broker.replica.types import AlterPartitionRequest, BrokerState
from broker.sim.config import SimConfig
from broker.sim.controller import PartitionChange, SimController
from bugs import Bug
from metadata.records import NO_LEADER, LeaderRecoveryState


def controller(**fields: object) -> SimController:
    config = replace(SimConfig(partitions=1), **fields)  # type: ignore[arg-type]
    c = SimController(config, {0: (0, 1, 2)})
    for b in range(3):
        c.register(b, 0, unclean_shutdown=False)
    return c


def request(
    c: SimController, isr: tuple[int, ...], epochs: dict[int, int] | None = None
) -> AlterPartitionRequest:
    p = c.partitions[0]
    states = tuple(BrokerState(b, (epochs or {}).get(b, c.registrations[b].epoch)) for b in isr)
    return AlterPartitionRequest(
        p.leader, p.leader_epoch, p.partition_epoch, states, LeaderRecoveryState.RECOVERED
    )


def test_missed_heartbeats_fence_and_elect_from_the_isr() -> None:
    c = controller()
    for b in (1, 2):
        assert c.heartbeat(b, c.registrations[b].epoch, 1_000)
    # 0's last heartbeat was its registration at time 0.
    assert c.tick(c.config.session_timeout_ms) == []
    assert c.tick(c.config.session_timeout_ms + 1) == [0]
    p = c.partitions[0]
    assert p.leader == 1 and p.isr == (1, 2) and p.leader_epoch == 1
    # A heartbeat of its registration unfences it; it stays out of the ISR.
    assert c.heartbeat(0, c.registrations[0].epoch, 2_000)
    assert c.active(0) and c.partitions[0].isr == (1, 2)


def test_a_heartbeat_with_an_old_broker_epoch_is_refused() -> None:
    c = controller()
    old = c.registrations[1].epoch
    c.register(1, 10, unclean_shutdown=False)
    assert not c.heartbeat(1, old, 20)
    assert c.heartbeat(1, c.registrations[1].epoch, 20)


def test_an_unfenced_last_isr_member_is_elected_again() -> None:
    c = controller(min_insync_replicas=1)
    for b in (2, 1, 0):
        c.fence(b)
    assert c.partitions[0].leader == NO_LEADER
    assert c.heartbeat(0, c.registrations[0].epoch, 10)
    assert c.partitions[0].leader == 0


def test_the_last_isr_member_is_kept_and_leaves_the_partition_leaderless() -> None:
    c = controller(min_insync_replicas=1)
    for b in (2, 1, 0):
        c.fence(b)
    p = c.partitions[0]
    assert p.leader == NO_LEADER and p.isr == (0,)
    c.register(1, 5, unclean_shutdown=False)
    assert c.partitions[0].leader == NO_LEADER  # 1 is not in the ISR
    c.register(0, 6, unclean_shutdown=False)
    assert c.partitions[0].leader == 0


def test_elr_under_strict_min_isr_elects_an_eligible_replica() -> None:
    c = controller()
    c.fence(2)
    c.fence(1)  # the ISR falls below min ISR 2: 1 joins the ELR
    assert c.partitions[0].isr == (0,) and c.partitions[0].elr == (1,)
    c.register(1, 5, unclean_shutdown=False)
    c.fence(0)
    p = c.partitions[0]
    assert p.leader == 1 and p.isr == (1,) and 1 not in p.elr


def test_without_elr_nobody_out_of_the_isr_leads() -> None:
    with bugs.injected(Bug.NO_ELR):
        c = controller()
        c.fence(2)
        c.fence(1)
        assert c.partitions[0].elr == ()
        c.register(1, 5, unclean_shutdown=False)
        c.fence(0)
        assert c.partitions[0].leader == NO_LEADER


def test_an_unclean_shutdown_leaves_the_isr_and_the_elr() -> None:
    c = controller()
    c.fence(2)
    c.fence(1)  # ELR {1}; ISR {0}
    c.register(1, 5, unclean_shutdown=True)
    assert c.partitions[0].elr == () and 1 in c.partitions[0].last_known_elr
    c.register(0, 6, unclean_shutdown=True)  # the last ISR member loses power
    p = c.partitions[0]
    assert p.isr == () and p.leader == NO_LEADER


def test_restart_keeps_isr_places_when_configured() -> None:
    c = controller(restart_keeps_isr=True)
    before = c.partitions[0]
    c.register(1, 5, unclean_shutdown=True)
    assert c.partitions[0].isr == before.isr and c.partitions[0].leader == 0


def test_unclean_election_only_when_configured() -> None:
    for unclean in (False, True):
        c = controller(min_insync_replicas=1, unclean_election=unclean, elr=False)
        c.fence(1)
        c.fence(2)
        c.register(1, 5, unclean_shutdown=False)  # out of the ISR, live
        c.fence(0)
        p = c.partitions[0]
        if unclean:
            assert p.leader == 1 and p.leader_recovery_state is LeaderRecoveryState.RECOVERING
            assert c.unclean == {0}
        else:
            assert p.leader == NO_LEADER and c.unclean == set()


def test_alter_partition_commits_and_publishes() -> None:
    c = controller()
    before = len(c.log)
    result, error = c.alter_partition(0, request(c, (0, 1)))
    assert error is Errors.NONE and result is not None and result.isr == (0, 1)
    assert c.partitions[0].isr == (0, 1)
    change = c.log[before]
    assert isinstance(change, PartitionChange) and change.registration.isr == (0, 1)


def test_alter_partition_refuses_an_old_leader_epoch_or_another_leader() -> None:
    c = controller()
    stale = request(c, (0, 1))
    c.elect(0, 1)
    assert c.alter_partition(0, stale) == (None, Errors.FENCED_LEADER_EPOCH)


def test_alter_partition_refuses_an_old_partition_epoch() -> None:
    c = controller()
    first = request(c, (0, 1))
    assert c.alter_partition(0, first)[1] is Errors.NONE
    assert c.alter_partition(0, first) == (None, Errors.INVALID_UPDATE_VERSION)


def test_alter_partition_refuses_fenced_and_stale_epoch_replicas() -> None:
    c = controller()
    assert c.alter_partition(0, request(c, (0, 1)))[1] is Errors.NONE
    # KIP-841: a fenced broker may not join.
    c.fence(2)
    assert c.alter_partition(0, request(c, (0, 1, 2))) == (None, Errors.INELIGIBLE_REPLICA)
    # KIP-903: nor one whose fetches carried an older broker epoch.
    old = c.registrations[2].epoch
    c.register(2, 5, unclean_shutdown=False)
    assert c.alter_partition(0, request(c, (0, 1, 2), {2: old})) == (
        None,
        Errors.INELIGIBLE_REPLICA,
    )
    assert c.alter_partition(0, request(c, (0, 1, 2)))[1] is Errors.NONE


def test_alter_partition_refuses_an_isr_without_its_leader() -> None:
    c = controller()
    assert c.alter_partition(0, request(c, (1, 2))) == (None, Errors.INVALID_REQUEST)
    assert c.alter_partition(9, request(c, (0,))) == (None, Errors.UNKNOWN_TOPIC_OR_PARTITION)


def test_controlled_shutdown_moves_leadership_and_makes_the_broker_ineligible() -> None:
    c = controller()
    c.controlled_shutdown(0)
    p = c.partitions[0]
    assert p.leader == 1 and p.isr == (1, 2)
    assert c.registrations[0].in_controlled_shutdown and not c.active(0)
    # KIP-841: a shutting-down broker may not rejoin.
    assert c.alter_partition(0, request(c, (0, 1, 2))) == (None, Errors.INELIGIBLE_REPLICA)
    # Below min ISR a clean shutdown keeps it eligible for election (ELR).
    c.controlled_shutdown(2)
    assert c.partitions[0].isr == (1,) and c.partitions[0].elr == (2,)

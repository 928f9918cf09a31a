"""The deliberate bugs of consumer groups (``bugs.Bug`` B17, B19, B20), each
at the line of the real code that keeps its rule: with the bug on, the
group simulation's invariants (an acknowledged commit is never lost or
replaced by an older one; the shard equals its log below the HW) or the
shard's (no partition has two owners) fire; with it off, the same steps
hold."""

from __future__ import annotations

from typing import Any

import pytest

import bugs
from broker.group.api import OffsetFetchRequest
from bugs import Bug
from tests.broker.group.harness import Client, Log, MapTopics, heartbeat, new_shard, owners_disjoint
from tests.broker.group_sim import GroupSim
from tests.broker.test_group_coordinator_sim import KEY, kafka_20634, run

# -- B17: a commit answered at its append (KAFKA-20634) ------------------------------------


def test_b17_a_commit_answered_before_the_hw_is_lost_with_its_leader() -> None:
    caught = r"seed 0: an acknowledged commit was lost"
    with bugs.injected(Bug.COMMIT_BEFORE_HW), pytest.raises(AssertionError, match=caught):
        run(kafka_20634)


def test_b17_off_the_commit_waits_for_the_hw() -> None:
    run(kafka_20634)


# -- B19: a returning leader's groups from memory (Redpanda CORE-16998) ---------------------


async def away_and_back(sim: GroupSim) -> None:
    """Broker 1 coordinates g0 (offset 3 acknowledged), broker 2 takes over
    and acknowledges offset 7, then broker 1 leads again without a
    restart."""
    await sim.settle()
    assert sim.registration(0).leader == 1
    sim.commit("g0", 0, 3)
    await sim.settle()
    sim.move_leader(0, leader=2, isr=(1, 2, 3))
    await sim.settle()
    sim.commit("g0", 0, 7)
    await sim.settle()
    assert sim.acked == {KEY: 7}
    sim.move_leader(0, leader=1, isr=(1, 2, 3))
    await sim.settle()


async def fetch_after_return(sim: GroupSim) -> None:
    await away_and_back(sim)
    answer = await sim.coordinators[1].fetch_offsets(OffsetFetchRequest("g0"))
    shown = [o.offset for o in answer.offsets]
    if shown != [7]:
        raise sim.fail(f"an acknowledged commit was lost: {KEY} at 7, broker 1 shows {shown}")


async def check_after_return(sim: GroupSim) -> None:
    await away_and_back(sim)
    await sim.check()


@pytest.mark.parametrize(
    ("body", "caught"),
    [
        (fetch_after_return, r"seed 0: an acknowledged commit was lost: .* broker 1 shows \[3\]"),
        (check_after_return, r"seed 0: broker 1's groups of __consumer_offsets-0 differ"),
    ],
    ids=["offset-fetch", "sim-check"],
)
def test_b19_a_returning_leader_answers_from_its_old_groups(body: Any, caught: str) -> None:
    with bugs.injected(Bug.GROUP_STATE_FROM_MEMORY), pytest.raises(AssertionError, match=caught):
        run(body)


@pytest.mark.parametrize("body", [fetch_after_return, check_after_return])
def test_b19_off_a_returning_leader_rebuilds_from_the_log(body: Any) -> None:
    run(body)


def test_b19_a_restart_forgets_what_the_bug_remembers() -> None:
    """The bug needs the broker's process to live on: a restarted broker
    has no memory and loads from its log."""

    async def body(sim: GroupSim) -> None:
        await sim.settle()
        sim.commit("g0", 0, 3)
        await sim.settle()
        sim.move_leader(0, leader=2, isr=(1, 2, 3))
        await sim.settle()
        sim.commit("g0", 0, 7)
        await sim.settle()
        await sim.restart_all()
        sim.move_leader(0, leader=1, isr=(1, 2, 3))
        await sim.settle()
        await sim.check()

    with bugs.injected(Bug.GROUP_STATE_FROM_MEMORY):
        run(body)


# -- B20: a partition given before its old owner revoked it ----------------------------------


def join_second_member() -> tuple[Client, Client, Log]:
    """Member 1 holds all four partitions; member 2 joins and heartbeats
    before member 1 has heard that it must give two up."""
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 4})
    first, second = Client("g", ("t",)), Client("g", ("t",))
    for _ in range(2):
        heartbeat(shard, log, first, topics, 0)
    assert len(first.held) == 4
    for _ in range(2):
        heartbeat(shard, log, second, topics, 10)
        owners_disjoint(shard.groups)
    return first, second, log


def test_b20_a_partition_is_given_while_its_owner_still_holds_it() -> None:
    with bugs.injected(Bug.ASSIGN_BEFORE_REVOKE), pytest.raises(AssertionError, match="owned by"):
        join_second_member()


def test_b20_off_the_new_member_waits_for_the_revocation() -> None:
    first, second, _ = join_second_member()
    assert len(first.held) == 4 and second.held == frozenset()

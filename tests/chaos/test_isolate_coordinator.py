"""The ``isolate-coordinator`` fault: in a run whose consumers share a group,
the broker that leads the group's partition of the offsets topic, found in
the controllers' metadata when the fault starts, cut off from every other
node (the controllers too); ended by ``heal``.  The kind and its schedule
(pure), the offsets partition that holds a group, and the runner's
resolution against a backend played by the test."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from broker.group.placement import OFFSETS_TOPIC, partition_for
from chaos.nemesis import (
    BROKER_KINDS,
    COORDINATOR_KIND,
    FAULT_KINDS,
    NETWORK_KINDS,
    POWER_LOSS_KINDS,
    Action,
)
from chaos.runner import PartitionReplicas, RunConfig, coordinator_of, expand_nemesis
from chaos.workloads.queue_setup import QueueOptions
from tests.chaos.fault_schedules import check_cuts_found_at_run_time, drawn_schedule
from tests.chaos.strand_fakes import nemesis_ops, recording_nemesis


def _offsets(leaders: list[int]) -> list[PartitionReplicas]:
    """The offsets topic's partitions, partition i led by ``leaders[i]``
    (brokers 4-6, every one in the ISR)."""
    return [
        PartitionReplicas(f"{OFFSETS_TOPIC}-{i}", leader, (4, 5, 6), (4, 5, 6))
        for i, leader in enumerate(leaders)
    ]


QUEUE = [PartitionReplicas("queue-0", 6, (6, 4, 5), (6, 4, 5))]

# -- the kind and the schedule -----------------------------------------------------------


def test_it_is_a_network_fault_aimed_at_the_brokers_with_no_power_loss() -> None:
    assert COORDINATOR_KIND == "isolate-coordinator"
    assert COORDINATOR_KIND in set(FAULT_KINDS) & set(BROKER_KINDS) & set(NETWORK_KINDS)
    assert COORDINATOR_KIND not in POWER_LOSS_KINDS
    assert expand_nemesis([COORDINATOR_KIND, "kill"], 6) == ["kill", COORDINATOR_KIND]
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        expand_nemesis([COORDINATOR_KIND], 1)


@pytest.mark.parametrize("seed", range(10))
def test_each_cut_is_a_coordinator_intent_ended_by_a_heal(seed: int) -> None:
    actions = drawn_schedule(
        seed,
        [COORDINATOR_KIND, "isolate-follower", "kill", "pause"],
        needed=COORDINATOR_KIND,
        interval_s=(0.3, 3.0),
        fault_period_s=(4.0, 20.0),
    )
    check_cuts_found_at_run_time(actions, COORDINATOR_KIND, "coordinator")


def test_a_run_without_a_group_has_no_coordinator_to_cut_off() -> None:
    queue = QueueOptions()
    with pytest.raises(ValueError, match="needs --group"):
        RunConfig(workload="queue", faults=(COORDINATOR_KIND,), queue=queue).check()
    grouped = dataclasses.replace(queue, group="g")
    RunConfig(workload="queue", faults=(COORDINATOR_KIND,), queue=grouped).check()


# -- the group's partition ---------------------------------------------------------------


@pytest.mark.parametrize("group", ["kq-queue", "g1", "a", "payments"])
def test_the_coordinator_is_the_leader_of_the_partition_the_group_hashes_to(group: str) -> None:
    found = [*QUEUE, *_offsets([4, 5, 6])]
    at = coordinator_of(group, found)
    assert at is not None and at.name == f"{OFFSETS_TOPIC}-{partition_for(group, 3)}"
    # The partition count is the topic's, not a guess: with 5 partitions
    # the group may land elsewhere.
    five = coordinator_of(group, _offsets([4, 5, 6, 4, 5]))
    assert five is not None and five.name == f"{OFFSETS_TOPIC}-{partition_for(group, 5)}"


def test_no_offsets_topic_no_coordinator() -> None:
    assert coordinator_of("g", QUEUE) is None
    assert coordinator_of("g", []) is None


# -- the runner ----------------------------------------------------------------------------


def _run(
    tmp_path: Path, found: list[PartitionReplicas], down: dict[int, str] | None = None
) -> tuple[list[tuple[str, Action]], list[tuple[str, object]]]:
    """An isolate-coordinator of group kq-queue then a heal, carried out by
    the runner's nemesis with the controllers' metadata ``found`` and the
    nodes ``down``: how each went, and what the backend was asked."""
    backend, nemesis, writer = recording_nemesis(tmp_path)

    async def replicas() -> list[PartitionReplicas]:
        return found

    nemesis.replicas = replicas
    nemesis.group = "kq-queue"
    nemesis.down = dict(down or {})
    cut = Action(0, "partition", kind=COORDINATOR_KIND, target="coordinator")

    async def main() -> list[tuple[str, Action]]:
        return [await nemesis.act(cut), await nemesis.act(Action(5, "heal"))]

    done = asyncio.run(main())
    writer.close()
    return done, backend.done


def test_the_runner_cuts_the_groups_coordinator_off_from_every_node(tmp_path: Path) -> None:
    # kq-queue hashes to partition 0 of 3: led by 5 here, not by the
    # queue partition's leader (6) nor by the leader of the others.
    assert partition_for("kq-queue", 3) == 0
    [(how, done), (healed, _)], asked = _run(tmp_path, [*QUEUE, *_offsets([5, 6, 4])])
    assert (how, healed) == ("ok", "ok")
    # Cut off from the controllers (1-3) too, so that they fence it.
    assert done.groups == ((5,), (1, 2, 3, 4, 6)) and done.target is None
    assert asked == [("partition", done.groups), ("heal", None)]
    value = {"groups": [[5], [1, 2, 3, 4, 6]], "kind": COORDINATOR_KIND}
    assert [(op.type, op.f, op.value) for op in nemesis_ops(tmp_path)][:2] == [
        ("invoke", "partition", value),
        ("ok", "partition", value),
    ]


@pytest.mark.parametrize(
    ("found", "down"),
    [
        (QUEUE, None),  # no offsets topic yet
        ([*QUEUE, *_offsets([-1, 6, 4])], None),  # the group's partition has no leader
        ([*QUEUE, *_offsets([5, 6, 4])], {5: "kill"}),  # its leader is down
    ],
)
def test_the_cut_is_skipped_when_no_coordinator_is_up(
    tmp_path: Path, found: list[PartitionReplicas], down: dict[int, str] | None
) -> None:
    [(how, done), (healed, _)], asked = _run(tmp_path, found, down)
    assert how == "skipped" and asked == [("heal", None)]
    assert done.target == "coordinator"
    assert [op.f for op in nemesis_ops(tmp_path)] == ["heal", "heal"]

"""The power-loss faults: their schedule, history ops, nemesis names and the
environment a run's processes get."""

from __future__ import annotations

import random

import pytest

from chaos.nemesis import (
    BROKER_KINDS,
    FAULT_KINDS,
    POWER_LOSS_KIND,
    POWER_LOSS_KINDS,
    TORN_POWER_LOSS_KIND,
    TORN_POWER_LOSS_KINDS,
    Action,
    action_ops,
    nemesis_op,
    schedule,
)
from chaos.runner import NEMESES, RunConfig, expand_nemesis, storage_environment
from chaos.workloads.queue_setup import QueueOptions
from history.ops import check_well_formed
from server.storage_mode import (
    LOSE_UNSYNCED_VARIABLE,
    lose_unsynced_from_environment,
    torn_tails_from_environment,
)
from tests.chaos.test_nemesis import replay


def test_a_power_loss_is_a_kill_of_one_node_ended_by_its_start_with_the_same_kind() -> None:
    nodes = [1, 2, 3, 4, 5, 6]
    acts = schedule(random.Random(5), nodes, [POWER_LOSS_KIND], duration_s=60, interval_s=1)
    cuts = [a for a in acts if a.kind == POWER_LOSS_KIND]
    assert len(cuts) >= 10
    down: dict[int, int] = {}
    for a in cuts:
        assert len(a.nodes) == 1 and a.target is None, a
        (node,) = a.nodes
        if a.f == "kill":
            assert node not in down
            down[node] = 1
        else:
            assert a.f == "start" and down.pop(node) == 1, a
    assert not down and acts[-1].f == "heal"
    # Every node may lose power, controllers and brokers alike.
    assert {a.nodes[0] for a in cuts} == set(nodes)
    replay(acts, nodes)  # one node down at a time, each started again


def test_power_loss_keeps_a_majority_up_with_other_kills() -> None:
    for seed in range(10):
        acts = schedule(
            random.Random(seed),
            [1, 2, 3],
            ["kill", POWER_LOSS_KIND, "pause"],
            duration_s=60,
            interval_s=0.5,
            max_concurrent=3,
        )
        assert any(a.kind == POWER_LOSS_KIND for a in acts)
        for _, down, _, _ in replay(acts, [1, 2, 3]):
            assert len(down) <= 1  # 3 nodes: one down at most keeps a majority


def test_power_loss_ops_are_the_documented_shapes() -> None:
    cut = Action(0, "kill", nodes=(5,), kind=POWER_LOSS_KIND)
    back = Action(1, "start", nodes=(5,), kind=POWER_LOSS_KIND)
    assert nemesis_op(cut) == ("kill", {"nodes": [5], "kind": "power-loss"})
    assert nemesis_op(back) == ("start", {"nodes": [5], "kind": "power-loss"})
    ops = [
        *action_ops(cut, index=0, invoke_ns=1, complete_ns=2),
        *action_ops(back, index=2, invoke_ns=3, complete_ns=4),
    ]
    assert check_well_formed(ops) == []
    assert [p.kind for p in check_well_formed(ops[:2])] == ["nemesis-unended"]


def test_a_partition_leaders_power_loss_is_an_intent_ended_by_its_start() -> None:
    kind = "power-loss-partition-leader"
    assert kind in BROKER_KINDS and kind in FAULT_KINDS
    acts = schedule(random.Random(2), [1, 2, 3, 4, 5, 6], [kind], duration_s=60, interval_s=1)
    mine = [a for a in acts if a.kind == kind]
    assert len(mine) >= 6
    assert [a.f for a in mine] == ["kill", "start"] * (len(mine) // 2)
    assert all(a.target == "partition-leader" and a.nodes == () for a in mine)
    # The runner resolves the intent to one broker, whose ops carry the kind.
    done = Action(0, "kill", nodes=(5,), kind=kind)
    assert nemesis_op(done) == ("kill", {"nodes": [5], "kind": kind})


def test_the_nemesis_names() -> None:
    assert POWER_LOSS_KIND in NEMESES and "power-loss-partition-leader" in NEMESES
    assert expand_nemesis(["power-loss"], 1) == ["power-loss"]
    assert expand_nemesis(["power-loss-partition-leader", "kill", "power-loss"], 6) == [
        "kill",
        "power-loss-partition-leader",
        "power-loss",
    ]
    with pytest.raises(ValueError, match="unknown nemesis 'power'"):
        expand_nemesis(["power"], 3)


def test_a_partition_leaders_power_loss_needs_brokers() -> None:
    with pytest.raises(ValueError, match="power-loss-partition-leader aim at a partition"):
        RunConfig(workload="register", faults=("power-loss-partition-leader",)).check()
    RunConfig(workload="register", faults=("power-loss",)).check()
    RunConfig(
        workload="queue", faults=("power-loss-partition-leader",), queue=QueueOptions()
    ).check()


def test_a_run_with_a_power_loss_starts_its_processes_in_the_mode() -> None:
    untorn = [k for k in POWER_LOSS_KINDS if k not in TORN_POWER_LOSS_KINDS]
    for kinds in ([POWER_LOSS_KIND], ["power-loss-partition-leader"], ["kill", *untorn]):
        env = storage_environment(RunConfig(faults=tuple(kinds)), {})
        assert env == {LOSE_UNSYNCED_VARIABLE: "1"}
        assert lose_unsynced_from_environment(env)
    # Without one, nothing is set, unless the runner's own environment has
    # the variable, which its nodes would inherit: then it is turned off.
    assert storage_environment(RunConfig(faults=("kill",)), {}) == {}
    inherited = {LOSE_UNSYNCED_VARIABLE: "1"}
    assert storage_environment(RunConfig(faults=("kill",)), inherited) == {
        LOSE_UNSYNCED_VARIABLE: "0"
    }


def test_torn_power_losses_are_power_losses_whose_run_tears_tails() -> None:
    assert TORN_POWER_LOSS_KIND in NEMESES and "torn-power-loss-partition-leader" in NEMESES
    assert set(TORN_POWER_LOSS_KINDS) <= set(POWER_LOSS_KINDS) & set(FAULT_KINDS)
    assert "torn-power-loss-partition-leader" in BROKER_KINDS
    # Scheduled as their plain twins: one node's kill and start, with the kind.
    nodes = [1, 2, 3, 4, 5, 6]
    acts = schedule(random.Random(5), nodes, [TORN_POWER_LOSS_KIND], duration_s=60, interval_s=1)
    cuts = [a for a in acts if a.kind == TORN_POWER_LOSS_KIND]
    assert len(cuts) >= 10 and [a.f for a in cuts] == ["kill", "start"] * (len(cuts) // 2)
    assert all(len(a.nodes) == 1 and a.target is None for a in cuts)
    replay(acts, nodes)
    kind = "torn-power-loss-partition-leader"
    acts = schedule(random.Random(2), nodes, [kind], duration_s=60, interval_s=1)
    mine = [a for a in acts if a.kind == kind]
    assert len(mine) >= 6 and all(a.target == "partition-leader" for a in mine)
    # The run's processes start in the torn variant of the mode, whatever
    # other power losses it has.
    for kinds in ([TORN_POWER_LOSS_KIND], [kind], [POWER_LOSS_KIND, kind, "kill"]):
        env = storage_environment(RunConfig(faults=tuple(kinds)), {})
        assert env == {LOSE_UNSYNCED_VARIABLE: "torn"}
        assert lose_unsynced_from_environment(env) and torn_tails_from_environment(env)
    plain = storage_environment(RunConfig(faults=(POWER_LOSS_KIND,)), {})
    assert not torn_tails_from_environment(plain)
    with pytest.raises(ValueError, match="torn-power-loss-partition-leader aim at a partition"):
        RunConfig(workload="register", faults=(kind,)).check()

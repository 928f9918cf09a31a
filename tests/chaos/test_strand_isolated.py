"""The isolated strand (``strand-isolated-power-loss-partition-leader``): a
queue partition's leader cut off from every node, the controllers too, so
that its AlterPartition shrinking the ISR to itself stays pending (KIP-497)
while the clients still reach it; its power cut once the controllers have
fenced it and elected another leader; then a heal and its restart.  The
schedule (pure), the runner against a backend played by the test, and one
real local run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from chaos.backend import partition_pairs, reaches
from chaos.nemesis import (
    BROKER_KINDS,
    FAULT_KINDS,
    NETWORK_KINDS,
    POWER_LOSS_KINDS,
    STRAND_ISOLATED_KIND,
    STRAND_KINDS,
    Action,
    schedule,
)
from chaos.runner import (
    PartitionReplicas,
    RunConfig,
    _Nemesis,
    expand_nemesis,
    storage_environment,
)
from history.runs import RunDir
from server.storage_mode import LOSE_UNSYNCED_VARIABLE
from tests.chaos.cluster_scenarios import need_iptables, scratch_tempdir
from tests.chaos.strand_fakes import (
    NODES,
    RecordingBackend,
    nemesis_ops,
    run_local_strand,
    run_strand_plan,
)

KIND = STRAND_ISOLATED_KIND


def test_the_isolated_strand_is_a_power_loss_strand_of_the_brokers() -> None:
    assert KIND == "strand-isolated-power-loss-partition-leader"
    assert KIND in STRAND_KINDS
    assert KIND in set(FAULT_KINDS) & set(BROKER_KINDS) & set(NETWORK_KINDS)
    assert KIND in POWER_LOSS_KINDS
    assert expand_nemesis([KIND], 6) == [KIND]
    env = storage_environment(RunConfig(faults=(KIND,)), {})
    assert env.get(LOSE_UNSYNCED_VARIABLE) == "1"


def test_its_schedule_is_a_strands_partition_kill_heal_and_start() -> None:
    actions = schedule(random.Random(2), NODES, [KIND], duration_s=40.0)
    mine = [(a.f, a.target) for a in actions if a.kind == KIND]
    assert mine[:3] == [
        ("partition", "strand"),
        ("kill", "stranded"),
        ("start", "partition-leader"),
    ]
    assert len(mine) % 3 == 0 and len(mine) >= 6  # two strands in 40 s
    # Nothing else while one is in force (a heal comes before each start).
    for i, a in enumerate(actions):
        if a.f == "start" and a.kind == KIND:
            assert actions[i - 1].f == "heal"


def _run(
    tmp_path: Path, leaders: list[int], wait_s: float = 15.0
) -> tuple[RecordingBackend, _Nemesis, list[tuple[str, Action]]]:
    """An isolated strand of queue-1 (leader 5, replicas 5, 4, 6, ISR
    unchanged) whose leader the controllers report as ``leaders`` in turn
    (the last one thereafter)."""
    answers = iter(leaders)
    last: list[int] = []

    async def replicas() -> list[PartitionReplicas]:
        leader = next(answers, None)
        if leader is not None:
            last[:] = [leader]
        return [
            PartitionReplicas("queue-0", 4, (4, 5, 6), (4,)),
            PartitionReplicas("queue-1", last[0], (5, 4, 6), (5, 4, 6)),
        ]

    return run_strand_plan(tmp_path, KIND, replicas, wait_s)


def test_the_runner_cuts_the_leader_off_from_every_node_and_waits_for_another_leader(
    tmp_path: Path,
) -> None:
    backend, nemesis, out = _run(tmp_path, [5, 5, 5, 5, 4])
    assert [how for how, _ in out] == ["ok"] * 4
    groups = ((5,), (1, 2, 3, 4, 6))
    assert backend.done == [("partition", groups), ("kill", 5), ("heal", None), ("restart", 5)]
    talk = reaches(partition_pairs(NODES, groups), NODES)
    assert talk[5] == {5}  # the controllers too
    [strand] = nemesis.strands
    assert strand["partition"] == "queue-1" and strand["leader"] == 5
    # The ISR never shrank (the shrink could not reach the controllers);
    # the kill came once the controllers had elected 4.
    assert (strand["isr_at_kill"], strand["shrunk"], strand["leader_at_kill"]) == (
        [5, 4, 6],
        False,
        4,
    )
    ops = nemesis_ops(tmp_path)
    assert [(op.f, op.value) for op in ops if op.type == "ok"] == [
        ("partition", {"groups": [[5], [1, 2, 3, 4, 6]], "kind": KIND}),
        ("kill", {"nodes": [5], "kind": KIND}),
        ("heal", {}),
        ("start", {"nodes": [5], "kind": KIND}),
    ]


def test_the_runner_cuts_the_power_after_its_bound_if_no_other_leader_comes(
    tmp_path: Path,
) -> None:
    backend, nemesis, _ = _run(tmp_path, [5], wait_s=0.5)
    assert ("kill", 5) in backend.done
    [strand] = nemesis.strands
    assert strand["leader_at_kill"] == 5 and strand["waited_s"] >= 0.5


# -- a real local cluster ------------------------------------------------------------------


@pytest.mark.slow
def test_a_local_isolated_strand_leaves_the_shrink_pending_and_another_leader_elected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_iptables()
    scratch_tempdir(tmp_path, monkeypatch)
    result, strands = run_local_strand(tmp_path, "queue-strand-isolated", KIND)
    run = RunDir(result.path)
    changes = [
        json.loads(line)
        for line in (run.node_dir(1) / "partition_changes.jsonl").read_text().splitlines()
    ]
    for s in strands:
        # The controllers fenced the cut-off leader and elected another
        # before its power was cut; they never committed its shrink.
        assert s["leader_at_kill"] not in (s["leader"], -1), s
        assert not s["shrunk"], s
        topic, partition = s["partition"].rsplit("-", 1)
        mine = [c for c in changes if (c["topic"], c["partition"]) == (topic, int(partition))]
        assert [s["leader"]] not in [c["isr"] for c in mine], mine
    # A correct build loses nothing: the HW stayed under the pending shrink,
    # so nothing the cut-off leader took alone was acknowledged or read.
    assert result.recovered and result.final_ok, result.final_check

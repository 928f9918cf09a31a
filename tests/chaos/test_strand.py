"""The strand faults (KIP-966's worked example): a queue partition's
followers cut off from its leader and from each other, the controllers
still reaching every node; the leader killed or power-cut once its ISR has
shrunk to itself; then a heal and its restart.  The schedule (pure), the
runner's execution against a backend played by the test, and one real
local run in which the controllers' metadata showed the ISR shrunk to the
leader alone before the kill."""

from __future__ import annotations

import asyncio
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
    STRAND_HOLD_S,
    STRAND_KINDS,
    STRAND_SHRINK_S,
    Action,
    nemesis_op,
    schedule,
    strand_groups,
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
from tests.chaos.fault_schedules import drawn_schedule, fault_spans
from tests.chaos.strand_fakes import (
    HISTORY,
    NODES,
    RecordingBackend,
    act_all,
    local_fault_notes,
    nemesis_ops,
    recording_nemesis,
    run_local_strand,
    run_strand_plan,
)

# -- the groups ------------------------------------------------------------------------


def test_strand_groups_cut_each_follower_off_from_the_leader_and_the_others() -> None:
    groups = strand_groups([*NODES, 7], [1, 2, 3], 5, [4, 6])
    assert groups == ((1, 2, 3, 5, 7), (1, 2, 3, 4), (1, 2, 3, 6))
    talk = reaches(partition_pairs([*NODES, 7], groups), [*NODES, 7])
    assert 5 not in talk[4] and 5 not in talk[6] and 6 not in talk[4]
    # The controllers reach every node, and the leader a broker that holds
    # no replica of the partition.
    for c in (1, 2, 3):
        assert talk[c] >= {1, 2, 3, 4, 5, 6, 7}
    assert 7 in talk[5] and 7 not in talk[4]


@pytest.mark.parametrize(
    ("controllers", "leader", "followers", "message"),
    [
        ([1, 2, 3], 5, [], "not empty"),
        ([1, 2, 3], 5, [4, 4], "distinct"),
        ([1, 2, 3], 9, [4], "leader \\[9\\] not one of"),
        ([1, 2, 3], 5, [8], "follower \\[8\\] not one of"),
        ([1, 2, 3], 5, [5, 4], "must be apart"),
        ([1, 2, 4], 5, [4], "must be apart"),
    ],
)
def test_strand_groups_refuse_what_is_not_a_strand(
    controllers: list[int], leader: int, followers: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        strand_groups(NODES, controllers, leader, followers)


# -- the schedule ------------------------------------------------------------------------


def test_the_strand_kinds_are_broker_and_network_faults_and_one_is_a_power_loss() -> None:
    assert set(STRAND_KINDS) <= set(FAULT_KINDS) & set(BROKER_KINDS) & set(NETWORK_KINDS)
    assert "strand-power-loss-partition-leader" in POWER_LOSS_KINDS
    assert "strand-partition-leader" not in POWER_LOSS_KINDS
    assert expand_nemesis(list(STRAND_KINDS), 6) == list(STRAND_KINDS)
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        expand_nemesis(["strand-partition-leader"], 1)


@pytest.mark.parametrize("power", [False, True])
def test_a_power_loss_strand_starts_every_process_in_the_power_loss_mode(power: bool) -> None:
    kind = STRAND_KINDS[1] if power else STRAND_KINDS[0]
    env = storage_environment(RunConfig(faults=(kind,)), {})
    assert (env.get(LOSE_UNSYNCED_VARIABLE) == "1") is power


def _strands(actions: list[Action]) -> list[list[Action]]:
    """The actions from each strand's partition to its start."""
    return fault_spans(actions, STRAND_KINDS, "strand")


@pytest.mark.parametrize("seed", range(40))
def test_each_strand_is_a_partition_a_kill_a_heal_and_a_start_alone(seed: int) -> None:
    pool = [*STRAND_KINDS, "kill-partition-leader", "isolate-follower", "kill", "pause"]
    actions = drawn_schedule(seed, pool)
    end = max(a.time_s for a in actions)
    for strand in _strands(actions):
        partition, kill, heal, start = strand  # nothing else comes in between
        assert partition.target == "strand" and partition.groups == ()
        assert (kill.f, kill.kind, kill.target) == ("kill", partition.kind, "stranded")
        assert kill.time_s == pytest.approx(partition.time_s + STRAND_SHRINK_S)
        assert heal.f == "heal"
        assert (start.kind, start.target) == (partition.kind, "partition-leader")
        hold = start.time_s - kill.time_s
        assert STRAND_HOLD_S[0] <= hold <= STRAND_HOLD_S[1] + 1e-9
        assert heal.time_s == start.time_s <= end


def test_a_strand_needs_its_whole_length_within_the_schedule() -> None:
    short = STRAND_SHRINK_S + STRAND_HOLD_S[1] - 0.5
    for seed in range(20):
        actions = schedule(
            random.Random(seed), NODES, ["strand-partition-leader"], duration_s=short
        )
        assert [a.f for a in actions] == ["heal"]
    actions = schedule(
        random.Random(1), NODES, ["strand-power-loss-partition-leader"], duration_s=40.0
    )
    assert len(_strands(actions)) >= 2


def test_a_strand_is_exempt_from_keep_majority_as_the_controllers_reach_every_node() -> None:
    # Two nodes only: a partition of either would leave no majority, yet a
    # strand starts (its groups keep the controllers with every node).
    actions = schedule(random.Random(3), [1, 2], ["strand-partition-leader"], duration_s=30)
    assert _strands(actions)


# -- the runner ----------------------------------------------------------------------------


def _run_strand(
    tmp_path: Path, isrs: list[tuple[int, ...]], wait_s: float = 15.0
) -> tuple[RecordingBackend, _Nemesis, list[tuple[str, Action]]]:
    """A strand of partition queue-1 (leader 5, replicas 5, 4, 6) whose ISR
    the controllers report as ``isrs`` in turn (the last one thereafter)."""
    answers = iter(isrs)
    last: list[tuple[int, ...]] = []

    async def replicas() -> list[PartitionReplicas]:
        isr = next(answers, None)
        if isr is not None:
            last[:] = [isr]
        return [
            # Partition 0 has no follower in its ISR: nothing to strand there.
            PartitionReplicas("queue-0", 4, (4, 5, 6), (4,)),
            PartitionReplicas("queue-1", 5, (5, 4, 6), last[0]),
        ]

    return run_strand_plan(tmp_path, "strand-power-loss-partition-leader", replicas, wait_s)


def test_the_runner_strands_the_leader_kills_it_once_the_isr_shrank_then_heals(
    tmp_path: Path,
) -> None:
    backend, nemesis, out = _run_strand(tmp_path, [(5, 4, 6), (5, 4, 6), (5, 4, 6), (5, 4), (5,)])
    assert [how for how, _ in out] == ["ok"] * 4
    assert backend.done == [
        ("partition", ((1, 2, 3, 5), (1, 2, 3, 4), (1, 2, 3, 6))),
        ("kill", 5),
        ("heal", None),
        ("restart", 5),
    ]
    [strand] = nemesis.strands
    assert strand["partition"] == "queue-1" and strand["leader"] == 5
    assert (strand["isr_before"], strand["isr_at_kill"], strand["shrunk"]) == (
        [5, 4, 6],
        [5],
        True,
    )
    ops = nemesis_ops(tmp_path)
    kind = "strand-power-loss-partition-leader"
    assert [(op.f, op.value) for op in ops if op.type == "ok"] == [
        ("partition", {"groups": [[1, 2, 3, 5], [1, 2, 3, 4], [1, 2, 3, 6]], "kind": kind}),
        ("kill", {"nodes": [5], "kind": kind}),
        ("heal", {}),
        ("start", {"nodes": [5], "kind": kind}),
    ]
    assert [nemesis_op(a) for _, a in out][1] == ("kill", {"nodes": [5], "kind": kind})


def test_the_runner_kills_after_its_bound_when_the_isr_never_shrinks(tmp_path: Path) -> None:
    backend, nemesis, _ = _run_strand(tmp_path, [(5, 4, 6)], wait_s=0.5)
    assert ("kill", 5) in backend.done
    [strand] = nemesis.strands
    assert strand["shrunk"] is False and strand["isr_at_kill"] == [5, 4, 6]
    assert strand["waited_s"] >= 0.5


def test_the_runner_skips_a_strand_with_no_follower_in_any_isr(tmp_path: Path) -> None:
    backend, nemesis, writer = recording_nemesis(tmp_path)

    async def replicas() -> list[PartitionReplicas]:
        return [PartitionReplicas("queue-0", 4, (4, 5, 6), (4,))]

    nemesis.replicas = replicas
    kind = "strand-partition-leader"

    plan = (
        Action(0, "partition", kind=kind, target="strand"),
        Action(3, "kill", kind=kind, target="stranded"),
        Action(9, "start", kind=kind, target="partition-leader"),
    )
    assert asyncio.run(act_all(nemesis, plan)) == ["skipped"] * 3
    writer.close()
    assert backend.done == []


def test_the_local_runs_check_finds_the_strands_notes_and_steps_and_fires_without_them(
    tmp_path: Path,
) -> None:
    # The fake strand's history and notes, laid out as a run folder, pass
    # the check the local runs make; a missing step or no notes fail it.
    _, nemesis, _ = _run_strand(tmp_path, [(5, 4, 6), (5,)])
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.history.write_text((tmp_path / HISTORY).read_text())
    run.summary.write_text(json.dumps({"strands": nemesis.strands}))
    kind = "strand-power-loss-partition-leader"
    steps = ("partition", "kill", "start")
    assert local_fault_notes(run.path, "strands", kind, steps) == nemesis.strands
    with pytest.raises(AssertionError, match="no elect-leader of strand-power-loss"):
        local_fault_notes(run.path, "strands", kind, (*steps, "elect-leader"))
    with pytest.raises(AssertionError, match="no catch_ups in summary.json"):
        local_fault_notes(run.path, "catch_ups", kind, steps)


# -- a real local cluster ------------------------------------------------------------------


@pytest.mark.slow
def test_a_local_strand_shrinks_the_isr_to_the_leader_before_killing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_iptables()
    scratch_tempdir(tmp_path, monkeypatch)
    result, strands = run_local_strand(tmp_path, "queue-strand", "strand-partition-leader")
    for s in strands:
        # The controllers' metadata had the ISR down to the leader alone.
        assert s["shrunk"] and s["isr_at_kill"] == [s["leader"]], s
        assert len(s["isr_before"]) >= 2
    # A correct build loses nothing: an eligible follower leads while the
    # stranded leader is down.
    assert result.recovered and result.final_ok, result.final_check

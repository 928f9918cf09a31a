"""A real queue run on the local backend whose nemesis moves partitions'
leadership with every node up: ``reassign`` (a leader's replica moved to
the fourth broker, and back) and ``elect-leader`` (another ISR member made
preferred and elected).  The controllers' metadata, read by the nemesis
after each move (the completion's ``now``), shows the new replicas and the
new leader; the run stays valid on a correct build (the harness's final
polls find every acknowledged record at its offset), and nothing is left
running."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chaos.runner import RunConfig, expand_nemesis, run_chaos
from chaos.workloads.queue import check_final_polls
from chaos.workloads.queue_setup import QueueOptions
from history.files import read_history
from history.ops import NEMESIS
from history.runs import RunDir, check_run
from tests.chaos.cluster_scenarios import processes_under, scratch_tempdir

pytestmark = pytest.mark.slow


def test_reassignments_and_elections_move_leaders_mid_run_and_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    config = RunConfig(
        name="queue-moves",
        workload="queue",
        faults=tuple(expand_nemesis(["reassign", "elect-leader"], 7)),
        time_limit_s=20,
        rate=30,
        concurrency=3,
        seed=11,
        fault_interval_s=2.0,
        fault_period_s=9.0,
        quiet_s=1.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(brokers=4, partitions=2, replication_factor=3, final_time_s=30),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 300))
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert result.problems == []
    run = RunDir(result.path)
    assert check_run(run.path) == []
    ops = read_history(run.history)
    done = [op for op in ops if op.process == NEMESIS and op.type == "ok"]

    elections = [op.value for op in done if op.f == "elect-leader"]
    assert elections, "no election was made"
    for v in elections:
        # The preferred replica, an ISR member that did not lead, leads now.
        assert v["preferred"] != v["leader"] and v["replicas"][0] == v["preferred"]
        assert v["now"]["leader"] == v["preferred"], v
        assert v["now"]["replicas"] == v["replicas"]

    moves = [op.value for op in done if op.f == "reassign" and "kind" not in op.value]
    reverts = [op.value for op in done if op.f == "reassign" and op.value.get("kind") == "revert"]
    assert moves and reverts, "no reassignment, or none reverted"
    # The leader's replica moved to the broker that held none: once the
    # move is done the old leader holds no replica and another leads.
    finished = [v for v in moves if v["now"]["replicas"] == v["replicas"]]
    assert finished, moves
    for v in finished:
        assert v["leader"] not in v["replicas"] and v["now"]["leader"] in v["replicas"]
        assert v["now"]["leader"] != v["leader"]
    for v in reverts:
        # Back to the replicas found (the target first while the move is on).
        assert v["now"]["replicas"][: len(v["replicas"])] == v["replicas"], v

    summary = json.loads(run.summary.read_text())
    assert summary["faults_injected"].get("elect-leader", 0) == len(elections)
    assert summary["faults_injected"].get("reassign", 0) == len(moves)
    final = summary["final_polls"]
    assert final["complete"], final
    assert check_final_polls(ops, final["from_index"]) == {
        "lost": [],
        "moved": [],
        "inconsistent": [],
    }
    assert processes_under(scratch) == []
    assert list(scratch.iterdir()) == []

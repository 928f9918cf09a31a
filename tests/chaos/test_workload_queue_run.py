"""One short real run of the queue workload on the local backend: 3
controllers and 3 brokers started as ``kq cluster up --brokers 3`` starts
them, a kill nemesis that may pick any of them, and the final polls.  The
history is well formed as the queue model, every acknowledged record is
found by the final polls at its offset (checked here from the history file,
independently of the workload's own verdict), and nothing is left running."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chaos.runner import RunConfig, expand_nemesis, run_chaos
from chaos.workloads.queue import check_final_polls
from chaos.workloads.queue_setup import QueueOptions
from history.exports import record_hash
from history.files import read_history
from history.ops import NEMESIS
from history.runs import RunDir, check_run
from tests.chaos.cluster_scenarios import need_iptables, processes_under, scratch_tempdir

pytestmark = pytest.mark.slow


def test_a_short_queue_run_with_kills_loses_no_acknowledged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    config = RunConfig(
        name="queue-ci",
        workload="queue",
        faults=("kill",),
        time_limit_s=12,
        rate=30,
        concurrency=3,
        seed=5,
        fault_interval_s=2.0,
        fault_period_s=8.0,
        quiet_s=2.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(partitions=3, final_time_s=30),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 240))
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert result.problems == []
    run = RunDir(result.path)
    assert check_run(run.path) == []
    cfg = json.loads(run.config.read_text())
    assert cfg["model"] == "queue" and cfg["brokers"] == [4, 5, 6]
    assert cfg["queue"]["topics"] == [{"name": "queue", "partitions": 3}]
    ops = read_history(run.history)
    kills = [op for op in ops if op.process == NEMESIS and op.f == "kill" and op.type == "ok"]
    assert kills, "the nemesis killed nothing"
    sends = [op for op in ops if op.f == "send" and op.type == "ok"]
    assert len(sends) >= 10
    summary = json.loads(run.summary.read_text())
    final = summary["final_polls"]
    assert final["complete"], final
    assert check_final_polls(ops, final["from_index"]) == {
        "lost": [],
        "moved": [],
        "inconsistent": [],
    }
    assert (run.logs / "broker-4.log").read_text()
    # The brokers' partition exports hold every acknowledged record at its
    # offset (the hash is of the value's text), and each partition's HW.
    exported: set[tuple[int, int, str]] = set()
    for broker in (4, 5, 6):
        folder = run.node_dir(broker)
        for line in (folder / "partitions.jsonl").read_text().splitlines():
            rec = json.loads(line)
            assert rec["node"] == broker and rec["topic"] == "queue"
            exported.add((rec["partition"], rec["offset"], rec["hash"]))
        states = [
            json.loads(x) for x in (folder / "partition_state.jsonl").read_text().splitlines()
        ]
        assert {s["partition"] for s in states} <= {0, 1, 2}
        assert all(0 <= s["high_watermark"] <= s["log_end_offset"] for s in states)
    # The controllers' committed partition changes: every partition created,
    # its leader and partition epochs never going down.
    changes = [
        json.loads(line)
        for line in (run.node_dir(1) / "partition_changes.jsonl").read_text().splitlines()
    ]
    assert {(c["topic"], c["partition"]) for c in changes} == {("queue", p) for p in range(3)}
    for p in range(3):
        mine = [c for c in changes if c["partition"] == p]
        assert [c["offset"] for c in mine] == sorted(c["offset"] for c in mine)
        for a, b in zip(mine, mine[1:], strict=False):
            assert b["leader_epoch"] >= a["leader_epoch"]
            assert b["partition_epoch"] == a["partition_epoch"] + 1
    for op in sends:
        for _, key, (offset, value) in op.value:
            if offset is not None:
                assert (key, offset, record_hash(str(value).encode())) in exported, (key, offset)
    assert processes_under(scratch) == []
    assert list(scratch.iterdir()) == []


def test_a_queue_run_under_partitions_and_follower_isolation_stays_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Brokers cut off by address like controllers: a partition of any
    nodes, and a follower isolated so that its ISR shrinks and grows."""
    need_iptables()
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    faults = tuple(expand_nemesis(["isolate-one", "isolate-follower", "pause"], 6))
    config = RunConfig(
        name="queue-net",
        workload="queue",
        faults=faults,
        time_limit_s=14,
        rate=30,
        concurrency=3,
        seed=8,
        fault_interval_s=1.5,
        fault_period_s=10.0,
        quiet_s=1.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(partitions=2, final_time_s=30),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 240))
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert check_run(result.path) == []
    ops = read_history(RunDir(result.path).history)
    done = [op for op in ops if op.process == NEMESIS and op.type == "ok"]
    assert any(op.f == "partition" for op in done)
    assert processes_under(scratch) == []


def test_a_group_run_with_kills_commits_and_hands_keys_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--group``: the consumers subscribe in one group while any node may
    be killed (a broker leading an offsets partition among them); the
    history is well formed, commits are acknowledged, keys are handed on
    (each ``assigned`` starting at or above every ``ok`` commit of the key
    that completed before it: the group checks' ``commit-lost`` rule), and
    the final polls find every acknowledged record."""
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    config = RunConfig(
        name="queue-group",
        workload="queue",
        faults=("kill",),
        time_limit_s=16,
        rate=30,
        concurrency=4,
        seed=11,
        fault_interval_s=2.0,
        fault_period_s=10.0,
        quiet_s=2.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(partitions=4, final_time_s=30, group="queue-ci"),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 240))
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert check_run(result.path) == []
    run = RunDir(result.path)
    assert json.loads(run.config.read_text())["queue"]["group"] == "queue-ci"
    ops = read_history(run.history)
    assert any(op.f == "subscribe" for op in ops)
    assert sum(op.f == "commit" and op.type == "ok" for op in ops) >= 3
    committed: dict[str, list[tuple[int, int]]] = {}  # key -> (completed at, offset)
    assignments = 0
    for op in ops:
        if op.f == "commit" and op.type == "ok":
            for k, offset in op.value[0][1].items():
                committed.setdefault(k, []).append((op.time, offset))
        if op.f == "poll" and op.type == "ok" and op.assigned:
            for k, (start, at) in op.assigned.items():
                before = [o for t, o in committed.get(k, []) if t < at]
                assert start >= max(before, default=0), (k, start, before)
                assignments += 1
    assert assignments >= 4
    assert processes_under(scratch) == []

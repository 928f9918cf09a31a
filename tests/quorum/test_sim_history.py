"""The simulator's histories and node exports (docs/history-format.md).

Recording must not change a run; what it records must be well formed and
agree with what the nodes committed: every ok write is in the committed
log at its offset and epoch, and no failed write is anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from history.exports import check_changes, check_log, record_hash
from history.files import NEMESIS, Op, check_well_formed
from history.runs import check_run
from kq.cli import main as kq_main
from quorum.sim import FaultPlan, SimConfig, run_schedule
from quorum.sim.history import LOG_KEY, SimHistory
from quorum.sim.schedule import Fault

SHAPES = [(1, 0), (3, 1), (5, 2)]


def _record(seed: int, voters: int, observers: int, plan: FaultPlan | None = None) -> SimHistory:
    history = SimHistory()
    result = run_schedule(
        seed, SimConfig(voters=voters, observers=observers), plan, history=history
    )
    assert result.ok, result.violation
    return history


@pytest.mark.parametrize("seed", range(3))
def test_recording_does_not_change_the_run(seed: int) -> None:
    config = SimConfig(voters=3, observers=1)
    plain = run_schedule(seed, config)
    recorded = run_schedule(seed, config, history=SimHistory())
    assert plain == recorded
    assert plain.trace == recorded.trace


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}v{s[1]}o")
@pytest.mark.parametrize("seed", range(8))
def test_histories_are_well_formed_and_record_the_faults(seed: int, shape: tuple[int, int]) -> None:
    voters, observers = shape
    history = _record(seed, voters, observers)
    ops = history.ops
    # With one node a partition cuts nothing and is not recorded, so only
    # bigger clusters are sure to have nemesis ops.
    assert check_well_formed(ops, model="log", require_nemesis=voters > 1) == []
    assert all(op.key == LOG_KEY for op in ops if op.process != NEMESIS)
    assert any(op.type == "ok" for op in ops)
    for node, entries in history.node_logs().items():
        assert check_log(entries, node) == []
    for node, changes in history.changes.items():
        assert check_changes(changes, node) == []
        assert changes, f"node {node} never reported a role"
    assert sorted(history.node_logs()) == list(range(1, voters + observers + 1))


def test_faults_appear_as_nemesis_ops() -> None:
    fs: set[str] = set()
    for seed in range(6):
        ops = _record(seed, 3, 1).ops
        fs |= {op.f for op in ops if op.process == NEMESIS}
    assert fs == {"kill", "start", "partition", "packet", "heal", "resign"}


def test_a_fault_free_run_has_no_nemesis_ops() -> None:
    ops = _record(4, 3, 1, FaultPlan(faults=())).ops
    assert check_well_formed(ops, model="log") == []
    assert not any(op.process == NEMESIS for op in ops)
    assert all(op.type in ("invoke", "ok") for op in ops)


def test_crashes_are_kill_and_start_pairs() -> None:
    ops = _record(2, 3, 0, FaultPlan(faults=(Fault.CRASH, Fault.RESTART))).ops
    nemesis = [op for op in ops if op.process == NEMESIS]
    assert {op.f for op in nemesis} == {"kill", "start"}
    killed = [op.value["nodes"][0] for op in nemesis if op.f == "kill" and op.type == "ok"]
    started = [op.value["nodes"][0] for op in nemesis if op.f == "start" and op.type == "ok"]
    assert killed and sorted(killed) == sorted(started)


@pytest.mark.parametrize("seed", range(6))
def test_outcomes_agree_with_the_committed_logs(seed: int) -> None:
    history = _record(seed, 3, 1)
    committed: dict[int, set[tuple[int, str]]] = {}
    for entries in history.node_logs().values():
        for e in entries:
            committed.setdefault(e.offset, set()).add((e.epoch, e.hash))
    assert all(len(v) == 1 for v in committed.values())
    hashes = {h for v in committed.values() for _, h in v}
    completions: list[Op] = [
        op for op in history.ops if op.process != NEMESIS and op.type != "invoke"
    ]
    for op in completions:
        if op.type == "ok":
            assert op.offset is not None and op.epoch is not None
            for i, record in enumerate(op.value):
                assert committed[op.offset + i] == {(op.epoch, record_hash(record.encode()))}
        elif op.type == "fail":
            assert op.error in ("superseded", "not-leader")
            assert not any(record_hash(r.encode()) in hashes for r in op.value)
        else:
            assert op.error == "indeterminate"
    # Offsets of ok writes are distinct, and each record committed at most once.
    oks = [op.offset for op in completions if op.type == "ok"]
    assert len(oks) == len(set(oks))


def test_kq_sim_writes_run_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = kq_main(
        ["sim", "--seed", "5", "--schedules", "2", "--history-dir", str(tmp_path), "--json"]
    )
    assert status == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["seed"] for row in rows] == [5, 6]
    for row in rows:
        run = Path(row["history_dir"])
        assert run.parent == tmp_path and run.name.endswith(f"-sim-seed-{row['seed']}")
        assert row["history_problems"] == []
        assert check_run(run) == []
        config = json.loads((run / "config.json").read_text())
        assert config["backend"] == "sim" and config["model"] == "log"
        assert config["nodes"] == [1, 2, 3, 4] and config["seed"] == row["seed"]
        assert config["replay"].startswith(f"kq sim --seed {row['seed']} ")
        summary = json.loads((run / "summary.json").read_text())
        assert summary["well_formed"] and summary["ok"]
        assert summary["sim"]["proposals"] == row["proposals"]
        assert (run / "logs" / "trace.log").read_text().count("\n") > 10
    status = kq_main(["sim", "--seed", "5", "--faults", "none", "--history-dir", str(tmp_path)])
    assert status == 0
    out = capsys.readouterr().out
    assert "history: " in out and "problem" not in out

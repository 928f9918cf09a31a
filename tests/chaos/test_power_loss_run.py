"""One short real queue run with power losses on the local backend: 3
controllers and 3 brokers in the storage's power-loss test mode, acks=all,
replication factor 3, min ISR 2; nodes drawn at random lose power (their
unsynced writes dropped by a SIGKILL) and start again.  The run ends valid:
every acknowledged record is found by the final polls at its offset, and a
broker did come back with a shorter log than it had (the fault bit)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from chaos.runner import RunConfig, run_chaos
from chaos.workloads.queue import check_final_polls
from chaos.workloads.queue_setup import QueueOptions
from history.files import read_history
from history.ops import NEMESIS
from history.runs import RunDir, check_run
from tests.chaos.cluster_scenarios import processes_under, scratch_tempdir

pytestmark = pytest.mark.slow

_START = re.compile(r"^--- .* kq cluster: starting broker (\d+)$")
_STATE = re.compile(r"broker \d+ partition (\S+): role .* leo (\d+) isr")


def log_cuts(text: str) -> list[tuple[str, int, int]]:
    """Each partition whose log end, in the first state line a restarted
    broker wrote, is below the last one its previous process wrote:
    ``(partition, before, after)``."""
    runs: list[list[tuple[str, int]]] = []
    for line in text.splitlines():
        if _START.match(line):
            runs.append([])
        elif runs and (m := _STATE.search(line)):
            runs[-1].append((m[1], int(m[2])))
    cuts = []
    for before, after in zip(runs, runs[1:], strict=False):
        last = dict(before)
        first: dict[str, int] = {}
        for partition, end in after:
            first.setdefault(partition, end)
        cuts += [(p, last[p], end) for p, end in first.items() if p in last and end < last[p]]
    return cuts


def test_log_cuts_reads_the_state_lines() -> None:
    text = "\n".join(
        [
            "--- 2026-11-26 07:07:13 kq cluster: starting broker 5",
            "broker 5 partition q-0: role leader leader 5 epoch 0 hw 3 leo 4 isr 4,5",
            "broker 5 partition q-1: role follower leader 4 epoch 0 hw 2 leo 2 isr 4",
            "--- 2026-11-26 07:07:22 kq cluster: starting broker 5",
            "broker 5 partition q-0: role follower leader 4 epoch 1 hw 0 leo 0 isr 4",
            "broker 5 partition q-1: role follower leader 4 epoch 1 hw 2 leo 2 isr 4",
            "broker 5 partition q-0: role follower leader 4 epoch 1 hw 5 leo 5 isr 4",
        ]
    )
    assert log_cuts(text) == [("q-0", 4, 0)]


def test_a_short_queue_run_with_power_losses_loses_no_acknowledged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    config = RunConfig(
        name="queue-power",
        workload="queue",
        faults=("power-loss",),
        time_limit_s=18,
        rate=30,
        concurrency=3,
        # Seed 1's schedule cuts the power of brokers 5 and 4 and of
        # controller 3, each after records were acknowledged.
        seed=1,
        fault_interval_s=2.0,
        fault_period_s=10.0,
        quiet_s=2.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(
            partitions=3, replication_factor=3, min_isr=2, acks="all", final_time_s=30
        ),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 300))
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert result.problems == []
    run = RunDir(result.path)
    assert check_run(run.path) == []
    ops = read_history(run.history)
    cuts = [
        op
        for op in ops
        if op.process == NEMESIS
        and op.f == "kill"
        and op.type == "ok"
        and isinstance(op.value, dict)
        and op.value.get("kind") == "power-loss"
    ]
    assert cuts, "the nemesis cut no power"
    final = json.loads(run.summary.read_text())["final_polls"]
    assert final["complete"], final
    assert check_final_polls(ops, final["from_index"]) == {
        "lost": [],
        "moved": [],
        "inconsistent": [],
    }
    # Every process ran in the mode, and some broker restarted with a log
    # cut back to its last sync: what was only in its memory was gone.
    harness = (run.logs / "harness.log").read_text()
    assert "the nodes run in the power-loss test mode" in harness
    logs = {p.name: p.read_text() for p in run.logs.glob("*.log") if p.name != "harness.log"}
    for name, text in logs.items():
        assert "runs in the power-loss test mode" in text, name
    brokers_cut = {name: log_cuts(text) for name, text in logs.items() if name.startswith("broker")}
    assert any(brokers_cut.values()), brokers_cut
    assert processes_under(scratch) == []
    assert list(scratch.iterdir()) == []

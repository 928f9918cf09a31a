"""A short real queue run on the local backend whose one fault cuts the power
of nodes (``power-loss``, ``torn-power-loss-partition-leader``), and what
every such run must show whatever it cut: it ran to its end and recovered,
its history, exports and summary are valid, the nemesis cut power at least
once, the final polls found every acknowledged record at its offset, and
nothing of the run is left running or in its scratch space.  Each test adds
what its own kind of cut must show (``test_power_loss_run``,
``test_torn_power_loss_run``)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.runner import RunConfig, run_chaos
from history.files import read_history
from history.ops import NEMESIS, Op
from history.runs import RunDir, check_run
from tests.chaos.cluster_scenarios import processes_under, scratch_tempdir
from tests.chaos.queue_runs import check_final_polls_found_everything


@dataclass(frozen=True, slots=True)
class PowerLossRun:
    """A finished run: its folder, its history, and the nemesis' completed
    power cuts of the run's fault kind, in the history's order."""

    run: RunDir
    ops: list[Op]
    cuts: list[Op]


def power_cuts(ops: list[Op], kind: str) -> list[Op]:
    """The nemesis' completed kills of ``kind``: the power cuts it made."""
    return [
        op
        for op in ops
        if op.process == NEMESIS
        and op.f == "kill"
        and op.type == "ok"
        and isinstance(op.value, dict)
        and op.value.get("kind") == kind
    ]


def check_power_loss_run(path: Path, kind: str) -> PowerLossRun:
    """The run folder ``path`` of a queue run that cut power with ``kind``:
    its exports valid, at least one cut, and the final polls complete with
    no acknowledged record lost, moved or inconsistent."""
    run = RunDir(path)
    assert check_run(run.path) == []
    ops = read_history(run.history)
    cuts = power_cuts(ops, kind)
    assert cuts, "the nemesis cut no power"
    check_final_polls_found_everything(run, ops)
    return PowerLossRun(run, ops, cuts)


def run_with_power_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: RunConfig
) -> PowerLossRun:
    """Run ``config`` (one fault kind, a power cut) with its runs folder
    and scratch space under ``tmp_path``, check it as
    :func:`check_power_loss_run` does, and that it left no process and no
    scratch file behind."""
    (kind,) = config.faults
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    config = dataclasses.replace(config, runs_dir=str(tmp_path / "runs"))
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 300))
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert result.problems == []
    found = check_power_loss_run(result.path, kind)
    assert processes_under(scratch) == []
    assert list(scratch.iterdir()) == []
    return found

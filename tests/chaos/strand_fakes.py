"""What the strand tests share: a backend played by the test that records
what the nemesis does, a strand's four actions run through the runner's
nemesis against it, and the short queue run of a strand on a real local
cluster with the strand ops its history holds."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from chaos.nemesis import Action
from chaos.runner import PartitionReplicas, RunConfig, RunResult, _Nemesis, run_chaos
from chaos.workloads.queue_setup import QueueOptions
from history.files import HistoryWriter, read_history
from history.ops import NEMESIS, Op
from history.runs import RunDir

NODES = [1, 2, 3, 4, 5, 6]  # controllers 1-3, brokers 4-6


class RecordingBackend:
    """Records what the nemesis does; the controllers are 1-3."""

    nodes = NODES

    def __init__(self) -> None:
        self.done: list[tuple[str, Any]] = []

    def addresses(self) -> dict[int, str]:
        return {1: "a", 2: "b", 3: "c"}

    async def kill(self, node: int) -> None:
        self.done.append(("kill", node))

    async def restart(self, node: int) -> None:
        self.done.append(("restart", node))

    async def partition(self, groups: Any) -> None:
        self.done.append(("partition", groups))

    async def heal(self) -> None:
        self.done.append(("heal", None))


HISTORY = "h.jsonl"
"""The history file the nemesis of :func:`recording_nemesis` writes, under
the test's ``tmp_path``."""


def recording_nemesis(tmp_path: Path) -> tuple[RecordingBackend, _Nemesis, HistoryWriter]:
    """The runner's nemesis against a :class:`RecordingBackend`, writing its
    ops to ``tmp_path / HISTORY`` (close the writer before reading them)."""
    backend = RecordingBackend()
    writer = HistoryWriter(tmp_path / HISTORY)
    nemesis = _Nemesis(backend, writer, lambda line: None)  # type: ignore[arg-type]
    return backend, nemesis, writer


def nemesis_ops(tmp_path: Path) -> list[Op]:
    """The nemesis' ops of :func:`recording_nemesis`'s history, in order."""
    return [op for op in read_history(tmp_path / HISTORY) if op.process == NEMESIS]


async def act_all(nemesis: _Nemesis, plan: Iterable[Action]) -> list[str]:
    """How the nemesis carried out each action of ``plan`` in turn
    (``ok`` or ``skipped``)."""
    return [(await nemesis.act(a))[0] for a in plan]


def run_strand_plan(
    tmp_path: Path,
    kind: str,
    replicas: Callable[[], Awaitable[list[PartitionReplicas]]],
    wait_s: float = 15.0,
) -> tuple[RecordingBackend, _Nemesis, list[tuple[str, Action]]]:
    """A strand of ``kind`` (its partition, kill, the heal and the start)
    carried out by the runner's nemesis against a :class:`RecordingBackend`,
    the controllers' metadata answered by ``replicas``; returns the backend,
    the nemesis and each action's outcome."""
    backend, nemesis, writer = recording_nemesis(tmp_path)
    nemesis.replicas = replicas
    nemesis.strand_wait_s = wait_s
    plan = [
        Action(0, "partition", kind=kind, target="strand"),
        Action(3, "kill", kind=kind, target="stranded"),
        Action(9, "heal"),
        Action(9, "start", kind=kind, target="partition-leader"),
    ]
    out: list[tuple[str, Action]] = []

    async def main() -> None:
        for action in plan:
            out.append(await nemesis.act(action))

    asyncio.run(main())
    writer.close()
    return backend, nemesis, out


def local_fault_config(
    tmp_path: Path, name: str, kind: str, partitions: int = 2, **changes: Any
) -> RunConfig:
    """A 20 s queue run of ``kind`` alone on a real local cluster
    (``partitions`` partitions of three replicas, min ISR 2, acks=all, a
    1.5 s replica lag), its runs folder under ``tmp_path``; ``changes``
    replace the run's other settings."""
    config = RunConfig(
        name=name,
        workload="queue",
        faults=(kind,),
        time_limit_s=20,
        rate=20,
        concurrency=2,
        seed=3,
        fault_interval_s=1.5,
        fault_period_s=10.0,
        quiet_s=2.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(
            partitions=partitions,
            replication_factor=3,
            min_isr=2,
            acks="all",
            final_time_s=30,
            replica_lag_ms=1_500,
        ),
    )
    return dataclasses.replace(config, **changes)


def local_fault_notes(path: Path, key: str, kind: str, steps: Sequence[str]) -> list[Any]:
    """The notes ``summary.json`` keeps under ``key`` in the run folder
    ``path``, after checking that there is one at least and that the
    nemesis carried out each of ``steps`` of ``kind``."""
    run = RunDir(path)
    notes: list[Any] = json.loads(run.summary.read_text()).get(key) or []
    assert notes, f"no {key} in summary.json: the fault was never carried out"
    ops = read_history(run.history)
    done = [(op.f, (op.value or {}).get("kind")) for op in ops if op.process == NEMESIS]
    for step in steps:
        assert (step, kind) in done, f"no {step} of {kind} in the history: {done}"
    return notes


def run_local_fault(
    config: RunConfig, key: str, steps: Sequence[str]
) -> tuple[RunResult, list[Any]]:
    """Run ``config`` (one fault kind) on a real local cluster; its result
    and ``summary.json``'s notes under ``key``, after checking that it
    completed and carried out each of ``steps`` (:func:`local_fault_notes`)."""
    (kind,) = config.faults
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 400))
    assert result.completed, result.error
    return result, local_fault_notes(result.path, key, kind, steps)


def run_local_strand(tmp_path: Path, name: str, kind: str) -> tuple[RunResult, list[Any]]:
    """A strand of ``kind`` alone in :func:`local_fault_config`'s run;
    returns its result and ``summary.json``'s strands, after checking that
    it completed and that its history holds the strand's partition, kill
    and start."""
    config = local_fault_config(tmp_path, name, kind)
    return run_local_fault(config, "strands", ("partition", "kill", "start"))

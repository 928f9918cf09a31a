"""``kq sim``: run seeded simulations of a quorum and report the invariants.

Each run is deterministic: the same flags and seed give the same events,
the same trace and the same verdict.  The simulator itself
(:mod:`quorum.sim`) is pure; this command prints and writes run folders.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from typing import Any

from kq.commands import sim_brokers
from kq.commands.common import Subparsers
from quorum.sim.cluster import SimConfig, SimResult
from quorum.sim.history import SimHistory
from quorum.sim.schedule import ALL_FAULTS, Fault, FaultPlan, run_schedule

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="run a deterministic simulation of a quorum under faults",
        description=(
            "Run seeded, deterministic simulations of a kq quorum: real consensus "
            "cores on a simulated network with crashes, partitions, message loss, "
            "duplication and delay, leader resignations and snapshots. Every "
            "safety invariant is checked after every event; after the faults the "
            "network heals and a new leader must commit a proposal on every node."
        ),
    )
    parser.add_argument("--voters", type=_positive("--voters", 1, 9), default=3)
    parser.add_argument("--observers", type=_positive("--observers", 0, 9), default=1)
    parser.add_argument("--seed", type=_positive("--seed", 0, 2**63), default=1)
    parser.add_argument(
        "--schedules",
        type=_positive("--schedules", 1, 1_000_000),
        default=1,
        help="run this many schedules, seeds SEED, SEED+1, ... (default 1)",
    )
    parser.add_argument(
        "--duration-ms",
        type=_positive("--duration-ms", 0, 10**9),
        default=FaultPlan().duration_ms,
        help="virtual time of the fault phase (default %(default)s)",
    )
    parser.add_argument(
        "--faults",
        type=_faults,
        default=ALL_FAULTS,
        help="comma-separated faults to draw from: "
        + ",".join(f.value for f in ALL_FAULTS)
        + " (default: all); 'none' for a fault-free run",
    )
    parser.add_argument(
        "--trace", action="store_true", help="print every role change and fault of each run"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per run")
    parser.add_argument(
        "--history-dir",
        metavar="DIR",
        help="record each run as a run folder DIR/<time>-sim-seed-<S>/: history.jsonl of "
        "the client's proposals and the faults, each node's committed log and changes, "
        "config.json, summary.json, logs/trace.log (docs/history-format.md)",
    )
    parser.set_defaults(func=run)
    # kq sim brokers: the broker simulation (broker.sim), its own flags.
    targets = parser.add_subparsers(dest="sim_target", metavar="{brokers}")
    brokers = targets.add_parser(
        "brokers",
        help="simulate brokers replicating partitions under a controller stub",
        description=(
            "Run seeded, deterministic simulations of brokers replicating partitions "
            "(Kafka's ISR protocol) under a controller stub, with power losses, kills, "
            "pauses, isolation, one-way cuts and message loss; every invariant is "
            "checked after every event. --scenario runs one of Kafka's historical bugs."
        ),
    )
    sim_brokers.add_arguments(brokers)


def _positive(flag: str, low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} needs an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be in [{low}, {high}], got {value}")
        return value

    return parse


def _faults(text: str) -> tuple[Fault, ...]:
    if text.strip() == "none":
        return ()
    names = [t.strip() for t in text.split(",") if t.strip()]
    known = {f.value: f for f in ALL_FAULTS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown fault(s) {', '.join(unknown) or repr(text)}; known: "
            + ", ".join(known)
            + ", or none"
        )
    return tuple(known[n] for n in names)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "sim_target", None) == "brokers":
        return sim_brokers.run(args)
    config = SimConfig(voters=args.voters, observers=args.observers)
    plan = replace(FaultPlan(), duration_ms=args.duration_ms, faults=args.faults)
    failures = 0
    for seed in range(args.seed, args.seed + args.schedules):
        history = SimHistory() if args.history_dir else None
        result = run_schedule(seed, config, plan, history=history)
        failures += not result.ok
        recorded: tuple[str, list[str]] | None = None
        if history is not None:
            recorded = _write_run(args.history_dir, seed, config, plan, result, history)
            # A run that held every invariant must leave a well-formed history.
            failures += result.ok and bool(recorded[1])
        if args.json:
            row = asdict(result)
            row["trace"] = list(result.trace) if args.trace or not result.ok else []
            if recorded is not None:
                row["history_dir"], row["history_problems"] = recorded
            print(json.dumps(row))
        else:
            _print_human(result, config, args.trace)
            if recorded is not None:
                _print_recorded(*recorded)
    if args.schedules > 1 and not args.json:
        print(f"{args.schedules - failures} of {args.schedules} schedules held every invariant")
    return 1 if failures else 0


def _write_run(
    root: str,
    seed: int,
    config: SimConfig,
    plan: FaultPlan,
    result: SimResult,
    history: SimHistory,
) -> tuple[str, list[str]]:
    """Write the run folder; returns its path and the problems found when
    reading it back (none for a run that finished)."""
    from history.runs import check_run, write_run

    voters = list(range(1, config.voters + 1))
    observers = [config.voters + i for i in range(1, config.observers + 1)]
    run_config: dict[str, Any] = {
        "backend": "sim",
        "model": "log",
        "nodes": voters + observers,
        "voters": voters,
        "observers": observers,
        "faults": [f.value for f in plan.faults],
        "seed": seed,
        "duration_ms": plan.duration_ms,
        "clock": "virtual",
        "start_unix_ns": None,
        "replay": f"kq sim --seed {seed} --voters {config.voters} "
        f"--observers {config.observers} --duration-ms {plan.duration_ms} --faults "
        + (",".join(f.value for f in plan.faults) or "none"),
    }
    sim = asdict(result)
    del sim["trace"]
    run = write_run(
        root,
        f"sim-seed-{seed}",
        config=run_config,
        ops=history.ops,
        node_logs=history.node_logs(),
        node_changes=history.changes,
        logs={"trace.log": "".join(line + "\n" for line in result.trace)},
        summary={"ok": result.ok, "violation": result.violation, "sim": sim},
    )
    return str(run.path), [str(p) for p in check_run(run.path)]


def _print_recorded(path: str, problems: list[str]) -> None:
    print(f"  history: {path}" + ("" if not problems else f" ({len(problems)} problem(s))"))
    for problem in problems:
        print(f"    {problem}")


def _print_human(result: SimResult, config: SimConfig, trace: bool) -> None:
    if trace or not result.ok:
        for line in result.trace:
            print(line)
    verdict = "every invariant held" if result.ok else f"VIOLATION {result.violation}"
    print(
        f"seed {result.seed}: {config.voters} voters, {config.observers} observers; "
        f"{result.events} events over {result.virtual_ms / 1000:.1f} s virtual; "
        f"{result.elections} elections (max epoch {result.max_epoch}); "
        f"{result.acknowledged}/{result.proposals} proposals committed; "
        f"committed offset {result.committed_offset}; "
        f"{result.messages_sent} messages, {result.messages_dropped} dropped: {verdict}"
    )
    if not result.ok:
        print(
            f"replay with: kq sim --seed {result.seed} --voters {config.voters} "
            f"--observers {config.observers} --trace",
            file=sys.stderr,
        )

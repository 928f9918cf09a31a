"""``kq sim``: run seeded simulations of a quorum and report the invariants.

The README's main command.  Each run is deterministic: the same flags and
seed give the same events, the same trace and the same verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from typing import Any

from quorum.sim.cluster import SimConfig, SimResult
from quorum.sim.schedule import ALL_FAULTS, Fault, FaultPlan, run_schedule

__all__ = ["register"]


def register(subparsers: Any) -> None:
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
    parser.set_defaults(func=run)


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
    config = SimConfig(voters=args.voters, observers=args.observers)
    plan = replace(FaultPlan(), duration_ms=args.duration_ms, faults=args.faults)
    failures = 0
    for seed in range(args.seed, args.seed + args.schedules):
        result = run_schedule(seed, config, plan)
        failures += not result.ok
        if args.json:
            row = asdict(result)
            row["trace"] = list(result.trace) if args.trace or not result.ok else []
            print(json.dumps(row))
        else:
            _print_human(result, config, args.trace)
    if args.schedules > 1 and not args.json:
        print(f"{args.schedules - failures} of {args.schedules} schedules held every invariant")
    return 1 if failures else 0


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

"""``kq sim brokers``: run the seeded simulation of brokers replicating
partitions (:mod:`broker.sim`) and report the invariants.

The same flags and seed give the same events, trace and verdict. With
``--scenario`` it runs one of Kafka's historical bugs (brokers.md §1.12,
and B5, B7, B8 of the bug catalogue, §5.7) as a scripted schedule,
``--broken`` with its rule broken on purpose.
``--bug`` turns on deliberate bugs of :mod:`bugs` in this process for the
random runs (the simulated brokers run the real replica state machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import bugs
from broker.sim import ALL_NEMESES, SimConfig, SimResult, replay_command, run_random
from broker.sim.cluster import SimCluster
from broker.sim.history import QueueHistory
from broker.sim.scenarios import SCENARIOS, run_scenario
from bugs import Bug
from kq.commands.common import probability

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=_bounded("--seed", 0, 2**63), default=1)
    parser.add_argument(
        "--steps",
        type=_bounded("--steps", 1, 10**7),
        default=2_000,
        help="events of the faulty phase (default %(default)s); a healed phase follows",
    )
    parser.add_argument(
        "--schedules",
        type=_bounded("--schedules", 1, 1_000_000),
        default=1,
        help="run this many schedules, seeds SEED, SEED+1, ... (default 1)",
    )
    parser.add_argument("--brokers", type=_bounded("--brokers", 1, 9), default=3)
    parser.add_argument("--partitions", type=_bounded("--partitions", 1, 64), default=2)
    parser.add_argument("--min-isr", type=_bounded("--min-isr", 1, 9), default=2)
    parser.add_argument(
        "--delete-rate",
        type=probability,
        default=0.0,
        help="the chance that a workload step is a DeleteRecords below the consumer's "
        "position (default 0: none, and the seeds' schedules of runs without deletes)",
    )
    parser.add_argument(
        "--bug",
        action="append",
        type=_bug,
        default=[],
        help="break one rule on purpose (repeatable; an id or a name): "
        + ", ".join(f"{b.id} {b.title}" for b in Bug),
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        help="run a scripted scenario (brokers.md §1.12, §5.7) instead of a random schedule",
    )
    parser.add_argument(
        "--broken", action="store_true", help="with --scenario: break the rule it tests"
    )
    parser.add_argument("--trace", action="store_true", help="print every event line of each run")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run")
    parser.add_argument(
        "--history-dir",
        metavar="DIR",
        help="record each random run as a run folder DIR/<time>-sim-brokers-seed-<S>/ "
        "(history.jsonl of send/poll and the faults, config.json, summary.json)",
    )


def _bounded(flag: str, low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} needs an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be in [{low}, {high}], got {value}")
        return value

    return parse


def _bug(text: str) -> Bug:
    try:
        found = bugs.parse([text])
    except bugs.BugSwitchError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if len(found) != 1:
        raise argparse.ArgumentTypeError(f"--bug needs one bug, got {text!r}")
    return next(iter(found))


def run(args: argparse.Namespace) -> int:
    if args.broken and not args.scenario:
        print("kq sim brokers: --broken needs --scenario", file=sys.stderr)
        return 2
    if args.scenario:
        return _run_scenario(args)
    with bugs.injected(*args.bug):
        return _run_random(args)


def _run_random(args: argparse.Namespace) -> int:
    config = replace(
        SimConfig(),
        brokers=args.brokers,
        replication_factor=args.brokers,
        partitions=args.partitions,
        min_insync_replicas=args.min_isr,
        delete_rate=args.delete_rate,
    )
    failures = 0
    for seed in range(args.seed, args.seed + args.schedules):
        recorded: list[QueueHistory] = []
        observe = _recording(recorded) if args.history_dir else None
        result = run_random(seed, args.steps, config, ALL_NEMESES, observe)
        failures += not result.ok
        written: tuple[str, list[str]] | None = None
        if recorded:
            written = _write_run(args.history_dir, config, result, recorded[0])
        if args.json:
            row: dict[str, Any] = asdict(result)
            row["trace"] = list(result.trace) if args.trace or not result.ok else []
            row["replay"] = replay_command(seed, args.steps)
            if written is not None:
                row["history_dir"], row["history_problems"] = written
            print(json.dumps(row))
        else:
            _print_human(result, args.trace)
            if written is not None:
                print(f"  history: {written[0]}" + (f" ({written[1]})" if written[1] else ""))
    if args.schedules > 1 and not args.json:
        print(f"{args.schedules - failures} of {args.schedules} schedules held every invariant")
    return 1 if failures else 0


def _recording(into: list[QueueHistory]) -> Callable[[SimCluster], None]:
    def observe(cluster: SimCluster) -> None:
        into.append(QueueHistory(cluster))

    return observe


def _run_scenario(args: argparse.Namespace) -> int:
    scenario = SCENARIOS[args.scenario]
    run_ = run_scenario(args.scenario, broken=args.broken, seed=args.seed)
    fired = None if run_.violation is None else run_.violation.rule
    # Without the bug nothing may fire; with it, the scenario's invariant must.
    expected = scenario.fires if args.broken else None
    row = {
        "scenario": scenario.name,
        "broken": args.broken,
        "bug": scenario.bug.title if args.broken else None,
        "violation": None if run_.violation is None else str(run_.violation),
        "rule": fired,
        "expected_rule": expected,
        "as_expected": fired == expected,
        "trace": list(run_.cluster.trace) if args.trace else [],
    }
    if args.json:
        print(json.dumps(row))
    else:
        for line in run_.cluster.trace if args.trace else []:
            print(line)
        verdict = "every invariant held" if fired is None else f"VIOLATION {row['violation']}"
        print(
            f"{scenario.name}{' with ' + scenario.bug.title if args.broken else ''}: {verdict}"
            f" ({'as expected' if row['as_expected'] else 'NOT as expected'})"
        )
    return 0 if row["as_expected"] else 1


def _write_run(
    root: str, config: SimConfig, result: SimResult, history: QueueHistory
) -> tuple[str, list[str]]:
    from history.runs import check_run, write_run

    run_config: dict[str, Any] = {
        "backend": "sim-brokers",
        "workload": "queue",
        "nodes": [],
        "brokers": list(range(config.brokers)),
        "partitions": config.partitions,
        "min_insync_replicas": config.min_insync_replicas,
        "delete_rate": config.delete_rate,
        "bugs": sorted(b.title for b in bugs.active()),
        "faults": [n.value for n in ALL_NEMESES],
        "seed": result.seed,
        "steps": result.steps,
        "clock": "virtual",
        "start_unix_ns": None,
        "replay": replay_command(result.seed, result.steps),
    }
    sim = asdict(result)
    del sim["trace"]
    run_dir = write_run(
        root,
        f"sim-brokers-seed-{result.seed}",
        config=run_config,
        ops=history.finish(),
        node_logs={},
        node_changes={},
        logs={"trace.log": "".join(line + "\n" for line in result.trace)},
        summary={"ok": result.ok, "violation": result.violation, "sim": sim},
    )
    return str(run_dir.path), [str(p) for p in check_run(run_dir.path)]


def _print_human(result: SimResult, trace: bool) -> None:
    if trace or not result.ok:
        for line in result.trace if trace else result.trace[-60:]:
            print(line)
    verdict = "every invariant held" if result.ok else f"VIOLATION {result.violation}"
    print(
        f"seed {result.seed}: {result.events} events over {result.virtual_ms / 1000:.1f} s "
        f"virtual; {result.produced} produces, {result.acked_all} acks=all acknowledged, "
        f"{result.consumed} records consumed; {result.elections} elections"
        + (f", unclean in {list(result.unclean_partitions)}" if result.unclean_partitions else "")
        + f"; {result.messages_sent} messages, {result.messages_dropped} dropped: {verdict}"
    )
    if not result.ok:
        print(f"replay with: {replay_command(result.seed, result.steps)}", file=sys.stderr)

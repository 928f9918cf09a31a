"""Simulated events per second of the deterministic simulator.

Runs the same fixed seeds for several cluster shapes and reports events per
second, and, because shared machines are noisy, the ratio to a peer measured
right after each run: the bare event scheduler with 64 self-re-arming no-op
timers (the floor cost of dispatching one event).  The ratio says what fraction of the
bare dispatch rate the full simulation (cores, network, invariants) keeps.

    .venv/bin/python bench/sim_events.py [--schedules N] [--repeat R] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quorum.sim import FaultPlan, SimConfig, run_schedule
from quorum.sim.scheduler import EventScheduler

SHAPES = [(1, 0), (3, 0), (3, 1), (5, 3)]


PEER_EVENTS = 500_000
PEER_TIMERS = 64


def bare_scheduler_rate() -> float:
    """Events per second of the scheduler alone: PEER_TIMERS timers that each
    re-arm themselves after a random delay, doing nothing else (a steady
    queue like the simulator's), for PEER_EVENTS events."""
    import random

    rng = random.Random(0)
    scheduler = EventScheduler()
    remaining = [PEER_EVENTS]

    def fire() -> None:
        remaining[0] -= 1
        if remaining[0] > 0:
            scheduler.after(rng.randint(1, 50), fire)

    for _ in range(PEER_TIMERS):
        scheduler.after(rng.randint(1, 50), fire)
    start = time.perf_counter()
    count = 0
    while remaining[0] > 0 and scheduler.run_next():
        count += 1
    return count / (time.perf_counter() - start)


def simulate(voters: int, observers: int, schedules: int) -> tuple[int, float]:
    events = 0
    start = time.perf_counter()
    for seed in range(schedules):
        result = run_schedule(seed, SimConfig(voters=voters, observers=observers), FaultPlan())
        if not result.ok:
            raise SystemExit(f"seed {seed} failed: {result.violation}")
        events += result.events
    return events, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for voters, observers in SHAPES:
        rates, ratios, total_events = [], [], 0
        for _ in range(args.repeat):
            events, seconds = simulate(voters, observers, args.schedules)
            # The peer runs right after, on the same machine state.
            peer = bare_scheduler_rate()
            rates.append(events / seconds)
            ratios.append((events / seconds) / peer)
            total_events = events
        rows.append(
            {
                "voters": voters,
                "observers": observers,
                "schedules": args.schedules,
                "events_per_run": total_events,
                "events_per_second": round(statistics.median(rates)),
                "ratio_to_bare_scheduler": round(statistics.median(ratios), 4),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| voters | observers | schedules | events | events/s | ratio to bare scheduler |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['voters']} | {r['observers']} | {r['schedules']} | "
                f"{r['events_per_run']} | {r['events_per_second']:,} | "
                f"{r['ratio_to_bare_scheduler']:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

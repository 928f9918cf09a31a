"""kq versus etcd: the same four workloads on a 3-member etcd and a 3-node kq
quorum, both on loopback with fsync, run in turn (see bench/harness.py), in
plaintext and with mutual TLS.

    .venv/bin/python bench/vs_etcd.py [--systems etcd,kq] [--security plaintext,tls]
        [--repeat N] [--quick] [--trials N] [--partition-trials N] [--no-floor]
        [--json] [--out FILE]

Workloads: sequential writes (commits/s, p50/p99 latency); 32 concurrent
writers (commits/s, p50/p99); batched writes of many records per request
(records/s); failover: SIGKILL the leader under load, time from the kill to
the next commit, over 20 trials (3 with --quick), p50/p99; failover by
partition: cut the leader off with iptables (bench/partition.py; skipped,
with the reason, without root, iptables or cgroup v2), time from the cut to
the first commit of a write sent after it to the other members, 20 trials
(3 with --quick).  First, the floor: a bare gRPC echo between two Python
processes (bench/grpc_floor.py).

Security modes: plaintext, and tls (every member and the client present a
certificate of the cluster's CA and verify the other side's; both systems'
certificates are made by kq's server.certs).  A system's modes run back to
back, so TLS/plaintext compares two clusters started minutes apart; a round
runs every system in every mode, and --repeat N runs N rounds (the modes'
order alternating from round to round, so a drift of the machine's load
does not always fall on the same mode).

Prints a table per system and mode, then each round's ratios (kq/etcd for
each mode, TLS/plaintext for each system) and, over the rounds, each
ratio's median and range; --json prints the JSON document instead, --out
also writes it to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import importlib.util
import json
import signal
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import FrameType
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import grpc_floor, harness
from bench.harness import Params, Round, Security, Target

# The systems under test: name -> module defining
#     open_target(workdir: Path, security: Security)
#         -> AbstractAsyncContextManager[Target]
# (see bench/harness.py).  Add a system by adding its module here.
SYSTEMS: dict[str, str] = {
    "etcd": "bench.cluster_etcd",  # Debian's etcd-server, 3 members
    "kq": "bench.cluster_kq",  # kq's gRPC KV service on a 3-node kq quorum
}

OpenTarget = Callable[[Path, Security], AbstractAsyncContextManager[Target]]


class SystemUnavailable(Exception):
    pass


def available(name: str) -> bool:
    return importlib.util.find_spec(SYSTEMS[name]) is not None


def load_system(name: str) -> OpenTarget:
    if name not in SYSTEMS:
        raise SystemUnavailable(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
    module_name = SYSTEMS[name]
    if not available(name):
        path = module_name.replace(".", "/") + ".py"
        raise SystemUnavailable(f"{name} target not available yet: {path} does not exist")
    module = importlib.import_module(module_name)
    open_target = getattr(module, "open_target", None)
    if open_target is None:
        raise SystemUnavailable(f"{module_name} defines no open_target(workdir, security)")
    return cast(OpenTarget, open_target)


def log(message: str) -> None:
    print(f"vs_etcd: {message}", file=sys.stderr, flush=True)


async def run_system(
    name: str, open_target: OpenTarget, security: Security, p: Params
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"kq-bench-{name}-") as tmp:
        probe = harness.fsync_probe(Path(tmp))
        log(f"{name}: starting a 3-member cluster ({security.value})")
        async with open_target(Path(tmp), security) as target:
            result = await harness.run_all(target, p, log)
        return {**result, "security": security.value, "fsync_probe": probe}


def round_order(securities: list[Security], round_index: int) -> list[Security]:
    """The modes' order in round ``round_index`` (from 0): as given, then
    reversed, alternately."""
    return list(securities) if round_index % 2 == 0 else list(reversed(securities))


def run_round(
    openers: dict[str, OpenTarget],
    securities: list[Security],
    p: Params,
    round_index: int,
    show: Callable[[str], None] | None,
) -> Round:
    """Every system in every mode, a system's modes back to back."""
    results: Round = {}
    for name, open_target in openers.items():
        for security in round_order(securities, round_index):
            result = asyncio.run(run_system(name, open_target, security, p))
            results.setdefault(name, {})[security.value] = result
            if show is not None:
                show(harness.format_table(name, result, security))
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated, run in this order (default: every available one of "
        + ",".join(SYSTEMS)
        + ")",
    )
    parser.add_argument(
        "--security",
        default="plaintext,tls",
        help="comma-separated modes, each system runs them back to back: plaintext, tls "
        "(mutual TLS between members and with the client); default plaintext,tls",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of every system in every mode (default 1)"
    )
    parser.add_argument("--quick", action="store_true", help="short runs, 3 failover trials")
    parser.add_argument("--json", action="store_true", help="print the JSON document only")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    parser.add_argument("--trials", type=int, help="failover trials (default 20; 3 with --quick)")
    parser.add_argument(
        "--partition-trials",
        type=int,
        help="failover-by-partition trials (default 20; 3 with --quick; 0: none)",
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the gRPC echo floor measured first"
    )
    return parser.parse_args(argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Unwind (so every cluster is stopped by pid) on SIGTERM too.
    raise SystemExit(128 + signum)


def show(text: str) -> None:
    print(text, flush=True)


def format_floor(floor: dict[str, Any]) -> str:
    lines = ["== floor: gRPC echo between two Python processes (100-byte messages)"]
    for kind, label in (("stream", "one stream"), ("unary", "unary calls")):
        r = floor[kind]
        lines.append(
            f"   {label:<12} {r['round_trips_per_s']:>8,.0f} round trips/s   "
            f"p50 {r['p50_ms']:.3f} ms   p99 {r['p99_ms']:.3f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.systems is None:
        names = [n for n in SYSTEMS if available(n)]
        for missing in (n for n in SYSTEMS if n not in names):
            log(f"{missing} target not available yet; running {', '.join(names)}")
    else:
        names = [n.strip() for n in args.systems.split(",") if n.strip()]
    try:
        securities = harness.parse_securities(args.security)
    except ValueError as exc:
        print(f"vs_etcd: --security: {exc}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"vs_etcd: --repeat must be at least 1, got {args.repeat}", file=sys.stderr)
        return 2
    try:
        openers = {name: load_system(name) for name in names}
    except SystemUnavailable as exc:
        print(f"vs_etcd: {exc}", file=sys.stderr)
        return 2

    p = harness.quick_params() if args.quick else harness.full_params()
    if args.trials is not None:
        p = dataclasses.replace(p, failover_trials=args.trials)
    if args.partition_trials is not None:
        p = dataclasses.replace(p, partition_trials=args.partition_trials)
    signal.signal(signal.SIGTERM, _terminate)

    # The floor on this machine, in the same run: a bare gRPC echo between
    # two Python processes (bench/grpc_floor.py).
    floor = None
    if not args.no_floor:
        log("floor: gRPC echo between two Python processes")
        floor = grpc_floor.measure()
        if not args.json:
            show(format_floor(floor))

    rounds: list[Round] = []
    for i in range(args.repeat):
        log(f"round {i + 1}/{args.repeat}")
        results = run_round(openers, securities, p, i, None if args.json else show)
        rounds.append(results)
        if not args.json:
            show(harness.format_round_ratios(harness.round_ratios(results)))

    doc = harness.result_document(rounds, p, "quick" if args.quick else "full", securities)
    if floor is not None:
        doc["floor"] = floor
    if args.json:
        print(json.dumps(doc, indent=2))
    elif args.repeat > 1:
        show(harness.format_ranges(doc["ratio_ranges"]))
    if args.out is not None:
        harness.write_json(doc, args.out)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

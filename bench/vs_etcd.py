"""kq versus etcd: the same four workloads on a 3-member etcd and a 3-node kq
quorum, both on loopback with fsync, run in turn (see bench/harness.py).

    .venv/bin/python bench/vs_etcd.py [--systems etcd,kq] [--quick] [--json] [--out FILE]

Workloads: sequential writes (commits/s, p50/p99 latency); 32 concurrent
writers (commits/s, p50/p99); batched writes of many records per request
(records/s); failover: SIGKILL the leader under load, time from the kill to
the next commit, over 20 trials (3 with --quick), p50/p99.

Prints a table per system and, when both ran, the kq/etcd ratios; --json
prints the JSON document instead, --out also writes it to FILE.
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

from bench import harness
from bench.harness import Params, Target

# The systems under test: name -> module defining
#     open_target(workdir: Path) -> AbstractAsyncContextManager[Target]
# (see bench/harness.py).  Add a system by adding its module here.
SYSTEMS: dict[str, str] = {
    "etcd": "bench.cluster_etcd",  # Debian's etcd-server, 3 members
    "kq": "bench.cluster_kq",  # kq's gRPC KV service on a 3-node kq quorum
}

OpenTarget = Callable[[Path], AbstractAsyncContextManager[Target]]


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
        raise SystemUnavailable(f"{module_name} defines no open_target(workdir)")
    return cast(OpenTarget, open_target)


def log(message: str) -> None:
    print(f"vs_etcd: {message}", file=sys.stderr, flush=True)


async def run_system(name: str, open_target: OpenTarget, p: Params) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"kq-bench-{name}-") as tmp:
        probe = harness.fsync_probe(Path(tmp))
        log(f"{name}: starting a 3-member cluster")
        async with open_target(Path(tmp)) as target:
            result = await harness.run_all(target, p, log)
        return {**result, "fsync_probe": probe}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated, run in this order (default: every available one of "
        + ",".join(SYSTEMS)
        + ")",
    )
    parser.add_argument("--quick", action="store_true", help="short runs, 3 failover trials")
    parser.add_argument("--json", action="store_true", help="print the JSON document only")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    parser.add_argument("--trials", type=int, help="failover trials (default 20; 3 with --quick)")
    return parser.parse_args(argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Unwind (so every cluster is stopped by pid) on SIGTERM too.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.systems is None:
        names = [n for n in SYSTEMS if available(n)]
        for missing in (n for n in SYSTEMS if n not in names):
            log(f"{missing} target not available yet; running {', '.join(names)}")
    else:
        names = [n.strip() for n in args.systems.split(",") if n.strip()]
    try:
        openers = {name: load_system(name) for name in names}
    except SystemUnavailable as exc:
        print(f"vs_etcd: {exc}", file=sys.stderr)
        return 2

    p = harness.quick_params() if args.quick else harness.full_params()
    if args.trials is not None:
        p = dataclasses.replace(p, failover_trials=args.trials)
    signal.signal(signal.SIGTERM, _terminate)

    results: dict[str, dict[str, Any]] = {}
    for name, open_target in openers.items():
        results[name] = asyncio.run(run_system(name, open_target, p))
        if not args.json:
            print(harness.format_table(name, results[name]), flush=True)

    doc = harness.result_document(results, p, "quick" if args.quick else "full")
    if args.json:
        print(json.dumps(doc, indent=2))
    elif "ratios_kq_over_etcd" in doc:
        print(harness.format_ratios(doc["ratios_kq_over_etcd"]))
    if args.out is not None:
        harness.write_json(doc, args.out)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

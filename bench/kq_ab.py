"""A/B of kq settings given by environment variables: the sequential and
32-writer workloads of bench/harness.py on a fresh 3-node kq cluster per
run, the variants alternating (A, B, A, B, ...) so that a drift of the
machine's load falls on both.  For measuring one change of the hot path
at a time (KQ_FETCH_STREAM, KQ_UVLOOP; CLIENT_IN_FLIGHT=N, the key-value
client's requests in flight, for its batching) on a machine shared with
others.

    .venv/bin/python bench/kq_ab.py --a KQ_FETCH_STREAM=0 --b KQ_FETCH_STREAM=1 [--rounds 3]
        [--seq-writes 1000] [--seconds 3] [--security plaintext]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness
from bench.cluster_kq import open_target
from bench.harness import Security
from kvstore.client import MAX_REQUESTS_IN_FLIGHT


def parse_env(text: str) -> dict[str, str]:
    """``NAME=VALUE[,NAME=VALUE...]`` (empty: no variable)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise ValueError(f"expected NAME=VALUE, got {part!r}")
        out[name] = value
    return out


# Pseudo-variable of the client in this process, not of the nodes: the key-
# value client's requests in flight (kvstore.client.MAX_REQUESTS_IN_FLIGHT;
# 32 or more: no batching for the 32 writers).
CLIENT_IN_FLIGHT = "CLIENT_IN_FLIGHT"


async def one_run(env: dict[str, str], security: Security, p: harness.Params) -> dict[str, Any]:
    env = dict(env)
    in_flight = env.pop(CLIENT_IN_FLIGHT, None)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory(prefix="kq-ab-") as tmp:
            async with open_target(
                Path(tmp),
                security,
                max_requests_in_flight=(
                    MAX_REQUESTS_IN_FLIGHT if in_flight is None else int(in_flight)
                ),
            ) as target:
                seq = await harness.sequential(target, p)
                conc = await harness.concurrent(target, p)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {
        "seq_per_s": seq["commits_per_s"],
        "seq_p50_ms": seq["p50_ms"],
        "conc_per_s": conc["commits_per_s"],
        "conc_p50_ms": conc["p50_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--a", default="", help="variant A's environment, NAME=VALUE,...")
    parser.add_argument("--b", default="", help="variant B's environment, NAME=VALUE,...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-writes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--security", default="plaintext")
    args = parser.parse_args(argv)
    try:
        variants = {"A": parse_env(args.a), "B": parse_env(args.b)}
        (security,) = harness.parse_securities(args.security)
    except ValueError as exc:
        print(f"kq_ab: {exc}", file=sys.stderr)
        return 2
    p = dataclasses.replace(
        harness.quick_params(),
        seq_writes=args.seq_writes,
        conc_duration_s=args.seconds,
    )
    results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        for name in order:
            got = asyncio.run(one_run(variants[name], security, p))
            results[name].append(got)
            print(f"round {r + 1} {name} {variants[name]}: {got}", flush=True)
    for name in ("A", "B"):
        runs = results[name]
        summary = {k: round(statistics.median(x[k] for x in runs), 2) for k in runs[0]}
        print(f"{name} {variants[name]} median: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

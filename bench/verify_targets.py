"""The targets of ``kq verify`` on this machine: each history generated with a
seed, then the whole command timed cold (a new process: Spark's start
included) and, with ``--warm``, the same job on an already running session.

Targets (histories of ``bench/verify_histories.py``, without node exports: the
figures are the linearizability checker's, as a compiled single-machine
checker that reads only the history would give them):

* ``small``: 100 register histories of 300 operations (3 keys, 3 processes
  per key, seeds 100 to 199) in one command;
* ``100k``: 100,000 operations over 1,000 keys, 3 processes per key (seed 1);
* ``1m``: 1,000,000 operations over 10,000 keys, 3 processes per key (seed 1);
* ``20-per-key``: 100,000 operations over 1,000 keys, 20 processes per key;
* ``kv-50``: a key-value history, 50 clients over 5 keys, 20,000 operations,
  1% of writes and cas timing out (``info``).

Each row: the command's wall time, its verdict (every target is
linearizable, so anything but ``valid`` is reported as a failure), the
undecided keys, the states the searches explored, the slowest key and the
peak resident memory of the command's processes (Python and the JVM).

    .venv/bin/python bench/verify_targets.py [TARGET ...] [--warm] [--cache DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.verify_histories import Sizes, write_register_run

__all__ = ["TARGETS", "Target", "cold", "history_of", "main", "tree_rss_kib"]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    what: str
    runs: int
    sizes: Sizes
    cold_s: float
    """The issue's target for the cold command."""


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "small",
            "100 register histories of 300 ops",
            100,
            Sizes(ops=300, keys=3, per_key=3, seed=100, nodes=0),
            12.0,
        ),
        Target(
            "100k",
            "100,000 ops, 1,000 keys, 3 processes per key",
            1,
            Sizes(ops=100_000, keys=1_000, per_key=3, seed=1, nodes=0),
            12.0,
        ),
        Target(
            "1m",
            "1,000,000 ops, 10,000 keys, 3 processes per key",
            1,
            Sizes(ops=1_000_000, keys=10_000, per_key=3, seed=1, nodes=0),
            30.0,
        ),
        Target(
            "20-per-key",
            "100,000 ops, 1,000 keys, 20 processes per key",
            1,
            Sizes(ops=100_000, keys=1_000, per_key=20, seed=1, nodes=0),
            60.0,
        ),
        Target(
            "kv-50",
            "key-value, 50 clients over 5 keys, 20,000 ops, 1% info",
            1,
            Sizes(ops=20_000, keys=5, seed=1, info_rate=0.01, nodes=0, clients=50),
            60.0,
        ),
    )
}


def history_of(cache: Path, target: Target) -> Path:
    """The target's history (a run folder, or a folder of runs), generated once."""
    s = target.sizes
    folder = cache / f"target-{target.name}"
    done = folder / ".complete"
    if done.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if target.runs == 1:
        write_register_run(cache, s, name=folder.name)
    else:
        for i in range(target.runs):
            write_register_run(folder, replace(s, seed=s.seed + i), name=f"r{i:03d}")
    done.write_text("")
    return folder


def tree_rss_kib(root: int) -> int:
    """The resident memory of ``root`` and its descendants, in KiB (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def cold(paths: list[Path], out: Path, where: list[str]) -> dict[str, Any]:
    """The whole ``kq verify`` command in a new process: its time, verdict and peak memory.

    ``where``: ``["--master", MASTER]`` or ``["--remote", "sc://HOST:PORT"]``."""
    kq = Path(sys.executable).parent / "kq"
    command = [str(kq), "verify", *map(str, paths), *where, "--no-report"]
    command += ["--out", str(out), "--json"]
    peak = [0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss_kib(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - t0
    sampler.join()
    try:
        verdict = json.loads(stdout)
    except ValueError:
        raise AssertionError(
            f"{' '.join(command)}: exit {proc.returncode}, no verdict: {stderr[-2000:]}"
        ) from None
    return {"seconds": seconds, "verdict": verdict, "peak_rss_mib": peak[0] // 1024}


def summarize(target: Target, seconds: float, verdict: dict[str, Any]) -> dict[str, Any]:
    lin = verdict["checks"]["linearizable"]["detail"]
    return {
        "target": target.name,
        "what": target.what,
        "runs": len(verdict["runs"]),
        "ops": sum(int(r["ops"]) for r in verdict["runs"]),
        "verdict": verdict["verdict"],
        "unknown_keys": lin.get("unknown", 0),
        "states": lin.get("states", 0),
        "slowest_key_ms": round(float(lin.get("slowest_key_ms", 0.0)), 1),
        "seconds": round(seconds, 2),
        "target_s": target.cold_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=", ".join(TARGETS))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--warm", action="store_true", help="also time each job warm")
    parser.add_argument(
        "--remote", metavar="sc://HOST:PORT", help="time through this Spark Connect server"
    )
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "kq-verify")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    args.cache.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    chosen = [TARGETS[t] for t in args.targets or TARGETS]
    for target in chosen:
        paths = [history_of(args.cache, target)]
        where = ["--remote", args.remote] if args.remote else ["--master", args.master]
        done = cold(paths, args.cache / "out", where)
        row = summarize(target, done["seconds"], done["verdict"])
        row["mode"] = "remote" if args.remote else "cold"
        row["peak_rss_mib"] = done["peak_rss_mib"]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if args.warm:
        rows += warm_rows(chosen, args.cache, args.master)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
    failed = [r["target"] for r in rows if r["verdict"] != "valid"]
    if failed:
        print(f"not verified valid: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def warm_rows(targets: list[Target], cache: Path, master: str) -> list[dict[str, Any]]:
    """Each target's job on one session, the second time (the first warms the workers)."""
    from spark_verify.job import VerifyOptions, verify
    from spark_verify.session import spark_session

    spark = spark_session(master)
    rows = []
    try:
        for target in targets:
            paths = [history_of(cache, target)]
            opts = VerifyOptions(out=cache / "out-warm", report=False)
            verify(spark, paths, opts)
            t0 = time.perf_counter()
            result = verify(spark, paths, opts)
            row = summarize(target, time.perf_counter() - t0, dict(result.verdict))
            row["mode"] = "warm"
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        spark.stop()
    return rows


if __name__ == "__main__":
    sys.exit(main())

"""Spark verification benchmarks: operations verified per second, and how the
time grows with the history's size and with concurrency per key.

Histories are linearizable register histories from a real sequential
execution (``bench/verify_histories.py``), 100 operations per key, three
nodes' committed logs.  Every figure is measured on one Spark session of the
given master (``local[2]`` by default), after a warm-up job, and has a peer in
the same run, on the same session: **Spark reading the same history with its
own JSON reader** (``spark.read.json(...).count()``), the floor cost of
touching the data.  ``ratio`` is *our time / the peer's time*.

* ``size``: the whole verification (``spark_verify.job.verify``, no report)
  of histories of 100,000, 1,000,000 (and with ``--big``, 10,000,000)
  operations over 1,000, 10,000 (100,000) keys;
* ``concurrency``: 100,000 operations over 1,000 keys with 2, 5, 10 and 20
  client processes per key (the linearizability search's hard part);
* ``logs``: the node-export checks alone (``spark_verify.logs.check_exports``)
  on the 1,000,000-operation run's three logs, against reading those logs;
* ``small``: where Spark's start-up and per-job costs dominate: one
  1,000-operation register history, and 100 histories of 300 operations
  (3 keys, 3 processes per key) in one verification, without node exports;
  each warm (on this session, with the number of Spark jobs it ran) and
  cold (the whole ``kq verify`` command, Spark's start included).

    .venv/bin/python bench/verify_bench.py [SECTION ...] [--master local[2]] [--big] [--json]
    .venv/bin/python bench/verify_bench.py size --cache /tmp/kq-verify-bench

Generated histories are kept in ``--cache`` (default: a folder under the
system's temporary directory) and reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.verify_histories import Sizes, write_register_run
from spark_verify.job import VerifyOptions, verify
from spark_verify.load import find_runs, load_history, load_node_exports
from spark_verify.logs import check_exports
from spark_verify.pairing import pair_ops
from spark_verify.session import spark_session

SECTIONS = ("size", "concurrency", "logs", "small")


def run_of(cache: Path, ops: int, keys: int, per_key: int) -> Path:
    name = f"register-{ops}-{keys}-{per_key}"
    run = cache / name
    if not (run / "config.json").is_file():
        t0 = time.monotonic()
        write_register_run(cache, Sizes(ops=ops, keys=keys, per_key=per_key, seed=1), name=name)
        print(f"  generated {name} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return run


def timed(f: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def measure(spark: Any, run: Path, out: Path) -> dict[str, Any]:
    """Verify ``run``; and the peer: Spark's JSON reader over the same file."""
    history = str(run / "history.jsonl")
    peer = timed(lambda: spark.read.json(history).count())
    result: dict[str, Any] = {}

    def go() -> None:
        result["v"] = verify(spark, [run], VerifyOptions(out=out, report=False))

    ours = timed(go)
    verdict = result["v"].verdict
    if verdict["valid"] is not True:
        raise AssertionError(f"{run.name}: a linearizable history verified {verdict['valid']}")
    ops = verdict["runs"][0]["ops"]
    lin = verdict["checks"]["linearizable"]["detail"]
    return {
        "ops": ops,
        "keys": verdict["runs"][0]["keys"],
        "seconds": round(ours, 2),
        "ops_per_s": round(ops / ours),
        "peer_read_s": round(peer, 2),
        "ratio": round(ours / peer, 2),
        "states": lin["states"],
        "slowest_key_ms": round(lin["slowest_key_ms"], 1),
    }


def section_size(spark: Any, cache: Path, big: bool) -> list[dict[str, Any]]:
    sizes = [(100_000, 1_000), (1_000_000, 10_000)] + ([(10_000_000, 100_000)] if big else [])
    rows = []
    for ops, keys in sizes:
        row = measure(spark, run_of(cache, ops, keys, 3), cache / "out")
        rows.append({"section": "size", "per_key": 3, **row})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def section_concurrency(spark: Any, cache: Path) -> list[dict[str, Any]]:
    rows = []
    for per_key in (2, 5, 10, 20):
        row = measure(spark, run_of(cache, 100_000, 1_000, per_key), cache / "out")
        rows.append({"section": "concurrency", "per_key": per_key, **row})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def section_logs(spark: Any, cache: Path) -> list[dict[str, Any]]:
    run = run_of(cache, 1_000_000, 10_000, 3)
    runs = find_runs([run])
    logs = [str(p / "log.jsonl") for p in runs[0].nodes.values()]
    peer = timed(lambda: spark.read.json(logs).count())
    ops = pair_ops(load_history(spark, runs)).ops.cache()
    ops.count()
    log, changes = load_node_exports(spark, runs)
    lines = log.count()
    results: list[Any] = []
    models = {runs[0].name: "register"}
    ours = timed(lambda: results.extend(check_exports(ops, log, changes, models)))
    failed = [r.name for r in results if r.valid is not True]
    if failed:
        raise AssertionError(f"log checks of a clean run failed: {failed}")
    row = {
        "section": "logs",
        "log_lines": lines,
        "ops": 1_000_000,
        "seconds": round(ours, 2),
        "lines_per_s": round(lines / ours),
        "peer_read_s": round(peer, 2),
        "ratio": round(ours / peer, 2),
    }
    print(json.dumps(row), file=sys.stderr)
    return [row]


def small_runs(cache: Path, count: int, ops: int, keys: int) -> Path:
    """``count`` register runs of ``ops`` operations without node exports, in one folder."""
    folder = cache / f"small-{count}x{ops}-{keys}"
    if not (folder / f"r{count - 1:03d}" / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            sizes = Sizes(ops=ops, keys=keys, per_key=3, seed=100 + i, nodes=0)
            write_register_run(folder, sizes, name=f"r{i:03d}")
    return folder


def jobs_and_seconds(spark: Any, paths: list[Path], out: Path) -> tuple[int, float, Any]:
    """One warm verification (no report): the Spark jobs it ran, its time, its verdict."""
    sc = spark.sparkContext
    group = f"bench-{time.monotonic_ns()}"
    sc.setJobGroup(group, "kq verify bench")
    result: dict[str, Any] = {}

    def go() -> None:
        result["v"] = verify(spark, paths, VerifyOptions(out=out, report=False))

    seconds = timed(go)
    sc.setJobGroup("", "")
    jobs = len(sc.statusTracker().getJobIdsForGroup(group))
    return jobs, seconds, result["v"].verdict


def cold_seconds(master: str, paths: list[Path], out: Path) -> float:
    """The whole ``kq verify`` command in a new process: Spark's start included."""
    kq = Path(sys.executable).parent / "kq"
    command = [str(kq), "verify", *map(str, paths), "--master", master, "--no-report"]
    t0 = time.perf_counter()
    done = subprocess.run([*command, "--out", str(out), "--json"], capture_output=True, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)}: exit {done.returncode}: {done.stderr[-2000:]!r}"
        )
    return seconds


def section_small(spark: Any, cache: Path, master: str) -> list[dict[str, Any]]:
    one = run_of_small(cache)
    many = small_runs(cache, 100, 300, 3)
    rows = []
    for name, paths in (("1 run of 1,000 ops", [one]), ("100 runs of 300 ops", [many])):
        # The first verification on a session also starts its Python workers.
        jobs_and_seconds(spark, paths, cache / "out")
        jobs, warm, verdict = jobs_and_seconds(spark, paths, cache / "out")
        if verdict["verdict"] != "valid":
            raise AssertionError(f"{name}: linearizable histories verified {verdict['verdict']}")
        cold = cold_seconds(master, paths, cache / "out-cold")
        row = {
            "section": "small",
            "what": name,
            "runs": len(verdict["runs"]),
            "ops": sum(r["ops"] for r in verdict["runs"]),
            "warm_s": round(warm, 2),
            "spark_jobs": jobs,
            "cold_s": round(cold, 2),
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def run_of_small(cache: Path) -> Path:
    run = cache / "register-1000-10-3-noexports"
    if not (run / "config.json").is_file():
        sizes = Sizes(ops=1_000, keys=10, per_key=3, seed=1, nodes=0)
        write_register_run(cache, sizes, name=run.name)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=", ".join(SECTIONS))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--big", action="store_true", help="also the 10,000,000-op history")
    default_cache = Path(tempfile.gettempdir()) / "kq-verify-bench"
    parser.add_argument("--cache", type=Path, default=default_cache)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    args.cache.mkdir(parents=True, exist_ok=True)
    spark = spark_session(args.master)
    spark.range(1000).count()  # warm up the JVM and the Python workers
    rows: list[dict[str, Any]] = []
    for section in args.sections or SECTIONS:
        if section == "size":
            rows += section_size(spark, args.cache, args.big)
        elif section == "concurrency":
            rows += section_concurrency(spark, args.cache)
        elif section == "small":
            rows += section_small(spark, args.cache, args.master)
        else:
            rows += section_logs(spark, args.cache)
    spark.stop()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print("  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

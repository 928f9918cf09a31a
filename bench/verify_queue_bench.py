"""Spark verification of a queue history against a register history of the same size.

The catalogue of injected bugs (``kq chaos catalogue``) verifies every run
with Spark, so the time ``kq verify`` takes on a queue run decides how many
runs a catalogue can afford.  Its peer, in the same run on the same Spark
session: the verification of a register history of about as many
operations, also with node exports (three nodes' committed logs).  Machines
are noisy, so the figure is the **ratio** queue time / register time of
each round (the two verifications alternate), with the median over rounds.

Histories are generated (seeded), or recorded run folders are given:

* queue (``write_queue_run``): a correct queue run as the ``queue`` workload
  writes it (``docs/history-format.md``): processes that assign the keys,
  send one to three records each to keys (topic-partitions) and poll what
  the log holds past their position; the final polls (every key read from
  the beginning, ``summary.json``'s ``final_polls.from_index``); the three
  brokers' partition exports (records, state, timeline) and the
  controllers' partition changes;
* register: ``bench/verify_histories.py`` with three nodes' logs.

Each verification is the whole job with its HTML report (``kq verify``'s
default: the report draws the queue run's per-partition plots), and the
Spark jobs it ran are counted.

    .venv/bin/python bench/verify_queue_bench.py [--ops 1200] [--rounds 3] [--json]
    .venv/bin/python bench/verify_queue_bench.py --queue-run RUN --register-run RUN
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.verify_histories import Sizes, write_register_run
from spark_verify.job import VerifyOptions, verify
from spark_verify.session import spark_session

BROKERS = (4, 5, 6)
CONTROLLERS = (1, 2, 3)
TICK_NS = 250_000_000


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def write_queue_run(out: Path, ops: int, keys: int = 4, processes: int = 5, seed: int = 1) -> Path:
    """A run folder ``out/queue-<ops>-<keys>-<seed>``: a correct queue run of
    about ``ops`` client operations over ``keys`` partitions of one topic."""
    rng = random.Random(seed)
    run = out / f"queue-{ops}-{keys}-{seed}"
    run.mkdir(parents=True, exist_ok=True)
    logs: list[list[int]] = [[] for _ in range(keys)]  # values per partition, by offset
    position: dict[tuple[int, int], int] = {}
    lines: list[str] = []
    t = 1_000_000
    value = 0

    def op(process: int, f: str, invoke: Any, done: Any) -> None:
        nonlocal t
        index = len(lines)
        lines.append(
            _line(
                {
                    "index": index,
                    "time": t,
                    "type": "invoke",
                    "process": process,
                    "f": f,
                    "value": invoke,
                }
            )
        )
        t += rng.randrange(200_000, 5_000_000)
        lines.append(
            _line(
                {
                    "index": index + 1,
                    "time": t,
                    "type": "ok",
                    "process": process,
                    "f": f,
                    "value": done,
                }
            )
        )
        t += rng.randrange(10_000, 1_000_000)

    def poll(process: int, limit: int) -> None:
        got: dict[str, list[list[int]]] = {}
        for k in range(keys):
            start = position.get((process, k), 0)
            records = [[o, logs[k][o]] for o in range(start, min(len(logs[k]), start + limit))]
            if records:
                got[str(k)] = records
                position[(process, k)] = records[-1][0] + 1
        op(process, "poll", [["poll"]], [["poll", got]])

    everything = {"keys": list(range(keys)), "seek_to_beginning": False}
    for p in range(processes):
        op(p, "assign", everything, everything)
    while len(lines) // 2 < ops:
        p = rng.randrange(processes)
        if rng.random() < 0.55:
            sent = []
            for _ in range(rng.randint(1, 3)):
                k = rng.randrange(keys)
                logs[k].append(value)
                sent.append((k, len(logs[k]) - 1, value))
                value += 1
            op(
                p,
                "send",
                [["send", k, v] for k, _, v in sent],
                [["send", k, [o, v]] for k, o, v in sent],
            )
        else:
            poll(p, rng.randint(1, 8))
    final_from = len(lines)
    final = processes
    op(final, "assign", {**everything, "seek_to_beginning": True}, everything)
    while any(position.get((final, k), 0) < len(logs[k]) for k in range(keys)):
        poll(final, 50)
    (run / "history.jsonl").write_text("".join(lines))

    # The brokers' exports: every broker holds every record (a clean run),
    # the first broker of each partition's turn leads it, the HW follows
    # the sends a tick at a time.
    end = t
    for n in BROKERS:
        node = run / "nodes" / str(n)
        node.mkdir(parents=True, exist_ok=True)
        with (node / "partitions.jsonl").open("w") as f:
            for k, values in enumerate(logs):
                for o, v in enumerate(values):
                    digest = hashlib.sha256(str(v).encode()).hexdigest()
                    f.write(
                        _line(
                            {
                                "node": n,
                                "topic": "queue",
                                "partition": k,
                                "offset": o,
                                "epoch": 0,
                                "producer_id": 0,
                                "sequence": o,
                                "control": False,
                                "hash": digest,
                            }
                        )
                    )
        with (node / "partition_state.jsonl").open("w") as f:
            for k, values in enumerate(logs):
                f.write(
                    _line(
                        {
                            "node": n,
                            "topic": "queue",
                            "partition": k,
                            "high_watermark": len(values),
                            "log_end_offset": len(values),
                            "stopped_at": None,
                        }
                    )
                )
        with (node / "partition_timeline.jsonl").open("w") as f:
            seq = 0
            ticks = max(1, end // TICK_NS)
            for i in range(ticks + 1):
                for k, values in enumerate(logs):
                    seq += 1
                    hw = len(values) * i // ticks
                    leader = BROKERS[k % len(BROKERS)]
                    f.write(
                        _line(
                            {
                                "node": n,
                                "seq": seq,
                                "life": 0,
                                "time": i * TICK_NS,
                                "topic": "queue",
                                "partition": k,
                                "event": "state",
                                "leader_epoch": 0,
                                "role": "leader" if leader == n else "follower",
                                "leader": leader,
                                "high_watermark": hw,
                                "log_end_offset": hw,
                                "log_start_offset": 0,
                                "isr": list(BROKERS),
                                "truncated_from": None,
                                "truncated_to": None,
                            }
                        )
                    )
    for n in CONTROLLERS:
        node = run / "nodes" / str(n)
        node.mkdir(parents=True, exist_ok=True)
        (node / "partition_changes.jsonl").write_text(
            "".join(
                _line(
                    {
                        "node": n,
                        "offset": 10 + k,
                        "epoch": 1,
                        "topic": "queue",
                        "partition": k,
                        "leader": BROKERS[k % len(BROKERS)],
                        "leader_epoch": 0,
                        "partition_epoch": 0,
                        "isr": list(BROKERS),
                        "elr": [],
                        "leader_recovery_state": "recovered",
                        "unclean": False,
                    }
                )
                for k in range(keys)
            )
        )
    config = {
        "format": 1,
        "name": run.name,
        "backend": "synthetic",
        "model": "queue",
        "workload": "queue",
        "nodes": list(CONTROLLERS),
        "brokers": list(BROKERS),
        "faults": [],
        "start_unix_ns": None,
        "seed": seed,
        "queue": {"brokers": len(BROKERS), "topics": [{"name": "queue", "partitions": keys}]},
    }
    (run / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    polls = {"from_index": final_from, "complete": True, "keys": keys}
    summary = {"format": 1, "workload": "queue", "completed": True, "final_polls": polls}
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return run


def _client_ops(run: Path) -> int:
    with (run / "history.jsonl").open() as f:
        return sum(1 for line in f if '"type":"invoke"' in line and '"nemesis"' not in line)


def _verify(spark: Any, run: Path, out: Path) -> dict[str, Any]:
    tracker = spark.sparkContext.statusTracker()
    before = len(tracker.getJobIdsForGroup())
    t0 = time.perf_counter()
    v = verify(spark, [run], VerifyOptions(out=out))
    elapsed = time.perf_counter() - t0
    return {
        "time_s": round(elapsed, 2),
        "jobs": len(tracker.getJobIdsForGroup()) - before,
        "verdict": v.verdict["verdict"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1200, help="client operations of each history")
    ap.add_argument("--rounds", type=int, default=3, help="queue and register verifications each")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--queue-run", type=Path, help="a recorded queue run folder instead")
    ap.add_argument("--register-run", type=Path, help="a recorded register run folder instead")
    ap.add_argument("--cache", type=Path, help="where generated runs are written")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.ops < 10 or args.rounds < 1:
        ap.error("--ops must be at least 10 and --rounds at least 1")
    work = Path(tempfile.mkdtemp(prefix="kq-verify-queue-bench-"))
    cache = args.cache or work
    queue_run = args.queue_run or write_queue_run(cache, args.ops)
    register_run = args.register_run
    if register_run is None:
        # bench/verify_histories.py counts invokes; 100 ops per key as its other benches.
        keys = max(1, args.ops // 100)
        name = f"register-{args.ops}-{keys}"
        register_run = cache / name
        if not (register_run / "config.json").is_file():
            write_register_run(cache, Sizes(ops=args.ops, keys=keys, per_key=3, seed=1), name=name)
    spark = spark_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    rounds: list[dict[str, Any]] = []
    try:
        # Warm-up: the Python workers and the JVM's first compilations.
        _verify(spark, register_run, work / "warm")
        for i in range(args.rounds):
            pair = {}
            order = ("queue", "register") if i % 2 == 0 else ("register", "queue")
            for which in order:
                run = queue_run if which == "queue" else register_run
                pair[which] = _verify(spark, run, work / f"{which}-{i}")
            pair["ratio"] = round(pair["queue"]["time_s"] / pair["register"]["time_s"], 2)
            rounds.append(pair)
            if not args.json:
                print(
                    f"round {i + 1}: queue {pair['queue']['time_s']:.1f} s "
                    f"({pair['queue']['jobs']} jobs, {pair['queue']['verdict']}), register "
                    f"{pair['register']['time_s']:.1f} s ({pair['register']['jobs']} jobs, "
                    f"{pair['register']['verdict']}), ratio {pair['ratio']:.2f}",
                    flush=True,
                )
    finally:
        spark.stop()
    result = {
        "queue_run": str(queue_run),
        "queue_ops": _client_ops(queue_run),
        "register_run": str(register_run),
        "register_ops": _client_ops(register_run),
        "master": args.master,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"queue {result['queue_ops']:,} ops vs register {result['register_ops']:,} ops: "
            f"median ratio {result['median_ratio']:.2f} over {len(rounds)} round(s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Transactions in the Spark job's queue checks (spark_verify.queue): on
crafted histories (each new check firing, and quiet on a correct one) and on
random transactional histories, under both isolation levels and on a
compacted topic, the job finds exactly the anomalies of the reference
(history.queue_checks), and ``kq verify`` allows what the reference allows."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from history.ops import Op
from history.queue_checks import Cleanup, check_queue
from spark_verify.job import VerifyOptions, verify
from spark_verify.load import find_runs, load_history
from spark_verify.pairing import pair_ops
from spark_verify.queue import cleanup_of, isolation_of, queue_anomaly_rows
from tests.history.queue_histories import Queue, SimLog

pytestmark = pytest.mark.spark

RC = "read_committed"
RU = "read_uncommitted"


def write_run(root: Path, name: str, ops: list[Op], queue: dict[str, Any]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {"format": 1, "name": name, "nodes": [], "model": "queue", "queue": queue}
    (run / "config.json").write_text(json.dumps(config))
    (run / "history.jsonl").write_text("".join(op.to_line() + "\n" for op in ops))
    return run


def planted() -> Queue:
    """Each check only transactions raise, a key (or two) each."""
    q = Queue()
    # precommitted-read (key a).
    q.txn(0, [("send", "a", 1, 0), ("poll", {"a": [(0, 1)]})])
    # G0 (keys b, c).
    q.txn(1, [("send", "b", 10, 0), ("send", "c", 13, 1)])
    q.txn(2, [("send", "b", 11, 1), ("send", "c", 12, 0)])
    # G1c (keys d, e).
    q.txn(3, [("send", "d", 20, 0), ("poll", {"e": [(0, 21)]})])
    q.txn(4, [("send", "e", 21, 0), ("poll", {"d": [(0, 20)]})])
    # G1c-ww (keys f, g).
    q.txn(5, [("send", "f", 30, 0), ("poll", {"g": [(0, 32)]})])
    q.txn(6, [("send", "f", 31, 1), ("send", "g", 32, 0)])
    # G1a of an aborted transaction (key h).
    q.txn(7, [("send", "h", 40, None)], "fail")
    q.poll(8, {"h": [(0, 40)]})
    # torn-transaction and no-loss (keys i, j).
    q.txn(9, [("send", "i", 50, 0), ("send", "j", 51, 0), ("send", "j", 52, 1)])
    q.heal()
    q.crash(11)
    keys = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
    q.assign(14, keys, seek=True)
    q.poll(
        14,
        {
            "a": [(0, 1)],
            "b": [(0, 10), (1, 11)],
            "c": [(0, 12), (1, 13)],
            "d": [(0, 20)],
            "e": [(0, 21)],
            "f": [(0, 30), (1, 31)],
            "g": [(0, 32)],
            "i": [(0, 50)],
            "j": [(1, 52)],
        },
    )
    return q


def random_txns(seed: int) -> list[Op]:
    """A random, mostly wrong, transactional history: sends and txns to
    three keys at offsets that mostly ascend, polls (in polls and txns)
    returning random stretches of what was sent (whatever its outcome, its
    own txn's included), final reads of a random part of each key."""
    rnd = random.Random(seed)
    q = Queue()
    keys = ["0", "1", "2"]
    log: dict[str, list[tuple[int, int]]] = {k: [] for k in keys}
    nxt = dict.fromkeys(keys, 0)
    value = iter(range(1, 10_000))

    holes: dict[str, list[int]] = {k: [] for k in keys}

    def send(k: str) -> tuple[str, int, int]:
        if holes[k] and rnd.random() < 0.4:
            # A later record at a lower offset: write order against time.
            o = holes[k].pop(rnd.randrange(len(holes[k])))
        else:
            if rnd.random() < 0.3:
                holes[k].append(nxt[k])
                nxt[k] += 1
            o = nxt[k]
            if rnd.random() < 0.05:
                o = max(0, o - 1)  # now and then an offset reused
            nxt[k] = o + 1
        v = next(value)
        log[k].append((o, v))
        return k, v, o

    def poll() -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for k in keys:
            if log[k] and rnd.random() < 0.6:
                start = rnd.randrange(len(log[k]))
                got = sorted(set(log[k][start : start + rnd.randrange(1, 4)]))
                out[k] = [r for i, r in enumerate(got) if i == 0 or r[0] > got[i - 1][0]]
        return out

    procs = list(range(4))
    for _ in range(45):
        w = rnd.randrange(4)
        p = procs[w]
        r = rnd.random()
        outcome = rnd.choice(["ok", "ok", "ok", "info", "fail"])
        if r < 0.55:
            mops: list[tuple[Any, ...]] = []
            for _ in range(rnd.randrange(1, 5)):
                if rnd.random() < 0.6:
                    k, v, o = send(rnd.choice(keys))
                    mops.append(("send", k, v, o if rnd.random() < 0.9 else None))
                else:
                    mops.append(("poll", poll()))
            q.txn(p, mops, outcome, acked=outcome == "info" and rnd.random() < 0.7)
        elif r < 0.75:
            k, v, o = send(rnd.choice(keys))
            q.send(p, [(k, v, o)], outcome, acked=outcome == "info" and rnd.random() < 0.5)
        else:
            q.poll(p, poll(), "ok" if rnd.random() < 0.9 else "fail")
            continue
        if outcome == "info":
            procs[w] += 4  # an info retires its process
    q.heal()
    q.crash(98)
    q.assign(99, keys, seek=True)
    final: dict[str, list[tuple[int, int]]] = {}
    for k in keys:
        rs = sorted(set(log[k]))
        kept = [r for i, r in enumerate(rs) if (i == 0 or r[0] > rs[i - 1][0])]
        final[k] = [r for r in kept if rnd.random() < 0.85]
    q.poll(99, final)
    return q.ops


def simulated(seed: int) -> list[Op]:
    rnd = random.Random(seed)
    sim = SimLog()
    for _ in range(30):
        w = rnd.randrange(3)
        if rnd.random() < 0.6:
            plan = [
                ("send", rnd.choice(sim.keys))
                if rnd.random() < 0.6
                else ("poll", {k: rnd.randrange(4) for k in sim.keys})
                for _ in range(rnd.randrange(1, 4))
            ]
            sim.step_txn(w, plan, rnd.choice(["ok", "ok", "info", "fail"]), rnd.random() < 0.5)
        else:
            sim.step_poll(w, {k: rnd.randrange(4) for k in sim.keys})
    sim.final_reads()
    return sim.q.ops


def test_spark_finds_what_the_reference_finds_in_transactions(
    spark: SparkSession, tmp_path: Path
) -> None:
    compact = {"cleanup_policy": "compact", "record_keys": 3}
    cases: dict[str, tuple[list[Op], dict[str, Any]]] = {
        "planted-rc": (planted().ops, {"isolation_level": RC}),
        "planted-ru": (planted().ops, {}),
        "clean-rc": (simulated(1), {"isolation_level": RC}),
        **{f"random-{s}-rc": (random_txns(s), {"isolation_level": RC}) for s in range(2)},
        "random-2-ru": (random_txns(2), {"isolation_level": RU}),
        "random-compacted": (random_txns(7), {"isolation_level": RC, **compact}),
    }
    folders = {n: write_run(tmp_path, n, ops, queue) for n, (ops, queue) in cases.items()}
    runs = find_runs(list(folders.values()))
    history = load_history(spark, runs)
    paired = pair_ops(history)
    cleanup = {n: c for n, f in folders.items() if (c := cleanup_of(f)) is not None}
    isolation = {n: isolation_of(f) for n, f in folders.items()}
    rows = queue_anomaly_rows(paired.ops, history, cleanup=cleanup, isolation=isolation).where(
        "check != ''"
    )
    got: dict[str, set[tuple[Any, ...]]] = {n: set() for n in cases}
    for r in rows.collect():
        got[r.run].add(
            (r.check, r.key, "[" + ",".join(r["values"]) + "]", tuple(r.offsets), tuple(r.ops))
        )
    for name, (ops, queue) in cases.items():
        config = {"queue": queue}
        result = check_queue(
            ops,
            cleanup=Cleanup.of_run(config, {}),
            isolation=queue.get("isolation_level", RU),
        )
        want = {a.ident() for a in result.all()}
        assert got[name] == want, (name, sorted(got[name] - want), sorted(want - got[name]))
        fired = {w[0] for w in want}
        if name == "planted-rc":
            assert {
                "precommitted-read",
                "G0",
                "G1c",
                "G1c-ww",
                "G1a",
                "torn-transaction",
                "no-loss",
            } <= fired
        if name == "planted-ru":
            assert "G1a" not in fired and "torn-transaction" not in fired
        if name == "clean-rc":
            assert want == set()
    # The random histories reach the new checks.
    every = {w[0] for name in cases if name.startswith("random") for w in got[name]}
    assert {"precommitted-read", "G1c-ww", "torn-transaction", "G1a"} <= every, every


def test_kq_verify_allows_what_the_isolation_allows(spark: SparkSession, tmp_path: Path) -> None:
    rc = write_run(tmp_path, "rc", planted().ops, {"isolation_level": RC})
    ru = write_run(tmp_path, "ru", planted().ops, {})
    done = verify(spark, [rc, ru], VerifyOptions(out=tmp_path / "out", report=False))
    runs = {r["name"]: r for r in done.verdict["runs"]}
    assert {"precommitted-read", "G1c", "torn-transaction", "G1a"} <= set(runs["rc"]["failed"])
    assert not {"G0", "G1c-ww"} & set(runs["rc"]["failed"])
    assert not {"precommitted-read", "G1c", "G0", "G1c-ww", "torn-transaction", "G1a"} & set(
        runs["ru"]["failed"]
    )
    checks = done.verdict["checks"]
    assert checks["G0"]["valid"] is True and checks["G0"]["detail"]["allowed"] == {"rc": 1, "ru": 1}
    assert checks["precommitted-read"]["detail"]["allowed"] == {"ru": 1}
    assert checks["G1c"]["detail"]["by_run"] == {"rc": 1}
    [g1c] = checks["G1c"]["anomalies"]
    assert [e["type"] for e in g1c["witness"][0]["values"]] == ["wr", "wr"]

"""The queue checks as a Spark job (spark_verify.queue) find exactly the
anomalies of the reference (history.queue_checks) on the same histories,
valid and planted, and ``kq verify`` gives a queue run one verdict."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from history.ops import Op
from history.queue_checks import check_queue
from spark_verify.job import VerifyOptions, verify
from spark_verify.load import find_runs, load_history
from spark_verify.pairing import pair_ops
from spark_verify.queue import check_queue_runs, queue_anomaly_rows
from tests.history.queue_histories import Queue, SimLog

pytestmark = pytest.mark.spark

K = "0"


def write_run(root: Path, name: str, ops: list[Op]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {"format": 1, "name": name, "nodes": [], "model": "queue"}
    (run / "config.json").write_text(json.dumps(config))
    (run / "history.jsonl").write_text("".join(op.to_line() + "\n" for op in ops))
    return run


def planted() -> Queue:
    """One history with an anomaly of every check, a key for each."""
    q = Queue()
    for v, o in ((1, 0), (2, 1), (3, 2), (4, 3)):
        q.send(0, [(K, v, o)])
    q.poll(4, {K: [(0, 1)]})
    q.poll(4, {K: [(2, 3)]})  # poll-skip (2)
    q.poll(4, {K: [(1, 2)]})  # nonmonotonic-poll
    q.assign(4, [K], seek=True)
    q.poll(4, {K: [(0, 1)]})  # back to the beginning: not nonmonotonic
    q.poll(5, {K: [(0, 1), (2, 3), (1, 2)]})  # int-poll-skip, int-nonmonotonic-poll
    q.send(1, [("a", 10, 0)])
    q.send(1, [("a", 11, 0)])  # inconsistent-offsets
    q.send(1, [("b", 20, 0)])
    q.poll(6, {"b": [(0, 20), (1, 20)]})  # duplicate
    q.send(2, [("c", 30, None)], "fail")
    q.poll(6, {"c": [(0, 30)]})  # G1a
    q.send(3, [("d", 41, 1)])
    q.send(3, [("d", 40, 0)])  # nonmonotonic-send
    q.send(3, [("d", 43, 3), ("d", 42, 2)])  # int-nonmonotonic-send
    q.poll(7, {"d": [(0, 40), (1, 41), (2, 42), (3, 43)]})
    q.send(3, [("e", 50, 0), ("e", 52, 2)])  # int-send-skip (allowed)
    q.send(9, [("e", 51, 1)])
    q.poll(7, {"e": [(0, 50)]})
    q.poll(10, {"e": [(2, 52)]})  # lost-write and unseen of 51
    q.send(15, [("f", 60, 0), ("f", 61, None)], "info", acked=True)  # no-loss of 60 only
    q.heal()
    final = {"a": [(0, 10)], "b": [(0, 20)], "d": [(o, 40 + o) for o in range(4)]}
    q.crash(11)
    q.assign(14, [K, "a", "b", "d", "e", "f"], seek=True)
    # no-loss: key 0 offset 2 missing; key e offset 1 holds another value.
    q.poll(14, {K: [(0, 1), (1, 2), (3, 4)], **final, "e": [(0, 50), (1, 99), (2, 52)]})
    return q


def simulated(seed: int, mutate: str | None) -> list[Op]:
    import random

    rnd = random.Random(seed)
    sim = SimLog()
    for _ in range(40):
        w = rnd.randrange(3)
        r = rnd.random()
        if r < 0.5:
            sim.step_send(
                w,
                rnd.choice(sim.keys),
                rnd.choice(["ok", "ok", "info", "fail"]),
                rnd.random() < 0.5,
            )
        elif r < 0.95:
            sim.step_poll(w, {k: rnd.randrange(4) for k in sim.keys})
        else:
            sim.step_crash(w)
    sim.final_reads()
    ops = list(sim.q.ops)
    if mutate == "offset":
        i = max(
            i
            for i, op in enumerate(ops)
            if op.f == "send" and op.type == "ok" and op.value[0][2][0] > 0
        )
        _, k, (o, v) = ops[i].value[0]
        ops[i] = dataclasses.replace(ops[i], value=[["send", k, [o - 1, v]]])
    return ops


def reference_idents(ops: list[Op]) -> set[tuple[Any, ...]]:
    return {a.ident() for a in check_queue(ops).all()}


def spark_idents(spark: SparkSession, run: Path) -> set[tuple[Any, ...]]:
    runs = find_runs([run])
    history = load_history(spark, runs)
    paired = pair_ops(history)
    rows = queue_anomaly_rows(paired.ops, history).where("check != ''").collect()
    return {
        (r.check, r.key, "[" + ",".join(r["values"]) + "]", tuple(r.offsets), tuple(r.ops))
        for r in rows
    }


def test_spark_finds_what_the_reference_finds(spark: SparkSession, tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()
    [body] = re.findall(r"<!-- example: history queue -->\n```jsonl\n(.*?)```", doc, re.DOTALL)
    example = [Op.from_json(json.loads(line)) for line in body.splitlines()]
    # The format's integer keys, and a final poll that misses value 2 (sent ok).
    missed = [*example[:-1], dataclasses.replace(example[-1], value=[["poll", {"0": [[0, 1]]}]])]
    cases = {
        "example": example,
        "example-missed": missed,
        "planted": planted().ops,
        "clean": simulated(1, None),
        "renumbered": simulated(2, "offset"),
    }
    expected_planted = {
        "inconsistent-offsets",
        "duplicate",
        "G1a",
        "lost-write",
        "unseen",
        "poll-skip",
        "nonmonotonic-poll",
        "int-poll-skip",
        "int-nonmonotonic-poll",
        "nonmonotonic-send",
        "int-send-skip",
        "int-nonmonotonic-send",
        "no-loss",
    }
    for name, ops in cases.items():
        want = reference_idents(ops)
        got = spark_idents(spark, write_run(tmp_path, name, ops))
        assert got == want, (name, sorted(got - want), sorted(want - got))
        if name == "planted":
            assert {w[0] for w in want} == expected_planted
        if name in ("clean", "example"):
            assert want == set()
        if name == "example-missed":
            assert {w[0] for w in want} == {"no-loss"}
        if name == "renumbered":
            assert "inconsistent-offsets" in {w[0] for w in want}


def _named_keys(ops: list[Op]) -> set[str]:
    keys: set[str] = set()
    for op in ops:
        for mop in op.value if isinstance(op.value, list) else ():
            if mop[0] == "send":
                keys.add(mop[1])
            elif mop[0] == "poll" and len(mop) > 1 and isinstance(mop[1], dict):
                keys.update(mop[1])
    return keys


def test_kq_verify_gives_a_queue_run_one_verdict(spark: SparkSession, tmp_path: Path) -> None:
    clean = write_run(tmp_path, "clean", simulated(3, None))
    bad = write_run(tmp_path, "bad", planted().ops)
    done = verify(spark, [clean, bad], VerifyOptions(out=tmp_path / "out"))
    runs = {r["name"]: r for r in done.verdict["runs"]}
    assert runs["clean"]["verdict"] == "valid", runs["clean"]
    assert runs["bad"]["verdict"] == "invalid"
    # A queue run's keys are the topic-partitions its sends and polls name.
    assert runs["bad"]["keys"] == len(_named_keys(planted().ops)) > 1
    assert runs["clean"]["keys"] == len(_named_keys(simulated(3, None))) > 0
    assert "no-loss" in runs["bad"]["failed"] and "G1a" in runs["bad"]["failed"]
    assert "int-send-skip" not in runs["bad"]["failed"]  # allowed
    checks = done.verdict["checks"]
    assert checks["int-send-skip"]["valid"] is True
    assert checks["int-send-skip"]["detail"]["allowed"] == {"bad": 1}
    assert done.report_path is not None and "no-loss" in done.report_path.read_text()


def test_check_queue_runs_without_final_reads_is_unknown(
    spark: SparkSession, tmp_path: Path
) -> None:
    q = Queue()
    q.send(0, [(K, 1, 0)])
    q.poll(1, {K: [(0, 1)]})
    q.heal()
    runs = find_runs([write_run(tmp_path, "nofinal", q.ops)])
    history = load_history(spark, runs)
    results = {c.name: c for c in check_queue_runs(pair_ops(history).ops, history)}
    assert results["no-loss"].valid == "unknown"
    assert results["no-loss"].detail["undecided"] == ["nofinal"]
    assert all(c.valid is True for n, c in results.items() if n != "no-loss")


def _cached_rdds(spark: SparkSession) -> int:
    return int(spark.sparkContext._jsc.getPersistentRDDs().size())


def test_a_verification_frees_what_it_cached_also_when_it_fails(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session kept warm across runs (kq chaos catalogue) must not keep a
    failed verification's history, ops and queue records."""
    run = write_run(tmp_path, "bad", planted().ops)
    before = _cached_rdds(spark)
    verify(spark, [run], VerifyOptions(out=tmp_path / "ok", report=False))
    assert _cached_rdds(spark) == before

    def boom(*args: Any, **kwargs: Any) -> Any:
        # After the history, the ops and the queue records are cached.
        assert _cached_rdds(spark) > before
        raise RuntimeError("a check failed")

    monkeypatch.setattr("spark_verify.job.check_partition_runs", boom)
    with pytest.raises(RuntimeError, match="a check failed"):
        verify(spark, [run], VerifyOptions(out=tmp_path / "failed", report=False))
    assert _cached_rdds(spark) == before


def test_the_catalogue_verifies_clean_runs_together_each_with_its_verdict(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``kq chaos catalogue --verify-clean-together``: one job over the clean
    runs; each run's outcome read from its own row."""
    from chaos.catalogue import fired_checks, run_view
    from kq.commands.chaos import SparkVerifier

    clean = write_run(tmp_path, "clean", simulated(3, None))
    bad = write_run(tmp_path, "bad", planted().ops)
    verifier = SparkVerifier()  # finds the session already running
    verdict = verifier.together([clean, bad])
    assert sorted(tmp_path.glob("verify-clean-*/verdict.json")) != []
    assert fired_checks(run_view(verdict, clean), None) == ()
    assert run_view(verdict, clean)["verdict"] == "valid"
    fired = fired_checks(run_view(verdict, bad), None)
    assert {"no-loss", "G1a"} <= set(fired) and "int-send-skip" not in fired
    assert run_view(verdict, tmp_path / "elsewhere")["missing"] is True

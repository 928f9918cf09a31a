"""Runs verified together keep their own verdicts when one of them has more
anomalies of a check than the verdict lists (``MAX_ANOMALIES``): the cap
shortens that run's listing only, and the other runs' verdicts come from
their own counts, not from whether the listing happened to name them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_verify.job import VerifyOptions, verify
from spark_verify.load import find_runs, load_history
from spark_verify.pairing import pair_ops
from spark_verify.queue import check_queue_runs
from spark_verify.verdict import MAX_ANOMALIES
from tests.history.queue_histories import Queue
from tests.spark_verify.test_queue import write_run

pytestmark = pytest.mark.spark

K = "0"


def aborted_reads(n: int) -> Queue:
    """``n`` records of a failed send, all read by one ok poll (``n`` G1a),
    then final reads that find the one acknowledged record (the failed
    send's records gone again)."""
    q = Queue()
    q.send(0, [(K, 0, 0)])
    q.send(1, [(K, v, None) for v in range(1, n + 1)], "fail")
    q.poll(2, {K: [(v, v) for v in range(n + 1)]})
    q.heal()
    q.crash(2)
    q.assign(5, [K], seek=True)
    q.poll(5, {K: [(0, 0)]})
    return q


def clean() -> Queue:
    q = Queue()
    q.send(0, [(K, 0, 0)])
    q.poll(1, {K: [(0, 0)]})
    q.heal()
    q.crash(1)
    q.assign(4, [K], seek=True)
    q.poll(4, {K: [(0, 0)]})
    return q


def test_a_run_past_the_cap_leaves_the_others_their_own_verdicts(
    spark: SparkSession, tmp_path: Path
) -> None:
    many = MAX_ANOMALIES + 20
    # "a-many" sorts first, so the listing's first anomalies are all its own.
    folders = [
        write_run(tmp_path, "a-many", aborted_reads(many).ops),
        write_run(tmp_path, "b-one", aborted_reads(1).ops),
        write_run(tmp_path, "c-clean", clean().ops),
    ]
    done = verify(spark, folders, VerifyOptions(out=tmp_path / "out", report=False))
    verdicts = {r["name"]: r for r in done.verdict["runs"]}
    assert verdicts["a-many"]["verdict"] == "invalid"
    assert verdicts["a-many"]["failed"] == ["G1a"]
    assert verdicts["b-one"]["verdict"] == "invalid"
    assert verdicts["b-one"]["failed"] == ["G1a"]
    assert verdicts["c-clean"]["verdict"] == "valid", verdicts["c-clean"]

    runs = find_runs(folders)
    history = load_history(spark, runs)
    results = {c.name: c for c in check_queue_runs(pair_ops(history).ops, history)}
    g1a = results["G1a"]
    assert g1a.count == many + 1
    assert g1a.detail["by_run"] == {"a-many": many, "b-one": 1}
    # The listing is capped, and still names the run with one.
    assert len(g1a.anomalies) == MAX_ANOMALIES
    assert {a.run for a in g1a.anomalies} == {"a-many", "b-one"}

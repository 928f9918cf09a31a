"""The consumer-group checks (spark_verify.groups): each fires on a minimal
history that breaks its rule, with the key, offsets, ops and processes
named, and stays quiet on the legal variants (rebalances, crashes, info and
failed commits, commits that complete after an assignment took effect)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from history.ops import Op
from spark_verify.groups import GROUP_CHECKS, group_anomaly_rows
from spark_verify.load import find_runs, history_problems, load_history
from spark_verify.pairing import pair_ops
from spark_verify.queue import QUEUE_CHECKS, check_queue_runs
from tests.history.queue_histories import Queue

pytestmark = pytest.mark.spark

K = "0"


def write_run(root: Path, name: str, ops: list[Op]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {"format": 1, "name": name, "nodes": [], "model": "queue"}
    (run / "config.json").write_text(json.dumps(config))
    (run / "history.jsonl").write_text("".join(op.to_line() + "\n" for op in ops))
    return run


def subscribed(*processes: int) -> Queue:
    q = Queue()
    for p in processes:
        q.assign(p, [K], f="subscribe")
    return q


Found = tuple[str, str, tuple[int, ...], tuple[int, ...], str]


def histories() -> tuple[dict[str, list[Op]], dict[str, set[Found]]]:
    """Each run's ops and the anomalies it must raise (none for the legal ones)."""
    ops: dict[str, list[Op]] = {}
    want: dict[str, set[Found]] = {}

    # commit-lost: process 1 is given key 0 at 3 after commit 5 completed.
    q = subscribed(0, 1)
    c = q.commit(0, {K: 5})
    p = q.poll(1, {K: [(3, 30)]}, assigned={K: (3, q.now)})
    ops["lost"] = q.ops
    want["lost"] = {("commit-lost", K, (3, 5), (c, p), "0,1")}

    # reassign-skip past a commit: given 7 when commits stored at most 5.
    q = subscribed(0, 1)
    q.commit(0, {K: 2})
    c = q.commit(0, {K: 5})
    p = q.poll(1, {K: [(7, 70)]}, assigned={K: (7, q.now)})
    ops["skip"] = q.ops
    want["skip"] = {("reassign-skip", K, (7, 5), (c, p), "0,1")}

    # reassign-skip with no commit: given 2 of a log that starts at 0; a
    # failed commit (refused, never stored) does not count.
    q = subscribed(1)
    q.commit(1, {K: 2}, "fail", error="stale-member-epoch")
    p = q.poll(1, {K: [(2, 20)]}, assigned={K: (2, q.now)})
    ops["skip-from-start"] = q.ops
    want["skip-from-start"] = {("reassign-skip", K, (2, 0), (p,), "1")}

    # commit-backwards: commit 3 invoked after commit 5 completed.
    q = subscribed(0, 1)
    c1 = q.commit(0, {K: 5})
    c2 = q.commit(1, {K: 3})
    ops["backwards"] = q.ops
    want["backwards"] = {("commit-backwards", K, (5, 3), (c1, c2), "0,1")}

    # Legal: commits move forward, a rebalance hands key 0 over at the last
    # ok commit (its old owner then crashes), an info commit (maybe stored)
    # moves it further.
    q = subscribed(0, 1)
    q.poll(0, {K: [(0, 1), (1, 2)]}, assigned={K: (0, q.now)})
    q.commit(0, {K: 2})
    q.commit(0, {K: 4})
    q.poll(0, {}, revoked=[0])
    q.crash(0)
    q.poll(1, {K: [(4, 5)]}, assigned={K: (4, q.now)})
    # An info commit retires process 1; the next owner starts where it may
    # have left the key.
    q.commit(1, {K: 6}, "info")
    q.assign(3, [K], f="subscribe")
    q.poll(3, {K: [(6, 7)]}, assigned={K: (6, q.now)})
    # Info and failed commits of lower offsets are not a group going back.
    q.commit(3, {K: 1}, "fail", error="fenced-member-epoch")
    q.commit(3, {K: 7})
    ops["clean"] = q.ops
    want["clean"] = set()

    # Legal: a commit invoked before the assignment took effect but completed
    # after it; the assignment may start at the earlier ok commit (the fetch
    # came first) or at the new one (it was stored in time).
    q = subscribed(0, 1, 2)
    q.commit(0, {K: 3})
    q.rec.invoke(0, "commit", value=[["commit", {K: 5}]])
    q.poll(1, {K: [(3, 30)]}, assigned={K: (3, q.now)})
    q.poll(2, {K: [(5, 50)]}, assigned={K: (5, q.now)})
    q.rec.ok(0)
    ops["late-commit"] = q.ops
    want["late-commit"] = set()

    # Legal: an assignment at the instant a commit completes does not yet
    # see it; overlapping ok commits of two members may land in either order.
    q = subscribed(0, 1, 2)
    q.rec.invoke(0, "commit", value=[["commit", {K: 5}]])
    q.rec.invoke(1, "commit", value=[["commit", {K: 3}]])
    q.rec.ok(1)
    q.rec.ok(0)
    # Commit 5 completed at q.now - 1: the assignment then starts at 3.
    q.poll(2, {K: [(3, 30)]}, assigned={K: (3, q.now - 1)})
    ops["same-instant"] = q.ops
    want["same-instant"] = set()

    # Retention: no commit, the assignment starts at the key's log start
    # (judged with the run's log start; without it, a skip from 0).
    q = subscribed(1)
    q.poll(1, {K: [(4, 40)]}, assigned={K: (4, q.now)})
    ops["retention"] = q.ops
    want["retention"] = set()

    # The format's example of a group (a rebalance, fail and info commits).
    doc = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()
    pattern = r"<!-- groups example: history queue -->\n```jsonl\n(.*?)```"
    [body] = re.findall(pattern, doc, re.DOTALL)
    ops["doc-example"] = [Op.from_json(json.loads(line)) for line in body.splitlines()]
    want["doc-example"] = set()
    return ops, want


def _frames(spark: SparkSession, root: Path, ops: dict[str, list[Op]]) -> tuple[DataFrame, ...]:
    runs = find_runs([write_run(root, name, o) for name, o in ops.items()])
    history = load_history(spark, runs)
    return pair_ops(history).ops, history


def found(rows: list[Any]) -> dict[str, set[Found]]:
    out: dict[str, set[Found]] = {}
    for r in rows:
        out.setdefault(r.run, set()).add((r.check, r.key, tuple(r.offsets), tuple(r.ops), r.extra))
    return out


def test_each_group_check_fires_on_its_rule_and_only_there(
    spark: SparkSession, tmp_path: Path
) -> None:
    ops, want = histories()
    paired, history = _frames(spark, tmp_path, ops)
    # The group fields are the format's: no unknown-field problem.
    assert history_problems(history).count() == 0
    got = found(group_anomaly_rows(paired, history, {"retention": {K: 4}}).collect())
    for name, expected in want.items():
        assert got.get(name, set()) == expected, name
    # The log start is what makes the retention run legal.
    bare = found(group_anomaly_rows(paired.where("run = 'retention'"), history).collect())
    assert bare == {"retention": {("reassign-skip", K, (4, 0), (2,), "1")}}


def test_group_checks_in_the_queue_verdict(spark: SparkSession, tmp_path: Path) -> None:
    ops, _ = histories()
    picked = {n: ops[n] for n in ("lost", "backwards", "clean")}
    runs = [write_run(tmp_path, name, o) for name, o in picked.items()]
    history = load_history(spark, find_runs(runs))
    results = {
        c.name: c
        for c in check_queue_runs(
            pair_ops(history).ops, history, subscribed=dict.fromkeys(picked, True)
        )
    }
    assert set(GROUP_CHECKS) <= set(QUEUE_CHECKS) and set(GROUP_CHECKS) <= set(results)
    lost = results["commit-lost"]
    assert lost.valid is False and lost.detail["by_run"] == {"lost": 1}
    [a] = lost.anomalies
    assert a.witness[0]["processes"] == ["0", "1"] and a.witness[0]["offsets"] == [3, 5]
    assert "below offset 5" in a.message and "2 record(s) read again" in a.message
    back = results["commit-backwards"]
    assert back.detail["by_run"] == {"backwards": 1}
    assert results["reassign-skip"].valid is True

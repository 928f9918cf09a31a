"""The Spark queue checks on topics with retention or compaction find
exactly the reference's anomalies (history.queue_checks with its Cleanup)
on the same histories: the records legitimately gone exempted, the others
(missing above the log start, the latest of a record key, a kept record at
another offset) still caught; a run folder's config.json and summary.json
say which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from history.ops import Op
from history.queue_checks import NO_CLEANUP, Cleanup, check_queue
from spark_verify.load import find_runs, load_history
from spark_verify.pairing import pair_ops
from spark_verify.queue import check_queue_runs, cleanup_of, queue_anomaly_rows
from tests.history.queue_histories import Queue
from tests.history.test_queue_cleanup import compacted, retained

pytestmark = pytest.mark.spark

K = "0"


def write_run(
    root: Path, name: str, ops: list[Op], queue: dict[str, Any], log_start: dict[str, int]
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    config = {"format": 1, "name": name, "nodes": [], "model": "queue", "queue": queue}
    (run / "config.json").write_text(json.dumps(config))
    summary = {"format": 1, "final_polls": {"log_start": log_start}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "history.jsonl").write_text("".join(op.to_line() + "\n" for op in ops))
    return run


def missing_above_start() -> Queue:
    q = Queue()
    for v in range(1, 6):
        q.send(0, [(K, v, v - 1)])
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(3, 4)]})
    q.heal()
    q.assign(9, [K], seek=True)
    q.poll(9, {K: [(3, 4)]})
    return q


def skip_over_latest() -> Queue:
    q = Queue()
    for v in range(1, 5):
        q.send(0, [(K, v, v - 1)])
    q.poll(1, {K: [(0, 1)]})
    q.poll(1, {K: [(3, 4)]})
    q.heal()
    q.assign(9, [K], seek=True)
    q.poll(9, {K: [(2, 3), (3, 4)]})
    return q


RETAIN = {"cleanup_policy": "delete", "retention_ms": 1000}
COMPACT = {"cleanup_policy": "compact", "record_keys": 2}

CASES: dict[str, tuple[Queue, dict[str, Any], dict[str, int]]] = {
    "retained": (retained(), RETAIN, {K: 3}),
    "retained-plain": (retained(), {}, {K: 3}),
    "retained-low-start": (retained(), RETAIN, {K: 2}),
    "missing-above-start": (missing_above_start(), RETAIN, {K: 3}),
    "compacted": (compacted([(2, 3), (3, 4)]), COMPACT, {}),
    "compacted-plain": (compacted([(2, 3), (3, 4)]), {}, {}),
    "compacted-one-key": (compacted([(3, 4)]), {**COMPACT, "record_keys": 0}, {}),
    "latest-missing": (compacted([(3, 4)]), COMPACT, {}),
    "renumbered": (compacted([(0, 3), (1, 4)]), COMPACT, {}),
    "skip-over-latest": (skip_over_latest(), COMPACT, {}),
    "compact-and-delete": (
        retained(),
        {"cleanup_policy": "compact,delete", "retention_bytes": 0, "record_keys": 5},
        {K: 3},
    ),
}


def test_spark_finds_what_the_reference_finds_with_cleanup(
    spark: SparkSession, tmp_path: Path
) -> None:
    folders = {}
    want: set[tuple[Any, ...]] = set()
    for name, (q, queue, log_start) in CASES.items():
        folder = write_run(tmp_path, name, q.ops, queue, log_start)
        folders[name] = folder
        config = json.loads((folder / "config.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
        cleanup = Cleanup.of_run(config, summary)
        assert (cleanup == NO_CLEANUP) is (cleanup_of(folder) is None)
        if cleanup != NO_CLEANUP:
            assert cleanup_of(folder) == (dict(cleanup.log_start), cleanup.record_keys)
        want |= {(name, *a.ident()) for a in check_queue(q.ops, cleanup=cleanup).all()}
    runs = find_runs(list(folders.values()))
    history = load_history(spark, runs)
    paired = pair_ops(history)
    cleanup_by_run = {n: c for n, f in folders.items() if (c := cleanup_of(f)) is not None}
    rows = queue_anomaly_rows(paired.ops, history, None, cleanup_by_run)
    got = {
        (r.run, r.check, r.key, "[" + ",".join(r["values"]) + "]", tuple(r.offsets), tuple(r.ops))
        for r in rows.where("check != ''").collect()
    }
    assert got == want, (sorted(got - want), sorted(want - got))
    fired = {name: {w[1] for w in want if w[0] == name} for name in CASES}
    assert fired["retained"] == fired["compacted"] == fired["compacted-one-key"] == set()
    assert fired["compact-and-delete"] == set()
    assert {"lost-write", "unseen", "poll-skip", "no-loss"} <= fired["retained-plain"]
    assert {"lost-write", "unseen", "poll-skip", "no-loss"} <= fired["compacted-plain"]
    assert {"poll-skip", "no-loss"} <= fired["retained-low-start"]
    assert {"no-loss"} <= fired["missing-above-start"] and "no-loss" in fired["latest-missing"]
    assert {"inconsistent-offsets", "duplicate", "no-loss"} <= fired["renumbered"]
    assert fired["skip-over-latest"] == {"poll-skip"}
    # The job reads each run's cleanup from its folder.
    results = {c.name: c for c in check_queue_runs(paired.ops, history, folders)}
    assert results["no-loss"].detail["runs"] == len(CASES)
    failed_runs = {a.run for a in results["no-loss"].anomalies}
    assert "retained" not in failed_runs and "missing-above-start" in failed_runs

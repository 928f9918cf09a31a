"""spark_verify.timeline: buckets, counts, latency quantiles and faults of a hand-made history."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_verify.timeline import BucketStats, FaultInterval, RunTimeline, Timeline, timeline

PAIRED = (
    "run string, key string, process string, f string, type string, index long, "
    "complete_index long, call long, ret long, value string, result string, error string, "
    "node long, offset long, epoch long"
)
NEMESIS = "run string, f string, kind string, nodes string, start long, end long, value string"

S = 1_000_000_000  # ns per second
MS = 1_000_000  # ns per millisecond


def op(run: str, f: str, type_: str, call: int, ret: int | None, index: int) -> dict[str, Any]:
    return {
        "run": run,
        "key": "k",
        "process": "0",
        "f": f,
        "type": type_,
        "index": index,
        "complete_index": index + 1,
        "call": call,
        "ret": ret,
        "value": None,
        "result": None,
        "error": None if type_ == "ok" else "timeout",
        "node": 1,
        "offset": None,
        "epoch": None,
    }


def history(spark: SparkSession) -> tuple[DataFrame, DataFrame]:
    """Run a: 10 s (its last op completes at 10 s), so 10 buckets of 1 s each.

    - bucket 0: three ok reads of 10, 20 and 30 ms;
    - bucket 2: a fail write of 100 ms, completed at 2.5 s;
    - bucket 3: an info write invoked at 3.2 s (counted at its invoke);
    - bucket 5: 100 ok writes of 1, 2, ..., 100 ms;
    - bucket 9: an ok read completed at exactly 10 s (the run's last instant).

    Run b: one op from 5 s to 6 s; the run spans [0, 6 s].
    """
    rows: list[dict[str, Any]] = []
    for i, lat in enumerate((10, 20, 30)):
        rows.append(op("a", "read", "ok", 100 * MS * i, 100 * MS * i + lat * MS, len(rows)))
    rows.append(op("a", "write", "fail", 2_400 * MS, 2_500 * MS, len(rows)))
    rows.append(op("a", "write", "info", 3_200 * MS, None, len(rows)))
    for lat in range(1, 101):
        rows.append(op("a", "write", "ok", 5_500 * MS - lat * MS, 5_500 * MS, len(rows)))
    rows.append(op("a", "read", "ok", 10 * S - 4 * MS, 10 * S, len(rows)))
    rows.append(op("b", "read", "ok", 5 * S, 6 * S, 0))
    faults = [
        {"run": "a", "f": "kill", "kind": None, "nodes": "[2]", "start": S, "end": 4 * S,
         "value": '{"nodes":[2]}'},
        # Never ended: it lasts to the end of the run.
        {"run": "a", "f": "partition", "kind": "halves", "nodes": "[[1],[2,3]]",
         "start": 6 * S, "end": None, "value": '{"groups":[[1],[2,3]],"kind":"halves"}'},
    ]  # fmt: skip
    return spark.createDataFrame(rows, schema=PAIRED), spark.createDataFrame(faults, schema=NEMESIS)


@pytest.mark.spark
def test_timeline_counts_quantiles_and_faults(spark: SparkSession) -> None:
    ops, nemesis = history(spark)
    tl = timeline(ops, nemesis, buckets=10)
    assert [r.run for r in tl.runs] == ["a", "b"]
    a = tl.run("a")
    assert a.end_s == 10.0
    assert a.buckets == 10
    assert a.bucket_s == pytest.approx(1.0)
    cells = {(r.bucket, r.f, r.type): r for r in a.rows}
    assert sorted(cells) == [
        (0, "read", "ok"),
        (2, "write", "fail"),
        (3, "write", "info"),
        (5, "write", "ok"),
        (9, "read", "ok"),
    ]
    reads = cells[0, "read", "ok"]
    assert reads.count == 3
    assert reads.throughput == pytest.approx(3.0)
    assert (reads.p50_ms, reads.max_ms) == (20.0, 30.0)
    failed = cells[2, "write", "fail"]
    assert (failed.count, failed.p50_ms, failed.p99_ms, failed.max_ms) == (1, 100.0, 100.0, 100.0)
    info = cells[3, "write", "info"]
    assert info.count == 1
    assert (info.p50_ms, info.p95_ms, info.p99_ms, info.max_ms) == (None, None, None, None)
    # percentile_approx is exact on a group this small.
    writes = cells[5, "write", "ok"]
    assert writes.count == 100
    assert writes.throughput == pytest.approx(100.0)
    assert (writes.p50_ms, writes.p95_ms, writes.p99_ms, writes.max_ms) == (50.0, 95.0, 99.0, 100.0)
    assert cells[9, "read", "ok"].count == 1
    assert cells[9, "read", "ok"].p50_ms == pytest.approx(4.0)

    assert a.faults == (
        FaultInterval("kill", None, "[2]", 1.0, 4.0, ended=True),
        FaultInterval("partition", "halves", "[[1],[2,3]]", 6.0, 10.0, ended=False),
    )
    assert a.faults[1].label == "partition halves"

    b = tl.run("b")
    assert b.end_s == 6.0
    assert b.faults == ()
    # Completed at the run's very end: the last bucket, not one past it.
    assert [(r.bucket, r.count, r.p50_ms) for r in b.rows] == [(9, 1, 1000.0)]
    assert b.rows[0].throughput == pytest.approx(1 / 0.6)

    # Plain data: through JSON text and back unchanged.
    assert Timeline.loads(json.dumps(tl.to_json())) == tl
    assert tl.per_run()["b"] == Timeline(10, (b,))


@pytest.mark.spark
def test_timeline_refuses_bad_input(spark: SparkSession) -> None:
    ops, nemesis = history(spark)
    with pytest.raises(ValueError, match="buckets must be a positive integer"):
        timeline(ops, nemesis, buckets=0)
    with pytest.raises(ValueError, match=r"ops \(PAIRED\) lacks the column\(s\) \['ret'\]"):
        timeline(ops.drop("ret"), nemesis)
    with pytest.raises(ValueError, match=r"nemesis \(NEMESIS\) lacks the column\(s\) \['kind'\]"):
        timeline(ops, nemesis.drop("kind"))
    odd = spark.createDataFrame([op("a", "read", "invoke", 0, 5, 0)], schema=PAIRED)
    with pytest.raises(ValueError, match="type is 'invoke', not ok, fail or info"):
        timeline(odd, nemesis, buckets=4)


def test_timeline_json_round_trip_and_errors() -> None:
    run = RunTimeline(
        run="r",
        end_s=2.0,
        buckets=2,
        bucket_s=1.0,
        rows=(
            BucketStats(0, "read", "ok", 2, 2.0, 1.0, 2.0, 2.0, 2.0),
            BucketStats(1, "write", "info", 1, 1.0),
        ),
        faults=(FaultInterval("pause", None, "[1]", 0.5, 2.0, ended=False),),
    )
    tl = Timeline(2, (run,))
    assert Timeline.from_json(json.loads(tl.dumps())) == tl
    with pytest.raises(KeyError, match="no timeline of run 'x'"):
        tl.run("x")
    assert FaultInterval("kill", "kill-leader", "[2]", 0.0, 1.0).label == "kill-leader"
    assert FaultInterval("kill", None, "[2]", 0.0, 1.0).label == "kill"
    bad = tl.to_json()
    bad["runs"][0]["rows"][0]["count"] = "2"
    with pytest.raises(ValueError, match="'count' must be an integer"):
        Timeline.from_json(bad)
    with pytest.raises(ValueError, match="format must be 1"):
        Timeline.from_json({"buckets": 2, "runs": []})
    bad = tl.to_json()
    bad["runs"][0]["faults"][0]["end_s"] = float("nan")
    with pytest.raises(ValueError, match="'end_s' must be a finite number"):
        Timeline.from_json(bad)

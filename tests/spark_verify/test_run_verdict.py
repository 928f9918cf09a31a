"""Each run's verdict out of checks shared by the runs verified together
(spark_verify.job.run_verdict; no Spark job): a check that counts each run's
anomalies (``detail.by_run``) decides each run by its own count; one that
does not names a run invalid only through its kept anomalies."""

from __future__ import annotations

from spark_verify.job import run_verdict
from spark_verify.verdict import MAX_ANOMALIES, Anomaly, result_of


def listed(run: str, n: int) -> list[Anomaly]:
    return [Anomaly("G1a", "G1a", f"anomaly {i}", run=run, key="0") for i in range(n)]


def verdicts(detail: dict[str, object]) -> dict[str, str]:
    # The listing holds the first MAX_ANOMALIES, all of run "a".
    g1a = result_of("G1a", listed("a", MAX_ANOMALIES), count=MAX_ANOMALIES + 21, detail=detail)
    return {run: run_verdict(run, [g1a], {}, {})["verdict"] for run in ("a", "b", "c")}


def test_per_run_counts_decide_each_run() -> None:
    got = verdicts({"by_run": {"a": MAX_ANOMALIES + 20, "b": 1}})
    assert got == {"a": "invalid", "b": "invalid", "c": "valid"}


def test_without_per_run_counts_an_unlisted_run_is_unknown() -> None:
    assert verdicts({}) == {"a": "invalid", "b": "unknown", "c": "unknown"}

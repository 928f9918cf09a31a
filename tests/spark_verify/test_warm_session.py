"""A Spark session kept warm across runs (``kq chaos catalogue``) keeps a
bounded number of finished queries, and the queue checks read SENDS and
READS as local checkpoints, not with their whole plan at every read."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from spark_verify.job import VerifyOptions, verify
from spark_verify.load import find_runs, load_history
from spark_verify.pairing import pair_ops
from spark_verify.queue import QueueRecords, queue_anomaly_rows, queue_records, reads_of, sends_of
from spark_verify.session import RETAINED_EXECUTIONS
from tests.spark_verify.test_queue import planted, write_run

pytestmark = pytest.mark.spark


def _executions(spark: SparkSession) -> tuple[int, int]:
    """How many finished queries the session's SQL listener keeps, and the
    id of the last one (ids count every query the session ran)."""
    store = spark._jsparkSession.sharedState().statusStore()
    listed = store.executionsList()
    size = int(listed.size())
    last = int(listed.apply(size - 1).executionId()) if size else -1
    return int(store.executionsCount()), last


def _until(holds: Callable[[], bool], bound_s: float = 20.0) -> bool:
    # The listener and its clean-up run on Spark's own threads.
    deadline = time.monotonic() + bound_s
    while not holds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_warm_session_keeps_a_bounded_number_of_finished_queries(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's SQL listener keeps each finished query's plan graph and
    metrics, 1,000 of them by default: across a catalogue's runs they filled
    the driver's heap until verifications failed for want of memory."""
    run = write_run(tmp_path, "bad", planted().ops)
    _, first = _executions(spark)
    ran = 0
    while ran <= RETAINED_EXECUTIONS:  # enough verifications to pass the bound
        verify(spark, [run], VerifyOptions(out=tmp_path / "out", report=False))
        ran = _executions(spark)[1] - first
    assert _until(lambda: _executions(spark)[0] <= RETAINED_EXECUTIONS), _executions(spark)


def _plan_text(df: DataFrame) -> int:
    """The length of ``df``'s plan as Spark's SQL listener records it."""
    return len(str(df._jdf.queryExecution().toString()))


def test_the_queue_checks_read_their_records_without_their_lineage(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The queue checks' one query reads SENDS and READS dozens of times:
    cached, each read carried their whole plan (the ops' pairing, the
    history's parsing) into the plan Spark's listener records at each
    adaptive re-plan.  Kept as local checkpoints they are scans of their
    rows; the anomalies are the same, and freeing them leaves nothing."""
    runs = find_runs([write_run(tmp_path, "planted", planted().ops)])
    history = load_history(spark, runs)
    paired = pair_ops(history).ops
    level = StorageLevel.MEMORY_AND_DISK
    before = int(spark.sparkContext._jsc.getPersistentRDDs().size())
    cached = QueueRecords(sends_of(paired).persist(level), reads_of(paired).persist(level))
    kept = queue_records(paired)
    assert int(spark.sparkContext._jsc.getPersistentRDDs().size()) > before
    try:
        lazy_rows = queue_anomaly_rows(paired, history, records=cached)
        kept_rows = queue_anomaly_rows(paired, history, records=kept)
        assert sorted(map(tuple, kept_rows.collect())) == sorted(map(tuple, lazy_rows.collect()))
        sizes = (_plan_text(kept_rows), _plan_text(lazy_rows))
        assert sizes[0] * 2 < sizes[1], sizes
    finally:
        cached.sends.unpersist()
        cached.reads.unpersist()
        kept.unpersist()
    assert int(spark.sparkContext._jsc.getPersistentRDDs().size()) == before

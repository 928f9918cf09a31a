"""The consumer-group checks of ``queue`` runs: committed offsets as Spark work.

A run whose consumers subscribe (``docs/history-format.md``, the ``queue``
model) records each ``commit`` op's offsets per key, and each ``ok`` poll's
``assigned`` field: per key the position its consumer began reading from
(the committed offset it fetched, or where ``auto.offset.reset=earliest``
put it) and the moment the assignment took effect.  Three rules of a
consumer group's committed offsets, per key (``docs/verification.md``,
"Consumer-group checks"):

- ``commit-lost``: an assignment starts below the highest offset of an
  ``ok`` commit that completed before it took effect (the group lost or
  rolled back an acknowledged commit: KAFKA-20634, Redpanda CORE-16998);
- ``reassign-skip``: an assignment starts above every offset any ``ok`` or
  ``info`` commit invoked before it could have stored, and above the key's
  log start (the records between were skipped by the group);
- ``commit-backwards``: an ``ok`` commit invoked after another ``ok`` commit
  completed has a lower offset (a group's committed offset never goes back).

Each is a window over one (run, key)'s events in time order (commits and
assignments in one partition), the best earlier commit carried forward as
a running maximum: one shuffle, nothing collected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = ["GROUP_CHECKS", "assignments_of", "commits_of", "group_anomaly_rows", "group_message"]

GROUP_CHECKS: Final = ("commit-lost", "reassign-skip", "commit-backwards")
"""The consumer-group checks, in the order the verdict lists them."""


def _commit() -> Column:
    return F.struct(
        F.col("offset").alias("offset"), F.col("op").alias("op"), F.col("process").alias("process")
    )


def commits_of(ops: DataFrame) -> DataFrame:
    """COMMITS: run, op, process, type, call, ret, key, offset: one row per
    key of each ``commit`` op (PAIRED rows), its invoke's offsets."""
    return ops.where(F.col("f") == "commit").select(
        "run",
        F.col("index").alias("op"),
        "process",
        "type",
        "call",
        "ret",
        F.explode(
            F.try_variant_get(F.try_parse_json(F.col("value")), "$[0][1]", "map<string,bigint>")
        ).alias("key", "offset"),
    )


def assignments_of(ops: DataFrame, history: DataFrame) -> DataFrame:
    """ASSIGNMENTS: run, op (the poll's invoke index), process, key, start,
    time: one row per key of each ``ok`` poll's ``assigned`` field, read
    from the history's raw lines (``history``: :func:`spark_verify.load.load_history`)."""
    at = F.explode(
        F.try_variant_get(
            F.try_parse_json(F.col("line")), "$.assigned", "map<string,array<bigint>>"
        )
    )
    given = (
        history.where(
            (F.col("f") == "poll") & (F.col("type") == "ok") & F.col("line").contains('"assigned"')
        )
        .select("run", F.col("index").alias("complete_index"), at.alias("key", "at"))
        .where((F.size("at") == 2) & F.col("at")[0].isNotNull() & F.col("at")[1].isNotNull())
    )
    polls = ops.where(F.col("f") == "poll").select("run", "complete_index", "index", "process")
    return given.join(polls, ["run", "complete_index"]).select(
        "run",
        F.col("index").alias("op"),
        "process",
        "key",
        F.col("at")[0].alias("start"),
        F.col("at")[1].alias("time"),
    )


def _best_before(commits: DataFrame, at: Column, probes: DataFrame) -> DataFrame:
    """Each probe (run, key, time, op, process, start: an assignment, or a
    commit at its invoke) with ``best``: the highest (offset, op, process)
    of ``commits`` whose time ``at`` is strictly before the probe's time;
    the probe's op and process as ``aop`` and ``aprocess``."""
    events = probes.select(
        "run",
        "key",
        F.col("time").alias("t"),
        F.lit(0).alias("kind"),
        F.col("op").alias("aop"),
        F.col("process").alias("aprocess"),
        "start",
        F.lit(None).cast(_COMMIT_TYPE).alias("c"),
    ).unionByName(
        commits.select(
            "run",
            "key",
            at.alias("t"),
            # At the same instant an assignment sorts first: a commit must be
            # strictly earlier to count.
            F.lit(1).alias("kind"),
            F.lit(None).cast("bigint").alias("aop"),
            F.lit(None).cast("string").alias("aprocess"),
            F.lit(None).cast("bigint").alias("start"),
            _commit().alias("c"),
        )
    )
    w = (
        Window.partitionBy("run", "key")
        .orderBy("t", "kind", "aop")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return (
        events.select("*", F.max("c").over(w).alias("best"))
        .where(F.col("kind") == 0)
        .drop("kind", "c")
    )


_COMMIT_TYPE: Final = "struct<offset:bigint,op:bigint,process:string>"


def _rows(check: str, df: DataFrame, offsets: Column, ops: Column, processes: Column) -> DataFrame:
    return df.select(
        "run",
        F.lit(check).alias("check"),
        "key",
        F.array().cast("array<string>").alias("values"),
        offsets.cast("array<bigint>").alias("offsets"),
        ops.cast("array<bigint>").alias("ops"),
        F.array_join(processes.cast("array<string>"), ",").alias("extra"),
    )


def group_anomaly_rows(
    ops: DataFrame, history: DataFrame, log_start: Mapping[str, Mapping[str, int]] | None = None
) -> DataFrame:
    """Every consumer-group anomaly of the queue runs in ``ops`` (PAIRED),
    with ``history`` their raw lines: run, check, key, values (empty),
    offsets, ops (invoke indexes), extra (the ops' processes, comma-joined),
    as ``spark_verify.queue.queue_anomaly_rows``.  ``log_start``: per run, per
    key, the highest log start the final reads saw (retention), below which
    an assignment may begin without a commit."""
    commits = commits_of(ops)
    assigned = assignments_of(ops, history)
    starts = ops.sparkSession.createDataFrame(
        [(r, k, o) for r, per in sorted((log_start or {}).items()) for k, o in sorted(per.items())],
        "run string, key string, log_start bigint",
    )
    out: list[DataFrame] = []

    # commit-lost: below the highest ok commit completed before the assignment.
    ok = commits.where(F.col("type") == "ok")
    lost = _best_before(ok, F.col("ret"), assigned).where(
        F.col("best").isNotNull() & (F.col("start") < F.col("best.offset"))
    )
    out.append(
        _rows(
            "commit-lost",
            lost,
            F.array("start", "best.offset"),
            F.array("best.op", "aop"),
            F.array("best.process", "aprocess"),
        )
    )

    # reassign-skip: above every commit (ok or info) invoked before it, and
    # above the log start (retention; an out-of-range commit resets there).
    stored = commits.where(F.col("type").isin("ok", "info"))
    bound = F.greatest(
        F.coalesce(F.col("best.offset"), F.lit(0)), F.coalesce("log_start", F.lit(0))
    )
    skip = (
        _best_before(stored, F.col("call"), assigned)
        .join(starts, ["run", "key"], "left")
        .withColumn("bound", bound)
        .where(F.col("start") > F.col("bound"))
    )
    from_commit = F.col("best").isNotNull() & (F.col("best.offset") == F.col("bound"))
    out.append(
        _rows(
            "reassign-skip",
            skip,
            F.array("start", "bound"),
            F.when(from_commit, F.array("best.op", "aop")).otherwise(F.array("aop")),
            F.when(from_commit, F.array("best.process", "aprocess")).otherwise(F.array("aprocess")),
        )
    )

    # commit-backwards: an ok commit invoked after an ok commit of a higher
    # offset completed (each ok commit a probe at its invoke).
    invoked = ok.select(
        "run", "key", F.col("call").alias("time"), "op", "process", F.col("offset").alias("start")
    )
    back = _best_before(ok, F.col("ret"), invoked).where(
        F.col("best").isNotNull() & (F.col("start") < F.col("best.offset"))
    )
    out.append(
        _rows(
            "commit-backwards",
            back,
            F.array("best.offset", "start"),
            F.array("best.op", "aop"),
            F.array("best.process", "aprocess"),
        )
    )
    result = out[0]
    for df in out[1:]:
        result = result.unionByName(df)
    return result


def group_message(
    check: str, key: str, offsets: Sequence[int], ops: Sequence[int], processes: Sequence[str]
) -> str:
    """The verdict's sentence for one consumer-group anomaly row."""
    if check == "commit-lost":
        return (
            f"poll {ops[1]} (process {processes[1]}) was assigned key {key} at offset "
            f"{offsets[0]}, below offset {offsets[1]} that commit {ops[0]} (process "
            f"{processes[0]}) had stored: {offsets[1] - offsets[0]} record(s) read again"
        )
    if check == "reassign-skip":
        since = (
            f"the highest commit invoked before it (op {ops[0]}, process {processes[0]}) "
            f"stored at most {offsets[1]}"
            if len(ops) == 2
            else f"no commit preceded it and the log starts at {offsets[1]}"
        )
        return (
            f"poll {ops[-1]} (process {processes[-1]}) was assigned key {key} at offset "
            f"{offsets[0]}, but {since}: {offsets[0] - offsets[1]} record(s) skipped"
        )
    return (
        f"commit {ops[1]} (process {processes[1]}) stored offset {offsets[1]} of key {key} "
        f"after commit {ops[0]} (process {processes[0]}) had stored {offsets[0]}"
    )

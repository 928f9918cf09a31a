"""The queue checks as a Spark job: Jepsen's Kafka analysis and kq's no-loss rule.

The same checks, with the same definitions, as the pure reference
``history.queue_checks`` (``docs/verification.md``, "Queue checks"), as
DataFrame work over the PAIRED table of ``queue`` runs:

- each op's micro-ops are exploded into SENDS rows (run, op, process, type,
  key, pos, offset, value) and READS rows (one per ``[offset, v]`` a poll
  returned), values kept as their canonical JSON text;
- the *version order* of each key is the union of the committed sends'
  offsets and every poll's (Jepsen's ``version-orders``); its dense index
  (holes removed) is a ``dense_rank`` over (run, key) by offset;
- ``inconsistent-offsets`` and ``duplicate`` are group-bys over it, ``G1a``,
  ``unseen``, ``lost-write`` and ``no-loss`` joins between sends and polls,
  the ``int-`` checks a ``lag`` over each op's records of a key, and
  ``poll-skip``, ``nonmonotonic-poll`` and ``nonmonotonic-send`` a ``last``
  over each (run, process, key) in completion order, where an ``assign`` or
  ``subscribe`` that does not name the key resets it.

A run with transactions (``txn`` ops) also gets Jepsen's
``precommitted-read`` (a join of each op's reads with its own sends),
Elle's cycles (``G0``, ``G1c-ww``, ``G1c``: the ``ww`` edges a ``lead``
over each key's version order joined with the writers, the ``wr`` edges a
join of the reads with the writers, one edge per pair of ops and kind
collected run by run to the driver, where :mod:`spark_verify.cycles` finds
the components and a cycle in each) and kq's ``torn-transaction`` (a
transaction's records joined with the final reads).

The consumer-group checks of runs that subscribe (``commit-lost``,
``reassign-skip``, ``commit-backwards``: :mod:`spark_verify.groups`) add
their rows to the same anomaly table.

Only each check's count and first anomalies come back to the driver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_verify.cycles import Edge, find_cycles
from spark_verify.groups import GROUP_CHECKS, group_anomaly_rows, group_message
from spark_verify.verdict import MAX_ANOMALIES, Anomaly, CheckResult, result_of

__all__ = [
    "ALWAYS_ALLOWED",
    "FINAL_FS",
    "QUEUE_CHECKS",
    "QueueRecords",
    "READ_UNCOMMITTED_ALLOWED",
    "SUBSCRIBE_ALLOWED",
    "RunCleanup",
    "check_queue_runs",
    "cleanup_of",
    "final_polls_from",
    "isolation_of",
    "queue_anomaly_rows",
    "queue_records",
    "reads_of",
    "sends_of",
]

# As history.queue_checks (spark_verify reads the same files without importing
# it), then the consumer-group checks (spark_verify.groups).
QUEUE_CHECKS: Final = (
    "inconsistent-offsets",
    "duplicate",
    "G1a",
    "precommitted-read",
    "lost-write",
    "unseen",
    "poll-skip",
    "nonmonotonic-poll",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "nonmonotonic-send",
    "int-send-skip",
    "int-nonmonotonic-send",
    "G0",
    "G1c-ww",
    "G1c",
    "no-loss",
    "torn-transaction",
    *GROUP_CHECKS,
)
ALWAYS_ALLOWED: Final = frozenset({"int-send-skip", "G0", "G1c-ww"})
SUBSCRIBE_ALLOWED: Final = frozenset({"poll-skip", "nonmonotonic-poll"})
READ_UNCOMMITTED_ALLOWED: Final = frozenset({"precommitted-read", "G1c"})
ISOLATION_LEVELS: Final = ("read_uncommitted", "read_committed")
FINAL_FS: Final = ("poll", "crash", "assign", "subscribe", "debug-topic-partitions")

_ANOMALY_COLUMNS: Final = ("run", "check", "key", "values", "offsets", "ops", "extra")


def _mops(ops: DataFrame, fs: Sequence[str]) -> DataFrame:
    """One row per micro-op of the ops whose f is in ``fs``: the completion's
    value, or the invoke's when the completion has none."""
    source = F.coalesce(F.col("result"), F.col("value"))
    return ops.where(F.col("f").isin(*fs)).select(
        "run",
        F.col("index").alias("op"),
        F.col("complete_index").alias("complete"),
        "process",
        "type",
        "f",
        F.posexplode(F.try_variant_get(F.try_parse_json(source), "$", "array<variant>")).alias(
            "mpos", "m"
        ),
    )


@dataclass(frozen=True, slots=True)
class QueueRecords:
    """The SENDS and READS of some queue runs' ops (:func:`sends_of`,
    :func:`reads_of`)."""

    sends: DataFrame
    reads: DataFrame

    def unpersist(self) -> None:
        for df in (self.sends, self.reads):
            _free_checkpoint(df)


def _free_checkpoint(df: DataFrame) -> None:
    """Free the blocks of ``df``, a local checkpoint (:func:`queue_records`)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        # Spark Connect: no JVM frame here; the server releases a frame's
        # checkpoint when the client lets the frame go.
        df.unpersist()
        return
    # The checkpoint is the RDD of the frame's one LogicalRDD: Spark frees
    # it only once the driver collects the frame, so free it now.
    jdf.queryExecution().analyzed().rdd().unpersist(False)


def queue_records(ops: DataFrame) -> QueueRecords:
    """``ops``'s SENDS and READS, parsed once and kept for every check and
    plot that reads them: each parses the ops' JSON values (the costliest
    step of the queue checks), and every queue check and the report's
    consumer lag read both.  Kept in memory and on disk (a cluster's
    executors hold them, not the driver); :meth:`QueueRecords.unpersist`
    frees them.

    Kept as local checkpoints, not cached: a query reads a cached frame with
    its whole plan attached (the ops' pairing, the history's parsing), and
    the queue checks' one query reads SENDS and READS dozens of times, so
    Spark's SQL listener drew that plan dozens of times over in the query's
    graph, metrics and text at each adaptive re-plan: gigabytes of driver
    heap for a history of 1,500 lines, verifications that failed for want
    of memory.  A checkpoint is read as a scan of its rows."""
    level = StorageLevel.MEMORY_AND_DISK
    return QueueRecords(
        sends_of(ops).localCheckpoint(eager=True, storageLevel=level),
        reads_of(ops).localCheckpoint(eager=True, storageLevel=level),
    )


def sends_of(ops: DataFrame) -> DataFrame:
    """SENDS: run, op, complete, process, type, key, pos, offset, value (JSON
    text), f (``send`` or ``txn``)."""
    m = _mops(ops, ("send", "txn"))
    m = m.where(F.try_variant_get("m", "$[0]", "string") == "send")
    third = F.try_variant_get("m", "$[2]", "variant")
    pair = F.size(F.try_variant_get(third, "$", "array<variant>")) == 2
    sends = m.select(
        "run",
        "op",
        "complete",
        "process",
        "type",
        F.try_variant_get("m", "$[1]", "string").alias("key"),
        F.col("mpos").alias("pos"),
        F.when(pair, F.try_variant_get(third, "$[0]", "bigint")).alias("offset"),
        F.coalesce(
            F.to_json(F.when(pair, F.try_variant_get(third, "$[1]", "variant")).otherwise(third)),
            F.lit("null"),
        ).alias("value"),
        "f",
    )
    return sends


def reads_of(ops: DataFrame) -> DataFrame:
    """READS: run, op, complete, process, type, key, pos, offset, value (JSON
    text), f (``poll`` or ``txn``).  A key's ``pos`` orders its records
    across a txn's polls (the poll's place, then the record's)."""
    m = _mops(ops, ("poll", "txn"))
    m = m.where(F.try_variant_get("m", "$[0]", "string") == "poll")
    per_key = m.select(
        "run",
        "op",
        "complete",
        "process",
        "type",
        "f",
        "mpos",
        F.explode(F.try_variant_get("m", "$[1]", "map<string,array<variant>>")).alias(
            "key", "pairs"
        ),
    )
    return per_key.select(
        "run",
        "op",
        "complete",
        "process",
        "type",
        "f",
        "mpos",
        "key",
        F.posexplode("pairs").alias("pos", "pair"),
    ).select(
        "run",
        "op",
        "complete",
        "process",
        "type",
        "key",
        (F.col("mpos").cast("bigint") * F.lit(1 << 32) + F.col("pos")).alias("pos"),
        F.try_variant_get("pair", "$[0]", "bigint").alias("offset"),
        F.coalesce(F.to_json(F.try_variant_get("pair", "$[1]", "variant")), F.lit("null")).alias(
            "value"
        ),
        "f",
    )


def _anomalies(
    check: str,
    df: DataFrame,
    values: Column,
    offsets: Column,
    ops: Column,
    extra: Column | None = None,
) -> DataFrame:
    return df.select(
        "run",
        F.lit(check).alias("check"),
        "key",
        values.cast("array<string>").alias("values"),
        offsets.cast("array<bigint>").alias("offsets"),
        ops.cast("array<bigint>").alias("ops"),
        (extra if extra is not None else F.lit(None)).cast("string").alias("extra"),
    )


def _arr(*cols: Column | str) -> Column:
    return F.array(*[F.col(c) if isinstance(c, str) else c for c in cols])


def _opt(c: str) -> Column:
    """``[c]``, or ``[]`` when c is null."""
    return F.when(F.col(c).isNull(), F.array().cast("array<bigint>")).otherwise(F.array(c))


def final_polls_from(run: Path) -> int | None:
    """Where a run folder's final polls start: ``summary.json``'s
    ``final_polls.from_index`` (``docs/history-format.md``), if it says."""
    path = run / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the run's summary: {e}") from None
    polls = summary.get("final_polls") if isinstance(summary, dict) else None
    start = polls.get("from_index") if isinstance(polls, dict) else None
    if start is None:
        return None
    if not (isinstance(start, int) and not isinstance(start, bool) and start >= 0):
        raise ValueError(f"{path}: final_polls.from_index must be an integer >= 0, got {start!r}")
    return start


RunCleanup = tuple[dict[str, int], int | None]
"""What a run's topics may remove (``history.queue_checks.Cleanup``): per
key, the highest log start offset the final reads saw (retention), and the
run's ``queue.record_keys`` if its topics are compacted (else None)."""


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def cleanup_of(run: Path) -> RunCleanup | None:
    """A run folder's cleanup, from ``config.json``'s ``queue``
    (``cleanup_policy``, ``retention_ms``, ``retention_bytes``,
    ``record_keys``) and ``summary.json``'s ``final_polls.log_start``, as
    ``history.queue_checks.Cleanup.of_run`` reads them; None for a run whose
    topics keep every record (a plain topic, or a run written before these
    fields)."""
    docs: list[dict[str, Any]] = []
    for name in ("config.json", "summary.json"):
        path = run / name
        try:
            doc = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot read it: {e}") from None
        docs.append(doc if isinstance(doc, dict) else {})
    config, summary = docs
    queue = config.get("queue")
    if not isinstance(queue, dict):
        return None
    policy = str(queue.get("cleanup_policy") or "delete").split(",")
    limits = (queue.get("retention_ms"), queue.get("retention_bytes"))
    log_start: dict[str, int] = {}
    polls = summary.get("final_polls")
    starts = polls.get("log_start") if isinstance(polls, dict) else None
    if "delete" in policy and any(_count(v) for v in limits) and isinstance(starts, dict):
        for k, v in starts.items():
            if not _count(v):
                raise ValueError(f"{run}: final_polls.log_start[{k!r}] is an offset, got {v!r}")
            log_start[str(k)] = v
    record_keys: int | None = None
    if "compact" in policy:
        n = queue.get("record_keys", 0)
        if not _count(n):
            raise ValueError(f"{run}: queue.record_keys is an integer >= 0, got {n!r}")
        record_keys = n
    if not log_start and record_keys is None:
        return None
    return log_start, record_keys


def isolation_of(run: Path) -> str:
    """A run folder's ``queue.isolation_level`` (``config.json``), as
    ``history.queue.isolation_level`` reads it: ``read_uncommitted`` when
    absent, another value refused by name."""
    path = run / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it: {e}") from None
    queue = config.get("queue") if isinstance(config, dict) else None
    level = queue.get("isolation_level") if isinstance(queue, dict) else None
    if level is None:
        return ISOLATION_LEVELS[0]
    if level not in ISOLATION_LEVELS:
        raise ValueError(
            f"{path}: queue.isolation_level is one of {', '.join(ISOLATION_LEVELS)}, got {level!r}"
        )
    return str(level)


def _final_start(
    ops: DataFrame, history: DataFrame, final_from: Mapping[str, int] | None
) -> DataFrame:
    """run, final_from: where each run's final reads start: the history's
    last stretch of final-read ops (Jepsen's final polls), or the given
    index (its summary's)."""
    nonfinal = (F.col("process") == "nemesis") | ~F.col("f").isin(*FINAL_FS)
    start = history.groupBy("run").agg(
        F.coalesce(F.max(F.when(nonfinal, F.col("index"))) + 1, F.lit(0)).alias("final_from")
    )
    if final_from:
        given = ops.sparkSession.createDataFrame(
            sorted(final_from.items()), "run string, given bigint"
        )
        start = start.join(given, "run", "left").select(
            "run", F.coalesce("given", "final_from").alias("final_from")
        )
    return start


def _gone_values(held: DataFrame, final: DataFrame, cleanup: Mapping[str, RunCleanup]) -> DataFrame:
    """run, key, value: the values of the version orders that retention or
    compaction may have removed, each judged at its lowest offset there:
    below the run's log start of the key, or below the highest offset the
    final reads returned a record of its record key at."""
    spark = held.sparkSession
    starts = spark.createDataFrame(
        [(run, k, v) for run, (ls, _) in sorted(cleanup.items()) for k, v in sorted(ls.items())],
        "run string, key string, log_start bigint",
    )
    compact = spark.createDataFrame(
        [(run, n) for run, (_, n) in sorted(cleanup.items()) if n is not None],
        "run string, record_keys bigint",
    )

    def record_key(df: DataFrame) -> DataFrame:
        number = F.when(F.col("value").rlike("^-?[0-9]+$"), F.col("value").cast("bigint"))
        rk = F.when(F.col("record_keys") == 0, F.col("key")).otherwise(
            F.pmod(number, F.col("record_keys")).cast("string")
        )
        return df.join(compact, "run").withColumn("rk", rk)

    latest = (
        record_key(final)
        .where(F.col("rk").isNotNull())
        .groupBy("run", "key", "rk")
        .agg(F.max("offset").alias("latest"))
    )
    lowest = held.groupBy("run", "key", "value").agg(F.min("offset").alias("offset"))
    below = lowest.join(starts, ["run", "key"]).where(F.col("offset") < F.col("log_start"))
    superseded = (
        record_key(lowest)
        .join(latest, ["run", "key", "rk"])
        .where(F.col("offset") < F.col("latest"))
    )
    return (
        below.select("run", "key", "value")
        .unionByName(superseded.select("run", "key", "value"))
        .distinct()
    )


def queue_anomaly_rows(
    ops: DataFrame,
    history: DataFrame,
    final_from: Mapping[str, int] | None = None,
    cleanup: Mapping[str, RunCleanup] | None = None,
    records: QueueRecords | None = None,
    isolation: Mapping[str, str] | None = None,
    txn_runs: Sequence[str] | None = None,
) -> DataFrame:
    """Every queue anomaly of the runs in ``ops`` (PAIRED rows of queue runs;
    ``history`` their raw lines, for the final reads), one row each:
    run, check, key, values (JSON texts), offsets, ops (invoke indexes), extra.

    ``final_from`` gives the index where a run's final polls start (its
    summary's); for the other runs it is the history's last stretch of
    final-read ops after the last fault, as Jepsen finds its final polls.
    ``cleanup`` gives what the topics of a run with retention or compaction
    may remove (:func:`cleanup_of`): those values are neither lost nor
    unseen, and a poll may skip them.  ``records`` are ``ops``'s SENDS and
    READS already parsed (and cached: :func:`queue_records`); without them
    they are parsed here.  ``isolation`` gives a run's
    ``queue.isolation_level`` (:func:`isolation_of`; a run not named reads
    uncommitted records); ``txn_runs`` the runs with ``txn`` ops (None:
    found here), the only ones whose cycles are looked for."""
    if records is None:
        records = QueueRecords(sends_of(ops), reads_of(ops))
    sends, reads = records.sends, records.reads
    spark = ops.sparkSession
    if txn_runs is None:
        txn_runs = [
            r.run for r in ops.where(F.col("f") == "txn").select("run").distinct().collect()
        ]
    committed_runs = spark.createDataFrame(
        [(r,) for r, level in sorted((isolation or {}).items()) if level == "read_committed"],
        "run string",
    )
    ok_read = reads.where(F.col("type") == "ok").select("run", "key", "value").distinct()

    # writer-of: the first send of each (key, value), and its outcome.
    writer = sends.groupBy("run", "key", "value").agg(
        F.min_by("op", F.struct("op", "pos")).alias("wop"),
        F.min_by("type", F.struct("op", "pos")).alias("wtype"),
        F.min_by("f", F.struct("op", "pos")).alias("wf"),
    )
    # must-have-committed?: ok, or info with a sent value read by an ok poll.
    committed = (
        sends.where(F.col("type") == "ok")
        .select("run", "op")
        .unionByName(
            sends.where(F.col("type") == "info")
            .join(ok_read, ["run", "key", "value"], "left_semi")
            .select("run", "op")
        )
        .distinct()
    )
    vo = (
        sends.where(F.col("offset").isNotNull())
        .join(committed, ["run", "op"], "left_semi")
        .select("run", "key", "offset", "value", "op")
        .unionByName(
            reads.where(F.col("offset").isNotNull()).select("run", "key", "offset", "value", "op")
        )
    )
    offsets = vo.groupBy("run", "key", "offset").agg(
        F.sort_array(F.collect_set("value")).alias("vals"),
        F.sort_array(F.collect_set("op")).alias("vops"),
    )
    idx = offsets.select(
        "run",
        "key",
        "offset",
        "vals",
        "vops",
        (F.dense_rank().over(Window.partitionBy("run", "key").orderBy("offset")) - 1).alias(
            "index"
        ),
        F.element_at("vals", 1).alias("chosen"),
    )
    by_value = idx.groupBy("run", "key", F.col("chosen").alias("value")).agg(
        F.max("index").alias("bv")
    )
    held = idx.select("run", "key", "index", "offset", F.explode("vals").alias("value"))
    first_last = held.groupBy("run", "key", "value").agg(
        F.min("index").alias("first"), F.max("index").alias("last")
    )
    start = _final_start(ops, history, final_from)
    final_ok = (
        reads.where(F.col("type") == "ok")
        .join(start, "run")
        .where(F.col("op") >= F.col("final_from"))
    )
    final = final_ok.where(F.col("offset").isNotNull()).select("run", "key", "offset", "value")
    gone = _gone_values(held, final, cleanup) if cleanup else None

    def present(df: DataFrame) -> DataFrame:
        """``df`` without the values retention or compaction removed."""
        return df if gone is None else df.join(gone, ["run", "key", "value"], "left_anti")

    # Per index of the version order, how many indexes up to it (upto) and
    # before it (before) hold a value not removed: a poll's skip from i1 to
    # i2 passes over before(i2) - upto(i1) records that were there.
    if gone is None:
        live = idx.select(
            "run",
            "key",
            "index",
            (F.col("index") + 1).alias("upto"),
            F.col("index").alias("before"),
        )
    else:
        flag = idx.join(
            gone.select("run", "key", F.col("value").alias("chosen"), F.lit(0).alias("g")),
            ["run", "key", "chosen"],
            "left",
        ).select("run", "key", "index", F.coalesce("g", F.lit(1)).alias("here"))
        upto = F.sum("here").over(Window.partitionBy("run", "key").orderBy("index"))
        live = flag.select(
            "run", "key", "index", upto.alias("upto"), (upto - F.col("here")).alias("before")
        )

    out: list[DataFrame] = []

    # inconsistent-offsets and duplicate.
    out.append(
        _anomalies(
            "inconsistent-offsets",
            idx.where(F.size("vals") > 1),
            F.col("vals"),
            F.array("offset"),
            F.col("vops"),
        )
    )
    dup = (
        vo.groupBy("run", "key", "value")
        .agg(
            F.sort_array(F.collect_set("offset")).alias("offs"),
            F.sort_array(F.collect_set("op")).alias("dops"),
        )
        .where(F.size("offs") > 1)
    )
    out.append(_anomalies("duplicate", dup, F.array("value"), F.col("offs"), F.col("dops")))

    # G1a: an ok poll read a value whose send failed (an aborted
    # transaction's, only by a consumer reading committed records).
    g1a = reads.where(F.col("type") == "ok").join(
        writer.where(F.col("wtype") == "fail"), ["run", "key", "value"]
    )
    g1a = g1a.where(F.col("wf") != "txn").unionByName(
        g1a.where(F.col("wf") == "txn").join(committed_runs, "run", "left_semi")
    )
    out.append(_anomalies("G1a", g1a, F.array("value"), _opt("offset"), _arr("wop", "op")))

    # precommitted-read: an op polled a value it sent itself.
    pre = (
        reads.join(
            sends.select("run", "op", "key", "value").distinct(),
            ["run", "op", "key", "value"],
            "left_semi",
        )
        .groupBy("run", "op", "key", "value")
        .agg(F.sort_array(F.collect_set("offset")).alias("offs"))
    )
    out.append(_anomalies("precommitted-read", pre, F.array("value"), F.col("offs"), _arr("op")))

    # lost-write: values whose last index is at or below the highest first
    # index of a value an ok poll read, read by no ok poll, their writer committed.
    bound = (
        ok_read.join(first_last, ["run", "key", "value"])
        .groupBy("run", "key")
        .agg(F.max("first").alias("bound"))
    )
    bound_offset = idx.select(
        "run", "key", F.col("index").alias("bound"), F.col("offset").alias("bound_offset")
    )
    first_offset = idx.select(
        "run", "key", F.col("index").alias("first"), F.col("offset").alias("first_offset")
    )
    lost = (
        first_last.join(bound, ["run", "key"])
        .where(F.col("last") <= F.col("bound"))
        .join(ok_read, ["run", "key", "value"], "left_anti")
        .transform(present)
        .join(writer, ["run", "key", "value"])
        .join(committed.withColumnRenamed("op", "wop"), ["run", "wop"], "left_semi")
        .join(bound_offset, ["run", "key", "bound"])
        .join(first_offset, ["run", "key", "first"])
    )
    out.append(
        _anomalies(
            "lost-write", lost, F.array("value"), _arr("first_offset", "bound_offset"), _arr("wop")
        )
    )

    # unseen: sent by an ok send, read by no ok poll.
    unseen = present(
        sends.where(F.col("type") == "ok").join(ok_read, ["run", "key", "value"], "left_anti")
    )
    out.append(_anomalies("unseen", unseen, F.array("value"), _opt("offset"), _arr("op")))

    # Inside one op: successive records of a key.
    bv1 = by_value.select("run", "key", F.col("value").alias("v1"), F.col("bv").alias("i1")).join(
        live.select("run", "key", F.col("index").alias("i1"), "upto"), ["run", "key", "i1"]
    )
    bv2 = by_value.select("run", "key", F.col("value").alias("v2"), F.col("bv").alias("i2")).join(
        live.select("run", "key", F.col("index").alias("i2"), "before"), ["run", "key", "i2"]
    )
    # A poll's skip counts only records that were there; a send's is
    # Jepsen's (allowed) int-send-skip.
    skipped_here = F.col("before") - F.col("upto") > 0
    for kind, rows in (("poll", reads), ("send", sends)):
        w = Window.partitionBy("run", "op", "key").orderBy("pos")
        pairs = (
            rows.select(
                "run", "op", "key", F.lag("value").over(w).alias("v1"), F.col("value").alias("v2")
            )
            .where(F.col("v1").isNotNull())
            .join(bv1, ["run", "key", "v1"])
            .join(bv2, ["run", "key", "v2"])
            .withColumn("delta", F.col("i2") - F.col("i1"))
        )
        skip = F.col("delta") > 1
        out.append(
            _anomalies(
                f"int-{kind}-skip",
                pairs.where(skip & skipped_here if kind == "poll" else skip),
                _arr("v1", "v2"),
                F.array().cast("array<bigint>"),
                _arr("op"),
                F.col("delta"),
            )
        )
        out.append(
            _anomalies(
                f"int-nonmonotonic-{kind}",
                pairs.where(F.col("delta") < 1),
                _arr("v1", "v2"),
                F.array().cast("array<bigint>"),
                _arr("op"),
                F.col("delta"),
            )
        )

    # Per process, in completion order: the last ok poll (or ok/info send) of
    # each key before this one, unless an assign or subscribe without the key
    # came between.
    keys = sends.select("run", "key").unionByName(reads.select("run", "key")).distinct()
    assigns = ops.where(F.col("f").isin("assign", "subscribe") & (F.col("type") != "fail")).select(
        "run",
        "process",
        F.col("complete_index").alias("complete"),
        F.coalesce(
            F.try_variant_get(F.try_parse_json(F.col("value")), "$", "array<string>"),
            F.try_variant_get(F.try_parse_json(F.col("value")), "$.keys", "array<string>"),
            F.array().cast("array<string>"),
        ).alias("named"),
        F.coalesce(
            F.try_variant_get(F.try_parse_json(F.col("value")), "$.seek_to_beginning", "boolean"),
            F.lit(False),
        ).alias("seek"),
    )
    # A consumer sent back to the beginning forgets where it left off (the
    # reference's rule); sends are not moved by it.
    resets = (
        assigns.join(keys, "run")
        .where(~F.array_contains("named", F.col("key")) | F.col("seek"))
        .select(
            F.array_contains("named", F.col("key")).alias("named_key"),
            "run",
            "process",
            "key",
            "complete",
            F.lit(None).cast("bigint").alias("op"),
            F.lit(None).cast("string").alias("type"),
            F.lit(None).cast("string").alias("first"),
            F.lit(None).cast("string").alias("last"),
            F.lit(True).alias("reset"),
        )
    )
    for name, rows, moves, cut in (
        ("poll", reads, F.col("type") == "ok", resets),
        (
            "send",
            sends.where(F.col("type").isin("ok", "info")),
            F.lit(True),
            resets.where(~F.col("named_key")),
        ),
    ):
        ends = rows.groupBy("run", "process", "key", "op", "complete", "type").agg(
            F.min_by("value", "pos").alias("first"), F.max_by("value", "pos").alias("last")
        )
        events = ends.select(
            "run",
            "process",
            "key",
            "complete",
            "op",
            "type",
            "first",
            "last",
            F.lit(False).alias("reset"),
        ).unionByName(cut.drop("named_key"))
        w = (
            Window.partitionBy("run", "process", "key")
            .orderBy("complete")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        mover = F.when(
            F.col("reset") | moves,
            F.struct(
                F.col("reset").alias("reset"), F.col("op").alias("op"), F.col("last").alias("v")
            ),
        )
        prev = F.last(mover, ignorenulls=True).over(w)
        seq = (
            events.select("*", prev.alias("prev"))
            .where(~F.col("reset") & F.col("prev").isNotNull() & ~F.col("prev.reset"))
            .select(
                "run",
                "key",
                "op",
                F.col("prev.op").alias("pop"),
                F.col("prev.v").alias("v1"),
                F.col("first").alias("v2"),
            )
            .join(bv1, ["run", "key", "v1"])
            .join(bv2, ["run", "key", "v2"])
            .withColumn("delta", F.col("i2") - F.col("i1"))
        )
        none = F.array().cast("array<bigint>")
        if name == "poll":
            out.append(
                _anomalies(
                    "poll-skip",
                    seq.where((F.col("delta") > 1) & skipped_here),
                    _arr("v1", "v2"),
                    none,
                    _arr("pop", "op"),
                    F.col("delta"),
                )
            )
            out.append(
                _anomalies(
                    "nonmonotonic-poll",
                    seq.where(F.col("delta") < 1),
                    _arr("v1", "v2"),
                    none,
                    _arr("pop", "op"),
                    F.col("delta"),
                )
            )
        else:
            out.append(
                _anomalies(
                    "nonmonotonic-send",
                    seq.where(F.col("delta") < 1),
                    _arr("v1", "v2"),
                    none,
                    _arr("pop", "op"),
                    F.col("delta"),
                )
            )

    # Elle's cycles, in the runs with transactions.
    if txn_runs:
        out.append(_cycle_rows(idx, reads, writer, committed, txn_runs))

    # no-loss over the final reads: the trailing section of the history made
    # only of final-read ops (Jepsen's final polls), if it holds an ok poll.
    starts = start.join(final_ok.select("run").distinct(), "run", "left_semi")
    seen = reads.select("run", "key", "value").distinct()
    # An info send's records one by one: acknowledged with an offset, or seen.
    # A transaction's when it committed, or must have.
    plain = sends.where(F.col("f") != "txn")
    txn_sends = sends.where(F.col("f") == "txn")
    info = plain.where(F.col("type") == "info")
    required = (
        plain.where(
            (F.col("type") == "ok") | ((F.col("type") == "info") & F.col("offset").isNotNull())
        )
        .unionByName(
            info.where(F.col("offset").isNull()).join(seen, ["run", "key", "value"], "left_semi")
        )
        .unionByName(txn_sends.where(F.col("type") == "ok"))
        .unionByName(
            txn_sends.where(F.col("type") == "info").join(committed, ["run", "op"], "left_semi")
        )
        .join(starts, "run", "left_semi")
    )
    if gone is not None and cleanup:
        # Retention or compaction removed it: judged at its acknowledged
        # offset, or, without one, where the version order has it.
        acked = required.where(F.col("offset").isNotNull())
        acked_gone = _gone_values(acked.select("run", "key", "offset", "value"), final, cleanup)
        required = acked.join(acked_gone, ["run", "key", "value"], "left_anti").unionByName(
            present(required.where(F.col("offset").isNull()))
        )
    at_offset = final.groupBy("run", "key", "offset").agg(
        F.concat_ws(", ", F.sort_array(F.collect_set("value"))).alias("there")
    )
    missing_at = (
        required.where(F.col("offset").isNotNull())
        .join(final, ["run", "key", "offset", "value"], "left_anti")
        .join(at_offset, ["run", "key", "offset"], "left")
    )
    missing_any = required.where(F.col("offset").isNull()).join(
        final.select("run", "key", "value"), ["run", "key", "value"], "left_anti"
    )
    out.append(
        _anomalies(
            "no-loss",
            missing_at,
            F.array("value"),
            F.array("offset"),
            _arr("op"),
            F.coalesce(F.col("there"), F.lit("")),
        )
    )
    out.append(
        _anomalies(
            "no-loss",
            missing_any,
            F.array("value"),
            F.array().cast("array<bigint>"),
            _arr("op"),
            F.lit(""),
        )
    )
    # torn-transaction: in the read_committed runs with final reads.
    torn = txn_sends.where(F.col("type").isin("ok", "info")).join(
        starts.join(committed_runs, "run", "left_semi"), "run", "left_semi"
    )
    torn = torn.join(
        final.select("run", "key", "value").distinct().withColumn("present", F.lit(True)),
        ["run", "key", "value"],
        "left",
    ).withColumn("present", F.coalesce("present", F.lit(False)))
    missing = torn.where(~F.col("present"))
    if gone is not None and cleanup:
        acked = missing.where(F.col("offset").isNotNull())
        acked_gone = _gone_values(acked.select("run", "key", "offset", "value"), final, cleanup)
        missing = acked.join(acked_gone, ["run", "key", "value"], "left_anti").unionByName(
            present(missing.where(F.col("offset").isNull()))
        )
    # Reached by the final reads: up to the acknowledged offset, or, without
    # one, up to the highest offset of the key's version order.
    top_final = final.groupBy("run", "key").agg(F.max("offset").alias("top"))
    top_known = idx.groupBy("run", "key").agg(F.max("offset").alias("known"))
    missing = (
        missing.join(top_final, ["run", "key"])
        .join(top_known, ["run", "key"], "left")
        .where(F.col("top") >= F.coalesce("offset", "known", F.lit(0)))
        .select(*torn.columns)
    )
    judged = torn.where(F.col("present")).unionByName(missing)
    entry = F.concat(
        F.regexp_replace(F.to_json(F.struct("key")), "}$", ""),
        F.lit(',"present":'),
        F.when(F.col("present"), F.lit("true")).otherwise(F.lit("false")),
        F.lit(',"value":'),
        F.col("value"),
        F.lit("}"),
    )
    torn_ops = (
        judged.groupBy("run", "op")
        .agg(
            F.array_sort(F.collect_list(F.struct("pos", entry.alias("entry")))).alias("entries"),
            F.concat_ws(",", F.sort_array(F.collect_set("key"))).alias("key"),
            F.max(F.col("present").cast("int")).alias("some"),
            F.min(F.col("present").cast("int")).alias("all"),
        )
        .where((F.col("some") == 1) & (F.col("all") == 0))
    )
    out.append(
        _anomalies(
            "torn-transaction",
            torn_ops,
            F.transform("entries", lambda e: e["entry"]),
            F.array().cast("array<bigint>"),
            _arr("op"),
        )
    )

    log_start = {run: starts for run, (starts, _) in (cleanup or {}).items()}
    out.append(group_anomaly_rows(ops, history, log_start))
    result = out[0]
    for df in out[1:]:
        result = result.unionByName(df)
    runs_with_final = starts.select("run", "final_from")
    return result.unionByName(
        # One marker row per run with final reads (check "", never an anomaly).
        runs_with_final.select(
            "run",
            F.lit("").alias("check"),
            F.lit(None).cast("string").alias("key"),
            F.array().cast("array<string>").alias("values"),
            F.array("final_from").cast("array<bigint>").alias("offsets"),
            F.array().cast("array<bigint>").alias("ops"),
            F.lit(None).cast("string").alias("extra"),
        )
    )


def _cycle_rows(
    idx: DataFrame,
    reads: DataFrame,
    writer: DataFrame,
    committed: DataFrame,
    txn_runs: Sequence[str],
) -> DataFrame:
    """The cycle anomalies (``G0``, ``G1c-ww``, ``G1c``) of ``txn_runs``:
    the edges between the ops that committed or must have, ``ww`` from the
    writer of each value of a key's version order (its index's least value)
    to the writer of the next one, ``wr`` from the writer of each value an
    ok op (or one that must have committed) polled to that op, each when the
    two differ; one edge per (run, kind, src, dst), the least (key, values),
    collected run by run (:mod:`spark_verify.cycles`)."""
    spark = idx.sparkSession
    runs = spark.createDataFrame([(r,) for r in sorted(txn_runs)], "run string")
    wop = writer.join(committed.withColumnRenamed("op", "wop"), ["run", "wop"], "left_semi")
    nxt = Window.partitionBy("run", "key").orderBy("index")
    pairs = (
        idx.join(runs, "run", "left_semi")
        .select("run", "key", F.col("chosen").alias("v1"), F.lead("chosen").over(nxt).alias("v2"))
        .where(F.col("v2").isNotNull())
    )
    w1 = wop.select("run", "key", F.col("value").alias("v1"), F.col("wop").alias("src"))
    w2 = wop.select("run", "key", F.col("value").alias("v2"), F.col("wop").alias("dst"))
    ww = (
        pairs.join(w1, ["run", "key", "v1"])
        .join(w2, ["run", "key", "v2"])
        .where(F.col("src") != F.col("dst"))
        .select(
            "run", F.lit("ww").alias("kind"), "key", F.array("v1", "v2").alias("vals"), "src", "dst"
        )
    )
    readers = reads.join(runs, "run", "left_semi")
    readers = readers.where(F.col("type") == "ok").unionByName(
        readers.where(F.col("type") != "ok").join(committed, ["run", "op"], "left_semi")
    )
    wr = (
        readers.join(wop, ["run", "key", "value"])
        .where(F.col("wop") != F.col("op"))
        .select(
            "run",
            F.lit("wr").alias("kind"),
            "key",
            F.array("value").alias("vals"),
            F.col("wop").alias("src"),
            F.col("op").alias("dst"),
        )
    )
    least = (
        ww.unionByName(wr)
        .groupBy("run", "kind", "src", "dst")
        .agg(F.min(F.struct("key", "vals")).alias("e"))
        .select(
            "run", "kind", "src", "dst", F.col("e.key").alias("key"), F.col("e.vals").alias("vals")
        )
    )
    rows: list[tuple[Any, ...]] = []
    current: str | None = None
    edges: list[Edge] = []

    def flush() -> None:
        for c in find_cycles(edges):
            rows.append(
                (
                    current,
                    c.check,
                    ",".join(sorted({e.key for e in c.edges})),
                    [
                        json.dumps(
                            {
                                "from": e.src,
                                "key": e.key,
                                "to": e.dst,
                                "type": e.kind,
                                "values": [json.loads(v) for v in e.values],
                            },
                            separators=(",", ":"),
                            sort_keys=True,
                            ensure_ascii=False,
                        )
                        for e in c.edges
                    ],
                    [],
                    list(c.ops),
                    None,
                )
            )

    # One run's edges at a time in the driver.
    for r in least.orderBy("run").toLocalIterator():
        if r.run != current:
            flush()
            current, edges = r.run, []
        edges.append(Edge(r.kind, r.key, tuple(r.vals), r.src, r.dst))
    flush()
    return spark.createDataFrame(
        rows,
        "run string, check string, key string, values array<string>, offsets array<bigint>, "
        "ops array<bigint>, extra string",
    )


def _message(
    check: str,
    key: str,
    values: Sequence[str],
    offsets: Sequence[int],
    ops: Sequence[int],
    extra: str | None,
) -> str:
    if check in GROUP_CHECKS:
        return group_message(check, key, offsets, ops, (extra or "").split(","))
    v = ", ".join(values)
    if check == "inconsistent-offsets":
        return f"key {key} offset {offsets[0]} holds {len(values)} values: {v}"
    if check == "duplicate":
        return f"key {key} value {v} is at {len(offsets)} offsets: {list(offsets)}"
    if check == "G1a":
        return f"poll {ops[1]} read {v} of key {key}, whose send {ops[0]} failed"
    if check == "lost-write":
        return (
            f"key {key} value {v} (offset {offsets[0]}, sent by op {ops[0]}) was never read by an "
            f"ok poll, though offset {offsets[1]} past it was"
        )
    if check == "unseen":
        return f"key {key} value {v} (sent ok by op {ops[0]}) was never polled"
    if check == "precommitted-read":
        return f"op {ops[0]} polled {v} of key {key}, which it sent itself before committing"
    if check in ("G0", "G1c-ww", "G1c"):
        steps = []
        for text in values:
            e = json.loads(text)
            shown = " then ".join(json.dumps(x) for x in e["values"])
            steps.append(f"{e['from']} {e['type']} {e['to']} (key {e['key']}: {shown})")
        ring = " -> ".join(str(o) for o in (*ops, ops[0]))
        return f"ops {ring}: {'; '.join(steps)}"
    if check == "torn-transaction":
        entries = [json.loads(t) for t in values]
        kept = ", ".join(
            f"{json.dumps(e['value'])} (key {e['key']})" for e in entries if e["present"]
        )
        lost = ", ".join(
            f"{json.dumps(e['value'])} (key {e['key']})" for e in entries if not e["present"]
        )
        return f"txn {ops[0]}: {kept} in the final reads, {lost} not"
    if check == "no-loss":
        if not offsets:
            return f"key {key} value {v} (send {ops[0]}) is not in the final reads"
        what = f"holds {extra}" if extra else "was not read"
        return (
            f"key {key} value {v} (send {ops[0]}, offset {offsets[0]}) is not in the final "
            f"reads: offset {offsets[0]} {what}"
        )
    delta = int(extra or 0)
    a, b = values
    moved = f"skipping {delta - 1} record(s)" if delta > 1 else f"back {1 - delta} record(s)"
    if check.startswith("int-"):
        return f"op {ops[0]} {check.split('-')[-1]}s {a} then {b} of key {key}: {moved}"
    verb = "polled" if check.endswith("poll") else "sent"
    return f"ops {ops[0]} then {ops[1]} {verb} {a} then {b} of key {key}: {moved}"


def check_queue_runs(
    ops: DataFrame,
    history: DataFrame,
    folders: Mapping[str, Path] | None = None,
    subscribed: Mapping[str, bool] | None = None,
    records: QueueRecords | None = None,
) -> list[CheckResult]:
    """The queue checks' results over the queue runs of ``ops``/``history``.

    A check is allowed in a run (Jepsen's ``allowed-error-types``): its
    anomalies there are counted in ``detail.allowed`` and do not make the
    run invalid; the others are counted per run in ``detail.by_run``, so
    that each run's verdict is its own whatever the listing of the first
    ``MAX_ANOMALIES`` holds (each run's first anomaly, then each run's
    second, and so on).  ``no-loss`` is ``unknown`` for a run with no final
    reads (listed in ``detail.undecided``).  ``folders`` are the runs' folders,
    whose ``summary.json`` says where their final polls start, and, with
    ``config.json``, what their topics' retention or compaction may have
    removed (:func:`cleanup_of`) and how their consumers read
    (:func:`isolation_of`: reading uncommitted records, ``precommitted-read``
    and ``G1c`` are allowed).  ``records``: ``ops``'s SENDS and READS,
    if already parsed (:func:`queue_records`).

    Two jobs: the runs (and which subscribe), then every check's count and
    first anomalies in one pass over the anomaly rows."""
    # One job for the runs and whether each subscribes.
    run_rows = (
        ops.groupBy("run")
        .agg(
            F.max((F.col("f") == "subscribe").cast("int")).alias("sub"),
            F.max((F.col("f") == "txn").cast("int")).alias("txn"),
        )
        .collect()
    )
    runs = [r.run for r in run_rows]
    txn_runs = sorted(r.run for r in run_rows if r.txn)
    if subscribed is None:
        subs = {r.run for r in run_rows if r.sub}
    else:
        subs = {r for r, s in subscribed.items() if s}
    given = {}
    cleanup: dict[str, RunCleanup] = {}
    isolation: dict[str, str] = {}
    for name, folder in (folders or {}).items():
        if folder.is_dir():
            isolation[name] = isolation_of(folder)
        start = final_polls_from(folder) if folder.is_dir() else None
        if start is not None:
            given[name] = start
        removed = cleanup_of(folder) if folder.is_dir() else None
        if removed is not None:
            cleanup[name] = removed
    rows = queue_anomaly_rows(ops, history, given, cleanup, records, isolation, txn_runs)
    # One pass (the anomaly rows' plan is computed once, not once for the
    # counts and again for the first anomalies): each run's first anomalies
    # of each check (_m), the first of them carrying that run's count of
    # the check (_c), which also gives every run with final reads (its
    # marker row, check "").  The cap is per run: a run with more anomalies
    # than the listing holds must not crowd the others out of it.
    order = ("run", "key", "ops", "values", "offsets")
    per_check_run = Window.partitionBy("check", "run")
    ranked = rows.select(
        "*",
        F.row_number().over(per_check_run.orderBy(*order)).alias("_m"),
        F.count("*").over(per_check_run).alias("_c"),
    )
    kept = ranked.where(F.col("_m") <= MAX_ANOMALIES).collect()
    counts = [r for r in kept if r._m == 1]
    final_runs = {r.run for r in counts if r.check == ""}
    per: dict[str, list[Anomaly]] = {c: [] for c in QUEUE_CHECKS}
    total: dict[str, int] = dict.fromkeys(QUEUE_CHECKS, 0)
    by_run: dict[str, dict[str, int]] = {c: {} for c in QUEUE_CHECKS}
    allowed: dict[str, dict[str, int]] = {c: {} for c in QUEUE_CHECKS}

    def is_allowed(check: str, run: str) -> bool:
        return (
            check in ALWAYS_ALLOWED
            or (check in SUBSCRIBE_ALLOWED and run in subs)
            or (check in READ_UNCOMMITTED_ALLOWED and isolation.get(run) != "read_committed")
        )

    for r in counts:
        if r.check not in total:
            continue
        if is_allowed(r.check, r.run):
            allowed[r.check][r.run] = r._c
        else:
            total[r.check] += r._c
            by_run[r.check][r.run] = r._c
    # The listing takes every run's first anomaly, then every run's second,
    # and so on up to MAX_ANOMALIES, shown in (run, key, ...) order.
    chosen: dict[str, list[Any]] = {c: [] for c in QUEUE_CHECKS}
    for r in sorted(kept, key=lambda r: (r._m, r.run)):
        if r.check not in per or is_allowed(r.check, r.run):
            continue
        if len(chosen[r.check]) < MAX_ANOMALIES:
            chosen[r.check].append(r)
    for c, picked in chosen.items():
        for r in sorted(picked, key=lambda r: (r.run, r._m)):
            values = [json.loads(v) for v in r["values"]]
            per[c].append(
                Anomaly(
                    check=r.check,
                    kind=r.check,
                    message=_message(r.check, r.key, r["values"], r.offsets, r.ops, r.extra),
                    run=r.run,
                    key=r.key,
                    witness=(
                        {
                            "values": values,
                            "offsets": list(r.offsets),
                            "ops": list(r.ops),
                            **(
                                {"processes": (r.extra or "").split(",")}
                                if r.check in GROUP_CHECKS
                                else {}
                            ),
                        },
                    ),
                )
            )
    undecided = sorted(set(runs) - final_runs)
    out: list[CheckResult] = []
    for c in QUEUE_CHECKS:
        detail: dict[str, Any] = {"runs": len(runs)}
        if allowed[c]:
            detail["allowed"] = allowed[c]
        if by_run[c]:
            detail["by_run"] = by_run[c]
        if c == "no-loss":
            detail["undecided"] = undecided
        out.append(
            result_of(
                c,
                per[c],
                count=total[c],
                unknown=c == "no-loss" and bool(undecided),
                detail=detail,
            )
        )
    return out

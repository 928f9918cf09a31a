"""The brokers' partition checks and per-partition series, as Spark jobs.

The same checks, with the same definitions, as the pure reference
``history.partition_checks`` (``docs/verification.md``, "Partition
checks"), over the node exports a run with brokers writes
(``docs/history-format.md``, "Brokers' partitions"): each broker's
``partitions.jsonl``, ``partition_state.jsonl`` and
``partition_timeline.jsonl``, each controller's ``partition_changes.jsonl``
and ``broker_registrations.jsonl``.

- ``replica-divergence``: a group-by over (run, partition, offset) of the
  records below each replica's own highest HW (a join with the HWs);
- ``hw-regression`` and ``epoch-regression``: a ``lag`` over each replica's
  timeline in log order;
- ``truncated-committed``: each truncation joined with its replica's earlier
  HWs of the same life, less those at or after an unclean election the
  controllers committed;
- ``log-start-above-hw``: a filter of the state lines;
- ``ineligible-isr``: each broker a committed change brought into an ISR
  (``array_except`` with the ISR of the partition's change before it, a
  ``lag`` in log order per controller) joined with that controller's
  latest registration line below the change's offset (``max_by``), kept
  when not registered, fenced or in controlled shutdown; one row per
  (partition, broker, offset) whichever controllers committed it.

:func:`partition_plots` draws the data of the report's per-partition plots:
HW and LEO over time per replica, ISR size (the leader's) and consumer lag
(from the history), each reduced to at most one point per time bucket.
Only counts, the first anomalies and the reduced series reach the driver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from spark_verify.queue import QueueRecords, reads_of, sends_of
from spark_verify.verdict import MAX_ANOMALIES, Anomaly, CheckResult, result_of

__all__ = [
    "PARTITION_CHECKS",
    "PartitionFrames",
    "PartitionPlot",
    "Series",
    "check_partition_runs",
    "load_partition_exports",
    "partition_anomaly_rows",
    "partition_plots",
]

# As history.partition_checks (spark_verify reads the same files without importing it).
PARTITION_CHECKS: Final = (
    "replica-divergence",
    "hw-regression",
    "epoch-regression",
    "truncated-committed",
    "log-start-above-hw",
    "ineligible-isr",
)

_SCHEMAS: Final = {
    "records": (
        "partitions.jsonl",
        "node bigint, topic string, partition bigint, offset bigint, epoch bigint,"
        " producer_id bigint, sequence bigint, control boolean, hash string",
    ),
    "states": (
        "partition_state.jsonl",
        "node bigint, topic string, partition bigint, high_watermark bigint,"
        " log_end_offset bigint, stopped_at string",
    ),
    "timeline": (
        "partition_timeline.jsonl",
        "node bigint, seq bigint, life bigint, time bigint, topic string, partition bigint,"
        " event string, leader_epoch bigint, role string, leader bigint, high_watermark bigint,"
        " log_end_offset bigint, log_start_offset bigint, isr array<bigint>,"
        " truncated_from bigint, truncated_to bigint",
    ),
    "changes": (
        "partition_changes.jsonl",
        "node bigint, offset bigint, epoch bigint, topic string, partition bigint,"
        " leader bigint, leader_epoch bigint, partition_epoch bigint, isr array<bigint>,"
        " elr array<bigint>, leader_recovery_state string, unclean boolean",
    ),
    "registrations": (
        "broker_registrations.jsonl",
        "node bigint, offset bigint, epoch bigint, broker bigint, event string,"
        " broker_epoch bigint, fenced boolean, in_controlled_shutdown boolean",
    ),
}

_TP: Final = ("run", "topic", "partition")


@dataclass(frozen=True, slots=True)
class PartitionFrames:
    """The partition exports of some runs, a ``run`` column first in each;
    ``runs`` are the runs that exported brokers' partitions."""

    records: DataFrame
    states: DataFrame
    timeline: DataFrame
    changes: DataFrame
    registrations: DataFrame
    runs: tuple[str, ...]


def load_partition_exports(spark: SparkSession, folders: Mapping[str, Path]) -> PartitionFrames:
    """Every ``nodes/<id>/`` partition export of the run folders ``folders``
    (run name -> folder), read with the files' schemas (a field missing
    from a line is null)."""
    frames: dict[str, DataFrame] = {}
    runs: set[str] = set()
    for name, (file, ddl) in _SCHEMAS.items():
        parts = []
        for run, folder in sorted(folders.items()):
            paths = sorted(str(p) for p in (folder / "nodes").glob(f"*/{file}"))
            if not paths:
                continue
            if name not in ("changes", "registrations"):
                runs.add(run)
            parts.append(spark.read.schema(ddl).json(paths).select(F.lit(run).alias("run"), "*"))
        df = spark.createDataFrame([], f"run string, {ddl}")
        for part in parts:
            df = df.unionByName(part)
        frames[name] = df
    return PartitionFrames(**frames, runs=tuple(sorted(runs)))


def _regression(
    check: str, events: DataFrame, window: WindowSpec, column: str, *, same_life: bool
) -> DataFrame:
    """A state line whose ``column`` is below the one of the state line just
    before it (of the same process life if ``same_life``): one row each."""
    prev = F.lag(F.struct("event", "life", "seq", "time", column)).over(window)
    found = F.col("event") == "state"
    found &= F.col("p.event") == "state"
    if same_life:
        found &= F.col("p.life") == F.col("life")
    found &= F.col(column) < F.col(f"p.{column}")
    rows = (
        events.select("*", prev.alias("p"))
        .where(found)
        .select("*", F.to_json(F.array("p.time", "time")).alias("times"))
    )
    return _rows(
        check,
        rows,
        F.array("node"),
        F.array(f"p.{column}", column),
        F.array("p.seq", "seq"),
        F.col("times"),
    )


def _rows(
    check: str,
    df: DataFrame,
    nodes: Column,
    offsets: Column,
    seqs: Column,
    extra: Column,
) -> DataFrame:
    return df.select(
        "run",
        F.lit(check).alias("check"),
        "topic",
        "partition",
        nodes.cast("array<bigint>").alias("nodes"),
        offsets.cast("array<bigint>").alias("offsets"),
        seqs.cast("array<bigint>").alias("seqs"),
        extra.cast("string").alias("extra"),
    )


def partition_anomaly_rows(frames: PartitionFrames) -> DataFrame:
    """Every partition anomaly, one row each: run, check, topic, partition,
    nodes, offsets (or HWs, epochs), seqs (timeline lines), extra (JSON)."""
    records, timeline = frames.records, frames.timeline
    states = timeline.where(F.col("event") == "state")
    none = F.array().cast("array<bigint>")
    out: list[DataFrame] = []

    # replica-divergence: each replica below its own highest HW.
    own = (
        states.select(*_TP, "node", "high_watermark")
        .unionByName(frames.states.select(*_TP, "node", "high_watermark"))
        .groupBy(*_TP, "node")
        .agg(F.max("high_watermark").alias("own"))
    )
    below = records.join(own, [*_TP, "node"]).where(F.col("offset") < F.col("own"))
    held = F.struct("node", "epoch", "producer_id", "sequence", "hash")
    div = (
        below.groupBy(*_TP, "offset")
        .agg(
            F.countDistinct("hash", "epoch", "producer_id", "sequence").alias("versions"),
            F.sort_array(F.collect_set("node")).alias("nodes"),
            F.to_json(F.sort_array(F.collect_list(held))).alias("held"),
        )
        .where(F.col("versions") > 1)
    )
    out.append(
        _rows("replica-divergence", div, F.col("nodes"), F.array("offset"), none, F.col("held"))
    )

    # hw-regression: the event just before a state line of the same replica
    # is a state of the same life with a higher HW (a truncation, a
    # follower log restart or a removal between them starts the series
    # again).
    w = Window.partitionBy(*_TP, "node").orderBy("seq")
    out.append(_regression("hw-regression", timeline, w, "high_watermark", same_life=True))

    # epoch-regression: the same over the state lines with an epoch and the
    # removals, across lives.
    epochs = timeline.where(
        ((F.col("event") == "state") & (F.col("leader_epoch") >= 0)) | (F.col("event") == "removed")
    )
    out.append(_regression("epoch-regression", epochs, w, "leader_epoch", same_life=False))

    # truncated-committed: below the replica's own earlier HW of that life,
    # with no unclean election at or before the truncation's epoch.
    cuts = timeline.where(F.col("event") == "truncate").alias("t")
    earlier = states.select(
        *_TP,
        "node",
        "life",
        F.col("seq").alias("s_seq"),
        F.col("high_watermark").alias("s_hw"),
    )
    committed = (
        cuts.join(earlier, [*_TP, "node", "life"], "left")
        .where(F.col("s_seq").isNull() | (F.col("s_seq") < F.col("seq")))
        .groupBy(*_TP, "node", "seq", "time", "leader_epoch", "truncated_from", "truncated_to")
        .agg(F.coalesce(F.max("s_hw"), F.lit(-1)).alias("committed"))
    )
    unclean = (
        frames.changes.where(F.col("unclean"))
        .groupBy(*_TP)
        .agg(F.min("leader_epoch").alias("unclean_epoch"))
    )
    cut = (
        committed.where(F.col("truncated_to") < F.col("committed"))
        .join(unclean, list(_TP), "left")
        .where(F.col("unclean_epoch").isNull() | (F.col("unclean_epoch") > F.col("leader_epoch")))
        .select(
            "*",
            F.to_json(F.array("truncated_from", "leader_epoch", "time")).alias("info"),
        )
    )
    out.append(
        _rows(
            "truncated-committed",
            cut,
            F.array("node"),
            F.array("truncated_to", "committed"),
            F.array("seq"),
            F.col("info"),
        )
    )

    # log-start-above-hw: a state line whose log start passed its HW
    # (UnifiedLog.deletableSegments keeps the log start at or below it).
    above = states.where(F.col("log_start_offset") > F.col("high_watermark"))
    out.append(
        _rows(
            "log-start-above-hw",
            above,
            F.array("node"),
            F.array("log_start_offset", "high_watermark"),
            F.array("seq"),
            F.to_json(F.array("time")),
        )
    )
    out.append(_ineligible_isr(frames.changes, frames.registrations))
    result = out[0]
    for df in out[1:]:
        result = result.unionByName(df)
    return result


def _ineligible_isr(changes: DataFrame, registrations: DataFrame) -> DataFrame:
    """ineligible-isr: brokers a committed change brought into an ISR while
    not registered, fenced or in controlled shutdown (KIP-841, KIP-903), by
    each controller's own registrations (a controller with none is not
    judged)."""
    w = Window.partitionBy("run", "node", "topic", "partition").orderBy("offset")
    prev = F.lag(F.struct("partition_epoch", "isr")).over(w)
    later = F.col("p").isNotNull() & (F.col("partition_epoch") > F.col("p.partition_epoch"))
    # A new partition (no change before it, or created again): every member joins.
    joined = F.when(later, F.array_except("isr", "p.isr")).otherwise(F.col("isr"))
    added = (
        changes.select(
            "run", "node", "topic", "partition", "offset", "partition_epoch", "isr", prev.alias("p")
        )
        .select(
            "run", "node", "topic", "partition", "offset", "isr", F.explode(joined).alias("broker")
        )
        .join(registrations.select("run", "node").distinct(), ["run", "node"])
    )
    regs = registrations.select(
        "run",
        "node",
        "broker",
        F.col("offset").alias("r_offset"),
        F.struct("event", "broker_epoch", "fenced", "in_controlled_shutdown").alias("r"),
    )
    on = ["run", "node", "broker"]
    latest = (
        added.alias("a")
        .join(
            regs.alias("g"),
            [F.col(f"a.{c}") == F.col(f"g.{c}") for c in on]
            + [F.col("g.r_offset") < F.col("a.offset")],
            "left",
        )
        .groupBy(*(F.col(f"a.{c}").alias(c) for c in (*on, "topic", "partition", "offset", "isr")))
        .agg(F.max_by("g.r", "g.r_offset").alias("reg"))
    )
    epoch = F.col("reg.broker_epoch").cast("string")
    why = (
        F.when(
            F.col("reg").isNull() | (F.col("reg.event") == "unregister"),
            F.lit("was not registered"),
        )
        .when(F.col("reg.fenced"), F.concat(F.lit("was fenced (broker epoch "), epoch, F.lit(")")))
        .when(
            F.col("reg.in_controlled_shutdown"),
            F.concat(F.lit("was in controlled shutdown (broker epoch "), epoch, F.lit(")")),
        )
    )
    found = (
        latest.select("*", why.alias("why"))
        .where(F.col("why").isNotNull())
        .groupBy("run", "topic", "partition", "broker", "offset")
        .agg(F.min_by(F.struct("why", "isr"), "node").alias("w"))
    )
    return _rows(
        "ineligible-isr",
        found,
        F.array("broker"),
        F.array("offset"),
        F.array().cast("array<bigint>"),
        F.to_json(F.struct("w.why", "w.isr")),
    )


def _message(check: str, tp: str, nodes: Sequence[int], offsets: Sequence[int], extra: str) -> str:
    info: Any = json.loads(extra) if extra else None
    if check == "replica-divergence":
        held = "; ".join(
            f"node {h['node']}: epoch {h['epoch']}, producer {h['producer_id']} sequence "
            f"{h['sequence']}, hash {str(h['hash'])[:12]}"
            for h in info or ()
        )
        return (
            f"{tp} offset {offsets[0]}, below the HW of each replica shown, differs between "
            f"replicas: {held}"
        )
    if check in ("hw-regression", "epoch-regression"):
        word = "HW" if check == "hw-regression" else "leader epoch"
        a, b = offsets
        return (
            f"node {nodes[0]}'s {word} of {tp} went from {a} down to {b} "
            f"(at {info[0] / 1e9:.3f} s and {info[1] / 1e9:.3f} s)"
        )
    if check == "ineligible-isr":
        return (
            f"the controllers brought broker {nodes[0]} into the ISR {list(info['isr'])} of "
            f"{tp} at metadata offset {offsets[0]} while it {info['why']}: only a registered, "
            f"unfenced broker not in controlled shutdown may join an ISR (KIP-841, KIP-903)"
        )
    if check == "log-start-above-hw":
        start, hw = offsets
        return (
            f"node {nodes[0]}'s log start offset of {tp} is {start}, above its HW {hw} "
            f"(at {info[0] / 1e9:.3f} s): records removed before they were committed"
        )
    frm, epoch, when = info
    to, committed = offsets
    return (
        f"node {nodes[0]} truncated {tp} from {frm} to {to} in leader epoch {epoch} at "
        f"{when / 1e9:.3f} s, below the committed HW {committed}, with no unclean election "
        "recorded"
    )


def check_partition_runs(
    spark: SparkSession, folders: Mapping[str, Path], frames: PartitionFrames | None = None
) -> list[CheckResult]:
    """The partition checks' results over the run folders ``folders``; not
    applicable when none of them exported brokers' partitions."""
    if frames is None:
        frames = load_partition_exports(spark, folders)
    if not frames.runs:
        na = {"applicable": False, "reason": "no brokers' partition exports"}
        return [result_of(c, [], detail=na) for c in PARTITION_CHECKS]
    rows = partition_anomaly_rows(frames)
    # One pass over the anomaly rows: each check's first anomalies and its
    # count (_c), not a second job computing the rows again for the counts.
    by_check = Window.partitionBy("check")
    w = by_check.orderBy("run", "topic", "partition", "nodes", "offsets", "seqs")
    kept = (
        rows.select(
            "*", F.row_number().over(w).alias("_n"), F.count("*").over(by_check).alias("_c")
        )
        .where(F.col("_n") <= MAX_ANOMALIES)
        .collect()
    )
    counts = {r.check: r._c for r in kept}
    per: dict[str, list[Anomaly]] = {c: [] for c in PARTITION_CHECKS}
    for r in sorted(kept, key=lambda r: r._n):
        tp = f"{r.topic}-{r.partition}"
        nodes, offsets, seqs = list(r.nodes), list(r.offsets), list(r.seqs)
        per[r.check].append(
            Anomaly(
                check=r.check,
                kind=r.check,
                message=_message(r.check, tp, nodes, offsets, r.extra),
                run=r.run,
                key=tp,
                node=nodes[0] if len(nodes) == 1 else None,
                witness=({"nodes": nodes, "offsets": offsets, "seqs": seqs},),
            )
        )
    detail = {"runs": len(frames.runs)}
    return [
        result_of(c, per[c], count=int(counts.get(c, 0)), detail=dict(detail))
        for c in PARTITION_CHECKS
    ]


# -- the report's per-partition plots ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a plot: its name and its (seconds, value) points in time order."""

    name: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class PartitionPlot:
    """One partition of one run: HW and LEO per replica, the leader's ISR
    size, and the consumer lag (``key``: its queue key, if the run says)."""

    run: str
    topic: str
    partition: int
    key: str | None
    hw: tuple[Series, ...]
    leo: tuple[Series, ...]
    isr: Series
    lag: Series

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


def _keys(folder: Path) -> dict[str, tuple[str, int]]:
    """Queue key -> (topic, partition), from config.json's ``queue.topics``
    (as ``history.queue.KeyMap``: keys count the topics' partitions in order)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    topics = (config.get("queue") or {}).get("topics") if isinstance(config, dict) else None
    out: dict[str, tuple[str, int]] = {}
    start = 0
    for t in topics or ():
        if not (isinstance(t, dict) and isinstance(t.get("partitions"), int)):
            return {}
        for p in range(t["partitions"]):
            out[str(start + p)] = (str(t.get("name")), p)
        start += t["partitions"]
    return out


def _points(rows: Sequence[Any], value: str) -> tuple[tuple[float, float], ...]:
    return tuple((r.t / 1e9, float(r[value])) for r in sorted(rows, key=lambda r: r.t))


def partition_plots(
    frames: PartitionFrames,
    ops: DataFrame,
    folders: Mapping[str, Path],
    buckets: int = 200,
    records: QueueRecords | None = None,
) -> dict[str, list[PartitionPlot]]:
    """Each run's partitions' series (run -> partitions in name order), at
    most one point per series per bucket of the run's timeline (the last
    one in it).  Consumer lag: at each ok poll that returned records of a
    key, the end of the records acknowledged by ok sends completed before
    it, less where the poll got to (never below 0).  ``records``: the
    SENDS and READS of ``ops``, if already parsed (``queue.queue_records``)."""
    if not frames.runs:
        return {}
    timeline = frames.timeline.where(F.col("run").isin(*frames.runs))
    ends = timeline.groupBy("run").agg(F.max("time").alias("run_end"))
    width = F.greatest(F.col("run_end") / buckets, F.lit(1.0))
    states = (
        timeline.where(F.col("event") == "state")
        .join(ends, "run")
        .select("*", F.floor(F.col("time") / width).alias("bucket"))
    )
    last = F.struct("time", "seq")
    per_replica = (
        states.groupBy(*_TP, "node", "bucket")
        .agg(
            F.max("time").alias("t"),
            F.max_by("high_watermark", last).alias("hw"),
            F.max_by("log_end_offset", last).alias("leo"),
        )
        .collect()
    )
    isr = (
        states.where(F.col("role") == "leader")
        .groupBy(*_TP, "bucket")
        .agg(F.max("time").alias("t"), F.max_by(F.size("isr"), last).alias("isr"))
        .collect()
    )
    lag_rows = _lag(ops.where(F.col("run").isin(*frames.runs)), ends, buckets, records)
    keys = {run: _keys(folder) for run, folder in folders.items()}

    grouped: dict[tuple[str, str, int], dict[str, Any]] = {}

    def slot(run: str, topic: str, partition: int) -> dict[str, Any]:
        return grouped.setdefault(
            (run, topic, partition), {"hw": {}, "leo": {}, "isr": [], "lag": [], "key": None}
        )

    for r in per_replica:
        s = slot(r.run, r.topic, r.partition)
        s["hw"].setdefault(r.node, []).append(r)
        s["leo"].setdefault(r.node, []).append(r)
    for r in isr:
        slot(r.run, r.topic, r.partition)["isr"].append(r)
    for r in lag_rows:
        tp = keys.get(r.run, {}).get(r.key)
        if tp is None:
            continue
        s = slot(r.run, *tp)
        s["lag"].append(r)
        s["key"] = r.key
    for (run, topic, partition), s in grouped.items():
        if s["key"] is None:
            s["key"] = next(
                (k for k, tp in keys.get(run, {}).items() if tp == (topic, partition)), None
            )
    out: dict[str, list[PartitionPlot]] = {}
    for (run, topic, partition), s in sorted(grouped.items()):
        out.setdefault(run, []).append(
            PartitionPlot(
                run,
                topic,
                partition,
                s["key"],
                tuple(
                    Series(f"broker {n} HW", _points(rows, "hw"))
                    for n, rows in sorted(s["hw"].items())
                ),
                tuple(
                    Series(f"broker {n} LEO", _points(rows, "leo"))
                    for n, rows in sorted(s["leo"].items())
                ),
                Series("ISR size", _points(s["isr"], "isr")),
                Series("consumer lag", _points(s["lag"], "lag")),
            )
        )
    return out


def _lag(
    ops: DataFrame, ends: DataFrame, buckets: int, records: QueueRecords | None = None
) -> list[Any]:
    """Per (run, key, bucket): the largest lag of an ok poll (see :func:`partition_plots`)."""
    if records is None:
        records = QueueRecords(
            sends_of(ops.where(F.col("f") == "send")), reads_of(ops.where(F.col("f") == "poll"))
        )

    def times(f: str) -> DataFrame:
        # The ops of ``f`` alone (the records' txn ops are not these).
        return ops.where(F.col("f") == f).select(
            "run", F.col("index").alias("op"), F.col("ret").alias("t")
        )

    sent = (
        records.sends.where((F.col("type") == "ok") & F.col("offset").isNotNull())
        .join(times("send"), ["run", "op"])
        .groupBy("run", "key", "op", "t")
        .agg((F.max("offset") + 1).alias("end"))
        .select(
            "run",
            "key",
            "t",
            F.lit(0).alias("order"),
            "end",
            F.lit(None).cast("bigint").alias("at"),
        )
    )
    polled = (
        records.reads.where((F.col("type") == "ok") & F.col("offset").isNotNull())
        .join(times("poll"), ["run", "op"])
        .groupBy("run", "key", "op", "t")
        .agg((F.max("offset") + 1).alias("at"))
        .select(
            "run",
            "key",
            "t",
            F.lit(1).alias("order"),
            F.lit(None).cast("bigint").alias("end"),
            "at",
        )
    )
    w = (
        Window.partitionBy("run", "key")
        .orderBy("t", "order")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    events = sent.unionByName(polled).where(F.col("t").isNotNull())
    lags = (
        events.select("*", F.coalesce(F.max("end").over(w), F.lit(0)).alias("produced"))
        .where(F.col("order") == 1)
        .join(ends, "run")
        .select(
            "run",
            "key",
            "t",
            F.greatest(F.col("produced") - F.col("at"), F.lit(0)).alias("lag"),
            F.floor(F.col("t") / F.greatest(F.col("run_end") / buckets, F.lit(1.0))).alias(
                "bucket"
            ),
        )
    )
    return (
        lags.groupBy("run", "key", "bucket")
        .agg(F.max("t").alias("t"), F.max("lag").alias("lag"))
        .collect()
    )

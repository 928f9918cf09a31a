"""Checks of the node exports: what the nodes committed and how they elected.

Inputs are the shared tables of ``docs/history-format.md`` as Spark
DataFrames: LOG (each node's ``log.jsonl``, one row per line, ``seq`` the
0-based line number), CHANGES (each node's ``changes.jsonl``) and PAIRED (one
row per client operation, invoke and completion merged).  Many runs may be
checked together: every rule below holds within one ``run`` and never compares
rows of different runs.  All the work is Spark aggregations and joins in the
executors; the driver receives counts and the first ``MAX_ANOMALIES``
anomalies, each with a minimal witness: export lines as objects of their
columns (a line standing for several nodes adds ``nodes``, the sorted node
ids that have it), and history operations as PAIRED rows with ``value`` and
``result`` parsed from their JSON text.

Definitions (a *line* is one row of LOG or CHANGES; a *write* is an ``ok``
operation whose ``f`` is ``write``, ``cas``, ``delete``, ``put`` or
``append`` and that carries both ``offset`` and ``epoch``):

- ``single-leader``: at most one leader per epoch (Raft's Election Safety,
  Raft thesis §3.4; KRaft's leader epoch plays the term).  Kind
  ``two-leaders``: two or more nodes have a CHANGES line with role ``leader``
  in the same (run, epoch); witness, the first such line (lowest ``seq``) of
  each of those nodes; counted once per (run, epoch).  Kind
  ``leader-disagreement``: CHANGES lines of the same (run, epoch) name two
  or more different non-null ``leader`` values (on one node or on several);
  witness, for each value, its first line (lowest node, then ``seq``);
  counted once per (run, epoch), and not reported for an epoch already
  reported as ``two-leaders`` (whose leaders name themselves).
- ``epoch-order`` (kind ``epoch-order``): along one node's CHANGES lines in
  ``seq`` order, each line's epoch is at least the previous line's (epochs are
  durable, so this holds across restarts).  Each line whose epoch is below its
  predecessor's is one anomaly; witness, the two lines.  The same rule as
  ``chaos.exports.check_changes``' ``epoch-order``.
- ``log-agreement`` (kind ``committed-divergence``): all LOG lines at one
  (run, offset), of any node, have the same ``epoch`` and ``hash`` (Raft's
  State Machine Safety, thesis §3.6.3: a committed entry is never replaced).
  A *version* of an offset is one distinct (epoch, hash) found there; an
  offset with two or more versions is one anomaly, whatever the number of
  lines; witness, one line per version (its lowest node, then ``seq``) with
  ``nodes``, the nodes that have that version.  Two versions on one node
  count too (an exporter writes both records rather than hide one).
- ``high-watermark``: along one node's LOG lines in ``seq`` order (the order
  it committed them), each offset is strictly above the previous line's: a
  repeat or a decrease (kind ``offset-order``) means the high watermark went
  back or an offset was committed twice.  Gaps are allowed (ranges received
  as a snapshot).  When the offset does go up, the epoch must not go down
  (kind ``epoch-order``; a line breaking both rules is ``offset-order``).
  Each such line is one anomaly; witness, it and the line before it.  The
  same rules as ``chaos.exports.check_log``' ``offset-order`` and
  ``epoch-order``.
- ``lost-writes`` (kind ``lost-write``): every write of a ``register`` or
  ``kv`` run is in the final committed log: some node has a ``data`` line at
  the write's (run, offset) with the write's epoch.  In a ``log`` run, a
  write's value is a JSON list of records and record *i* must be a ``data``
  line at ``offset + i`` with the write's epoch and, as hash, the SHA-256 of
  the record's UTF-8 bytes.  A record is *checkable* if some node has any
  line at its offset; a checkable record with no matching line is lost (it
  was overwritten), and a write with a lost record is one anomaly (witness:
  the write, and every node's lines at its first lost record's offset).  A
  write none of whose records is checkable (every node got that range as a
  snapshot) is counted in ``detail["uncheckable"]``, never called lost.
- ``phantom-writes``: nothing is committed that no one wrote.  ``log`` runs:
  each distinct ``data`` (run, offset, epoch, hash) must be the hash of a
  record of some write operation (any PAIRED row with ``f`` ``write`` of
  that run) that did not ``fail``; a record of a ``fail`` write is kind
  ``failed-write-committed`` (witness: the line with ``nodes``, and the
  failed write), a record of no write at all is kind ``phantom-record``
  (witness: the line).  ``register``/``kv`` runs: an ``ok`` read with an
  ``offset`` and ``epoch`` must name a ``data`` line of some node (same
  offset and epoch), else kind ``phantom-version`` (witness: the read and
  every node's lines at that offset); a read whose offset no node has is
  counted as uncheckable.  ``topics`` runs carry no versions: a check of
  topics runs only is valid with ``detail["applicable"] = False``.
- ``version-forks`` (kind ``shared-version``): two writes naming the same
  (run, offset) are the same write: same ``key`` and same ``value`` (one
  record cannot be two writes; a value is unique per key by the contract).
  An offset named by writes of two or more different (key, value) pairs is
  one anomaly; witness, for each pair, its first write (lowest ``index``).
  Two writes of one key at different offsets (forks of a key's history) are
  the linearizability checker's matter.

``lost-writes`` and ``phantom-writes`` take the model of each run: a model
name for every run, or a mapping run -> model (a run missing from the
mapping is not checked by them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame, Row, Window
from pyspark.sql import functions as F

from spark_verify.verdict import MAX_ANOMALIES, Anomaly, CheckResult, result_of

__all__ = [
    "CHANGES_COLUMNS",
    "LOG_COLUMNS",
    "MODELS",
    "PAIRED_COLUMNS",
    "WRITE_FS",
    "check_epochs",
    "check_exports",
    "check_high_watermark",
    "check_log_agreement",
    "check_lost_writes",
    "check_phantom_writes",
    "check_single_leader",
    "check_version_collisions",
    "op_witness",
    "runs_of_models",
]

LOG_COLUMNS: Final = ("run", "node", "seq", "offset", "epoch", "kind", "hash")
CHANGES_COLUMNS: Final = ("run", "node", "seq", "time", "epoch", "leader", "role")
PAIRED_COLUMNS: Final = (
    "run",
    "key",
    "process",
    "f",
    "type",
    "index",
    "complete_index",
    "call",
    "ret",
    "value",
    "result",
    "error",
    "node",
    "offset",
    "epoch",
)
MODELS: Final = ("register", "kv", "log", "topics")
WRITE_FS: Final = ("write", "cas", "delete", "put", "append")
"""The ``f`` of operations that commit a record of their own."""

SINGLE_LEADER: Final = "single-leader"
EPOCH_ORDER: Final = "epoch-order"
LOG_AGREEMENT: Final = "log-agreement"
HIGH_WATERMARK: Final = "high-watermark"
LOST_WRITES: Final = "lost-writes"
PHANTOM_WRITES: Final = "phantom-writes"
VERSION_FORKS: Final = "version-forks"

Model = str | Mapping[str, str]


# -- pure helpers ---------------------------------------------------------------


def runs_of_models(model: Model, wanted: Iterable[str]) -> list[str] | None:
    """The runs whose model is one of ``wanted``: ``None`` means every run
    (``model`` is one name, among ``wanted``), ``[]`` none.  Refuses an
    unknown model name."""
    names = set(wanted)
    if isinstance(model, str):
        _known_model(model, "model")
        return None if model in names else []
    for run, m in model.items():
        _known_model(m, f"model of run {run!r}")
    return sorted(run for run, m in model.items() if m in names)


def _known_model(m: object, what: str) -> None:
    if m not in MODELS:
        raise ValueError(f"{what} must be one of {', '.join(MODELS)}, got {m!r}")


def _parse_json(text: object, what: str) -> Any:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{what} must be JSON text, got {text!r}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not JSON ({e}): {text!r}") from e


def op_witness(row: Mapping[str, Any]) -> dict[str, Any]:
    """A PAIRED row as a witness: its columns, ``value`` and ``result``
    parsed from their JSON text (SQL NULL is JSON null)."""
    out = dict(row)
    where = f"op {out.get('index')!r} of run {out.get('run')!r}"
    for name in ("value", "result"):
        out[name] = _parse_json(out.get(name), f"{name} of {where}")
    return out


def _nodes_text(nodes: Sequence[int]) -> str:
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    return "nodes " + ", ".join(str(n) for n in nodes[:-1]) + f" and {nodes[-1]}"


def _require(df: DataFrame, what: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what} lacks column(s) {', '.join(missing)} (has {', '.join(df.columns)})"
        )


# -- Spark plumbing -------------------------------------------------------------


def _struct(columns: Sequence[str]) -> Column:
    return F.struct(*[F.col(c) for c in columns])


def _dict(value: Any) -> dict[str, Any]:
    if isinstance(value, Row):
        return value.asDict(recursive=True)
    return dict(value)


@dataclass(frozen=True, slots=True)
class _Found:
    """The first anomalous rows of a DataFrame and how many there are by kind."""

    rows: list[Row]
    kinds: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


def _gather(df: DataFrame, order: Sequence[str], kind: str | Column) -> _Found:
    """The first ``MAX_ANOMALIES`` rows of ``df`` in ``order`` (one job, a
    top-k) and the count of each kind (a second job only when there may be
    more than were taken)."""
    kind_col = F.lit(kind) if isinstance(kind, str) else kind
    df = df.withColumn("_kind", kind_col)
    rows = df.orderBy(*order).limit(MAX_ANOMALIES).collect()
    if len(rows) < MAX_ANOMALIES:
        kinds: dict[str, int] = {}
        for r in rows:
            kinds[r["_kind"]] = kinds.get(r["_kind"], 0) + 1
    else:
        kinds = {r["_kind"]: r["count"] for r in df.groupBy("_kind").count().collect()}
    return _Found(rows, kinds)


def _counts(df: DataFrame, column: str) -> dict[str, int]:
    return {r[column]: r["count"] for r in df.groupBy(column).count().collect()}


def _filter_runs(df: DataFrame, runs: list[str] | None) -> DataFrame:
    return df if runs is None else df.where(F.col("run").isin(runs))


# -- elections ------------------------------------------------------------------


def check_single_leader(changes: DataFrame) -> CheckResult:
    """At most one leader per (run, epoch), and one leader named per epoch
    (the module's docstring defines both kinds)."""
    _require(changes, "CHANGES", CHANGES_COLUMNS)
    line = _struct(CHANGES_COLUMNS)
    leaders = (
        changes.where(F.col("role") == "leader")
        .groupBy("run", "epoch", "node")
        .agg(F.min_by(line, F.col("seq")).alias("line"))
        .groupBy("run", "epoch")
        .agg(F.count("*").alias("n"), F.collect_list("line").alias("lines"))
        .where(F.col("n") > 1)
    )
    told = (
        changes.where(F.col("leader").isNotNull())
        .groupBy("run", "epoch", "leader")
        .agg(F.min_by(line, F.struct("node", "seq")).alias("line"))
        .groupBy("run", "epoch")
        .agg(F.count("*").alias("n"), F.collect_list("line").alias("lines"))
        .where(F.col("n") > 1)
        .join(leaders.select("run", "epoch"), ["run", "epoch"], "left_anti")
    )
    both = leaders.withColumn("k", F.lit("two-leaders")).unionByName(
        told.withColumn("k", F.lit("leader-disagreement"))
    )
    found = _gather(both, ["run", "epoch", "k"], F.col("k"))
    anomalies = []
    for r in found.rows:
        lines = sorted((_dict(x) for x in r["lines"]), key=lambda d: (d["node"], d["seq"]))
        if r["k"] == "two-leaders":
            nodes = [d["node"] for d in lines]
            message = f"{_nodes_text(nodes)} were all leader of epoch {r['epoch']}"
        else:
            named = sorted({d["leader"] for d in lines})
            message = f"epoch {r['epoch']} has {len(named)} leaders named: {named}"
        anomalies.append(
            Anomaly(SINGLE_LEADER, r["k"], message, run=r["run"], witness=tuple(lines))
        )
    return result_of(SINGLE_LEADER, anomalies, count=found.total, detail={"kinds": found.kinds})


def _along(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Each line of ``df`` (as ``line``) with the line before it on the same
    node (``prev``, in ``seq`` order); the first line of a node has none."""
    w = Window.partitionBy("run", "node").orderBy("seq")
    line = _struct(columns)
    return df.select(line.alias("line"), F.lag(line).over(w).alias("prev")).where(
        F.col("prev").isNotNull()
    )


def check_epochs(changes: DataFrame) -> CheckResult:
    """A node's epoch never goes down along its CHANGES lines."""
    _require(changes, "CHANGES", CHANGES_COLUMNS)
    down = _along(changes, CHANGES_COLUMNS).where(F.col("line.epoch") < F.col("prev.epoch"))
    down = down.select("line", "prev", "line.run", "line.node", "line.seq")
    found = _gather(down, ["run", "node", "seq"], "epoch-order")
    anomalies = []
    for r in found.rows:
        prev, line = _dict(r["prev"]), _dict(r["line"])
        message = (
            f"node {line['node']}'s epoch went from {prev['epoch']} down to {line['epoch']} "
            f"(changes lines {prev['seq']} and {line['seq']})"
        )
        anomalies.append(
            Anomaly(
                EPOCH_ORDER,
                "epoch-order",
                message,
                run=line["run"],
                node=line["node"],
                witness=(prev, line),
            )
        )
    return result_of(EPOCH_ORDER, anomalies, count=found.total)


# -- committed logs -------------------------------------------------------------


def _versions(log: DataFrame) -> DataFrame:
    """One row per distinct (run, offset, epoch, hash) of LOG: ``line``, its
    first line (lowest node, then seq) with ``nodes``, the nodes that have it."""
    line = _struct(LOG_COLUMNS)
    return (
        log.groupBy("run", "offset", "epoch", "hash")
        .agg(
            F.min_by(line, F.struct("node", "seq")).alias("line"),
            F.array_sort(F.collect_set("node")).alias("nodes"),
        )
        .withColumn("line", F.col("line").withField("nodes", F.col("nodes")))
    )


def check_log_agreement(log: DataFrame) -> CheckResult:
    """No offset of a run is committed as two different records."""
    _require(log, "LOG", LOG_COLUMNS)
    split = (
        _versions(log)
        .groupBy("run", "offset")
        .agg(F.count("*").alias("n"), F.collect_list("line").alias("lines"))
        .where(F.col("n") > 1)
    )
    found = _gather(split, ["run", "offset"], "committed-divergence")
    anomalies = []
    for r in found.rows:
        lines = sorted((_dict(x) for x in r["lines"]), key=lambda d: (d["epoch"], d["hash"]))
        parts = "; ".join(
            f"epoch {d['epoch']} hash {d['hash'][:12]} on {_nodes_text(d['nodes'])}" for d in lines
        )
        message = f"offset {r['offset']} is committed as {len(lines)} different records: {parts}"
        anomalies.append(
            Anomaly(
                LOG_AGREEMENT, "committed-divergence", message, run=r["run"], witness=tuple(lines)
            )
        )
    return result_of(LOG_AGREEMENT, anomalies, count=found.total)


def check_high_watermark(log: DataFrame) -> CheckResult:
    """Along each node's log, offsets strictly increase and epochs never
    decrease (the rules of ``chaos.exports.check_log``)."""
    _require(log, "LOG", LOG_COLUMNS)
    back = F.col("line.offset") <= F.col("prev.offset")
    bad = (
        _along(log, LOG_COLUMNS)
        .where(back | (F.col("line.epoch") < F.col("prev.epoch")))
        .select(
            "line",
            "prev",
            "line.run",
            "line.node",
            "line.seq",
            F.when(back, F.lit("offset-order")).otherwise(F.lit("epoch-order")).alias("k"),
        )
    )
    found = _gather(bad, ["run", "node", "seq"], F.col("k"))
    anomalies = []
    for r in found.rows:
        prev, line = _dict(r["prev"]), _dict(r["line"])
        if r["k"] == "offset-order":
            message = (
                f"node {line['node']} committed offset {line['offset']} after offset "
                f"{prev['offset']}: its high watermark went back or it committed an offset twice"
            )
        else:
            message = (
                f"node {line['node']}'s offset {line['offset']} has epoch {line['epoch']}, "
                f"below offset {prev['offset']}'s {prev['epoch']}"
            )
        anomalies.append(
            Anomaly(
                HIGH_WATERMARK,
                r["k"],
                message,
                run=line["run"],
                node=line["node"],
                witness=(prev, line),
            )
        )
    return result_of(HIGH_WATERMARK, anomalies, count=found.total, detail={"kinds": found.kinds})


# -- writes against the logs ----------------------------------------------------


def _writes(ops: DataFrame) -> DataFrame:
    return ops.where(
        (F.col("type") == "ok")
        & F.col("f").isin(list(WRITE_FS))
        & F.col("offset").isNotNull()
        & F.col("epoch").isNotNull()
    )


def _log_records(ops: DataFrame) -> DataFrame:
    """Each record of each op of a ``log`` run (its ``value`` a JSON list of
    strings): ``i`` (position in the batch, NULL if the value is not a
    non-empty list) and ``want``, the SHA-256 of the record's UTF-8 bytes."""
    # The outer explode keeps an op whose value does not parse, so that it is
    # refused rather than skipped.  A string cast to binary is its UTF-8 bytes.
    return ops.select(
        "*", F.posexplode_outer(F.from_json("value", "array<string>")).alias("i", "rec")
    ).withColumn("want", F.sha2(F.col("rec").cast("binary"), 256))


def _refuse_malformed(records: DataFrame) -> None:
    bad = records.where(F.col("rec").isNull()).select("run", "index", "value").limit(1).collect()
    if bad:
        r = bad[0]
        raise ValueError(
            f"op {r['index']} of run {r['run']!r}, a write of the log model, has value "
            f"{r['value']!r}: not a non-empty JSON list of strings"
        )


def _offsets(log: DataFrame) -> DataFrame:
    """Per (run, offset) with any line: ``lines``, how many, and ``data``, the
    distinct (epoch, hash) of its ``data`` lines."""
    data = F.when(F.col("kind") == "data", F.struct("epoch", "hash"))
    return log.groupBy("run", "offset").agg(
        F.count("*").alias("lines"), F.collect_set(data).alias("data")
    )


def _lines_at(
    log: DataFrame, where: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Every LOG line at the given few (run, offset), by node then seq."""
    wanted = sorted(set(where))
    out: dict[tuple[str, int], list[dict[str, Any]]] = {w: [] for w in wanted}
    if not wanted:
        return out
    spark = log.sparkSession
    keys = spark.createDataFrame(wanted, schema="run string, offset long")
    rows = log.join(F.broadcast(keys), ["run", "offset"]).select(*LOG_COLUMNS).collect()
    for r in sorted(rows, key=lambda r: (r["run"], r["offset"], r["node"], r["seq"])):
        out[(r["run"], r["offset"])].append(r.asDict())
    return out


def _ops_at(
    ops: DataFrame, where: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], dict[str, Any]]:
    """The PAIRED rows of the given few (run, index), as witnesses."""
    wanted = sorted(set(where))
    if not wanted:
        return {}
    keys = ops.sparkSession.createDataFrame(wanted, schema="run string, index long")
    rows = ops.join(F.broadcast(keys), ["run", "index"]).select(*PAIRED_COLUMNS).collect()
    return {(r["run"], r["index"]): op_witness(r.asDict()) for r in rows}


@dataclass(frozen=True, slots=True)
class _Part:
    """One model's share of a check: its anomalies (the first few) and counts."""

    anomalies: list[Anomaly]
    count: int
    detail: Mapping[str, int]


def _merge(name: str, parts: Sequence[_Part], applicable: bool) -> CheckResult:
    anomalies = sorted(
        (a for p in parts for a in p.anomalies),
        key=lambda a: (a.run or "", _position(a)),
    )
    detail: dict[str, Any] = {"applicable": applicable}
    for p in parts:
        for k, v in p.detail.items():
            detail[k] = detail.get(k, 0) + v
    return result_of(name, anomalies, count=sum(p.count for p in parts), detail=detail)


def _position(a: Anomaly) -> int:
    """The first offset an anomaly's witness names (its op's, else its line's)."""
    for w in a.witness:
        if w.get("offset") is not None:
            return int(w["offset"])
    return -1


def _lost_part(ops: DataFrame, offsets: DataFrame, log: DataFrame, records: DataFrame) -> _Part:
    """``records``: run, index, offset (the record's), epoch, want (NULL: any hash)."""
    at = records.join(offsets, ["run", "offset"], "left")
    matches = F.exists(
        "data",
        lambda x: (
            (x["epoch"] == F.col("epoch")) & (F.col("want").isNull() | (x["hash"] == F.col("want")))
        ),
    )
    checkable = F.col("lines").isNotNull()
    per_record = at.select(
        "run",
        "index",
        "offset",
        checkable.alias("checkable"),
        (checkable & ~F.coalesce(matches, F.lit(False))).alias("lost"),
    )
    per_write = per_record.groupBy("run", "index").agg(
        F.max("checkable").alias("checkable"),
        F.min(F.when(F.col("lost"), F.col("offset"))).alias("lost_at"),
    )
    status = per_write.withColumn(
        "status",
        F.when(F.col("lost_at").isNotNull(), F.lit("lost"))
        .when(F.col("checkable"), F.lit("checked"))
        .otherwise(F.lit("uncheckable")),
    )
    counts = _counts(status, "status")
    lost = counts.get("lost", 0)
    anomalies: list[Anomaly] = []
    if lost:
        rows = (
            status.where(F.col("status") == "lost")
            .orderBy("run", "index")
            .limit(MAX_ANOMALIES)
            .collect()
        )
        op_of = _ops_at(ops, [(r["run"], r["index"]) for r in rows])
        lines_of = _lines_at(log, [(r["run"], r["lost_at"]) for r in rows])
        for r in rows:
            op = op_of[(r["run"], r["index"])]
            lines = lines_of[(r["run"], r["lost_at"])]
            found = sorted({(d["epoch"], d["kind"]) for d in lines})
            message = (
                f"ok {op['f']} of key {op['key']!r} (op {op['index']}, offset {op['offset']} "
                f"epoch {op['epoch']}) is not in the committed logs: offset {r['lost_at']} holds "
                + ", ".join(f"{k} of epoch {e}" for e, k in found)
            )
            anomalies.append(
                Anomaly(
                    LOST_WRITES,
                    "lost-write",
                    message,
                    run=r["run"],
                    key=op["key"],
                    witness=(op, *lines),
                )
            )
    detail = {
        "writes": sum(counts.values()),
        "checked": counts.get("checked", 0) + lost,
        "uncheckable": counts.get("uncheckable", 0),
    }
    return _Part(anomalies, lost, detail)


def check_lost_writes(ops: DataFrame, log: DataFrame, model: Model) -> CheckResult:
    """Every ok write is in some node's final committed log (the module's
    docstring defines it per model).  ``model``: one model for every run, or
    run -> model."""
    _require(ops, "PAIRED", PAIRED_COLUMNS)
    _require(log, "LOG", LOG_COLUMNS)
    regkv = runs_of_models(model, ("register", "kv"))
    logm = runs_of_models(model, ("log",))
    parts: list[_Part] = []
    if regkv is None or regkv or logm is None or logm:
        offsets = _offsets(log)
        writes = _writes(ops)
        if regkv is None or regkv:
            records = _filter_runs(writes, regkv).select(
                "run", "index", "offset", "epoch", F.lit(None).cast("string").alias("want")
            )
            parts.append(_lost_part(ops, offsets, log, records))
        if logm is None or logm:
            exploded = _log_records(_filter_runs(writes, logm))
            _refuse_malformed(exploded)
            records = exploded.select(
                "run", "index", (F.col("offset") + F.col("i")).alias("offset"), "epoch", "want"
            )
            parts.append(_lost_part(ops, offsets, log, records))
    return _merge(LOST_WRITES, parts, applicable=bool(parts))


def _phantom_records(ops: DataFrame, log: DataFrame, runs: list[str] | None) -> _Part:
    """``log`` runs: every distinct data line is a record of a write that did not fail."""
    data = _versions(_filter_runs(log, runs).where(F.col("kind") == "data"))
    exploded = _log_records(_filter_runs(ops, runs).where(F.col("f") == "write"))
    _refuse_malformed(exploded)
    by_hash = exploded.groupBy("run", F.col("want").alias("hash")).agg(
        F.max(F.col("type") != "fail").alias("good"),
        F.min(F.when(F.col("type") == "fail", F.col("index"))).alias("failed"),
    )
    status = data.join(by_hash, ["run", "hash"], "left").withColumn(
        "status",
        F.when(F.col("good"), F.lit("written"))
        .when(F.col("failed").isNotNull(), F.lit("failed-write-committed"))
        .otherwise(F.lit("phantom-record")),
    )
    counts = _counts(status, "status")
    bad = counts.get("failed-write-committed", 0) + counts.get("phantom-record", 0)
    anomalies: list[Anomaly] = []
    if bad:
        rows = (
            status.where(F.col("status") != "written")
            .orderBy("run", "offset", "epoch", "hash")
            .limit(MAX_ANOMALIES)
            .collect()
        )
        op_of = _ops_at(ops, [(r["run"], r["failed"]) for r in rows if r["failed"] is not None])
        for r in rows:
            line = _dict(r["line"])
            where = (
                f"the data record at offset {r['offset']} epoch {r['epoch']} "
                f"on {_nodes_text(line['nodes'])}"
            )
            if r["status"] == "failed-write-committed":
                op = op_of[(r["run"], r["failed"])]
                message = f"{where} is a record of op {op['index']}, a write that failed"
                witness: tuple[Mapping[str, Any], ...] = (op, line)
            else:
                message = f"{where} is a record of no write in the history"
                witness = (line,)
            anomalies.append(
                Anomaly(PHANTOM_WRITES, r["status"], message, run=r["run"], witness=witness)
            )
    detail = {"data_records": sum(counts.values()), "uncheckable": 0}
    return _Part(anomalies, bad, detail)


def _phantom_versions(ops: DataFrame, log: DataFrame, runs: list[str] | None) -> _Part:
    """``register``/``kv`` runs: an ok read's (offset, epoch) names a data line."""
    reads = _filter_runs(ops, runs).where(
        (F.col("type") == "ok")
        & (F.col("f") == "read")
        & F.col("offset").isNotNull()
        & F.col("epoch").isNotNull()
    )
    at = reads.select("run", "index", "offset", "epoch").join(
        _offsets(_filter_runs(log, runs)), ["run", "offset"], "left"
    )
    named = F.exists("data", lambda x: x["epoch"] == F.col("epoch"))
    status = at.withColumn(
        "status",
        F.when(F.col("lines").isNull(), F.lit("uncheckable"))
        .when(named, F.lit("checked"))
        .otherwise(F.lit("phantom")),
    )
    counts = _counts(status, "status")
    bad = counts.get("phantom", 0)
    anomalies: list[Anomaly] = []
    if bad:
        rows = (
            status.where(F.col("status") == "phantom")
            .orderBy("run", "index")
            .limit(MAX_ANOMALIES)
            .collect()
        )
        op_of = _ops_at(ops, [(r["run"], r["index"]) for r in rows])
        lines_of = _lines_at(log, [(r["run"], r["offset"]) for r in rows])
        for r in rows:
            op = op_of[(r["run"], r["index"])]
            lines = lines_of[(r["run"], r["offset"])]
            message = (
                f"ok read of key {op['key']!r} (op {op['index']}) names offset {op['offset']} "
                f"epoch {op['epoch']}, which no node has as a data record"
            )
            anomalies.append(
                Anomaly(
                    PHANTOM_WRITES,
                    "phantom-version",
                    message,
                    run=r["run"],
                    key=op["key"],
                    witness=(op, *lines),
                )
            )
    detail = {
        "reads": sum(counts.values()),
        "checked": counts.get("checked", 0) + bad,
        "uncheckable": counts.get("uncheckable", 0),
    }
    return _Part(anomalies, bad, detail)


def check_phantom_writes(ops: DataFrame, log: DataFrame, model: Model) -> CheckResult:
    """Nothing is committed that no one wrote (the module's docstring
    defines it per model; not applicable to ``topics``)."""
    _require(ops, "PAIRED", PAIRED_COLUMNS)
    _require(log, "LOG", LOG_COLUMNS)
    regkv = runs_of_models(model, ("register", "kv"))
    logm = runs_of_models(model, ("log",))
    parts: list[_Part] = []
    if logm is None or logm:
        parts.append(_phantom_records(ops, log, logm))
    if regkv is None or regkv:
        parts.append(_phantom_versions(ops, log, regkv))
    return _merge(PHANTOM_WRITES, parts, applicable=bool(parts))


def check_version_collisions(ops: DataFrame) -> CheckResult:
    """No (run, offset) is named by ok writes of two different (key, value)."""
    _require(ops, "PAIRED", PAIRED_COLUMNS)
    op = _struct(PAIRED_COLUMNS)
    shared = (
        _writes(ops)
        .groupBy("run", "offset", "key", F.coalesce(F.col("value"), F.lit("null")))
        .agg(F.min_by(op, F.col("index")).alias("op"))
        .groupBy("run", "offset")
        .agg(F.count("*").alias("n"), F.collect_list("op").alias("ops"))
        .where(F.col("n") > 1)
    )
    found = _gather(shared, ["run", "offset"], "shared-version")
    anomalies = []
    for r in found.rows:
        witness = sorted((op_witness(_dict(x)) for x in r["ops"]), key=lambda d: d["index"])
        named = ", ".join(f"op {w['index']} ({w['f']} of key {w['key']!r})" for w in witness)
        message = f"offset {r['offset']} is named by {len(witness)} different writes: {named}"
        anomalies.append(
            Anomaly(VERSION_FORKS, "shared-version", message, run=r["run"], witness=tuple(witness))
        )
    return result_of(VERSION_FORKS, anomalies, count=found.total)


# -- all of them ----------------------------------------------------------------

_Check = Callable[[], CheckResult]


def check_exports(
    ops: DataFrame, log: DataFrame, changes: DataFrame, model_by_run: Mapping[str, str]
) -> list[CheckResult]:
    """Every check of this module, over runs of any models (``model_by_run``
    names each run's; a run missing from it skips the model-dependent
    checks)."""
    runs_of_models(model_by_run, MODELS)  # refuses unknown models before any job
    versioned = runs_of_models(model_by_run, ("register", "kv", "log"))
    checks: list[_Check] = [
        lambda: check_single_leader(changes),
        lambda: check_epochs(changes),
        lambda: check_log_agreement(log),
        lambda: check_high_watermark(log),
        lambda: check_lost_writes(ops, log, model_by_run),
        lambda: check_phantom_writes(ops, log, model_by_run),
        lambda: check_version_collisions(_filter_runs(ops, versioned)),
    ]
    return [c() for c in checks]

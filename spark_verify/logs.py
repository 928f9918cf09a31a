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
  ``history.exports.check_changes``' ``epoch-order``.
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
  same rules as ``history.exports.check_log``' ``offset-order`` and
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
mapping is not checked by them); ``check_exports`` also gives
``version-forks`` only the runs of the ``register``, ``kv`` and ``log``
models.  A write of a ``log`` run whose value is not a non-empty JSON list
of strings is refused with a ``ValueError`` naming the op.

Finding is separate from showing: each check first finds its anomalies with
aggregates over narrow columns (a (run, offset) whose least and greatest
(epoch, hash) differ has two versions), counts them, and only then fetches
the lines or operations of the first ``MAX_ANOMALIES`` with a broadcast join.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, Window
from pyspark.sql import functions as F

from spark_verify.ops import KNOWN_MODELS, PAIRED_COLUMNS
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
    "first_per",
    "op_witness",
    "runs_of_models",
    "versions_of",
]

LOG_COLUMNS: Final = ("run", "node", "seq", "offset", "epoch", "kind", "hash")
CHANGES_COLUMNS: Final = ("run", "node", "seq", "time", "epoch", "leader", "role")
MODELS: Final = KNOWN_MODELS
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


# -- witnesses (pure) -----------------------------------------------------------


def first_per(
    rows: Iterable[Mapping[str, Any]], group: Sequence[str], order: Sequence[str]
) -> list[dict[str, Any]]:
    """For each distinct value of the ``group`` fields, its first row in
    ``order``; the result sorted by ``group``."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        g = tuple(row[c] for c in group)
        cur = best.get(g)
        if cur is None or tuple(row[c] for c in order) < tuple(cur[c] for c in order):
            best[g] = dict(row)
    return [best[g] for g in sorted(best, key=_sort_key)]


def _sort_key(values: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    # NULL (None) sorts first, as in Spark's ascending order.
    return tuple((v is not None, v) for v in values)


def versions_of(lines: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The versions of one offset: for each distinct (epoch, hash) among
    ``lines`` (LOG rows), its first line (lowest node, then seq) with
    ``nodes``, the sorted nodes that have it; sorted by (epoch, hash)."""
    lines = list(lines)
    out = first_per(lines, ("epoch", "hash"), ("node", "seq"))
    for v in out:
        v["nodes"] = sorted(
            {d["node"] for d in lines if (d["epoch"], d["hash"]) == (v["epoch"], v["hash"])}
        )
    return out


# -- Spark plumbing -------------------------------------------------------------


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


def _fetch(
    df: DataFrame, keys: Iterable[tuple[Any, ...]], by: Sequence[str], columns: Sequence[str]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """The rows of ``df`` (as dicts of ``columns``) whose ``by`` fields are one
    of the few ``keys``: a broadcast join, so one scan of ``df``."""
    wanted = sorted(set(keys), key=_sort_key)
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {k: [] for k in wanted}
    if not wanted:
        return out
    schema = df.select(*by).schema
    keys_df = df.sparkSession.createDataFrame(wanted, schema=schema)
    for r in df.join(F.broadcast(keys_df), list(by)).select(*columns).collect():
        d = r.asDict()
        out[tuple(d[c] for c in by)].append(d)
    return out


def _summary(log: DataFrame) -> DataFrame:
    """Per (run, offset) with any LOG line: ``lines``, how many; ``lo`` and
    ``hi``, the least and greatest (epoch, hash) there (equal if and only if
    every line agrees); ``data``, the distinct (epoch, hash) of its ``data``
    lines.  Shared by the log-agreement, lost-writes and phantom-writes
    checks (``check_exports`` computes it once)."""
    version = F.struct("epoch", "hash")
    return log.groupBy("run", "offset").agg(
        F.count("*").alias("lines"),
        F.min(version).alias("lo"),
        F.max(version).alias("hi"),
        F.collect_set(F.when(F.col("kind") == "data", version)).alias("data"),
    )


# -- elections ------------------------------------------------------------------


def check_single_leader(changes: DataFrame) -> CheckResult:
    """At most one leader per (run, epoch), and one leader named per epoch
    (the module's docstring defines both kinds)."""
    _require(changes, "CHANGES", CHANGES_COLUMNS)

    def spread(df: DataFrame, column: str) -> DataFrame:
        return (
            df.groupBy("run", "epoch")
            .agg(F.min(column).alias("lo"), F.max(column).alias("hi"))
            .where(F.col("lo") != F.col("hi"))
            .select("run", "epoch")
        )

    leaders = spread(changes.where(F.col("role") == "leader"), "node")
    told = spread(changes.where(F.col("leader").isNotNull()), "leader").join(
        leaders, ["run", "epoch"], "left_anti"
    )
    both = leaders.withColumn("k", F.lit("two-leaders")).unionByName(
        told.withColumn("k", F.lit("leader-disagreement"))
    )
    found = _gather(both, ["run", "epoch", "k"], F.col("k"))
    lines_of = _fetch(
        changes, [(r["run"], r["epoch"]) for r in found.rows], ("run", "epoch"), CHANGES_COLUMNS
    )
    anomalies = []
    for r in found.rows:
        lines = lines_of[(r["run"], r["epoch"])]
        if r["k"] == "two-leaders":
            witness = first_per((d for d in lines if d["role"] == "leader"), ("node",), ("seq",))
            nodes = [d["node"] for d in witness]
            message = f"{_nodes_text(nodes)} were all leader of epoch {r['epoch']}"
        else:
            told_lines = (d for d in lines if d["leader"] is not None)
            witness = first_per(told_lines, ("leader",), ("node", "seq"))
            witness.sort(key=lambda d: (d["node"], d["seq"]))
            named = sorted(d["leader"] for d in witness)
            message = f"epoch {r['epoch']} has {len(named)} leaders named: {named}"
        anomalies.append(
            Anomaly(SINGLE_LEADER, r["k"], message, run=r["run"], witness=tuple(witness))
        )
    return result_of(SINGLE_LEADER, anomalies, count=found.total, detail={"kinds": found.kinds})


def _steps(df: DataFrame, compared: Sequence[str], bad: Callable[[], Column]) -> DataFrame:
    """The lines of ``df`` that break a rule against the line before them on
    the same node (in ``seq`` order): run, node, seq, prev_seq and ``k``
    (``bad()``, NULL if the line is fine).  Only the ``compared`` columns go
    through the window's sort; witnesses are fetched afterwards."""
    w = Window.partitionBy("run", "node").orderBy("seq")
    cols = [F.col(c) for c in ("run", "node", "seq", *compared)]
    prev = [F.lag(c).over(w).alias(f"prev_{c}") for c in ("seq", *compared)]
    return (
        df.select(*cols, *prev)
        .where(F.col("prev_seq").isNotNull())
        .select("run", "node", "seq", "prev_seq", bad().alias("k"))
        .where(F.col("k").isNotNull())
    )


def _step_witnesses(
    df: DataFrame, found: _Found, columns: Sequence[str]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    keys = [(r["run"], r["node"], r[s]) for r in found.rows for s in ("prev_seq", "seq")]
    return _fetch(df, keys, ("run", "node", "seq"), columns)


def check_epochs(changes: DataFrame) -> CheckResult:
    """A node's epoch never goes down along its CHANGES lines."""
    _require(changes, "CHANGES", CHANGES_COLUMNS)

    def down() -> Column:
        return F.when(F.col("epoch") < F.col("prev_epoch"), F.lit("epoch-order"))

    found = _gather(_steps(changes, ["epoch"], down), ["run", "node", "seq"], F.col("k"))
    lines_of = _step_witnesses(changes, found, CHANGES_COLUMNS)
    anomalies = []
    for r in found.rows:
        prev = lines_of[(r["run"], r["node"], r["prev_seq"])][0]
        line = lines_of[(r["run"], r["node"], r["seq"])][0]
        message = (
            f"node {line['node']}'s epoch went from {prev['epoch']} down to {line['epoch']} "
            f"(changes lines {prev['seq']} and {line['seq']})"
        )
        anomalies.append(
            Anomaly(
                EPOCH_ORDER,
                "epoch-order",
                message,
                run=r["run"],
                node=r["node"],
                witness=(prev, line),
            )
        )
    return result_of(EPOCH_ORDER, anomalies, count=found.total)


# -- committed logs -------------------------------------------------------------


def check_log_agreement(log: DataFrame) -> CheckResult:
    """No offset of a run is committed as two different records."""
    _require(log, "LOG", LOG_COLUMNS)
    return _log_agreement(log, _summary(log))


def _log_agreement(log: DataFrame, summary: DataFrame) -> CheckResult:
    split = summary.where(F.col("lo") != F.col("hi")).select("run", "offset")
    found = _gather(split, ["run", "offset"], "committed-divergence")
    lines_of = _fetch(
        log, [(r["run"], r["offset"]) for r in found.rows], ("run", "offset"), LOG_COLUMNS
    )
    anomalies = []
    for r in found.rows:
        versions = versions_of(lines_of[(r["run"], r["offset"])])
        parts = "; ".join(
            f"epoch {d['epoch']} hash {d['hash'][:12]} on {_nodes_text(d['nodes'])}"
            for d in versions
        )
        message = f"offset {r['offset']} is committed as {len(versions)} different records: {parts}"
        anomalies.append(
            Anomaly(
                LOG_AGREEMENT,
                "committed-divergence",
                message,
                run=r["run"],
                witness=tuple(versions),
            )
        )
    return result_of(LOG_AGREEMENT, anomalies, count=found.total)


def check_high_watermark(log: DataFrame) -> CheckResult:
    """Along each node's log, offsets strictly increase and epochs never
    decrease (the rules of ``history.exports.check_log``)."""
    _require(log, "LOG", LOG_COLUMNS)

    def bad() -> Column:
        return F.when(F.col("offset") <= F.col("prev_offset"), F.lit("offset-order")).when(
            F.col("epoch") < F.col("prev_epoch"), F.lit("epoch-order")
        )

    steps = _steps(log, ["offset", "epoch"], bad)
    found = _gather(steps, ["run", "node", "seq"], F.col("k"))
    lines_of = _step_witnesses(log, found, LOG_COLUMNS)
    anomalies = []
    for r in found.rows:
        prev = lines_of[(r["run"], r["node"], r["prev_seq"])][0]
        line = lines_of[(r["run"], r["node"], r["seq"])][0]
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
                run=r["run"],
                node=r["node"],
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


def _ops_at(
    ops: DataFrame, keys: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], dict[str, Any]]:
    """The PAIRED rows of the given few (run, index), as witnesses."""
    found = _fetch(ops, keys, ("run", "index"), PAIRED_COLUMNS)
    return {k: op_witness(rows[0]) for k, rows in found.items() if rows}


def _lines_at(
    log: DataFrame, keys: Iterable[tuple[str, int]]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Every LOG line at the given few (run, offset), by node then seq."""
    found = _fetch(log, keys, ("run", "offset"), LOG_COLUMNS)
    return {k: sorted(v, key=lambda d: (d["node"], d["seq"])) for k, v in found.items()}


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


def _lost_part(
    ops: DataFrame, log: DataFrame, summary: DataFrame, records: DataFrame, batches: bool
) -> _Part:
    """``records``: run, index, offset (the record's), epoch, want (NULL: any
    hash); ``batches``: whether a write may have several records (else each
    record is its write, and the per-write grouping, a shuffle, is skipped)."""
    at = records.join(summary, ["run", "offset"], "left")
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
    lost_at = F.when(F.col("lost"), F.col("offset"))
    per_write = (
        per_record.groupBy("run", "index").agg(
            F.max("checkable").alias("checkable"), F.min(lost_at).alias("lost_at")
        )
        if batches
        else per_record.select("run", "index", "checkable", lost_at.alias("lost_at"))
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
    return _lost_writes(ops, log, _summary(log), model)


def _lost_writes(ops: DataFrame, log: DataFrame, summary: DataFrame, model: Model) -> CheckResult:
    writes = _writes(ops)

    def versioned(runs: list[str] | None) -> _Part:
        records = _filter_runs(writes, runs).select(
            "run", "index", "offset", "epoch", F.lit(None).cast("string").alias("want")
        )
        return _lost_part(ops, log, summary, records, batches=False)

    def logged(runs: list[str] | None) -> _Part:
        exploded = _log_records(_filter_runs(writes, runs))
        _refuse_malformed(exploded)
        records = exploded.select(
            "run", "index", (F.col("offset") + F.col("i")).alias("offset"), "epoch", "want"
        )
        return _lost_part(ops, log, summary, records, batches=True)

    return _by_model(LOST_WRITES, model, [(("register", "kv"), versioned), (("log",), logged)])


def _by_model(
    name: str,
    model: Model,
    parts_by_models: Sequence[tuple[tuple[str, ...], Callable[[list[str] | None], _Part]]],
) -> CheckResult:
    """One check made of a part per family of models: each part runs over
    the runs of its models (all runs when ``model`` is one model of them,
    none when it is another), and the check applies if any part ran."""
    parts: list[_Part] = []
    for models, part in parts_by_models:
        runs = runs_of_models(model, models)
        if runs is None or runs:
            parts.append(part(runs))
    return _merge(name, parts, applicable=bool(parts))


def _phantom_records(
    ops: DataFrame, log: DataFrame, summary: DataFrame, runs: list[str] | None
) -> _Part:
    """``log`` runs: every distinct data line is a record of a write that did not fail."""
    data = (
        _filter_runs(summary, runs)
        .select("run", "offset", F.explode("data").alias("v"))
        .select("run", "offset", "v.epoch", "v.hash")
    )
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
        lines_of = _lines_at(log, [(r["run"], r["offset"]) for r in rows])
        for r in rows:
            data_lines = (d for d in lines_of[(r["run"], r["offset"])] if d["kind"] == "data")
            line = next(
                v
                for v in versions_of(data_lines)
                if (v["epoch"], v["hash"]) == (r["epoch"], r["hash"])
            )
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


def _phantom_versions(
    ops: DataFrame, log: DataFrame, summary: DataFrame, runs: list[str] | None
) -> _Part:
    """``register``/``kv`` runs: an ok read's (offset, epoch) names a data line."""
    reads = _filter_runs(ops, runs).where(
        (F.col("type") == "ok")
        & (F.col("f") == "read")
        & F.col("offset").isNotNull()
        & F.col("epoch").isNotNull()
    )
    at = reads.select("run", "index", "offset", "epoch").join(summary, ["run", "offset"], "left")
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
    return _phantom_writes(ops, log, _summary(log), model)


def _phantom_writes(
    ops: DataFrame, log: DataFrame, summary: DataFrame, model: Model
) -> CheckResult:
    return _by_model(
        PHANTOM_WRITES,
        model,
        [
            (("log",), lambda runs: _phantom_records(ops, log, summary, runs)),
            (("register", "kv"), lambda runs: _phantom_versions(ops, log, summary, runs)),
        ],
    )


def check_version_collisions(ops: DataFrame) -> CheckResult:
    """No (run, offset) is named by ok writes of two different (key, value)."""
    _require(ops, "PAIRED", PAIRED_COLUMNS)
    writes = _writes(ops)
    what = F.struct("key", F.coalesce(F.col("value"), F.lit("null")))
    shared = (
        writes.groupBy("run", "offset")
        .agg(F.min(what).alias("lo"), F.max(what).alias("hi"))
        .where(F.col("lo") != F.col("hi"))
        .select("run", "offset")
    )
    found = _gather(shared, ["run", "offset"], "shared-version")
    ops_of = _fetch(
        writes, [(r["run"], r["offset"]) for r in found.rows], ("run", "offset"), PAIRED_COLUMNS
    )
    anomalies = []
    for r in found.rows:
        firsts = first_per(ops_of[(r["run"], r["offset"])], ("key", "value"), ("index",))
        witness = sorted((op_witness(d) for d in firsts), key=lambda d: d["index"])
        named = ", ".join(f"op {w['index']} ({w['f']} of key {w['key']!r})" for w in witness)
        message = f"offset {r['offset']} is named by {len(witness)} different writes: {named}"
        anomalies.append(
            Anomaly(VERSION_FORKS, "shared-version", message, run=r["run"], witness=tuple(witness))
        )
    return result_of(VERSION_FORKS, anomalies, count=found.total)


# -- all of them ----------------------------------------------------------------


def check_exports(
    ops: DataFrame, log: DataFrame, changes: DataFrame, model_by_run: Mapping[str, str]
) -> list[CheckResult]:
    """Every check of this module, over runs of any models (``model_by_run``
    names each run's; a run missing from it skips the model-dependent
    checks).  The per-offset summary of the logs is computed once, kept
    while the checks that share it run."""
    _require(ops, "PAIRED", PAIRED_COLUMNS)
    _require(log, "LOG", LOG_COLUMNS)
    _require(changes, "CHANGES", CHANGES_COLUMNS)
    runs_of_models(model_by_run, MODELS)  # refuses unknown models before any job
    versioned = runs_of_models(model_by_run, ("register", "kv", "log"))
    summary = _summary(log).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return [
            check_single_leader(changes),
            check_epochs(changes),
            _log_agreement(log, summary),
            check_high_watermark(log),
            _lost_writes(ops, log, summary, model_by_run),
            _phantom_writes(ops, log, summary, model_by_run),
            check_version_collisions(_filter_runs(ops, versioned)),
        ]
    finally:
        summary.unpersist()

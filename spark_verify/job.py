"""The verification job: run folders in, a verdict (JSON and HTML) out.

:func:`verify` reads one or many runs (``docs/history-format.md``), pairs
invocations with completions (window functions, :mod:`spark_verify.pairing`),
and runs every check of ``docs/verification.md``:

- ``well-formed``: the history's lines and pairing (:mod:`spark_verify.load`,
  :mod:`spark_verify.pairing`);
- per key, in the executors (``groupBy(run, key).applyInArrow``): ``linearizable``
  (:func:`spark_verify.wgl.check_key`), ``aborted-reads``, ``stale-reads`` and the
  per-key ``version-forks`` (:mod:`spark_verify.versions`), for ``register`` and
  ``kv`` runs;
- over the node exports (:mod:`spark_verify.logs`): ``single-leader``,
  ``epoch-order``, ``log-agreement``, ``high-watermark``, ``lost-writes``,
  ``phantom-writes`` and the cross-key ``version-forks``; and
  ``vote-durability`` (:mod:`spark_verify.votes`) over the nodes' votes;
- ``final-metadata``: for ``topics`` runs, the harness's final check of the
  metadata against the history (``summary.json``'s ``final_check``).

Only counts, the first anomalies (with their witnesses) and the per-key rows
of invalid and unknown keys come back to the driver, so the job scales with the
cluster, not the driver.  The same code runs on ``local[*]`` and under
``spark-submit`` (:mod:`spark_verify.submit`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_verify.load import (
    RunInput,
    RunInputError,
    Unreadable,
    find_runs,
    history_problems,
    load_history,
    load_node_exports,
)
from spark_verify.logs import check_exports, check_version_collisions
from spark_verify.ops import KEYS_SCHEMA_DDL, CheckOp
from spark_verify.pairing import pair_ops
from spark_verify.partitions import (
    PARTITION_CHECKS,
    PartitionFrames,
    check_partition_runs,
    load_partition_exports,
    partition_plots,
)
from spark_verify.queue import QUEUE_CHECKS, QueueRecords, check_queue_runs, queue_records
from spark_verify.report import write_report
from spark_verify.session import is_remote, master_of, parallelism
from spark_verify.timeline import timeline
from spark_verify.verdict import (
    MAX_ANOMALIES,
    Anomaly,
    CheckResult,
    Validity,
    combine,
    result_of,
)
from spark_verify.versions import stale_reads, version_forks
from spark_verify.votes import check_vote_runs
from spark_verify.wgl import (
    DEFAULT_KEY_MEMORY,
    check_key,
    find_aborted_reads,
    keys_row_to_anomaly,
)

__all__ = [
    "CHECK_ORDER",
    "DEFAULT_KEY_BUDGET_S",
    "KEY_MODELS",
    "Verification",
    "VerifyOptions",
    "out_dir",
    "shuffle_partitions",
    "verify",
    "verify_runs",
]

KEY_MODELS: Final = ("register", "kv")
"""Models whose histories are checked key by key (linearizability, versions)."""

DEFAULT_KEY_BUDGET_S: Final = 10.0

CHECK_ORDER: Final = (
    "well-formed",
    "linearizable",
    "aborted-reads",
    "stale-reads",
    "version-forks",
    "single-leader",
    "epoch-order",
    "vote-durability",
    "log-agreement",
    "high-watermark",
    "lost-writes",
    "phantom-writes",
    "final-metadata",
)
"""Every check of the verdict, in the order the verdict and report list them."""

# The per-key job's rows: the KEYS table plus the other per-key checks'
# anomaly counts and their first anomalies (JSON lists of Anomaly objects).
_KEY_ROWS_DDL: Final = (
    KEYS_SCHEMA_DDL
    + ", aborted long, stale long, forks long, aborted_json string, stale_json string,"
    " forks_json string, versioned long"
)
_PER_KEY: Final = (
    ("aborted-reads", "aborted"),
    ("stale-reads", "stale"),
    ("version-forks", "forks"),
)
# Per key, at most this many anomalies of each kind travel back (the count is exact).
_PER_KEY_KEPT: Final = 10
# The report lists at most this many keys (invalid and unknown ones first).
_REPORT_KEYS: Final = 1000


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """How to verify.  ``model`` names the model of histories whose run
    folder does not (a history from another tool); ``key_budget_s`` is each
    key's time budget (past it the key is ``unknown``); ``out`` is where
    ``verdict.json`` and ``report.html`` go (default: ``<run>/verify`` for
    one run folder, else ``runs/verify-<UTC time>``: :func:`out_dir`);
    ``report=False`` skips
    the HTML page and its timeline job; ``key_memory_mib`` bounds each key's
    search cache."""

    model: str | None = None
    key_budget_s: float = DEFAULT_KEY_BUDGET_S
    out: Path | None = None
    report: bool = True
    buckets: int = 200
    key_memory_mib: int = DEFAULT_KEY_MEMORY >> 20
    """The bound of each key's cache of seen configurations (the compiled
    search's); past it the key is ``unknown``."""

    def check(self) -> None:
        if not self.key_budget_s > 0:
            raise ValueError(f"the key budget must be positive, got {self.key_budget_s}")
        if self.key_memory_mib < 1:
            raise ValueError(f"the key memory must be at least 1 MiB, got {self.key_memory_mib}")
        if self.buckets < 1:
            raise ValueError(f"buckets must be at least 1, got {self.buckets}")


@dataclass(frozen=True, slots=True)
class Verification:
    """A finished verification: the verdict JSON object, where it was
    written, and the report's path (None without a report)."""

    verdict: Mapping[str, Any]
    verdict_path: Path
    report_path: Path | None
    checks: tuple[CheckResult, ...] = field(default=())

    @property
    def valid(self) -> Validity:
        v: Validity = self.verdict["valid"]
        return v


def verify(
    spark: SparkSession,
    paths: Sequence[str | Path],
    options: VerifyOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Verification:
    """Find the runs under ``paths`` and verify them together (see the module
    docstring).  Raises :class:`spark_verify.load.RunInputError` for paths
    that hold no run."""
    opts = options or VerifyOptions()
    opts.check()
    unreadable: list[Unreadable] = []
    runs = find_runs(paths, model=opts.model, unreadable=unreadable)
    return verify_runs(spark, runs, opts, progress=progress, unreadable=unreadable)


_BYTES_PER_PARTITION: Final = 64 * 2**20
_OPEN_COST: Final = 64 * 2**10


def shuffle_partitions(runs: Sequence[RunInput], spark: SparkSession) -> int:
    """Shuffle partitions for a local verification of ``runs``: one per
    64 MiB of history and node exports, at least four per core, at most 512."""
    size = 0
    for run in runs:
        paths = [run.history, *(p for n in run.nodes.values() for p in n.glob("*.jsonl"))]
        for path in paths:
            if path.is_file():
                size += path.stat().st_size
            elif path.is_dir():
                size += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    cores = parallelism(spark)
    return max(4 * cores, min(512, size // _BYTES_PER_PARTITION + 1))


def _master_text(spark: SparkSession) -> str:
    """The verdict's ``master``: the master, or a Connect server's and its master."""
    if is_remote(spark):
        return f"Spark Connect ({master_of(spark)})"
    return master_of(spark)


def out_dir(runs: Sequence[RunInput], opts: VerifyOptions) -> Path:
    """Where a verification writes: ``--out``; else the run folder's
    ``verify/`` for one run folder; else (several runs, or histories that
    are files) ``runs/verify-<UTC time>/``, beside the run folders kq
    writes (and ignored as they are), never a stray folder here."""
    if opts.out is not None:
        return opts.out
    if len(runs) == 1 and runs[0].path.is_dir():
        return runs[0].path / "verify"
    return Path("runs") / time.strftime("verify-%Y%m%dT%H%M%SZ", time.gmtime())


def verify_runs(
    spark: SparkSession,
    runs: Sequence[RunInput],
    options: VerifyOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    unreadable: Sequence[Unreadable] = (),
) -> Verification:
    """:func:`verify` of runs already found; ``unreadable`` are runs whose
    history could not be read, each given the verdict "cannot verify"."""
    opts = options or VerifyOptions()
    opts.check()
    t0 = time.monotonic()
    if not runs:
        return _unreadable_only(spark, unreadable, opts, t0)

    def say(message: str) -> None:
        if progress is not None:
            progress(f"{time.monotonic() - t0:6.1f}s  {message}")

    # What the verification caches is freed however it ends: a session
    # kept warm across runs (kq chaos catalogue) must not keep a failed
    # verification's frames.
    with contextlib.ExitStack() as held:
        return _verify_held(spark, runs, opts, say, unreadable, t0, held)


def _verify_held(
    spark: SparkSession,
    runs: Sequence[RunInput],
    opts: VerifyOptions,
    say: Callable[[str], None],
    unreadable: Sequence[Unreadable],
    t0: float,
    held: contextlib.ExitStack,
) -> Verification:
    """:func:`verify_runs`' work; every frame it caches is unpersisted by
    ``held``."""
    models = {r.name: r.model for r in runs}
    if master_of(spark).startswith("local"):
        # On a cluster the submitter sets the width; locally the default is
        # too narrow for big histories (window sorts run out of memory) and
        # too wide for small ones (a task per partition per stage).
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions(runs, spark)))
        # Small histories share a task: Spark counts each file as 4 MiB more
        # than it is when packing files into partitions, which gives a
        # hundred 50 kB histories a hundred tasks.
        spark.conf.set("spark.sql.files.openCostInBytes", str(_OPEN_COST))

    say(f"reading {len(runs)} run(s)")
    history = load_history(spark, runs).persist(StorageLevel.MEMORY_AND_DISK)
    held.callback(history.unpersist)
    paired = pair_ops(history)
    ops = paired.ops.persist(StorageLevel.MEMORY_AND_DISK)
    held.callback(ops.unpersist)
    problems = history_problems(history).unionByName(paired.problems)

    say("checking well-formedness")
    well_formed, problems_by_run = _well_formed(problems)
    if unreadable:
        well_formed = _merge(well_formed, _unreadable_check(unreadable))
    checks: dict[str, CheckResult] = {"well-formed": well_formed}
    say("checking each key (linearizability, aborted and stale reads, version forks)")
    key_results, key_rows, keys_by_run = _per_key(
        ops, models, opts.key_budget_s, opts.report, opts.key_memory_mib, held
    )
    # The keyed runs' counts come with their keys' verdicts; only runs of
    # other models need a job of their own.
    counts = {
        run: {"ops": int(row.get("ops") or 0), "keys": int(row.get("named_keys") or 0)}
        for run, row in keys_by_run.items()
    }
    others = sorted(r.name for r in runs if r.model not in KEY_MODELS)
    if others:
        counts.update(_op_counts(ops.where(F.col("run").isin(others))))
    for name, result in key_results.items():
        checks[name] = _merge(checks.get(name), result)

    if any(r.nodes for r in runs):
        say("checking the node exports")
        log, changes = load_node_exports(spark, runs)
        exported = check_exports(ops, log, changes, models)
    else:
        # No node exports: nothing for their checks to read, and no job for it.
        versioned = sum(int(row.get("versioned") or 0) for row in keys_by_run.values())
        exported = _without_exports(ops, models, versioned > 0 or bool(others))
    for result in exported:
        checks[result.name] = _merge(checks.get(result.name), result)
    checks["vote-durability"] = check_vote_runs(spark, runs)
    checks["final-metadata"] = _final_metadata(runs)
    queue_runs = sorted(r.name for r in runs if r.model == "queue")
    folders = {r.name: r.path for r in runs if r.model == "queue" and r.path.is_dir()}
    records: QueueRecords | None = None
    if queue_runs:
        say("checking the queue runs (Jepsen's queue checks and no-loss)")
        in_queue = F.col("run").isin(queue_runs)
        queue_ops = ops.where(in_queue)
        # The sends' and polls' records, parsed from the ops' JSON once for
        # every queue check and the report's consumer lag.
        records = queue_records(queue_ops)
        held.callback(records.unpersist)
        for result in check_queue_runs(
            queue_ops, history.where(in_queue), folders, records=records
        ):
            checks[result.name] = result
        # A queue op names its keys (topic-partitions) inside its value, not
        # in the key column: a queue run's keys are those its sends and polls
        # name.
        named = records.sends.select("run", "key").unionByName(records.reads.select("run", "key"))
        for row in (
            named.where(F.col("key").isNotNull())
            .groupBy("run")
            .agg(F.countDistinct("key").alias("keys"))
            .collect()
        ):
            counts.setdefault(row["run"], {"ops": 0, "keys": 0})["keys"] = int(row["keys"])
        say("checking the brokers' partition exports")
        partition_frames: PartitionFrames | None = load_partition_exports(spark, folders)
        for result in check_partition_runs(spark, folders, partition_frames):
            checks[result.name] = result
    else:
        partition_frames = None

    ordered = tuple(
        checks[name] for name in (*CHECK_ORDER, *QUEUE_CHECKS, *PARTITION_CHECKS) if name in checks
    )
    run_rows = [
        {
            "name": r.name,
            "path": str(r.path),
            "model": r.model,
            "ops": counts.get(r.name, {}).get("ops", 0),
            "keys": counts.get(r.name, {}).get("keys", 0),
            **run_verdict(r.name, ordered, problems_by_run, keys_by_run, _locator(r)),
        }
        for r in runs
    ]
    run_rows.extend(_unreadable_row(u) for u in unreadable)
    verdict: dict[str, Any] = {
        "format": 1,
        "valid": False if unreadable else combine(c.valid for c in ordered),
        "verdict": overall_verdict(r["verdict"] for r in run_rows),
        "runs": run_rows,
        "checks": {c.name: c.to_json() for c in ordered},
        "master": _master_text(spark),
    }
    out = out_dir(runs, opts)
    out.mkdir(parents=True, exist_ok=True)
    report_path: Path | None = None
    if opts.report:
        say("drawing the report")
        tl = timeline(ops, paired.nemesis, buckets=opts.buckets)
        verdict["elapsed_s"] = round(time.monotonic() - t0, 3)
        report_path = out / "report.html"
        per_run = tl.per_run()
        plots = (
            partition_plots(partition_frames, ops, folders, opts.buckets, records)
            if partition_frames is not None
            else {}
        )
        write_report(
            report_path,
            verdict,
            {r.name: per_run[r.name] for r in runs if r.name in per_run},
            key_rows,
            partitions=plots,
            title="kq verification: "
            + ", ".join(r.name for r in runs[:3])
            + (f" and {len(runs) - 3} more" if len(runs) > 3 else ""),
        )
        verdict["report"] = str(report_path)
    verdict["elapsed_s"] = round(time.monotonic() - t0, 3)
    verdict_path = out / "verdict.json"
    tmp = verdict_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(verdict, indent=2, default=str) + "\n")
    tmp.replace(verdict_path)
    return Verification(verdict, verdict_path, report_path, ordered)


# -- each run's verdict -------------------------------------------------------------

VALID: Final = "valid"
INVALID: Final = "invalid"
UNKNOWN_VERDICT: Final = "unknown"
CANNOT_VERIFY: Final = "cannot-verify"
RUN_VERDICTS: Final = (VALID, INVALID, UNKNOWN_VERDICT, CANNOT_VERIFY)
"""A run's verdict: every check passed; an anomaly was found; some check
could not decide (a key's budget ran out); the history could not be read
(not well formed: no verdict is given on a history misread)."""

_KEYED: Final = ("linearizable", "aborted-reads", "stale-reads", "version-forks")


def run_verdict(
    run: str,
    checks: Sequence[CheckResult],
    problems_by_run: Mapping[str, int],
    keys_by_run: Mapping[str, Mapping[str, Any]],
    locate: Callable[[Anomaly], str] | None = None,
) -> dict[str, Any]:
    """One run's ``verdict``, ``failed`` (the checks that found anomalies in
    it, or could not decide), ``reason`` (a sentence) and ``search_s`` (the
    time its keys' searches took, summed).

    A history that is not well formed cannot be verified: its other checks
    read a history that is not the one recorded, so they give no verdict.
    The per-key checks' counts are the run's own; the other checks' are
    shared by the runs verified together, so a run is invalid under one if
    the check's per-run counts (``detail.by_run``) give it anomalies, or,
    for a check without them, if a kept anomaly names it, and unknown if
    that check kept only the first of its anomalies and none of them names
    the run."""
    keyed = keys_by_run.get(run, {})
    search_s = round(float(keyed.get("search_ms") or 0.0) / 1000.0, 3)
    problems = problems_by_run.get(run, 0) + int(keyed.get("malformed") or 0)
    if problems:
        found = next(
            (a for c in checks if c.name == "well-formed" for a in c.anomalies if a.run == run),
            None,
        )
        first = ""
        if found is not None:
            where = locate(found) if locate is not None else ""
            first = f"{where}: {found.message}" if where else found.message
        reason = f"{problems:,} problem(s) reading the history" + (f": {first}" if first else "")
        return {
            "verdict": CANNOT_VERIFY,
            "failed": ["well-formed"],
            "reason": reason,
            "search_s": search_s,
        }
    invalid: list[str] = []
    unknown: list[str] = []
    for c in checks:
        if c.name == "well-formed":
            continue
        if c.name in _KEYED and keyed:
            column = {
                "linearizable": "invalid",
                "aborted-reads": "aborted",
                "stale-reads": "stale",
                "version-forks": "forks",
            }[c.name]
            if int(keyed.get(column) or 0):
                invalid.append(c.name)
                continue
            if c.name == "linearizable" and int(keyed.get("unknown") or 0):
                unknown.append(c.name)
                continue
            if c.name != "version-forks":
                continue  # the cross-key version forks are checked below
        by_run = c.detail.get("by_run")
        counted = isinstance(by_run, Mapping)
        if isinstance(by_run, Mapping):
            # The check counted each run's anomalies: the run's own count
            # decides, not whether the capped listing names it.
            if by_run.get(run, 0):
                invalid.append(c.name)
                continue
        elif any(a.run == run for a in c.anomalies):
            invalid.append(c.name)
            continue
        if (
            (c.valid is False and c.count > len(c.anomalies) and not counted)
            or (c.name == "final-metadata" and run in c.detail.get("missing", ()))
            or (c.name == "no-loss" and run in c.detail.get("undecided", ()))
        ):
            unknown.append(c.name)
    if invalid:
        return {
            "verdict": INVALID,
            "failed": invalid,
            "reason": "anomalies found by " + ", ".join(invalid),
            "search_s": search_s,
        }
    if unknown:
        return {
            "verdict": UNKNOWN_VERDICT,
            "failed": unknown,
            "reason": "undecided: " + ", ".join(unknown),
            "search_s": search_s,
        }
    return {"verdict": VALID, "failed": [], "reason": "every check passed", "search_s": search_s}


def _locator(run: RunInput) -> Callable[[Anomaly], str]:
    """Where a well-formedness anomaly of ``run`` is: its history file and
    the line of the op it quotes (JSON Lines: line i + 1 holds index i; a
    Jepsen history: the op's own line in history.edn)."""

    def locate(a: Anomaly) -> str:
        index = next((w.get("index") for w in a.witness if w.get("index") is not None), None)
        if not isinstance(index, int) or a.message.startswith("line "):
            return str(run.history)
        if run.edn is not None:
            if 0 <= index < len(run.edn.file_lines) and run.edn.file_lines[index] > 0:
                return f"{run.history}: line {run.edn.file_lines[index]}"
            return f"{run.history}: op {index}"
        if run.fmt == "jsonl":
            return f"{run.history}: line {index + 1}"
        return f"{run.history}: the row of index {index}"

    return locate


def overall_verdict(verdicts: Iterable[str]) -> str:
    """The command's verdict over its runs: cannot-verify if any run could
    not be read, else invalid if any run is, else unknown if any is, else valid."""
    seen = set(verdicts)
    for v in (CANNOT_VERIFY, INVALID, UNKNOWN_VERDICT):
        if v in seen:
            return v
    return VALID


def _without_exports(
    ops: DataFrame, models: Mapping[str, str], versions: bool
) -> list[CheckResult]:
    """The export checks when no run has node exports: not applicable, with
    no Spark job; the cross-key version forks, which read the history, still
    run, unless ``versions`` is false (no op carries an offset: a history
    from another tool), when no two writes can share a version."""
    na = {"applicable": False, "reason": "no node exports"}
    out = [
        result_of(name, [], detail=na)
        for name in (
            "single-leader",
            "epoch-order",
            "log-agreement",
            "high-watermark",
            "lost-writes",
            "phantom-writes",
        )
    ]
    versioned = sorted(r for r, m in models.items() if m in ("register", "kv", "log"))
    if versioned and versions:
        out.append(check_version_collisions(ops.where(F.col("run").isin(versioned))))
    return out


def _unreadable_row(u: Unreadable) -> dict[str, Any]:
    return {
        "name": u.name,
        "path": str(u.path),
        "model": None,
        "ops": 0,
        "keys": 0,
        "verdict": CANNOT_VERIFY,
        "failed": ["well-formed"],
        "reason": u.message,
        "search_s": 0.0,
    }


def _unreadable_check(unreadable: Sequence[Unreadable]) -> CheckResult:
    return result_of(
        "well-formed",
        [
            Anomaly(check="well-formed", kind="unreadable", message=u.message, run=u.name)
            for u in unreadable
        ],
        detail={"problems": {"unreadable": len(unreadable)}},
    )


def _unreadable_only(
    spark: SparkSession, unreadable: Sequence[Unreadable], opts: VerifyOptions, t0: float
) -> Verification:
    """No history could be read: the verdict says so, without a Spark job."""
    if not unreadable:
        raise RunInputError("no runs to verify")
    well_formed = _unreadable_check(unreadable)
    verdict: dict[str, Any] = {
        "format": 1,
        "valid": False,
        "verdict": CANNOT_VERIFY,
        "runs": [_unreadable_row(u) for u in unreadable],
        "checks": {"well-formed": well_formed.to_json()},
        "master": _master_text(spark),
        "elapsed_s": round(time.monotonic() - t0, 3),
    }
    out = (
        opts.out
        if opts.out is not None
        else Path("runs") / time.strftime("verify-%Y%m%dT%H%M%SZ", time.gmtime())
    )
    out.mkdir(parents=True, exist_ok=True)
    verdict_path = out / "verdict.json"
    verdict_path.write_text(json.dumps(verdict, indent=2, default=str) + "\n")
    return Verification(verdict, verdict_path, None, (well_formed,))


# -- well-formedness --------------------------------------------------------------


def _well_formed(problems: DataFrame) -> tuple[CheckResult, dict[str, int]]:
    """The check, and each run's count of problems."""
    # One job when the history is well formed (the usual case): the counts.
    by_kind: dict[str, int] = {}
    by_run: dict[str, int] = {}
    for r in problems.groupBy("run", "kind").count().collect():
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["count"]
        by_run[r["run"]] = by_run.get(r["run"], 0) + r["count"]
    total = sum(by_kind.values())
    found = problems.orderBy("run", "index", "kind").limit(MAX_ANOMALIES).collect() if total else []
    anomalies = [
        Anomaly(
            check="well-formed",
            kind=r["kind"],
            message=r["message"],
            run=r["run"],
            witness=({"index": r["index"], "line": r["line"]},),
        )
        for r in found
    ]
    return result_of("well-formed", anomalies, count=total, detail={"problems": by_kind}), by_run


def _op_counts(ops: DataFrame) -> dict[str, dict[str, int]]:
    rows = (
        ops.groupBy("run")
        .agg(F.count(F.lit(1)).alias("ops"), F.countDistinct("key").alias("keys"))
        .collect()
    )
    return {r["run"]: {"ops": r["ops"], "keys": r["keys"]} for r in rows}


# -- per key ------------------------------------------------------------------------


def _key_checker(
    models: Mapping[str, str], budget_s: float, memory_mib: int
) -> Callable[[pa.Table], pa.Table]:
    """The function each executor runs on one (run, key)'s ops."""
    schema = _arrow_schema()

    def check(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        if not rows:
            return schema.empty_table()
        run, key = rows[0]["run"], rows[0]["key"]
        try:
            ops = [CheckOp.from_row(r) for r in rows]
            result = check_key(ops, models[run], budget_s=budget_s, max_bytes=memory_mib << 20)
        except ValueError as exc:
            # An op the model cannot take (an unknown f, a value of the wrong
            # shape): the history is not well formed, and the key undecided.
            return pa.Table.from_pylist([_malformed_row(run, key, len(rows), exc)], schema=schema)
        out = result.to_row(run, key)
        # Ops with a version: none in any run, and no two writes can share one.
        out["versioned"] = sum(1 for op in ops if op.offset is not None)
        for (_, column), found in zip(
            _PER_KEY,
            (find_aborted_reads(ops), stale_reads(ops), version_forks(ops)),
            strict=True,
        ):
            out[column] = len(found)
            out[column + "_json"] = json.dumps(
                [a.to_json() for a in found[:_PER_KEY_KEPT]], separators=(",", ":")
            )
        return pa.Table.from_pylist([out], schema=schema)

    return check


MALFORMED: Final = "malformed-op"
"""The ``kind`` of a KEYS row whose ops the model refused."""


def _malformed_row(run: str, key: str, ops: int, exc: Exception) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run": run,
        "key": key,
        "ops": ops,
        "valid": "unknown",
        "elapsed_ms": 0.0,
        "states": 0,
        "kind": MALFORMED,
        "message": str(exc),
        "witness": "[]",
        "memory_bytes": 0,
    }
    for _, column in _PER_KEY:
        out[column] = 0
        out[column + "_json"] = "[]"
    out["versioned"] = 0
    return out


def _arrow_schema() -> pa.Schema:
    types = {"string": pa.string(), "long": pa.int64(), "double": pa.float64()}
    fields = []
    for part in _KEY_ROWS_DDL.split(","):
        name, kind = part.split()
        fields.append(pa.field(name, types[kind]))
    return pa.schema(fields)


def _per_key(
    ops: DataFrame,
    models: Mapping[str, str],
    budget_s: float,
    report: bool,
    memory_mib: int,
    held: contextlib.ExitStack,
) -> tuple[dict[str, CheckResult], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The per-key checks' results, the KEYS rows (for the report; without
    one, only the invalid and unknown keys'), and each run's counts
    (``keys``, ``named_keys``, ``ops``, ``versioned``, ``invalid``,
    ``unknown``, ``malformed``, ``search_ms`` and the per-key anomaly counts).

    Jobs: one for the counts; then one for the keys the report lists, or,
    without a report, one for the invalid and unknown keys if there are any."""
    keyed_runs = sorted(r for r, m in models.items() if m in KEY_MODELS)
    if not keyed_runs:
        na = {"applicable": False}
        return (
            {
                name: result_of(name, [], detail=na)
                for name in ("linearizable", "aborted-reads", "stale-reads", "version-forks")
            },
            [],
            {},
        )
    subset = ops.where(F.col("run").isin(keyed_runs))
    rows = (
        subset.groupBy("run", "key")
        .applyInArrow(_key_checker(dict(models), budget_s, memory_mib), _KEY_ROWS_DDL)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # Freed below once read, and by ``held`` if a job fails first.
    held.callback(rows.unpersist)
    # One job: each run's counts (the run's verdict), summed for the totals.
    per_run = [
        r.asDict()
        for r in rows.groupBy("run")
        .agg(
            F.count(F.lit(1)).alias("keys"),
            F.count("key").alias("named_keys"),
            F.sum("ops").alias("ops"),
            F.sum("versioned").alias("versioned"),
            F.sum(F.when(F.col("valid") == "false", 1).otherwise(0)).alias("invalid"),
            F.sum(F.when(F.col("valid") == "unknown", 1).otherwise(0)).alias("unknown"),
            F.sum(F.when(F.col("kind") == MALFORMED, 1).otherwise(0)).alias("malformed"),
            F.sum("states").alias("states"),
            F.max("elapsed_ms").alias("slowest_ms"),
            F.max("memory_bytes").alias("largest_cache"),
            F.sum("elapsed_ms").alias("search_ms"),
            *(F.sum(column).alias(column) for _, column in _PER_KEY),
        )
        .collect()
    ]
    by_run = {r["run"]: r for r in per_run}
    totals: dict[str, Any] = {
        name: sum(int(r[name] or 0) for r in per_run)
        for name in ("keys", "invalid", "unknown", "malformed", "states")
        + tuple(c for _, c in _PER_KEY)
    }
    totals["slowest_ms"] = max((float(r["slowest_ms"] or 0.0) for r in per_run), default=0.0)
    largest = max((int(r["largest_cache"] or 0) for r in per_run), default=0)
    undecided_or_bad = totals["invalid"] + totals["unknown"]
    if report:
        # One job: the unknown and invalid keys first, then the valid ones.
        listed = (
            rows.orderBy((F.col("valid") == "true").asc(), F.col("valid").desc(), "run", "key")
            .limit(_REPORT_KEYS)
            .collect()
        )
        bad = [r for r in listed if r["valid"] != "true"]
        good = [r for r in listed if r["valid"] == "true"]
    elif undecided_or_bad:
        bad = (
            rows.where(F.col("valid") != "true")
            .orderBy(F.col("valid").desc(), "run", "key")
            .limit(_REPORT_KEYS)
            .collect()
        )
        good = []
    else:
        bad, good = [], []
    key_rows = [r.asDict() for r in bad] + [{**r.asDict(), "witness": "[]"} for r in good]

    lin_anomalies = [a for a in (keys_row_to_anomaly(r.asDict()) for r in bad[:MAX_ANOMALIES]) if a]
    unknown_keys = [
        {"run": r["run"], "key": r["key"], "message": r["message"]}
        for r in bad
        if r["valid"] == "unknown"
    ][:MAX_ANOMALIES]
    malformed_count = totals["malformed"]
    malformed_anomalies = [
        Anomaly(
            check="well-formed",
            kind="model",
            message=f"key {r['key']!r}: {r['message']}",
            run=r["run"],
            key=r["key"],
        )
        for r in (
            rows.where(F.col("kind") == MALFORMED)
            .orderBy("run", "key")
            .limit(MAX_ANOMALIES)
            .collect()
            if malformed_count
            else []
        )
    ]
    results = {
        "linearizable": result_of(
            "linearizable",
            lin_anomalies,
            count=int(totals["invalid"] or 0),
            unknown=bool(totals["unknown"]),
            detail={
                "keys": int(totals["keys"]),
                "invalid": int(totals["invalid"] or 0),
                "unknown": int(totals["unknown"] or 0),
                "unknown_keys": unknown_keys,
                "states": int(totals["states"] or 0),
                "slowest_key_ms": float(totals["slowest_ms"] or 0.0),
                "key_budget_s": budget_s,
                "largest_key_cache_mib": round(largest / 2**20, 1),
                "key_memory_mib": memory_mib,
            },
        )
    }
    for name, column in _PER_KEY:
        total = int(totals[column] or 0)
        kept: list[Anomaly] = []
        if total:
            for r in (
                rows.where(F.col(column) > 0)
                .select("run", "key", column + "_json")
                .orderBy("run", "key")
                .limit(MAX_ANOMALIES)
                .collect()
            ):
                kept.extend(_anomaly_from_json(a) for a in json.loads(r[column + "_json"]))
                if len(kept) >= MAX_ANOMALIES:
                    break
        results[name] = result_of(name, kept, count=total, detail={"keys": int(totals["keys"])})
    results["well-formed"] = result_of(
        "well-formed",
        malformed_anomalies,
        count=malformed_count,
        detail={"problems": {"model": malformed_count}} if malformed_count else {},
    )
    rows.unpersist()
    return results, key_rows, by_run


def _anomaly_from_json(obj: Mapping[str, Any]) -> Anomaly:
    return Anomaly(
        check=obj["check"],
        kind=obj["kind"],
        message=obj["message"],
        run=obj.get("run"),
        key=obj.get("key"),
        node=obj.get("node"),
        witness=tuple(obj.get("witness", ())),
    )


def _merge(first: CheckResult | None, second: CheckResult) -> CheckResult:
    """Two results of one check: the per-key and the cross-key version forks,
    the history's and the model's well-formedness."""
    if first is None:
        return second
    anomalies = (first.anomalies + second.anomalies)[:MAX_ANOMALIES]
    detail: dict[str, Any] = dict(first.detail)
    for k, v in second.detail.items():
        mine = detail.get(k)
        if isinstance(mine, Mapping) and isinstance(v, Mapping):
            # Counters by kind: add them up.
            detail[k] = {n: mine.get(n, 0) + v.get(n, 0) for n in {*mine, *v}}
        elif k == "applicable" and k in detail:
            detail[k] = bool(mine) or bool(v)
        else:
            detail[k] = v
    return CheckResult(
        first.name,
        combine((first.valid, second.valid)),
        first.count + second.count,
        anomalies,
        detail,
    )


# -- the metadata's final check --------------------------------------------------------


def _final_metadata(runs: Iterable[RunInput]) -> CheckResult:
    """The ``topics`` workload's final check, as the harness recorded it in
    ``summary.json`` (it compares a linearizable read of the final metadata
    with the history: ``chaos.workloads.topics.check_final_metadata``)."""
    anomalies: list[Anomaly] = []
    checked = 0
    missing: list[str] = []
    for run in runs:
        if run.model != "topics":
            continue
        summary = _summary(run)
        final = summary.get("final_check") if summary else None
        if not isinstance(final, Mapping):
            missing.append(run.name)
            continue
        if final.get("error") and not final.get("problems"):
            # The final read itself failed: nothing was compared.
            missing.append(run.name)
            continue
        checked += 1
        for p in final.get("problems") or ():
            p = p if isinstance(p, Mapping) else {"kind": "problem", "message": str(p)}
            anomalies.append(
                Anomaly(
                    check="final-metadata",
                    kind=str(p.get("kind", "problem")),
                    message=str(p.get("message", "")),
                    run=run.name,
                    key=str(p["target"]) if p.get("target") is not None else None,
                    witness=({"target": p.get("target"), "kind": p.get("kind")},),
                )
            )
    return result_of(
        "final-metadata",
        anomalies,
        unknown=bool(missing),
        detail={"applicable": checked > 0 or bool(missing), "runs": checked, "missing": missing},
    )


def _summary(run: RunInput) -> dict[str, Any] | None:
    path = run.path / "summary.json" if run.path.is_dir() else None
    if path is None or not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None

"""Throughput, latency and faults over time: the data behind the report's plots.

Jepsen's ``perf`` checker draws the same three things (latency of each op
against time, throughput in buckets, nemesis activity shaded) so that a reader
can see what each fault did to the clients.  Here the aggregation runs in
Spark: the executors group the paired operations (the PAIRED table, one row
per op) into buckets and compute counts and approximate latency quantiles
(``percentile_approx``, Greenwald-Khanna); only those few aggregated rows (at
most runs x buckets x functions x 3 types) come to the driver, so ten million
operations cost no more driver memory than ten.

Time is the history's ``time`` base: nanoseconds since the run started
(``docs/history-format.md``).  A run spans ``[0, end]``, ``end`` being the
latest time any of its operations or faults carries, cut into ``buckets``
equal intervals.  An ok or fail op is counted in the bucket of its completion
(``ret``); an ``info`` op has no completion time in PAIRED (its interval is
open-ended) and no latency, so it is counted in the bucket of its invoke.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = [
    "DEFAULT_BUCKETS",
    "QUANTILES",
    "BucketStats",
    "FaultInterval",
    "RunTimeline",
    "Timeline",
    "timeline",
]

DEFAULT_BUCKETS = 200

# The latency quantiles kept per bucket (besides the maximum).
QUANTILES = (0.5, 0.95, 0.99)

# percentile_approx's default accuracy: relative error 1/10000 of the group's
# size, exact for groups of fewer than 10000 values.
_ACCURACY = 10_000

_NS_PER_S = 1e9
_NS_PER_MS = 1e6

_TYPES = ("ok", "fail", "info")

_OPS_COLUMNS = ("run", "f", "type", "call", "ret")
_NEMESIS_COLUMNS = ("run", "f", "kind", "nodes", "start", "end")


@dataclass(frozen=True, slots=True)
class BucketStats:
    """The completions of one function and type in one bucket of one run.

    ``throughput`` is completions per second of the bucket's width.  The
    latencies (``ret - call`` in milliseconds) are None for ``info`` ops.
    """

    bucket: int
    f: str
    type: str
    count: int
    throughput: float
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "f": self.f,
            "type": self.type,
            "count": self.count,
            "throughput": self.throughput,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> BucketStats:
        where = "a timeline bucket"
        return BucketStats(
            bucket=_int(obj, "bucket", where),
            f=_str(obj, "f", where),
            type=_str(obj, "type", where),
            count=_int(obj, "count", where),
            throughput=_float(obj, "throughput", where),
            p50_ms=_opt_float(obj, "p50_ms", where),
            p95_ms=_opt_float(obj, "p95_ms", where),
            p99_ms=_opt_float(obj, "p99_ms", where),
            max_ms=_opt_float(obj, "max_ms", where),
        )


@dataclass(frozen=True, slots=True)
class FaultInterval:
    """One fault of the nemesis, in seconds since the run started.

    ``ended`` is False when no op ended the fault; then ``end_s`` is the end of
    the run (the fault lasted at least that long).  ``nodes`` is the JSON text
    of the fault's nodes or partition groups, as in NEMESIS.
    """

    f: str
    kind: str | None
    nodes: str | None
    start_s: float
    end_s: float
    ended: bool = True

    @property
    def label(self) -> str:
        """What the report names this fault by: its ``f`` and its kind, if any.

        A kind that already names the ``f`` (``kill-leader``) stands alone.
        """
        if not self.kind:
            return self.f
        return self.kind if self.kind.startswith(self.f) else f"{self.f} {self.kind}"

    def to_json(self) -> dict[str, Any]:
        return {
            "f": self.f,
            "kind": self.kind,
            "nodes": self.nodes,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "ended": self.ended,
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> FaultInterval:
        where = "a timeline fault"
        ended = obj.get("ended", True)
        if not isinstance(ended, bool):
            raise ValueError(f"{where}: 'ended' must be a boolean, not {ended!r}")
        return FaultInterval(
            f=_str(obj, "f", where),
            kind=_opt_str(obj, "kind", where),
            nodes=_opt_str(obj, "nodes", where),
            start_s=_float(obj, "start_s", where),
            end_s=_float(obj, "end_s", where),
            ended=ended,
        )


@dataclass(frozen=True, slots=True)
class RunTimeline:
    """One run: ``buckets`` intervals of ``bucket_s`` seconds from 0 to ``end_s``.

    ``rows`` holds only the non-empty (bucket, f, type) cells, sorted; a cell
    that is absent had no completion.
    """

    run: str
    end_s: float
    buckets: int
    bucket_s: float
    rows: tuple[BucketStats, ...] = ()
    faults: tuple[FaultInterval, ...] = ()

    def bucket_start_s(self, bucket: int) -> float:
        return bucket * self.bucket_s

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "end_s": self.end_s,
            "buckets": self.buckets,
            "bucket_s": self.bucket_s,
            "rows": [r.to_json() for r in self.rows],
            "faults": [x.to_json() for x in self.faults],
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> RunTimeline:
        run = _str(obj, "run", "a run timeline")
        where = f"the timeline of run {run!r}"
        return RunTimeline(
            run=run,
            end_s=_float(obj, "end_s", where),
            buckets=_int(obj, "buckets", where),
            bucket_s=_float(obj, "bucket_s", where),
            rows=tuple(BucketStats.from_json(r) for r in _list(obj, "rows", where)),
            faults=tuple(FaultInterval.from_json(x) for x in _list(obj, "faults", where)),
        )


@dataclass(frozen=True, slots=True)
class Timeline:
    """The timelines of every run of a verification, sorted by run name."""

    buckets: int
    runs: tuple[RunTimeline, ...] = ()

    def run(self, name: str) -> RunTimeline:
        for r in self.runs:
            if r.run == name:
                return r
        have = [r.run for r in self.runs]
        raise KeyError(f"no timeline of run {name!r} (runs: {have})")

    def per_run(self) -> dict[str, Timeline]:
        """One Timeline per run, keyed by run name (what ``render_report`` takes)."""
        return {r.run: Timeline(self.buckets, (r,)) for r in self.runs}

    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "buckets": self.buckets, "runs": [r.to_json() for r in self.runs]}

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Timeline:
        if not isinstance(obj, Mapping):
            raise ValueError(f"a timeline must be a JSON object, not {type(obj).__name__}")
        if obj.get("format") != 1:
            raise ValueError(f"a timeline's format must be 1, not {obj.get('format')!r}")
        return Timeline(
            buckets=_int(obj, "buckets", "a timeline"),
            runs=tuple(RunTimeline.from_json(r) for r in _list(obj, "runs", "a timeline")),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @staticmethod
    def loads(text: str) -> Timeline:
        return Timeline.from_json(json.loads(text))


def timeline(ops: DataFrame, nemesis: DataFrame, *, buckets: int = DEFAULT_BUCKETS) -> Timeline:
    """Throughput and latency per bucket, function and type, and the faults, of every run.

    ``ops`` has the PAIRED columns (at least run, f, type, call, ret),
    ``nemesis`` the NEMESIS ones (at least run, f, kind, nodes, start, end).
    """
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets must be a positive integer, not {buckets!r}")
    _require(ops, _OPS_COLUMNS, "ops (PAIRED)")
    _require(nemesis, _NEMESIS_COLUMNS, "nemesis (NEMESIS)")

    # Each run's end: the latest time any op or fault of it carries.  greatest()
    # skips NULLs (an info op's ret, an unended fault's end).
    times = ops.select("run", F.greatest("call", "ret").alias("t")).unionByName(
        nemesis.select("run", F.greatest("start", "end").alias("t"))
    )
    # At least 1 ns, so that a run whose every op is at time 0 still has a width.
    spans = times.groupBy("run").agg(F.greatest(F.max("t"), F.lit(1)).alias("end_ns"))
    span_rows = spans.collect()  # one row per run
    ends: dict[str, int] = {}
    for row in span_rows:
        if row["run"] is None:
            raise ValueError("ops or nemesis has a row whose run is NULL")
        ends[row["run"]] = int(row["end_ns"])

    at = F.coalesce(F.col("ret"), F.col("call"))
    # Bucket i covers [i*end/B, (i+1)*end/B); the run's last instant goes in the last
    # one.  Integer arithmetic: ns times of hours of running times 200 fit a long.
    bucket: Column = F.least(
        F.floor(at * F.lit(buckets) / F.col("end_ns")).cast("long"), F.lit(buckets - 1)
    )
    completed = F.col("type").isin("ok", "fail") & F.col("ret").isNotNull()
    latency = F.when(completed, (F.col("ret") - F.col("call")) / F.lit(_NS_PER_MS))
    per_bucket = (
        ops.select("run", "f", "type", "call", "ret")
        .join(F.broadcast(spans), "run")
        .select(
            "run",
            "f",
            "type",
            bucket.alias("bucket"),
            latency.cast("double").alias("latency_ms"),
        )
        .groupBy("run", "bucket", "f", "type")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.percentile_approx("latency_ms", list(QUANTILES), _ACCURACY).alias("q"),
            F.max("latency_ms").alias("max_ms"),
        )
    )
    rows: dict[str, list[BucketStats]] = {run: [] for run in ends}
    for row in per_bucket.collect():
        run = row["run"]
        if row["type"] not in _TYPES:
            raise ValueError(
                f"ops: run {run!r} has {row['f']!r} ops whose type is {row['type']!r}, "
                "not ok, fail or info"
            )
        width_s = ends[run] / buckets / _NS_PER_S
        q = row["q"]
        p50, p95, p99 = (None, None, None) if q is None else (q[0], q[1], q[2])
        rows[run].append(
            BucketStats(
                bucket=int(row["bucket"]),
                f=row["f"],
                type=row["type"],
                count=int(row["count"]),
                throughput=row["count"] / width_s,
                p50_ms=_maybe(p50),
                p95_ms=_maybe(p95),
                p99_ms=_maybe(p99),
                max_ms=_maybe(row["max_ms"]),
            )
        )

    faults: dict[str, list[FaultInterval]] = {run: [] for run in ends}
    fault_rows = nemesis.select("run", "f", "kind", "nodes", "start", "end").collect()
    for row in fault_rows:
        run = row["run"]
        if row["start"] is None:
            raise ValueError(f"nemesis: run {run!r} has a {row['f']!r} fault with no start")
        end = row["end"]
        faults[run].append(
            FaultInterval(
                f=row["f"],
                kind=row["kind"],
                nodes=row["nodes"],
                start_s=row["start"] / _NS_PER_S,
                end_s=(ends[run] if end is None else end) / _NS_PER_S,
                ended=end is not None,
            )
        )

    out = []
    for run in sorted(ends):
        end_ns = ends[run]
        out.append(
            RunTimeline(
                run=run,
                end_s=end_ns / _NS_PER_S,
                buckets=buckets,
                bucket_s=end_ns / buckets / _NS_PER_S,
                rows=tuple(sorted(rows[run], key=lambda r: (r.bucket, r.f, _TYPES.index(r.type)))),
                faults=tuple(sorted(faults[run], key=lambda x: (x.start_s, x.end_s, x.f))),
            )
        )
    return Timeline(buckets, tuple(out))


def _require(df: DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks the column(s) {missing}; it has {df.columns}")


def _maybe(x: Any) -> float | None:
    return None if x is None else float(x)


def _list(obj: Mapping[str, Any], name: str, where: str) -> list[Any]:
    v = obj.get(name)
    if not isinstance(v, list):
        raise ValueError(f"{where}: {name!r} must be a list, not {v!r}")
    return v


def _str(obj: Mapping[str, Any], name: str, where: str) -> str:
    v = obj.get(name)
    if not isinstance(v, str):
        raise ValueError(f"{where}: {name!r} must be a string, not {v!r}")
    return v


def _opt_str(obj: Mapping[str, Any], name: str, where: str) -> str | None:
    v = obj.get(name)
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{where}: {name!r} must be a string or null, not {v!r}")
    return v


def _int(obj: Mapping[str, Any], name: str, where: str) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}: {name!r} must be an integer, not {v!r}")
    return v


def _float(obj: Mapping[str, Any], name: str, where: str) -> float:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where}: {name!r} must be a finite number, not {v!r}")
    return float(v)


def _opt_float(obj: Mapping[str, Any], name: str, where: str) -> float | None:
    return None if obj.get(name) is None else _float(obj, name, where)

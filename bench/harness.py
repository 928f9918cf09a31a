"""Common harness of the kq-versus-etcd benchmark (``bench/vs_etcd.py``).

The four workloads are written once, against the :class:`Target` protocol,
so every system is driven by the same asyncio code and the same client
style (one grpc.aio client per target, many concurrent calls on it):

* :func:`sequential`: one write at a time; commits/s and latency p50/p99.
* :func:`concurrent`: ``writers`` coroutines writing back to back for a fixed
  time; commits/s and latency p50/p99.
* :func:`batched`: ``producers`` coroutines each sending batches of
  ``records`` records (``Target.put_many``), as Kafka producers do;
  records/s.
* :func:`failover`: under a light concurrent load, SIGKILL the leader and
  time from the kill to the first commit of a write *sent after the kill*;
  restart the killed member, wait until healthy, repeat.

Every loop is bounded in count and in time, and every request in time.

A system plugs in as a module ``bench/cluster_<name>.py`` that defines::

    def open_target(
        workdir: pathlib.Path, security: Security
    ) -> AbstractAsyncContextManager[Target]

an async context manager that starts a 3-member cluster on loopback (data and
logs under ``workdir``), in plaintext or with mutual TLS between members and
between the client and the members (:class:`Security`), yields a
:class:`Target` connected to it, and stops every process it started (by
pid) on exit, also on failure.  ``vs_etcd.py`` keeps the registry of such
modules.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime
import enum
import importlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

from bench.partition import partition as partition_workload

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
GEN_DIR = BENCH_DIR / ".gen"


class Security(enum.Enum):
    """How a cluster under test is reached and how its members talk."""

    PLAINTEXT = "plaintext"
    # Mutual TLS: every member and the client present a certificate of the
    # cluster's CA and verify the other side's.
    TLS = "tls"


def parse_securities(text: str) -> list[Security]:
    """``plaintext,tls`` -> the modes in that order; ValueError naming an
    unknown or repeated one."""
    known = {s.value: s for s in Security}
    out: list[Security] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if word not in known:
            raise ValueError(f"unknown security mode {word!r}; known: {', '.join(known)}")
        if known[word] in out:
            raise ValueError(f"security mode {word!r} given twice")
        out.append(known[word])
    if not out:
        raise ValueError("no security mode given (plaintext, tls or both)")
    return out


class Target(Protocol):
    """A 3-member replicated key-value cluster under test, and its client.

    Contract (what the workloads rely on):

    * ``put`` returns only once the write is committed: durable (fsynced) on
      a majority and applied.  It raises on any failure, including its own
      per-request deadline; it never retries by itself.  After a failure the
      target may switch to another member for later calls (as a real client
      would on a refused connection or a "not leader" answer); the caller
      retries with a fresh call.  Many calls may be in flight at once.
    * ``put_many`` is ``put`` for many records: all committed when it returns.
      It may split them into several requests (etcd: one Txn per 128 puts,
      etcd's default --max-txn-ops).
    * ``leader_pid`` is the operating-system pid of the current leader.
    * ``kill_leader`` finds the leader and sends it SIGKILL as its last act
      (the harness starts the failover clock when it returns), and returns
      the killed pid.  The member stays down until ``restart_killed``.
    * ``restart_killed`` restarts every killed member and returns once the
      cluster is healthy again: all members up, one leader, all caught up.
    * ``close`` releases the client (the cluster itself is stopped by the
      context manager that made the target).

    Optionally a target may define ``async def describe(self) -> dict``
    (version, flags) for the JSON output.
    """

    name: str

    async def put(self, key: bytes, value: bytes) -> None: ...

    async def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None: ...

    async def leader_pid(self) -> int: ...

    async def kill_leader(self) -> int: ...

    async def restart_killed(self) -> None: ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------
# Statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by linear interpolation
    between closest ranks (numpy's default method).  Raises ValueError on an
    empty sequence or a ``q`` outside 0..100."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50/p99/mean/min/max of latencies given in seconds, in milliseconds
    (all None when there are none)."""
    if not seconds:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None, "min_ms": None, "max_ms": None}
    return {
        "p50_ms": percentile(seconds, 50) * 1e3,
        "p99_ms": percentile(seconds, 99) * 1e3,
        "mean_ms": sum(seconds) / len(seconds) * 1e3,
        "min_ms": min(seconds) * 1e3,
        "max_ms": max(seconds) * 1e3,
    }


# --------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class Params:
    """Workload parameters; :func:`full_params` and :func:`quick_params` are
    the two presets of ``vs_etcd.py``."""

    value_size: int = 100
    # How long one write may take before it counts as failed.
    request_timeout_s: float = 10.0
    # Steady-state workloads abort after this many failed writes.
    max_errors: int = 100
    seq_writes: int = 10_000
    seq_max_s: float = 60.0
    conc_writers: int = 32
    conc_warmup_s: float = 1.0
    conc_duration_s: float = 15.0
    batch_records: int = 1000
    batch_producers: int = 4
    batch_warmup_s: float = 1.0
    batch_duration_s: float = 15.0
    failover_trials: int = 20
    failover_load_writers: int = 4
    # A fresh write is started this often after the kill (on top of the
    # load), so the recovery time is resolved to about this much.
    failover_probe_interval_s: float = 0.01
    # Per-write deadline during failover: a write stuck on a dead leader is
    # abandoned after this and the writer tries again.
    failover_request_timeout_s: float = 2.0
    # Load before each kill; also the pause after each restart.
    failover_settle_s: float = 1.0
    # A trial whose writes have not recovered by then counts as failed.
    failover_max_wait_s: float = 30.0
    # Bound on the whole failover workload.
    failover_max_total_s: float = 900.0
    # Failover by partition (bench/partition.py): trials, each cutting the
    # leader off with iptables; skipped where that is not possible.
    partition_trials: int = 20


def full_params() -> Params:
    return Params()


def quick_params() -> Params:
    return Params(
        seq_writes=1000,
        seq_max_s=20.0,
        conc_warmup_s=0.5,
        conc_duration_s=3.0,
        batch_warmup_s=0.5,
        batch_duration_s=3.0,
        failover_trials=3,
        failover_settle_s=0.5,
        failover_max_total_s=180.0,
        partition_trials=3,
    )


# --------------------------------------------------------------------------
# Workloads


def now() -> float:
    return time.perf_counter()


def make_value(size: int) -> bytes:
    return (b"kq-bench-" * (size // 9 + 1))[:size]


def make_key(prefix: str, i: int) -> bytes:
    # Keys cycle over a bounded key space so the stores' key sets stay small
    # (etcd still keeps every revision until compaction).
    return f"bench/{prefix}/{i % 100_000:06d}".encode()


class TooManyErrors(RuntimeError):
    pass


class _Errors:
    def __init__(self, limit: int, workload: str) -> None:
        self.count = 0
        self.limit = limit
        self.workload = workload
        self.last: str | None = None

    def add(self, exc: BaseException) -> None:
        self.count += 1
        self.last = f"{type(exc).__name__}: {exc}"[:500]
        if self.count > self.limit:
            raise TooManyErrors(f"{self.workload}: {self.count} failed writes; last: {self.last}")


async def first_success(calls: Sequence[Awaitable[Any]], failure: str) -> None:
    """Return as soon as one of ``calls`` (run at once) succeeds, cancelling
    the others; ``RuntimeError(failure)`` if every one fails."""
    started = [asyncio.ensure_future(call) for call in calls]
    try:
        for next_done in asyncio.as_completed(started):
            with contextlib.suppress(Exception):
                await next_done
                return
        raise RuntimeError(failure)
    finally:
        for call in started:
            call.cancel()


async def _timed(call: Awaitable[None], timeout: float) -> None:
    await asyncio.wait_for(call, timeout)


async def sequential(target: Target, p: Params) -> dict[str, Any]:
    """``p.seq_writes`` writes one at a time (at most ``p.seq_max_s``)."""
    value = make_value(p.value_size)
    errors = _Errors(p.max_errors, "sequential")
    latencies: list[float] = []
    start = now()
    for i in range(p.seq_writes):
        if now() - start > p.seq_max_s:
            break
        t0 = now()
        try:
            await _timed(target.put(make_key("seq", i), value), p.request_timeout_s)
        except Exception as exc:
            errors.add(exc)
            continue
        latencies.append(now() - t0)
    elapsed = now() - start
    return {
        "writes": len(latencies),
        "errors": errors.count,
        "last_error": errors.last,
        "seconds": elapsed,
        "commits_per_s": len(latencies) / elapsed if elapsed > 0 else 0.0,
        **latency_summary(latencies),
    }


async def _run_window(
    workers: int,
    warmup_s: float,
    duration_s: float,
    one: Callable[[int, int], Awaitable[int]],
    errors: _Errors,
    timeout: float,
) -> tuple[int, list[float], float]:
    """Run ``workers`` coroutines calling ``one(worker, seq)`` back to back
    for ``warmup_s + duration_s``; count what ``one`` returns (records) and
    the latency of every call that started and finished inside the
    measurement window (after the warm-up).  Returns (records, latencies,
    window seconds)."""
    t_start = now()
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s
    records = 0
    latencies: list[float] = []
    failure: list[BaseException] = []

    async def worker(w: int) -> None:
        nonlocal records
        seq = 0
        while now() < t_end and not failure:
            t0 = now()
            seq += 1
            try:
                n = await asyncio.wait_for(one(w, seq), timeout)
            except Exception as exc:
                try:
                    errors.add(exc)
                except TooManyErrors as too_many:
                    failure.append(too_many)
                await asyncio.sleep(0.01)
                continue
            t1 = now()
            if t0 >= t_measure and t1 <= t_end:
                records += n
                latencies.append(t1 - t0)

    await asyncio.gather(*(worker(w) for w in range(workers)))
    if failure:
        raise failure[0]
    return records, latencies, duration_s


async def concurrent(target: Target, p: Params) -> dict[str, Any]:
    """``p.conc_writers`` writers, each writing back to back, for
    ``p.conc_duration_s`` after ``p.conc_warmup_s`` of warm-up."""
    value = make_value(p.value_size)
    errors = _Errors(p.max_errors, "concurrent")

    async def one(w: int, seq: int) -> int:
        await target.put(make_key(f"conc/{w}", seq), value)
        return 1

    writes, latencies, window = await _run_window(
        p.conc_writers, p.conc_warmup_s, p.conc_duration_s, one, errors, p.request_timeout_s
    )
    return {
        "writers": p.conc_writers,
        "writes": writes,
        "errors": errors.count,
        "last_error": errors.last,
        "seconds": window,
        "commits_per_s": writes / window,
        **latency_summary(latencies),
    }


async def batched(target: Target, p: Params) -> dict[str, Any]:
    """``p.batch_producers`` producers, each sending batches of
    ``p.batch_records`` records back to back."""
    value = make_value(p.value_size)
    errors = _Errors(p.max_errors, "batched")

    async def one(w: int, seq: int) -> int:
        base = seq * p.batch_records
        items = [(make_key(f"batch/{w}", base + r), value) for r in range(p.batch_records)]
        await target.put_many(items)
        return len(items)

    records, latencies, window = await _run_window(
        p.batch_producers, p.batch_warmup_s, p.batch_duration_s, one, errors, p.request_timeout_s
    )
    batch_lat = latency_summary(latencies)
    return {
        "producers": p.batch_producers,
        "records_per_batch": p.batch_records,
        "records": records,
        "batches": len(latencies),
        "errors": errors.count,
        "last_error": errors.last,
        "seconds": window,
        "records_per_s": records / window,
        "batch_p50_ms": batch_lat["p50_ms"],
        "batch_p99_ms": batch_lat["p99_ms"],
    }


@dataclass
class FailoverTrial:
    trial: int
    killed_pid: int
    recovered: bool
    # Kill to the commit of the first write sent after the kill.
    recovery_s: float | None
    new_leader_pid: int | None
    load_writes_before_kill: int


async def failover_trial(target: Target, p: Params, trial: int) -> FailoverTrial:
    """One trial: load, kill the leader, wait for the first commit of a
    write sent after the kill, stop the load, restart the killed member."""
    value = make_value(p.value_size)
    stop = asyncio.Event()
    recovered = asyncio.Event()
    t_kill: float | None = None
    first_commit: float | None = None
    before_kill = 0
    probes: set[asyncio.Task[bool]] = set()
    timeout = p.failover_request_timeout_s

    async def write(key: bytes) -> bool:
        nonlocal first_commit, before_kill
        t0 = now()
        try:
            await asyncio.wait_for(target.put(key, value), timeout)
        except Exception:
            return False
        t1 = now()
        if t_kill is None:
            before_kill += 1
        elif t0 >= t_kill and (first_commit is None or t1 < first_commit):
            first_commit = t1
            recovered.set()
        return True

    async def load_writer(w: int) -> None:
        seq = 0
        deadline = now() + p.failover_settle_s + p.failover_max_wait_s + 2 * timeout
        while not stop.is_set() and now() < deadline:
            ok = await write(make_key(f"fail/{trial}/{w}", seq))
            seq += 1
            if not ok:
                await asyncio.sleep(0.005)

    async def prober() -> None:
        # A fresh write every probe interval, so recovery is seen as soon as
        # the cluster can commit, not when some stuck write times out.
        seq = 0
        cap = max(1, int(timeout / p.failover_probe_interval_s) + 1)
        while not stop.is_set() and not recovered.is_set():
            if len(probes) < cap:
                task = asyncio.create_task(write(make_key(f"probe/{trial}", seq)))
                probes.add(task)
                task.add_done_callback(probes.discard)
                seq += 1
            await asyncio.sleep(p.failover_probe_interval_s)

    loaders = [asyncio.create_task(load_writer(w)) for w in range(p.failover_load_writers)]
    probe_task: asyncio.Task[None] | None = None
    killed_pid = -1
    try:
        await asyncio.sleep(p.failover_settle_s)
        killed_pid = await target.kill_leader()
        t_kill = now()
        probe_task = asyncio.create_task(prober())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(recovered.wait(), p.failover_max_wait_s)
    finally:
        stop.set()
        pending: list[asyncio.Task[Any]] = [*loaders, *probes]
        if probe_task is not None:
            pending.append(probe_task)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    new_leader: int | None = None
    if first_commit is not None:
        try:
            new_leader = await asyncio.wait_for(target.leader_pid(), 10.0)
        except Exception:
            new_leader = None
    await target.restart_killed()
    return FailoverTrial(
        trial=trial,
        killed_pid=killed_pid,
        recovered=first_commit is not None,
        recovery_s=None if first_commit is None or t_kill is None else first_commit - t_kill,
        new_leader_pid=new_leader,
        load_writes_before_kill=before_kill,
    )


async def failover(
    target: Target, p: Params, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """``p.failover_trials`` kill-the-leader trials (bounded by
    ``p.failover_max_total_s`` overall)."""
    trials: list[FailoverTrial] = []
    start = now()
    for i in range(p.failover_trials):
        if now() - start > p.failover_max_total_s:
            break
        trial = await failover_trial(target, p, i)
        trials.append(trial)
        if log is not None:
            shown = (
                "no recovery" if trial.recovery_s is None else f"{trial.recovery_s * 1e3:.0f} ms"
            )
            log(f"failover trial {i + 1}/{p.failover_trials}: {shown}")
        await asyncio.sleep(p.failover_settle_s)
    times = [t.recovery_s for t in trials if t.recovery_s is not None]
    return {
        "trials": len(trials),
        "recovered": len(times),
        "failed": len(trials) - len(times),
        "seconds": now() - start,
        **latency_summary(times),
        "trial_results": [asdict(t) for t in trials],
    }


WORKLOADS: dict[str, Callable[[Target, Params], Awaitable[dict[str, Any]]]] = {
    "sequential": sequential,
    "concurrent": concurrent,
    "batched": batched,
    "failover": failover,
}


async def run_all(
    target: Target, p: Params, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """All the workloads in order, on one cluster (failover by partition
    for targets that offer it: bench/partition.py)."""
    results: dict[str, Any] = {}
    describe = getattr(target, "describe", None)
    if describe is not None:
        results["system"] = await describe()
    for name in ("sequential", "concurrent", "batched"):
        if log is not None:
            log(f"{target.name}: {name}")
        results[name] = await WORKLOADS[name](target, p)
    if log is not None:
        log(f"{target.name}: failover")
    results["failover"] = await failover(target, p, log)
    if p.partition_trials > 0 and hasattr(target, "put_to_others"):
        if log is not None:
            log(f"{target.name}: failover by partition")
        results["partition"] = await partition_workload(
            cast(Any, target),
            p.partition_trials,
            latency_summary,
            now,
            log,
            settle_s=p.failover_settle_s,
            probe_interval_s=p.failover_probe_interval_s,
            request_timeout_s=p.failover_request_timeout_s,
            max_wait_s=p.failover_max_wait_s,
        )
    return results


def fsync_probe(directory: Path, count: int = 500, size: int = 4096) -> dict[str, float | None]:
    """Latency of ``count`` write+fdatasync pairs of ``size`` bytes to one
    file in ``directory`` (the file is removed): what one fsync costs on
    the disk the cluster's data is on, measured in the same run."""
    path = directory / f".fsync-probe-{os.getpid()}"
    block = b"\0" * size
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(count):
            os.write(fd, block)
            t0 = now()
            os.fdatasync(fd)
            times.append(now() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return latency_summary(times)


# --------------------------------------------------------------------------
# Reporting

# (label, workload, key, higher is better)
METRICS: list[tuple[str, str, str, bool]] = [
    ("sequential commits/s", "sequential", "commits_per_s", True),
    ("sequential p50 ms", "sequential", "p50_ms", False),
    ("sequential p99 ms", "sequential", "p99_ms", False),
    ("32 writers commits/s", "concurrent", "commits_per_s", True),
    ("32 writers p50 ms", "concurrent", "p50_ms", False),
    ("32 writers p99 ms", "concurrent", "p99_ms", False),
    ("batched records/s", "batched", "records_per_s", True),
    ("failover p50 ms", "failover", "p50_ms", False),
    ("failover p99 ms", "failover", "p99_ms", False),
    ("partition failover p50 ms", "partition", "p50_ms", False),
    ("partition failover p99 ms", "partition", "p99_ms", False),
]


def metric(result: dict[str, Any], workload: str, key: str) -> float | None:
    value = result.get(workload, {}).get(key)
    return None if value is None else float(value)


def ratios(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, float | None]:
    """numerator/denominator for every metric of METRICS (None where either
    is missing or the denominator's is 0): kq/etcd, or TLS/plaintext."""
    out: dict[str, float | None] = {}
    for label, workload, key, _ in METRICS:
        a = metric(numerator, workload, key)
        b = metric(denominator, workload, key)
        out[label] = None if a is None or b is None or b == 0 else a / b
    return out


# One round: system -> security mode ("plaintext", "tls") -> its results.
Round = dict[str, dict[str, dict[str, Any]]]


def round_ratios(results: Round) -> dict[str, dict[str, dict[str, float | None]]]:
    """The ratios of one round: kq/etcd for each mode both ran in, and
    TLS/plaintext for each system that ran both."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    kq, etcd = results.get("kq", {}), results.get("etcd", {})
    both = [s.value for s in Security if s.value in kq and s.value in etcd]
    if both:
        out["kq_over_etcd"] = {mode: ratios(kq[mode], etcd[mode]) for mode in both}
    plain, tls = Security.PLAINTEXT.value, Security.TLS.value
    paired = {name: r for name, r in results.items() if plain in r and tls in r}
    if paired:
        out["tls_over_plaintext"] = {name: ratios(r[tls], r[plain]) for name, r in paired.items()}
    return out


def ratio_ranges(
    per_round: Sequence[dict[str, dict[str, dict[str, float | None]]]],
) -> dict[str, dict[str, dict[str, dict[str, float | int | None]]]]:
    """Over rounds: each ratio's median, min and max and how many rounds
    gave it (family -> group -> metric -> summary)."""
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in per_round:
        for family, groups in r.items():
            for group, figures in groups.items():
                for label, value in figures.items():
                    bucket = values.setdefault(family, {}).setdefault(group, {})
                    bucket.setdefault(label, [])
                    if value is not None:
                        bucket[label].append(value)
    return {
        family: {
            group: {
                label: {
                    "median": statistics.median(vs) if vs else None,
                    "min": min(vs) if vs else None,
                    "max": max(vs) if vs else None,
                    "rounds": len(vs),
                }
                for label, vs in figures.items()
            }
            for group, figures in groups.items()
        }
        for family, groups in values.items()
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def format_table(name: str, result: dict[str, Any], security: Security | None = None) -> str:
    """A plain-text table of one system's figures (in one security mode)."""
    lines = [f"== {name}" if security is None else f"== {name}, {security.value}"]
    system = result.get("system")
    if system:
        lines.append("   " + ", ".join(f"{k}={v}" for k, v in system.items()))
    width = max(len(label) for label, *_ in METRICS)
    for label, workload, key, _ in METRICS:
        lines.append(f"   {label:<{width}}  {_fmt(metric(result, workload, key)):>10}")
    probe = result.get("fsync_probe")
    if probe:
        lines.append(
            f"   fdatasync of 4 KiB on the data disk: p50 {_fmt(probe.get('p50_ms'))} ms, "
            f"p99 {_fmt(probe.get('p99_ms'))} ms"
        )
    for workload in ("sequential", "concurrent", "batched"):
        count = result.get(workload, {}).get("errors")
        if count:
            last = result[workload].get("last_error")
            lines.append(f"   {workload}: {count} failed writes (last: {last})")
    failover_result = result.get("failover", {})
    if failover_result:
        lines.append(
            f"   failover trials: {failover_result.get('trials')} "
            f"({failover_result.get('failed')} without recovery)"
        )
    cut = result.get("partition", {})
    if cut.get("skipped"):
        lines.append(f"   partition trials: skipped ({cut['skipped']})")
    elif cut:
        lines.append(
            f"   partition trials: {cut.get('trials')} ({cut.get('failed')} without recovery)"
        )
    return "\n".join(lines)


BETTER = "throughput: higher is better for kq; latency, failover: lower"
KQ_OVER_ETCD = f"kq/etcd ({BETTER})"


def format_ratios(r: dict[str, float | None], title: str = KQ_OVER_ETCD) -> str:
    lines = [f"== {title}"]
    width = max(len(label) for label in r)
    for label, value in r.items():
        lines.append(f"   {label:<{width}}  {'-' if value is None else f'{value:.2f}':>10}")
    return "\n".join(lines)


def format_round_ratios(r: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """Every ratio of one round, one table per ratio."""
    out = []
    for mode, figures in r.get("kq_over_etcd", {}).items():
        out.append(format_ratios(figures, f"kq/etcd, {mode} ({BETTER})"))
    for name, figures in r.get("tls_over_plaintext", {}).items():
        out.append(format_ratios(figures, f"{name}: TLS/plaintext (the cost of TLS)"))
    return "\n".join(out)


def format_ranges(ranges: dict[str, dict[str, dict[str, dict[str, float | int | None]]]]) -> str:
    """Each ratio as median [min..max] over the rounds."""
    titles = {"kq_over_etcd": "kq/etcd, {}", "tls_over_plaintext": "{}: TLS/plaintext"}
    out = []
    for family, groups in ranges.items():
        for group, figures in groups.items():
            title = titles.get(family, family + ", {}").format(group)
            rounds = max((int(f["rounds"] or 0) for f in figures.values()), default=0)
            lines = [f"== {title}, median [min..max] over {rounds} rounds"]
            width = max(len(label) for label in figures)
            for label, f in figures.items():
                med, lo, hi = (cast(float | None, f[k]) for k in ("median", "min", "max"))
                shown = "-" if med is None else f"{med:.2f} [{lo:.2f}..{hi:.2f}]"
                lines.append(f"   {label:<{width}}  {shown:>20}")
            out.append("\n".join(lines))
    return "\n".join(out)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def result_document(
    rounds: Sequence[Round], p: Params, preset: str, securities: Sequence[Security]
) -> dict[str, Any]:
    """The JSON document of a run: each round's results (system -> mode ->
    figures) and ratios, and the ratios' ranges over the rounds."""
    per_round = [round_ratios(r) for r in rounds]
    return {
        "benchmark": "kq vs etcd",
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "git_commit": _git_commit(),
        "preset": preset,
        "params": asdict(p),
        "securities": [s.value for s in securities],
        "rounds": [
            {"round": i + 1, "systems": r, **{f"ratios_{k}": v for k, v in ratio.items()}}
            for i, (r, ratio) in enumerate(zip(rounds, per_round, strict=True))
        ],
        "ratio_ranges": ratio_ranges(per_round),
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


# --------------------------------------------------------------------------
# Generated gRPC code


def load_proto(proto: Path) -> tuple[ModuleType, ModuleType]:
    """Generate the ``_pb2`` and ``_pb2_grpc`` modules of ``proto`` with the
    venv's grpc_tools.protoc into a fresh directory under ``bench/.gen/``
    (ignored by git, removed at exit) and import them.  Generated code is
    never committed.  Idempotent within a process."""
    stem = proto.stem
    pb2_name, grpc_name = f"{stem}_pb2", f"{stem}_pb2_grpc"
    if pb2_name in sys.modules and grpc_name in sys.modules:
        return sys.modules[pb2_name], sys.modules[grpc_name]
    import grpc_tools
    from grpc_tools import protoc

    GEN_DIR.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=GEN_DIR))
    atexit.register(shutil.rmtree, out, True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto.parent}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(proto),
        ]
    )
    if status != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {proto} (status {status})")
    # The _pb2_grpc module imports its _pb2 module by its top-level name.
    sys.path.insert(0, str(out))
    return importlib.import_module(pb2_name), importlib.import_module(grpc_name)

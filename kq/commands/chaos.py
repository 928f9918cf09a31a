"""``kq chaos``: run chaos tests against a real cluster and list past runs.

- ``kq chaos run``: one run (:func:`chaos.runner.run_chaos`), with a line of
  progress per second and per fault, and the run folder at the end.  Exit
  status 0 when the run completed, the cluster recovered and the history is
  well formed; 1 otherwise (saying why); 2 for bad usage.
- ``kq chaos list``: the runs of a runs folder, newest last.
- ``kq chaos catalogue``: every deliberate bug (:mod:`bugs`) run under the
  faults that expose it, each run verified with Spark, then clean runs
  (:mod:`chaos.catalogue`).  Exit status 0 when every bug was caught and
  no clean run raised anything; 1 otherwise; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bugs
from chaos.runner import (
    BACKENDS,
    NEMESES,
    REGISTER_STORES,
    WORKLOADS,
    Progress,
    RunConfig,
    expand_nemesis,
    run_chaos,
    summary_of,
)
from chaos.workloads.queue_setup import ACKS, CLEANUP_POLICIES, QueueOptions
from history.runs import check_run, find_runs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    format_table,
    print_json,
    probability,
    run_async,
)

__all__ = ["register"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number, got {text}")
    return value


def _retention(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (no limit) or more, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _nemesis(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name some faults, or none")
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in NEMESES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown nemesis {', '.join(unknown)}; known: {', '.join(NEMESES)}, or none"
        )
    return names


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _group_id(text: str) -> str:
    # A run's replay command repeats it as one word.
    if not text or not text.isprintable() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a group id: printable characters, no spaces"
        )
    return text


def _bugs(text: str) -> frozenset[bugs.Bug]:
    try:
        found = bugs.parse(text)
    except bugs.BugSwitchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not found:
        raise argparse.ArgumentTypeError("name some bugs (ids such as B5 or names)")
    return found


def register(subparsers: Subparsers) -> None:
    """Register ``kq chaos``."""
    sub = add_command_group(
        subparsers,
        "chaos",
        help="run chaos tests against a real cluster; list and check past runs",
        description="Run a workload against a real cluster while a nemesis injects faults, "
        "and record everything in a run folder (docs/chaos.md).",
        title="subcommands",
    )

    run = sub.add_parser(
        "run",
        help="one chaos run",
        description="Start a cluster, run a workload against it while the nemesis injects "
        "faults, heal, read every key, collect the nodes' logs and exports, stop the cluster. "
        "Exit status: 0 the run completed, the cluster recovered, the history is well "
        "formed and the workload's final check (if any) passed; 1 otherwise; 2 bad usage.",
    )
    run.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="local",
        help="where the cluster runs: local (processes on this host) or docker (one "
        "container per node) (default: %(default)s)",
    )
    run.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="register",
        help="what the clients do (default: %(default)s)",
    )
    run.add_argument(
        "--nemesis",
        type=_nemesis,
        default="kill,pause,partition",
        metavar="F[,F...]",
        help=f"the faults to inject, comma-separated, or none: {', '.join(NEMESES)} "
        "(partition: every partition kind the cluster size allows; packet: slow, lossy links "
        "between nodes, and rotate-certs: every node's certificate re-issued while it runs, "
        "only when named) (default: %(default)s)",
    )
    run.add_argument(
        "--insecure",
        action="store_true",
        help="run the cluster PLAINTEXT (no certificates, no authentication) instead of on "
        "mutual TLS, the default",
    )
    run.add_argument(
        "--time-limit",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="how long the workload runs (default: %(default)s)",
    )
    run.add_argument(
        "--rate",
        type=_positive_float,
        default=200.0,
        help="target operations per second over all clients (default: %(default)s)",
    )
    run.add_argument(
        "--concurrency",
        type=_positive_int,
        default=10,
        help="clients running at once (default: %(default)s)",
    )
    run.add_argument(
        "--nodes", type=_positive_int, default=3, help="cluster size (default: %(default)s)"
    )
    run.add_argument(
        "--keys", type=_positive_int, default=5, help="registers to use (default: %(default)s)"
    )
    run.add_argument(
        "--store",
        choices=sorted(REGISTER_STORES),
        default="configs",
        help="register workload: where the registers live: configs (the metadata "
        "controller's cluster configs, by conditional AlterConfigs) or kv (the quorum's "
        "key-value store, whose reads also carry versions) (default: %(default)s)",
    )
    run.add_argument(
        "--pin-clients",
        action="store_true",
        help="register workload on --store kv: bind each client to one node (process p to "
        "the p mod n-th), as Jepsen does, instead of following the leader; a node that does "
        "not lead refuses (not-leader), and a deposed leader is still asked",
    )
    queue = QueueOptions()
    run.add_argument(
        "--brokers",
        type=_positive_int,
        default=queue.brokers,
        help="queue workload: brokers in the cluster beside the --nodes controllers; faults "
        "may pick them as any node (default: %(default)s)",
    )
    run.add_argument(
        "--topics",
        type=_positive_int,
        default=queue.topics,
        help="queue workload: topics to create (default: %(default)s)",
    )
    run.add_argument(
        "--partitions",
        type=_positive_int,
        default=queue.partitions,
        help="queue workload: partitions of each topic; each partition is a key "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--replication-factor",
        type=_positive_int,
        default=queue.replication_factor,
        help="queue workload: replicas of each partition (default: %(default)s)",
    )
    run.add_argument(
        "--min-isr",
        type=_positive_int,
        default=queue.min_isr,
        help="queue workload: the topics' min.insync.replicas (default: %(default)s)",
    )
    run.add_argument(
        "--acks",
        choices=sorted(ACKS),
        default=queue.acks,
        help="queue workload: the producer's acks; all is idempotent (default: %(default)s)",
    )
    run.add_argument(
        "--max-send",
        type=_positive_int,
        default=queue.max_send,
        help="queue workload: the most records in one send op (default: %(default)s)",
    )
    run.add_argument(
        "--final-time",
        type=_positive_float,
        default=queue.final_time_s,
        metavar="SECONDS",
        help="queue workload: the final polls' deadline (default: %(default)s)",
    )
    run.add_argument(
        "--replica-fetch-max-bytes",
        type=_positive_int,
        default=None,
        metavar="BYTES",
        help="queue workload: the cluster's replica.fetch.max.bytes for the run (default: "
        "Kafka's 1 MiB); small, a follower back from a cut catches up over many fetches",
    )
    run.add_argument(
        "--replica-lag-ms",
        type=_positive_int,
        default=queue.replica_lag_ms,
        metavar="MS",
        help="queue workload: the cluster's replica.lag.time.max.ms for the run, short so "
        "that ISRs shrink and grow often (default: %(default)s)",
    )
    run.add_argument(
        "--cleanup-policy",
        choices=CLEANUP_POLICIES,
        default=queue.cleanup_policy,
        help="queue workload: the topics' cleanup.policy (default: %(default)s)",
    )
    run.add_argument(
        "--retention-ms",
        type=_retention,
        metavar="MS",
        help="queue workload: the topics' retention.ms, -1 for none (default: the cluster's)",
    )
    run.add_argument(
        "--retention-bytes",
        type=_retention,
        metavar="BYTES",
        help="queue workload: the topics' retention.bytes, -1 for none (default: the cluster's)",
    )
    run.add_argument(
        "--segment-bytes",
        type=_positive_int,
        metavar="BYTES",
        help="queue workload: the topics' segment.bytes, small so that retention and "
        "compaction act during a run (default: the cluster's)",
    )
    run.add_argument(
        "--record-keys",
        type=_non_negative_int,
        default=queue.record_keys,
        metavar="N",
        help="queue workload: record keys the values cycle through (value mod N), so that "
        "compaction has records to remove; 0: each partition's records share one "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--group",
        type=_group_id,
        metavar="GROUP",
        help="queue workload: the consumers subscribe in this consumer group and commit "
        "offsets (ops subscribe and commit) instead of assigning themselves keys "
        "(default: they assign)",
    )
    run.add_argument(
        "--transactional",
        action="store_true",
        help="queue workload: each worker writes in transactions (op txn: sends and polls "
        "committed together) with its own transactional id",
    )
    run.add_argument(
        "--zombie",
        action="store_true",
        help="queue workload with --transactional: two workers share one transactional id, "
        "each fencing the other (Kafka's zombie producer)",
    )
    run.add_argument(
        "--zombie-pause-ms",
        type=_non_negative_int,
        default=queue.zombie_pause_ms,
        metavar="MS",
        help="queue workload with --zombie: the zombie stalls MS between the sends and polls "
        "of each of its transactions, as a paused process would (default: %(default)s)",
    )
    run.add_argument(
        "--unadded-sends",
        type=probability,
        default=queue.unadded_sends,
        metavar="P",
        help="queue workload with --transactional: a misbehaving client sends each record, "
        "with chance P, to a partition it never added to the transaction (KIP-890's buggy "
        "client; the leaders must refuse those writes) (default: %(default)s)",
    )
    run.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default=queue.isolation_level,
        help="queue workload: the consumers' isolation.level (default: %(default)s)",
    )
    defaults = RunConfig()
    run.add_argument(
        "--fault-interval",
        type=_positive_float,
        default=defaults.fault_interval_s,
        metavar="SECONDS",
        help="the nemesis acts every SECONDS on average within a fault period "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--fault-period",
        type=_positive_float,
        default=defaults.fault_period_s,
        metavar="SECONDS",
        help="how long each fault period lasts; every fault still in force ends with it "
        "(default: %(default)s)",
    )
    run.add_argument(
        "--quiet-period",
        type=_non_negative_float,
        default=defaults.quiet_s,
        metavar="SECONDS",
        help="the time with no fault between two fault periods (default: %(default)s)",
    )
    run.add_argument(
        "--op-timeout",
        type=_positive_float,
        default=defaults.op_timeout_s,
        metavar="SECONDS",
        help="the longest a client operation may take before it completes as a timeout "
        "(a queue send's records still unresolved then are info) (default: %(default)s)",
    )
    run.add_argument(
        "--client-timeout",
        type=_positive_float,
        default=defaults.client_timeout_s,
        metavar="SECONDS",
        help="one request's deadline in the clients, at most --op-timeout; for the queue "
        "workload the producer's request.timeout.ms (at least 0.5 s), its "
        "delivery.timeout.ms 0.5 s under --op-timeout or 0.1 s over the request timeout, "
        "whichever is later (default: %(default)s)",
    )
    run.add_argument(
        "--seed", type=_seed, help="seed of the fault schedule and the workload (default: random)"
    )
    run.add_argument(
        "--runs-dir",
        default="runs",
        metavar="DIR",
        help="where run folders go (default: %(default)s)",
    )
    run.add_argument(
        "--name",
        help="the run's name, after the time in its folder name (default: WORKLOAD-BACKEND)",
    )
    run.add_argument(
        "--json",
        action="store_true",
        help="no progress; print the summary and the run folder as JSON",
    )
    run.add_argument(
        "--verify",
        action="store_true",
        help="then verify the run folder with Spark (kq verify RUN_DIR): the verdict, and "
        "the report in RUN_DIR/verify/; exit 1 unless the verdict is valid",
    )
    run.set_defaults(func=_run)

    listing = sub.add_parser("list", help="list past runs", description="List past runs.")
    listing.add_argument(
        "--runs-dir",
        default="runs",
        metavar="DIR",
        help="the runs folder (default: %(default)s)",
    )
    listing.add_argument("--json", action="store_true", help="print the runs as JSON")
    listing.set_defaults(func=_list)

    check = sub.add_parser(
        "check",
        help="check that run folders are well formed (history and node exports)",
        description="Check run folders against docs/history-format.md: each PATH is a run "
        "folder or a folder of run folders (such as runs/). Prints one line per run, then "
        "every problem.",
        epilog="Exit status: 0 every run is well formed; 1 a run has a problem; 2 a PATH "
        "holds no run.",
    )
    check.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    check.set_defaults(func=_check)

    catalogue = sub.add_parser(
        "catalogue",
        help="run every deliberate bug under the faults that expose it, verify each run "
        "with Spark, then clean runs",
        description="The proof that the checks can fail: each bug of the catalogue "
        "(bugs.Bug: Q1-Q5 in the quorum, B1-B20 in the brokers, their consumer groups and "
        "the harness) is turned on in a local cluster and run with its recipe (workload, "
        "faults, flags) until a "
        "check of the Spark verification (kq chaos run --verify) fires or its budget of "
        "runs is spent; then the same recipes run with no bug. Prints a table: bug, "
        "recipe, the checks that fired, runs until the first detection, time. A bug no "
        "check caught is a finding; a clean run where a check fired (or that gave no "
        "verdict) is a false alarm. A benign bug (shown to lose nothing in kq, as B3) "
        "runs only when named, as a negative control: a check firing on it is a finding "
        "too. Needs root (iptables) and Java 17+ (docs/chaos.md).",
        epilog="Exit status: 0 every bug caught and every clean run clean; 1 a finding or "
        "a false alarm; 2 bad usage; 4 Spark cannot run.",
    )
    catalogue.add_argument(
        "--bugs",
        type=_bugs,
        metavar="BUG[,BUG...]",
        help="the bugs to run, by id or name (default: every bug but the benign ones)",
    )
    catalogue.add_argument(
        "--runs",
        type=_non_negative_int,
        metavar="N",
        help="runs allowed per bug before it counts as not caught (default: each recipe's "
        "budget; 0: no bug runs, only the clean runs of the chosen bugs' recipes)",
    )
    catalogue.add_argument(
        "--clean-runs",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="runs with no bug, over the chosen bugs' recipes in turn (default: %(default)s)",
    )
    catalogue.add_argument(
        "--verify-clean-together",
        action="store_true",
        help="verify the clean runs in one Spark job after the last of them, instead of one "
        "job per run (faster for many clean runs; the verification goes to "
        "verify-clean-<time>/ beside the run folders)",
    )
    catalogue.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="local",
        help="where the clusters run (default: %(default)s)",
    )
    catalogue.add_argument("--seed", type=_seed, help="seed of every run's seed (default: random)")
    catalogue.add_argument(
        "--runs-dir",
        default="runs",
        metavar="DIR",
        help="where run folders go (default: %(default)s)",
    )
    catalogue.add_argument(
        "--list",
        action="store_true",
        help="print every recipe and the checks it expects to fire, and run nothing",
    )
    catalogue.add_argument(
        "--json", action="store_true", help="no progress; print the results as JSON"
    )
    catalogue.set_defaults(func=_catalogue)


# -- kq chaos check ----------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.paths:
        runs = find_runs(path)
        if not runs:
            print(f"kq chaos check: {path}: no run folder here", file=sys.stderr)
            return EXIT_USAGE
        for run in runs:
            problems = check_run(run)
            if problems:
                bad += 1
                print(f"{run}: {len(problems)} problem(s)")
                for p in problems:
                    print(f"  {p}")
            else:
                print(f"{run}: well formed")
    return EXIT_FAILURE if bad else EXIT_OK


# -- kq chaos run ------------------------------------------------------------------


def _print_progress(p: Progress) -> None:
    faults = ", ".join(p.faults) or "none"
    if p.event is None:
        line = f"{p.elapsed_s:7.1f}s  ok {p.ok}  fail {p.fail}  info {p.info}  faults: {faults}"
    else:
        line = f"{p.elapsed_s:7.1f}s  {p.event}"
    print(line, flush=True)


def _run_config(args: argparse.Namespace) -> RunConfig:
    """The :class:`RunConfig` of ``kq chaos run``'s parsed flags (and the
    bug switch of the environment), checked: :class:`CommandError` with
    exit status 2 for bad usage.  A run's ``replay`` parsed back gives its
    configuration again."""
    if args.client_timeout > args.op_timeout:
        # A request that outlives the op's own wait never ends with the
        # client's verdict: the op times out first.  The queue producer's
        # delivery.timeout.ms (chaos.workloads.queue_setup) is set between
        # the two so that most records resolve with the producer's verdict.
        raise CommandError(
            f"--client-timeout ({args.client_timeout:g} s) must not exceed --op-timeout "
            f"({args.op_timeout:g} s)",
            EXIT_USAGE,
        )
    try:
        brokers = args.brokers if WORKLOADS[args.workload].needs_brokers else 0
        faults = expand_nemesis(args.nemesis, args.nodes + brokers)
    except ValueError as exc:
        raise CommandError(f"--nemesis: {exc}", EXIT_USAGE) from None
    try:
        # A replayed catalogue run names its bugs in the environment.
        injected = bugs.from_environment(os.environ)
    except bugs.BugSwitchError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    name = args.name or f"{args.workload}-{args.backend}"
    config = RunConfig(
        bugs=injected,
        name=name,
        backend=args.backend,
        workload=args.workload,
        faults=tuple(faults),
        nodes=args.nodes,
        time_limit_s=args.time_limit,
        rate=args.rate,
        concurrency=args.concurrency,
        keys=args.keys,
        store=args.store,
        pin_clients=args.pin_clients,
        seed=args.seed,
        runs_dir=args.runs_dir,
        tls=not args.insecure,
        fault_interval_s=args.fault_interval,
        fault_period_s=args.fault_period,
        quiet_s=args.quiet_period,
        op_timeout_s=args.op_timeout,
        client_timeout_s=args.client_timeout,
        queue=QueueOptions(
            brokers=args.brokers,
            topics=args.topics,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            min_isr=args.min_isr,
            acks=args.acks,
            max_send=args.max_send,
            final_time_s=args.final_time,
            replica_lag_ms=args.replica_lag_ms,
            cleanup_policy=args.cleanup_policy,
            retention_ms=args.retention_ms,
            retention_bytes=args.retention_bytes,
            segment_bytes=args.segment_bytes,
            record_keys=args.record_keys,
            replica_fetch_max_bytes=args.replica_fetch_max_bytes,
            group=args.group,
            transactional=args.transactional,
            zombie=args.zombie,
            unadded_sends=args.unadded_sends,
            zombie_pause_ms=args.zombie_pause_ms,
            isolation_level=args.isolation_level,
        ),
    )
    try:
        config.check()
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    return config


@command("chaos run")
def _run(args: argparse.Namespace) -> int:
    config = _run_config(args)
    injected = config.bugs
    try:
        result = run_async(run_chaos(config, None if args.json else _print_progress))
    except ValueError as exc:  # a bad --name
        raise CommandError(str(exc), EXIT_USAGE) from None
    except OSError as exc:
        raise CommandError(f"cannot make the run folder: {exc}") from None
    if injected:
        print(
            "kq chaos run: WARNING: deliberate bugs were on (KQ_INJECT_BUGS): "
            + ", ".join(f"{b.id} {b.title}" for b in sorted(injected, key=lambda b: b.id))
            + "; this run's history is not a real run's",
            file=sys.stderr,
        )
    if args.insecure:
        print(
            "kq chaos run: WARNING: --insecure: the cluster ran PLAINTEXT, without encryption "
            "or authentication",
            file=sys.stderr,
        )
    reasons = []
    if not result.completed:
        reasons.append(f"the run did not complete: {result.error}")
    elif not result.recovered:
        reasons.append(
            f"the cluster did not recover (a leader, every node answering) within "
            f"{config.recovery_timeout_s:g} s of the final heal"
        )
    if result.problems:
        reasons.append(f"the history is not well formed ({len(result.problems)} problem(s))")
    if result.completed and not result.final_ok:
        check = result.final_check or {}
        found = check.get("error") or f"{len(check.get('problems', []))} problem(s)"
        reasons.append(f"the final check failed: {found}")
    verdict: dict[str, Any] | None = None
    if args.verify and result.completed:
        verdict = _verify(result.path, args.json, reasons)
    if args.json:
        out = {"path": str(result.path), "ok": result.ok and not reasons, **result.summary}
        if args.verify:
            out["verdict"] = verdict
        print_json(out)
    else:
        s = result.summary
        ops = s.get("ops", {})
        print(
            f"{ops.get('invoke', 0)} ops: {ops.get('ok', 0)} ok, {ops.get('fail', 0)} fail, "
            f"{ops.get('info', 0)} info; {s.get('nemesis', 0)} nemesis actions; "
            f"well formed: {'yes' if not result.problems else 'no'}; "
            f"{s.get('security_protocol', '?')}"
        )
        for p in result.problems[:10]:
            print(f"  {p}")
        if result.final_check is not None:
            problems = result.final_check.get("problems", [])
            print(f"final check: {'ok' if result.final_ok else 'FAILED'}")
            for fp in problems[:10]:
                print(f"  {fp['kind']}: {fp['message']}")
        print(f"run folder: {result.path}")
    for reason in reasons:
        print(f"kq chaos run: {reason}", file=sys.stderr)
    return EXIT_FAILURE if reasons else EXIT_OK


def _verify(path: Path, quiet: bool, reasons: list[str]) -> dict[str, Any] | None:
    """``kq verify`` of the run folder just written (``--verify``): prints the
    summary (unless ``quiet``), adds to ``reasons`` unless it is valid, and
    returns the verdict (None if Spark could not run)."""
    from spark_verify.run import CannotVerify, run_verification, summary_text

    def say(message: str) -> None:
        if not quiet:
            print(f"verify: {message}", flush=True)

    say(f"verifying {path} with Spark")
    try:
        done = run_verification([path], progress=say)
    except CannotVerify as exc:
        reasons.append(f"--verify: {exc}")
        return None
    if not quiet:
        print(summary_text(done.verdict, done.verdict_path, done.report_path))
    if done.valid is not True:
        word = "INVALID" if done.valid is False else "unknown"
        reasons.append(f"the verification's verdict is {word} (see {done.verdict_path})")
    return dict(done.verdict)


# -- kq chaos catalogue ------------------------------------------------------------


class SparkVerifier:
    """``kq chaos run --verify``'s job (:func:`spark_verify.job.verify`) on
    one run folder at a time, on one local Spark session started at the
    first run and kept warm until :meth:`close` (its start costs seconds)."""

    def __init__(self, master: str | None = None) -> None:
        self._master = master
        self._spark: SparkSession | None = None

    def __call__(self, path: Path) -> Mapping[str, Any]:
        from spark_verify.job import VerifyOptions, verify
        from spark_verify.session import spark_session

        if self._spark is None:
            self._spark = spark_session(self._master)
        return verify(self._spark, [path], VerifyOptions()).verdict

    def together(self, paths: Sequence[Path]) -> Mapping[str, Any]:
        """The same job on several run folders at once (one verdict row per
        run), written to ``verify-clean-<UTC time>/`` beside them."""
        from spark_verify.job import VerifyOptions, verify
        from spark_verify.session import spark_session

        if self._spark is None:
            self._spark = spark_session(self._master)
        stamp = datetime.now(UTC).strftime("verify-clean-%Y%m%dT%H%M%SZ")
        out = paths[0].parent / stamp if paths else None
        return verify(self._spark, list(paths), VerifyOptions(out=out)).verdict

    def close(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


@command("chaos catalogue")
def _catalogue(args: argparse.Namespace) -> int:
    from chaos.catalogue import (
        bug_order,
        default_bugs,
        recipe_table,
        render_table,
        run_catalogue,
    )

    if args.list:
        print(recipe_table(sorted(args.bugs or bugs.Bug, key=bug_order)))
        return EXIT_OK
    chosen = sorted(args.bugs, key=bug_order) if args.bugs else default_bugs()
    if bugs.BUGS_VARIABLE in os.environ:
        raise CommandError(
            f"{bugs.BUGS_VARIABLE} is set: the catalogue turns bugs on itself, run by run "
            "(unset it)",
            EXIT_USAGE,
        )
    from spark_verify.run import EXIT_SPARK
    from spark_verify.session import java_problem

    problem = java_problem()
    if problem is not None:
        raise CommandError(f"the catalogue verifies every run with Spark: {problem}", EXIT_SPARK)
    verifier = SparkVerifier()
    try:
        result = run_async(
            run_catalogue(
                chosen,
                verifier,
                runs=args.runs,
                clean_runs=args.clean_runs,
                backend=args.backend,
                runs_dir=args.runs_dir,
                seed=args.seed,
                progress=None if args.json else lambda line: print(line, flush=True),
                verify_together=verifier.together if args.verify_clean_together else None,
            )
        )
    except ValueError as exc:  # a backend that cannot run a recipe
        raise CommandError(str(exc), EXIT_USAGE) from None
    finally:
        verifier.close()
    if args.json:
        print_json(result.to_json())
    else:
        print(render_table(result))
    return EXIT_OK if result.ok else EXIT_FAILURE


# -- kq chaos list -----------------------------------------------------------------


def _run_row(path: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    summary = summary_of(path)
    stamp = path.name.split("-", 1)[0]
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        time_text = when.strftime("%Y-%m-%d %H:%M:%SZ")
    except ValueError:
        time_text = ""
    ops = summary.get("ops", {}) if summary else {}
    return {
        "path": str(path),
        "time": time_text,
        "name": config.get("name"),
        "backend": config.get("backend"),
        "workload": config.get("workload", config.get("model")),
        "faults": config.get("faults") or [],
        "ops": ops.get("invoke") if isinstance(ops, dict) else None,
        "well_formed": summary.get("well_formed") if summary else None,
        "completed": summary.get("completed") if summary else None,
    }


@command("chaos list")
def _list(args: argparse.Namespace) -> int:
    root = Path(args.runs_dir)
    if root.exists() and not root.is_dir():
        raise CommandError(f"{root} is not a folder", EXIT_USAGE)
    rows = (
        [
            row
            for row in (_run_row(p) for p in sorted(root.iterdir()) if p.is_dir())
            if row is not None
        ]
        if root.is_dir()
        else []
    )
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        print(f"no runs in {root}")
        return EXIT_OK

    def yes_no(v: object) -> str:
        return "-" if v is None else ("yes" if v else "no")

    print(
        format_table(
            ["TIME", "NAME", "BACKEND", "WORKLOAD", "FAULTS", "OPS", "WELL-FORMED", "FOLDER"],
            [
                [
                    r["time"],
                    r["name"],
                    r["backend"],
                    r["workload"],
                    ",".join(r["faults"]) or "none",
                    "-" if r["ops"] is None else r["ops"],
                    yes_no(r["well_formed"]),
                    Path(r["path"]).name,
                ]
                for r in rows
            ],
        )
    )
    return EXIT_OK

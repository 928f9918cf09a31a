"""``kq cluster``: a local cluster of controller and broker processes on one
machine.

kq cluster up [--cluster-dir DIR] [--nodes 3] [--brokers 3] [--base-port 9091]
              [--set KEY=VALUE] [--insecure] [--json]
kq cluster status [--cluster-dir DIR] [--json]
kq cluster down [--cluster-dir DIR]
kq cluster kill NODE [--cluster-dir DIR]      (SIGKILL, to test recovery)
kq cluster start NODE [--cluster-dir DIR]     (restart one stopped node)
kq cluster pause NODE / resume NODE           (SIGSTOP / SIGCONT)

NODE is a controller's or a broker's id: they share one id space, the
brokers' ids following the controllers' (3 controllers: brokers 4, 5, 6).

``--cluster-dir`` is the folder's name in every command that finds the
local cluster (``kq quorum``, ``kq kv``, the admin commands); ``--dir`` is
its older name here.  The cluster itself is :mod:`server.local_cluster`.

A new cluster is secure by default, as CockroachDB's ``cockroach start``
is: a CA and certificates in DIR/certs, every node's listener SSL (mutual
TLS).  ``--insecure`` makes a PLAINTEXT cluster, and every start of one
(``up``, ``start``) prints a warning saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    format_table,
    print_json,
    run_async,
)
from quorum.driver.client import describe
from server.config import ConfigError, load_settings
from server.local_brokers import broker_status_rows, start_brokers, stop_members
from server.local_cluster import (
    DEFAULT_BASE_PORT,
    DEFAULT_BROKERS,
    DEFAULT_DIR,
    DEFAULT_NODES,
    MAX_BROKERS,
    METRICS_PORT_OFFSET,
    STATE_FILE,
    BrokerState,
    ClusterState,
    NodeState,
    check_configs,
    check_ports,
    format_new_nodes,
    load_state,
    local_cluster_state,
    log_tail,
    make_certs,
    node_alive,
    process_paused,
    spawn_node,
    status_rows,
    wait_for_leader,
    wait_gone,
    write_broker_configs,
    write_configs,
)

__all__ = ["register"]


def _status_json(
    state: ClusterState, rows: list[dict[str, Any]], brokers: list[dict[str, Any]]
) -> dict[str, Any]:
    leaders = [r for r in rows if r["role"] == "leader"]
    leader = max(leaders, key=lambda r: r["epoch"]) if leaders else None
    return {
        "cluster_id": state.cluster_id,
        "dir": str(state.dir),
        "leader_id": None if leader is None else leader["node_id"],
        "epoch": None if leader is None else leader["epoch"],
        "tls": state.tls,
        "security_protocol": state.security_protocol.value,
        "nodes": rows,
        "brokers": brokers,
    }


def _print_status(
    state: ClusterState, rows: list[dict[str, Any]], brokers: list[dict[str, Any]]
) -> None:
    summary = _status_json(state, rows, brokers)
    up = sum(1 for r in rows if r["alive"])
    leader = (
        f"leader node {summary['leader_id']} (epoch {summary['epoch']})"
        if summary["leader_id"] is not None
        else "no leader"
    )
    tls = " (SSL: mutual TLS)" if state.tls else " (PLAINTEXT: insecure)"
    print(
        f"Cluster {state.cluster_id} in {state.dir}{tls}: {up}/{len(rows)} nodes running, {leader}"
    )
    print()
    print(
        format_table(
            [
                "NodeId",
                "Address",
                "Metrics",
                "Protocol",
                "Pid",
                "Alive",
                "Role",
                "Epoch",
                "HighWatermark",
                "LeaderId",
            ],
            [
                [
                    r["node_id"],
                    r["address"],
                    r["metrics_address"] or "-",
                    r["security_protocol"],
                    "-" if r["pid"] is None else r["pid"],
                    _alive(r),
                    r["role"],
                    "-" if r["epoch"] is None else r["epoch"],
                    "-" if r["high_watermark"] is None else r["high_watermark"],
                    "-" if r["leader_id"] is None else r["leader_id"],
                ]
                for r in rows
            ],
        )
    )
    if not brokers:
        return
    running = sum(1 for r in brokers if r["alive"])
    unfenced = sum(1 for r in brokers if r["state"] == "unfenced")
    print()
    print(f"Brokers: {running}/{len(brokers)} running, {unfenced} registered and unfenced")
    print()
    print(
        format_table(
            ["BrokerId", "Address", "Metrics", "Protocol", "Pid", "Alive", "State", "Epoch"],
            [
                [
                    r["broker_id"],
                    r["address"],
                    r["metrics_address"] or "-",
                    r["security_protocol"],
                    "-" if r["pid"] is None else r["pid"],
                    _alive(r),
                    r["state"],
                    "-" if r["epoch"] is None else r["epoch"],
                ]
                for r in brokers
            ],
        )
    )


def _alive(row: dict[str, Any]) -> str:
    if not row["alive"]:
        return "no"
    return "paused" if row["paused"] else "yes"


def _rows(state: ClusterState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await asyncio.gather(status_rows(state), broker_status_rows(state))

    return run_async(both())


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "cluster",
        help="run a local cluster of controllers and brokers (up, status, down)",
        description=(
            "A local kq cluster: `kq controller start` processes on 127.0.0.1 and `kq broker "
            "start` processes each on its own 127.0.1.<id>; node or broker N on port BASE+N-1, "
            "with data, configs and logs under --cluster-dir."
        ),
    )

    up = commands.add_parser(
        "up",
        help="format (if new) and start the local cluster; wait for a leader and the brokers",
        description=(
            "Start the local cluster in --cluster-dir: on first use pick a cluster id, write "
            "each node's and broker's config and format its directories; then start every "
            "controller in the background, wait until a leader is elected, start every broker, "
            "wait until each is registered and unfenced, and print the status. "
            "Refuses while any node or broker of the cluster is running."
        ),
    )
    _dir_flag(up)
    up.add_argument(
        "--nodes", type=int, help=f"number of voters, new cluster only (default {DEFAULT_NODES})"
    )
    up.add_argument(
        "--brokers",
        type=int,
        help=f"number of brokers, new cluster only (default {DEFAULT_BROKERS}; 0: controllers "
        "only); their ids follow the controllers', broker N on 127.0.1.N port BASE+N-1",
    )
    up.add_argument(
        "--base-port",
        type=int,
        help=f"port of node 1, new cluster only (default {DEFAULT_BASE_PORT})",
    )
    security = up.add_mutually_exclusive_group()
    security.add_argument(
        "--tls",
        action="store_true",
        help="the default, kept for scripts that name it: a new cluster gets a CA and "
        "certificates in DIR/certs and every node listens SSL (mutual TLS); the commands "
        "find the admin certificate through --cluster-dir",
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        help="new cluster only: PLAINTEXT listeners, no certificates, no authentication "
        "(every start warns so)",
    )
    up.add_argument(
        "--set",
        dest="cfg_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a quorum.*, node.* or log_level setting for every controller's and broker's "
        "config, controller.* for the controllers', broker.*, group.*, offsets.*, "
        "transaction.* and transaction_state.* for the brokers' (new cluster only; edit "
        "DIR/node-N/config.toml and DIR/broker-N/config.toml "
        "later)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a leader, then for the brokers (default 30 each)",
    )
    up.add_argument("--json", action="store_true", help="print the status as JSON")
    up.set_defaults(func=_up)

    status = commands.add_parser(
        "status",
        help="each node's pid, role, epoch and high watermark; each broker's state",
        description=(
            "Ask every node of the local cluster for its role (DescribeQuorum), and the "
            "active controller for each broker's registration (DescribeCluster)."
        ),
    )
    _dir_flag(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_status)

    down = commands.add_parser(
        "down",
        help="stop every broker, then every node (SIGTERM; SIGKILL stragglers)",
        description=(
            "Send SIGTERM to every running broker of the local cluster (a controlled "
            "shutdown: it hands its leaderships over first), wait up to --timeout seconds, "
            "SIGKILL any still running; then the same for the controllers (a leader "
            "resigns). Data is kept."
        ),
    )
    _dir_flag(down)
    down.add_argument(
        "--timeout", type=float, default=10.0, help="seconds before SIGKILL (default 10)"
    )
    down.add_argument("--json", action="store_true", help="print what was stopped as JSON")
    down.set_defaults(func=_down)

    kill = commands.add_parser("kill", help="SIGKILL one node or broker (to test recovery)")
    kill.add_argument("node", type=int, metavar="NODE", help="a controller's or a broker's id")
    _dir_flag(kill)
    kill.set_defaults(func=_kill)

    start = commands.add_parser(
        "start",
        help="start one stopped node or broker again",
        description=(
            "Start one stopped controller (waits until it serves) or broker (waits until it "
            "is registered again and unfenced)."
        ),
    )
    start.add_argument("node", type=int, metavar="NODE", help="a controller's or a broker's id")
    _dir_flag(start)
    start.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for it (default 30)"
    )
    start.set_defaults(func=_start)

    for verb, sig, what in (
        ("pause", "SIGSTOP", "freeze one node or broker (SIGSTOP): alive but silent"),
        ("resume", "SIGCONT", "resume a paused node or broker (SIGCONT)"),
    ):
        parser = commands.add_parser(verb, help=what, description=f"Send {sig}: {what}.")
        parser.add_argument(
            "node", type=int, metavar="NODE", help="a controller's or a broker's id"
        )
        _dir_flag(parser)
        parser.set_defaults(func=_pause if verb == "pause" else _resume)


def _dir_flag(parser: argparse.ArgumentParser) -> None:
    # --cluster-dir, as every command that finds the local cluster calls
    # it; --dir is its older name here.
    parser.add_argument(
        "--cluster-dir",
        "--dir",
        dest="dir",
        default=DEFAULT_DIR,
        metavar="DIR",
        help="the local cluster's folder (default: ./%(default)s; --dir is another name)",
    )


def _need_state(directory: str) -> ClusterState:
    state = load_state(directory)
    if state is None:
        raise CommandError(
            f"no local cluster in {directory} (no {STATE_FILE}); start one with `kq cluster up`"
        )
    return state


def _new_state(args: argparse.Namespace) -> ClusterState:
    nodes = DEFAULT_NODES if args.nodes is None else args.nodes
    brokers = DEFAULT_BROKERS if args.brokers is None else args.brokers
    base = DEFAULT_BASE_PORT if args.base_port is None else args.base_port
    if not 1 <= nodes <= 99:
        raise CommandError(f"--nodes must be in 1..99, got {nodes}", EXIT_USAGE)
    # Every node's and broker's port, and their metrics ports
    # (METRICS_PORT_OFFSET above), must fit.
    top = 65535 - (nodes + brokers) + 1 - METRICS_PORT_OFFSET
    if not 1024 <= base <= top:
        raise CommandError(
            f"--base-port must be in 1024..{top} for {nodes} nodes and {brokers} brokers, "
            f"got {base}",
            EXIT_USAGE,
        )
    state = local_cluster_state(Path(args.dir).resolve(), base, nodes, brokers)
    state.tls = not args.insecure
    return state


# The sections only brokers read: a group's coordinator and its offsets
# topic run on brokers, so the controllers' configs do not get them.
_BROKER_ONLY = ("broker.", "group.", "offsets.", "transaction.", "transaction_state.")


def _extra_settings(items: Sequence[str]) -> dict[str, object]:
    """The --set values of `cluster up`, checked."""
    flags = []
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CommandError(f"--set {item!r} is not KEY=VALUE", EXIT_USAGE)
        if key == "broker.log_dirs" or not (
            key.startswith(("quorum.", "node.", "controller.", *_BROKER_ONLY)) or key == "log_level"
        ):
            raise CommandError(
                f"--set {item}: only quorum.*, node.*, controller.*, broker.* (but "
                "broker.log_dirs), group.*, offsets.*, transaction.*, transaction_state.* and "
                "log_level can be set for every node "
                "of a local cluster",
                EXIT_USAGE,
            )
        flags.append((key, text, f"flag --set {item}"))
    try:
        settings = load_settings(None, {}, flags)
    except ConfigError as exc:
        raise CommandError(f"config error: {exc}", EXIT_USAGE) from None
    return dict(settings.values)


def _for(extra: dict[str, object], *skip: str) -> dict[str, object]:
    """The settings of ``extra`` but those of the sections ``skip``."""
    return {k: v for k, v in extra.items() if not k.startswith(tuple(s + "." for s in skip))}


@command("cluster up")
def _up(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise CommandError("--timeout must be positive", EXIT_USAGE)
    if args.brokers is not None and not 0 <= args.brokers <= MAX_BROKERS:
        raise CommandError(
            f"--brokers must be in 0..{MAX_BROKERS} (0: controllers only), got {args.brokers}",
            EXIT_USAGE,
        )
    state = load_state(args.dir)
    created = state is None
    if state is None:
        extra = _extra_settings(args.cfg_set)
        state = _new_state(args)
        state.dir.mkdir(parents=True, exist_ok=True)
        if state.tls:
            make_certs(state)
        write_configs(
            state, _for(extra, "broker", "group", "offsets", "transaction", "transaction_state")
        )
        write_broker_configs(state, _for(extra, "controller"))
        state.save()
    else:
        running = [n for n in state.members if node_alive(state, n)]
        if running:
            pids = ", ".join(f"{_what(n)} {n.node_id} pid {n.pid}" for n in running)
            raise CommandError(
                f"the cluster in {state.dir} is already running ({pids}); see `kq cluster "
                f"status --cluster-dir {args.dir}`, restart a stopped node with `kq cluster start "
                f"NODE`, or stop it with `kq cluster down --cluster-dir {args.dir}`"
            )
        if args.nodes is not None and args.nodes != len(state.nodes):
            raise CommandError(
                f"the cluster in {state.dir} has {len(state.nodes)} nodes, not {args.nodes}; "
                "remove the directory to make a new cluster",
                EXIT_USAGE,
            )
        if args.brokers is not None and args.brokers != len(state.brokers):
            raise CommandError(
                f"the cluster in {state.dir} has {len(state.brokers)} brokers, not "
                f"{args.brokers}; remove the directory to make a new cluster",
                EXIT_USAGE,
            )
        if args.base_port is not None and args.base_port != state.base_port:
            raise CommandError(
                f"the cluster in {state.dir} uses base port {state.base_port}, not "
                f"{args.base_port}; remove the directory to make a new cluster",
                EXIT_USAGE,
            )
        if args.cfg_set:
            raise CommandError(
                "--set applies to a new cluster only; edit the configs in "
                f"{state.dir}/node-N/config.toml and broker-N/config.toml instead",
                EXIT_USAGE,
            )
        if args.tls and not state.tls:
            raise CommandError(
                f"the cluster in {state.dir} runs without TLS; --tls applies to a new cluster",
                EXIT_USAGE,
            )
        if args.insecure and state.tls:
            raise CommandError(
                f"the cluster in {state.dir} runs with TLS; --insecure applies to a new cluster",
                EXIT_USAGE,
            )
    check_configs(state)
    if not state.tls:
        print(state.plaintext_warning(), file=sys.stderr)
    check_ports(state, state.members)
    formatted = format_new_nodes(state)
    procs = {n.node_id: spawn_node(state, n) for n in state.nodes}
    if not args.json:
        what = "Created and started" if created else "Started"
        brokers = f" and {len(state.brokers)} brokers" if state.brokers else ""
        print(
            f"{what} a kq cluster {state.cluster_id} of {len(state.nodes)} controllers{brokers} "
            f"in {state.dir}"
            + (f" (formatted {','.join(map(str, formatted))})" if formatted else "")
        )
    run_async(wait_for_leader(state, procs, args.timeout))
    if state.brokers:
        run_async(start_brokers(state, state.brokers, args.timeout))
    rows, brokers_rows = _rows(state)
    if args.json:
        print_json(_status_json(state, rows, brokers_rows))
    else:
        print()
        _print_status(state, rows, brokers_rows)
        print()
        print(
            f"Logs: {state.dir}/node-N/controller.log"
            + (f", {state.dir}/broker-N/broker.log" if state.brokers else "")
        )
        print(f"Stop: kq cluster down --cluster-dir {args.dir}")
    return 0


def _what(node: object) -> str:
    return "broker" if isinstance(node, BrokerState) else "node"


@command("cluster status")
def _status(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    rows, brokers = _rows(state)
    if args.json:
        print_json(_status_json(state, rows, brokers))
    else:
        _print_status(state, rows, brokers)
    return 0


@command("cluster down")
def _down(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    outcome = stop_members(state, state.members, args.timeout)
    stuck = [k for k, v in outcome.items() if v.startswith("still running")]
    if args.json:
        print_json(
            {
                "dir": str(state.dir),
                "nodes": {str(n.node_id): outcome[n.node_id] for n in state.nodes},
                "brokers": {str(b.node_id): outcome[b.node_id] for b in state.brokers},
            }
        )
    else:
        for b in state.brokers:
            print(f"broker {b.node_id}: {outcome[b.node_id]}")
        for n in state.nodes:
            print(f"node {n.node_id}: {outcome[n.node_id]}")
    return EXIT_FAILURE if stuck else 0


@command("cluster kill")
def _kill(args: argparse.Namespace) -> int:
    state, node, what, pid = _running_member(args)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(state, [node], 5.0):
        raise CommandError(f"{what} {node.node_id} (pid {pid}) survived SIGKILL for 5 s")
    node.pid = None
    state.save()
    print(f"killed {what} {node.node_id} (pid {pid}) with SIGKILL")
    return 0


@command("cluster start")
def _start(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    node = state.member(args.node)
    what = _what(node)
    if node_alive(state, node):
        raise CommandError(f"{what} {node.node_id} is already running (pid {node.pid})")
    if args.timeout <= 0:
        raise CommandError("--timeout must be positive", EXIT_USAGE)
    check_configs(state)
    check_ports(state, [node])
    if not state.tls:
        print(state.plaintext_warning(), file=sys.stderr)
    if isinstance(node, BrokerState):
        procs = run_async(start_brokers(state, [node], args.timeout))
        print(
            f"started broker {node.node_id} (pid {procs[node.node_id].pid}) on {node.address}: "
            "registered and unfenced"
        )
        return 0
    proc = spawn_node(state, node)
    deadline = time.monotonic() + args.timeout
    credentials = state.client_credentials()
    while run_async(describe(node.address, 0.5, credentials)) is None:
        code = proc.poll()
        if code is not None:
            node.pid = None
            state.save()
            raise CommandError(
                f"node {node.node_id} exited with status {code}; the end of "
                f"{state.path(node.log_file)}:\n{log_tail(state, node)}"
            )
        if time.monotonic() >= deadline:
            raise CommandError(
                f"node {node.node_id} (pid {proc.pid}) does not answer on {node.address} "
                f"after {args.timeout:g} s; see {state.path(node.log_file)}"
            )
        time.sleep(0.1)
    print(f"started node {node.node_id} (pid {proc.pid}) on {node.address}")
    return 0


def _running_member(args: argparse.Namespace) -> tuple[ClusterState, NodeState, str, int]:
    """The local cluster, its controller or broker ``args.node`` (which must
    be running), what it is ("node" or "broker") and its pid."""
    state = _need_state(args.dir)
    node = state.member(args.node)
    what = _what(node)
    if not node_alive(state, node):
        raise CommandError(f"{what} {node.node_id} is not running")
    assert node.pid is not None
    return state, node, what, node.pid


def _signal(args: argparse.Namespace, sig: signal.Signals) -> tuple[str, int, int]:
    _, node, what, pid = _running_member(args)
    paused = process_paused(pid)
    if paused == (sig is signal.SIGSTOP):
        raise CommandError(
            f"{what} {node.node_id} (pid {pid}) is "
            + ("already paused" if paused else "not paused")
        )
    os.kill(pid, sig)
    return what, node.node_id, pid


@command("cluster pause")
def _pause(args: argparse.Namespace) -> int:
    what, node_id, pid = _signal(args, signal.SIGSTOP)
    print(f"paused {what} {node_id} (pid {pid}) with SIGSTOP; `kq cluster resume {node_id}`")
    return 0


@command("cluster resume")
def _resume(args: argparse.Namespace) -> int:
    what, node_id, pid = _signal(args, signal.SIGCONT)
    print(f"resumed {what} {node_id} (pid {pid}) with SIGCONT")
    return 0

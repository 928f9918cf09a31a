"""``kq cluster``: a local cluster of controller processes on one machine.

kq cluster up [--cluster-dir DIR] [--nodes 3] [--base-port 9091] [--set KEY=VALUE]
              [--insecure] [--json]
kq cluster status [--cluster-dir DIR] [--json]
kq cluster down [--cluster-dir DIR]
kq cluster kill NODE [--cluster-dir DIR]      (SIGKILL, to test recovery)
kq cluster start NODE [--cluster-dir DIR]     (restart one stopped node)

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
from server.local_cluster import (
    DEFAULT_BASE_PORT,
    DEFAULT_DIR,
    DEFAULT_NODES,
    HOST,
    METRICS_PORT_OFFSET,
    STATE_FILE,
    ClusterState,
    check_configs,
    check_ports,
    format_new_nodes,
    load_state,
    log_tail,
    make_certs,
    new_cluster_state,
    node_alive,
    spawn_node,
    status_rows,
    wait_for_leader,
    wait_gone,
    write_configs,
)

__all__ = ["register"]


def _status_json(state: ClusterState, rows: list[dict[str, Any]]) -> dict[str, Any]:
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
    }


def _print_status(state: ClusterState, rows: list[dict[str, Any]]) -> None:
    summary = _status_json(state, rows)
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
                    "yes" if r["alive"] else "no",
                    r["role"],
                    "-" if r["epoch"] is None else r["epoch"],
                    "-" if r["high_watermark"] is None else r["high_watermark"],
                    "-" if r["leader_id"] is None else r["leader_id"],
                ]
                for r in rows
            ],
        )
    )


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "cluster",
        help="run a local cluster of controller processes (up, status, down)",
        description=(
            "A local kq cluster: N `kq controller start` processes on 127.0.0.1, "
            "node N on port BASE+N-1, with data, configs and logs under --cluster-dir."
        ),
    )

    up = commands.add_parser(
        "up",
        help="format (if new) and start the local cluster; wait for a leader",
        description=(
            "Start the local cluster in --cluster-dir: on first use pick a cluster id, write "
            "each node's config and format its data directory; then start every node "
            "in the background, wait until a leader is elected and print the status. "
            "Refuses while any node of the cluster is running."
        ),
    )
    _dir_flag(up)
    up.add_argument(
        "--nodes", type=int, help=f"number of voters, new cluster only (default {DEFAULT_NODES})"
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
        help="a quorum.*, node.*, controller.* or log_level setting for every node's config "
        "(new cluster only; edit DIR/node-N/config.toml later)",
    )
    up.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for a leader (default 30)"
    )
    up.add_argument("--json", action="store_true", help="print the status as JSON")
    up.set_defaults(func=_up)

    status = commands.add_parser(
        "status",
        help="each node's pid, role, epoch and high watermark",
        description="Ask every node of the local cluster for its role (DescribeQuorum).",
    )
    _dir_flag(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_status)

    down = commands.add_parser(
        "down",
        help="stop every node (SIGTERM: a leader resigns first; SIGKILL stragglers)",
        description=(
            "Send SIGTERM to every running node of the local cluster, wait up to "
            "--timeout seconds, then SIGKILL any still running. Data is kept."
        ),
    )
    _dir_flag(down)
    down.add_argument(
        "--timeout", type=float, default=10.0, help="seconds before SIGKILL (default 10)"
    )
    down.add_argument("--json", action="store_true", help="print what was stopped as JSON")
    down.set_defaults(func=_down)

    kill = commands.add_parser("kill", help="SIGKILL one node (to test recovery)")
    kill.add_argument("node", type=int, metavar="NODE")
    _dir_flag(kill)
    kill.set_defaults(func=_kill)

    start = commands.add_parser("start", help="start one stopped node again")
    start.add_argument("node", type=int, metavar="NODE")
    _dir_flag(start)
    start.add_argument(
        "--timeout", type=float, default=15.0, help="seconds to wait for it to serve"
    )
    start.set_defaults(func=_start)


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
    base = DEFAULT_BASE_PORT if args.base_port is None else args.base_port
    if not 1 <= nodes <= 99:
        raise CommandError(f"--nodes must be in 1..99, got {nodes}", EXIT_USAGE)
    # The metrics ports (METRICS_PORT_OFFSET above) must fit too.
    top = 65535 - nodes + 1 - METRICS_PORT_OFFSET
    if not 1024 <= base <= top:
        raise CommandError(
            f"--base-port must be in 1024..{top} for {nodes} nodes, got {base}",
            EXIT_USAGE,
        )
    addresses = {i: f"{HOST}:{base + i - 1}" for i in range(1, nodes + 1)}
    metrics = {i: f"{HOST}:{base + METRICS_PORT_OFFSET + i - 1}" for i in addresses}
    state = new_cluster_state(Path(args.dir).resolve(), base, addresses, metrics)
    state.tls = not args.insecure
    return state


def _extra_settings(items: Sequence[str]) -> dict[str, object]:
    """The --set values of `cluster up`, checked."""
    flags = []
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CommandError(f"--set {item!r} is not KEY=VALUE", EXIT_USAGE)
        if not (key.startswith(("quorum.", "node.", "controller.")) or key == "log_level"):
            raise CommandError(
                f"--set {item}: only quorum.*, node.*, controller.* and log_level can be set "
                "for every node of a local cluster",
                EXIT_USAGE,
            )
        flags.append((key, text, f"flag --set {item}"))
    try:
        settings = load_settings(None, {}, flags)
    except ConfigError as exc:
        raise CommandError(f"config error: {exc}", EXIT_USAGE) from None
    return dict(settings.values)


@command("cluster up")
def _up(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise CommandError("--timeout must be positive", EXIT_USAGE)
    state = load_state(args.dir)
    created = state is None
    if state is None:
        extra = _extra_settings(args.cfg_set)
        state = _new_state(args)
        state.dir.mkdir(parents=True, exist_ok=True)
        if state.tls:
            make_certs(state)
        write_configs(state, extra)
        state.save()
    else:
        running = [n for n in state.nodes if node_alive(state, n)]
        if running:
            pids = ", ".join(f"node {n.node_id} pid {n.pid}" for n in running)
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
        if args.base_port is not None and args.base_port != state.base_port:
            raise CommandError(
                f"the cluster in {state.dir} uses base port {state.base_port}, not "
                f"{args.base_port}; remove the directory to make a new cluster",
                EXIT_USAGE,
            )
        if args.cfg_set:
            raise CommandError(
                "--set applies to a new cluster only; edit the node configs in "
                f"{state.dir}/node-N/config.toml instead",
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
    check_ports(state, state.nodes)
    formatted = format_new_nodes(state)
    procs = {n.node_id: spawn_node(state, n) for n in state.nodes}
    if not args.json:
        what = "Created and started" if created else "Started"
        print(
            f"{what} a {len(state.nodes)}-node kq cluster {state.cluster_id} in {state.dir}"
            + (f" (formatted nodes {','.join(map(str, formatted))})" if formatted else "")
        )
    run_async(wait_for_leader(state, procs, args.timeout))
    rows = run_async(status_rows(state))
    if args.json:
        print_json(_status_json(state, rows))
    else:
        print()
        _print_status(state, rows)
        print()
        print(f"Logs: {state.dir}/node-N/controller.log")
        print(f"Stop: kq cluster down --cluster-dir {args.dir}")
    return 0


@command("cluster status")
def _status(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    rows = run_async(status_rows(state))
    if args.json:
        print_json(_status_json(state, rows))
    else:
        _print_status(state, rows)
    return 0


@command("cluster down")
def _down(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    running = [n for n in state.nodes if node_alive(state, n)]
    outcome: dict[int, str] = {n.node_id: "not running" for n in state.nodes}
    for n in running:
        assert n.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(n.pid, signal.SIGTERM)
        outcome[n.node_id] = "stopped"
    if not wait_gone(state, running, args.timeout):
        for n in running:
            if node_alive(state, n):
                assert n.pid is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGKILL)
                outcome[n.node_id] = f"killed (still running after {args.timeout:g} s)"
        wait_gone(state, running, 5.0)
    stuck = [n for n in running if node_alive(state, n)]
    for n in state.nodes:
        if n not in stuck:
            n.pid = None
    state.save()
    for n in stuck:
        outcome[n.node_id] = f"still running (pid {n.pid})"
    if args.json:
        print_json({"dir": str(state.dir), "nodes": {str(k): v for k, v in outcome.items()}})
    else:
        for node_id, what in sorted(outcome.items()):
            print(f"node {node_id}: {what}")
    return EXIT_FAILURE if stuck else 0


@command("cluster kill")
def _kill(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    node = state.node(args.node)
    if not node_alive(state, node):
        raise CommandError(f"node {node.node_id} is not running")
    assert node.pid is not None
    pid = node.pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_gone(state, [node], 5.0):
        raise CommandError(f"node {node.node_id} (pid {pid}) survived SIGKILL for 5 s")
    node.pid = None
    state.save()
    print(f"killed node {node.node_id} (pid {pid}) with SIGKILL")
    return 0


@command("cluster start")
def _start(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    node = state.node(args.node)
    if node_alive(state, node):
        raise CommandError(f"node {node.node_id} is already running (pid {node.pid})")
    check_configs(state)
    check_ports(state, [node])
    if not state.tls:
        print(state.plaintext_warning(), file=sys.stderr)
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

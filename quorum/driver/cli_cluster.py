"""``kq cluster``: a local cluster of controller processes on one machine.

kq cluster up [--dir DIR] [--nodes 3] [--base-port 9091] [--set KEY=VALUE] [--json]
kq cluster status [--dir DIR] [--json]
kq cluster down [--dir DIR]
kq cluster kill NODE [--dir DIR]      (SIGKILL, to test recovery)
kq cluster start NODE [--dir DIR]     (restart one stopped node)

Node N listens on ``127.0.0.1:<base port + N - 1>``.  Everything lives under
DIR (default ``./kq-cluster``)::

    cluster.json           the state: cluster id, and per node its id,
                           address, pid, data dir, config and log file
    node-N/config.toml     the node's generated config (data_dir = "data")
    node-N/data/           its formatted data directory
    node-N/controller.log  its stdout and stderr (the node's log)

Paths in ``cluster.json`` are relative to DIR.  ``up`` formats new data
directories, starts one ``kq controller start`` process per node in its own
session (so that it outlives the shell that started it), waits until a
leader is elected and prints the status.  ``up`` on a stopped cluster starts
it again with its data; it refuses while any of its processes is alive.
A pid is only taken for a node's if the process's command line names that
node's config file (on Linux; elsewhere, if the pid exists).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quorum.driver.cli_common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    command,
    describe,
    format_table,
    needs_subcommand,
    print_json,
    run_async,
)
from quorum.driver.cli_config import (
    ConfigError,
    controller_config,
    env_name,
    load_settings,
    render_toml,
)
from quorum.driver.storage_format import (
    META_FILE,
    StorageFormatError,
    format_storage,
    random_cluster_id,
    read_meta,
)

__all__ = ["STATE_FILE", "ClusterState", "NodeState", "load_state", "local_addresses", "register"]

STATE_FILE = "cluster.json"
STATE_VERSION = 1
DEFAULT_DIR = "kq-cluster"
DEFAULT_NODES = 3
DEFAULT_BASE_PORT = 9091
HOST = "127.0.0.1"
# Settings each node's generated config fixes; the environment must not
# override them for a node of a local cluster.
_IDENTITY_KEYS = ("node_id", "cluster_id", "data_dir", "listen", "voters", "metrics_listen")


@dataclass(slots=True)
class NodeState:
    node_id: int
    address: str
    pid: int | None
    data_dir: str
    config: str
    log_file: str


@dataclass(slots=True)
class ClusterState:
    dir: Path
    cluster_id: str
    base_port: int
    nodes: list[NodeState]

    def path(self, relative: str) -> Path:
        return self.dir / relative

    def node(self, node_id: int) -> NodeState:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        ids = ",".join(str(n.node_id) for n in self.nodes)
        raise CommandError(f"the cluster in {self.dir} has no node {node_id} (nodes {ids})")

    def save(self) -> None:
        obj = {
            "version": STATE_VERSION,
            "cluster_id": self.cluster_id,
            "base_port": self.base_port,
            "nodes": [asdict(n) for n in self.nodes],
        }
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2) + "\n")
        os.replace(tmp, self.dir / STATE_FILE)


def load_state(directory: str | os.PathLike[str]) -> ClusterState | None:
    """The state of the local cluster in ``directory``; None if it has none."""
    path = Path(directory).resolve()
    file = path / STATE_FILE
    if not file.exists():
        return None
    try:
        obj = json.loads(file.read_text())
        if obj.get("version") != STATE_VERSION:
            raise ValueError(f"unknown version {obj.get('version')!r}")
        nodes = [
            NodeState(
                node_id=int(n["node_id"]),
                address=str(n["address"]),
                pid=None if n.get("pid") is None else int(n["pid"]),
                data_dir=str(n["data_dir"]),
                config=str(n["config"]),
                log_file=str(n["log_file"]),
            )
            for n in obj["nodes"]
        ]
        return ClusterState(path, str(obj["cluster_id"]), int(obj["base_port"]), nodes)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CommandError(f"{file} is unreadable or malformed: {exc}") from None


def local_addresses(directory: str | os.PathLike[str]) -> list[str]:
    """The node addresses of the local cluster in ``directory`` (none if no state)."""
    try:
        state = load_state(directory)
    except CommandError:
        return []
    return [] if state is None else [n.address for n in state.nodes]


# -- processes ------------------------------------------------------------------


def process_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs (not a zombie) with ``marker`` in its command line.

    Without /proc, only whether the pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not ours
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except FileNotFoundError:
        # With a /proc of processes, the pid exited meanwhile; else no /proc.
        return not Path("/proc/self").exists()
    except OSError:
        return True
    if stat.rpartition(")")[2].split()[:1] in (["Z"], ["X"]):
        return False
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0")]
    return marker in args


def _config_marker(state: ClusterState, node: NodeState) -> str:
    return str(state.path(node.config))


def node_alive(state: ClusterState, node: NodeState) -> bool:
    return node.pid is not None and process_alive(node.pid, _config_marker(state, node))


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {env_name(x) for x in _IDENTITY_KEYS}}
    # Let `python -m kq.cli` find kq even when it is run from a source tree
    # without an install.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run_kq(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``kq ARGS...`` in a child process (as the cluster's nodes run):
    for tests and benchmarks that drive the command line."""
    return subprocess.run(
        [sys.executable, "-m", "kq.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=_child_env(),
        check=False,
    )


def free_base_port(count: int, host: str = "127.0.0.1") -> int:
    """A port P such that P .. P+count-1 are all free on ``host`` now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise CommandError(f"no range of {count} free ports on {host}")


def spawn_node(state: ClusterState, node: NodeState) -> subprocess.Popen[bytes]:
    log_path = state.path(node.log_file)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "kq.cli",
        "controller",
        "start",
        "--config",
        _config_marker(state, node),
    ]
    with log_path.open("ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"--- {stamp} kq cluster: starting node {node.node_id}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state.dir,
            env=_child_env(),
            start_new_session=True,
        )
    node.pid = proc.pid
    state.save()
    return proc


def port_free(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def log_tail(state: ClusterState, node: NodeState, lines: int = 15) -> str:
    try:
        text = state.path(node.log_file).read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.splitlines()[-lines:]
    return "\n".join("    " + line for line in tail)


def _wait_gone(state: ClusterState, nodes: Sequence[NodeState], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(node_alive(state, n) for n in nodes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# -- status -----------------------------------------------------------------------


async def _status_rows(state: ClusterState, timeout_s: float = 1.0) -> list[dict[str, Any]]:
    alive = [node_alive(state, n) for n in state.nodes]
    answers = await asyncio.gather(
        *(
            describe(n.address, timeout_s) if up else _none()
            for n, up in zip(state.nodes, alive, strict=True)
        )
    )
    rows = []
    for n, up, r in zip(state.nodes, alive, answers, strict=True):
        rows.append(
            {
                "node_id": n.node_id,
                "address": n.address,
                "pid": n.pid if up else None,
                "alive": up,
                "role": "down" if r is None else r.role,
                "epoch": None if r is None else r.epoch,
                "high_watermark": None if r is None else r.high_watermark,
                "log_end_offset": None if r is None else r.log_end_offset,
                "leader_id": None if r is None or r.leader.leader_id < 0 else r.leader.leader_id,
                "data_dir": n.data_dir,
                "log_file": n.log_file,
            }
        )
    return rows


async def _none() -> None:
    return None


def _status_json(state: ClusterState, rows: list[dict[str, Any]]) -> dict[str, Any]:
    leaders = [r for r in rows if r["role"] == "leader"]
    leader = max(leaders, key=lambda r: r["epoch"]) if leaders else None
    return {
        "cluster_id": state.cluster_id,
        "dir": str(state.dir),
        "leader_id": None if leader is None else leader["node_id"],
        "epoch": None if leader is None else leader["epoch"],
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
    print(f"Cluster {state.cluster_id} in {state.dir}: {up}/{len(rows)} nodes running, {leader}")
    print()
    print(
        format_table(
            ["NodeId", "Address", "Pid", "Alive", "Role", "Epoch", "HighWatermark", "LeaderId"],
            [
                [
                    r["node_id"],
                    r["address"],
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


# -- commands ----------------------------------------------------------------------


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cluster",
        help="run a local cluster of controller processes (up, status, down)",
        description=(
            "A local kq cluster: N `kq controller start` processes on 127.0.0.1, "
            "node N on port BASE+N-1, with data, configs and logs under --dir."
        ),
    )
    commands = parser.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)
    needs_subcommand(parser)

    up = commands.add_parser(
        "up",
        help="format (if new) and start the local cluster; wait for a leader",
        description=(
            "Start the local cluster in --dir: on first use pick a cluster id, write "
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
    parser.add_argument(
        "--dir", default=DEFAULT_DIR, help="the cluster's directory (default: ./%(default)s)"
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
    if not 1024 <= base <= 65535 - nodes + 1:
        raise CommandError(
            f"--base-port must be in 1024..{65535 - nodes + 1} for {nodes} nodes, got {base}",
            EXIT_USAGE,
        )
    addresses = {i: f"{HOST}:{base + i - 1}" for i in range(1, nodes + 1)}
    return new_cluster_state(Path(args.dir).resolve(), base, addresses)


def new_cluster_state(directory: Path, port: int, addresses: Mapping[int, str]) -> ClusterState:
    """The state of a new cluster of the nodes in ``addresses`` (node id to
    address), with a fresh cluster id and each node's files under
    ``node-<id>/`` of ``directory``."""
    return ClusterState(
        directory,
        random_cluster_id(),
        port,
        [
            NodeState(
                node_id=i,
                address=address,
                pid=None,
                data_dir=f"node-{i}/data",
                config=f"node-{i}/config.toml",
                log_file=f"node-{i}/controller.log",
            )
            for i, address in addresses.items()
        ],
    )


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


def write_configs(
    state: ClusterState,
    extra: Mapping[str, object],
    header: str = "",
    per_node: Callable[[int], Mapping[str, object]] | None = None,
) -> None:
    """Each node's config file: its identity, the voters, ``extra`` for
    every node and ``per_node(id)`` for that one; ``header`` names what
    wrote it."""
    voters = {n.node_id: n.address for n in state.nodes}
    for n in state.nodes:
        path = state.path(n.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        values: dict[str, object] = {
            "node_id": n.node_id,
            "cluster_id": state.cluster_id,
            "data_dir": os.path.relpath(state.path(n.data_dir), path.parent),
            "log_level": "INFO",
            "voters": voters,
        }
        values.update(extra)
        if per_node is not None:
            values.update(per_node(n.node_id))
        top = header or (
            f"kq controller config of node {n.node_id} of the local cluster in this\n"
            "# directory, written by `kq cluster up`"
        )
        path.write_text(f"# {top}; docs/operations.md lists every key.\n" + render_toml(values))


def check_configs(state: ClusterState) -> None:
    """Load every node's config as its process will (file and environment)."""
    env = _child_env()
    for n in state.nodes:
        try:
            controller_config(load_settings(state.path(n.config), env))
        except ConfigError as exc:
            raise CommandError(f"node {n.node_id}: config error: {exc}", EXIT_USAGE) from None


def format_new_nodes(state: ClusterState) -> list[int]:
    formatted = []
    for n in state.nodes:
        data_dir = state.path(n.data_dir)
        if (data_dir / META_FILE).exists():
            try:
                meta = read_meta(data_dir)
            except StorageFormatError as exc:
                raise CommandError(str(exc)) from None
            if meta.cluster_id != state.cluster_id or meta.node_id != n.node_id:
                raise CommandError(
                    f"data directory {data_dir} belongs to cluster {meta.cluster_id} node "
                    f"{meta.node_id}, not cluster {state.cluster_id} node {n.node_id}"
                )
            continue
        try:
            format_storage(data_dir, state.cluster_id, n.node_id, [m.node_id for m in state.nodes])
        except (StorageFormatError, ValueError, OSError) as exc:
            raise CommandError(str(exc)) from None
        formatted.append(n.node_id)
    return formatted


def _check_ports(state: ClusterState, nodes: Sequence[NodeState]) -> None:
    busy = [n for n in nodes if not port_free(n.address)]
    if busy:
        shown = ", ".join(f"{n.address} (node {n.node_id})" for n in busy)
        raise CommandError(
            f"address(es) already in use: {shown}; stop what uses them, or start a new "
            "cluster with another --base-port (or --dir)"
        )


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
        write_configs(state, extra)
        state.save()
    else:
        running = [n for n in state.nodes if node_alive(state, n)]
        if running:
            pids = ", ".join(f"node {n.node_id} pid {n.pid}" for n in running)
            raise CommandError(
                f"the cluster in {state.dir} is already running ({pids}); see `kq cluster "
                f"status --dir {args.dir}`, restart a stopped node with `kq cluster start "
                f"NODE`, or stop it with `kq cluster down --dir {args.dir}`"
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
    check_configs(state)
    _check_ports(state, state.nodes)
    formatted = format_new_nodes(state)
    procs = {n.node_id: spawn_node(state, n) for n in state.nodes}
    if not args.json:
        what = "Created and started" if created else "Started"
        print(
            f"{what} a {len(state.nodes)}-node kq cluster {state.cluster_id} in {state.dir}"
            + (f" (formatted nodes {','.join(map(str, formatted))})" if formatted else "")
        )
    run_async(wait_for_leader(state, procs, args.timeout))
    rows = run_async(_status_rows(state))
    if args.json:
        print_json(_status_json(state, rows))
    else:
        print()
        _print_status(state, rows)
        print()
        print(f"Logs: {state.dir}/node-N/controller.log")
        print(f"Stop: kq cluster down --dir {args.dir}")
    return 0


async def wait_for_leader(
    state: ClusterState, procs: dict[int, subprocess.Popen[bytes]], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for node_id, proc in procs.items():
            code = proc.poll()
            if code is not None:
                node = state.node(node_id)
                node.pid = None
                state.save()
                raise CommandError(
                    f"node {node_id} exited with status {code} while starting; the end of "
                    f"{state.path(node.log_file)}:\n{log_tail(state, node)}\n"
                    f"(stop the other nodes with `kq cluster down --dir {state.dir}`)"
                )
        answers = await asyncio.gather(*(describe(n.address, 0.5) for n in state.nodes))
        if any(a is not None and a.role == "leader" for a in answers):
            return
        if time.monotonic() >= deadline:
            raise CommandError(
                f"no leader was elected within {timeout_s:g} s; the nodes are still "
                f"running: see `kq cluster status --dir {state.dir}` and the logs in "
                f"{state.dir}/node-N/controller.log"
            )
        await asyncio.sleep(0.2)


@command("cluster status")
def _status(args: argparse.Namespace) -> int:
    state = _need_state(args.dir)
    rows = run_async(_status_rows(state))
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
    if not _wait_gone(state, running, args.timeout):
        for n in running:
            if node_alive(state, n):
                assert n.pid is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGKILL)
                outcome[n.node_id] = f"killed (still running after {args.timeout:g} s)"
        _wait_gone(state, running, 5.0)
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
    if not _wait_gone(state, [node], 5.0):
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
    _check_ports(state, [node])
    proc = spawn_node(state, node)
    deadline = time.monotonic() + args.timeout
    while run_async(describe(node.address, 0.5)) is None:
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

"""The local cluster of ``kq cluster``: controller and broker processes on
one machine.

Also what the chaos harness's local backend and the benchmarks start their
clusters with.  Controllers and brokers share one id space, as in Kafka
(a broker's id must differ from every controller's): with C controllers,
the controllers are 1..C and the brokers C+1, C+2, ...  Node N, controller
or broker, listens on port ``<base port> + N - 1`` (its Prometheus exporter
on that plus :data:`METRICS_PORT_OFFSET`): a controller on ``127.0.0.1``,
broker N on its own loopback address ``127.0.1.N`` (:func:`broker_host`),
so that a fault test can cut one broker off by its address alone (Linux
routes all of 127.0.0.0/8 to the loopback interface).  With 3 controllers
and 3 brokers at base 9091: controllers at 127.0.0.1:9091-9093, brokers 4,
5, 6 at 127.0.1.4:9094, 127.0.1.5:9095 and 127.0.1.6:9096.  Everything lives
under one folder (default ``./kq-cluster``)::

    cluster.json             the state: cluster id, and per node and per
                             broker its id, address, pid, data dir, config,
                             log file and metrics address (a broker's log
                             directories too)
    node-N/config.toml       the node's generated config (data_dir = "data")
    node-N/data/             its formatted data directory
    node-N/controller.log    its stdout and stderr (the node's log)
    broker-N/config.toml     a broker's generated config
    broker-N/metadata/       its copy of the metadata log (formatted as a
                             node's data directory)
    broker-N/logs/           its log directory (the partitions' logs),
                             stamped with the cluster and broker id
    broker-N/broker.log      its stdout and stderr

Paths in ``cluster.json`` are relative to the folder.  Starting formats new
data directories, starts one ``kq controller start`` process per node in
its own session (so that it outlives the shell that started it) and waits
until a leader is elected; then one ``kq broker start`` per broker
(:mod:`server.local_brokers` waits for them to be unfenced).  A pid is
only taken for a node's if the process's command line names that node's
config file (on Linux; elsewhere, if the pid exists).  Errors for the
user are :class:`server.errors.UserError`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from quorum.driver.client import describe
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.storage_format import (
    META_FILE,
    StorageFormatError,
    format_storage,
    random_cluster_id,
    read_meta,
)
from quorum.driver.tls import TlsFiles
from server.certs import create_ca, issue
from server.config import (
    CONTROLLER_LISTENER,
    ConfigError,
    SecurityProtocol,
    controller_config,
    env_name,
    load_settings,
    render_toml,
)
from server.errors import EXIT_USAGE, UserError

__all__ = [
    "BROKER_NET",
    "DEFAULT_BASE_PORT",
    "DEFAULT_BROKERS",
    "DEFAULT_DIR",
    "DEFAULT_NODES",
    "HOST",
    "MAX_BROKERS",
    "METRICS_PORT_OFFSET",
    "STATE_FILE",
    "BrokerState",
    "ClusterState",
    "NodeState",
    "broker_addresses",
    "broker_host",
    "PLAINTEXT_WARNING",
    "check_configs",
    "check_none_exited",
    "check_ports",
    "format_new_nodes",
    "free_base_port",
    "CallerCredentials",
    "broker_tls",
    "host_bindable",
    "local_cluster_state",
    "write_broker_configs",
    "issue_node_cert",
    "load_state",
    "local_addresses",
    "node_protocol",
    "log_tail",
    "make_certs",
    "new_cluster_state",
    "node_alive",
    "process_alive",
    "process_paused",
    "run_kq",
    "spawn_node",
    "status_rows",
    "wait_for_leader",
    "wait_gone",
    "write_configs",
]

STATE_FILE = "cluster.json"
STATE_VERSION = 1
DEFAULT_DIR = "kq-cluster"
DEFAULT_NODES = 3
DEFAULT_BROKERS = 3
# At most this many brokers; with at most 99 controllers every broker id
# stays below 255, the last octet of its loopback address.
MAX_BROKERS = 99
DEFAULT_BASE_PORT = 9091
HOST = "127.0.0.1"
# Broker N listens on BROKER_NET + N (127.0.1.N), each on its own address.
BROKER_NET = "127.0.1."
# Node N's Prometheus exporter listens on its gRPC port plus this.
METRICS_PORT_OFFSET = 1000
# The source tree this module is part of (server/ is at its top).
SOURCE_ROOT = Path(__file__).resolve().parents[1]
# Where a TLS cluster keeps its certificates, and the commands' user.
CERTS_DIR = "certs"
ADMIN_USER = "admin"
PLAINTEXT_WARNING = (
    "WARNING: the cluster in {dir} is insecure: its listeners are PLAINTEXT, with no "
    "encryption, no authentication and no authorization; anyone who reaches {addresses} "
    "can act as any node or client. Make a cluster without --insecure for mutual TLS."
)
"""What every start of a plaintext local cluster prints (CockroachDB warns
so on every ``--insecure`` start)."""
# Settings each node's generated config fixes; the environment must not
# override them for a node of a local cluster.
_IDENTITY_KEYS = (
    "node_id",
    "cluster_id",
    "data_dir",
    "listen",
    "voters",
    "metrics_listen",
    "broker.log_dirs",
)


@dataclass(slots=True)
class NodeState:
    node_id: int
    address: str
    pid: int | None
    data_dir: str
    config: str
    log_file: str
    # host:port of its Prometheus exporter; "" for none (clusters made
    # before nodes had one, and the chaos harness's).
    metrics_address: str = ""


@dataclass(slots=True)
class BrokerState(NodeState):
    """A broker of the local cluster: ``node_id`` its broker id,
    ``data_dir`` its copy of the metadata log, ``log_dirs`` where its
    partitions' logs live (paths relative to the cluster's folder)."""

    log_dirs: list[str] = field(default_factory=list)


def broker_host(broker_id: int) -> str:
    """The loopback address broker ``broker_id`` of a local cluster listens on."""
    if not 1 <= broker_id <= 254:
        raise UserError(f"broker id {broker_id} has no loopback address {BROKER_NET}<id>")
    return f"{BROKER_NET}{broker_id}"


@dataclass(slots=True)
class ClusterState:
    dir: Path
    cluster_id: str
    base_port: int
    nodes: list[NodeState]
    # Mutual TLS: the cluster's CA and certificates in certs/ (a
    # controller's per node, a broker's per broker and user-admin's for the
    # commands).
    tls: bool = False
    # The brokers (none in clusters made before brokers, or with --brokers 0).
    brokers: list[BrokerState] = field(default_factory=list)

    @property
    def certs_dir(self) -> Path:
        return self.dir / CERTS_DIR

    def client_tls(self) -> TlsFiles | None:
        """The certificate the commands use against this cluster."""
        return TlsFiles.in_folder(self.certs_dir, f"user-{ADMIN_USER}") if self.tls else None

    def client_credentials(self) -> grpc.ChannelCredentials | None:
        files = self.client_tls()
        return files.channel_credentials() if files is not None else None

    @property
    def security_protocol(self) -> SecurityProtocol:
        """The protocol every node's listener is made with."""
        return SecurityProtocol.SSL if self.tls else SecurityProtocol.PLAINTEXT

    def plaintext_warning(self) -> str:
        return PLAINTEXT_WARNING.format(
            dir=self.dir, addresses=", ".join(n.address for n in self.nodes)
        )

    def path(self, relative: str) -> Path:
        return self.dir / relative

    def node(self, node_id: int) -> NodeState:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        ids = ",".join(str(n.node_id) for n in self.nodes)
        raise UserError(f"the cluster in {self.dir} has no node {node_id} (nodes {ids})")

    def broker(self, broker_id: int) -> BrokerState:
        for b in self.brokers:
            if b.node_id == broker_id:
                return b
        ids = ",".join(str(b.node_id) for b in self.brokers) or "none"
        raise UserError(f"the cluster in {self.dir} has no broker {broker_id} (brokers {ids})")

    @property
    def members(self) -> list[NodeState]:
        """Every process of the cluster: the controllers, then the brokers."""
        return [*self.nodes, *self.brokers]

    def member(self, node_id: int) -> NodeState:
        """Controller or broker ``node_id`` (they share one id space)."""
        for n in self.members:
            if n.node_id == node_id:
                return n
        nodes = ",".join(str(n.node_id) for n in self.nodes)
        brokers = ",".join(str(b.node_id) for b in self.brokers) or "none"
        raise UserError(
            f"the cluster in {self.dir} has no node or broker {node_id} "
            f"(controllers {nodes}, brokers {brokers})"
        )

    def broker_addresses(self) -> list[str]:
        return [b.address for b in self.brokers]

    def save(self) -> None:
        obj = {
            "version": STATE_VERSION,
            "cluster_id": self.cluster_id,
            "base_port": self.base_port,
            "tls": self.tls,
            "nodes": [asdict(n) for n in self.nodes],
            "brokers": [asdict(b) for b in self.brokers],
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
                metrics_address=str(n.get("metrics_address", "")),
            )
            for n in obj["nodes"]
        ]
        # A cluster made before brokers has no "brokers": none.
        brokers = [
            BrokerState(
                node_id=int(b["node_id"]),
                address=str(b["address"]),
                pid=None if b.get("pid") is None else int(b["pid"]),
                data_dir=str(b["data_dir"]),
                config=str(b["config"]),
                log_file=str(b["log_file"]),
                metrics_address=str(b.get("metrics_address", "")),
                log_dirs=[str(d) for d in b["log_dirs"]],
            )
            for b in obj.get("brokers", [])
        ]
        return ClusterState(
            path,
            str(obj["cluster_id"]),
            int(obj["base_port"]),
            nodes,
            bool(obj.get("tls", False)),
            brokers,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{file} is unreadable or malformed: {exc}") from None


def local_addresses(directory: str | os.PathLike[str]) -> list[str]:
    """The node addresses of the local cluster in ``directory`` (none if no state)."""
    try:
        state = load_state(directory)
    except UserError:
        return []
    return [] if state is None else [n.address for n in state.nodes]


def broker_addresses(directory: str | os.PathLike[str]) -> list[str]:
    """The broker addresses (host:port) of the local cluster in
    ``directory``, in broker id order; none if it has no state or no
    brokers."""
    try:
        state = load_state(directory)
    except UserError:
        return []
    return [] if state is None else state.broker_addresses()


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


def process_paused(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP: ``kq cluster pause``); False
    without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["T"]


def _config_marker(state: ClusterState, node: NodeState) -> str:
    return str(state.path(node.config))


def node_alive(state: ClusterState, node: NodeState) -> bool:
    return node.pid is not None and process_alive(node.pid, _config_marker(state, node))


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {env_name(x) for x in _IDENTITY_KEYS}}
    # Let `python -m kq.cli` find kq even when it is run from a source tree
    # without an install: the source tree's root, which holds kq/.
    root = str(SOURCE_ROOT)
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


def free_base_port(count: int, host: str = "127.0.0.1", brokers: int = 0) -> int:
    """A port P such that P .. P+count-1 are all free on ``host`` now, and
    so are the metrics ports of a local cluster of ``count`` nodes at P;
    with ``brokers``, also the ports of brokers ``count+1`` ..
    ``count+brokers`` (and their metrics ports) on their own addresses
    (:func:`broker_host`)."""
    rng = random.Random()
    top = 60_000 - count - brokers
    for _ in range(200):
        base = rng.randrange(20_000, top)
        wanted = [(host, p) for p in range(base, base + count)]
        wanted += [(broker_host(b), base + b - 1) for b in range(count + 1, count + brokers + 1)]
        wanted += [(h, p + METRICS_PORT_OFFSET) for h, p in wanted]
        socks = []
        try:
            for address in wanted:
                s = socket.socket()
                socks.append(s)
                s.bind(address)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise UserError(f"no range of {count} free ports on {host}")


def spawn_node(
    state: ClusterState, node: NodeState, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``node``: ``kq controller start`` for a controller, ``kq
    broker start`` for a :class:`BrokerState`, with its config, in its own
    session, its output appended to its log file; its pid saved.  ``env``:
    variables set for the process over this one's (a chaos run's bug
    switch, :mod:`bugs`)."""
    log_path = state.path(node.log_file)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    role = "broker" if isinstance(node, BrokerState) else "controller"
    cmd = [
        sys.executable,
        "-m",
        "kq.cli",
        role,
        "start",
        "--config",
        _config_marker(state, node),
    ]
    with log_path.open("ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        what = "broker" if role == "broker" else "node"
        log.write(f"--- {stamp} kq cluster: starting {what} {node.node_id}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=state.dir,
            env={**_child_env(), **(env or {})},
            start_new_session=True,
        )
    node.pid = proc.pid
    state.save()
    return proc


def host_bindable(host: str) -> bool:
    """Whether this machine can listen on ``host`` (any port): False for an
    address no interface has, such as 127.0.1.4 where 127.0.0.0/8 is not
    all routed to the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


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


def wait_gone(state: ClusterState, nodes: Sequence[NodeState], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(node_alive(state, n) for n in nodes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# -- status -----------------------------------------------------------------------


async def status_rows(state: ClusterState, timeout_s: float = 1.0) -> list[dict[str, Any]]:
    alive = [node_alive(state, n) for n in state.nodes]
    credentials = state.client_credentials()
    answers = await asyncio.gather(
        *(
            describe(n.address, timeout_s, credentials) if up else _none()
            for n, up in zip(state.nodes, alive, strict=True)
        )
    )
    rows = []
    for n, up, r in zip(state.nodes, alive, answers, strict=True):
        rows.append(
            {
                "node_id": n.node_id,
                "address": n.address,
                "metrics_address": n.metrics_address or None,
                "pid": n.pid if up else None,
                "alive": up,
                "paused": up and n.pid is not None and process_paused(n.pid),
                "role": "down" if r is None else r.role,
                "epoch": None if r is None else r.epoch,
                "high_watermark": None if r is None else r.high_watermark,
                "log_end_offset": None if r is None else r.log_end_offset,
                "leader_id": None if r is None or r.leader.leader_id < 0 else r.leader.leader_id,
                "security_protocol": node_protocol(state, n),
                "data_dir": n.data_dir,
                "log_file": n.log_file,
            }
        )
    return rows


def node_protocol(state: ClusterState, node: NodeState) -> str:
    """The security protocol of ``node``'s listener, as its config file says
    (the cluster's, if the file does not load)."""
    try:
        config = controller_config(load_settings(state.path(node.config), _child_env()))
    except ConfigError:
        return state.security_protocol.value
    return config.security_protocol.value


async def _none() -> None:
    return None


def new_cluster_state(
    directory: Path,
    port: int,
    addresses: Mapping[int, str],
    metrics: Mapping[int, str] | None = None,
    brokers: Mapping[int, str] | None = None,
    broker_metrics: Mapping[int, str] | None = None,
) -> ClusterState:
    """The state of a new cluster of the nodes in ``addresses`` (node id to
    address; ``metrics``: to the address of its Prometheus exporter, if it
    has one), with a fresh cluster id and each node's files under
    ``node-<id>/`` of ``directory``; and of the brokers in ``brokers``
    (broker id to address, ``broker_metrics`` likewise), each with its
    files under ``broker-<id>/``."""
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
                metrics_address=(metrics or {}).get(i, ""),
            )
            for i, address in addresses.items()
        ],
        brokers=[
            BrokerState(
                node_id=b,
                address=address,
                pid=None,
                data_dir=f"broker-{b}/metadata",
                config=f"broker-{b}/config.toml",
                log_file=f"broker-{b}/broker.log",
                metrics_address=(broker_metrics or {}).get(b, ""),
                log_dirs=[f"broker-{b}/logs"],
            )
            for b, address in (brokers or {}).items()
        ],
    )


def local_cluster_state(directory: Path, base_port: int, nodes: int, brokers: int) -> ClusterState:
    """A new local cluster's state laid out as the module says: controllers
    1..``nodes`` on 127.0.0.1, brokers ``nodes+1``.. each on its own
    127.0.1.<id>; node N on port ``base_port + N - 1``, its metrics
    :data:`METRICS_PORT_OFFSET` above."""
    addresses = {i: f"{HOST}:{base_port + i - 1}" for i in range(1, nodes + 1)}
    metrics = {i: f"{HOST}:{base_port + METRICS_PORT_OFFSET + i - 1}" for i in addresses}
    ids = range(nodes + 1, nodes + brokers + 1)
    broker_at = {b: f"{broker_host(b)}:{base_port + b - 1}" for b in ids}
    broker_metrics = {b: f"{broker_host(b)}:{base_port + METRICS_PORT_OFFSET + b - 1}" for b in ids}
    return new_cluster_state(directory, base_port, addresses, metrics, broker_at, broker_metrics)


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
        if n.metrics_address:
            values["metrics_listen"] = n.metrics_address
        if state.tls:
            files = TlsFiles.in_folder(state.certs_dir, f"controller-{n.node_id}")
            for key, file in (("ca", files.ca), ("cert", files.cert), ("key", files.key)):
                values[f"tls.{key}_file"] = os.path.relpath(file, path.parent)
            values["authorizer.super_users"] = (f"User:{ADMIN_USER}",)
        values["listener_security_protocol_map"] = {CONTROLLER_LISTENER: state.security_protocol}
        values.update(extra)
        if per_node is not None:
            values.update(per_node(n.node_id))
        top = header or (
            f"kq controller config of node {n.node_id} of the local cluster in this\n"
            "# directory, written by `kq cluster up`"
        )
        path.write_text(f"# {top}; docs/operations.md lists every key.\n" + render_toml(values))


def write_broker_configs(
    state: ClusterState,
    extra: Mapping[str, object],
    per_broker: Callable[[int], Mapping[str, object]] | None = None,
) -> None:
    """Each broker's config file: its identity and listener, the controller
    quorum, its log directory, ``extra`` for every broker and
    ``per_broker(id)`` for that one (a fault test's ``node.dscp``).  On a TLS
    cluster it presents its own certificate, and the admin user and every
    broker of the cluster are its super users: the admin's commands produce
    and consume, and the brokers fetch from each other (ClusterAction),
    with no ACL (Kafka's brokers are super users as a rule)."""
    voters = {n.node_id: n.address for n in state.nodes}
    for b in state.brokers:
        path = state.path(b.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        values: dict[str, object] = {
            "node_id": b.node_id,
            "cluster_id": state.cluster_id,
            "data_dir": os.path.relpath(state.path(b.data_dir), path.parent),
            "listen": b.address,
            "log_level": "INFO",
            "voters": voters,
            "broker.log_dirs": tuple(
                os.path.relpath(state.path(d), path.parent) for d in b.log_dirs
            ),
            # Kafka's default of 3 replicas, or every broker of a smaller
            # cluster (a one-broker cluster could not create the topic).
            "offsets.replication_factor": min(3, len(state.brokers)),
            "transaction_state.replication_factor": min(3, len(state.brokers)),
        }
        if b.metrics_address:
            values["metrics_listen"] = b.metrics_address
        if state.tls:
            files = broker_tls(state, b.node_id)
            for key, file in (("ca", files.ca), ("cert", files.cert), ("key", files.key)):
                values[f"tls.{key}_file"] = os.path.relpath(file, path.parent)
            values["authorizer.super_users"] = (
                f"User:{ADMIN_USER}",
                *(
                    Identity.node(state.cluster_id, IdentityRole.BROKER, o.node_id).principal
                    for o in state.brokers
                ),
            )
        values.update(extra)
        if per_broker is not None:
            values.update(per_broker(b.node_id))
        top = (
            f"kq broker config of broker {b.node_id} of the local cluster in this\n"
            "# directory, written by `kq cluster up`"
        )
        path.write_text(f"# {top}; docs/brokers.md lists every key.\n" + render_toml(values))


def issue_node_cert(state: ClusterState, node: NodeState, hosts: Sequence[str] = ()) -> None:
    """A new certificate and key (new serial, new key) for ``node`` from the
    cluster's CA, valid for its address's host and ``hosts``; written to
    ``certs/`` by temporary file and rename, so a running node's next
    handshake reads either the old pair or the new one (rotation)."""
    host = node.address.rpartition(":")[0]
    issue(
        state.certs_dir,
        Identity.node(state.cluster_id, IdentityRole.CONTROLLER, node.node_id),
        hosts=tuple(dict.fromkeys((host, *hosts))),
    )


def broker_tls(state: ClusterState, broker_id: int) -> TlsFiles:
    """The certificate of broker ``broker_id`` for its calls to the cluster
    (a broker's lifecycle calls must present its own), issued from the
    cluster's CA on first use."""
    files = TlsFiles.in_folder(state.certs_dir, f"{IdentityRole.BROKER.value}-{broker_id}")
    if not files.cert.exists():
        # A broker of the cluster serves on its address: its certificate
        # names that host, which clients and other brokers verify.
        hosts = tuple(b.address.rpartition(":")[0] for b in state.brokers if b.node_id == broker_id)
        issue(
            state.certs_dir, Identity.node(state.cluster_id, IdentityRole.BROKER, broker_id), hosts
        )
    return files


class CallerCredentials:
    """The channel credentials of a cluster's callers, each made once: the
    admin user's (``broker=None``) or a broker's (whose lifecycle calls must
    present its own certificate); None for a plaintext cluster."""

    def __init__(self) -> None:
        self._made: dict[int | None, grpc.ChannelCredentials] = {}

    def of(self, state: ClusterState, broker: int | None = None) -> grpc.ChannelCredentials | None:
        if not state.tls:
            return None
        if broker not in self._made:
            files = state.client_tls() if broker is None else broker_tls(state, broker)
            assert files is not None
            self._made[broker] = files.channel_credentials()
        return self._made[broker]


def make_certs(state: ClusterState, hosts: Callable[[int], Sequence[str]] | None = None) -> None:
    """The cluster's CA, a certificate per controller (for its host, and
    ``hosts(id)`` if given) and the commands' (user admin), in ``certs/``,
    for a new TLS cluster."""
    create_ca(state.certs_dir, state.cluster_id)
    for n in state.nodes:
        issue_node_cert(state, n, hosts(n.node_id) if hosts is not None else ())
    for b in state.brokers:
        broker_tls(state, b.node_id)
    issue(state.certs_dir, Identity.user(state.cluster_id, ADMIN_USER), hosts=())


def check_configs(state: ClusterState) -> None:
    """Load every node's and broker's config as its process will (file and
    environment)."""
    from server.broker import broker_config

    env = _child_env()
    for n in state.nodes:
        try:
            controller_config(load_settings(state.path(n.config), env))
        except ConfigError as exc:
            raise UserError(f"node {n.node_id}: config error: {exc}", EXIT_USAGE) from None
    for b in state.brokers:
        try:
            broker_config(load_settings(state.path(b.config), env))
        except ConfigError as exc:
            raise UserError(f"broker {b.node_id}: config error: {exc}", EXIT_USAGE) from None


def format_new_nodes(state: ClusterState) -> list[int]:
    """Format every node's and broker's data directory not formatted yet
    (a broker's metadata copy as a node's, with the voters' ids) and stamp
    every broker's log directories (``kq storage format``); the ids of
    those newly formatted.  A directory of another cluster or node is
    refused."""
    from server.broker import LogDirFormatError, format_log_dirs

    formatted = []
    for b in state.brokers:
        try:
            stamped = format_log_dirs(
                [state.path(d) for d in b.log_dirs], state.cluster_id, b.node_id
            )
        except (LogDirFormatError, OSError) as exc:
            raise UserError(f"broker {b.node_id}: {exc}") from None
        if stamped:
            formatted.append(b.node_id)
    for n in state.members:
        data_dir = state.path(n.data_dir)
        if (data_dir / META_FILE).exists():
            try:
                meta = read_meta(data_dir)
            except StorageFormatError as exc:
                raise UserError(str(exc)) from None
            if meta.cluster_id != state.cluster_id or meta.node_id != n.node_id:
                raise UserError(
                    f"data directory {data_dir} belongs to cluster {meta.cluster_id} node "
                    f"{meta.node_id}, not cluster {state.cluster_id} node {n.node_id}"
                )
            continue
        try:
            format_storage(data_dir, state.cluster_id, n.node_id, [m.node_id for m in state.nodes])
        except (StorageFormatError, ValueError, OSError) as exc:
            raise UserError(str(exc)) from None
        formatted.append(n.node_id)
    return sorted(set(formatted))


def check_ports(state: ClusterState, nodes: Sequence[NodeState]) -> None:
    """Every address ``nodes`` listen on can be bound: its host exists here
    and its port is free; else a UserError naming them."""
    hosts = {n.address.rpartition(":")[0]: n for n in reversed(nodes)}
    missing = [(host, n) for host, n in hosts.items() if not host_bindable(host)]
    if missing:
        shown = ", ".join(f"{host} (node {n.node_id})" for host, n in missing)
        raise UserError(
            f"cannot listen on {shown}: no interface has that address. Each broker of a "
            f"local cluster listens on its own loopback address {BROKER_NET}<id>, which Linux "
            "routes to the loopback interface; elsewhere add them (macOS: `sudo ifconfig lo0 "
            f"alias {missing[0][0]}`) or start the cluster with --brokers 0"
        )
    wanted = [(n.address, f"node {n.node_id}") for n in nodes]
    wanted += [
        (n.metrics_address, f"node {n.node_id}'s metrics") for n in nodes if n.metrics_address
    ]
    busy = [(address, what) for address, what in wanted if not port_free(address)]
    if busy:
        shown = ", ".join(f"{address} ({what})" for address, what in busy)
        raise UserError(
            f"address(es) already in use: {shown}; stop what uses them, or start a new "
            "cluster with another --base-port (or --cluster-dir)"
        )


def check_none_exited(
    state: ClusterState,
    procs: Mapping[int, subprocess.Popen[bytes]],
    member: Callable[[int], NodeState],
    kind: str,
) -> None:
    """While ``procs`` start: UserError naming the first that exited
    (``kind`` and id, found by ``member``), its status and the end of its
    log, its pid cleared from the saved state."""
    for member_id, proc in procs.items():
        code = proc.poll()
        if code is not None:
            gone = member(member_id)
            gone.pid = None
            state.save()
            raise UserError(
                f"{kind} {member_id} exited with status {code} while starting; the end of "
                f"{state.path(gone.log_file)}:\n{log_tail(state, gone)}\n"
                f"(stop the others with `kq cluster down --cluster-dir {state.dir}`)"
            )


async def wait_for_leader(
    state: ClusterState, procs: dict[int, subprocess.Popen[bytes]], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    credentials = state.client_credentials()
    while True:
        check_none_exited(state, procs, state.node, "node")
        answers = await asyncio.gather(
            *(describe(n.address, 0.5, credentials) for n in state.nodes)
        )
        if any(a is not None and a.role == "leader" for a in answers):
            return
        if time.monotonic() >= deadline:
            raise UserError(
                f"no leader was elected within {timeout_s:g} s; the nodes are still "
                f"running: see `kq cluster status --cluster-dir {state.dir}` and the logs in "
                f"{state.dir}/node-N/controller.log"
            )
        await asyncio.sleep(0.2)

"""The ``local`` cluster backend: one ``kq controller start`` process per node.

Node ``i`` listens on its own loopback address ``127.0.0.(10+i)`` (one port
for all), with its config, data directory and log under
``<directory>/node-<i>/`` as ``kq cluster up`` lays them out (this module
reuses its helpers).  Faults:

- kill, restart: SIGKILL; a new process on the same data;
- pause, resume: SIGSTOP, SIGCONT;
- partition, block: iptables rules (:mod:`chaos.netfilter`): node ``i``
  marks its packets with DSCP value ``10+i`` (``node.dscp``), its
  connections are source-NATed to its own address, and each blocked pair
  ``(a, b)`` drops a's packets to b's address.  The rules are installed
  before the nodes start and removed by :meth:`LocalCluster.stop`;
- packet (slow, lossy links): the same marks and addresses select every
  packet from one node to another (the test's clients, unmarked, are not
  touched); an iptables ``-m statistic`` rule drops some at random and an
  ``NFQUEUE`` rule (``--queue-bypass``) sends the rest to one
  :mod:`chaos.nfqueue` delayer process of the cluster (queue number
  :attr:`LocalCluster.queue`), which the cluster starts and stops by its
  process id on :meth:`LocalCluster.heal` and :meth:`LocalCluster.stop`.
  Loopback has no qdisc to delay one node's packets only, hence the queue.

The cluster runs mutual TLS unless made with ``tls=False``: a CA and
certificates in ``<directory>/certs`` (each node's for its own address),
every node's listener SSL, clients presenting the admin user's certificate
(:meth:`LocalCluster.client_credentials`).  :meth:`LocalCluster.rotate_certs`
re-issues node certificates in place (temporary file and rename), which
the nodes load on their next handshake.

With ``brokers``, the cluster also runs that many ``kq broker start``
processes, started as ``kq cluster up --brokers`` starts them
(:mod:`server.local_brokers`: each registered and unfenced before
:meth:`LocalCluster.start` returns).  Brokers share the controllers' id
space (controllers 1..C, brokers C+1..C+B) and are nodes of the backend
like the controllers: :attr:`LocalCluster.nodes` holds both, so every
fault above may pick a broker.  Broker ``b`` listens on its own loopback
address ``127.0.1.b`` (:func:`server.local_cluster.broker_host`) and marks
its packets with DSCP ``10+b``, so a partition cuts it off by address as
it does a controller.  :meth:`LocalCluster.addresses` stays the
controllers' client addresses (the metadata quorum's clients);
:meth:`LocalCluster.broker_addresses` are the brokers'.  A restarted
broker is waited for until it is registered again and unfenced.

One local cluster with network faults per host at a time: the addresses and
DSCP values are the same for every cluster, so a second one is refused while
the first runs (:mod:`chaos.host_lock`).

:meth:`LocalCluster.collect` stops the nodes and exports each node's
committed log and changes (:func:`chaos.node_exports.export_node`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import grpc

from chaos.backend import check_packet, partition_pairs
from chaos.host_lock import HostLock
from chaos.netfilter import Netfilter
from chaos.nfqueue import Delayer, queue_number
from chaos.node_exports import export_broker, export_node, export_partition_changes
from history.runs import RunDir
from quorum.driver.client import describe
from server.local_brokers import broker_epochs, wait_for_brokers
from server.local_cluster import (
    BrokerState,
    CallerCredentials,
    ClusterState,
    NodeState,
    broker_host,
    check_configs,
    format_new_nodes,
    free_base_port,
    issue_node_cert,
    log_tail,
    make_certs,
    new_cluster_state,
    node_alive,
    port_free,
    spawn_node,
    wait_for_leader,
    write_broker_configs,
    write_configs,
)

__all__ = ["LocalCluster"]

ADDRESS_BASE = 10
"""Node i gets address 127.0.0.(ADDRESS_BASE + i) and DSCP value ADDRESS_BASE + i."""


def node_host(node: int) -> str:
    return f"127.0.0.{ADDRESS_BASE + node}"


def node_dscp(node: int) -> int:
    return ADDRESS_BASE + node


BROKER_CHAOS_SETTINGS: dict[str, object] = {
    "broker.heartbeat_interval_ms": 500,
    # Retention checked every second rather than Kafka's 5 minutes: the
    # queue workload's --retention-ms removes records within a run.
    "broker.log_retention_check_interval_ms": 1_000,
    # Consumer groups (queue runs with a group): a crashed member's keys
    # move after 6 s rather than Kafka's 45, many times a run; the offsets
    # topic has a few partitions, so that faults of a few brokers move the
    # group's coordinator.
    "group.session_timeout_ms": 6_000,
    "group.heartbeat_interval_ms": 1_000,
    "offsets.partitions": 3,
    # Transactions (queue runs with --transactional): a few transaction-log
    # partitions for the same reason.
    "transaction_state.partitions": 3,
}
"""Every chaos broker's: heartbeats often enough for the shorter session."""
CONTROLLER_BROKER_SETTINGS: dict[str, object] = {
    # The controller fences a silent broker after this (Kafka's
    # broker.session.timeout.ms, 9 s by default): shorter, so that a killed
    # or paused leader loses its partitions many times a run.
    "controller.broker_session_timeout_ms": 4_000,
    "controller.broker_heartbeat_interval_ms": 500,
}
"""Every controller's, in a cluster with brokers."""


class LocalCluster:
    """A cluster of local processes under ``directory`` (created; removed
    again by :meth:`stop` unless ``keep_data``).  ``settings`` are config
    keys (``quorum.*``, ``node.*``, ...) for every node.  Without
    ``network_faults``, no iptables rules are installed and :meth:`block`
    refuses.  Without ``tls``, the nodes listen PLAINTEXT.  ``env``:
    environment variables of every controller and broker process, over
    this process's (the bug switch of :mod:`bugs`, for the catalogue)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        nodes: int = 3,
        settings: Mapping[str, object] | None = None,
        *,
        network_faults: bool = True,
        start_timeout_s: float = 30.0,
        keep_data: bool = False,
        tls: bool = True,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not 1 <= nodes <= 50:
            raise ValueError(f"nodes must be in 1..50, got {nodes}")
        if not 0 <= brokers <= 20:
            raise ValueError(f"brokers must be in 0..20, got {brokers}")
        self._brokers = brokers
        self._env = dict(env or {})
        self._broker_settings = {**BROKER_CHAOS_SETTINGS, **(broker_settings or {})}
        self.directory = Path(directory).resolve()
        self._tls = tls
        self._credentials = CallerCredentials()
        self._count = nodes
        self._settings = {
            **(CONTROLLER_BROKER_SETTINGS if brokers else {}),
            **(settings or {}),
        }
        self._network_faults = network_faults
        self._start_timeout_s = start_timeout_s
        self._keep_data = keep_data
        # Held while the cluster runs with network faults (chaos.host_lock).
        self._host_lock = HostLock(self.directory)
        self._netfilter = Netfilter(f"KQ-CHAOS-{secrets.token_hex(3)}")
        self.queue = queue_number(self._netfilter.tag)
        """The netfilter queue of the cluster's packet delayer."""
        self._delayer: Delayer | None = None
        self._state: ClusterState | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._paused: set[int] = set()
        self._high_watermark: dict[int, int] = {}
        self.start_unix_ns = 0

    # -- the cluster ---------------------------------------------------------------

    @property
    def nodes(self) -> Sequence[int]:
        """The controllers, then the brokers: every node a fault may pick."""
        return list(range(1, self._count + self._brokers + 1))

    @property
    def controllers(self) -> Sequence[int]:
        return list(range(1, self._count + 1))

    @property
    def brokers(self) -> Sequence[int]:
        return list(range(self._count + 1, self._count + self._brokers + 1))

    def host(self, node: int) -> str:
        """The loopback address ``node`` (a controller or a broker) listens on."""
        return broker_host(node) if node > self._count else node_host(node)

    @property
    def state(self) -> ClusterState:
        if self._state is None:
            raise RuntimeError("the cluster is not started")
        return self._state

    def addresses(self) -> Mapping[int, str]:
        return {n.node_id: n.address for n in self.state.nodes}

    def broker_addresses(self) -> Mapping[int, str]:
        """Each broker's client address (empty without brokers)."""
        return {b.node_id: b.address for b in self.state.brokers}

    @property
    def security_protocol(self) -> str:
        return "SSL" if self._tls else "PLAINTEXT"

    def client_credentials(self, broker: int | None = None) -> grpc.ChannelCredentials | None:
        return self._credentials.of(self.state, broker)

    async def rotate_certs(self, nodes: Sequence[int]) -> None:
        if not self._tls:
            raise RuntimeError("this local cluster runs PLAINTEXT: it has no certificates")
        state = self.state
        for node in nodes:
            await asyncio.to_thread(issue_node_cert, state, state.node(node))

    def pid(self, node: int) -> int | None:
        proc = self._procs.get(node)
        return None if proc is None or proc.poll() is not None else proc.pid

    def _pick_port(self) -> int:
        for _ in range(50):
            port = free_base_port(1, node_host(1))
            if all(port_free(f"{self.host(i)}:{port}") for i in self.nodes):
                return port
        raise RuntimeError("no port free on every node address")

    def _write_configs(self, state: ClusterState) -> None:
        def dscp(node: int) -> dict[str, object]:
            return {"node.dscp": node_dscp(node)} if self._network_faults else {}

        write_configs(
            state,
            self._settings,
            header="node of a local chaos cluster",
            per_node=dscp,
        )
        if state.brokers:
            write_broker_configs(state, self._broker_settings, per_broker=dscp)

    async def start(self) -> None:
        if self._state is not None:
            raise RuntimeError("the cluster was started already")
        try:
            if self._network_faults:
                # Refused at once while another local cluster's rules could
                # cut this one's nodes (they share addresses and marks).
                self._host_lock.acquire()
                # Before any node connects: NAT is decided on a connection's
                # first packet.
                self._netfilter.install({node_dscp(i): self.host(i) for i in self.nodes})
            self.directory.mkdir(parents=True, exist_ok=True)
            port = self._pick_port()
            state = new_cluster_state(
                self.directory,
                port,
                {i: f"{node_host(i)}:{port}" for i in self.controllers},
                brokers={b: f"{broker_host(b)}:{port}" for b in self.brokers},
            )
            state.tls = self._tls
            self._state = state
            if self._tls:
                make_certs(state)
            self._write_configs(state)
            state.save()
            check_configs(state)
            format_new_nodes(state)
            self.start_unix_ns = time.time_ns()
            for n in state.nodes:
                self._procs[n.node_id] = spawn_node(state, n, self._env)
            await wait_for_leader(state, self._procs, self._start_timeout_s)
            if state.brokers:
                # As kq cluster up: each registered and unfenced.
                started = {b.node_id: spawn_node(state, b, self._env) for b in state.brokers}
                self._procs.update(started)
                await wait_for_brokers(state, started, self._start_timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def _terminate(self, node: int, timeout_s: float = 10.0) -> None:
        """Stop ``node``'s process: SIGTERM (a leader resigns), SIGKILL after
        ``timeout_s``; reap it."""
        proc = self._procs.get(node)
        if proc is None:
            return
        if proc.poll() is None:
            if node in self._paused:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait)
        self._paused.discard(node)

    async def _stop_nodes(self) -> None:
        # Brokers first: a broker's controlled shutdown needs the controllers.
        brokers = [n for n in self._procs if n > self._count]
        await asyncio.gather(*(self._terminate(n) for n in brokers))
        await asyncio.gather(*(self._terminate(n) for n in list(self._procs) if n not in brokers))
        if self._state is not None:
            for n in self._state.members:
                n.pid = None
            if self._state.dir.exists():
                self._state.save()

    async def stop(self) -> None:
        try:
            await self._stop_nodes()
        finally:
            try:
                if self._network_faults:
                    self._netfilter.remove()
            finally:
                self._stop_delayer()
                self._host_lock.release()
                if not self._keep_data:
                    shutil.rmtree(self.directory, ignore_errors=True)

    # -- process faults -------------------------------------------------------------

    def _node(self, node: int) -> NodeState:
        return self.state.member(node)

    async def kill(self, node: int) -> None:
        self._node(node)
        proc = self._procs.get(node)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
        self._paused.discard(node)

    async def restart(self, node: int, timeout_s: float = 15.0) -> None:
        n = self._node(node)
        if isinstance(n, BrokerState):
            await self._restart_broker(n, max(timeout_s, 30.0))
            return
        await self._terminate(node)
        proc = self._procs[node] = spawn_node(self.state, n, self._env)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"node {node} exited with status {proc.returncode} on restart:\n"
                    + log_tail(self.state, n)
                )
            answer = await describe(n.address, 0.5, self.client_credentials())
            if answer is not None:
                self._high_watermark[node] = answer.high_watermark
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"node {node} did not answer within {timeout_s:g} s")
            await asyncio.sleep(0.1)

    async def _restart_broker(self, broker: BrokerState, timeout_s: float) -> None:
        """Start a broker again over its directories; return once it is
        registered anew (a higher broker epoch) and unfenced."""
        await self._terminate(broker.node_id)
        since = await broker_epochs(self.state)
        proc = self._procs[broker.node_id] = spawn_node(self.state, broker, self._env)
        await wait_for_brokers(self.state, {broker.node_id: proc}, timeout_s, since)

    async def wait_brokers(self, timeout_s: float) -> bool:
        """Whether every broker is running, registered and unfenced within
        ``timeout_s`` (True at once without brokers)."""
        procs = {b: p for b, p in self._procs.items() if b > self._count}
        if not procs:
            return True
        try:
            await wait_for_brokers(self.state, procs, timeout_s)
        except Exception:
            return False
        return True

    async def _signal(self, node: int, sig: signal.Signals) -> int:
        self._node(node)
        proc = self._procs.get(node)
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"node {node} is not running")
        os.kill(proc.pid, sig)
        return proc.pid

    async def pause(self, node: int) -> None:
        await self._signal(node, signal.SIGSTOP)
        self._paused.add(node)

    async def resume(self, node: int) -> None:
        await self._signal(node, signal.SIGCONT)
        self._paused.discard(node)

    # -- network faults ---------------------------------------------------------------

    async def block(self, pairs: Collection[tuple[int, int]]) -> None:
        if not self._network_faults:
            raise RuntimeError("this local cluster was made without network_faults")
        for a, b in pairs:
            self._node(a)
            self._node(b)
        drops = [(node_dscp(a), self.host(b)) for a, b in pairs if a != b]
        await asyncio.to_thread(self._netfilter.block, drops)
        await asyncio.to_thread(self._stop_delayer)

    async def partition(self, groups: Sequence[Collection[int]]) -> None:
        await self.block(partition_pairs(self.nodes, groups))

    @property
    def delayer_pid(self) -> int | None:
        """The process id of the packet delayer while a packet fault delays."""
        return None if self._delayer is None else self._delayer.pid

    def _stop_delayer(self) -> None:
        """Stop the delayer, if any.  Called once its NFQUEUE rules are gone,
        so that no packet is queued to it while it exits (the kernel drops
        what is still queued when its socket closes)."""
        delayer, self._delayer = self._delayer, None
        if delayer is not None:
            delayer.stop()

    async def packet(self, drop: float, delay_ms: float, jitter_ms: float = 0.0) -> None:
        if not self._network_faults:
            raise RuntimeError("this local cluster was made without network_faults")
        check_packet(drop, delay_ms, jitter_ms)
        await asyncio.to_thread(self._netfilter.heal)
        await asyncio.to_thread(self._stop_delayer)
        queue = None
        if delay_ms > 0 or jitter_ms > 0:
            delayer = Delayer(self.queue, delay_ms, jitter_ms)
            await asyncio.to_thread(delayer.start)
            self._delayer = delayer
            queue = self.queue
        links = [(node_dscp(a), self.host(b)) for a in self.nodes for b in self.nodes if a != b]
        try:
            await asyncio.to_thread(self._netfilter.packet, links, drop, queue)
        except BaseException:
            await asyncio.to_thread(self._netfilter.heal)
            await asyncio.to_thread(self._stop_delayer)
            raise

    async def heal(self) -> None:
        if self._network_faults:
            try:
                await asyncio.to_thread(self._netfilter.heal)
            finally:
                await asyncio.to_thread(self._stop_delayer)

    # -- what the nodes left -------------------------------------------------------------

    async def high_watermarks(self) -> dict[int, int]:
        """Ask every running, unpaused node its high watermark; the last one
        each node reported."""
        state = self.state
        live = [n for n in state.nodes if node_alive(state, n) and n.node_id not in self._paused]
        credentials = self.client_credentials()
        answers = await asyncio.gather(*(describe(n.address, 1.0, credentials) for n in live))
        for n, answer in zip(live, answers, strict=True):
            if answer is not None:
                old = self._high_watermark.get(n.node_id, 0)
                self._high_watermark[n.node_id] = max(old, answer.high_watermark)
        return dict(self._high_watermark)

    async def collect(self, run_dir: Path, start_unix_ns: int | None = None) -> None:
        """Stop the nodes, copy their logs to ``run_dir/logs/node-<i>.log`` and
        write their exports.  ``start_unix_ns``: the run's start (change
        times count from it; default: when the nodes were started)."""
        state = self.state
        await self.heal()
        await self.high_watermarks()
        await self._stop_nodes()
        run = RunDir(Path(run_dir))
        start = self.start_unix_ns if start_unix_ns is None else start_unix_ns
        for b in state.brokers:
            log_path = state.path(b.log_file)
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            await asyncio.to_thread(
                export_broker, run, b.node_id, text, [state.path(d) for d in b.log_dirs], start
            )
        for n in state.nodes:
            log_path = state.path(n.log_file)
            text = log_path.read_text(errors="replace") if log_path.exists() else ""
            await asyncio.to_thread(
                export_node,
                run,
                n.node_id,
                text,
                state.path(n.data_dir),
                state.cluster_id,
                self._high_watermark.get(n.node_id, 0),
                start,
            )
            if state.brokers:
                await asyncio.to_thread(
                    export_partition_changes,
                    run,
                    n.node_id,
                    state.path(n.data_dir),
                    state.cluster_id,
                    self._high_watermark.get(n.node_id, 0),
                )

"""The ``docker`` cluster backend: one container per node.

:class:`DockerCluster` runs each node in its own container of the image
:func:`chaos.docker_image.ensure_image` makes, on an internal Docker network
of its own (``10.88.X.0/24``, node ``i`` at ``10.88.X.(10+i)``, every node
on port 9091).  A container formats its data directory (``kq storage
format``) the first time it starts, then runs ``kq controller start``; its
config, data and log are under ``/kq`` in the container.  The host reaches
the nodes through the network's bridge: clients, :meth:`DockerCluster.start`
(which waits for a leader) and :meth:`DockerCluster.collect` run on the
host.  Faults:

- kill, restart: ``docker kill -s KILL``; ``docker start`` (same address,
  same data);
- pause, resume: ``docker pause``, ``docker unpause`` (the cgroup freezer);
- partition, block: iptables rules on the host in a chain of the cluster's
  own, jumped to from ``DOCKER-USER``: each blocked pair ``(a, b)`` drops
  packets from a's address to b's.  They hold across restarts; healing
  flushes the chain, :meth:`DockerCluster.stop` deletes it;
- :meth:`DockerCluster.lose`: each packet from a to b dropped with a
  probability (``-m statistic``), the same way;
- :meth:`DockerCluster.netem`: delay and loss on each node's interface with
  ``tc qdisc ... netem``, only where the kernel has the ``sch_netem`` module
  (it refuses, naming the module, otherwise);
- :meth:`DockerCluster.packet` (slow, lossy links): loss by ``-m
  statistic`` drop rules in the cluster's chain for every pair of nodes;
  delay by netem where the kernel has it (on each running node's
  interface, so the node's answers to the host's clients are delayed too),
  else by ``NFQUEUE`` rules (``--queue-bypass``) in the same chain, for
  every pair of nodes, feeding one :mod:`chaos.nfqueue` delayer process
  on the host (queue :attr:`DockerCluster.queue`), which the cluster
  starts and stops by its process id on :meth:`DockerCluster.heal` and
  :meth:`DockerCluster.stop`.  Traffic between containers crosses the
  host's ``FORWARD`` hook (so ``DOCKER-USER``), the host's own traffic to
  them does not: the NFQUEUE rules delay node-to-node packets only.

The cluster runs mutual TLS unless made with ``tls=False``: a CA and
certificates made on the host (each node's valid for its address and its
hostname ``node-<i>``), each node's own three files (the CA's certificate,
its certificate and key; never the CA's key) in a host folder bind-mounted
read-only at ``/kq/certs``, so that :meth:`DockerCluster.rotate_certs`
replaces them by rename on the host while the node runs, is paused or is
down, and the node loads them on its next handshake.

:meth:`DockerCluster.collect` copies each node's log and data directory out
of its container (``docker cp``) and writes the same exports as the local
backend (:mod:`chaos.local`) with :func:`chaos.node_exports.export_node`:
the committed log from the stored log up to the last high watermark the
node reported, and the changes from its log lines.  The
containers share the host's time zone (``/etc/localtime``), so that the
lines' local times read right on the host.

With ``brokers``, the cluster also runs that many broker containers, as the
local backend runs its broker processes (:mod:`chaos.local`): broker ids
after the controllers' (controllers 1..C, brokers C+1..C+B), broker ``b``
at ``10.88.X.(10+b)`` on the same network, each with its own certificate
(``broker-<b>``, valid for its address), a config written as ``kq cluster
up --brokers`` writes it (:func:`server.local_cluster.write_broker_configs`;
under ``/kq``: ``metadata/``, the metadata copy, and ``logs/``, its log
directory, both formatted by ``kq storage format`` on first start), and
``kq broker start``.  They are started once a controller leads and waited
for until the controller has each registered and unfenced (a restarted one:
registered again, at a higher broker epoch).  Brokers are nodes of the
backend like the controllers (:attr:`DockerCluster.nodes` holds both), so
every fault may pick one; :meth:`DockerCluster.addresses` stays the
controllers', :meth:`DockerCluster.broker_addresses` are the brokers'.  A
power loss needs nothing of the backend: the run's environment (``env``)
starts every process in the storage's power-loss test mode, and ``docker
kill -s KILL`` then drops what it did not sync.  :meth:`DockerCluster.collect`
stops the brokers first (a controlled shutdown needs the controllers),
copies each broker's log, metadata copy and log directory out and writes
its partitions' exports (:func:`chaos.node_exports.export_broker`) and
the controllers' partition changes
(:func:`chaos.node_exports.export_partition_changes`).

Needs root, the docker command and a daemon (:func:`chaos.docker_image.ensure_daemon`
starts one when none answers) and iptables.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import grpc

from chaos.backend import check_packet, partition_pairs
from chaos.docker_image import Docker, DockerError, ensure_daemon, ensure_image
from chaos.local import BROKER_CHAOS_SETTINGS, CONTROLLER_BROKER_SETTINGS
from chaos.netfilter import IptablesChains, NetfilterError, nfqueue_target, random_match
from chaos.nfqueue import Delayer, queue_number
from chaos.node_exports import export_broker, export_node, export_partition_changes
from history.runs import RunDir
from quorum.driver.client import describe
from quorum.driver.storage_format import META_FILE
from server.local_brokers import broker_epochs, broker_registrations, broker_state
from server.local_cluster import (
    CallerCredentials,
    ClusterState,
    broker_tls,
    issue_node_cert,
    make_certs,
    new_cluster_state,
    write_broker_configs,
    write_configs,
)

__all__ = ["DockerCluster", "DockerNetfilter", "netem_available"]

PORT = 9091
ADDRESS_BASE = 10
"""Node i gets address 10.88.X.(ADDRESS_BASE + i)."""
HOME = "/kq"
LOG = f"{HOME}/controller.log"
BROKER_LOG = f"{HOME}/broker.log"
CONFIG = f"{HOME}/config.toml"
BROKER_METADATA = "metadata"
"""A broker's metadata copy, relative to ``HOME`` (as its config names it)."""
BROKER_LOG_DIR = "logs"
"""A broker's one log directory, relative to ``HOME``."""
MAX_BROKERS = 20
CERTS = "certs"
"""The node's certificates folder, relative to ``HOME`` (a bind mount)."""
LABEL = "kq.chaos"


def netem_available() -> bool:
    """Whether the kernel has (or can load) the ``sch_netem`` qdisc."""
    if Path("/sys/module/sch_netem").exists():
        return True
    modprobe = shutil.which("modprobe") or "/sbin/modprobe"
    with contextlib.suppress(OSError):
        subprocess.run([modprobe, "-q", "sch_netem"], capture_output=True, check=False)
    return Path("/sys/module/sch_netem").exists()


class DockerNetfilter(IptablesChains):
    """The drop rules of one cluster, in the filter chain ``tag`` (at most
    28 characters) jumped to from ``DOCKER-USER``."""

    def install(self) -> None:
        self.remove()
        self._installed = True
        if self._run("-S", "DOCKER-USER", check=False).returncode != 0:
            self._run("-N", "DOCKER-USER")
        self._run("-N", self.tag)
        self._run("-I", "DOCKER-USER", "1", "-j", self.tag)

    def block(self, drops: Iterable[tuple[str, str, float]]) -> None:
        """Drop exactly these: packets from ``s`` to ``d`` for each
        ``(s, d, p)``, each with probability ``p`` (1: all)."""
        if not self._installed:
            raise NetfilterError("the rules are not installed")
        self._run("-F", self.tag)
        for src, dst, p in sorted(set(drops)):
            self._run("-A", self.tag, "-s", src, "-d", dst, *random_match(p), "-j", "DROP")

    def packet(self, links: Iterable[tuple[str, str]], drop: float, queue: int | None) -> None:
        """Exactly these faults: of the packets from ``s`` to ``d`` for each
        ``(s, d)``, drop each with probability ``drop`` (0: none) and send
        the rest to netfilter queue ``queue`` (``None``: none)."""
        if not self._installed:
            raise NetfilterError("the rules are not installed")
        self._run("-F", self.tag)
        for src, dst in sorted(set(links)):
            if drop > 0:
                self._run("-A", self.tag, "-s", src, "-d", dst, *random_match(drop), "-j", "DROP")
            if queue is not None:
                self._run("-A", self.tag, "-s", src, "-d", dst, *nfqueue_target(queue))

    def heal(self) -> None:
        if self._installed:
            self._run("-F", self.tag)

    def remove(self) -> None:
        """Delete the chain and its jump (whatever of them exists)."""
        try:
            self._run("-S", check=False)
        except NetfilterError:
            self._installed = False
            return
        while self._run("-D", "DOCKER-USER", "-j", self.tag, check=False).returncode == 0:
            pass
        self._run("-F", self.tag, check=False)
        self._run("-X", self.tag, check=False)
        self._installed = False

    def leftovers(self) -> list[str]:
        listing = self._run("-S", check=False).stdout
        return [line for line in listing.splitlines() if self.tag in line]


class DockerCluster:
    """A cluster of ``nodes`` containers.  ``settings``: config keys
    (``quorum.*``, ``node.*``, ...) for every node; ``image``: the image to
    run (default: :func:`chaos.docker_image.ensure_image`'s, with ``base``);
    ``docker``: the daemon (default: :func:`chaos.docker_image.ensure_daemon`).
    Host-side files (configs, certificates, copies) live in a temporary
    folder that :meth:`stop` removes.  Without ``tls``, the nodes listen
    PLAINTEXT.  ``env``: environment variables of every node's container
    (the bug switch of :mod:`bugs`, for the catalogue; the storage's
    power-loss test mode).  ``brokers``: broker containers beside the
    ``nodes`` controllers, each with ``broker_settings`` over
    :data:`chaos.local.BROKER_CHAOS_SETTINGS` in its config (the
    controllers then fence a silent broker as the local backend's do)."""

    def __init__(
        self,
        nodes: int = 3,
        settings: Mapping[str, object] | None = None,
        *,
        image: str | None = None,
        base: str | None = None,
        docker: Docker | None = None,
        start_timeout_s: float = 60.0,
        tls: bool = True,
        env: Mapping[str, str] | None = None,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
    ) -> None:
        if not 1 <= nodes <= 50:
            raise ValueError(f"nodes must be in 1..50, got {nodes}")
        if not 0 <= brokers <= MAX_BROKERS:
            raise ValueError(f"brokers must be in 0..{MAX_BROKERS}, got {brokers}")
        self._count = nodes
        self._brokers = brokers
        self._env = dict(env or {})
        self._tls = tls
        self._credentials = CallerCredentials()
        self._settings = {
            **(CONTROLLER_BROKER_SETTINGS if brokers else {}),
            **(settings or {}),
        }
        self._broker_settings = {**BROKER_CHAOS_SETTINGS, **(broker_settings or {})}
        self._image = image
        self._base = base
        self._docker = docker
        self._start_timeout_s = start_timeout_s
        self.token = secrets.token_hex(4)
        self.name = f"kq-chaos-{self.token}"
        self.netfilter = DockerNetfilter(f"KQ-DOCKER-{self.token}")
        self.queue = queue_number(self.netfilter.tag)
        """The netfilter queue of the cluster's packet delayer."""
        self._delayer: Delayer | None = None
        self._subnet: int | None = None
        self._network: str | None = None
        self._containers: dict[int, str] = {}
        self._dir: Path | None = None
        self._state: ClusterState | None = None
        self._paused: set[int] = set()
        self._netem = False
        self._high_watermark: dict[int, int] = {}
        self._started = False
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

    def is_broker(self, node: int) -> bool:
        return node > self._count

    @property
    def docker(self) -> Docker:
        if self._docker is None:
            raise RuntimeError("the cluster is not started")
        return self._docker

    @property
    def state(self) -> ClusterState:
        """The host-side state: configs, certificates (``certs/``, with the
        CA's key; each node's mounted copy under ``node-<i>/certs``)."""
        if self._state is None:
            raise RuntimeError("the cluster is not started")
        return self._state

    @property
    def network(self) -> str | None:
        """The Docker network's name (None before start and after stop)."""
        return self._network

    def containers(self) -> Mapping[int, str]:
        """Each node's container name."""
        return dict(self._containers)

    def host(self, node: int) -> str:
        if self._subnet is None:
            raise RuntimeError("the cluster is not started")
        self._check(node)
        return f"10.88.{self._subnet}.{ADDRESS_BASE + node}"

    def addresses(self) -> Mapping[int, str]:
        """The controllers' client addresses (the metadata quorum's)."""
        return {n: f"{self.host(n)}:{PORT}" for n in self.controllers}

    def broker_addresses(self) -> Mapping[int, str]:
        """Each broker's client address (empty without brokers)."""
        return {b: f"{self.host(b)}:{PORT}" for b in self.brokers}

    @property
    def security_protocol(self) -> str:
        return "SSL" if self._tls else "PLAINTEXT"

    def client_credentials(self, broker: int | None = None) -> grpc.ChannelCredentials | None:
        if not self._tls:
            return None
        if self._state is None:
            raise RuntimeError("the cluster is not started")
        return self._credentials.of(self._state, broker)

    def _node_certs(self, node: int) -> Path:
        """The host folder mounted as ``node``'s certificates folder
        (``node-<i>/certs``, ``broker-<b>/certs``)."""
        if self._state is None:
            raise RuntimeError("the cluster is not started")
        folder = f"broker-{node}" if self.is_broker(node) else f"node-{node}"
        return self._state.dir / folder / CERTS

    def _stem(self, node: int) -> str:
        """The name of ``node``'s certificate and key in the cluster's
        certificates folder (as :mod:`server.local_cluster` names them)."""
        return f"broker-{node}" if self.is_broker(node) else f"controller-{node}"

    def _publish_certs(self, node: int) -> None:
        """Copy ``node``'s files from the cluster's certificates folder into
        its mounted folder, each by temporary file and rename (the key
        first: a node takes a new pair only once both match)."""
        state = self._state
        assert state is not None
        folder = self._node_certs(node)
        folder.mkdir(parents=True, exist_ok=True)
        stem = self._stem(node)
        for name in (f"{stem}.key", f"{stem}.crt", "ca.crt"):
            data = (state.certs_dir / name).read_bytes()
            tmp = folder / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, folder / name)

    def _tls_settings(self, node: int) -> dict[str, object]:
        stem = f"{CERTS}/{self._stem(node)}"
        return {
            "tls.ca_file": f"{CERTS}/ca.crt",
            "tls.cert_file": f"{stem}.crt",
            "tls.key_file": f"{stem}.key",
        }

    async def rotate_certs(self, nodes: Sequence[int]) -> None:
        if not self._tls:
            raise RuntimeError("this docker cluster runs PLAINTEXT: it has no certificates")
        state = self._state
        if state is None:
            raise RuntimeError("the cluster is not started")
        for node in nodes:
            self._check(node)
            if self.is_broker(node):
                await asyncio.to_thread(self._reissue_broker_cert, node)
            else:
                await asyncio.to_thread(issue_node_cert, state, state.node(node), (f"node-{node}",))
            await asyncio.to_thread(self._publish_certs, node)

    def _reissue_broker_cert(self, broker: int) -> None:
        """A new certificate and key for ``broker`` in the cluster's folder
        (the broker reads only its mounted copy, replaced by rename after)."""
        state = self.state
        for suffix in (".crt", ".key"):
            (state.certs_dir / f"{self._stem(broker)}{suffix}").unlink(missing_ok=True)
        broker_tls(state, broker)

    def _check(self, node: int) -> None:
        if node not in self.nodes:
            raise ValueError(f"node {node} is not one of {list(self.nodes)}")

    def _make_network(self) -> None:
        used = set()
        listing = self.docker.run("network", "ls", "-q").stdout.split()
        if listing:
            out = self.docker.run(
                "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *listing
            ).stdout
            used = {s for s in out.split() if s.startswith("10.88.")}
        candidates = [x for x in range(1, 255) if f"10.88.{x}.0/24" not in used]
        random.shuffle(candidates)
        for x in candidates[:20]:
            done = self.docker.run(
                "network", "create", "--internal", "--subnet", f"10.88.{x}.0/24",
                "--label", f"{LABEL}={self.token}", self.name,
                check=False,
            )  # fmt: skip
            if done.returncode == 0:
                self._network = self.name
                self._subnet = x
                return
            if "overlap" not in done.stderr:
                raise DockerError(f"docker network create {self.name}: {done.stderr.strip()}")
        raise DockerError("no free 10.88.X.0/24 subnet for the cluster's network")

    def _log(self, node: int) -> str:
        """Where ``node``'s output goes in its container."""
        return BROKER_LOG if self.is_broker(node) else LOG

    def _command(self, node: int) -> str:
        # A broker's format also stamps its log directory (kq storage format
        # reads broker.log_dirs from its config).
        broker = self.is_broker(node)
        meta = f"{BROKER_METADATA if broker else 'data'}/{META_FILE}"
        what, role = ("broker", "broker") if broker else ("node", "controller")
        return (
            f"cd {HOME} && exec >>{self._log(node)} 2>&1 && "
            f"echo \"--- $(date '+%Y-%m-%d %H:%M:%S') starting {what} {node}\" && "
            f"{{ [ -e {meta} ] || kq storage format --config {CONFIG}; }} && "
            f"exec kq {role} start --config {CONFIG}"
        )

    def _create(self, node: int, image: str, config: Path) -> None:
        name = f"{self.name}-{node}"
        zone = []
        if Path("/etc/localtime").is_file():
            zone = ["-v", "/etc/localtime:/etc/localtime:ro"]
        tz = ["-e", f"TZ={os.environ['TZ']}"] if os.environ.get("TZ") else []
        env = [f"--env={k}={v}" for k, v in sorted(self._env.items())]
        certs = ["-v", f"{self._node_certs(node)}:{HOME}/{CERTS}:ro"] if self._tls else []
        self._containers[node] = name
        self.docker.run(
            "create", "--name", name,
            "--hostname", f"broker-{node}" if self.is_broker(node) else f"node-{node}",
            "--label", f"{LABEL}={self.token}",
            "--network", self.name, "--ip", self.host(node),
            "--init", "--cap-add", "NET_ADMIN",
            *zone, *tz, *env, *certs,
            image, "/bin/sh", "-c", self._command(node),
        )  # fmt: skip
        self.docker.run("cp", str(config), f"{name}:{CONFIG}")

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("the cluster was started already")
        self._started = True
        try:
            if self._docker is None:
                self._docker = await asyncio.to_thread(ensure_daemon)
            image = self._image
            if image is None:
                image = (await asyncio.to_thread(ensure_image, self.docker, None, self._base)).tag
            await asyncio.to_thread(self.netfilter.install)
            await asyncio.to_thread(self._make_network)
            self._dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
            state = new_cluster_state(
                self._dir, PORT, self.addresses(), brokers=self.broker_addresses()
            )
            state.tls = self._tls
            self._state = state
            if self._tls:
                make_certs(state, hosts=lambda node: (f"node-{node}",))
                for node in self.nodes:
                    self._publish_certs(node)
            write_configs(
                state,
                self._settings,
                header="node of a docker chaos cluster",
                per_node=self._tls_settings if self._tls else None,
            )
            if state.brokers:
                write_broker_configs(
                    state,
                    self._broker_settings,
                    per_broker=self._tls_settings if self._tls else None,
                )
            for n in state.members:
                await asyncio.to_thread(self._create, n.node_id, image, state.path(n.config))
            self.start_unix_ns = time.time_ns()
            names = [self._containers[n] for n in self.controllers]
            await asyncio.to_thread(self.docker.run, "start", *names)
            await self._wait_for_leader()
            if self.brokers:
                # As kq cluster up: once a controller leads, each registered
                # and unfenced.
                names = [self._containers[b] for b in self.brokers]
                await asyncio.to_thread(self.docker.run, "start", *names)
                await self._wait_for_brokers(self.brokers, self._start_timeout_s)
        except BaseException:
            await self.stop()
            raise

    def _running(self) -> dict[int, bool]:
        names = list(self._containers.values())
        out = self.docker.run("inspect", "-f", "{{.Name}} {{.State.Running}}", *names).stdout
        running = dict(line.lstrip("/").split() for line in out.splitlines() if line.strip())
        return {n: running.get(name) == "true" for n, name in self._containers.items()}

    def log_tail(self, node: int, lines: int = 15) -> str:
        """The end of ``node``'s log, read from its container."""
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "node.log"
            source = f"{self._containers[node]}:{self._log(node)}"
            done = self.docker.run("cp", source, str(copy), check=False)
            if done.returncode != 0:
                return "(no log)"
            text = copy.read_text(errors="replace")
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    async def _wait_for_leader(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        addresses = self.addresses()
        credentials = self.client_credentials()
        while True:
            running = await asyncio.to_thread(self._running)
            for node in self.controllers:
                if not running[node]:
                    tail = await asyncio.to_thread(self.log_tail, node)
                    raise DockerError(f"node {node} exited while starting:\n{tail}")
            answers = await asyncio.gather(
                *(describe(a, 0.5, credentials) for a in addresses.values())
            )
            if any(a is not None and a.role == "leader" for a in answers):
                return
            if time.monotonic() >= deadline:
                raise DockerError(f"no leader was elected within {self._start_timeout_s:g} s")
            await asyncio.sleep(0.2)

    async def _wait_for_brokers(
        self, brokers: Sequence[int], timeout_s: float, since: Mapping[int, int] | None = None
    ) -> None:
        """Wait until the active controller has each of ``brokers``
        registered at a broker epoch above ``since`` (its epoch before it
        was started; -1: any) and unfenced, as
        :func:`server.local_brokers.wait_for_brokers` waits for processes;
        :class:`DockerError` with the end of its log if one exits, or
        naming those not up and their state at the timeout."""
        deadline = time.monotonic() + timeout_s
        since = since or {}
        while True:
            running = await asyncio.to_thread(self._running)
            for b in brokers:
                if not running[b]:
                    tail = await asyncio.to_thread(self.log_tail, b)
                    raise DockerError(f"broker {b} exited while starting:\n{tail}")
            wait = min(2.0, max(0.5, deadline - time.monotonic()))
            seen = await broker_registrations(self.state, wait)
            found = {b: None if seen is None else seen.get(b) for b in brokers}
            late = [
                b
                for b, r in found.items()
                if r is None
                or r.broker_epoch <= since.get(b, -1)
                or r.fenced
                or r.in_controlled_shutdown
            ]
            if not late:
                return
            if time.monotonic() >= deadline:
                why = (
                    "no controller answered"
                    if seen is None
                    else ", ".join(f"broker {b}: {broker_state(found[b])}" for b in late)
                )
                tail = await asyncio.to_thread(self.log_tail, late[0])
                raise DockerError(
                    f"broker(s) {','.join(map(str, late))} not registered and unfenced within "
                    f"{timeout_s:g} s ({why}); the end of broker {late[0]}'s log:\n{tail}"
                )
            await asyncio.sleep(0.2)

    async def wait_brokers(self, timeout_s: float) -> bool:
        """Whether every broker is running, registered and unfenced within
        ``timeout_s`` (True at once without brokers)."""
        if not self.brokers:
            return True
        try:
            await self._wait_for_brokers(self.brokers, timeout_s)
        except DockerError:
            return False
        return True

    def _remove(self) -> None:
        docker = self._docker
        if docker is not None:
            names = list(self._containers.values())
            if names:
                docker.run("rm", "-f", "-v", *names, check=False)
            self._containers.clear()
            if self._network is not None:
                docker.run("network", "rm", self._network, check=False)
                self._network = None
        try:
            self.netfilter.remove()
        finally:
            self._stop_delayer()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._paused.clear()

    async def stop(self) -> None:
        await asyncio.to_thread(self._remove)

    # -- process faults -------------------------------------------------------------

    def _name(self, node: int) -> str:
        self._check(node)
        try:
            return self._containers[node]
        except KeyError:
            raise RuntimeError("the cluster is not started") from None

    async def kill(self, node: int) -> None:
        name = self._name(node)
        if node in self._paused:
            await asyncio.to_thread(self.docker.run, "unpause", name, check=False)
            self._paused.discard(node)
        await asyncio.to_thread(self.docker.run, "kill", "-s", "KILL", name, check=False)
        await asyncio.to_thread(self.docker.run, "wait", name, check=False)

    async def _stop_container(self, node: int, timeout_s: int = 10) -> None:
        name = self._name(node)
        if node in self._paused:
            await asyncio.to_thread(self.docker.run, "unpause", name, check=False)
            self._paused.discard(node)
        await asyncio.to_thread(
            self.docker.run, "stop", "-t", str(timeout_s), name, timeout_s=timeout_s + 60
        )

    async def restart(self, node: int, timeout_s: float = 20.0) -> None:
        name = self._name(node)
        if self.is_broker(node):
            # Back once registered anew (a higher broker epoch) and unfenced.
            since = await broker_epochs(self.state)
            await self._stop_container(node)
            await asyncio.to_thread(self.docker.run, "start", name)
            await self._wait_for_brokers([node], max(timeout_s, 30.0), since)
            return
        await self._stop_container(node)
        await asyncio.to_thread(self.docker.run, "start", name)
        address = self.addresses()[node]
        deadline = time.monotonic() + timeout_s
        while True:
            answer = await describe(address, 0.5, self.client_credentials())
            if answer is not None:
                self._high_watermark[node] = answer.high_watermark
                return
            if not (await asyncio.to_thread(self._running))[node]:
                tail = await asyncio.to_thread(self.log_tail, node)
                raise DockerError(f"node {node} exited on restart:\n{tail}")
            if time.monotonic() >= deadline:
                raise DockerError(f"node {node} did not answer within {timeout_s:g} s")
            await asyncio.sleep(0.1)

    async def pause(self, node: int) -> None:
        await asyncio.to_thread(self.docker.run, "pause", self._name(node))
        self._paused.add(node)

    async def resume(self, node: int) -> None:
        await asyncio.to_thread(self.docker.run, "unpause", self._name(node))
        self._paused.discard(node)

    # -- network faults ---------------------------------------------------------------

    async def block(self, pairs: Collection[tuple[int, int]]) -> None:
        await self.lose(dict.fromkeys(pairs, 1.0))

    async def lose(self, pairs: Mapping[tuple[int, int], float]) -> None:
        """Drop each packet from ``a`` to ``b`` with probability
        ``pairs[(a, b)]`` (in (0, 1]), and no other traffic between nodes.
        Replaces any earlier network fault made with iptables."""
        drops = []
        for (a, b), p in pairs.items():
            self._check(a)
            self._check(b)
            if not 0 < p <= 1:
                raise ValueError(f"a drop probability must be in (0, 1], got {p}")
            if a != b:
                drops.append((self.host(a), self.host(b), p))
        await asyncio.to_thread(self.netfilter.block, drops)
        await asyncio.to_thread(self._stop_delayer)

    async def partition(self, groups: Sequence[Collection[int]]) -> None:
        await self.block(partition_pairs(self.nodes, groups))

    async def netem(
        self, nodes: Iterable[int], *, delay_ms: float = 0, jitter_ms: float = 0, loss: float = 0
    ) -> None:
        """Delay (and jitter) and lose (probability ``loss``) every packet
        the ``nodes`` send, with ``tc qdisc ... netem`` on their interface;
        :meth:`heal` removes it.  :class:`DockerError` naming the missing
        ``sch_netem`` kernel module where the kernel has none."""
        if not await asyncio.to_thread(netem_available):
            raise DockerError(
                "netem delay and loss need the sch_netem kernel module, which this kernel "
                "does not have (modprobe sch_netem failed); use lose() (iptables) for loss"
            )
        args = ["delay", f"{delay_ms:g}ms"] + ([f"{jitter_ms:g}ms"] if jitter_ms else [])
        if loss:
            args += ["loss", f"{loss * 100:g}%"]
        self._netem = True
        for node in nodes:
            cmd = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *args]
            await asyncio.to_thread(self.docker.run, "exec", self._name(node), *cmd)

    @property
    def delayer_pid(self) -> int | None:
        """The process id of the packet delayer while a packet fault delays."""
        return None if self._delayer is None else self._delayer.pid

    def _stop_delayer(self) -> None:
        """Stop the delayer, if any, once its NFQUEUE rules are gone."""
        delayer, self._delayer = self._delayer, None
        if delayer is not None:
            delayer.stop()

    async def packet(self, drop: float, delay_ms: float, jitter_ms: float = 0.0) -> None:
        check_packet(drop, delay_ms, jitter_ms)
        await self.heal()
        queue = None
        if delay_ms > 0 or jitter_ms > 0:
            if await asyncio.to_thread(netem_available):
                running = await asyncio.to_thread(self._running)
                up = [n for n, on in running.items() if on and n not in self._paused]
                await self.netem(up, delay_ms=delay_ms, jitter_ms=jitter_ms)
            else:
                delayer = Delayer(self.queue, delay_ms, jitter_ms)
                await asyncio.to_thread(delayer.start)
                self._delayer = delayer
                queue = self.queue
        links = [(self.host(a), self.host(b)) for a in self.nodes for b in self.nodes if a != b]
        try:
            await asyncio.to_thread(self.netfilter.packet, links, drop, queue)
        except BaseException:
            await self.heal()
            raise

    async def heal(self) -> None:
        try:
            await asyncio.to_thread(self.netfilter.heal)
        finally:
            await asyncio.to_thread(self._stop_delayer)
        if self._netem:
            running = await asyncio.to_thread(self._running)
            for node, up in running.items():
                if up and node not in self._paused:
                    await asyncio.to_thread(
                        self.docker.run, "exec", self._name(node),
                        "tc", "qdisc", "del", "dev", "eth0", "root", check=False,
                    )  # fmt: skip
            self._netem = False

    # -- what the nodes left -------------------------------------------------------------

    async def high_watermarks(self) -> dict[int, int]:
        """Ask every running, unpaused node its high watermark; the last one
        each node reported."""
        running = await asyncio.to_thread(self._running)
        live = [n for n in self.controllers if running[n] and n not in self._paused]
        addresses = self.addresses()
        credentials = self.client_credentials()
        answers = await asyncio.gather(*(describe(addresses[n], 1.0, credentials) for n in live))
        for n, answer in zip(live, answers, strict=True):
            if answer is not None:
                old = self._high_watermark.get(n, 0)
                self._high_watermark[n] = max(old, answer.high_watermark)
        return dict(self._high_watermark)

    async def collect(self, run_dir: Path, start_unix_ns: int | None = None) -> None:
        """Stop the nodes, copy their logs to ``run_dir/logs/node-<i>.log`` and
        write their exports.  ``start_unix_ns``: the run's start (change
        times count from it; default: when the nodes were started)."""
        state = self._state
        if state is None or self._dir is None:
            raise RuntimeError("the cluster is not started")
        await self.heal()
        await self.high_watermarks()
        # Brokers first: a broker's controlled shutdown needs the controllers.
        await asyncio.gather(*(self._stop_container(b) for b in self.brokers))
        await asyncio.gather(*(self._stop_container(n) for n in self.controllers))
        run = RunDir(Path(run_dir))
        start = self.start_unix_ns if start_unix_ns is None else start_unix_ns
        for b in state.brokers:
            await asyncio.to_thread(self._copy_broker, b.node_id)
            log_path = state.path(b.log_file)
            await asyncio.to_thread(
                export_broker,
                run,
                b.node_id,
                log_path.read_text(errors="replace") if log_path.exists() else "",
                [state.path(d) for d in b.log_dirs],
                start,
            )
        for n in state.nodes:
            name = self._containers[n.node_id]
            log_path = state.path(n.log_file)
            data_dir = state.path(n.data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)
            await asyncio.to_thread(self.docker.run, "cp", f"{name}:{LOG}", str(log_path))
            await asyncio.to_thread(self.docker.run, "cp", f"{name}:{HOME}/data", str(data_dir))
            await asyncio.to_thread(
                export_node,
                run,
                n.node_id,
                log_path.read_text(errors="replace"),
                data_dir,
                state.cluster_id,
                self._high_watermark.get(n.node_id, 0),
                start,
            )
            if state.brokers:
                await asyncio.to_thread(
                    export_partition_changes,
                    run,
                    n.node_id,
                    data_dir,
                    state.cluster_id,
                    self._high_watermark.get(n.node_id, 0),
                )

    def _copy_broker(self, broker: int) -> None:
        """Copy a stopped broker's log, metadata copy and log directory out
        of its container to where the cluster's state has them."""
        state = self.state
        b = state.broker(broker)
        name = self._containers[broker]
        self.docker.run("cp", f"{name}:{BROKER_LOG}", str(state.path(b.log_file)), check=False)
        (log_dir,) = b.log_dirs
        for inside, outside in ((BROKER_METADATA, b.data_dir), (BROKER_LOG_DIR, log_dir)):
            dest = state.path(outside)
            shutil.rmtree(dest, ignore_errors=True)
            self.docker.run("cp", f"{name}:{HOME}/{inside}", str(dest), check=False)

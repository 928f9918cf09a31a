"""A 3-member etcd cluster on loopback, and the benchmark's etcd Target.

:class:`EtcdCluster` (a context manager) starts Debian's ``etcd`` (package
``etcd-server``, installed with apt-get when ``etcd`` is missing and we are
root) as three members on 127.0.0.1 with free ports, data directories and
log files under a work directory, and etcd's defaults otherwise: etcd always
fsyncs its write-ahead log before acknowledging, heartbeat 100 ms, election
timeout 1000 ms, --max-txn-ops 128.  It waits until every member answers
Status over gRPC and agrees on a leader, finds the leader, SIGKILLs and
restarts members by pid, and stops them all (by pid) on exit.  ETCD_* and
ETCDCTL_* variables of our environment are not passed to etcd.

With :attr:`Security.TLS` the members serve clients and peers on https
URLs with mutual TLS (``--client-cert-auth``, ``--peer-client-cert-auth``),
with certificates made by kq's own :mod:`server.certs` (the functions
``kq certs`` uses: an ECDSA P-256 CA, a certificate per member naming
127.0.0.1 and localhost, and a user certificate for the client), so both
systems pay for the same kind of handshake and the same ciphers.

:class:`EtcdTarget` is the :class:`bench.harness.Target` for it: a grpc.aio
client over etcd's public v3 gRPC API (``bench/etcd/etcd_kv.proto``, code
generated at run time), writing to the leader; after a failed call it moves
to the next live member (a follower forwards writes to the leader).  Over
TLS its channels present the client certificate
(``grpc.ssl_channel_credentials(root, key, cert)``).

    .venv/bin/python bench/cluster_etcd.py [--tls]   # start, show the leader, stop
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import BENCH_DIR, Security, first_success, load_proto
from quorum.driver.identity import Identity, Role
from quorum.driver.tls import TlsFiles, dial
from server.certs import create_ca, issue

PROTO = BENCH_DIR / "etcd" / "etcd_kv.proto"
HOST = "127.0.0.1"
SIZE = 3
# etcd's default --max-txn-ops: the most puts one Txn may carry.
MAX_TXN_OPS = 128
# Deadline of one data-path call (etcd's own server-side limit is 7 s).
REQUEST_TIMEOUT_S = 5.0
START_TIMEOUT_S = 60.0
# The identities in the certificates of the benchmark's etcd cluster: the
# cluster id of its CA, and the client's user name.
CERTS_CLUSTER_ID = "etcd-bench"
CLIENT_USER = "bench"
# Channel options: no proxy from the environment, and quick reconnection to
# a restarted member (gRPC's default back-off grows to minutes).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_http_proxy", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def ensure_etcd() -> str:
    """The path of the ``etcd`` binary; installs Debian's ``etcd-server``
    with apt-get when it is missing and we are root."""
    found = shutil.which("etcd")
    if found:
        return found
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            "etcd is not installed; install Debian's etcd-server "
            "(apt-get update && apt-get install -y etcd-server)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("cluster_etcd: etcd missing; apt-get install etcd-server", file=sys.stderr)
    subprocess.run(["apt-get", "update"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", "etcd-server"],
        check=True,
        env=env,
        timeout=900,
    )
    found = shutil.which("etcd")
    if not found:
        raise RuntimeError("apt-get installed etcd-server but no etcd is on PATH")
    return found


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    for line in out.stdout.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def clean_env() -> dict[str, str]:
    """Our environment less ETCD_* (etcd reads them as flags) and ETCDCTL_*."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports free on ``host`` right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True, slots=True)
class EtcdCerts:
    """The files of a TLS cluster: each member's and the client's."""

    members: tuple[TlsFiles, ...]
    client: TlsFiles


def make_certs(certs_dir: Path, size: int = SIZE) -> EtcdCerts:
    """A CA and certificates for ``size`` members and a client in
    ``certs_dir``, made with :mod:`server.certs`.  Each member's certificate
    names the hosts clients and peers dial it by (etcd's clients and peers
    verify them), and serves both as a server and as a client certificate
    (a member dials its peers with it)."""
    ca = create_ca(certs_dir, CERTS_CLUSTER_ID).cert
    members = []
    for i in range(size):
        node = Identity.node(CERTS_CLUSTER_ID, Role.CONTROLLER, i + 1)
        paths = issue(certs_dir, node, hosts=(HOST, "localhost"))
        members.append(TlsFiles(ca, paths.cert, paths.key))
    client = issue(certs_dir, Identity.user(CERTS_CLUSTER_ID, CLIENT_USER), hosts=())
    return EtcdCerts(tuple(members), TlsFiles(ca, client.cert, client.key))


def member_command(
    binary: str,
    name: str,
    data_dir: Path,
    ports: tuple[int, int],
    cluster: Sequence[tuple[str, int]],
    token: str,
    tls: TlsFiles | None = None,
) -> list[str]:
    """etcd's command line for member ``name`` with client and peer
    ``ports`` in the ``cluster`` of (name, peer port); with ``tls``, https
    URLs and mutual TLS for clients and peers alike (the member's
    certificate serves both, trusting only the CA)."""
    scheme = "http" if tls is None else "https"
    client_port, peer_port = ports
    initial = ",".join(f"{n}={scheme}://{HOST}:{p}" for n, p in cluster)
    client = f"{scheme}://{HOST}:{client_port}"
    peer = f"{scheme}://{HOST}:{peer_port}"
    command = [
        binary,
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={initial}",
        f"--initial-cluster-token={token}",
        "--initial-cluster-state=new",
        "--logger=zap",
        "--log-outputs=stderr",
        "--log-level=warn",
    ]
    if tls is not None:
        command += [
            f"--cert-file={tls.cert}",
            f"--key-file={tls.key}",
            f"--trusted-ca-file={tls.ca}",
            "--client-cert-auth",
            f"--peer-cert-file={tls.cert}",
            f"--peer-key-file={tls.key}",
            f"--peer-trusted-ca-file={tls.ca}",
            "--peer-client-cert-auth",
        ]
    return command


class EtcdCluster:
    """Three etcd members on loopback; a context manager that starts them,
    waits until healthy, and stops every one of them by pid on exit."""

    def __init__(
        self,
        workdir: Path | None = None,
        size: int = SIZE,
        security: Security = Security.PLAINTEXT,
    ) -> None:
        self.size = size
        self.security = security
        self.certs: EtcdCerts | None = None
        self._own_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="kq-bench-etcd-")) if workdir is None else workdir
        )
        self.binary = ""
        self.version = ""
        self.pb2, self.pb2_grpc = load_proto(PROTO)
        ports = free_ports(2 * size)
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        self.names = [f"m{i}" for i in range(size)]
        self.endpoints = [f"{HOST}:{p}" for p in self.client_ports]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self.member_ids: list[int] = [0] * size
        self._token = f"kq-bench-{os.getpid()}-{int(time.time())}"
        self._channels: list[grpc.Channel] = []

    # -- processes

    def _command(self, i: int) -> list[str]:
        return member_command(
            self.binary,
            self.names[i],
            self.workdir / self.names[i],
            (self.client_ports[i], self.peer_ports[i]),
            list(zip(self.names, self.peer_ports, strict=True)),
            self._token,
            None if self.certs is None else self.certs.members[i],
        )

    def client_credentials(self) -> grpc.ChannelCredentials | None:
        """The client's credentials over TLS (its certificate and the CA);
        None in plaintext."""
        return None if self.certs is None else self.certs.client.channel_credentials()

    def log_path(self, i: int) -> Path:
        return self.workdir / f"{self.names[i]}.log"

    def spawn(self, i: int) -> int:
        """Start member ``i`` (again: its data directory is kept); its pid."""
        if self.alive(i):
            raise RuntimeError(f"member {self.names[i]} is already running")
        with open(self.log_path(i), "ab") as log:
            proc = subprocess.Popen(
                self._command(i),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=clean_env(),
                start_new_session=True,
            )
        self.procs[i] = proc
        return proc.pid

    def pid(self, i: int) -> int:
        proc = self.procs[i]
        if proc is None:
            raise RuntimeError(f"member {self.names[i]} was never started")
        return proc.pid

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.poll() is None

    def kill(self, i: int) -> int:
        """SIGKILL member ``i`` by pid (the last thing done); its pid."""
        pid = self.pid(i)
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart(self, i: int) -> int:
        """Reap member ``i`` if it died, and start it again; its new pid."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            raise RuntimeError(f"member {self.names[i]} is still running (pid {proc.pid})")
        if proc is not None:
            proc.wait(timeout=10)
        return self.spawn(i)

    def start(self) -> None:
        self.binary = ensure_etcd()
        self.version = etcd_version(self.binary)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.security is Security.TLS:
            self.certs = make_certs(self.workdir / "certs", self.size)
        atexit.register(self.stop)
        for i in range(self.size):
            self.spawn(i)
        credentials = self.client_credentials()
        self._channels = [
            grpc.insecure_channel(ep, options=CHANNEL_OPTIONS)
            if credentials is None
            else grpc.secure_channel(ep, credentials, options=CHANNEL_OPTIONS)
            for ep in self.endpoints
        ]
        self.wait_healthy(START_TIMEOUT_S)

    def stop(self) -> None:
        """Stop every member by pid, one after the other: SIGTERM, then
        SIGKILL after 10 s.  (SIGTERM to all at once makes each etcd try to
        hand leadership to peers that are going away too: seconds.)"""
        for proc in self.procs:
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for channel in self._channels:
            channel.close()
        self._channels = []
        atexit.unregister(self.stop)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            for i in range(self.size):
                sys.stderr.write(self.log_tail(i))
        self.stop()

    def log_tail(self, i: int, lines: int = 15) -> str:
        try:
            text = self.log_path(i).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "".join(f"[{self.names[i]}] {line}\n" for line in text)

    # -- health (blocking gRPC)

    def status(self, i: int, timeout: float = 1.0) -> Any:
        stub = self.pb2_grpc.MaintenanceStub(self._channels[i])
        return stub.Status(self.pb2.StatusRequest(), timeout=timeout)

    def wait_healthy(self, timeout: float = 30.0) -> int:
        """Wait until every member is running, answers Status with one and
        the same leader, and serves a linearizable read (so it has caught
        up with the leader's commit index); the leader's index."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for i in range(self.size):
                proc = self.procs[i]
                if proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise RuntimeError(
                        f"etcd member {self.names[i]} is not running ({code}):\n{self.log_tail(i)}"
                    )
            try:
                statuses = [self.status(i) for i in range(self.size)]
                for i, st in enumerate(statuses):
                    self.member_ids[i] = st.header.member_id
                leaders = {st.leader for st in statuses}
                if len(leaders) == 1 and (leader := leaders.pop()) in self.member_ids:
                    kv = [self.pb2_grpc.KVStub(ch) for ch in self._channels]
                    for stub in kv:
                        stub.Range(self.pb2.RangeRequest(key=b"bench/health"), timeout=2.0)
                    return self.member_ids.index(leader)
                last = f"leaders seen: {sorted(st.leader for st in statuses)}"
            except grpc.RpcError as exc:
                last = f"{exc.code()}: {exc.details()}"
            time.sleep(0.05)
        raise TimeoutError(f"etcd cluster not healthy after {timeout:.0f} s ({last})")

    def leader_index(self) -> int:
        return self.wait_healthy(10.0)


class EtcdTarget:
    """The benchmark's Target for an :class:`EtcdCluster` (grpc.aio)."""

    name = "etcd"

    def __init__(self, cluster: EtcdCluster) -> None:
        self.cluster = cluster
        self.pb2 = cluster.pb2
        self.pb2_grpc = cluster.pb2_grpc
        self._credentials = cluster.client_credentials()
        self._channels: list[grpc.aio.Channel] = []
        self._kv: list[Any] = []
        self._maint: list[Any] = []
        for i in range(cluster.size):
            self._connect(i)
        self._current = 0
        self._killed: list[int] = []

    def _connect(self, i: int) -> None:
        channel = dial(self.cluster.endpoints[i], self._credentials, CHANNEL_OPTIONS)
        stubs = (self.pb2_grpc.KVStub(channel), self.pb2_grpc.MaintenanceStub(channel))
        if i < len(self._channels):
            self._channels[i] = channel
            self._kv[i], self._maint[i] = stubs
        else:
            self._channels.append(channel)
            self._kv.append(stubs[0])
            self._maint.append(stubs[1])

    def _failed(self, i: int) -> None:
        """A call to member ``i`` failed: use the next live member, unless
        another call already moved on."""
        if self._current != i:
            return
        for step in range(1, self.cluster.size + 1):
            j = (i + step) % self.cluster.size
            if j not in self._killed:
                self._current = j
                return

    async def put(self, key: bytes, value: bytes) -> None:
        i = self._current
        try:
            await self._kv[i].Put(
                self.pb2.PutRequest(key=key, value=value), timeout=REQUEST_TIMEOUT_S
            )
        except grpc.aio.AioRpcError:
            self._failed(i)
            raise

    async def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """One Txn per MAX_TXN_OPS puts, all sent at once."""
        i = self._current
        pb2 = self.pb2
        txns = [
            pb2.TxnRequest(
                success=[
                    pb2.RequestOp(request_put=pb2.PutRequest(key=k, value=v))
                    for k, v in items[start : start + MAX_TXN_OPS]
                ]
            )
            for start in range(0, len(items), MAX_TXN_OPS)
        ]
        try:
            await asyncio.gather(*(self._kv[i].Txn(txn, timeout=REQUEST_TIMEOUT_S) for txn in txns))
        except grpc.aio.AioRpcError:
            self._failed(i)
            raise

    async def _leader_index(self, timeout: float = 10.0) -> int:
        """The member that answers Status naming itself leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self.cluster.size):
                if i in self._killed:
                    continue
                try:
                    st = await self._maint[i].Status(self.pb2.StatusRequest(), timeout=1.0)
                except grpc.aio.AioRpcError:
                    continue
                if st.leader != 0 and st.leader == st.header.member_id:
                    return i
            await asyncio.sleep(0.02)
        raise TimeoutError("no etcd member says it is the leader")

    async def refresh_leader(self) -> int:
        self._current = await self._leader_index()
        return self._current

    async def leader_pid(self) -> int:
        return self.cluster.pid(await self._leader_index())

    async def kill_leader(self) -> int:
        i = await self._leader_index()
        self._killed.append(i)
        return self.cluster.kill(i)

    async def restart_killed(self) -> None:
        for i in self._killed:
            self.cluster.restart(i)
            old = self._channels[i]
            self._connect(i)
            await old.close()
        self._killed.clear()
        await asyncio.to_thread(self.cluster.wait_healthy, START_TIMEOUT_S)
        await self.refresh_leader()

    # -- partition trials (bench/partition.py) ------------------------------

    async def leader_member(self) -> tuple[int, int, list[int]]:
        i = await self._leader_index()
        return i, self.cluster.pid(i), [self.cluster.client_ports[i], self.cluster.peer_ports[i]]

    async def put_to_others(self, member: int, key: bytes, value: bytes, timeout: float) -> None:
        """A Put to each other member at once (a follower forwards it to the
        leader it knows); returns when one commits it."""
        request = self.pb2.PutRequest(key=key, value=value)
        others = [i for i in range(self.cluster.size) if i != member]
        await first_success(
            [self._kv[i].Put(request, timeout=timeout) for i in others],
            "no other member committed the write",
        )

    async def wait_healed(self) -> None:
        await asyncio.to_thread(self.cluster.wait_healthy, START_TIMEOUT_S)
        await self.refresh_leader()

    async def describe(self) -> dict[str, Any]:
        st = await self._maint[self._current].Status(self.pb2.StatusRequest(), timeout=2.0)
        return {
            "name": "etcd",
            "version": self.cluster.version,
            "cluster_version": st.version,
            "members": self.cluster.size,
            "security": self.cluster.security.value,
            "fsync": "always (WAL fsync before ack)",
            "election_timeout_ms": 1000,
            "heartbeat_ms": 100,
            "max_txn_ops": MAX_TXN_OPS,
        }

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


@asynccontextmanager
async def open_target(
    workdir: Path, security: Security = Security.PLAINTEXT
) -> AsyncIterator[EtcdTarget]:
    """The harness's entry point: a healthy 3-member cluster under
    ``workdir`` (plaintext or mutual TLS) and a Target on it; everything
    stopped on exit."""
    with EtcdCluster(workdir, security=security) as cluster:
        target = EtcdTarget(cluster)
        try:
            await target.refresh_leader()
            yield target
        finally:
            await target.close()


def main() -> None:
    security = Security.TLS if "--tls" in sys.argv[1:] else Security.PLAINTEXT
    with EtcdCluster(security=security) as cluster:
        leader = cluster.leader_index()
        print(f"etcd {cluster.version} ({security.value}): members {cluster.endpoints}")
        print(f"leader: {cluster.names[leader]} (pid {cluster.pid(leader)})")


if __name__ == "__main__":
    main()

"""Helpers for tests that run real quorum nodes in this process."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from cryptography import x509

from quorum.config import QuorumConfig
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.node import NodeOptions
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.storage_format import format_storage
from quorum.driver.tls import TlsFiles
from quorum.types import Role
from server.certs import create_ca, issue
from server.controller import kv_server

CLUSTER_ID = "kq-test-cluster-000000"
FAST = NodeOptions(
    quorum=QuorumConfig(
        election_timeout_ms=150, fetch_timeout_ms=400, fetch_max_wait_ms=100, request_timeout_ms=150
    ),
    snapshot_every_offsets=0,
)


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    def __init__(
        self, root: Path, voters: int = 3, options: NodeOptions = FAST, tls: bool = False
    ) -> None:
        self.root = root
        self.options = options
        ports = free_ports(voters)
        self.voters = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        self.servers: dict[int, NodeServer] = {}
        for n in self.voters:
            format_storage(root / f"node-{n}", CLUSTER_ID, n, self.voters.keys())
        # With tls: the cluster's CA and each controller's certificate in
        # root/certs (kq certs' layout); clients make their own with issue().
        self.certs: Path | None = None
        if tls:
            self.certs = root / "certs"
            create_ca(self.certs, CLUSTER_ID)
            for n in self.voters:
                issue(self.certs, Identity.node(CLUSTER_ID, IdentityRole.CONTROLLER, n))

    def tls_files(self, identity: Identity) -> TlsFiles:
        """A certificate for ``identity`` from the cluster's CA."""
        assert self.certs is not None, "not a TLS cluster"
        paths = issue(self.certs, identity, hosts=("127.0.0.1",))
        return TlsFiles(self.certs / "ca.crt", paths.cert, paths.key)

    def node_config(self, node: int) -> NodeConfig:
        tls = None
        if self.certs is not None:
            tls = TlsFiles.in_folder(self.certs, f"controller-{node}")
        return NodeConfig(
            node, CLUSTER_ID, self.voters, self.root / f"node-{node}", options=self.options, tls=tls
        )

    def make_server(self, config: NodeConfig) -> NodeServer:
        """A node's server: the key-value store alone (subclasses add the
        metadata controller)."""
        return kv_server(config)

    async def start(self, node: int) -> NodeServer:
        server = self.make_server(self.node_config(node))
        await server.start()
        self.servers[node] = server
        return server

    async def stop(self, node: int, resign: bool = True) -> None:
        server = self.servers.pop(node)
        await server.stop(resign=resign)

    def leader(self) -> NodeServer | None:
        leaders = [s for s in self.servers.values() if s.node.core.role is Role.LEADER]
        return max(leaders, key=lambda s: s.node.core.epoch) if leaders else None

    async def wait_for(self, cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError("condition not met in time")
            await asyncio.sleep(0.01)

    async def wait_leader(self, timeout_s: float = 10.0) -> NodeServer:
        await self.wait_for(lambda: self.leader() is not None, timeout_s)
        leader = self.leader()
        assert leader is not None
        return leader


def served_serial(address: str, files: TlsFiles) -> int:
    """The serial number of the certificate the node at ``address``
    presents to a new connection: a real TLS handshake (with ALPN h2, as
    gRPC's), presenting ``files``' certificate."""
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    # A node of a cluster that has just elected a leader may still be
    # opening its listener: a refused connection is retried for a while.
    deadline = time.monotonic() + 10
    while True:
        try:
            raw = socket.create_connection((host, int(port)), timeout=5)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with (
        raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


@asynccontextmanager
async def running(
    root: Path, voters: int = 3, options: NodeOptions = FAST, tls: bool = False
) -> AsyncIterator[Cluster]:
    """A started cluster, stopped at the end (its subclasses' too: pass
    ``cluster``)."""
    async with started(Cluster(root, voters, options, tls)) as cluster:
        yield cluster


C = TypeVar("C", bound=Cluster)


@asynccontextmanager
async def started(cluster: C) -> AsyncIterator[C]:
    """Start every voter of ``cluster``; stop whatever runs at the end."""
    try:
        for n in cluster.voters:
            await cluster.start(n)
        yield cluster
    finally:
        for n in list(cluster.servers):
            await cluster.stop(n, resign=False)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))

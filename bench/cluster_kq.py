"""The benchmark's kq target: a 3-node kq quorum on loopback.

Started and stopped with the ``kq cluster`` commands (each node its own
``kq controller start`` process with RocksDB storage and fsync; no brokers,
so that the quorum is three processes as etcd's is), driven with
kq's Python client (grpc.aio), the same client style as the etcd target.

With :attr:`Security.TLS` the cluster is made with ``kq cluster up --tls``:
a CA and a certificate per node and for the user ``admin`` made by
:mod:`server.certs` (what ``kq certs`` uses), a ``[tls]`` section in every
node's config (mutual TLS between nodes and with clients), and the client
presents the user certificate through the same ``KvClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.harness import Security, first_success
from kqproto import kv_pb2, kv_pb2_grpc, quorum_pb2
from kvstore.client import MAX_REQUESTS_IN_FLIGHT, KvClient
from server.local_cluster import free_base_port, load_state, run_kq

REQUEST_TIMEOUT_S = 5.0
HEALTHY_TIMEOUT_S = 30.0
NODES = 3


# The flags of ``kq cluster up`` for each mode (TLS is its default).
MODE_FLAGS: dict[Security, tuple[str, ...]] = {
    Security.PLAINTEXT: ("--insecure",),
    Security.TLS: (),
}


class KqTarget:
    name = "kq"

    def __init__(
        self, directory: Path, max_requests_in_flight: int = MAX_REQUESTS_IN_FLIGHT
    ) -> None:
        self.dir = directory
        state = load_state(directory)
        assert state is not None
        self.security = Security.TLS if state.tls else Security.PLAINTEXT
        self.addresses = {n.node_id: n.address for n in state.nodes}
        self.client = KvClient(
            list(self.addresses.values()),
            timeout_s=REQUEST_TIMEOUT_S,
            credentials=state.client_credentials(),
            max_requests_in_flight=max_requests_in_flight,
        )
        self._killed: list[int] = []

    def _pids(self) -> dict[int, int]:
        state = load_state(self.dir)
        assert state is not None
        return {n.node_id: n.pid for n in state.nodes if n.pid is not None}

    async def put(self, key: bytes, value: bytes) -> None:
        await self.client.put(key.decode(), value)

    async def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        await self.client.put_many([(k.decode(), v) for k, v in items])

    async def _describe(self, node: int) -> Any:
        stub = self.client.quorum_stub(self.addresses[node])
        return await stub.DescribeQuorum(quorum_pb2.DescribeQuorumRequest(), timeout=1.0)

    async def leader_id(self) -> int:
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in self.addresses:
                if node in self._killed:
                    continue
                with contextlib.suppress(Exception):
                    d = await self._describe(node)
                    if d.role == "leader":
                        return node
            await asyncio.sleep(0.02)
        raise RuntimeError("no kq leader")

    async def leader_pid(self) -> int:
        return self._pids()[await self.leader_id()]

    async def kill_leader(self) -> int:
        node = await self.leader_id()
        pid = self._pids()[node]
        self._killed.append(node)
        os.kill(pid, signal.SIGKILL)
        return pid

    async def restart_killed(self) -> None:
        for node in self._killed:
            result = run_kq("cluster", "start", str(node), "--dir", str(self.dir))
            if result.returncode != 0:
                raise RuntimeError(f"kq cluster start {node} failed: {result.stderr.strip()}")
        self._killed.clear()
        await self.wait_healthy()

    async def wait_healthy(self) -> None:
        """All nodes up, one leader, every voter caught up with it: its log
        (lag 0) and its state machine (applied up to the leader's high
        watermark), as a restarted etcd member has replayed its WAL."""
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                leader = await self.leader_id()
                d = await self._describe(leader)
                caught_up = len(d.replicas) == NODES and all(r.lag == 0 for r in d.replicas)
                if caught_up:
                    applied = [(await self._describe(n)).applied_offset for n in self.addresses]
                    if min(applied) >= d.high_watermark:
                        return
            except Exception:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError("the kq cluster did not become healthy")

    # -- partition trials (bench/partition.py) ------------------------------

    async def leader_member(self) -> tuple[int, int, list[int]]:
        node = await self.leader_id()
        port = int(self.addresses[node].rsplit(":", 1)[1])
        return node, self._pids()[node], [port]

    async def put_to_others(self, member: int, key: bytes, value: bytes, timeout: float) -> None:
        """A Put to each other node at once (no redirect: a node that does
        not lead answers NOT_LEADER); returns when one commits it."""
        request = kv_pb2.PutRequest(key=key.decode(), value=value)

        async def one(address: str) -> None:
            stub = kv_pb2_grpc.KvServiceStub(self.client._channel(address))
            response = await stub.Put(request, timeout=timeout)
            if response.error != kv_pb2.OK:
                raise RuntimeError(f"{address}: {kv_pb2.KvError.Name(response.error)}")

        await first_success(
            [one(a) for n, a in self.addresses.items() if n != member],
            "no other node committed the write",
        )

    async def wait_healed(self) -> None:
        await self.wait_healthy()

    async def describe(self) -> dict[str, object]:
        from kq import __version__

        return {
            "version": __version__,
            "nodes": NODES,
            "security": self.security.value,
            "storage": "RocksDB, fsync per Ready",
        }

    async def close(self) -> None:
        await self.client.close()


@contextlib.asynccontextmanager
async def open_target(
    workdir: Path,
    security: Security = Security.PLAINTEXT,
    *,
    max_requests_in_flight: int = MAX_REQUESTS_IN_FLIGHT,
) -> AsyncIterator[KqTarget]:
    """A fresh kq cluster in ``workdir`` and a target on it; its key-value
    client keeps ``max_requests_in_flight`` write requests in flight."""
    directory = workdir / "kq"
    up = run_kq(
        "cluster", "up", "--dir", str(directory), "--nodes", str(NODES), "--brokers", "0",
        "--base-port", str(free_base_port(NODES)), *MODE_FLAGS[security], "--json",
    )  # fmt: skip
    try:
        if up.returncode != 0:
            raise RuntimeError(f"kq cluster up failed: {up.stderr.strip() or up.stdout.strip()}")
        target = KqTarget(directory, max_requests_in_flight)
        if target.security is not security:
            # What is measured must be the mode the figures are labelled with.
            await target.close()
            raise RuntimeError(
                f"kq cluster up made a {target.security.value} cluster, not {security.value}"
            )
        try:
            await target.wait_healthy()
            yield target
        finally:
            await target.close()
    finally:
        run_kq("cluster", "down", "--dir", str(directory))
        state = load_state(directory)
        for node in state.nodes if state else []:
            if node.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(node.pid, signal.SIGKILL)

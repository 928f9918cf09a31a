"""A real controller quorum in this process, and test brokers that talk to
it over gRPC only.

:class:`MetadataCluster` runs controller nodes (``metadata.server.
controller_server``) on 127.0.0.1 with free ports and short timeouts.
:class:`TestBroker` plays a broker's half of the lifecycle
(BrokerLifecycleService): it registers with a random incarnation id and
heartbeats in an asyncio task, reporting as its metadata offset the one a
controller's stale DescribeCluster answers (a real broker would replicate
the log as an observer; the offset is all the controller looks at).  It can
stop heartbeating (a simulated kill) or shut down in a controlled way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar

import grpc

from kqproto import metadata_pb2, metadata_pb2_grpc, quorum_pb2
from metadata.active import ControllerSettings, QuorumController
from quorum.driver.client import ChannelPool
from quorum.driver.node import NodeOptions
from quorum.driver.server import NodeConfig, NodeServer
from server.controller import controller_server, plugin_of
from tests.driver.cluster_util import CLUSTER_ID, FAST, Cluster

__all__ = [
    "CLUSTER_ID",
    "SETTINGS",
    "MetadataCluster",
    "TestBroker",
    "new_uuid",
    "running_metadata",
]

SETTINGS = ControllerSettings(
    broker_session_timeout_ms=3_000,
    broker_heartbeat_interval_ms=500,
    tick_interval_ms=50,
    metadata_max_idle_interval_ms=500,
)
METADATA_VERSION = metadata_pb2.SupportedFeature(
    name="metadata.version", min_version=1, max_version=1
)

NONE = metadata_pb2.NONE
NOT_CONTROLLER = metadata_pb2.NOT_CONTROLLER


def new_uuid() -> str:
    """A random Kafka Uuid in its text form."""
    while True:
        raw = os.urandom(16)
        if any(raw):
            return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class _Response(Protocol):
    @property
    def error(self) -> int: ...

    @property
    def leader(self) -> quorum_pb2.LeaderHint: ...


R = TypeVar("R", bound=_Response)


class MetadataCluster(Cluster):
    """Controller nodes 1..n; gRPC stubs to any of them."""

    def __init__(
        self,
        root: Path,
        voters: int = 3,
        options: NodeOptions = FAST,
        settings: ControllerSettings = SETTINGS,
    ) -> None:
        super().__init__(root, voters, options)
        self.settings = settings
        self._channels = ChannelPool()

    async def start(self, node: int) -> NodeServer:
        server = controller_server(
            NodeConfig(
                node, CLUSTER_ID, self.voters, self.root / f"node-{node}", options=self.options
            ),
            self.settings,
        )
        await server.start()
        self.servers[node] = server
        return server

    async def close(self) -> None:
        await self._channels.close()

    # -- controllers ------------------------------------------------------------

    def controller(self, node: int) -> QuorumController:
        return plugin_of(self.servers[node]).controller

    def active_node(self) -> int | None:
        for node in self.servers:
            if self.controller(node).is_active:
                return node
        return None

    async def wait_active(self, timeout_s: float = 15.0) -> int:
        await self.wait_for(lambda: self.active_node() is not None, timeout_s)
        node = self.active_node()
        assert node is not None
        return node

    def standbys(self) -> list[int]:
        return [n for n in self.servers if not self.controller(n).is_active]

    # -- gRPC ---------------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def admin(self, target: int | str) -> metadata_pb2_grpc.AdminServiceAsyncStub:
        address = self.voters[target] if isinstance(target, int) else target
        return metadata_pb2_grpc.AdminServiceStub(self.channel(address))

    def lifecycle(self, target: int | str) -> metadata_pb2_grpc.BrokerLifecycleServiceAsyncStub:
        address = self.voters[target] if isinstance(target, int) else target
        return metadata_pb2_grpc.BrokerLifecycleServiceStub(self.channel(address))

    async def on_active(self, call: Callable[[int], Awaitable[R]], timeout_s: float = 10.0) -> R:
        """``call(node)`` on the active controller; again elsewhere while the
        answer is NOT_CONTROLLER (a definite refusal: nothing was done)."""
        deadline = time.monotonic() + timeout_s
        while True:
            node = await self.wait_active(max(0.1, deadline - time.monotonic()))
            response = await call(node)
            if response.error != NOT_CONTROLLER or time.monotonic() > deadline:
                return response
            await asyncio.sleep(0.05)

    async def eventually(
        self, check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, what: str = ""
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not await check():
            if time.monotonic() > deadline:
                raise AssertionError(f"not met within {timeout_s} s: {what}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_metadata(
    root: Path, voters: int = 3, settings: ControllerSettings = SETTINGS
) -> AsyncIterator[MetadataCluster]:
    cluster = MetadataCluster(root, voters, settings=settings)
    try:
        for n in cluster.voters:
            await cluster.start(n)
        yield cluster
    finally:
        await cluster.close()
        for n in list(cluster.servers):
            await cluster.stop(n, resign=False)


class TestBroker:
    """A broker's lifecycle over gRPC: register, heartbeat, stop, shut down."""

    __test__ = False  # not a test class

    def __init__(
        self,
        cluster: MetadataCluster,
        broker_id: int,
        rack: str | None = None,
        incarnation_id: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.rack = rack
        self.incarnation_id = incarnation_id or new_uuid()
        self.epoch = -1
        self.interval_s = cluster.settings.broker_heartbeat_interval_ms / 1000
        # The last answer of the active controller, and when it came.
        self.last: metadata_pb2.BrokerHeartbeatResponse | None = None
        self.last_ok = 0.0
        self.heartbeats = 0
        # The error of the last heartbeat answered (NONE once all is well).
        self.last_error = NONE
        self.want_shutdown = False
        self._target: str | None = None
        self._next = 0
        self._task: asyncio.Task[None] | None = None

    def endpoint(self) -> metadata_pb2.Endpoint:
        return metadata_pb2.Endpoint(
            name="PLAINTEXT",
            host="127.0.0.1",
            port=19_000 + self.broker_id,
            security_protocol="PLAINTEXT",
        )

    def registration(self) -> metadata_pb2.RegisterBrokerRequest:
        request = metadata_pb2.RegisterBrokerRequest(
            broker_id=self.broker_id,
            cluster_id=CLUSTER_ID,
            incarnation_id=self.incarnation_id,
            endpoints=[self.endpoint()],
            features=[METADATA_VERSION],
            previous_broker_epoch=-1,
        )
        if self.rack is not None:
            request.rack = self.rack
        return request

    async def register(self, timeout_s: float = 10.0) -> metadata_pb2.RegisterBrokerResponse:
        """Register with the active controller; the answer (epoch kept if NONE)."""
        request = self.registration()
        response = await self.cluster.on_active(
            lambda n: self.cluster.lifecycle(n).RegisterBroker(request, timeout=5), timeout_s
        )
        if response.error == NONE:
            self.epoch = response.broker_epoch
            self._target = self.cluster.voters[self.cluster.active_node() or 1]
        return response

    async def start(self, timeout_s: float = 10.0) -> None:
        """Register, then heartbeat until stopped; waits until unfenced."""
        response = await self.register(timeout_s)
        assert response.error == NONE, response
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self.wait(lambda r: not r.is_fenced, timeout_s, "unfenced")

    async def wait(
        self,
        cond: Callable[[metadata_pb2.BrokerHeartbeatResponse], bool],
        timeout_s: float = 10.0,
        what: str = "",
    ) -> metadata_pb2.BrokerHeartbeatResponse:
        """The first heartbeat answer (from now on) that meets ``cond``."""
        seen = self.heartbeats
        deadline = time.monotonic() + timeout_s
        while True:
            last = self.last
            if self.heartbeats > seen and last is not None and cond(last):
                return last
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"broker {self.broker_id}: no heartbeat answer {what} within {timeout_s} s "
                    f"(last: {last})"
                )
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Stop heartbeating at once, as if the broker process were killed."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def controlled_shutdown(
        self, timeout_s: float = 10.0
    ) -> list[metadata_pb2.BrokerHeartbeatResponse]:
        """Heartbeat with want_shutdown until should_shut_down, then stop;
        every answer on the way."""
        answers: list[metadata_pb2.BrokerHeartbeatResponse] = []
        self.want_shutdown = True
        deadline = time.monotonic() + timeout_s
        while True:
            last = await self.wait(
                lambda r: True, max(0.1, deadline - time.monotonic()), "during shutdown"
            )
            answers.append(last)
            if last.should_shut_down:
                await self.stop()
                return answers

    # -- heartbeats ----------------------------------------------------------------

    def _guess(self) -> str:
        addresses = [self.cluster.voters[n] for n in sorted(self.cluster.servers)]
        self._next += 1
        return addresses[self._next % len(addresses)]

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self.beat()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def beat(self) -> metadata_pb2.BrokerHeartbeatResponse | None:
        """One heartbeat to the active controller (following NOT_CONTROLLER
        a few times); its answer, or None if no controller answered."""
        for _ in range(5):
            address = self._target or self._guess()
            try:
                described = await self.cluster.admin(address).DescribeCluster(
                    metadata_pb2.DescribeClusterRequest(linearizable=False), timeout=1
                )
                response = await self.cluster.lifecycle(address).BrokerHeartbeat(
                    metadata_pb2.BrokerHeartbeatRequest(
                        broker_id=self.broker_id,
                        broker_epoch=self.epoch,
                        current_metadata_offset=described.metadata_offset,
                        want_shutdown=self.want_shutdown,
                    ),
                    timeout=2,
                )
            except grpc.aio.AioRpcError:
                self._target = None
                await asyncio.sleep(0.05)
                continue
            if response.error == NOT_CONTROLLER:
                hint = response.leader.leader_address
                self._target = hint if hint and hint != address else None
                await asyncio.sleep(0.05)
                continue
            self._target = address
            self.last_error = response.error
            if response.error == NONE:
                self.last = response
                self.last_ok = time.monotonic()
                self.heartbeats += 1
            return response
        return None

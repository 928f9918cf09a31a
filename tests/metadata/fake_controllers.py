"""In-process fake controllers for the metadata client's tests.

A :class:`FakeController` serves AdminService and BrokerLifecycleService on
127.0.0.1 (a free port).  It is either the active controller (it answers,
naming itself as the active controller) or a standby that names another
address: it answers writes and linearizable reads NOT_CONTROLLER with that
hint, and answers stale reads itself, as the contract says.  Each RPC's
requests are recorded; ``behaviour[rpc]`` replaces the answer of one RPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from kqproto import metadata_pb2, metadata_pb2_grpc, quorum_pb2

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]

SERVICES: dict[str, tuple[type, Callable[[Any, grpc.aio.Server], None]]] = {
    "AdminService": (
        metadata_pb2_grpc.AdminServiceServicer,
        metadata_pb2_grpc.add_AdminServiceServicer_to_server,
    ),
    "BrokerLifecycleService": (
        metadata_pb2_grpc.BrokerLifecycleServiceServicer,
        metadata_pb2_grpc.add_BrokerLifecycleServiceServicer_to_server,
    ),
}


class FakeController:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.address = ""
        # None: the active controller; else (id, address) of the one named.
        self.points_to: tuple[int, str] | None = None
        # What a stale read names as the active controller; default as above.
        self.probe_hint: tuple[int, str] | None = None
        self.requests: list[tuple[str, Any]] = []
        self.behaviour: dict[str, Handler] = {}
        self.server: grpc.aio.Server | None = None

    def calls(self, rpc: str) -> int:
        return sum(1 for name, _ in self.requests if name == rpc)

    def hint(self, target: tuple[int, str] | None = None) -> quorum_pb2.LeaderHint:
        if target is None:
            target = self.points_to or (self.node_id, self.address)
        return quorum_pb2.LeaderHint(leader_id=target[0], leader_address=target[1], epoch=5)

    async def handle(self, rpc: str, request: Any, context: Any, out: Any) -> Any:
        self.requests.append((rpc, request))
        if rpc in self.behaviour:
            return await self.behaviour[rpc](request, context)
        stale_read = "linearizable" in request.DESCRIPTOR.fields_by_name and not (
            request.linearizable
        )
        if stale_read:
            hint = self.hint(self.probe_hint) if self.probe_hint else self.hint()
            return self.answer(rpc, request, out, hint)
        if self.points_to is not None:
            return out(
                error=metadata_pb2.NOT_CONTROLLER,
                message=f"node {self.node_id} is not the active controller",
                leader=self.hint(),
            )
        return self.answer(rpc, request, out, self.hint())

    def answer(self, rpc: str, request: Any, out: Any, hint: quorum_pb2.LeaderHint) -> Any:
        response = out(error=metadata_pb2.NONE, leader=hint)
        if rpc == "CreateTopics":
            for t in request.topics:
                response.topics.add(
                    name=t.name,
                    topic_id=f"id-{t.name}",
                    num_partitions=max(t.num_partitions, 1),
                    replication_factor=max(t.replication_factor, 1),
                )
        elif rpc == "DescribeTopics":
            for name in request.names or ["t"]:
                response.topics.add(name=name, topic_id=f"id-{name}")
            response.metadata_offset = 42
        elif rpc == "RegisterBroker":
            response.broker_epoch = 100 + request.broker_id
        elif rpc == "DescribeFeatures":
            response.features.add(
                name="metadata.version",
                supported_min_version=1,
                supported_max_version=3,
                finalized_level=2,
            )
        return response

    async def start(self) -> None:
        server = grpc.aio.server()
        for service_name, (base, add) in SERVICES.items():
            add(_servicer(self, service_name, base), server)
        port = server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None


def _servicer(fake: FakeController, service_name: str, base: type) -> Any:
    methods: dict[str, Any] = {}
    for method in metadata_pb2.DESCRIPTOR.services_by_name[service_name].methods:
        out = getattr(metadata_pb2, method.output_type.name)

        async def handler(
            self: Any, request: Any, context: Any, _rpc: str = method.name, _out: Any = out
        ) -> Any:
            return await fake.handle(_rpc, request, context, _out)

        methods[method.name] = handler
    return type(f"Fake{service_name}", (base,), methods)()


@asynccontextmanager
async def two_controllers() -> AsyncIterator[tuple[FakeController, FakeController]]:
    """(standby, active): the standby names the active one."""
    standby, active = FakeController(1), FakeController(2)
    await standby.start()
    await active.start()
    standby.points_to = (active.node_id, active.address)
    try:
        yield standby, active
    finally:
        await standby.stop()
        await active.stop()


@asynccontextmanager
async def bare_server() -> AsyncIterator[str]:
    """A gRPC server with no service at all (every RPC: UNIMPLEMENTED)."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)

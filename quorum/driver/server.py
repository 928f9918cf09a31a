"""One kq quorum node as a gRPC server.

A single grpc.aio server on the node's address serves: RaftService (between
quorum nodes), QuorumService (describe, resign), the services of the node's
plug-ins (:mod:`quorum.driver.plugin`: the key-value store's, the metadata
controller's), gRPC health checking and server reflection.  The node's
state machine is a :class:`quorum.shared_log.SharedLog` of its plug-ins'
state machines (its snapshots hold each part under its name, so every node
of a cluster reads every other's): the node knows none of them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from kqproto import quorum_pb2, quorum_pb2_grpc, raft_pb2
from quorum.driver.metrics import NodeMetrics
from quorum.driver.node import (
    NodeOptions,
    QuorumNode,
)
from quorum.driver.plugin import (
    Authorizer,
    CertifiedCallers,
    PluginHost,
    ServerPlugin,
    authorize_call,
)
from quorum.driver.rpc_guard import RequestGuard
from quorum.driver.storage_format import open_node_storage
from quorum.driver.tls import TlsFiles
from quorum.driver.transport import KEEPALIVE_MS, RaftTransport
from quorum.shared_log import SharedLog
from quorum.storage import NodeStorage
from quorum.types import NodeId, Role, VoterSet

__all__ = ["NodeConfig", "NodeServer"]

log = logging.getLogger("kq.server")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: NodeId
    cluster_id: str
    # Voter id -> host:port of its gRPC server.
    voters: Mapping[NodeId, str]
    data_dir: Path
    # Where this node listens; a voter's default is its entry in `voters`.
    listen: str = ""
    options: NodeOptions = field(default_factory=NodeOptions)
    # host:port of the Prometheus exporter; empty: none.
    metrics_listen: str = ""
    # Mutual TLS on the node's listener and its channels to peers; None:
    # plaintext.
    tls: TlsFiles | None = None

    @property
    def address(self) -> str:
        if self.listen:
            return self.listen
        if self.node_id in self.voters:
            return self.voters[self.node_id]
        raise ValueError(f"node {self.node_id} is not a voter and has no listen address")


class NodeServer:
    """Owns a node's storage, core driver, transport and gRPC server;
    implements :class:`quorum.driver.plugin.PluginHost` for its plug-ins."""

    def __init__(
        self,
        config: NodeConfig,
        storage: NodeStorage | None = None,
        *,
        state_machine: SharedLog,
        plugins: Sequence[Callable[[PluginHost], ServerPlugin]] = (),
    ) -> None:
        self.config = config
        self.storage = storage or open_node_storage(
            config.data_dir, config.cluster_id, config.node_id
        )
        self.state_machine = state_machine
        self.metrics = NodeMetrics(config.node_id)
        self.node = QuorumNode(
            config.node_id,
            VoterSet(frozenset(config.voters)),
            self.storage,
            self.state_machine,
            config.options,
            random.Random(),
            self.metrics,
        )
        q = config.options.quorum
        self.transport = RaftTransport(
            config.node_id,
            config.cluster_id,
            config.voters,
            self.node.deliver,
            rpc_timeout_s=q.request_timeout_ms / 1000,
            unreachable=self.node.report_unreachable,
            dscp=config.options.dscp,
            tls=config.tls,
            max_message_bytes=config.options.max_message_bytes,
        )
        limits = config.options
        server_options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", limits.max_message_bytes),
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_concurrent_streams", limits.max_streams_per_connection),
            ("grpc.so_reuseport", 0),
            # The peers' keepalive pings (quorum.driver.transport) come every
            # KEEPALIVE_MS while their replication streams are open; accept
            # them (gRPC's default refuses pings more often than every 5
            # minutes without data, closing the connection after two).
            ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
            ("grpc.http2.max_ping_strikes", 0),
        ]
        if config.options.dscp:
            server_options.append(("grpc.dscp", config.options.dscp))
        # Before any servicer: malformed requests, a caller's calls in
        # flight, items per request (quorum.driver.rpc_guard).
        self.guard = RequestGuard(
            config.node_id,
            max_calls_per_caller=limits.max_calls_per_caller,
            max_request_items=limits.max_request_items,
        )
        self.server = grpc.aio.server(options=server_options, interceptors=[self.guard])
        self.port = 0
        self.health = health_aio.HealthServicer()
        # Until a plug-in installs one (the metadata controller does, in its
        # constructor: before the server serves anything).
        self._authorizer: Authorizer = CertifiedCallers()
        self.plugins = [make(self) for make in plugins]

    async def start(self) -> None:
        from kqproto import raft_pb2_grpc

        raft_pb2_grpc.add_RaftServiceServicer_to_server(self.transport, self.server)
        quorum_pb2_grpc.add_QuorumServiceServicer_to_server(QuorumServicer(self), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for plugin in self.plugins:
            plugin.add_to_server(self.server)
        names = [
            raft_pb2.DESCRIPTOR.services_by_name["RaftService"].full_name,
            quorum_pb2.DESCRIPTOR.services_by_name["QuorumService"].full_name,
            *[name for plugin in self.plugins for name in plugin.service_names],
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(names, self.server)
        if self.config.tls is None:
            self.port = self.server.add_insecure_port(self.config.address)
        else:
            self.port = self.server.add_secure_port(
                self.config.address, self.config.tls.server_credentials()
            )
        if self.port == 0:
            raise OSError(f"node {self.config.node_id} cannot listen on {self.config.address}")
        await self.server.start()
        if self.config.metrics_listen:
            self.metrics.serve(self.config.metrics_listen)
        self.node.start(self.transport.send)
        for plugin in self.plugins:
            await plugin.start()
        for name in names[:-1] + [""]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "node %d of cluster %s listening on %s",
            self.config.node_id,
            self.config.cluster_id,
            self.config.address,
        )

    async def stop(self, resign: bool = True) -> None:
        await self.health.enter_graceful_shutdown()
        for plugin in self.plugins:
            await plugin.stop()
        await self.node.stop(resign=resign)
        await self.transport.close()
        await self.server.stop(grace=0.2)
        self.metrics.close()
        close = getattr(self.storage, "close", None)
        if close is not None:
            close()
        log.info("node %d stopped", self.config.node_id)

    async def wait_stopped(self) -> None:
        await self.server.wait_for_termination()

    # -- PluginHost ------------------------------------------------------------

    @property
    def node_id(self) -> NodeId:
        return self.config.node_id

    @property
    def cluster_id(self) -> str:
        return self.config.cluster_id

    @property
    def raft(self) -> QuorumNode:
        return self.node

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def authorizer(self) -> Authorizer:
        return self._authorizer

    def install_authorizer(self, authorizer: Authorizer) -> None:
        self._authorizer = authorizer

    def leader_hint(self) -> quorum_pb2.LeaderHint:
        core = self.node.core
        live = core.role in (Role.LEADER, Role.FOLLOWER)
        leader = core.leader_id if live else None
        return quorum_pb2.LeaderHint(
            leader_id=-1 if leader is None else leader,
            leader_address=self.config.voters.get(leader, "") if leader is not None else "",
            epoch=core.epoch,
        )


class QuorumServicer(quorum_pb2_grpc.QuorumServiceServicer):
    def __init__(self, server: NodeServer) -> None:
        self.s = server

    async def DescribeQuorum(
        self, request: quorum_pb2.DescribeQuorumRequest, context: Any
    ) -> quorum_pb2.DescribeQuorumResponse:
        await authorize_call(self.s, context, "DescribeQuorum", "DESCRIBE")
        node = self.s.node
        status = node.status()
        out = quorum_pb2.DescribeQuorumResponse(
            error=quorum_pb2.OK,
            leader=self.s.leader_hint(),
            cluster_id=self.s.config.cluster_id,
            node_id=status.node_id,
            role=status.role.value,
            epoch=status.epoch,
            high_watermark=status.high_watermark,
            log_start_offset=status.log_start_offset,
            log_end_offset=status.log_end_offset,
            voters=sorted(self.s.config.voters),
            applied_offset=self.s.state_machine.applied_offset,
            state_digest=self.s.state_machine.digest(),
        )
        leader_end = status.log_end_offset
        for r in status.replicas:
            out.replicas.append(
                quorum_pb2.ReplicaState(
                    node_id=r.node_id,
                    voter=r.is_voter,
                    log_end_offset=r.log_end_offset,
                    lag=max(0, leader_end - r.log_end_offset),
                    last_fetch_timestamp_ms=node.wall_ms(r.last_fetch_ms),
                    last_caught_up_timestamp_ms=node.wall_ms(r.last_caught_up_ms),
                    status="Leader"
                    if r.node_id == status.node_id
                    else ("Follower" if r.is_voter else "Observer"),
                    address=self.s.config.voters.get(r.node_id, ""),
                )
            )
        return out

    async def Resign(
        self, request: quorum_pb2.ResignRequest, context: Any
    ) -> quorum_pb2.ResignResponse:
        await authorize_call(self.s, context, "Resign", "ALTER")
        if not self.s.node.resign(tuple(request.preferred_successors)):
            return quorum_pb2.ResignResponse(
                error=quorum_pb2.NOT_LEADER,
                message=f"node {self.s.config.node_id} is not the leader",
                leader=self.s.leader_hint(),
            )
        await asyncio.sleep(0)
        return quorum_pb2.ResignResponse(error=quorum_pb2.OK, leader=self.s.leader_hint())

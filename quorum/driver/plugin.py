"""The seam between a node's gRPC server and the plug-ins that add services
to it (the metadata controller; later the broker's side).

A plug-in sees the node only as a :class:`PluginHost`: its ids, the quorum
as a :class:`~quorum.driver.raft_client.RaftClient`, the metrics registry and
where the leader is; :class:`quorum.driver.server.NodeServer` implements it.
A plug-in is a :class:`ServerPlugin`: made once the node exists, its
services added to the server, started after the server and the node and
stopped before them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import grpc
from prometheus_client import CollectorRegistry

from kqproto import quorum_pb2
from quorum.driver.raft_client import RaftClient
from quorum.types import NodeId

__all__ = [
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_WRITE_TIMEOUT_S",
    "PluginHost",
    "ServerPlugin",
    "call_timeout",
]

DEFAULT_WRITE_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 2.0


class PluginHost(Protocol):
    """What a node offers the plug-ins on its server."""

    @property
    def node_id(self) -> NodeId: ...

    @property
    def cluster_id(self) -> str: ...

    @property
    def raft(self) -> RaftClient:
        """The quorum, as the state machine above it sees it."""
        ...

    @property
    def registry(self) -> CollectorRegistry:
        """Where the node's Prometheus metrics are registered."""
        ...

    def leader_hint(self) -> quorum_pb2.LeaderHint:
        """The leader as this node knows it, with its client address, for
        answers that redirect a client."""
        ...


class ServerPlugin(Protocol):
    """More services on a node's gRPC server."""

    # Full names of the gRPC services it adds (for health and reflection).
    service_names: Sequence[str]

    def add_to_server(self, server: grpc.aio.Server) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def call_timeout(context: Any, default: float) -> float:
    """The time left for a call: its gRPC deadline less a margin to answer,
    or ``default`` when it has none."""
    remaining: float | None = context.time_remaining()
    if remaining is None:
        return default
    return max(0.001, min(default, remaining - 0.01))

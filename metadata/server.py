"""The metadata controller on a quorum node's gRPC server.

:func:`controller_server` makes a :class:`quorum.driver.server.NodeServer`
whose state machine is the metadata one and whose server also carries the
metadata services (AdminService, BrokerLifecycleService), served by the
node's :class:`metadata.active.QuorumController`: active on the quorum
leader, a standby elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from kqproto import metadata_pb2, metadata_pb2_grpc
from metadata.active import ControllerSettings, QuorumController
from metadata.metrics import ControllerMetrics
from metadata.state_machine import ControllerStateMachine
from quorum.driver.server import NodeConfig, NodeServer
from quorum.storage import NodeStorage

__all__ = ["MetadataPlugin", "controller_server"]


class MetadataPlugin:
    """Implements :class:`quorum.driver.server.ServerPlugin`."""

    service_names: Sequence[str] = (
        metadata_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
        metadata_pb2.DESCRIPTOR.services_by_name["BrokerLifecycleService"].full_name,
    )

    def __init__(self, server: NodeServer, settings: ControllerSettings) -> None:
        from metadata.service import AdminServicer, BrokerLifecycleServicer

        sm = server.state_machine
        if not isinstance(sm, ControllerStateMachine):
            raise TypeError("the metadata plugin needs a ControllerStateMachine")
        self.server = server
        self.controller = QuorumController(server.node, sm, server.config.cluster_id, settings)
        self.metrics = ControllerMetrics(
            server.metrics.registry,
            server.config.node_id,
            lambda: sm.image,
            lambda: self.controller.is_active,
        )
        self._admin = AdminServicer(self.controller, server)
        self._lifecycle = BrokerLifecycleServicer(self.controller, server)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        metadata_pb2_grpc.add_AdminServiceServicer_to_server(self._admin, server)
        metadata_pb2_grpc.add_BrokerLifecycleServiceServicer_to_server(self._lifecycle, server)

    async def start(self) -> None:
        self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()


def controller_server(
    config: NodeConfig,
    settings: ControllerSettings | None = None,
    storage: NodeStorage | None = None,
) -> NodeServer:
    """A controller node: the quorum, the key-value store and the metadata
    services on one gRPC server."""
    settings = settings or ControllerSettings()
    return NodeServer(
        config,
        storage,
        state_machine=ControllerStateMachine(),
        plugins=[lambda server: MetadataPlugin(server, settings)],
    )


def plugin_of(server: NodeServer) -> MetadataPlugin:
    """The metadata plugin of a server made by :func:`controller_server`."""
    for plugin in server.plugins:
        if isinstance(plugin, MetadataPlugin):
            return plugin
    raise LookupError(f"node {server.config.node_id} runs no metadata controller")

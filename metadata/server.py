"""The metadata controller as a plug-in of a quorum node's gRPC server.

:class:`MetadataPlugin` adds the metadata services (AdminService,
BrokerLifecycleService) to a node's server, served by the node's
:class:`metadata.active.QuorumController`: active on the quorum leader, a
standby elsewhere.  It sees the node only through the seams of
:mod:`quorum.driver.plugin` (a :class:`PluginHost`) and
:mod:`quorum.driver.raft_client`; the process that puts node and plug-in
together is :mod:`server.controller`.

It installs the node's authorizer (:class:`ImageAuthorizer`): every service
of the node, the quorum's and the key-value store's too, authorizes its
callers against the ACL bindings of this node's committed metadata image, so
every controller (a standby too) enforces the same set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from kqproto import metadata_pb2, metadata_pb2_grpc
from metadata.acls import AclOperation, AclResourceType
from metadata.active import ControllerSettings, QuorumController
from metadata.authorizer import Action, AuthorizerSettings, authorize
from metadata.image import MetadataImage
from metadata.metrics import ControllerMetrics
from metadata.state_machine import ControllerStateMachine
from quorum.driver.plugin import Permission, PluginHost

__all__ = ["ImageAuthorizer", "MetadataPlugin"]


class ImageAuthorizer:
    """Implements :class:`quorum.driver.plugin.Authorizer` with Kafka's
    StandardAuthorizer rules (:mod:`metadata.authorizer`) over the ACL
    bindings of the image ``image()`` returns (the node's committed one)."""

    def __init__(self, image: Callable[[], MetadataImage], settings: AuthorizerSettings) -> None:
        self._image = image
        self.settings = settings

    def authorize(
        self, principal: str, host: str, operation: str, resource_type: str, resource_name: str
    ) -> Permission:
        try:
            action = Action(AclOperation[operation], AclResourceType[resource_type], resource_name)
        except KeyError:
            return Permission(False, f"unknown operation {operation} or resource {resource_type}")
        verdict = authorize(self._image().acls, self.settings, principal, host, action)
        return Permission(verdict.allowed, verdict.reason)


class MetadataPlugin:
    """Implements :class:`quorum.driver.plugin.ServerPlugin`."""

    service_names: Sequence[str] = (
        metadata_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
        metadata_pb2.DESCRIPTOR.services_by_name["BrokerLifecycleService"].full_name,
    )

    def __init__(
        self,
        host: PluginHost,
        state_machine: ControllerStateMachine,
        settings: ControllerSettings,
        authorizer: AuthorizerSettings | None = None,
    ) -> None:
        from metadata.service import AdminServicer, BrokerLifecycleServicer

        self.host = host
        self.controller = QuorumController(host.raft, state_machine, host.cluster_id, settings)
        self.metrics = ControllerMetrics(
            host.registry,
            host.node_id,
            lambda: state_machine.image,
            lambda: self.controller.is_active,
        )
        self._admin = AdminServicer(self.controller, host)
        self._lifecycle = BrokerLifecycleServicer(self.controller, host)
        self.authorizer = ImageAuthorizer(
            lambda: state_machine.image, authorizer or AuthorizerSettings()
        )
        host.install_authorizer(self.authorizer)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        metadata_pb2_grpc.add_AdminServiceServicer_to_server(self._admin, server)
        metadata_pb2_grpc.add_BrokerLifecycleServiceServicer_to_server(self._lifecycle, server)

    async def start(self) -> None:
        self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

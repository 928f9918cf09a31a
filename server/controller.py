"""A controller process: a quorum node with the metadata controller.

:func:`controller_server` puts the pieces together: the node's
:class:`~quorum.driver.server.NodeServer` (storage, consensus driver,
transport, the key-value store and the quorum's admin service) with the
metadata state machine on its log and the :class:`MetadataPlugin` on its
gRPC server.
"""

from __future__ import annotations

from metadata.active import ControllerSettings
from metadata.server import MetadataPlugin
from metadata.state_machine import ControllerStateMachine
from quorum.driver.server import NodeConfig, NodeServer
from quorum.storage import NodeStorage

__all__ = ["controller_server", "plugin_of"]


def controller_server(
    config: NodeConfig,
    settings: ControllerSettings | None = None,
    storage: NodeStorage | None = None,
) -> NodeServer:
    """A controller node: the quorum, the key-value store and the metadata
    services on one gRPC server."""
    settings = settings or ControllerSettings()
    state_machine = ControllerStateMachine()
    return NodeServer(
        config,
        storage,
        state_machine=state_machine,
        plugins=[lambda host: MetadataPlugin(host, state_machine, settings)],
    )


def plugin_of(server: NodeServer) -> MetadataPlugin:
    """The metadata plugin of a server made by :func:`controller_server`."""
    for plugin in server.plugins:
        if isinstance(plugin, MetadataPlugin):
            return plugin
    raise LookupError(f"node {server.config.node_id} runs no metadata controller")

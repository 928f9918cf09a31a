"""A controller process: a quorum node with the metadata controller.

:func:`controller_server` puts the pieces together: the node's
:class:`~quorum.driver.server.NodeServer` (storage, consensus driver,
transport, the quorum's admin service) with its two plug-ins, the
key-value store (:class:`KvPlugin`) and the metadata controller
(:class:`MetadataPlugin`), whose state machines share the node's log
(:class:`~quorum.shared_log.SharedLog`).  :func:`run_controller` runs one in the foreground until
SIGTERM or SIGINT, on which a leader first resigns (so that the others
elect a successor at once instead of waiting for a fetch timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from kvstore.service import KvPlugin
from kvstore.state_machine import KvStateMachine
from metadata.active import ControllerSettings
from metadata.authorizer import AuthorizerSettings
from metadata.server import MetadataPlugin
from metadata.state_machine import ControllerStateMachine
from quorum.driver.loop import run as run_loop
from quorum.driver.rocks import StorageOpenError
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.storage_format import StorageFormatError, open_node_storage, read_meta
from quorum.shared_log import SharedLog
from quorum.storage import NodeStorage, StorageCorruptError
from quorum.types import Role
from server.config import ControllerConfig
from server.errors import EXIT_FAILURE
from server.injected_bugs import install_from_environment
from server.storage_mode import StorageModeError, lose_unsynced_from_environment

__all__ = ["controller_server", "kv_of", "kv_server", "plugin_of", "run_controller"]

log = logging.getLogger("kq.controller")


def controller_server(
    config: NodeConfig,
    settings: ControllerSettings | None = None,
    storage: NodeStorage | None = None,
    authorizer: AuthorizerSettings | None = None,
) -> NodeServer:
    """A controller node: the quorum, the key-value store and the metadata
    services on one gRPC server, the two sharing the node's log.  Over TLS,
    every service authorizes its callers with ``authorizer``'s super users
    and the ACL bindings of the metadata log (docs/security.md)."""
    settings = settings or ControllerSettings()
    metadata = ControllerStateMachine()
    kv = KvStateMachine()
    return NodeServer(
        config,
        storage,
        state_machine=SharedLog([("metadata", metadata), ("kv", kv)]),
        plugins=[
            lambda host: KvPlugin(host, kv),
            lambda host: MetadataPlugin(host, metadata, settings, authorizer),
        ],
    )


def kv_server(config: NodeConfig, storage: NodeStorage | None = None) -> NodeServer:
    """A quorum node with the key-value store alone (the quorum's own
    tests and benchmarks: no metadata controller)."""
    kv = KvStateMachine()
    return NodeServer(
        config,
        storage,
        state_machine=SharedLog([("kv", kv)]),
        plugins=[lambda host: KvPlugin(host, kv)],
    )


def plugin_of(server: NodeServer) -> MetadataPlugin:
    """The metadata plugin of a server made by :func:`controller_server`."""
    for plugin in server.plugins:
        if isinstance(plugin, MetadataPlugin):
            return plugin
    raise LookupError(f"node {server.config.node_id} runs no metadata controller")


def kv_of(server: NodeServer) -> KvStateMachine:
    """The key-value store of a server made here."""
    for plugin in server.plugins:
        if isinstance(plugin, KvPlugin):
            return plugin.state_machine
    raise LookupError(f"node {server.config.node_id} runs no key-value store")


def run_controller(config: ControllerConfig) -> int:
    """Open the node's storage, serve until a signal, stop; the exit status."""
    if not install_from_environment(os.environ, log, f"node {config.node_id}"):
        return EXIT_FAILURE
    try:
        lose_unsynced = lose_unsynced_from_environment(os.environ)
    except StorageModeError as exc:
        log.error("cannot start node %d: %s", config.node_id, exc)
        return EXIT_FAILURE
    where = config.settings.config_file
    log.info(
        "starting node %d of cluster %s: data dir %s, address %s, voters %s%s",
        config.node_id,
        config.cluster_id,
        config.data_dir,
        config.address,
        ",".join(f"{n}@{a}" for n, a in sorted(config.voters.items())),
        f"; config file {where}" if where else "",
    )
    try:
        meta = read_meta(config.data_dir)
    except StorageFormatError as exc:
        log.error("cannot start node %d: %s", config.node_id, exc)
        return EXIT_FAILURE
    if meta.cluster_id == config.cluster_id and set(meta.voters.voters) != set(config.voters):
        log.error(
            "cannot start node %d: data directory %s was formatted for voters %s but the "
            "configuration names voters %s; refusing to start (the voter set cannot change "
            "by editing the configuration)",
            config.node_id,
            config.data_dir,
            ",".join(map(str, meta.voters.sorted())),
            ",".join(map(str, sorted(config.voters))),
        )
        return EXIT_FAILURE
    # uvloop when installed (quorum.driver.loop; KQ_UVLOOP=0: asyncio's).
    return run_loop(_serve(config, lose_unsynced))


async def _serve(config: ControllerConfig, lose_unsynced: bool = False) -> int:
    node_id = config.node_id
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            log.warning("received %s again; already stopping", sig.name)
            return
        received.append(sig.name)
        log.info("received %s: resigning leadership if leader, then stopping", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        try:
            storage = None
            if lose_unsynced:
                log.warning(
                    "node %d runs in the power-loss test mode: writes not synced are lost "
                    "at a kill",
                    node_id,
                )
                storage = open_node_storage(
                    config.data_dir, config.cluster_id, node_id, lose_unsynced=True
                )
            # The gRPC server of a NodeServer belongs to the loop it is made in.
            server = controller_server(
                config.node_config(), config.controller, storage, authorizer=config.authorizer
            )
        except (
            StorageFormatError,
            StorageCorruptError,
            StorageOpenError,
            OSError,
            ValueError,
        ) as exc:
            log.error("cannot start node %d: %s", node_id, exc)
            return EXIT_FAILURE
        try:
            await server.start()
        except (OSError, RuntimeError) as exc:
            log.error("cannot start node %d on %s: %s", node_id, config.address, exc)
            await server.server.stop(grace=None)
            close = getattr(server.storage, "close", None)
            if close is not None:
                close()
            return EXIT_FAILURE
        status = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if server.node.failure is not None:
                log.error("node %d failed: %s; stopping", node_id, server.node.failure)
                status = EXIT_FAILURE
                break
        core = server.node.core
        if status == 0 and core.role is Role.LEADER:
            log.info("node %d leads epoch %d: resigning before it stops", node_id, core.epoch)
        await server.stop(resign=status == 0)
        if status == 0:
            log.info("node %d stopped cleanly", node_id)
        return status
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

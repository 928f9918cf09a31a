"""Metadata replicated for real: standbys, observers (brokers) and restarts
from snapshots hold exactly the active controller's image.

Three controllers and broker-side observers run in this process on
loopback.  Snapshots are taken every few dozen offsets, so a restarted
controller loads a snapshot and replays the log after it, and a late
observer installs a snapshot from the leader (FetchSnapshot) because the
log before it is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from broker.local_changes import LocalChanges, local_changes
from metadata.active import ControllerSettings, QuorumController
from metadata.controller import (
    Controller,
    ControllerResult,
    HeartbeatRequest,
    ItemResult,
    NewTopic,
    RegisterRequest,
)
from metadata.delta import MetadataDelta
from metadata.image import MetadataImage
from metadata.records import Endpoint, FeatureRange
from metadata.state_machine import ControllerStateMachine
from quorum.config import QuorumConfig
from quorum.driver.node import NodeOptions
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.storage_format import format_storage
from quorum.shared_log import SharedLog
from server.controller import controller_server, plugin_of
from tests.driver.cluster_util import CLUSTER_ID, Cluster, free_ports, started

OPTIONS = NodeOptions(
    quorum=QuorumConfig(
        election_timeout_ms=150, fetch_timeout_ms=400, fetch_max_wait_ms=100, request_timeout_ms=150
    ),
    snapshot_every_offsets=40,
)
SETTINGS = ControllerSettings(
    broker_session_timeout_ms=60_000, broker_heartbeat_interval_ms=500, tick_interval_ms=50
)
FEATURES = (FeatureRange("metadata.version", 1, 1),)


class ControllerCluster(Cluster):
    async def start(self, node: int) -> NodeServer:
        server = controller_server(
            NodeConfig(
                node, CLUSTER_ID, self.voters, self.root / f"node-{node}", options=self.options
            ),
            SETTINGS,
        )
        await server.start()
        self.servers[node] = server
        return server

    def active(self) -> QuorumController | None:
        for server in self.servers.values():
            controller = plugin_of(server).controller
            if controller.is_active:
                return controller
        return None

    async def wait_active(self) -> QuorumController:
        await self.wait_for(lambda: self.active() is not None, 15)
        active = self.active()
        assert active is not None
        return active


async def start_observer(cluster: Cluster, node_id: int) -> NodeServer:
    data_dir = cluster.root / f"observer-{node_id}"
    format_storage(data_dir, CLUSTER_ID, node_id, cluster.voters.keys())
    (port,) = free_ports(1)
    observer = NodeServer(
        NodeConfig(
            node_id,
            CLUSTER_ID,
            cluster.voters,
            data_dir,
            listen=f"127.0.0.1:{port}",
            options=OPTIONS,
        ),
        # A node's snapshots hold every part of its log: an observer that
        # replays the metadata alone takes the metadata's part.
        state_machine=SharedLog([("metadata", ControllerStateMachine())]),
    )
    await observer.start()
    return observer


def controllers(root: Path) -> AbstractAsyncContextManager[ControllerCluster]:
    return started(ControllerCluster(root, voters=3, options=OPTIONS))


def create(topics: list[NewTopic]) -> Callable[[Controller], ControllerResult[list[ItemResult]]]:
    return lambda c: c.create_topics(topics)


def metadata_of(server: NodeServer) -> ControllerStateMachine:
    part = server.state_machine.part("metadata")
    assert isinstance(part, ControllerStateMachine)
    return part


def image_of(server: NodeServer) -> MetadataImage:
    return metadata_of(server).image


async def register_and_unfence(active: QuorumController, broker_id: int) -> int:
    request = RegisterRequest(
        broker_id,
        CLUSTER_ID,
        f"incarnation-{broker_id}",
        (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),),
        f"rack-{broker_id % 2}",
        FEATURES,
    )
    epoch = await active.write(lambda c: c.register_broker(request, active.node.now_ms()), 5)
    beat = HeartbeatRequest(broker_id, epoch, active.sm.applied_offset - 1)
    response = await active.write(lambda c: c.heartbeat(beat, active.node.now_ms()), 5)
    assert not response.is_fenced
    return epoch


def test_standbys_observers_and_restarts_hold_the_active_image(tmp_path: Path) -> None:
    async def go() -> None:
        async with controllers(tmp_path) as cluster:
            active = await cluster.wait_active()
            observer = await start_observer(cluster, 11)
            changes: list[LocalChanges] = []

            def on_commit(delta: MetadataDelta, image: MetadataImage) -> None:
                # What broker 1 would do, from the image before and after.
                changes.append(local_changes(delta.image, image, 1))

            sm = metadata_of(observer)
            sm.add_listener(on_commit)
            try:
                epochs = {b: await register_and_unfence(active, b) for b in (1, 2, 3)}
                # A broker's epoch is the offset of its registration record.
                for b, epoch in epochs.items():
                    assert active.sm.image.brokers[b].epoch == epoch
                for i in range(30):
                    results = await active.write(create([NewTopic(f"t{i}", 2, 3)]), 5)
                    assert results[0].error.name == "NONE", results[0]
                end = active.sm.applied_offset
                everyone = [*cluster.servers.values(), observer]
                await cluster.wait_for(
                    lambda: all(s.state_machine.applied_offset >= end for s in everyone), 10
                )
                leader_image = image_of(active_server(cluster, active))
                for s in everyone:
                    assert image_of(s).topics == leader_image.topics
                    assert image_of(s).brokers == leader_image.brokers
                # The observer (broker 1's view) was told which partitions
                # it leads and follows.
                led = {tp for c in changes for tp in c.leaders}
                followed = {tp for c in changes for tp in c.followers}
                assert led and followed
                expected_led = {
                    (t.topic_id, i) for t, i, p in leader_image.partitions() if p.leader == 1
                }
                assert {(tp.topic_id, tp.partition) for tp in led} == expected_led

                # A standby restarts: snapshot + log give the same image.
                standby = next(
                    n for n, s in cluster.servers.items() if not plugin_of(s).controller.is_active
                )
                await cluster.stop(standby, resign=False)
                restarted = await cluster.start(standby)
                assert restarted.node.last_snapshot_offset > 0 or (
                    restarted.storage.snapshots.latest() is not None
                )
                await cluster.wait_for(lambda: restarted.state_machine.applied_offset >= end, 10)
                image = image_of(restarted)
                assert image.topics == leader_image.topics
                assert image.brokers == leader_image.brokers
                assert image.features == leader_image.features

                # A late observer: the leader's log before its snapshot is
                # gone, so it installs the snapshot, then fetches the rest.
                leader_node = active_server(cluster, active).node
                assert leader_node.status().log_start_offset > 0
                late = await start_observer(cluster, 12)
                try:
                    await cluster.wait_for(lambda: late.state_machine.applied_offset >= end, 10)
                    assert late.node.last_snapshot_offset > 0
                    assert image_of(late).topics == leader_image.topics
                    assert image_of(late).brokers == leader_image.brokers
                finally:
                    await late.stop(resign=False)
            finally:
                await observer.stop(resign=False)

    asyncio.run(asyncio.wait_for(go(), 90))


def active_server(cluster: ControllerCluster, active: QuorumController) -> NodeServer:
    for server in cluster.servers.values():
        if plugin_of(server).controller is active:
            return server
    raise AssertionError("the active controller's server is gone")


@pytest.mark.slow
def test_a_new_active_controller_keeps_the_metadata(tmp_path: Path) -> None:
    async def go() -> None:
        async with controllers(tmp_path) as cluster:
            active = await cluster.wait_active()
            for b in (1, 2, 3):
                await register_and_unfence(active, b)
            results = await active.write(lambda c: c.create_topics([NewTopic("keep", 3, 3)]), 5)
            assert results[0].error.name == "NONE"
            before = active.sm.image
            old = active_server(cluster, active).config.node_id
            await cluster.stop(old, resign=True)
            successor = await cluster.wait_active()
            assert successor is not active
            await cluster.wait_for(lambda: successor.sm.applied_offset >= before.offset, 10)
            after = successor.sm.image
            assert after.topics == before.topics
            assert set(after.brokers) == {1, 2, 3}
            # Fresh sessions: nobody is fenced for the failover.
            assert not any(b.fenced for b in after.brokers.values())
            more = await successor.write(lambda c: c.create_topics([NewTopic("more", 1, 3)]), 5)
            assert more[0].error.name == "NONE"

    asyncio.run(asyncio.wait_for(go(), 90))

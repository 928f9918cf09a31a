"""A partition of the local backend cuts a broker off from the controllers
too: real processes (3 controllers, 3 brokers, mutual TLS), one partition
leader isolated with iptables.

Every channel a broker opens to another node carries its DSCP mark
(``node.dscp``), its heartbeats to the controllers as well as its Raft
observer's fetches and its replica fetches, so the partition stops them:
the controllers end its session (``controller.broker_session_timeout_ms``)
and fence it, and its partitions get another leader and an ISR without it
(Kafka's ``BrokerHeartbeatManager``, ``ReplicationControlManager.fenceStaleBroker``).
The harness's own clients are unmarked, so they still reach every node,
the isolated one included (Jepsen's clients are never cut off).  Healed,
the broker heartbeats again, is unfenced and rejoins the ISR."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.backend import isolate
from chaos.local import LocalCluster
from kqproto import metadata_pb2
from metadata.client import MetadataClient, NewTopic
from quorum.driver.client import describe
from server.local_brokers import broker_registrations
from tests.chaos.cluster_scenarios import need_iptables, processes_under, scratch_tempdir
from tests.chaos.polling import until

pytestmark = pytest.mark.slow

PARTITIONS = 3


async def _partitions(admin: MetadataClient) -> list[metadata_pb2.PartitionDescription]:
    answer = await admin.describe_topics(["t"])
    return [p for topic in answer.topics for p in topic.partitions]


async def _reaches_every_node(cluster: LocalCluster) -> None:
    """The harness's client (unmarked) gets an answer from every node."""
    credentials = cluster.client_credentials()
    addresses = {**cluster.addresses(), **cluster.broker_addresses()}
    for node, address in addresses.items():
        assert await describe(address, 2.0, credentials) is not None, f"node {node} is cut off"


def test_an_isolated_broker_is_fenced_by_the_controllers_and_comes_back_healed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_iptables()
    scratch = scratch_tempdir(tmp_path, monkeypatch)

    async def body() -> None:
        # The chaos brokers' settings: heartbeats every 0.5 s, a session of 4 s.
        cluster = LocalCluster(tmp_path / "cluster", 3, brokers=3)
        try:
            await cluster.start()
            async with MetadataClient(
                list(cluster.addresses().values()),
                timeout_s=5.0,
                credentials=cluster.client_credentials(),
            ) as admin:
                await admin.create_topics([NewTopic("t", PARTITIONS, 3)])

                async def settled() -> object:
                    parts = await _partitions(admin)
                    full = [p for p in parts if p.leader >= 0 and len(p.isr) == 3]
                    return len(full) == PARTITIONS or [(p.leader, list(p.isr)) for p in parts]

                await until("every partition led with a full ISR", 30, settled)
                target = (await _partitions(admin))[0].leader
                led = {p.partition for p in await _partitions(admin) if p.leader == target}

                await cluster.partition(isolate(cluster.nodes, target))

                async def fenced() -> object:
                    seen = await broker_registrations(cluster.state)
                    parts = await _partitions(admin)
                    if (
                        seen is not None
                        and target in seen
                        and seen[target].fenced
                        and all(p.leader != target and target not in p.isr for p in parts)
                    ):
                        return True
                    state = None if seen is None or target not in seen else seen[target].fenced
                    return (state, [(p.leader, list(p.isr)) for p in parts])

                # The session (4 s) ends, the controllers fence the broker and
                # move its leaderships (each partition it led has a leader).
                await until(f"broker {target} fenced and out of every ISR", 20, fenced)
                moved = {p.partition: p.leader for p in await _partitions(admin)}
                assert all(moved[p] >= 0 for p in led), moved
                # The cut is between nodes only: the harness still reaches all.
                await _reaches_every_node(cluster)

                await cluster.heal()

                async def back() -> object:
                    seen = await broker_registrations(cluster.state)
                    parts = await _partitions(admin)
                    if (
                        seen is not None
                        and target in seen
                        and not seen[target].fenced
                        and all(target in p.isr for p in parts)
                    ):
                        return True
                    state = None if seen is None or target not in seen else seen[target].fenced
                    return (state, [(p.leader, list(p.isr)) for p in parts])

                await until(f"broker {target} unfenced and back in every ISR", 40, back)
                await _reaches_every_node(cluster)
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(body(), 180))
    assert processes_under(scratch) == []

"""The controller's Prometheus metrics follow the metadata."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from metadata.controller import NewTopic
from server.controller import plugin_of
from tests.metadata.metadata_cluster import TestBroker, running_metadata


def value(registry: CollectorRegistry, name: str) -> float:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no metric {name}")


def test_controller_metrics(tmp_path: Path) -> None:
    async def go() -> None:
        async with running_metadata(tmp_path) as cluster:
            active_node = await cluster.wait_active()
            registries = {n: s.metrics.registry for n, s in cluster.servers.items()}
            actives = {n: value(r, "kq_controller_active") for n, r in registries.items()}
            assert actives == {n: float(n == active_node) for n in cluster.servers}

            brokers = [TestBroker(cluster, b) for b in (1, 2, 3)]
            for broker in brokers:
                await broker.start()
            active = cluster.controller(active_node)
            created = await active.write(lambda c: c.create_topics([NewTopic("m", 6, 2)]), 5)
            assert created[0].error.name == "NONE"
            r = registries[active_node]
            assert value(r, "kq_controller_registered_brokers") == 3
            assert value(r, "kq_controller_fenced_brokers") == 0
            assert value(r, "kq_controller_topics") == 1
            assert value(r, "kq_controller_partitions") == 6
            assert value(r, "kq_controller_offline_partitions") == 0
            assert value(r, "kq_controller_metadata_offset") == active.sm.applied_offset

            # A broker dies: it is fenced, its partitions re-led elsewhere
            # (not by their preferred replica).
            await brokers[0].stop()
            await cluster.wait_for(lambda: value(r, "kq_controller_fenced_brokers") == 1, 10)
            led_by_1 = sum(1 for _, _, p in active.sm.image.partitions() if p.preferred_leader == 1)
            assert led_by_1 > 0
            assert value(r, "kq_controller_preferred_replica_imbalance") == led_by_1
            assert value(r, "kq_controller_offline_partitions") == 0
            for broker in brokers[1:]:
                await broker.stop()
            assert plugin_of(cluster.servers[active_node]).metrics.counts().partitions == 6

    asyncio.run(asyncio.wait_for(go(), 60))

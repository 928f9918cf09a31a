"""The broker's partition gauges (server/broker.py): the four counts come
from one pass over the replicas per scrape, exposed as a gauge each."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from server.broker import _PartitionGauges


def test_one_scrape_counts_the_partitions_once() -> None:
    calls: list[int] = []

    def counts() -> dict[str, int]:
        calls.append(1)
        return {"leader": 3, "under_replicated": 1, "under_min_isr": 0, "offline": 2}

    registry = CollectorRegistry()
    registry.register(_PartitionGauges("4", counts))
    assert calls == []  # registering describes, it does not count
    text = generate_latest(registry).decode()
    assert len(calls) == 1
    for line in (
        'kq_broker_leader_partitions{node="4"} 3.0',
        'kq_broker_under_replicated_partitions{node="4"} 1.0',
        'kq_broker_under_min_isr_partitions{node="4"} 0.0',
        'kq_broker_offline_partitions{node="4"} 2.0',
        "# TYPE kq_broker_leader_partitions gauge",
    ):
        assert line in text, line

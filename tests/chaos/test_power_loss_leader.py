"""A partition leader that loses power and comes back while its old session
still lives: real processes (3 controllers, 3 brokers) in the storage's
power-loss test mode, the leader killed with SIGKILL after acks=all
produces and started again at once.  Its log comes back empty, and its
registration is refused until the old session ends; if it published its
metadata before its own registration, it would lead the partition again
in the old leader epoch with that empty log, and its followers would
truncate the acknowledged records away (seen in a power-loss chaos run).
It must wait, as Kafka's broker waits for the controller to see it caught
up to its registration, which moves the leadership elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.local import LocalCluster
from kqproto import broker_pb2_grpc
from metadata.client import MetadataClient, NewTopic
from partition_log.batch import decode_records, split_batches
from quorum.driver.tls import dial
from server.storage_mode import LOSE_UNSYNCED_VARIABLE
from tests.chaos.cluster_scenarios import processes_under, scratch_tempdir
from tests.server.test_broker_process import fetch, produce

pytestmark = pytest.mark.slow

RECORDS = 6


async def _partition(cluster: LocalCluster) -> tuple[int, int, list[int]]:
    """The leader, leader epoch and ISR of ``t-0``, once it has all three."""
    async with MetadataClient(
        list(cluster.addresses().values()), credentials=cluster.client_credentials()
    ) as admin:
        for _ in range(200):
            answer = await admin.describe_topics(["t"])
            for topic in answer.topics:
                for p in topic.partitions:
                    if p.leader >= 0 and len(p.isr) == 3:
                        return p.leader, p.leader_epoch, list(p.isr)
            await asyncio.sleep(0.1)
    raise AssertionError("t-0 never had a leader and three in-sync replicas")


async def _values(cluster: LocalCluster, broker: int) -> list[bytes]:
    async with dial(cluster.broker_addresses()[broker], cluster.client_credentials()) as channel:
        got = (await broker_pb2_grpc.BrokerServiceStub(channel).Fetch(fetch(0))).topics[0]
    part = got.partitions[0]
    return [r.value or b"" for b in split_batches(part.records) for r in decode_records(b)]


def test_a_leader_back_from_a_power_loss_does_not_lead_with_its_cut_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = scratch_tempdir(tmp_path, monkeypatch)

    async def body() -> None:
        cluster = LocalCluster(
            tmp_path / "cluster",
            3,
            # A session that outlives the restart: the new process starts
            # while the controllers still count the old one alive.
            {"controller.broker_session_timeout_ms": 12_000},
            network_faults=False,
            brokers=3,
            env={LOSE_UNSYNCED_VARIABLE: "1"},
        )
        try:
            await cluster.start()
            async with MetadataClient(
                list(cluster.addresses().values()), credentials=cluster.client_credentials()
            ) as admin:
                await admin.create_topics(
                    [NewTopic("t", 1, 3, configs={"min.insync.replicas": "2"})]
                )
            leader, epoch, _ = await _partition(cluster)
            sent = [b"v%d" % i for i in range(RECORDS)]
            address = cluster.broker_addresses()[leader]
            async with dial(address, cluster.client_credentials()) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                for i, value in enumerate(sent):
                    answer = (await stub.Produce(produce(value))).topics[0].partitions[0]
                    assert (answer.error, answer.base_offset) == (0, i), answer
            await cluster.kill(leader)
            # Registered again (after the old session ended) and unfenced.
            await cluster.restart(leader, 60.0)
            new_leader, new_epoch, isr = await _partition(cluster)
            assert new_epoch > epoch, (new_leader, new_epoch)
            # Every acknowledged record is at its offset.
            for _ in range(100):
                if await _values(cluster, new_leader) == sent:
                    break
                await asyncio.sleep(0.1)
            assert await _values(cluster, new_leader) == sent
            assert sorted(isr) == list(cluster.brokers)
            state = cluster.state
            log = state.path(state.member(leader).log_file).read_text()
            assert "runs in the power-loss test mode" in log
        finally:
            await cluster.stop()

    asyncio.run(asyncio.wait_for(body(), 240))
    assert processes_under(scratch) == []

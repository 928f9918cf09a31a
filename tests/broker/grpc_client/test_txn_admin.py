"""The transactions admin client against real brokers (three controllers,
three brokers, mutual TLS, one cluster for the module): transactional ids
described at their coordinators (an unknown one is TransactionNotFoundError),
the listing of every broker (one that does not answer fails it, naming
the broker), an open transaction found by its first offset and, though a
candidate, not hanging, and a
description that follows its coordinator when that broker stops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from broker.client.hanging import candidates
from broker.client.producer_batch import ProducerConfig, TopicPartition
from broker.grpc_client import (
    AbortSpec,
    BrokerClientError,
    OpenTransactionNotFoundError,
    Producer,
    TransactionAdmin,
    TransactionNotFoundError,
)
from broker.grpc_client.txn_admin import wall_clock_ms
from tests.broker.grpc_client.cluster import BROKERS, BrokerCluster

TOPIC = "payments"
CONFIG = ProducerConfig(linger_ms=2, request_timeout_ms=10_000, delivery_timeout_ms=30_000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    running = BrokerCluster(tmp_path_factory.mktemp("txn-admin-client"))
    try:
        running.start()
        running.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
        yield running
    finally:
        running.stop()


def admin(cluster: BrokerCluster, timeout_ms: int = 20_000) -> TransactionAdmin:
    return TransactionAdmin(cluster.addresses, tls=cluster.admin_tls, timeout_ms=timeout_ms)


def producer(cluster: BrokerCluster, tid: str) -> Producer:
    return Producer(
        cluster.addresses,
        CONFIG,
        tls=cluster.admin_tls,
        transactional_id=tid,
        transaction_timeout_ms=45_000,
    )


def test_describe_list_and_find_an_open_transaction(cluster: BrokerCluster) -> None:
    async def body() -> None:
        first, second = producer(cluster, "pay-1"), producer(cluster, "pay-2")
        try:
            await first.init_transactions(30_000)
            await second.init_transactions(30_000)
            first.begin_transaction()
            sent = [await first.send(TOPIC, b"x%d" % i, partition=0) for i in range(2)]
            start = (await sent[0]).offset
            await asyncio.gather(*sent)
            async with admin(cluster) as txns:
                found = await txns.describe_transactions(["pay-1", "pay-2", "pay-1"])
                assert list(found) == ["pay-1", "pay-2"]
                assert found["pay-1"].state == "Ongoing"
                assert found["pay-1"].partitions == (TopicPartition(TOPIC, 0),)
                assert found["pay-1"].transaction_timeout_ms == 45_000
                assert found["pay-2"].state == "Empty"
                assert found["pay-2"].partitions == ()
                assert found["pay-2"].transaction_start_time_ms == -1
                assert found["pay-1"].coordinator_id in BROKERS

                listed = await txns.list_transactions()
                assert {(t.transactional_id, t.state) for t in listed} >= {
                    ("pay-1", "Ongoing"),
                    ("pay-2", "Empty"),
                }
                by_id = {t.transactional_id: t for t in listed}
                assert by_id["pay-1"].coordinator_id == found["pay-1"].coordinator_id
                assert by_id["pay-1"].producer_id == found["pay-1"].producer_id
                only = await txns.list_transactions(
                    states=["Empty"], producer_ids=[found["pay-2"].producer_id]
                )
                assert [t.transactional_id for t in only] == ["pay-2"]
                # Open for longer than an hour: none (KIP-994).
                assert await txns.list_transactions(states=["Ongoing"], duration_ms=3_600_000) == []
                with pytest.raises(ValueError, match="unknown transaction states Running"):
                    await txns.list_transactions(states=["Running"])

                spec = await txns.find_open_transaction(TopicPartition(TOPIC, 0), start)
                assert spec.producer_id == found["pay-1"].producer_id
                assert spec.producer_epoch == found["pay-1"].producer_epoch
                # No marker was written to the partition for it yet: Kafka's 0.
                assert spec.coordinator_epoch == 0
                with pytest.raises(OpenTransactionNotFoundError, match=f"offset {start + 1} "):
                    await txns.find_open_transaction(TopicPartition(TOPIC, 0), start + 1)
                # Healthy: with a zero timeout the open transaction is a
                # candidate, and its coordinator has it Ongoing there.
                await asyncio.sleep(0.05)
                tp = TopicPartition(TOPIC, 0)
                found_open = candidates(await txns.describe_producers([tp]), wall_clock_ms(), 0)
                assert [c.producer.producer_id for c in found_open] == [spec.producer_id]
                assert await txns.find_hanging([tp], 0) == []
                assert await txns.find_hanging([tp]) == []
                with pytest.raises(TransactionNotFoundError, match="'nobody'"):
                    await txns.describe_transaction("nobody")
            await first.commit_transaction(30_000)
        finally:
            await first.close(5)
            await second.close(5)

    asyncio.run(body())


def test_abort_spec_is_checked() -> None:
    tp = TopicPartition(TOPIC, 0)
    for bad in ((-1, 0, 0), (1, -1, 0), (1, 0, -1)):
        with pytest.raises(ValueError, match="negative"):
            AbortSpec(tp, *bad)


def test_a_broker_that_does_not_answer_fails_the_listing(cluster: BrokerCluster) -> None:
    """A broker the metadata names but that does not answer: the listing
    would miss the transactions it coordinates, so it is an error naming
    it, never a shorter list."""

    async def body() -> None:
        async with admin(cluster, timeout_ms=2_000) as txns:
            await txns.metadata.refresh()
            txns.metadata.brokers[99] = "127.0.0.1:1"

            async def unchanged(topics: object = ()) -> None:
                return None

            txns.metadata.refresh = unchanged  # type: ignore[method-assign]
            with pytest.raises(BrokerClientError, match=r"broker 99 \(127.0.0.1:1\)") as caught:
                await txns.list_transactions()
            assert "would miss the transactions it coordinates" in str(caught.value)

    asyncio.run(body())


def test_describe_follows_the_coordinator_when_its_broker_stops(cluster: BrokerCluster) -> None:
    """The coordinator's broker stops (a controlled shutdown moves its
    leaderships): the id is described at its new coordinator, found again
    with FindCoordinator (a new coordinator still loading answers
    COORDINATOR_LOAD_IN_PROGRESS, which is waited out)."""

    async def coordinator() -> int:
        moving = producer(cluster, "pay-moving")
        try:
            await moving.init_transactions(30_000)
        finally:
            await moving.close(5)
        async with admin(cluster) as txns:
            return (await txns.describe_transaction("pay-moving")).coordinator_id

    before = asyncio.run(coordinator())
    cluster.stop_broker(before, controlled=True)

    async def again() -> None:
        async with admin(cluster) as txns:
            found = await txns.describe_transaction("pay-moving")
            assert found.state == "Empty"
            assert found.coordinator_id in set(BROKERS) - {before}

    asyncio.run(again())

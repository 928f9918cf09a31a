"""The gRPC producer, consumer and admin clients against real brokers
(three controllers, three brokers, mutual TLS, one cluster for the module):
records produced with acks all, 1 and 0 are consumed back at their
acknowledged offsets; keys land on their murmur2 partitions; an idempotent
retry after a dropped answer writes once; compression round-trips; the
consumer follows a leader change; OFFSET_OUT_OF_RANGE resets by each
policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from broker.client.consumer import (
    ConsumerConfig,
    ConsumerRecord,
    FetchError,
    OffsetOutOfRangeError,
    OffsetResetStrategy,
)
from broker.client.errors import Outcome
from broker.client.partitioner import partition_for_key
from broker.client.producer_batch import Acks, ProducerConfig, TopicPartition
from broker.errors import Errors
from broker.grpc_client import (
    Admin,
    BrokerClientError,
    Consumer,
    DeliveryFailedError,
    MetadataCache,
    NoBrokerError,
    OffsetSpec,
    PartitionInfo,
    Producer,
    UnknownTopicError,
)
from broker.grpc_client.sync import SyncConsumer, SyncProducer
from kqproto import broker_pb2
from metadata.client import acl_binding
from partition_log.batch import Compression
from tests.broker.grpc_client.cluster import BROKERS, BrokerCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    running = BrokerCluster(tmp_path_factory.mktemp("clients"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def tls(cluster: BrokerCluster) -> Any:
    return cluster.admin_tls


async def consume(
    cluster: BrokerCluster,
    partitions: list[tuple[str, int]],
    count: int,
    *,
    from_offset: int | None = 0,
    config: ConsumerConfig | None = None,
    timeout_s: float = 20,
) -> list[ConsumerRecord]:
    """``count`` records of ``partitions`` from ``from_offset`` (None: by
    the reset policy)."""
    got: list[ConsumerRecord] = []
    async with Consumer(cluster.addresses, config, tls=tls(cluster)) as consumer:
        consumer.assign(partitions)
        if from_offset is not None:
            for tp in partitions:
                consumer.seek(tp, from_offset)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(got) < count:
            assert asyncio.get_running_loop().time() < deadline, f"only {len(got)} of {count}"
            got.extend(await consumer.poll(500))
    return got


@pytest.mark.parametrize(
    ("acks", "idempotent"), [(Acks.ALL, True), (Acks.LEADER, False), (Acks.NONE, False)]
)
def test_produce_with_each_acks_and_consume_back(
    cluster: BrokerCluster, acks: Acks, idempotent: bool
) -> None:
    topic = f"acks{int(acks)}".replace("-", "m")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    config = ProducerConfig(acks=acks, enable_idempotence=idempotent, linger_ms=2)

    async def body() -> None:
        async with Producer(cluster.addresses, config, tls=tls(cluster)) as producer:
            futures = [await producer.send(topic, b"v%d" % i, key=b"k") for i in range(20)]
            await producer.flush()
            acked = [await f for f in futures]
        assert {m.partition for m in acked} == {0}
        if acks is Acks.NONE:
            assert {m.offset for m in acked} == {-1}
        else:
            assert [m.offset for m in acked] == list(range(20))
        got = await consume(cluster, [(topic, 0)], 20)
        assert [(r.offset, r.value, r.key) for r in got] == [
            (i, b"v%d" % i, b"k") for i in range(20)
        ]

    asyncio.run(asyncio.wait_for(body(), 60))


def test_keys_land_on_their_murmur2_partitions(cluster: BrokerCluster) -> None:
    cluster.create_topic("keyed", 4, 2)
    keys = [b"key-%d" % i for i in range(40)]

    async def body() -> None:
        async with Producer(cluster.addresses, tls=tls(cluster)) as producer:
            futures = [await producer.send("keyed", b"value-" + k, key=k) for k in keys]
            acked = [await f for f in futures]
        for key, meta in zip(keys, acked, strict=True):
            assert meta.partition == partition_for_key(key, 4), key
        got = await consume(cluster, [("keyed", p) for p in range(4)], len(keys))
        for record in got:
            assert record.key is not None
            assert record.partition == partition_for_key(record.key, 4)
            assert record.value == b"value-" + record.key
        assert sorted(r.key for r in got if r.key) == sorted(keys)
        # Null keys go to the sticky partition, all of them while it is
        # not switched: a handful of small records fill no batch.
        async with Producer(cluster.addresses, tls=tls(cluster)) as producer:
            futures = [await producer.send("keyed", b"n%d" % i) for i in range(5)]
            assert len({(await f).partition for f in futures}) == 1

    asyncio.run(asyncio.wait_for(body(), 60))


class DroppingStub:
    """A broker stub whose first ``drops`` Produce answers are lost after the
    broker handled the request (the connection broke on the way back)."""

    def __init__(self, stub: Any, dropped: list[int], drops: int) -> None:
        self._stub = stub
        self._dropped = dropped
        self._drops = drops

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def Produce(self, request: Any, timeout: float | None = None) -> Any:
        answer = await self._stub.Produce(request, timeout=timeout)
        if len(self._dropped) < self._drops:
            self._dropped.append(answer.topics[0].partitions[0].base_offset)
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="answer dropped by the test",
            )
        return answer


class DroppingMetadata(MetadataCache):
    def __init__(self, *args: Any, drops: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dropped: list[int] = []
        self.drops = drops

    def stub_at(self, address: str) -> Any:
        return DroppingStub(super().stub_at(address), self.dropped, self.drops)


def test_an_idempotent_retry_after_a_dropped_answer_writes_once(cluster: BrokerCluster) -> None:
    cluster.create_topic("dedup", 1, 3)

    async def body() -> None:
        metadata = DroppingMetadata(cluster.addresses, tls=tls(cluster), drops=2)
        config = ProducerConfig(linger_ms=0, retry_backoff_ms=10)
        producer = Producer(cluster.addresses, config, metadata=metadata)
        try:
            futures = [await producer.send("dedup", b"once-%d" % i) for i in range(3)]
            acked = [await f for f in futures]
            # The broker appended the first attempt; the retry was a
            # duplicate, answered with the original offsets.
            assert metadata.dropped and metadata.dropped[0] == 0
            assert [m.offset for m in acked] == [0, 1, 2]
            assert producer.accumulator.sequencing.bumps == 0
        finally:
            await producer.close()
            await metadata.close()
        got = await consume(cluster, [("dedup", 0)], 3)
        assert [(r.offset, r.value) for r in got] == [(i, b"once-%d" % i) for i in range(3)]
        # Nothing more in the log: the high watermark is 3.
        async with Admin(cluster.addresses, tls=tls(cluster)) as admin:
            latest = await admin.list_offsets({TopicPartition("dedup", 0): OffsetSpec.LATEST})
        assert latest[TopicPartition("dedup", 0)].offset == 3

    asyncio.run(asyncio.wait_for(body(), 60))


def test_without_idempotence_the_same_dropped_answer_writes_twice(
    cluster: BrokerCluster,
) -> None:
    """The check above fails without the broker's sequence check: a
    producer without idempotence retries the same records into the log."""
    cluster.create_topic("nodedup", 1, 3)

    async def body() -> None:
        metadata = DroppingMetadata(cluster.addresses, tls=tls(cluster), drops=1)
        config = ProducerConfig(
            linger_ms=0, retry_backoff_ms=10, enable_idempotence=False, acks=Acks.ALL
        )
        producer = Producer(cluster.addresses, config, metadata=metadata)
        try:
            meta = await (await producer.send("nodedup", b"twice"))
            assert meta.offset == 1
        finally:
            await producer.close()
            await metadata.close()
        got = await consume(cluster, [("nodedup", 0)], 2)
        assert [r.value for r in got] == [b"twice", b"twice"]

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compressed_batches_round_trip(cluster: BrokerCluster, compression: Compression) -> None:
    topic = f"compressed-{compression.name.lower()}"
    cluster.create_topic(topic, 1, 3)
    values = [(b"%d " % i) * 50 for i in range(100)]

    async def body() -> None:
        config = ProducerConfig(compression_type=compression, linger_ms=20)
        async with Producer(cluster.addresses, config, tls=tls(cluster)) as producer:
            futures = [await producer.send(topic, v) for v in values]
            acked = [await f for f in futures]
        assert [m.offset for m in acked] == list(range(100))
        got = await consume(cluster, [(topic, 0)], 100)
        assert [r.value for r in got] == values

    asyncio.run(asyncio.wait_for(body(), 60))


def offset_out_of_range_setup(cluster: BrokerCluster, topic: str) -> None:
    cluster.create_topic(topic, 1, 3)

    async def body() -> None:
        async with Producer(cluster.addresses, tls=tls(cluster)) as producer:
            futures = [await producer.send(topic, b"r%d" % i) for i in range(10)]
            await asyncio.gather(*futures)
        async with Admin(cluster.addresses, tls=tls(cluster)) as admin:
            low = await admin.delete_records({TopicPartition(topic, 0): 5})
            assert low == {TopicPartition(topic, 0): 5}
            offsets = await admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.EARLIEST})
            assert offsets[TopicPartition(topic, 0)].offset == 5

    asyncio.run(asyncio.wait_for(body(), 60))


def test_offset_out_of_range_resets_by_each_policy(cluster: BrokerCluster) -> None:
    topic = "ranged"
    offset_out_of_range_setup(cluster, topic)

    async def body() -> None:
        # earliest: from the new log start offset.
        got = await consume(
            cluster,
            [(topic, 0)],
            5,
            from_offset=2,
            config=ConsumerConfig(auto_offset_reset=OffsetResetStrategy.EARLIEST),
        )
        assert [(r.offset, r.value) for r in got] == [(i, b"r%d" % i) for i in range(5, 10)]
        # latest: past everything there; a record produced afterwards comes.
        config = ConsumerConfig(auto_offset_reset=OffsetResetStrategy.LATEST)
        async with Consumer(cluster.addresses, config, tls=tls(cluster)) as consumer:
            consumer.assign([(topic, 0)])
            consumer.seek((topic, 0), 100)  # past the log end
            assert await consumer.poll(1_000) == []
            assert await consumer.position((topic, 0)) == 10
            async with Producer(cluster.addresses, tls=tls(cluster)) as producer:
                await (await producer.send(topic, b"later"))
            got = []
            for _ in range(20):
                got.extend(await consumer.poll(500))
                if got:
                    break
            assert [(r.offset, r.value) for r in got] == [(10, b"later")]
        # none: poll raises, naming the partition.
        config = ConsumerConfig(auto_offset_reset=OffsetResetStrategy.NONE)
        async with Consumer(cluster.addresses, config, tls=tls(cluster)) as consumer:
            consumer.assign([(topic, 0)])
            consumer.seek((topic, 0), 1)
            with pytest.raises(OffsetOutOfRangeError, match=f"{topic}-0"):
                for _ in range(20):
                    await consumer.poll(500)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_admin_offsets_by_time_and_refusals(cluster: BrokerCluster) -> None:
    cluster.create_topic("timed", 2, 3)

    async def body() -> None:
        async with Producer(cluster.addresses, tls=tls(cluster)) as producer:
            # Recent: older records would be past retention.ms at once.
            now = int(time.time() * 1000)
            stamps = [now - 3_000, now - 2_000, now - 1_000]
            for i, stamp in enumerate(stamps):
                await (await producer.send("timed", b"t%d" % i, partition=0, timestamp_ms=stamp))
        tp = TopicPartition("timed", 0)
        got = await consume(cluster, [("timed", 0)], 3)
        assert [r.timestamp for r in got] == stamps
        async with Admin(cluster.addresses, tls=tls(cluster)) as admin:
            by_time = await admin.list_offsets({tp: stamps[0] + 500})
            assert by_time[tp].offset == 1 and by_time[tp].timestamp == stamps[1]
            assert (await admin.list_offsets({tp: stamps[2] + 1}))[tp].offset == -1
            both = await admin.list_offsets(
                {tp: OffsetSpec.LATEST, TopicPartition("timed", 1): OffsetSpec.LATEST}
            )
            assert both[tp].offset == 3 and both[TopicPartition("timed", 1)].offset == 0
            with pytest.raises(UnknownTopicError, match="'no-such-topic'"):
                await admin.list_offsets({TopicPartition("no-such-topic", 0): OffsetSpec.LATEST})
            with pytest.raises(BrokerClientError, match="has no partition 7"):
                await admin.list_offsets({TopicPartition("timed", 7): OffsetSpec.LATEST})
            with pytest.raises(ValueError, match="not a time"):
                await admin.list_offsets({tp: -9})
            # DeleteRecords past the high watermark is refused, nothing moves.
            with pytest.raises(BrokerClientError) as refused:
                await admin.delete_records({tp: 50})
            assert refused.value.code == Errors.OFFSET_OUT_OF_RANGE
            assert (await admin.list_offsets({tp: OffsetSpec.EARLIEST}))[tp].offset == 0

    asyncio.run(asyncio.wait_for(body(), 60))


def test_producer_refuses_an_unknown_topic_and_a_bad_partition(cluster: BrokerCluster) -> None:
    cluster.create_topic("small", 1, 1)

    async def body() -> None:
        config = ProducerConfig(max_block_ms=300)
        async with Producer(cluster.addresses, config, tls=tls(cluster)) as producer:
            with pytest.raises(UnknownTopicError, match="'absent' does not exist.*300 ms"):
                await producer.send("absent", b"x")
            with pytest.raises(ValueError, match=r"partition 3 of topic 'small'"):
                await producer.send("small", b"x", partition=3)

    asyncio.run(asyncio.wait_for(body(), 30))


def test_send_fails_when_no_broker_answers() -> None:
    async def body() -> None:
        from tests.driver.cluster_util import free_ports

        (port,) = free_ports(1)
        config = ProducerConfig(max_block_ms=200)
        async with Producer([f"127.0.0.1:{port}"], config) as producer:
            with pytest.raises(BrokerClientError, match="no broker answered Metadata"):
                await producer.send("t", b"x")

    asyncio.run(asyncio.wait_for(body(), 30))


def test_sync_wrappers(cluster: BrokerCluster) -> None:
    cluster.create_topic("synced", 1, 3)
    with SyncProducer(cluster.addresses, tls=tls(cluster)) as producer:
        futures = [producer.send("synced", b"s%d" % i) for i in range(5)]
        producer.flush()
        assert [f.result(10).offset for f in futures] == list(range(5))
    with SyncConsumer(cluster.addresses, tls=tls(cluster)) as consumer:
        consumer.assign([("synced", 0)])
        consumer.seek_to_beginning()
        got: list[ConsumerRecord] = []
        for _ in range(20):
            got.extend(consumer.poll(500))
            if len(got) >= 5:
                break
        assert [r.value for r in got] == [b"s%d" % i for i in range(5)]
        assert consumer.position(("synced", 0)) == 5


def test_the_consumer_and_producer_follow_a_leader_change(cluster: BrokerCluster) -> None:
    """The partition's leader shuts down mid-stream: the producer's next
    batches go to the new leader (KIP-951 hint or a refresh), the consumer
    fetches on from there, and every acknowledged record is read once at
    its acknowledged offset."""
    cluster.create_topic("moving", 1, 3, {"min.insync.replicas": "2"})
    first = cluster.partition("moving").leader

    async def body() -> None:
        config = ConsumerConfig(fetch_max_wait_ms=200)
        async with (
            Producer(cluster.addresses, tls=tls(cluster)) as producer,
            Consumer(cluster.addresses, config, tls=tls(cluster)) as consumer,
        ):
            consumer.assign([("moving", 0)])
            consumer.seek_to_beginning()
            acked = [await (await producer.send("moving", b"a%d" % i)) for i in range(10)]
            got: list[ConsumerRecord] = []
            while len(got) < 10:
                got.extend(await consumer.poll(500))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, cluster.stop_broker, first)
            for i in range(10, 20):
                future = await producer.send("moving", b"a%d" % i)
                acked.append(await future)
            while len(got) < 20:
                got.extend(await consumer.poll(500))
            leader = consumer.metadata.partitions[TopicPartition("moving", 0)].leader
            assert leader != first and leader in BROKERS
        assert [m.offset for m in acked] == list(range(20))
        assert [(r.offset, r.value) for r in got] == [(i, b"a%d" % i) for i in range(20)]

    try:
        asyncio.run(asyncio.wait_for(body(), 90))
    finally:
        if first not in cluster.brokers:
            cluster.restart_broker(first)


def test_a_delivery_failure_says_whether_the_record_may_be_in_the_log(
    cluster: BrokerCluster,
) -> None:
    """min.insync.replicas 3 with a broker down: the leader refuses before
    appending (NOT_ENOUGH_REPLICAS), retried until delivery.timeout.ms: the
    record is definitely not in the log. The retry backoff outlasts the
    delivery timeout, so the batch expires between attempts, never while an
    attempt awaits its answer (which would make it ``info``, rightly)."""
    cluster.create_topic("strict", 1, 3, {"min.insync.replicas": "3"})
    registration = cluster.partition("strict")
    follower = next(b for b in registration.replicas if b != registration.leader)
    cluster.stop_broker(follower, controlled=True)
    try:
        # The leader's own image: it refuses before appending from then on.
        leader = registration.leader
        cluster.wait_until(
            lambda: follower not in (cluster.isr("strict", on=leader) or (follower,))
        )

        async def body() -> None:
            config = ProducerConfig(
                linger_ms=0,
                request_timeout_ms=2_000,
                delivery_timeout_ms=3_000,
                retry_backoff_ms=10_000,
                retry_backoff_max_ms=10_000,
            )
            async with Producer(cluster.addresses, config, tls=tls(cluster)) as producer:
                future = await producer.send("strict", b"x")
                with pytest.raises(DeliveryFailedError) as failed:
                    await future
            assert failed.value.outcome is Outcome.FAIL and failed.value.definite
            assert failed.value.name in ("NOT_ENOUGH_REPLICAS", "TIMEOUT")

        asyncio.run(asyncio.wait_for(body(), 30))
    finally:
        cluster.restart_broker(follower)


def test_refusals_reach_the_caller_with_kafkas_names(cluster: BrokerCluster) -> None:
    """A user allowed to write and describe a topic, but neither to read it
    nor IdempotentWrite on the cluster: an idempotent producer's records
    fail, and so does every later send (InitProducerId refused); without
    idempotence it writes; its consumer's poll raises the refusal."""
    cluster.create_topic("guarded", 1, 3)
    cluster.grant(
        acl_binding("TOPIC", "guarded", "User:alice", "WRITE"),
        acl_binding("TOPIC", "guarded", "User:alice", "DESCRIBE"),
    )
    alice = cluster.user_tls("alice")

    async def body() -> None:
        plain = ProducerConfig(acks=Acks.LEADER, enable_idempotence=False, linger_ms=0)
        async with Producer(cluster.addresses, plain, tls=alice) as producer:
            # The ACLs reach every broker's image shortly.
            meta = None
            for _ in range(50):
                try:
                    meta = await (await producer.send("guarded", b"allowed"))
                    break
                except (DeliveryFailedError, UnknownTopicError):
                    await asyncio.sleep(0.1)
            assert meta is not None and meta.offset == 0
        async with Producer(cluster.addresses, tls=alice) as producer:
            future = await producer.send("guarded", b"idempotent")
            with pytest.raises(BrokerClientError) as refused:
                await future
            assert refused.value.name == "CLUSTER_AUTHORIZATION_FAILED"
            assert "IDEMPOTENT_WRITE" in str(refused.value)
            with pytest.raises(BrokerClientError, match="CLUSTER_AUTHORIZATION_FAILED"):
                await producer.send("guarded", b"later")
        # A topic alice may not describe: refused at once, not waited for.
        cluster.create_topic("hidden", 1, 1)
        patient = ProducerConfig(max_block_ms=30_000)
        async with Producer(cluster.addresses, patient, tls=alice) as producer:
            started = asyncio.get_running_loop().time()
            with pytest.raises(BrokerClientError) as hidden:
                await producer.send("hidden", b"x")
            assert hidden.value.name == "TOPIC_AUTHORIZATION_FAILED"
            assert "not allowed DESCRIBE on topic hidden" in hidden.value.message
            assert asyncio.get_running_loop().time() - started < 10
        async with Admin(cluster.addresses, tls=alice) as admin:
            with pytest.raises(BrokerClientError, match="TOPIC_AUTHORIZATION_FAILED"):
                await admin.topic("hidden")
        config = ConsumerConfig(auto_offset_reset=OffsetResetStrategy.EARLIEST)
        async with Consumer(cluster.addresses, config, tls=alice) as consumer:
            consumer.assign([("guarded", 0)])
            consumer.seek(("guarded", 0), 0)
            with pytest.raises(FetchError, match="guarded-0.*TOPIC_AUTHORIZATION_FAILED"):
                for _ in range(20):
                    await consumer.poll(500)

    asyncio.run(asyncio.wait_for(body(), 60))


class CountingStub:
    """A broker stub that counts the Produce requests in flight at once."""

    def __init__(self, stub: Any, counts: dict[str, int]) -> None:
        self._stub = stub
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def Produce(self, request: Any, timeout: float | None = None) -> Any:
        self._counts["now"] += 1
        self._counts["max"] = max(self._counts["max"], self._counts["now"])
        try:
            return await self._stub.Produce(request, timeout=timeout)
        finally:
            self._counts["now"] -= 1


class CountingMetadata(MetadataCache):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts = {"now": 0, "max": 0}

    def stub_at(self, address: str) -> Any:
        return CountingStub(super().stub_at(address), self.counts)


def test_batches_are_pipelined_at_most_five_per_partition(cluster: BrokerCluster) -> None:
    cluster.create_topic("pipelined", 1, 3)

    async def body() -> None:
        metadata = CountingMetadata(cluster.addresses, tls=tls(cluster))
        config = ProducerConfig(batch_size=256, linger_ms=0)
        producer = Producer(cluster.addresses, config, metadata=metadata)
        try:
            futures = [await producer.send("pipelined", b"%03d" % i * 20) for i in range(400)]
            acked = [await f for f in futures]
        finally:
            await producer.close()
            await metadata.close()
        assert [m.offset for m in acked] == list(range(400))
        # One partition: each request holds one batch of it.
        assert 1 < metadata.counts["max"] <= 5, metadata.counts

    asyncio.run(asyncio.wait_for(body(), 60))


class VanishingMetadata(MetadataCache):
    """Brokers that answer the first Metadata, then nothing at all."""

    gone = False

    async def partition_count(self, topic: str, max_wait_ms: int) -> int:
        count = await super().partition_count(topic, max_wait_ms)
        self.gone = True
        return count

    async def _do_refresh(self) -> None:
        if self.gone:
            self._refresh_due = True
            raise NoBrokerError("no broker answered Metadata (the test took them away)")
        await super()._do_refresh()

    def stub_at(self, address: str) -> Any:
        if self.gone:
            raise NoBrokerError("the test took the brokers away")
        return super().stub_at(address)


def test_records_expire_by_the_delivery_timeout_while_no_broker_answers(
    cluster: BrokerCluster,
) -> None:
    async def body() -> None:
        metadata = VanishingMetadata(cluster.addresses, tls=tls(cluster))
        config = ProducerConfig(linger_ms=0, request_timeout_ms=100, delivery_timeout_ms=600)
        producer = Producer(cluster.addresses, config, metadata=metadata)
        try:
            future = await producer.send("vanishing", b"lost", partition=0)
            with pytest.raises(DeliveryFailedError) as failed:
                await asyncio.wait_for(future, 10)
        finally:
            await producer.close(timeout_s=1)
            await metadata.close()
        assert failed.value.name == "TIMEOUT" and failed.value.definite

    cluster.create_topic("vanishing", 1, 1)
    asyncio.run(asyncio.wait_for(body(), 30))


def test_metadata_ignores_an_older_leader_epoch() -> None:
    """KIP-320: a stale broker's answer does not send the client back."""
    cache = MetadataCache(["127.0.0.1:1"])
    tp = TopicPartition("t", 0)
    cache.brokers = {1: "127.0.0.1:1", 2: "127.0.0.1:2"}
    assert cache.apply_leader_hint(tp, 2, 5)
    assert not cache.apply_leader_hint(tp, 1, 4) or cache.partitions[tp].leader == 2
    assert cache.partitions[tp].leader == 2
    response = broker_pb2.MetadataResponse(
        brokers=[
            broker_pb2.NodeEndpoint(node_id=1, host="127.0.0.1", port=1),
            broker_pb2.NodeEndpoint(node_id=2, host="127.0.0.1", port=2),
        ],
        topics=[
            broker_pb2.MetadataTopic(
                name="t",
                partitions=[broker_pb2.MetadataPartition(partition=0, leader_id=1, leader_epoch=3)],
            )
        ],
    )
    cache._take(response)
    assert (cache.partitions[tp].leader, cache.partitions[tp].leader_epoch) == (2, 5)
    assert cache.topics == {"t": 1}


def test_client_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one bootstrap"):
        MetadataCache([])
    with pytest.raises(ValueError, match="enable_idempotence requires acks=all"):
        ProducerConfig(acks=Acks.LEADER)
    with pytest.raises(ValueError, match="timeout_ms must be >= 1"):
        Admin(["127.0.0.1:1"], timeout_ms=0)


class OneTopic(MetadataCache):
    """Metadata that knows one single-partition topic and asks no broker."""

    async def partition_count(self, topic: str, max_wait_ms: int) -> int:
        self.topics[topic] = 1
        return 1

    async def refresh(self, topics: Any = ()) -> None:
        self._refresh_due = False


class BrokenSender(Producer):
    async def _run_once(self) -> int:
        raise RuntimeError("a bug in the sender")


def test_a_sender_that_dies_fails_its_records_and_later_sends() -> None:
    async def body() -> None:
        metadata = OneTopic(["127.0.0.1:1"])
        producer = BrokenSender(["127.0.0.1:1"], metadata=metadata)
        future = await producer.send("t", b"x")
        with pytest.raises(BrokerClientError, match="sender failed.*a bug in the sender"):
            await asyncio.wait_for(future, 5)
        with pytest.raises(BrokerClientError, match="sender failed"):
            await producer.send("t", b"y")
        await producer.close(timeout_s=1)

    asyncio.run(asyncio.wait_for(body(), 10))


class BrokenConsumer(Consumer):
    def _take(self, response: Any, offsets: Any) -> None:
        raise RuntimeError("a bug reading the answer")


def test_a_consumer_bug_reaches_poll(cluster: BrokerCluster) -> None:
    cluster.create_topic("broken", 1, 1)

    async def body() -> None:
        async with BrokenConsumer(cluster.addresses, tls=tls(cluster)) as consumer:
            consumer.assign([("broken", 0)])
            consumer.seek(("broken", 0), 0)
            with pytest.raises(RuntimeError, match="a bug reading the answer"):
                for _ in range(20):
                    await consumer.poll(500)

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_kip951_leader_hint_moves_the_partition_without_a_refresh() -> None:
    cache = MetadataCache(["127.0.0.1:1"])
    tp = TopicPartition("t", 0)
    cache.brokers = {1: "127.0.0.1:1"}
    cache.partitions[tp] = PartitionInfo("t", 0, 1, 4, (1, 2), (1, 2))
    cache._refresh_due = False
    endpoint = broker_pb2.NodeEndpoint(node_id=2, host="127.0.1.2", port=9092)
    assert cache.apply_leader_hint(tp, 2, 5, [endpoint])
    assert cache.leaders() == {tp: 2} and cache.brokers[2] == "127.0.1.2:9092"
    assert cache.partitions[tp].replicas == (1, 2)
    assert not cache.refresh_due()
    # A hint naming a broker whose address it does not know asks for one.
    assert not cache.apply_leader_hint(tp, 3, 6)
    assert cache.refresh_due() and cache.leaders() == {tp: 2}


def test_the_leaders_are_computed_once_per_change_of_the_metadata() -> None:
    cache = MetadataCache(["127.0.0.1:1"])
    tp = TopicPartition("t", 0)

    def answer(leader: int, epoch: int) -> broker_pb2.MetadataResponse:
        return broker_pb2.MetadataResponse(
            brokers=[
                broker_pb2.NodeEndpoint(node_id=n, host="127.0.0.1", port=9090 + n) for n in (1, 2)
            ],
            topics=[
                broker_pb2.MetadataTopic(
                    name="t",
                    partitions=[
                        broker_pb2.MetadataPartition(
                            partition=0, leader_id=leader, leader_epoch=epoch
                        )
                    ],
                )
            ],
        )

    cache._take(answer(1, 4))
    first = cache.leaders()
    assert first == {tp: 1} and cache.leaders() is first
    cache._take(answer(2, 5))  # a refresh
    assert cache.leaders() == {tp: 2}
    assert cache.apply_leader_hint(tp, 1, 6)  # a KIP-951 hint
    assert cache.leaders() == {tp: 1}
    cache._take(answer(-1, 7))  # an election in progress
    assert cache.leaders() == {tp: None}

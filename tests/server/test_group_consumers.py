"""Consumers in a group on broker processes end to end (in this process,
127.0.0.1, mutual TLS): three consumers subscribe to a 6-partition topic,
share its partitions (each owned by one consumer at a time, as the rebalance
callbacks see it), consume every record and commit; one closes (leaves the
group) and the others take its partitions from its committed offsets: no
record skipped, each new owner starting exactly at the last commit."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from broker.client.consumer import ConsumerConfig, ConsumerRecord, OffsetResetStrategy
from broker.client.producer_batch import TopicPartition
from broker.group.shard import GroupConfig
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.group import CommitFailedError, RebalanceListener
from broker.grpc_client.producer import Producer
from metadata.client import MetadataClient, NewTopic
from quorum.driver.identity import Identity
from server.broker import BrokerProcess
from tests.driver.cluster_util import CLUSTER_ID, free_ports
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import BROKERS, Controllers, stop_all, wait_for
from tests.server.test_group_process import group_broker

PARTITIONS = 6
PER_PHASE = 300


class World:
    """What the three consumers did, as their callbacks and polls saw it."""

    def __init__(self) -> None:
        self.owner: dict[TopicPartition, str] = {}
        self.last_commit: dict[TopicPartition, int] = {}
        self.starts: list[tuple[TopicPartition, int, int]] = []  # (tp, start, last commit)
        self.seen: dict[tuple[int, int], int] = {}  # (partition, offset) -> times
        self.errors: list[str] = []


class Tracking(RebalanceListener):
    def __init__(self, name: str, world: World) -> None:
        self.name, self.world = name, world
        self.consumer: Consumer | None = None

    async def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        assert self.consumer is not None
        for tp in partitions:
            if tp in self.world.owner:
                self.world.errors.append(f"{tp} given to {self.name}, owned by "
                                         f"{self.world.owner[tp]}")  # fmt: skip
            self.world.owner[tp] = self.name
            start = await self.consumer.position(tp)
            self.world.starts.append((tp, start, self.world.last_commit.get(tp, 0)))

    async def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        assert self.consumer is not None
        # Commit what was processed before giving the partitions up.
        positions = {tp: await self.consumer.position(tp) for tp in partitions}
        await commit(self.consumer, self.world, positions)
        self.release(partitions)

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self.release(partitions)

    def release(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if self.world.owner.get(tp) != self.name:
                self.world.errors.append(f"{self.name} released {tp} it did not own")
            self.world.owner.pop(tp, None)


async def start(
    cluster: Controllers, brokers: dict[int, BrokerProcess], session_ms: int, partitions: int
) -> None:
    """The controllers, then the brokers (into ``brokers``) with a short
    group session and heartbeat, unfenced; then topic "t" of
    ``partitions``, replication factor 3."""
    for node in cluster.voters:
        await cluster.start(node)
    for broker_id, port in zip(BROKERS, free_ports(len(BROKERS)), strict=True):
        process = group_broker(cluster, broker_id, port)
        fast = GroupConfig(session_timeout_ms=session_ms, heartbeat_interval_ms=100)
        process.settings = dataclasses.replace(process.settings, groups=fast)
        process.groups.config = fast
        brokers[broker_id] = process
        await process.start()
    await wait_for(lambda: all(not b.fenced for b in brokers.values()))
    admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
    async with MetadataClient(
        list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
    ) as admin:
        await admin.create_topics([NewTopic("t", partitions, 3)])


async def commit(consumer: Consumer, world: World, positions: dict[TopicPartition, int]) -> None:
    try:
        await consumer.commit(positions)
    except CommitFailedError:
        return  # a rebalance moved on: the next owner starts at the last commit
    for tp, offset in positions.items():
        world.last_commit[tp] = offset


def test_three_consumers_share_a_topic_and_take_over_a_leaving_members_partitions(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        brokers: dict[int, BrokerProcess] = {}
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        consumers: dict[str, Consumer] = {}
        loops: dict[str, asyncio.Task[None]] = {}
        try:
            await start(cluster, brokers, 6_000, PARTITIONS)
            addresses = [b.address for b in brokers.values()]

            async def produce(phase: int) -> None:
                async with Producer(addresses, tls=admin_tls) as producer:
                    sent = [
                        await producer.send("t", b"%d-%d" % (phase, i), partition=i % PARTITIONS)
                        for i in range(PER_PHASE)
                    ]
                    await producer.flush()
                    for future in sent:
                        await future

            await produce(0)
            world = World()
            config = ConsumerConfig(auto_offset_reset=OffsetResetStrategy.EARLIEST)
            for name in ("a", "b", "c"):
                consumer = Consumer(
                    addresses,
                    config,
                    tls=admin_tls,
                    group_id="g",
                    client_id=name,
                    enable_auto_commit=False,
                )
                listener = Tracking(name, world)
                listener.consumer = consumer
                consumer.subscribe(["t"], listener=listener)
                consumers[name] = consumer

            async def run(consumer: Consumer) -> None:
                while True:
                    records: list[ConsumerRecord] = await consumer.poll(200)
                    for record in records:
                        key = (record.partition, record.offset)
                        world.seen[key] = world.seen.get(key, 0) + 1
                    if records:
                        positions = {tp: await consumer.position(tp)
                                     for tp in consumer.assignment()}  # fmt: skip
                        await commit(consumer, world, positions)

            for name, consumer in consumers.items():
                loops[name] = asyncio.ensure_future(run(consumer))

            def shared() -> bool:
                return len(world.seen) == PER_PHASE and all(
                    c.assignment() for c in consumers.values()
                )

            await wait_for(shared, 60)
            assert not world.errors, world.errors
            # "a" stops polling and closes: it leaves the group.
            loops.pop("a").cancel()
            closing = consumers.pop("a")
            await closing.close()
            await produce(1)
            await wait_for(
                lambda: (
                    len(world.seen) == 2 * PER_PHASE
                    and {tp for c in consumers.values() for tp in c.assignment()}
                    == {TopicPartition("t", p) for p in range(PARTITIONS)}
                ),
                60,
            )
            assert not world.errors, world.errors
            assert set(world.owner.values()) <= {"b", "c"}
            # Each new owner started exactly where the last commit left off.
            assert [s for s in world.starts if s[1] != s[2]] == []
            moved = {tp for tp, _, last in world.starts if last > 0}
            assert moved, "no partition changed hands after a commit"
        finally:
            for task in loops.values():
                task.cancel()
            await asyncio.gather(*loops.values(), return_exceptions=True)
            for consumer in consumers.values():
                await consumer.close(timeout_ms=2_000)
            await stop_all(cluster, *brokers.values())

    asyncio.run(asyncio.wait_for(body(), 150))


def test_a_static_members_next_instance_takes_its_partitions_back_without_a_rebalance(
    tmp_path: Path,
) -> None:
    """Two members, one static (``group_instance_id``): when the static one
    closes (epoch -2) the other is not given its partitions; the next
    consumer with the same instance id gets exactly them back, the other's
    untouched; when that one closes too and its session ends, the other
    takes every partition."""

    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        brokers: dict[int, BrokerProcess] = {}
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        consumers: list[Consumer] = []
        try:
            await start(cluster, brokers, 4_000, 4)
            addresses = [b.address for b in brokers.values()]

            def consumer(instance: str | None) -> Consumer:
                made = Consumer(
                    addresses,
                    tls=admin_tls,
                    group_id="static",
                    group_instance_id=instance,
                    enable_auto_commit=False,
                )
                made.subscribe(["t"])
                consumers.append(made)
                return made

            async def poll_until(check: object, timeout_s: float, *polled: Consumer) -> None:
                deadline = asyncio.get_running_loop().time() + timeout_s
                while not check():  # type: ignore[operator]
                    assert asyncio.get_running_loop().time() < deadline, "timed out"
                    await asyncio.gather(*(c.poll(100) for c in polled))

            a, b = consumer("a-1"), consumer(None)

            def split() -> bool:
                return len(a.assignment()) == 2 and len(b.assignment()) == 2

            await poll_until(split, 60, a, b)
            held_a, held_b = a.assignment(), b.assignment()
            await a.close()  # static: leaves for now, keeping its partitions
            for _ in range(10):  # about a second, well inside the session
                await b.poll(100)
            assert b.assignment() == held_b
            again = consumer("a-1")
            await poll_until(lambda: bool(again.assignment()), 30, again, b)
            assert again.assignment() == held_a and b.assignment() == held_b
            await again.close()
            await poll_until(lambda: len(b.assignment()) == 4, 30, b)
        finally:
            for c in consumers:
                await c.close(timeout_ms=2_000)
            await stop_all(cluster, *brokers.values())

    asyncio.run(asyncio.wait_for(body(), 150))

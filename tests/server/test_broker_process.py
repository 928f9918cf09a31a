"""Broker processes (server/broker.py) end to end, in this process on
127.0.0.1 with mutual TLS: three controllers and three brokers, a topic
with replication factor 3 and min ISR 2, acks=all produces through a plain
gRPC stub, the leader stopped and produces going on at its successor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from prometheus_client import generate_latest

from broker.errors import Errors
from kqproto import broker_pb2, broker_pb2_grpc
from metadata.active import ControllerSettings
from metadata.authorizer import AuthorizerSettings
from metadata.client import ConfigOp, ConfigResource, MetadataClient, NewTopic
from metadata.image import PartitionRegistration
from partition_log.batch import build_batch, decode_records, split_batches
from partition_log.records import Record
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.storage_format import format_storage
from quorum.driver.tls import dial
from server.broker import BrokerProcess, BrokerSettings
from server.controller import controller_server
from tests.driver.cluster_util import CLUSTER_ID, Cluster, free_ports
from tests.metadata.test_metadata_replication import OPTIONS

SETTINGS = ControllerSettings(
    broker_session_timeout_ms=3_000, broker_heartbeat_interval_ms=200, tick_interval_ms=50
)
SUPER_USERS = frozenset({"User:admin", "Broker:11", "Broker:12", "Broker:13"})
AUTHORIZER = AuthorizerSettings(super_users=SUPER_USERS)
BROKERS = (11, 12, 13)
T = TypeVar("T")


class Controllers(Cluster):
    def make_server(self, config: NodeConfig) -> NodeServer:
        return controller_server(config, SETTINGS, authorizer=AUTHORIZER)


def broker(cluster: Controllers, broker_id: int, port: int, *, new: bool = True) -> BrokerProcess:
    """Broker ``broker_id`` on ``port``: formatted first when ``new``, else
    restarted over the directories it had."""
    metadata_dir = cluster.root / f"broker-{broker_id}" / "metadata"
    logs = cluster.root / f"broker-{broker_id}" / "logs"
    if new:
        format_storage(metadata_dir, CLUSTER_ID, broker_id, cluster.voters.keys())
        logs.mkdir(parents=True)
    return BrokerProcess(
        BrokerSettings(
            broker_id,
            CLUSTER_ID,
            dict(cluster.voters),
            metadata_dir,
            [logs],
            f"127.0.0.1:{port}",
            rack=f"rack-{broker_id % 2}",
            tls=cluster.tls_files(Identity.node(CLUSTER_ID, IdentityRole.BROKER, broker_id)),
            options=OPTIONS,
            authorizer=AUTHORIZER,
            heartbeat_interval_ms=200,
            tick_interval_ms=100,
            controlled_shutdown_timeout_s=10,
        )
    )


async def stop_all(cluster: Controllers, *brokers: BrokerProcess | None) -> None:
    """A test's end: each broker stopped as a crash would, then every
    controller."""
    for process in brokers:
        if process is not None:
            await process.stop(controlled=False)
    for node in list(cluster.servers):
        await cluster.stop(node)


def produce(value: bytes, topic: str = "t", acks: int = -1) -> broker_pb2.ProduceRequest:
    """One record ``value`` (key ``k``) to partition 0 of ``topic``."""
    return broker_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=10_000,
        topics=[
            broker_pb2.ProduceTopicData(
                name=topic,
                partitions=[
                    broker_pb2.ProducePartitionData(
                        partition=0,
                        records=build_batch([Record(0, int(time.time() * 1000), b"k", value)]),
                    )
                ],
            )
        ],
    )


def fetch(offset: int, topic: str = "t") -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(
        max_wait_ms=0,
        topics=[
            broker_pb2.FetchTopic(
                topic=topic,
                partitions=[
                    broker_pb2.FetchPartition(
                        partition=0,
                        fetch_offset=offset,
                        current_leader_epoch=-1,
                        last_fetched_epoch=-1,
                    )
                ],
            )
        ],
    )


async def wait_for(check: Callable[[], T | None], timeout_s: float = 20.0) -> T:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def start_all(
    cluster: Controllers, brokers: dict[int, BrokerProcess], ids: Sequence[int]
) -> None:
    """Start the controllers, then a broker per id on a free port (each put
    in ``brokers`` as it starts, so the caller's ``finally`` stops what
    started), and wait until every broker is registered and unfenced."""
    for node in cluster.voters:
        await cluster.start(node)
    for broker_id, port in zip(ids, free_ports(len(ids)), strict=True):
        brokers[broker_id] = broker(cluster, broker_id, port)
        await brokers[broker_id].start()
    await wait_for(lambda: all(not b.fenced for b in brokers.values()))


def test_three_brokers_replicate_and_fail_over(tmp_path: Path) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        brokers: dict[int, BrokerProcess] = {}
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        try:
            await start_all(cluster, brokers, BROKERS)
            async with MetadataClient(
                list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
            ) as admin:
                created = await admin.create_topics(
                    [NewTopic("t", 1, 3, configs={"min.insync.replicas": "2"})]
                )
                assert created.topics[0].error == 0, created

            def partition() -> PartitionRegistration | None:
                image = brokers[BROKERS[0]].image
                topic = image.topic_by_name("t")
                return None if topic is None else topic.partition(0)

            first = await wait_for(partition)
            leader = first.leader
            assert leader in BROKERS and sorted(first.isr) == list(BROKERS)
            await wait_for(
                lambda: all(b.image.topic_by_name("t") is not None for b in brokers.values())
            )
            credentials = admin_tls.channel_credentials()
            async with dial(brokers[leader].address, credentials) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                for i in range(5):
                    answer = (await stub.Produce(produce(b"v%d" % i))).topics[0].partitions[0]
                    assert (answer.error, answer.base_offset) == (Errors.NONE, i), answer
                got = (await stub.Fetch(fetch(0))).topics[0].partitions[0]
                assert got.error == Errors.NONE and got.high_watermark == 5
                values = [r.value for b in split_batches(got.records) for r in decode_records(b)]
                assert values == [b"v%d" % i for i in range(5)]

            # The leader goes (a controlled shutdown): another leads.
            await brokers.pop(leader).stop()

            def moved() -> PartitionRegistration | None:
                topic = next(iter(brokers.values())).image.topic_by_name("t")
                p = None if topic is None else topic.partition(0)
                return p if p is not None and p.leader not in (leader, -1) else None

            second = await wait_for(moved)
            assert second.leader_epoch > first.leader_epoch
            async with dial(brokers[second.leader].address, credentials) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)

                async def produced() -> broker_pb2.ProducePartitionResponse:
                    return (await stub.Produce(produce(b"after"))).topics[0].partitions[0]

                answer = await produced()
                for _ in range(50):
                    if answer.error == Errors.NONE:
                        break
                    await asyncio.sleep(0.1)
                    answer = await produced()
                assert (answer.error, answer.base_offset) == (Errors.NONE, 5), answer
                got = (await stub.Fetch(fetch(0))).topics[0].partitions[0]
                assert got.high_watermark == 6
                values = [r.value for b in split_batches(got.records) for r in decode_records(b)]
                assert values == [*(b"v%d" % i for i in range(5)), b"after"]
        finally:
            await stop_all(cluster, *brokers.values())

    asyncio.run(asyncio.wait_for(body(), 90))


def test_a_crashed_follower_leaves_the_isr_and_comes_back(tmp_path: Path) -> None:
    """A follower that stops without a controlled shutdown leaves the ISR
    (the leader's ISR expiration or the controller's session timeout), the
    two others go on taking acks=all produces, and the follower restarted
    over its directories catches up and is added back (the leader's
    AlterPartition). InitProducerId draws from the controller's blocks."""

    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        brokers: dict[int, BrokerProcess] = {}
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        try:
            for node in cluster.voters:
                await cluster.start(node)
            ports = dict(zip(BROKERS, free_ports(len(BROKERS)), strict=True))
            for broker_id, port in ports.items():
                brokers[broker_id] = broker(cluster, broker_id, port)
                await brokers[broker_id].start()
            async with MetadataClient(
                list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
            ) as admin:
                await wait_for(lambda: all(not b.fenced for b in brokers.values()))
                await admin.alter_configs(
                    {ConfigResource.cluster(): [ConfigOp("replica.lag.time.max.ms", "1000")]}
                )
                await admin.create_topics(
                    [NewTopic("t", 1, 3, configs={"min.insync.replicas": "2"})]
                )

            def registration(of: int) -> PartitionRegistration | None:
                topic = brokers[of].image.topic_by_name("t")
                return None if topic is None else topic.partition(0)

            def with_isr(of: int, member: int, present: bool) -> PartitionRegistration | None:
                p = registration(of)
                return p if p is not None and (member in p.isr) == present else None

            some = next(iter(brokers))
            first = await wait_for(lambda: registration(some))
            leader = first.leader
            follower = next(b for b in BROKERS if b != leader)
            credentials = admin_tls.channel_credentials()
            async with dial(brokers[leader].address, credentials) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                ids = await stub.InitProducerId(
                    broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
                )
                assert ids.error == Errors.NONE and ids.producer_id >= 0, ids
                answer = (await stub.Produce(produce(b"a"))).topics[0].partitions[0]
                assert (answer.error, answer.base_offset) == (Errors.NONE, 0), answer

                await brokers.pop(follower).stop(controlled=False)
                shrunk = await wait_for(lambda: with_isr(leader, follower, False))
                assert sorted(shrunk.isr) == sorted(b for b in BROKERS if b != follower)
                assert shrunk.leader == leader
                # The leader's metrics count the partition under-replicated,
                # not under min ISR.
                metrics = brokers[leader].node.registry
                labels = {"node": str(leader)}
                await wait_for(
                    lambda: (
                        metrics.get_sample_value("kq_broker_under_replicated_partitions", labels)
                        == 1
                    )
                )
                assert metrics.get_sample_value("kq_broker_under_min_isr_partitions", labels) == 0
                assert metrics.get_sample_value("kq_broker_leader_partitions", labels) == 1
                assert metrics.get_sample_value("kq_broker_fenced", labels) == 0
                answer = (await stub.Produce(produce(b"b"))).topics[0].partitions[0]
                assert (answer.error, answer.base_offset) == (Errors.NONE, 1), answer

                brokers[follower] = broker(cluster, follower, ports[follower], new=False)
                await brokers[follower].start()
                grown = await wait_for(lambda: with_isr(leader, follower, True), 30)
                assert sorted(grown.isr) == list(BROKERS)
                await wait_for(
                    lambda: (
                        metrics.get_sample_value("kq_broker_under_replicated_partitions", labels)
                        == 0
                    )
                )
                answer = (await stub.Produce(produce(b"c"))).topics[0].partitions[0]
                assert (answer.error, answer.base_offset) == (Errors.NONE, 2), answer
                # The data plane's metrics, in the exporter's text: three
                # acks=all produces of one record, answered and timed; the
                # followers fetched them; the follower's return is an ISR
                # expansion of the leader's.
                await wait_for(
                    lambda: metrics.get_sample_value("kq_broker_isr_expands_total", labels)
                )
                text = generate_latest(metrics).decode()
                tag = f'node="{leader}"'
                for line in (
                    f"kq_broker_messages_in_total{{{tag}}} 3.0",
                    f'kq_broker_requests_total{{{tag},request="Produce"}} 3.0',
                    f'kq_broker_request_latency_seconds_count{{{tag},request="Produce"}} 3.0',
                    f'kq_broker_request_errors_total{{error="NONE",{tag},request="Produce"}} 3.0',
                    f'kq_broker_purgatory_size{{{tag},operation="Produce"}} 0.0',
                ):
                    assert line in text, line
                bytes_in = metrics.get_sample_value("kq_broker_bytes_in_total", labels)
                replicated = metrics.get_sample_value(
                    "kq_broker_replication_bytes_out_total", labels
                )
                assert bytes_in and replicated and replicated >= bytes_in
            # The restarted follower holds every record.
            log = brokers[follower].replicas.logs.log(brokers[follower].replicas.resolve("t", 0))
            assert log is not None
            await wait_for(lambda: log.log_end_offset == 3)
        finally:
            await stop_all(cluster, *brokers.values())

    asyncio.run(asyncio.wait_for(body(), 90))


def test_a_log_directory_that_does_not_load_stops_the_broker(tmp_path: Path) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        process: BrokerProcess | None = None
        try:
            for node in cluster.voters:
                await cluster.start(node)
            (port,) = free_ports(1)
            process = broker(cluster, BROKERS[0], port)
            # Not a partition's directory name: the load refuses it.
            (tmp_path / f"broker-{BROKERS[0]}" / "logs" / "not a partition").mkdir()
            await process.start()
            failure = await wait_for(lambda: process.failure if process else None)
            assert "cannot load its log directories" in failure
            assert "not a partition" in failure
            assert not process.replicas.replicas
        finally:
            await stop_all(cluster, process)

    asyncio.run(asyncio.wait_for(body(), 60))

"""The broker's gRPC data plane (broker/service.py) on a real gRPC server on
127.0.0.1 with mutual TLS (certificates from server.certs), over a
ReplicaManager on in-memory log directories fed images replayed from
metadata records. A follower is a second ReplicaManager in the same test,
replicating over the ReplicaFetch stream as the broker process does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.codec import fetch_answers, replica_fetch_request
from broker.errors import Errors
from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import LogManager
from broker.producer_ids import BlockProducerIds, CountingBlocks
from broker.purgatory import Operation
from broker.replica import AlterPartitionRequest
from broker.replica_manager import ReplicaManager
from broker.service import BrokerService, ServiceSettings
from kqproto import broker_pb2, broker_pb2_grpc
from metadata.acls import AclOperation, AclPermission, AclResourceType, PatternType
from metadata.authorizer import AuthorizerSettings
from metadata.image import TopicIdPartition
from metadata.records import AccessControlEntryRecord, ConfigRecord
from metadata.records import Record as MetadataRecord
from partition_log.batch import BatchScanner, build_batch
from partition_log.log import PartitionLog
from partition_log.records import Record
from quorum.driver.identity import Identity, Role
from quorum.driver.tls import TlsFiles, dial
from server.certs import create_ca, issue
from tests.broker.images import (
    BROKER_RESOURCE,
    EPOCHS,
    Metadata,
    change,
    fence,
    topic,
    topic_config,
    unfence,
)

CLUSTER = "svc-test"
E = Errors


def batch(*values: bytes, timestamp: int = 1000) -> bytes:
    return build_batch([Record(i, timestamp + i, b"k", v) for i, v in enumerate(values)])


def acl(
    acl_id: str,
    principal: str,
    operation: AclOperation,
    name: str = "t",
    *,
    resource: AclResourceType = AclResourceType.TOPIC,
) -> AccessControlEntryRecord:
    return AccessControlEntryRecord(
        acl_id,
        resource,
        name,
        PatternType.LITERAL,
        principal,
        "*",
        operation,
        AclPermission.ALLOW,
    )


@dataclass
class Certs:
    folder: Path

    def credentials(self, identity: Identity) -> grpc.ChannelCredentials:
        paths = issue(self.folder, identity, hosts=("127.0.0.1",))
        return TlsFiles(self.folder / "ca.crt", paths.cert, paths.key).channel_credentials()

    def user(self, name: str) -> grpc.ChannelCredentials:
        return self.credentials(Identity.user(CLUSTER, name))

    def broker(self, broker_id: int) -> grpc.ChannelCredentials:
        return self.credentials(Identity.node(CLUSTER, Role.BROKER, broker_id))


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    create_ca(tmp_path, CLUSTER)
    return Certs(tmp_path)


class Brokers:
    """Broker 1 (serving) and broker 2 (its follower) over one metadata log."""

    def __init__(
        self,
        *records: MetadataRecord,
        super_users: frozenset[str] = frozenset({"User:admin", "Broker:2"}),
    ) -> None:
        self.md = Metadata(*records)
        self.dirs = {b: MemoryLogDirectory(f"broker-{b}") for b in (1, 2)}
        self.managers = {b: ReplicaManager(b, LogManager([self.dirs[b]])) for b in (1, 2)}
        self.now = 1_000_000
        for manager in self.managers.values():
            manager.apply_delta(self.md.image, self.now)
        self.alters: list[tuple[TopicIdPartition, AlterPartitionRequest]] = []
        self.service = BrokerService(
            self.managers[1],
            ServiceSettings(
                CLUSTER,
                # Brokers are super users by default, as Kafka's usually are.
                authorizer=AuthorizerSettings(super_users=super_users),
            ),
            producer_ids=BlockProducerIds(CountingBlocks(first=5000, block_size=2)),
            on_alter_partition=lambda key, request: self.alters.append((key, request)),
            controller_id=lambda: 9,
            now_ms=lambda: self.now,
        )

    def step(self, *records: MetadataRecord) -> None:
        self.md.step(*records)
        for manager in self.managers.values():
            manager.apply_delta(self.md.image, self.now)
        self.service.wake()

    def follower_fetch(self, max_wait_ms: int = 0) -> broker_pb2.FetchRequest | None:
        requests = self.managers[2].next_fetch_requests(EPOCHS[2]).get(1)
        if not requests:
            return None
        self.pending = requests
        return replica_fetch_request(2, EPOCHS[2], requests, self.md.image, max_wait_ms=max_wait_ms)

    def follower_answer(self, response: Any) -> None:
        answers = fetch_answers(response, self.pending)
        for key, request in self.pending.items():
            self.managers[2].step_fetch_answer(key, request, answers[key], self.now)

    def log(self, broker_id: int, name: str) -> PartitionLog:
        manager = self.managers[broker_id]
        found = manager.logs.log(manager.resolve(name, 0))
        assert found is not None
        return found

    def snapshot(self, broker_id: int = 1) -> dict[str, bytes]:
        found = {}
        logdir = self.dirs[broker_id]
        for name in logdir.list():
            directory = logdir.open(name)
            for file_name in directory.list():
                handle = directory.open(file_name)
                found[f"{name}/{file_name}"] = handle.read(0, handle.size)
        return found


@asynccontextmanager
async def serving(brokers: Brokers, certs: Certs | None) -> AsyncIterator[str]:
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(brokers.service, server)
    if certs is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        paths = issue(certs.folder, Identity.node(CLUSTER, Role.BROKER, 1), hosts=("127.0.0.1",))
        tls = TlsFiles(certs.folder / "ca.crt", paths.cert, paths.key)
        port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


def produce(
    name: str, partition: int, records: bytes, acks: int = 1, timeout_ms: int = 5000
) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topics=[
            broker_pb2.ProduceTopicData(
                name=name,
                partitions=[broker_pb2.ProducePartitionData(partition=partition, records=records)],
            )
        ],
    )


def fetch(name: str, partition: int, offset: int, **options: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(
        max_wait_ms=options.get("max_wait_ms", 0),
        min_bytes=options.get("min_bytes", 0),
        max_bytes=options.get("max_bytes", 0),
        topics=[
            broker_pb2.FetchTopic(
                topic=name,
                partitions=[
                    broker_pb2.FetchPartition(
                        partition=partition,
                        fetch_offset=offset,
                        current_leader_epoch=-1,
                        last_fetched_epoch=-1,
                        partition_max_bytes=options.get("partition_max_bytes", 0),
                    )
                ],
            )
        ],
    )


def values(records: bytes) -> list[int]:
    """The base offsets of the batches in ``records``."""
    return [b.header.base_offset for b in BatchScanner(records)]


def part(response: Any, t: int = 0, p: int = 0) -> Any:
    return response.topics[t].partitions[p]


# -- produce and fetch ------------------------------------------------------------------


def test_produce_acks_1_then_fetch_back_over_tls(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            first = await stub.Produce(produce("solo", 0, batch(b"a", b"b")))
            second = await stub.Produce(produce("solo", 0, batch(b"c")))
            assert (part(first).error, part(first).base_offset) == (E.NONE, 0)
            assert (part(second).error, part(second).base_offset) == (E.NONE, 2)
            got = await stub.Fetch(fetch("solo", 0, 0))
            answer = part(got)
            assert answer.error == E.NONE and answer.high_watermark == 3
            assert values(answer.records) == [0, 2]
            # acks=0: appended, answered without offsets.
            zero = await stub.Produce(produce("solo", 0, batch(b"d"), acks=0))
            assert (part(zero).error, part(zero).base_offset) == (E.NONE, -1)
            assert brokers.log(1, "solo").log_end_offset == 4

    run(body)


def test_acks_all_waits_for_the_follower_fetch_that_moves_the_hw(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with (
            serving(brokers, certs) as address,
            dial(address, certs.user("admin")) as client,
            dial(address, certs.broker(2)) as replica,
        ):
            stub = broker_pb2_grpc.BrokerServiceStub(client)
            waiting = asyncio.ensure_future(stub.Produce(produce("t", 0, batch(b"x"), acks=-1)))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            # The consumer sees nothing below the HW yet.
            assert part(await stub.Fetch(fetch("t", 0, 0))).records == b""
            stream = broker_pb2_grpc.BrokerServiceStub(replica).ReplicaFetch()
            for _ in range(2):  # the records, then the fetch at the new LEO
                request = brokers.follower_fetch()
                assert request is not None
                await stream.write(request)
                brokers.follower_answer(await stream.read())
            done = await asyncio.wait_for(waiting, 5)
            assert (part(done).error, part(done).base_offset) == (E.NONE, 0)
            await stream.done_writing()
            follower_log = brokers.log(2, "t")
            assert follower_log.log_end_offset == 1

    run(body)


def test_acks_all_under_min_isr_is_refused_before_append_and_timeout(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)), topic_config("t", "min.insync.replicas", "2"))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            timed_out = await stub.Produce(produce("t", 0, batch(b"x"), acks=-1, timeout_ms=200))
            assert part(timed_out).error == E.REQUEST_TIMED_OUT
            assert "unknown" in part(timed_out).message
            brokers.step(change("id-t", 0, isr=[1]))
            before = brokers.snapshot()
            refused = await stub.Produce(produce("t", 0, batch(b"y"), acks=-1))
            assert part(refused).error == E.NOT_ENOUGH_REPLICAS
            assert brokers.snapshot() == before
            # acks=1 still goes in.
            one = await stub.Produce(produce("t", 0, batch(b"z"), acks=1))
            assert (part(one).error, part(one).base_offset) == (E.NONE, 1)
            bad = await stub.Produce(produce("t", 0, batch(b"w"), acks=2))
            assert part(bad).error == E.INVALID_REQUIRED_ACKS

    run(body)


def test_a_topics_min_isr_set_in_a_delta_refuses_what_the_default_allows(certs: Certs) -> None:
    """The replica's min ISR is the topic's effective value (its own over the
    cluster's), and follows a ConfigRecord in a later delta."""
    brokers = Brokers(
        *topic("t", "id-t", (1, 2, 3)),
        ConfigRecord(0, "", "min.insync.replicas", "2"),
        # A broker's own value (an older log's) is not read: the controller
        # decides the ELR without it.
        ConfigRecord(BROKER_RESOURCE, "1", "min.insync.replicas", "3"),
    )
    brokers.step(change("id-t", 0, isr=[1, 2]))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            # ISR 2 >= the cluster's 2: appended, then waits for broker 2.
            allowed = await stub.Produce(produce("t", 0, batch(b"x"), acks=-1, timeout_ms=100))
            assert part(allowed).error == E.REQUEST_TIMED_OUT
            assert brokers.log(1, "t").log_end_offset == 1
            brokers.step(topic_config("t", "min.insync.replicas", "3"))
            before = brokers.snapshot()
            refused = await stub.Produce(produce("t", 0, batch(b"y"), acks=-1))
            assert part(refused).error == E.NOT_ENOUGH_REPLICAS
            assert "min.insync.replicas 3" in part(refused).message
            assert brokers.snapshot() == before
            # The topic's value deleted: the cluster's again.
            brokers.step(topic_config("t", "min.insync.replicas", None))
            again = await stub.Produce(produce("t", 0, batch(b"z"), acks=-1, timeout_ms=100))
            assert part(again).error == E.REQUEST_TIMED_OUT

    run(body)


def test_long_poll_fetch_is_answered_early_by_a_produce(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            loop = asyncio.get_running_loop()
            started = loop.time()
            poll = asyncio.ensure_future(
                stub.Fetch(fetch("solo", 0, 0, max_wait_ms=10_000, min_bytes=1))
            )
            await asyncio.sleep(0.2)
            assert not poll.done()
            await stub.Produce(produce("solo", 0, batch(b"a")))
            got = await asyncio.wait_for(poll, 5)
            assert values(part(got).records) == [0]
            assert loop.time() - started < 5
            # Nothing arrives: answered empty once max_wait_ms has passed.
            empty = await stub.Fetch(fetch("solo", 0, 1, max_wait_ms=150, min_bytes=1))
            assert part(empty).error == E.NONE and part(empty).records == b""

    run(body)


def test_fetch_limits_and_errors(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)), *topic("two", "id-2", (1,)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            for name in ("solo", "two"):
                for value in (b"a" * 100, b"b" * 100):
                    await stub.Produce(produce(name, 0, batch(value)))
            one = await stub.Fetch(fetch("solo", 0, 0, partition_max_bytes=1))
            assert values(part(one).records) == [0]  # at least one batch
            both = broker_pb2.FetchRequest(max_bytes=1)
            for name in ("solo", "two"):
                both.topics.append(fetch(name, 0, 0).topics[0])
            got = await stub.Fetch(both)
            assert values(part(got, 0).records) == [0]
            assert part(got, 1).records == b""  # the budget is spent
            out = await stub.Fetch(fetch("solo", 0, 9))
            assert part(out).error == E.OFFSET_OUT_OF_RANGE
            by_id = fetch("solo", 0, 0)
            by_id.topics[0].topic_id = "id-2"
            assert part(await stub.Fetch(by_id)).error == E.INCONSISTENT_TOPIC_ID
            only_id = fetch("", 0, 0)
            only_id.topics[0].topic_id = "nope"
            assert part(await stub.Fetch(only_id)).error == E.UNKNOWN_TOPIC_ID
            fenced = fetch("solo", 0, 0)
            fenced.topics[0].partitions[0].current_leader_epoch = 7
            answer = part(await stub.Fetch(fenced))
            assert answer.error == E.UNKNOWN_LEADER_EPOCH
            assert answer.current_leader.leader_id == 1
            negative = await stub.Fetch(fetch("solo", 0, -5))
            assert negative.error == E.INVALID_REQUEST
            assert "topics[0].partitions[0].fetch_offset" in negative.message

    run(body)


def test_leadership_errors_name_the_leader_and_its_endpoint(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (2, 1)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            before = brokers.snapshot()
            got = await stub.Produce(produce("t", 0, batch(b"x")))
            assert part(got).error == E.NOT_LEADER_OR_FOLLOWER
            assert part(got).current_leader.leader_id == 2
            assert [(e.node_id, e.port) for e in got.node_endpoints] == [(2, 9002)]
            assert brokers.snapshot() == before
            missing = await stub.Produce(produce("nope", 0, batch(b"x")))
            assert part(missing).error == E.UNKNOWN_TOPIC_OR_PARTITION
            fetched = await stub.Fetch(fetch("t", 0, 0))
            assert part(fetched).error == E.NOT_LEADER_OR_FOLLOWER
            assert [e.node_id for e in fetched.node_endpoints] == [2]

    run(body)


# -- replication ----------------------------------------------------------------------------


def test_replica_fetch_stream_replicates_and_checks_the_replica_id(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with (
            serving(brokers, certs) as address,
            dial(address, certs.user("admin")) as client,
            dial(address, certs.broker(2)) as replica,
            dial(address, certs.broker(3)) as other,
        ):
            stub = broker_pb2_grpc.BrokerServiceStub(client)
            for value in (b"a", b"b", b"c"):
                await stub.Produce(produce("t", 0, batch(value)))
            stream = broker_pb2_grpc.BrokerServiceStub(replica).ReplicaFetch()
            for _ in range(3):
                request = brokers.follower_fetch()
                assert request is not None
                await stream.write(request)
                brokers.follower_answer(await stream.read())
            await stream.done_writing()
            leader_log = brokers.log(1, "t")
            follower_log = brokers.log(2, "t")
            assert leader_log.high_watermark == 3
            assert follower_log.log_end_offset == 3 and follower_log.high_watermark == 3
            assert leader_log.read(0, 1 << 20) == follower_log.read(0, 1 << 20)
            # Broker 3 fetching as replica 2: refused, naming both.
            request = brokers.follower_fetch()
            assert request is not None
            impostor: Any = await broker_pb2_grpc.BrokerServiceStub(other).Fetch(request)
            assert impostor.error == E.CLUSTER_AUTHORIZATION_FAILED
            assert "Broker:3" in impostor.message and "replica 2" in impostor.message
            # A user may not replicate either, and a replica fetch needs
            # replica_state on the stream.
            assert (await stub.Fetch(request)).error == E.CLUSTER_AUTHORIZATION_FAILED
            stream = broker_pb2_grpc.BrokerServiceStub(replica).ReplicaFetch()
            await stream.write(fetch("t", 0, 0))
            answer: Any = await stream.read()
            assert answer.error == E.INVALID_REQUEST and "replica_state" in answer.message
            await stream.done_writing()

    run(body)


def test_offset_for_leader_epoch_and_list_offsets(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            await stub.Produce(produce("solo", 0, batch(b"a", timestamp=1000)))
            await stub.Produce(produce("solo", 0, batch(b"b", timestamp=5000)))
            brokers.step(change("id-s", 0, leader=1))  # a new leader epoch (1)
            await stub.Produce(produce("solo", 0, batch(b"c", timestamp=9000)))

            def ask(epoch: int) -> broker_pb2.OffsetForLeaderEpochRequest:
                return broker_pb2.OffsetForLeaderEpochRequest(
                    replica_id=-1,
                    topics=[
                        broker_pb2.OffsetForLeaderTopic(
                            topic="solo",
                            partitions=[
                                broker_pb2.OffsetForLeaderPartition(
                                    partition=0, current_leader_epoch=-1, leader_epoch=epoch
                                )
                            ],
                        )
                    ],
                )

            zero = part(await stub.OffsetForLeaderEpoch(ask(0)))
            assert (zero.error, zero.leader_epoch, zero.end_offset) == (E.NONE, 0, 2)
            one = part(await stub.OffsetForLeaderEpoch(ask(1)))
            assert (one.leader_epoch, one.end_offset) == (1, 3)
            # A user asking as replica 2 is refused, naming both.
            as_replica = ask(0)
            as_replica.replica_id = 2
            refused = await stub.OffsetForLeaderEpoch(as_replica)
            assert refused.error == E.CLUSTER_AUTHORIZATION_FAILED
            assert "User:admin" in refused.message and "replica 2" in refused.message

            def offsets(*timestamps: int) -> broker_pb2.ListOffsetsRequest:
                return broker_pb2.ListOffsetsRequest(
                    topics=[
                        broker_pb2.ListOffsetsTopic(
                            name="solo",
                            partitions=[
                                broker_pb2.ListOffsetsPartition(
                                    partition=0, current_leader_epoch=-1, timestamp=ts
                                )
                                for ts in timestamps
                            ],
                        )
                    ]
                )

            got = await stub.ListOffsets(offsets(-2, -1, 4000, 9000, 99999, -4, -3))
            answers = got.topics[0].partitions
            assert (answers[6].error, answers[6].offset, answers[6].timestamp) == (E.NONE, 2, 9000)
            assert [(a.error, a.offset) for a in answers[:5]] == [
                (E.NONE, 0),
                (E.NONE, 3),
                (E.NONE, 1),
                (E.NONE, 2),
                (E.NONE, -1),
            ]
            assert answers[2].timestamp == 5000
            assert answers[5].error == E.INVALID_REQUEST

    run(body)


def test_list_offsets_latest_is_not_available_while_a_new_leaders_hw_is_behind() -> None:
    # KIP-207: broker 1 takes over a partition whose HW it has not caught
    # up with (its LEO is past its HW, so its epoch start is past the HW).
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with serving(brokers, None) as address, dial(address) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            await stub.Produce(produce("t", 0, batch(b"a")))  # HW stays 0: 2 has not fetched
            brokers.step(change("id-t", 0, leader=1))
            request = broker_pb2.ListOffsetsRequest(
                topics=[
                    broker_pb2.ListOffsetsTopic(
                        name="t",
                        partitions=[
                            broker_pb2.ListOffsetsPartition(
                                partition=0, current_leader_epoch=-1, timestamp=-1
                            )
                        ],
                    )
                ]
            )
            answer = part(await stub.ListOffsets(request))
            assert answer.error == E.OFFSET_NOT_AVAILABLE

    run(body)


def test_delete_records_never_past_the_hw(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            for value in (b"a", b"b", b"c"):
                await stub.Produce(produce("solo", 0, batch(value)))

            def delete(offset: int) -> broker_pb2.DeleteRecordsRequest:
                return broker_pb2.DeleteRecordsRequest(
                    topics=[
                        broker_pb2.DeleteRecordsTopic(
                            name="solo",
                            partitions=[
                                broker_pb2.DeleteRecordsPartition(partition=0, offset=offset)
                            ],
                        )
                    ]
                )

            past = part(await stub.DeleteRecords(delete(7)))
            assert past.error == E.OFFSET_OUT_OF_RANGE
            moved = part(await stub.DeleteRecords(delete(2)))
            assert (moved.error, moved.low_watermark) == (E.NONE, 2)
            gone = part(await stub.Fetch(fetch("solo", 0, 0)))
            assert gone.error == E.OFFSET_OUT_OF_RANGE and gone.log_start_offset == 2
            hw = part(await stub.DeleteRecords(delete(-1)))
            assert hw.low_watermark == 3

    run(body)


def delete_request(name: str, offset: int, timeout_ms: int) -> broker_pb2.DeleteRecordsRequest:
    return broker_pb2.DeleteRecordsRequest(
        topics=[
            broker_pb2.DeleteRecordsTopic(
                name=name,
                partitions=[broker_pb2.DeleteRecordsPartition(partition=0, offset=offset)],
            )
        ],
        timeout_ms=timeout_ms,
    )


async def parked(brokers: Brokers, count: int) -> None:
    """Until ``count`` DeleteRecords wait in the purgatory (the run's
    timeout bounds it)."""
    while brokers.service.purgatory.delayed(Operation.DELETE_RECORDS) != count:
        await asyncio.sleep(0.01)


def test_delete_records_waits_for_the_followers_log_start(certs: Certs) -> None:
    # DelayedDeleteRecords: the leader's log start moves at once; the answer
    # waits until the follower, told the leader's start in a fetch answer,
    # reports its own start in its next fetch (the low watermark).
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with (
            serving(brokers, certs) as address,
            dial(address, certs.user("admin")) as client,
            dial(address, certs.broker(2)) as replica,
        ):
            stub = broker_pb2_grpc.BrokerServiceStub(client)
            stream = broker_pb2_grpc.BrokerServiceStub(replica).ReplicaFetch()

            async def follower_round() -> None:
                request = brokers.follower_fetch()
                assert request is not None
                await stream.write(request)
                brokers.follower_answer(await stream.read())

            for value in (b"a", b"b", b"c"):
                await stub.Produce(produce("t", 0, batch(value)))
            for _ in range(3):  # the records, the HW, the HW to the follower
                await follower_round()
            assert brokers.log(1, "t").high_watermark == 3
            assert brokers.log(2, "t").high_watermark == 3
            waiting = asyncio.ensure_future(stub.DeleteRecords(delete_request("t", 2, 10_000)))
            await parked(brokers, 1)
            assert brokers.log(1, "t").log_start_offset == 2
            assert brokers.log(2, "t").log_start_offset == 0
            # The answer carries the leader's start: the follower moves...
            await follower_round()
            assert brokers.log(2, "t").log_start_offset == 2
            # ...and the leader learns it from the next fetch.
            assert not waiting.done()
            await follower_round()
            done = part(await asyncio.wait_for(waiting, 5))
            assert (done.error, done.low_watermark) == (E.NONE, 2)
            # Not reached within timeout_ms: REQUEST_TIMED_OUT, the leader's
            # start moved, the low watermark answered is the follower's.
            late = part(await stub.DeleteRecords(delete_request("t", 3, 100)))
            assert (late.error, late.low_watermark) == (E.REQUEST_TIMED_OUT, 2)
            assert brokers.log(1, "t").log_start_offset == 3
            assert brokers.service.purgatory.delayed() == 0
            await stream.done_writing()

    run(body)


def test_delete_records_stops_waiting_for_a_fenced_follower(certs: Certs) -> None:
    # lowWatermarkIfLeader counts the replicas on live brokers: once the
    # image fences broker 2, the wait is over.
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            await stub.Produce(produce("t", 0, batch(b"a", b"b")))
            brokers.step(change("id-t", 0, isr=[1]))  # the HW moves on the leader alone
            assert brokers.log(1, "t").high_watermark == 2
            waiting = asyncio.ensure_future(stub.DeleteRecords(delete_request("t", 1, 10_000)))
            await parked(brokers, 1)
            brokers.step(fence(2))
            done = part(await asyncio.wait_for(waiting, 5))
            assert (done.error, done.low_watermark) == (E.NONE, 1)
            # A leadership that moves away ends the wait too.
            brokers.step(unfence(2))
            waiting = asyncio.ensure_future(stub.DeleteRecords(delete_request("t", 2, 10_000)))
            await parked(brokers, 1)
            brokers.step(change("id-t", 0, leader=2, isr=[2]))
            moved = part(await asyncio.wait_for(waiting, 5))
            assert moved.error == E.NOT_LEADER_OR_FOLLOWER
            # Bad input changes nothing.
            bad = await stub.DeleteRecords(delete_request("t", 0, -1))
            assert bad.error == E.INVALID_REQUEST and "timeout_ms -1" in bad.message

    run(body)


def test_init_producer_id_from_blocks(certs: Certs) -> None:
    brokers = Brokers()

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            new = broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
            ids = [(await stub.InitProducerId(new)).producer_id for _ in range(3)]
            assert ids == [5000, 5001, 5002]  # blocks of two, asked for one after another
            bumped = await stub.InitProducerId(
                broker_pb2.InitProducerIdRequest(producer_id=5000, producer_epoch=3)
            )
            assert (bumped.producer_id, bumped.producer_epoch) == (5000, 4)
            half = await stub.InitProducerId(
                broker_pb2.InitProducerIdRequest(producer_id=5000, producer_epoch=-1)
            )
            assert half.error == E.INVALID_REQUEST

    run(body)


# -- metadata and ACLs ------------------------------------------------------------------------


def test_metadata_from_the_image(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2, 3)))
    brokers.step(change("id-t", 0, isr=[1, 2], elr=[3]))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            got = await stub.Metadata(broker_pb2.MetadataRequest(topics=["t", "nope"]))
            assert [b.node_id for b in got.brokers] == [1, 2, 3]
            assert (got.cluster_id, got.controller_id) == (CLUSTER, 9)
            assert got.metadata_offset == brokers.md.image.offset
            t, nope = got.topics
            assert (t.error, t.topic_id) == (E.NONE, "id-t")
            p = t.partitions[0]
            assert (p.leader_id, list(p.replicas), list(p.isr), list(p.elr)) == (
                1,
                [1, 2, 3],
                [1, 2],
                [3],
            )
            assert list(p.offline_replicas) == []
            assert nope.error == E.UNKNOWN_TOPIC_OR_PARTITION
            brokers.step(fence(3))
            fenced = await stub.Metadata(broker_pb2.MetadataRequest(topics=["t"]))
            assert [b.node_id for b in fenced.brokers] == [1, 2]
            assert list(fenced.topics[0].partitions[0].offline_replicas) == [3]

    run(body)


def test_replication_needs_cluster_action_and_hands_out_isr_expansions(certs: Certs) -> None:
    brokers = Brokers(
        *topic("t", "id-t", (1, 2)),
        change("id-t", 0, isr=[1]),
        super_users=frozenset({"User:admin"}),
    )

    async def body() -> None:
        async with (
            serving(brokers, certs) as address,
            dial(address, certs.user("admin")) as client,
            dial(address, certs.broker(2)) as replica,
        ):
            stub = broker_pb2_grpc.BrokerServiceStub(client)
            await stub.Produce(produce("t", 0, batch(b"a")))
            follower = broker_pb2_grpc.BrokerServiceStub(replica)
            request = brokers.follower_fetch()
            assert request is not None
            refused = await follower.Fetch(request)
            assert refused.error == E.CLUSTER_AUTHORIZATION_FAILED
            assert "CLUSTER_ACTION" in refused.message
            brokers.step(
                acl(
                    "c1",
                    "Broker:2",
                    AclOperation.CLUSTER_ACTION,
                    "kafka-cluster",
                    resource=AclResourceType.CLUSTER,
                )
            )
            for _ in range(2):
                request = brokers.follower_fetch()
                assert request is not None
                brokers.follower_answer(await follower.Fetch(request))
            # Caught up: the leader asks the controller to add 2 to the ISR.
            assert [(key.topic_id, alter.isr) for key, alter in brokers.alters] == [
                ("id-t", (1, 2))
            ]

    run(body)


def test_acls_are_answered_per_topic(certs: Certs) -> None:
    brokers = Brokers(
        *topic("t", "id-t", (1,)),
        *topic("u", "id-u", (1,)),
        acl("a1", "User:alice", AclOperation.WRITE),
        acl("a2", "User:alice", AclOperation.READ),
        acl(
            "a3",
            "Broker:2",
            AclOperation.CLUSTER_ACTION,
            "kafka-cluster",
            resource=AclResourceType.CLUSTER,
        ),
    )

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("alice")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            request = produce("t", 0, batch(b"x"))
            request.topics.append(produce("u", 0, batch(b"y")).topics[0])
            got = await stub.Produce(request)
            assert part(got, 0).error == E.NONE
            assert part(got, 1).error == E.TOPIC_AUTHORIZATION_FAILED
            assert "User:alice" in part(got, 1).message
            assert brokers.log(1, "u").log_end_offset == 0
            both = fetch("t", 0, 0)
            both.topics.append(fetch("u", 0, 0).topics[0])
            fetched = await stub.Fetch(both)
            assert part(fetched, 0).error == E.NONE and part(fetched, 1).error == (
                E.TOPIC_AUTHORIZATION_FAILED
            )
            # Metadata of all topics leaves out what alice may not describe.
            listing = await stub.Metadata(broker_pb2.MetadataRequest(all_topics=True))
            assert [t.name for t in listing.topics] == ["t"]
            named = await stub.Metadata(broker_pb2.MetadataRequest(topics=["u"]))
            assert named.topics[0].error == E.TOPIC_AUTHORIZATION_FAILED
            # No IdempotentWrite: no producer id.
            denied = await stub.InitProducerId(
                broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
            )
            assert denied.error == E.CLUSTER_AUTHORIZATION_FAILED

    run(body)


def test_plaintext_allows_everything() -> None:
    brokers = Brokers(*topic("t", "id-t", (1,)))

    async def body() -> None:
        async with serving(brokers, None) as address, dial(address) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            got = await stub.Produce(produce("t", 0, batch(b"x")))
            assert part(got).error == E.NONE

    run(body)


# -- malformed requests --------------------------------------------------------------------------


def test_malformed_produces_name_the_field_and_store_nothing(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            good = batch(b"a")
            damaged = bytearray(good)
            damaged[-1] ^= 0xFF
            before = brokers.snapshot()
            cases = {
                b"": (E.INVALID_REQUEST, "topics[0].partitions[0].records is empty"),
                bytes(damaged): (E.CORRUPT_MESSAGE, "topics[0].partitions[0].records"),
                good + bytes(damaged): (E.CORRUPT_MESSAGE, f"at position {len(good)}"),
                good[:-3]: (E.CORRUPT_MESSAGE, "partial"),
            }
            for records, (code, words) in cases.items():
                got = part(await stub.Produce(produce("solo", 0, records)))
                assert got.error == code, (records, got)
                assert words in got.message
            negative = part(await stub.Produce(produce("solo", -1, good)))
            assert negative.error == E.INVALID_REQUEST and "partition -1" in negative.message
            assert brokers.snapshot() == before

    run(body)


def test_a_diverging_follower_is_answered_at_once_and_truncates(certs: Certs) -> None:
    # Broker 2 led epoch 1 and wrote a record broker 1 never fetched; broker
    # 1 leads again in epoch 2: 2's fetch gets the diverging epoch at once,
    # though it asks to wait, and truncates by it (KIP-279, KIP-595).
    brokers = Brokers(*topic("t", "id-t", (1, 2)))
    key = brokers.managers[1].resolve("t", 0)

    async def body() -> None:
        async with (
            serving(brokers, certs) as address,
            dial(address, certs.user("admin")) as client,
            dial(address, certs.broker(2)) as replica,
        ):
            stub = broker_pb2_grpc.BrokerServiceStub(client)
            await stub.Produce(produce("t", 0, batch(b"a")))
            stream = broker_pb2_grpc.BrokerServiceStub(replica).ReplicaFetch()
            for _ in range(2):
                request = brokers.follower_fetch()
                assert request is not None
                await stream.write(request)
                brokers.follower_answer(await stream.read())
            brokers.step(change("id-t", 0, leader=2))
            brokers.managers[2].append(key, batch(b"lost"), 1, brokers.now)
            brokers.step(change("id-t", 0, leader=1))
            assert brokers.log(2, "t").log_end_offset == 2
            loop = asyncio.get_running_loop()
            started = loop.time()
            request = brokers.follower_fetch(max_wait_ms=10_000)
            assert request is not None
            await stream.write(request)
            response: Any = await stream.read()
            assert loop.time() - started < 5
            diverging = part(response).diverging_epoch
            assert (diverging.epoch, diverging.end_offset) == (0, 1)
            brokers.follower_answer(response)
            assert brokers.log(2, "t").log_end_offset == 1
            await stream.done_writing()

    run(body)


def test_acks_all_waiting_when_leadership_moves_names_the_new_leader(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            waiting = asyncio.ensure_future(stub.Produce(produce("t", 0, batch(b"x"), acks=-1)))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            brokers.step(change("id-t", 0, leader=2))
            done = await asyncio.wait_for(waiting, 5)
            answer = part(done)
            # An unknown outcome: the record is in broker 1's log and may be
            # on the new leader too.
            assert answer.error == E.NOT_LEADER_OR_FOLLOWER
            assert "offset 0" in answer.message
            assert (answer.current_leader.leader_id, answer.current_leader.leader_epoch) == (2, 1)
            assert [e.node_id for e in done.node_endpoints] == [2]

    run(body)

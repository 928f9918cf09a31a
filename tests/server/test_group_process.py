"""Consumer groups on broker processes end to end (in this process, on
127.0.0.1, mutual TLS): the first FindCoordinator has the offsets topic
created, a member joins and gets every partition, its commit is answered
and fetched, and after the coordinator's broker crashes the new
coordinator, rebuilt from the offsets partition's log, has the commit."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from broker.errors import Errors
from broker.group_coordinator import OffsetsTopicSettings
from kqproto import groups_pb2, groups_pb2_grpc
from metadata.client import MetadataClient, NewTopic
from metadata.image import OFFSETS_TOPIC
from quorum.driver.identity import Identity
from quorum.driver.tls import dial
from server.broker import BrokerProcess
from tests.driver.cluster_util import CLUSTER_ID, free_ports
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import (
    BROKERS,
    Controllers,
    broker,
    stop_all,
    wait_for,
)


def group_broker(cluster: Controllers, broker_id: int, port: int) -> BrokerProcess:
    process = broker(cluster, broker_id, port)
    process.settings = dataclasses.replace(
        process.settings,
        offsets_topic=OffsetsTopicSettings(partitions=3, replication_factor=3),
    )
    process.groups.topic = process.settings.offsets_topic
    return process


def test_a_group_commits_and_keeps_its_offset_through_a_coordinator_crash(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        brokers: dict[int, BrokerProcess] = {}
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        try:
            for node in cluster.voters:
                await cluster.start(node)
            for broker_id, port in zip(BROKERS, free_ports(len(BROKERS)), strict=True):
                brokers[broker_id] = group_broker(cluster, broker_id, port)
                await brokers[broker_id].start()
            await wait_for(lambda: all(not b.fenced for b in brokers.values()))
            async with MetadataClient(
                list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
            ) as admin:
                await admin.create_topics([NewTopic("t", 6, 3)])
            address = brokers[BROKERS[0]].address
            channel = dial(address, admin_tls.channel_credentials())
            stub = groups_pb2_grpc.GroupServiceStub(channel)

            async def coordinator() -> groups_pb2.Coordinator | None:
                found = await stub.FindCoordinator(
                    groups_pb2.FindCoordinatorRequest(group_ids=["g"])
                )
                answer = found.coordinators[0]
                return answer if answer.error == Errors.NONE else None

            async def await_coordinator() -> groups_pb2.Coordinator:
                for _ in range(400):
                    found = await coordinator()
                    if found is not None:
                        return found
                    await asyncio.sleep(0.05)
                raise AssertionError("no coordinator")

            first = await stub.FindCoordinator(groups_pb2.FindCoordinatorRequest(group_ids=["g"]))
            assert first.coordinators[0].error == Errors.COORDINATOR_NOT_AVAILABLE
            found = await await_coordinator()
            # The offsets topic was made with offsets.min_insync_replicas (2).
            leader = brokers[found.node_id]
            offsets_topic = leader.image.topic_by_name(OFFSETS_TOPIC)
            assert offsets_topic is not None
            mins = {r.min_isr for k, r in leader.replicas.replicas.items()
                    if k.topic_id == offsets_topic.topic_id}  # fmt: skip
            assert mins == {2}
            host = f"{found.host}:{found.port}"
            group_stub = groups_pb2_grpc.GroupServiceStub(
                dial(host, admin_tls.channel_credentials())
            )

            async def join() -> groups_pb2.ConsumerGroupHeartbeatResponse:
                for _ in range(400):
                    answer = await group_stub.ConsumerGroupHeartbeat(
                        groups_pb2.ConsumerGroupHeartbeatRequest(
                            group_id="g",
                            member_epoch=0,
                            rebalance_timeout_ms=30_000,
                            subscribed_topic_names=groups_pb2.TopicNames(names=["t"]),
                            owned=groups_pb2.Assignment(),
                            client_id="test",
                        )
                    )
                    if answer.error != Errors.COORDINATOR_LOAD_IN_PROGRESS:
                        return answer
                    await asyncio.sleep(0.05)
                raise AssertionError("the coordinator never loaded")

            # Any other broker answers NOT_COORDINATOR naming the coordinator.
            other = brokers[next(b for b in BROKERS if b != found.node_id)]
            elsewhere = await groups_pb2_grpc.GroupServiceStub(
                dial(other.address, admin_tls.channel_credentials())
            ).OffsetFetch(groups_pb2.OffsetFetchRequest(group_id="g"))
            assert elsewhere.error == Errors.NOT_COORDINATOR, elsewhere
            assert (elsewhere.coordinator.node_id, elsewhere.coordinator.port) == (
                found.node_id,
                found.port,
            )
            joined = await join()
            assert joined.error == Errors.NONE, joined.message
            assert joined.member_epoch == 1
            assert sorted(p for t in joined.assignment.topics for p in t.partitions) == list(
                range(6)
            )
            assert joined.assignment.topics[0].topic == "t"
            committed = await group_stub.OffsetCommit(
                groups_pb2.OffsetCommitRequest(
                    group_id="g",
                    member_id=joined.member_id,
                    member_epoch=joined.member_epoch,
                    topics=[
                        groups_pb2.OffsetCommitTopic(
                            name="t",
                            partitions=[
                                groups_pb2.OffsetCommitPartition(
                                    partition=2, offset=42, leader_epoch=1
                                )
                            ],
                        )
                    ],
                )
            )
            assert committed.error == Errors.NONE
            assert committed.topics[0].partitions[0].error == Errors.NONE
            # A stale epoch is refused.
            stale = await group_stub.OffsetCommit(
                groups_pb2.OffsetCommitRequest(
                    group_id="g",
                    member_id=joined.member_id,
                    member_epoch=joined.member_epoch + 1,
                    topics=[
                        groups_pb2.OffsetCommitTopic(
                            name="t",
                            partitions=[groups_pb2.OffsetCommitPartition(partition=2, offset=1)],
                        )
                    ],
                )
            )
            assert stale.error == Errors.STALE_MEMBER_EPOCH
            metrics = brokers[found.node_id].broker_metrics
            assert metrics.value("kq_broker_group_commits_total", error="NONE") == 1
            assert metrics.value("kq_broker_group_commits_total", error="STALE_MEMBER_EPOCH") == 1
            assert metrics.value("kq_broker_group_rebalances_total") == 1
            assert metrics.value("kq_broker_groups", state="Stable") == 1
            assert metrics.value("kq_broker_group_commit_latency_seconds_count") == 2
            # Committed past the (empty) partition's high watermark: lag 0.
            lag = {"node": str(found.node_id), "group": "g", "topic": "t", "partition": "2"}
            assert metrics.registry.get_sample_value("kq_broker_group_lag", lag) == 0
            # The coordinator's broker crashes; another takes the partition.
            crashed = found.node_id
            await brokers[crashed].stop(controlled=False)
            del brokers[crashed]
            survivor = brokers[next(b for b in BROKERS if b != crashed)]
            stub = groups_pb2_grpc.GroupServiceStub(
                dial(survivor.address, admin_tls.channel_credentials())
            )

            async def moved() -> groups_pb2.Coordinator | None:
                found_now = await coordinator()
                return found_now if found_now and found_now.node_id != crashed else None

            for _ in range(600):
                new = await moved()
                if new is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the coordinator did not move")
            new_stub = groups_pb2_grpc.GroupServiceStub(
                dial(f"{new.host}:{new.port}", admin_tls.channel_credentials())
            )
            for _ in range(400):
                fetched = await new_stub.OffsetFetch(groups_pb2.OffsetFetchRequest(group_id="g"))
                if fetched.error == Errors.NONE:
                    break
                await asyncio.sleep(0.05)
            assert fetched.error == Errors.NONE, fetched.message
            assert [(t.name, p.partition, p.offset, p.leader_epoch) for t in fetched.topics
                    for p in t.partitions] == [("t", 2, 42, 1)]  # fmt: skip
            # The member is still known to the new coordinator.
            described = await new_stub.DescribeGroups(
                groups_pb2.DescribeGroupsRequest(group_ids=["g"])
            )
            assert [m.member_id for m in described.groups[0].members] == [joined.member_id]
        finally:
            await stop_all(cluster, *brokers.values())

    asyncio.run(asyncio.wait_for(body(), 120))

"""The metadata services end to end: a real three-controller quorum in this
process, test brokers that register and heartbeat over gRPC, and every
request sent over gRPC as a client or broker would send it.

What is checked is the contract of ``proto/kqproto/metadata.proto``: the answers
(errors per item and at the top, in request order, with the leader hint),
what the active controller decides (placement, ISR changes, fencing,
controlled shutdown, elections, reassignments), NOT_CONTROLLER from
standbys, and that a failover keeps the metadata and the brokers' sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kqproto import metadata_pb2 as pb
from metadata.service import is_uuid
from tests.metadata.metadata_cluster import (
    CLUSTER_ID,
    SETTINGS,
    MetadataCluster,
    TestBroker,
    new_uuid,
    running_metadata,
)

ADMIN = "kq.metadata.AdminService"
LIFECYCLE = "kq.metadata.BrokerLifecycleService"
SESSION_S = SETTINGS.broker_session_timeout_ms / 1000


def run(coro: Awaitable[None], timeout_s: float = 120) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout_s))


def name(code: int) -> str:
    return pb.MetadataError.Name(code)


def codes(results: Iterable[object]) -> list[str]:
    return [name(r.error) for r in results]  # type: ignore[attr-defined]


async def start_brokers(
    cluster: MetadataCluster, ids: Iterable[int], racks: bool = False
) -> dict[int, TestBroker]:
    brokers = {b: TestBroker(cluster, b, rack=f"rack-{b % 2}" if racks else None) for b in ids}
    await asyncio.gather(*(b.start() for b in brokers.values()))
    return brokers


async def stop_brokers(brokers: Iterable[TestBroker]) -> None:
    for b in brokers:
        await b.stop()


async def create(cluster: MetadataCluster, *topics: pb.CreatableTopic) -> pb.CreateTopicsResponse:
    request = pb.CreateTopicsRequest(topics=list(topics))
    response = await cluster.on_active(lambda n: cluster.admin(n).CreateTopics(request, timeout=5))
    assert response.error == pb.NONE, response
    return response


async def describe(cluster: MetadataCluster, *names: str) -> pb.DescribeTopicsResponse:
    request = pb.DescribeTopicsRequest(names=list(names), linearizable=True)
    response = await cluster.on_active(
        lambda n: cluster.admin(n).DescribeTopics(request, timeout=5)
    )
    assert response.error == pb.NONE, response
    return response


async def partitions(cluster: MetadataCluster, topic: str) -> list[pb.PartitionDescription]:
    (described,) = (await describe(cluster, topic)).topics
    assert described.error == pb.NONE, described
    return list(described.partitions)


async def brokers_of(cluster: MetadataCluster) -> dict[int, pb.BrokerDescription]:
    response = await cluster.on_active(
        lambda n: cluster.admin(n).DescribeCluster(
            pb.DescribeClusterRequest(linearizable=True), timeout=5
        )
    )
    assert response.error == pb.NONE, response
    return {b.broker_id: b for b in response.brokers}


async def alter_configs(
    cluster: MetadataCluster, *resources: pb.AlterConfigsResource, validate_only: bool = False
) -> pb.AlterConfigsResponse:
    request = pb.AlterConfigsRequest(resources=list(resources), validate_only=validate_only)
    response = await cluster.on_active(lambda n: cluster.admin(n).AlterConfigs(request, timeout=5))
    assert response.error == pb.NONE, response
    return response


async def describe_configs(
    cluster: MetadataCluster, *resources: pb.ConfigResource, include_defaults: bool = False
) -> pb.DescribeConfigsResponse:
    request = pb.DescribeConfigsRequest(
        resources=list(resources), include_defaults=include_defaults, linearizable=True
    )
    response = await cluster.on_active(
        lambda n: cluster.admin(n).DescribeConfigs(request, timeout=5)
    )
    assert response.error == pb.NONE, response
    return response


def entries(result: pb.DescribeConfigsResult) -> dict[str, tuple[str, str]]:
    return {e.name: (e.value, pb.ConfigSource.Name(e.source)) for e in result.entries}


def topic(name: str, partitions: int = -1, rf: int = -1, **kw: object) -> pb.CreatableTopic:
    return pb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf, **kw)  # type: ignore[arg-type]


def assignment(*replicas: list[int]) -> list[pb.ReplicaAssignment]:
    return [pb.ReplicaAssignment(partition=i, replicas=r) for i, r in enumerate(replicas)]


def set_op(key: str, value: str, **kw: object) -> pb.AlterConfigOp:
    return pb.AlterConfigOp(key=key, op=pb.SET, value=value, **kw)  # type: ignore[arg-type]


TOPIC = pb.TOPIC
BROKER = pb.BROKER
CLUSTER = pb.CLUSTER


# -- topics, configs, features, producer ids, standbys ------------------------------------


def test_admin_api_on_a_real_quorum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        async with running_metadata(tmp_path) as cluster:
            active = await cluster.wait_active()
            brokers = await start_brokers(cluster, (1, 2, 3))
            try:
                await _cluster_and_brokers(cluster, active, brokers)
                await _create_topics(cluster)
                await _describe_and_list(cluster)
                await _configs(cluster)
                await _delete_and_grow(cluster)
                await _features_and_producer_ids(cluster, brokers)
                await _malformed(cluster, brokers)
                await _unexpected(cluster, brokers, monkeypatch)
                await _standby(cluster)
                await _health_and_reflection(cluster)
            finally:
                await stop_brokers(brokers.values())

    run(go())


async def _cluster_and_brokers(
    cluster: MetadataCluster, active: int, brokers: dict[int, TestBroker]
) -> None:
    response = await cluster.on_active(
        lambda n: cluster.admin(n).DescribeCluster(
            pb.DescribeClusterRequest(linearizable=True), timeout=5
        )
    )
    assert response.error == pb.NONE
    assert response.cluster_id == CLUSTER_ID
    assert response.controller_id == active
    assert response.leader.leader_id == active
    assert response.leader.leader_address == cluster.voters[active]
    assert [(f.name, f.level) for f in response.features] == [("metadata.version", 1)]
    assert [b.broker_id for b in response.brokers] == [1, 2, 3]
    for b in response.brokers:
        assert not b.fenced and not b.in_controlled_shutdown
        assert b.incarnation_id == brokers[b.broker_id].incarnation_id
        assert b.broker_epoch == brokers[b.broker_id].epoch
        assert not b.HasField("rack")
        assert [(e.name, e.port) for e in b.endpoints] == [("PLAINTEXT", 19_000 + b.broker_id)]
    # The heartbeat answer: caught up, unfenced.
    last = brokers[1].last
    assert last is not None and last.is_caught_up and not last.is_fenced
    assert response.metadata_offset > max(b.epoch for b in brokers.values())

    # Registering again with the same incarnation is a retry: a new epoch.
    again = await brokers[3].register()
    assert again.error == pb.NONE and again.broker_epoch > 0
    await brokers[3].wait(lambda r: not r.is_fenced, what="unfenced again")
    # A new incarnation of a broker whose session lives is refused.
    rival = TestBroker(cluster, 2)
    refused = await rival.register()
    assert name(refused.error) == "DUPLICATE_BROKER_REGISTRATION", refused
    # A heartbeat with an old epoch.
    stale = await cluster.on_active(
        lambda n: cluster.lifecycle(n).BrokerHeartbeat(
            pb.BrokerHeartbeatRequest(
                broker_id=1, broker_epoch=brokers[1].epoch + 1000, current_metadata_offset=1
            ),
            timeout=5,
        )
    )
    assert name(stale.error) == "STALE_BROKER_EPOCH", stale
    assert not stale.is_fenced and not stale.is_caught_up  # the rest stays empty


async def _create_topics(cluster: MetadataCluster) -> None:
    response = await create(
        cluster,
        topic("orders", 6, 3),
        topic("too-wide", 1, 4),
        topic("dup", 1, 1),
        topic("dup", 2, 1),
        topic("bad name!", 1, 1),
        topic("defaulted"),
        topic("placed", assignments=assignment([1, 2], [2, 3], [3, 1])),
        topic("mixed", 3, assignments=assignment([1, 2])),
        topic("tuned", 1, 1, configs={"retention.ms": "60000", "cleanup.policy": "compact"}),
        topic("misconfigured", 1, 1, configs={"retention.ms": "soon"}),
        topic("no-partitions", 0, 1),
    )
    results = {(i, r.name): r for i, r in enumerate(response.topics)}
    assert [r.name for r in response.topics] == [
        "orders",
        "too-wide",
        "dup",
        "dup",
        "bad name!",
        "defaulted",
        "placed",
        "mixed",
        "tuned",
        "misconfigured",
        "no-partitions",
    ]
    assert codes(response.topics) == [
        "NONE",
        "INVALID_REPLICATION_FACTOR",
        "INVALID_REQUEST",
        "INVALID_REQUEST",
        "INVALID_TOPIC_NAME",
        "NONE",
        "NONE",
        "INVALID_REQUEST",
        "NONE",
        "INVALID_CONFIG",
        "INVALID_PARTITIONS",
    ]
    orders = results[(0, "orders")]
    assert is_uuid(orders.topic_id)
    assert (orders.num_partitions, orders.replication_factor) == (6, 3)
    # The refusal names both numbers: the factor asked and the brokers there are.
    wide = results[(1, "too-wide")]
    assert "4" in wide.message and "3" in wide.message, wide.message
    assert wide.topic_id == ""
    assert "dup" in results[(2, "dup")].message
    defaulted = results[(5, "defaulted")]
    assert (defaulted.num_partitions, defaulted.replication_factor) == (1, 1)
    placed = results[(6, "placed")]
    assert (placed.num_partitions, placed.replication_factor) == (3, 2)
    assert "retention.ms" in results[(9, "misconfigured")].message

    # Again: the existing topic's id comes back with TOPIC_ALREADY_EXISTS.
    again = await create(cluster, topic("orders", 6, 3))
    assert codes(again.topics) == ["TOPIC_ALREADY_EXISTS"]
    assert again.topics[0].topic_id == orders.topic_id

    # validate_only: the answer it would get, no id, nothing created.
    checked = await cluster.on_active(
        lambda n: cluster.admin(n).CreateTopics(
            pb.CreateTopicsRequest(topics=[topic("checked", 2, 2)], validate_only=True), timeout=5
        )
    )
    assert codes(checked.topics) == ["NONE"]
    assert checked.topics[0].topic_id == ""
    assert (checked.topics[0].num_partitions, checked.topics[0].replication_factor) == (2, 2)

    listing = await cluster.on_active(
        lambda n: cluster.admin(n).ListTopics(pb.ListTopicsRequest(linearizable=True), timeout=5)
    )
    assert [t.name for t in listing.topics] == ["defaulted", "orders", "placed", "tuned"]
    assert {t.name: t.topic_id for t in listing.topics}["orders"] == orders.topic_id


async def _describe_and_list(cluster: MetadataCluster) -> None:
    everything = await describe(cluster)
    assert [t.name for t in everything.topics] == ["defaulted", "orders", "placed", "tuned"]
    assert everything.metadata_offset > 0
    some = await describe(cluster, "placed", "nope", "", "orders")
    assert codes(some.topics) == ["NONE", "UNKNOWN_TOPIC_OR_PARTITION", "INVALID_REQUEST", "NONE"]
    assert [t.name for t in some.topics] == ["placed", "nope", "", "orders"]
    assert some.topics[1].topic_id == "" and "nope" in some.topics[1].message
    placed = some.topics[0]
    assert [list(p.replicas) for p in placed.partitions] == [[1, 2], [2, 3], [3, 1]]
    for p in placed.partitions:
        assert p.leader == p.replicas[0]
        assert list(p.isr) == list(p.replicas)
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
        assert not p.adding_replicas and not p.removing_replicas and not p.leader_recovering
    orders = some.topics[3]
    assert [p.partition for p in orders.partitions] == list(range(6))
    leaders = [p.leader for p in orders.partitions]
    # Leaders are spread: every broker leads two of the six.
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    for p in orders.partitions:
        assert sorted(p.replicas) == [1, 2, 3] and sorted(p.isr) == [1, 2, 3]
    tuned = await describe(cluster, "tuned")
    assert dict(tuned.topics[0].configs) == {"retention.ms": "60000", "cleanup.policy": "compact"}


async def _configs(cluster: MetadataCluster) -> None:
    orders = pb.ConfigResource(type=TOPIC, name="orders")
    # A conditional set: only if retention.ms has no value on the topic.
    first = await alter_configs(
        cluster,
        pb.AlterConfigsResource(
            type=TOPIC, name="orders", ops=[set_op("retention.ms", "5000", expect_absent=True)]
        ),
    )
    assert codes(first.results) == ["NONE"]
    # The answer says where the change committed (the chaos register
    # workload records it as the write's version).
    assert first.HasField("position") and first.position.epoch >= 1
    # Again: the condition fails, with the value found, and nothing of the
    # request is applied, not even the cluster change whose own result is NONE.
    second = await alter_configs(
        cluster,
        pb.AlterConfigsResource(type=CLUSTER, name="", ops=[set_op("num.partitions", "3")]),
        pb.AlterConfigsResource(
            type=TOPIC,
            name="orders",
            ops=[
                set_op("retention.ms", "7000", expect_absent=True),
                set_op("segment.bytes", "1048576", has_expected=True, expected_value="1"),
            ],
        ),
    )
    assert codes(second.results) == ["NONE", "CONFIG_PRECONDITION_FAILED"]
    assert not second.HasField("position"), "nothing was written, yet a position was given"
    current = {(c.key, c.present, c.value) for c in second.results[1].current}
    assert current == {("retention.ms", True, "5000"), ("segment.bytes", False, "")}
    assert "retention.ms" in second.results[1].message
    # A compare-and-set on the current value succeeds.
    third = await alter_configs(
        cluster,
        pb.AlterConfigsResource(
            type=TOPIC,
            name="orders",
            ops=[set_op("retention.ms", "6000", has_expected=True, expected_value="5000")],
        ),
    )
    assert codes(third.results) == ["NONE"]
    assert third.position.offset > first.position.offset
    assert third.position.epoch >= first.position.epoch
    # All or nothing: an invalid value on one resource, nothing anywhere.
    mixed = await alter_configs(
        cluster,
        pb.AlterConfigsResource(type=CLUSTER, name="", ops=[set_op("num.partitions", "4")]),
        pb.AlterConfigsResource(type=TOPIC, name="orders", ops=[set_op("retention.ms", "x")]),
        pb.AlterConfigsResource(type=TOPIC, name="ghost", ops=[set_op("retention.ms", "1")]),
        pb.AlterConfigsResource(type=BROKER, name="one", ops=[set_op("log.retention.ms", "1")]),
        pb.AlterConfigsResource(type=9, name="", ops=[set_op("num.partitions", "4")]),  # type: ignore[arg-type]
    )
    assert codes(mixed.results) == [
        "NONE",
        "INVALID_CONFIG",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "INVALID_REQUEST",
        "INVALID_REQUEST",
    ]
    assert "type" in mixed.results[4].message
    (cluster_now,) = (
        await describe_configs(cluster, pb.ConfigResource(type=CLUSTER, name=""))
    ).results
    assert entries(cluster_now) == {}, "a refused AlterConfigs changed the cluster's configs"
    # validate_only checks and writes nothing.
    checked = await alter_configs(
        cluster,
        pb.AlterConfigsResource(type=CLUSTER, name="", ops=[set_op("num.partitions", "5")]),
        validate_only=True,
    )
    assert codes(checked.results) == ["NONE"]

    # Values at every level, then where each comes from.
    done = await alter_configs(
        cluster,
        pb.AlterConfigsResource(
            type=CLUSTER,
            name="",
            ops=[set_op("log.retention.ms", "7777"), set_op("log.segment.bytes", "2097152")],
        ),
        pb.AlterConfigsResource(type=BROKER, name="1", ops=[set_op("log.retention.ms", "8888")]),
    )
    assert codes(done.results) == ["NONE", "NONE"]
    own = await describe_configs(cluster, orders)
    assert entries(own.results[0]) == {"retention.ms": ("6000", "TOPIC_CONFIG")}
    full = await describe_configs(
        cluster,
        orders,
        pb.ConfigResource(type=TOPIC, name="defaulted"),
        pb.ConfigResource(type=BROKER, name="1"),
        pb.ConfigResource(type=BROKER, name="2"),
        pb.ConfigResource(type=CLUSTER, name=""),
        pb.ConfigResource(type=TOPIC, name="ghost"),
        pb.ConfigResource(type=BROKER, name="-1"),
        pb.ConfigResource(type=CLUSTER, name="x"),
        include_defaults=True,
    )
    assert codes(full.results) == [
        "NONE",
        "NONE",
        "NONE",
        "NONE",
        "NONE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "INVALID_REQUEST",
        "INVALID_REQUEST",
    ]
    topic_entries = entries(full.results[0])
    assert topic_entries["retention.ms"] == ("6000", "TOPIC_CONFIG")
    assert topic_entries["segment.bytes"] == ("2097152", "CLUSTER_CONFIG")
    assert topic_entries["cleanup.policy"] == ("delete", "DEFAULT_CONFIG")
    assert "log.retention.ms" not in topic_entries and "num.partitions" not in topic_entries
    assert entries(full.results[1])["retention.ms"] == ("7777", "CLUSTER_CONFIG")
    broker_1 = entries(full.results[2])
    assert broker_1["log.retention.ms"] == ("8888", "BROKER_CONFIG")
    assert broker_1["log.segment.bytes"] == ("2097152", "CLUSTER_CONFIG")
    assert broker_1["replica.lag.time.max.ms"] == ("30000", "DEFAULT_CONFIG")
    assert "retention.ms" not in broker_1 and "num.partitions" not in broker_1
    assert entries(full.results[3])["log.retention.ms"] == ("7777", "CLUSTER_CONFIG")
    cluster_entries = entries(full.results[4])
    assert cluster_entries["log.retention.ms"] == ("7777", "CLUSTER_CONFIG")
    assert cluster_entries["num.partitions"] == ("1", "DEFAULT_CONFIG")
    assert [e.name for e in full.results[4].entries] == sorted(cluster_entries)
    # A DELETE brings the inherited value back.
    await alter_configs(
        cluster,
        pb.AlterConfigsResource(
            type=TOPIC, name="orders", ops=[pb.AlterConfigOp(key="retention.ms", op=pb.DELETE)]
        ),
    )
    after = await describe_configs(cluster, orders, include_defaults=True)
    assert entries(after.results[0])["retention.ms"] == ("7777", "CLUSTER_CONFIG")


async def _delete_and_grow(cluster: MetadataCluster) -> None:
    listing = await describe(cluster)
    ids = {t.name: t.topic_id for t in listing.topics}
    request = pb.DeleteTopicsRequest(
        names=["defaulted", "nope", "tuned", ""],
        topic_ids=[ids["placed"], new_uuid(), ids["tuned"], "not-an-id"],
    )
    response = await cluster.on_active(lambda n: cluster.admin(n).DeleteTopics(request, timeout=5))
    assert response.error == pb.NONE
    got = [(r.name, r.topic_id, name(r.error)) for r in response.topics]
    assert got == [
        ("defaulted", ids["defaulted"], "NONE"),
        ("nope", "", "UNKNOWN_TOPIC_OR_PARTITION"),
        ("tuned", ids["tuned"], "INVALID_REQUEST"),
        ("", "", "INVALID_REQUEST"),
        ("placed", ids["placed"], "NONE"),
        ("", request.topic_ids[1], "UNKNOWN_TOPIC_OR_PARTITION"),
        ("tuned", ids["tuned"], "INVALID_REQUEST"),
        ("", "not-an-id", "INVALID_REQUEST"),
    ]
    left = await describe(cluster)
    assert [t.name for t in left.topics] == ["orders", "tuned"]

    grow = pb.CreatePartitionsRequest(
        topics=[
            pb.CreatePartitionsTopic(name="orders", count=8),
            pb.CreatePartitionsTopic(name="orders", count=9),
            pb.CreatePartitionsTopic(name="tuned", count=1),
            pb.CreatePartitionsTopic(name="ghost", count=2),
        ]
    )
    response2 = await cluster.on_active(
        lambda n: cluster.admin(n).CreatePartitions(grow, timeout=5)
    )
    assert codes(response2.topics) == [
        "INVALID_REQUEST",
        "INVALID_REQUEST",
        "INVALID_PARTITIONS",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    grow = pb.CreatePartitionsRequest(
        topics=[
            pb.CreatePartitionsTopic(name="orders", count=8),
            pb.CreatePartitionsTopic(
                name="tuned",
                count=3,
                assignments=[
                    pb.ReplicaAssignment(partition=2, replicas=[3]),
                    pb.ReplicaAssignment(partition=1, replicas=[2]),
                ],
            ),
        ]
    )
    response3 = await cluster.on_active(
        lambda n: cluster.admin(n).CreatePartitions(grow, timeout=5)
    )
    assert codes(response3.topics) == ["NONE", "NONE"]
    assert len(await partitions(cluster, "orders")) == 8
    assert [list(p.replicas) for p in await partitions(cluster, "tuned")][1:] == [[2], [3]]
    wrong = pb.CreatePartitionsRequest(
        topics=[
            pb.CreatePartitionsTopic(
                name="tuned",
                count=4,
                assignments=[pb.ReplicaAssignment(partition=3, replicas=[1, 2])],
            ),
            pb.CreatePartitionsTopic(
                name="orders",
                count=9,
                assignments=[pb.ReplicaAssignment(partition=3, replicas=[1, 2, 3])],
            ),
        ],
        validate_only=True,
    )
    response4 = await cluster.on_active(
        lambda n: cluster.admin(n).CreatePartitions(wrong, timeout=5)
    )
    assert codes(response4.topics) == ["INVALID_REPLICA_ASSIGNMENT", "INVALID_REPLICA_ASSIGNMENT"]
    assert "replication factor 1" in response4.topics[0].message


async def _features_and_producer_ids(
    cluster: MetadataCluster, brokers: dict[int, TestBroker]
) -> None:
    features = await cluster.on_active(
        lambda n: cluster.admin(n).DescribeFeatures(
            pb.DescribeFeaturesRequest(linearizable=True), timeout=5
        )
    )
    assert [
        (f.name, f.supported_min_version, f.supported_max_version, f.finalized_level)
        for f in features.features
    ] == [("metadata.version", 1, 1, 1)]
    update = pb.UpdateFeaturesRequest(
        updates=[
            pb.FeatureUpdate(name="metadata.version", level=1),
            pb.FeatureUpdate(name="no.such.feature", level=1),
            pb.FeatureUpdate(name="", level=1),
            pb.FeatureUpdate(name="twice", level=1),
            pb.FeatureUpdate(name="twice", level=2),
        ],
        validate_only=True,
    )
    updated = await cluster.on_active(lambda n: cluster.admin(n).UpdateFeatures(update, timeout=5))
    assert [r.name for r in updated.results] == [u.name for u in update.updates]
    assert codes(updated.results) == [
        "NONE",
        "INVALID_FEATURE_UPDATE",
        "INVALID_REQUEST",
        "INVALID_REQUEST",
        "INVALID_REQUEST",
    ]

    blocks = []
    for b in (1, 2, 1):
        allocate = pb.AllocateProducerIdsRequest(broker_id=b, broker_epoch=brokers[b].epoch)
        block = await cluster.on_active(
            lambda n: cluster.lifecycle(n).AllocateProducerIds(allocate, timeout=5)  # noqa: B023
        )
        assert block.error == pb.NONE, block
        blocks.append((block.first_producer_id, block.count))
    assert all(count > 0 for _, count in blocks)
    for (first, count), (after, _) in zip(blocks, blocks[1:], strict=False):
        assert after >= first + count, blocks
    stale = await cluster.on_active(
        lambda n: cluster.lifecycle(n).AllocateProducerIds(
            pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=brokers[1].epoch + 1000),
            timeout=5,
        )
    )
    assert name(stale.error) == "STALE_BROKER_EPOCH"
    unknown = await cluster.on_active(
        lambda n: cluster.lifecycle(n).AllocateProducerIds(
            pb.AllocateProducerIdsRequest(broker_id=42, broker_epoch=1), timeout=5
        )
    )
    assert name(unknown.error) == "BROKER_ID_NOT_REGISTERED"

    # A broker that registers and is then unregistered.
    gone = TestBroker(cluster, 9)
    assert (await gone.register()).error == pb.NONE
    assert 9 in await brokers_of(cluster)
    # current_metadata_offset is an end offset: caught up only once it is
    # past the registration record, whose offset is the broker epoch.
    for offset, caught_up in ((gone.epoch, False), (gone.epoch + 1, True)):
        beat = pb.BrokerHeartbeatRequest(
            broker_id=9, broker_epoch=gone.epoch, current_metadata_offset=offset
        )
        beaten = await cluster.on_active(
            lambda n: cluster.lifecycle(n).BrokerHeartbeat(beat, timeout=5)  # noqa: B023
        )
        assert beaten.error == pb.NONE, beaten
        assert (beaten.is_caught_up, beaten.is_fenced) == (caught_up, not caught_up), offset
    for expected in ("NONE", "BROKER_ID_NOT_REGISTERED"):
        answer = await cluster.on_active(
            lambda n: cluster.admin(n).UnregisterBroker(
                pb.UnregisterBrokerRequest(broker_id=9), timeout=5
            )
        )
        assert name(answer.error) == expected, answer
    assert 9 not in await brokers_of(cluster)


async def _malformed(cluster: MetadataCluster, brokers: dict[int, TestBroker]) -> None:
    """Malformed requests: INVALID_REQUEST naming the field, never a crash."""
    good = TestBroker(cluster, 7).registration()
    cases: list[tuple[pb.RegisterBrokerRequest, str]] = []
    for change, field in (
        ({"incarnation_id": "not-a-uuid"}, "incarnation_id"),
        ({"incarnation_id": "AAAAAAAAAAAAAAAAAAAAAA"}, "incarnation_id"),
        ({"broker_id": -3}, "broker_id"),
        ({"cluster_id": "another-cluster-000000"}, "cluster"),
        ({"previous_broker_epoch": -7}, "previous_broker_epoch"),
    ):
        request = pb.RegisterBrokerRequest()
        request.CopyFrom(good)
        for key, value in change.items():
            setattr(request, key, value)
        cases.append((request, field))
    no_endpoint = pb.RegisterBrokerRequest()
    no_endpoint.CopyFrom(good)
    del no_endpoint.endpoints[:]
    cases.append((no_endpoint, "endpoints"))
    bad_port = pb.RegisterBrokerRequest()
    bad_port.CopyFrom(good)
    bad_port.endpoints[0].port = 70000
    cases.append((bad_port, "port"))
    # Log directory ids (KIP-858): Uuids, none reserved, none twice.
    for dirs, field in (
        (["not-a-uuid"], "log_dirs[0] 'not-a-uuid' is not a directory id"),
        (["AAAAAAAAAAAAAAAAAAAAAQ"], "log_dirs[0] 'AAAAAAAAAAAAAAAAAAAAAQ'"),  # LOST
        (["ZzZzZzZzZzZzZzZzZzZzZw", "ZzZzZzZzZzZzZzZzZzZzZw"], "listed twice"),
    ):
        with_dirs = pb.RegisterBrokerRequest()
        with_dirs.CopyFrom(good)
        with_dirs.log_dirs.extend(dirs)
        cases.append((with_dirs, field))
    for request, field in cases:
        answer = await cluster.on_active(
            lambda n: cluster.lifecycle(n).RegisterBroker(request, timeout=5)  # noqa: B023
        )
        assert name(answer.error) == "INVALID_REQUEST", (request, answer)
        assert field in answer.message, (field, answer.message)
        assert answer.broker_epoch == 0
    assert 7 not in await brokers_of(cluster)

    beat = await cluster.on_active(
        lambda n: cluster.lifecycle(n).BrokerHeartbeat(
            pb.BrokerHeartbeatRequest(broker_id=1, broker_epoch=-5), timeout=5
        )
    )
    assert name(beat.error) == "INVALID_REQUEST" and "broker_epoch" in beat.message
    elect = await cluster.on_active(
        lambda n: cluster.admin(n).ElectLeaders(pb.ElectLeadersRequest(type=7), timeout=5)  # type: ignore[arg-type]
    )
    assert name(elect.error) == "INVALID_REQUEST" and "type" in elect.message
    assert not elect.results
    unregister = await cluster.on_active(
        lambda n: cluster.admin(n).UnregisterBroker(
            pb.UnregisterBrokerRequest(broker_id=-1), timeout=5
        )
    )
    assert name(unregister.error) == "INVALID_REQUEST"
    alter = await cluster.on_active(
        lambda n: cluster.lifecycle(n).AlterPartition(
            pb.AlterPartitionRequest(
                broker_id=1,
                broker_epoch=brokers[1].epoch,
                topics=[
                    pb.AlterPartitionTopic(
                        topic_id="bogus",
                        partitions=[pb.AlterPartitionPartition(partition=0, leader_epoch=0)],
                    ),
                    pb.AlterPartitionTopic(
                        topic_id=new_uuid(),
                        partitions=[
                            pb.AlterPartitionPartition(partition=-2),
                            pb.AlterPartitionPartition(partition=0),
                        ],
                    ),
                ],
            ),
            timeout=5,
        )
    )
    assert alter.error == pb.NONE, alter
    assert [codes(t.partitions) for t in alter.topics] == [
        ["INVALID_REQUEST"],
        ["INVALID_REQUEST", "UNKNOWN_TOPIC_OR_PARTITION"],
    ]
    assert "topic_id" in alter.topics[0].partitions[0].message
    assert "partition" in alter.topics[1].partitions[0].message
    assert alter.topics[1].partitions[1].leader == -1
    listing = await cluster.on_active(
        lambda n: cluster.admin(n).ListPartitionReassignments(
            pb.ListPartitionReassignmentsRequest(
                partitions=[pb.TopicPartition(topic="orders", partition=-1)], linearizable=True
            ),
            timeout=5,
        )
    )
    assert name(listing.error) == "INVALID_REQUEST" and "partition" in listing.message


async def _unexpected(
    cluster: MetadataCluster, brokers: dict[int, TestBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error in the controller is an answer, not a gRPC failure."""
    decisions = cluster.controller(await cluster.wait_active()).controller

    def boom(broker_id: int, broker_epoch: int) -> None:
        raise RuntimeError("injected failure")

    with monkeypatch.context() as patch:
        patch.setattr(decisions, "allocate_producer_ids", boom)
        answer = await cluster.on_active(
            lambda n: cluster.lifecycle(n).AllocateProducerIds(
                pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=brokers[1].epoch),
                timeout=5,
            )
        )
    assert name(answer.error) == "UNKNOWN_SERVER_ERROR", answer
    assert "injected failure" in answer.message
    assert answer.first_producer_id == 0 and answer.count == 0
    assert answer.leader.leader_id == cluster.active_node()


class _NamesLeader(Protocol):
    @property
    def leader(self) -> Any: ...


A = TypeVar("A", bound=_NamesLeader)


async def _naming_the_leader(cluster: MetadataCluster, call: Callable[[], Awaitable[A]]) -> A:
    """A standby's answer once it names a leader: on a loaded host a standby
    may lose sight of the leader for a moment (its fetch timeout passes and
    it becomes prospective, KIP-996) and answer NOT_CONTROLLER without one;
    asked again until it knows the leader."""
    answers: list[A] = []

    async def named() -> bool:
        answers.append(await call())
        return bool(answers[-1].leader.leader_id >= 0)

    await cluster.eventually(named, what="the standby names the active controller")
    return answers[-1]


async def _standby(cluster: MetadataCluster) -> None:
    active = await cluster.wait_active()
    standby = cluster.standbys()[0]
    orders = list((await describe(cluster, "orders")).topics)
    write = await _naming_the_leader(
        cluster,
        lambda: cluster.admin(standby).CreateTopics(
            pb.CreateTopicsRequest(topics=[topic("from-standby", 1, 1)]), timeout=5
        ),
    )
    assert name(write.error) == "NOT_CONTROLLER", write
    assert not write.topics
    assert write.leader.leader_id == active
    assert write.leader.leader_address == cluster.voters[active]
    linearizable = await _naming_the_leader(
        cluster,
        lambda: cluster.admin(standby).DescribeTopics(
            pb.DescribeTopicsRequest(names=["orders"], linearizable=True), timeout=5
        ),
    )
    assert name(linearizable.error) == "NOT_CONTROLLER"
    assert not linearizable.topics and linearizable.leader.leader_id == active
    beat = await _naming_the_leader(
        cluster,
        lambda: cluster.lifecycle(standby).BrokerHeartbeat(
            pb.BrokerHeartbeatRequest(broker_id=1, broker_epoch=1, current_metadata_offset=1),
            timeout=5,
        ),
    )
    assert name(beat.error) == "NOT_CONTROLLER" and beat.leader.leader_id == active

    # Stale reads are answered by the standby from its own image.
    async def caught_up() -> bool:
        stale = await cluster.admin(standby).DescribeTopics(
            pb.DescribeTopicsRequest(names=["orders"], linearizable=False), timeout=5
        )
        assert stale.error == pb.NONE
        return stale.topics[0] == orders[0]

    await cluster.eventually(caught_up, what="the standby's stale read shows orders")
    stale_cluster = await cluster.admin(standby).DescribeCluster(
        pb.DescribeClusterRequest(linearizable=False), timeout=5
    )
    assert stale_cluster.error == pb.NONE
    assert stale_cluster.controller_id == active
    assert [b.broker_id for b in stale_cluster.brokers] == [1, 2, 3]
    stale_list = await cluster.admin(standby).ListTopics(pb.ListTopicsRequest(), timeout=5)
    assert stale_list.error == pb.NONE and "orders" in {t.name for t in stale_list.topics}


async def _health_and_reflection(cluster: MetadataCluster) -> None:
    for address in cluster.voters.values():
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in (ADMIN, LIFECYCLE):
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=2
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, (address, service)

            async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            answers = [a async for a in stub.ServerReflectionInfo(ask(), timeout=5)]
            listed = {s.name for s in answers[0].list_services_response.service}
            assert {ADMIN, LIFECYCLE} <= listed, listed


# -- brokers failing, shutting down, leading; reassignments ------------------------------


async def alter_partition(
    cluster: MetadataCluster,
    broker: TestBroker,
    topic_id: str,
    p: pb.PartitionDescription,
    isr: Iterable[int],
    brokers: dict[int, TestBroker],
    *,
    leader_epoch: int | None = None,
    partition_epoch: int | None = None,
    broker_epoch: int | None = None,
) -> pb.AlterPartitionResponse:
    request = pb.AlterPartitionRequest(
        broker_id=broker.broker_id,
        broker_epoch=broker.epoch if broker_epoch is None else broker_epoch,
        topics=[
            pb.AlterPartitionTopic(
                topic_id=topic_id,
                partitions=[
                    pb.AlterPartitionPartition(
                        partition=p.partition,
                        leader_epoch=p.leader_epoch if leader_epoch is None else leader_epoch,
                        partition_epoch=(
                            p.partition_epoch if partition_epoch is None else partition_epoch
                        ),
                        new_isr=[
                            pb.BrokerState(broker_id=b, broker_epoch=brokers[b].epoch) for b in isr
                        ],
                    )
                ],
            )
        ],
    )
    return await cluster.on_active(
        lambda n: cluster.lifecycle(n).AlterPartition(request, timeout=5)
    )


async def elect(
    cluster: MetadataCluster, kind: int, *partitions: tuple[str, int]
) -> pb.ElectLeadersResponse:
    request = pb.ElectLeadersRequest(
        type=kind,  # type: ignore[arg-type]
        partitions=[pb.TopicPartition(topic=t, partition=i) for t, i in partitions],
    )
    response = await cluster.on_active(lambda n: cluster.admin(n).ElectLeaders(request, timeout=5))
    assert response.error == pb.NONE, response
    return response


@pytest.mark.slow
def test_brokers_fail_shut_down_and_lead(tmp_path: Path) -> None:
    async def go() -> None:
        async with running_metadata(tmp_path) as cluster:
            await cluster.wait_active()
            brokers = await start_brokers(cluster, (1, 2, 3, 4))
            try:
                created = await create(
                    cluster,
                    # min ISR 3: a replica leaving the ISR is eligible (KIP-966).
                    topic(
                        "flow",
                        assignments=assignment([1, 2, 3], [2, 3, 4], [3, 4, 1]),
                        configs={"min.insync.replicas": "3"},
                    ),
                    topic("spread", 8, 3),
                )
                flow_id = created.topics[0].topic_id
                await _kill_and_return(cluster, brokers, flow_id)
                await _alter_partition_and_elect(cluster, brokers, flow_id)
                await _reassign(cluster, brokers, flow_id)
                await _controlled_shutdown(cluster, brokers)
            finally:
                await stop_brokers(brokers.values())

    run(go())


async def _kill_and_return(
    cluster: MetadataCluster, brokers: dict[int, TestBroker], flow_id: str
) -> None:
    before = {name: await partitions(cluster, name) for name in ("flow", "spread")}
    led_by_1 = [(name, p.partition) for name, ps in before.items() for p in ps if p.leader == 1]
    assert ("flow", 0) in led_by_1
    killed_at = asyncio.get_running_loop().time()
    await brokers[1].stop()

    async def re_led() -> bool:
        now = {name: await partitions(cluster, name) for name in ("flow", "spread")}
        return (
            all(p.leader != 1 and 1 not in p.isr for ps in now.values() for p in ps)
            and (await brokers_of(cluster))[1].fenced
        )

    await cluster.eventually(re_led, timeout_s=SESSION_S + 3, what="broker 1's partitions re-led")
    took = asyncio.get_running_loop().time() - killed_at
    assert took < SESSION_S + 2, took
    after = {name: await partitions(cluster, name) for name in ("flow", "spread")}
    for name, i in led_by_1:
        old, new = before[name][i], after[name][i]
        # The new leader was in the ISR, and the leader epoch went up.
        assert new.leader in old.isr and new.leader != -1, (name, i, old, new)
        assert new.leader_epoch == old.leader_epoch + 1
        assert new.partition_epoch > old.partition_epoch
    assert after["flow"][0].leader == 2  # the next replica in preference order
    assert list(after["flow"][0].isr) == [2, 3]
    # Below min ISR 3, broker 1 left the ISR holding every committed
    # record: DescribeTopics shows it eligible.
    assert list(after["flow"][0].eligible_leader_replicas) == [1]
    assert list(after["flow"][0].last_known_elr) == []
    # Broker 1 is fenced: its replicas are offline, and only its.
    assert [list(p.offline_replicas) for p in after["flow"]] == [[1], [], [1]]
    # The other brokers were not disturbed.
    live = await brokers_of(cluster)
    assert [b for b in (2, 3, 4) if live[b].fenced] == []

    # Broker 1 comes back: a new incarnation, accepted now that the old
    # session is over; it is unfenced but not back in any ISR yet.
    brokers[1] = TestBroker(cluster, 1)
    await brokers[1].start()
    back = await partitions(cluster, "flow")
    assert back[0].leader == 2 and 1 not in back[0].isr
    # It registered without its previous broker epoch (an unclean
    # shutdown): no longer eligible.  The last-known ELR holds only a last
    # known leader (KIP-966), and a partition with a leader has none.
    assert list(back[0].eligible_leader_replicas) == []
    assert list(back[0].last_known_elr) == []
    # Unfenced again: no replica is offline.
    assert [list(p.offline_replicas) for p in back] == [[], [], []]


async def _alter_partition_and_elect(
    cluster: MetadataCluster, brokers: dict[int, TestBroker], flow_id: str
) -> None:
    p = (await partitions(cluster, "flow"))[0]
    assert (p.leader, list(p.replicas)) == (2, [1, 2, 3]) and p.leader_epoch >= 1
    # The preferred leader is not in the ISR: it cannot lead yet.
    refused = await elect(cluster, pb.PREFERRED, ("flow", 0))
    assert codes(refused.results) == ["PREFERRED_LEADER_NOT_AVAILABLE"]

    isr = [2, 3, 1]
    wrong = {
        "FENCED_LEADER_EPOCH": {"leader_epoch": p.leader_epoch - 1},
        "UNKNOWN_LEADER_EPOCH": {"leader_epoch": p.leader_epoch + 1},
        "INVALID_UPDATE_VERSION": {"partition_epoch": p.partition_epoch - 1},
        "UNKNOWN_PARTITION_EPOCH": {"partition_epoch": p.partition_epoch + 1},
    }
    for expected, change in wrong.items():
        answer = await alter_partition(cluster, brokers[2], flow_id, p, isr, brokers, **change)
        assert answer.error == pb.NONE, answer
        (result,) = answer.topics[0].partitions
        assert name(result.error) == expected, (expected, result)
        # The answer carries the partition's current state.
        assert (result.leader, result.leader_epoch, result.partition_epoch) == (
            p.leader,
            p.leader_epoch,
            p.partition_epoch,
        )
        assert list(result.isr) == list(p.isr)
    # From a broker that does not lead the partition.
    answer = await alter_partition(cluster, brokers[3], flow_id, p, isr, brokers)
    assert codes(answer.topics[0].partitions) == ["NOT_LEADER_OR_FOLLOWER"]
    # With the leader's old broker epoch: refused as a whole.
    answer = await alter_partition(
        cluster, brokers[2], flow_id, p, isr, brokers, broker_epoch=brokers[2].epoch - 1
    )
    assert name(answer.error) == "STALE_BROKER_EPOCH" and not answer.topics
    assert answer.leader.leader_id == cluster.active_node()

    # The leader adds broker 1 back to the ISR.
    answer = await alter_partition(cluster, brokers[2], flow_id, p, isr, brokers)
    assert answer.error == pb.NONE
    assert [t.topic_id for t in answer.topics] == [flow_id]
    (result,) = answer.topics[0].partitions
    assert result.error == pb.NONE, result
    assert (result.partition, result.leader, result.leader_epoch) == (0, 2, p.leader_epoch)
    assert result.partition_epoch == p.partition_epoch + 1
    assert list(result.isr) == isr
    now = (await partitions(cluster, "flow"))[0]
    assert list(now.isr) == isr and now.partition_epoch == result.partition_epoch
    # The same change again: its partition epoch is now stale.
    again = await alter_partition(cluster, brokers[2], flow_id, p, isr, brokers)
    assert codes(again.topics[0].partitions) == ["INVALID_UPDATE_VERSION"]

    # Now the preferred replica can lead again.
    elected = await elect(cluster, pb.PREFERRED, ("flow", 0), ("flow", 1), ("nope", 0))
    assert codes(elected.results) == ["NONE", "ELECTION_NOT_NEEDED", "UNKNOWN_TOPIC_OR_PARTITION"]
    assert [(r.topic, r.partition) for r in elected.results] == [
        ("flow", 0),
        ("flow", 1),
        ("nope", 0),
    ]
    led = (await partitions(cluster, "flow"))[0]
    assert led.leader == 1 and led.leader_epoch == p.leader_epoch + 1
    # Every partition: only those an election was tried for are reported.
    everything = await elect(cluster, pb.PREFERRED)
    assert all(r.error != pb.ELECTION_NOT_NEEDED for r in everything.results)
    for r in everything.results:
        assert r.topic in ("flow", "spread"), r
    # The partitions broker 1 lost when it died: it is no longer in their
    # ISR, so it cannot become their leader again.
    for r in everything.results:
        assert name(r.error) in ("NONE", "PREFERRED_LEADER_NOT_AVAILABLE"), r
    unclean = await elect(cluster, pb.UNCLEAN, ("flow", 0))
    assert codes(unclean.results) == ["ELECTION_NOT_NEEDED"]


async def _reassign(cluster: MetadataCluster, brokers: dict[int, TestBroker], flow_id: str) -> None:
    async def reassign(
        *items: tuple[str, int, list[int]],
    ) -> pb.AlterPartitionReassignmentsResponse:
        request = pb.AlterPartitionReassignmentsRequest(
            partitions=[
                pb.ReassignablePartition(topic=t, partition=i, replicas=r) for t, i, r in items
            ]
        )
        response = await cluster.on_active(
            lambda n: cluster.admin(n).AlterPartitionReassignments(request, timeout=5)
        )
        assert response.error == pb.NONE, response
        return response

    async def ongoing(
        *wanted: tuple[str, int],
    ) -> list[tuple[str, int, list[int], list[int], list[int]]]:
        request = pb.ListPartitionReassignmentsRequest(
            partitions=[pb.TopicPartition(topic=t, partition=i) for t, i in wanted],
            linearizable=True,
        )
        response = await cluster.on_active(
            lambda n: cluster.admin(n).ListPartitionReassignments(request, timeout=5)
        )
        assert response.error == pb.NONE, response
        return [
            (
                r.topic,
                r.partition,
                list(r.replicas),
                list(r.adding_replicas),
                list(r.removing_replicas),
            )
            for r in response.reassignments
        ]

    p1 = (await partitions(cluster, "flow"))[1]
    assert list(p1.replicas) == [2, 3, 4] and p1.leader == 2
    started = await reassign(
        ("flow", 1, [4, 1, 2]), ("flow", 2, [9, 1]), ("flow", 7, [1]), ("flow", 0, [])
    )
    assert codes(started.results) == [
        "NONE",
        "INVALID_REPLICA_ASSIGNMENT",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "NO_REASSIGNMENT_IN_PROGRESS",
    ]
    assert await ongoing() == [("flow", 1, [4, 1, 2, 3], [1], [3])]
    assert await ongoing(("flow", 1), ("flow", 2), ("nope", 0)) == await ongoing()
    assert await ongoing(("flow", 2)) == []
    moving = (await partitions(cluster, "flow"))[1]
    assert list(moving.adding_replicas) == [1] and list(moving.removing_replicas) == [3]

    # The new replica caught up: the leader adds it to the ISR, which
    # completes the reassignment (the removed replica leaves).
    answer = await alter_partition(cluster, brokers[2], flow_id, moving, [*moving.isr, 1], brokers)
    (result,) = answer.topics[0].partitions
    assert result.error == pb.NONE, result
    assert sorted(result.isr) == [1, 2, 4]
    assert await ongoing() == []
    done = (await partitions(cluster, "flow"))[1]
    assert list(done.replicas) == [4, 1, 2]
    assert not done.adding_replicas and not done.removing_replicas
    assert done.leader == 2 and done.leader_epoch > moving.leader_epoch

    # Start one more, then cancel it: the replicas before it come back.
    before = (await partitions(cluster, "spread"))[0]
    target = [b for b in (1, 2, 3, 4) if b not in before.replicas][:1] + list(before.replicas[:2])
    assert codes((await reassign(("spread", 0, target))).results) == ["NONE"]
    assert len(await ongoing()) == 1
    assert codes((await reassign(("spread", 0, []))).results) == ["NONE"]
    assert await ongoing() == []
    assert list((await partitions(cluster, "spread"))[0].replicas) == list(before.replicas)
    assert codes((await reassign(("spread", 0, []))).results) == ["NO_REASSIGNMENT_IN_PROGRESS"]


async def _controlled_shutdown(cluster: MetadataCluster, brokers: dict[int, TestBroker]) -> None:
    async def led_by(b: int) -> list[tuple[str, int]]:
        return [
            (name, p.partition)
            for name in ("flow", "spread")
            for p in await partitions(cluster, name)
            if p.leader == b
        ]

    leading = await led_by(3)
    assert leading, "broker 3 leads nothing to move"
    answers = await brokers[3].controlled_shutdown()
    # Told to go only once it leads nothing; on the way it was shutting down.
    assert answers[-1].should_shut_down
    assert await led_by(3) == []
    assert any(a.in_controlled_shutdown and not a.should_shut_down for a in answers), answers
    assert not answers[-1].in_controlled_shutdown and answers[-1].is_fenced
    for name in ("flow", "spread"):
        for p in await partitions(cluster, name):
            assert 3 not in p.isr, (name, p)
            assert p.leader != -1 or list(p.isr) == [], (name, p)
    described = (await brokers_of(cluster))[3]
    assert described.fenced and not described.in_controlled_shutdown
    # The others carry on.
    for b in (1, 2, 4):
        await brokers[b].wait(lambda r: not r.is_fenced and not r.in_controlled_shutdown)


# -- failover -----------------------------------------------------------------------------


@pytest.mark.slow
def test_failover_keeps_metadata_and_broker_sessions(tmp_path: Path) -> None:
    async def go() -> None:
        async with running_metadata(tmp_path) as cluster:
            old = await cluster.wait_active()
            brokers = await start_brokers(cluster, (1, 2, 3), racks=True)
            try:
                await create(cluster, topic("kept", 6, 3), topic("also-kept", 2, 2))
                await alter_configs(
                    cluster,
                    pb.AlterConfigsResource(
                        type=TOPIC, name="kept", ops=[set_op("retention.ms", "1234")]
                    ),
                )
                topics_before = list((await describe(cluster)).topics)
                brokers_before = await brokers_of(cluster)
                assert all(not b.fenced for b in brokers_before.values())
                assert {b: d.rack for b, d in brokers_before.items()} == {
                    1: "rack-1",
                    2: "rack-0",
                    3: "rack-1",
                }

                # The active controller dies.
                await cluster.stop(old, resign=False)
                failed_at = time.monotonic()
                new = await cluster.wait_active()
                assert new != old
                # Its answers name it; the metadata is all there.
                topics_after = await describe(cluster)
                assert topics_after.leader.leader_id == new
                assert list(topics_after.topics) == topics_before
                assert await brokers_of(cluster) == brokers_before
                (kept,) = (
                    await describe_configs(cluster, pb.ConfigResource(type=TOPIC, name="kept"))
                ).results
                assert entries(kept) == {"retention.ms": ("1234", "TOPIC_CONFIG")}

                # The brokers find the new controller and keep their
                # registrations: fresh sessions there, nobody fenced even
                # after a whole session timeout.
                await asyncio.sleep(SESSION_S + 1)
                for b in brokers.values():
                    assert b.last_ok > failed_at + SESSION_S, b.broker_id
                    assert b.last is not None and not b.last.is_fenced
                after = await brokers_of(cluster)
                assert after == brokers_before, (after, brokers_before)

                # Writes work on the new active controller.
                made = await create(cluster, topic("after-failover", 3, 3))
                assert codes(made.topics) == ["NONE"]
                for p in await partitions(cluster, "after-failover"):
                    assert sorted(p.isr) == [1, 2, 3]

                # The old controller comes back as a standby and catches up.
                await cluster.start(old)
                final = list((await describe(cluster)).topics)

                async def caught_up() -> bool:
                    try:
                        stale = await cluster.admin(old).DescribeTopics(
                            pb.DescribeTopicsRequest(linearizable=False), timeout=5
                        )
                    except grpc.aio.AioRpcError:
                        return False  # still reconnecting
                    return stale.error == pb.NONE and list(stale.topics) == final

                await cluster.eventually(caught_up, what="the restarted controller caught up")
                refused = await cluster.admin(old).CreateTopics(
                    pb.CreateTopicsRequest(topics=[topic("x", 1, 1)]), timeout=5
                )
                if cluster.active_node() != old:
                    assert name(refused.error) == "NOT_CONTROLLER"
                    assert refused.leader.leader_id == cluster.active_node()
            finally:
                await stop_brokers(brokers.values())

    run(go())

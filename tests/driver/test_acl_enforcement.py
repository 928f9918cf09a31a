"""Authorization on a real controller quorum over mutual TLS: every client
method of the node (the metadata admin service, the quorum's Resign and
DescribeQuorum, the key-value store) is refused PERMISSION_DENIED to a
user's certificate without an ACL, naming the principal, the operation and
the resource, with one audit line per refusal; ACLs added by a super user
(through the client and through ``kq acls``) allow it, a DENY beats an
ALLOW, prefixed ACLs cover their prefix, ACLs survive a restart and a
snapshot, and a broker's certificate cannot speak for another broker id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from kqproto import (
    kv_pb2,
    kv_pb2_grpc,
    metadata_pb2,
    metadata_pb2_grpc,
    quorum_pb2,
    quorum_pb2_grpc,
)
from kvstore.client import KvClient
from metadata.active import ControllerSettings
from metadata.authorizer import AuthorizerSettings
from metadata.client import AclFilter, MetadataClient, PermissionDeniedError, acl_binding
from quorum.driver.client import ClientError
from quorum.driver.identity import Identity, Role
from quorum.driver.node import NodeOptions
from quorum.driver.plugin import AUDIT_LOGGER
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.storage_format import format_storage
from quorum.driver.tls import dial
from server.controller import controller_server, plugin_of
from tests.driver.cluster_util import CLUSTER_ID, FAST, Cluster, run, started
from tests.metadata.metadata_cluster import SETTINGS, new_uuid

RPC_S = 5.0
ADMIN = "admin"
SUPER = AuthorizerSettings(super_users=frozenset({f"User:{ADMIN}"}))


class TlsMetadataCluster(Cluster):
    """Controllers with the metadata plug-in on mutual TLS, ``User:admin``
    a super user."""

    def __init__(
        self, root: Path, options: NodeOptions = FAST, settings: ControllerSettings = SETTINGS
    ) -> None:
        super().__init__(root, 3, options, tls=True)
        self.settings = settings

    def make_server(self, config: NodeConfig) -> NodeServer:
        return controller_server(config, self.settings, authorizer=SUPER)

    def user(self, name: str) -> grpc.ChannelCredentials:
        return self.tls_files(Identity.user(CLUSTER_ID, name)).channel_credentials()

    def broker(self, broker_id: int) -> grpc.ChannelCredentials:
        return self.tls_files(
            Identity.node(CLUSTER_ID, Role.BROKER, broker_id)
        ).channel_credentials()

    def client(self, name: str) -> MetadataClient:
        return MetadataClient(list(self.voters.values()), credentials=self.user(name))

    async def wait_active(self) -> int:
        def active() -> int | None:
            for n, s in self.servers.items():
                if plugin_of(s).controller.is_active:
                    return n
            return None

        await self.wait_for(lambda: active() is not None, 15.0)
        found = active()
        assert found is not None
        return found


@asynccontextmanager
async def broker_running(cluster: TlsMetadataCluster, broker_id: int = 0) -> AsyncIterator[None]:
    """A broker that registers with its own certificate and heartbeats
    (reporting itself caught up), so topics can be placed on it."""
    channels = {a: dial(a, cluster.broker(broker_id)) for a in cluster.voters.values()}
    stubs = {a: metadata_pb2_grpc.BrokerLifecycleServiceStub(c) for a, c in channels.items()}
    epoch = -1
    while epoch < 0:
        for stub in stubs.values():
            r = await stub.RegisterBroker(_registration(broker_id), timeout=RPC_S)
            if r.error == M.NONE:
                epoch = r.broker_epoch
                break
        await asyncio.sleep(0.05)

    async def beat() -> None:
        while True:
            for stub in stubs.values():
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.BrokerHeartbeat(
                        M.BrokerHeartbeatRequest(
                            broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=2**40
                        ),
                        timeout=RPC_S,
                    )
            await asyncio.sleep(0.2)

    task = asyncio.create_task(beat())
    try:
        await cluster.wait_for(
            lambda: any(
                (b := plugin_of(s).controller.committed_image().brokers.get(broker_id)) is not None
                and not b.fenced
                for s in cluster.servers.values()
            )
        )
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for c in channels.values():
            await c.close()


@asynccontextmanager
async def tls_metadata(
    root: Path, options: NodeOptions = FAST
) -> AsyncIterator[TlsMetadataCluster]:
    async with started(TlsMetadataCluster(root, options)) as cluster:
        await cluster.wait_active()
        async with broker_running(cluster):
            yield cluster


async def _status(call: Awaitable[Any]) -> tuple[str, str]:
    """The gRPC status of a call, and its details ("OK", "" if answered)."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


M = metadata_pb2
CLUSTER_RES = "CLUSTER kafka-cluster"
# Every client method of a controller node: the call, and the operation
# and resource it needs (Kafka's mapping; docs/security.md's table).
Call = Callable[[grpc.aio.Channel], Awaitable[Any]]


def _admin(method: str, request: Any) -> Call:
    return lambda ch: getattr(metadata_pb2_grpc.AdminServiceStub(ch), method)(
        request, timeout=RPC_S
    )


METHODS: dict[str, tuple[Call, str, str]] = {
    "CreateTopics": (
        _admin("CreateTopics", M.CreateTopicsRequest(topics=[M.CreatableTopic(name="t1")])),
        "CREATE",
        "TOPIC t1",
    ),
    "DeleteTopics": (
        _admin("DeleteTopics", M.DeleteTopicsRequest(names=["t1"])),
        "DELETE",
        "TOPIC t1",
    ),
    "CreatePartitions": (
        _admin(
            "CreatePartitions",
            M.CreatePartitionsRequest(topics=[M.CreatePartitionsTopic(name="t1", count=2)]),
        ),
        "ALTER",
        "TOPIC t1",
    ),
    "DescribeTopics": (
        _admin("DescribeTopics", M.DescribeTopicsRequest(names=["t1"])),
        "DESCRIBE",
        "TOPIC t1",
    ),
    "DescribeCluster": (
        _admin("DescribeCluster", M.DescribeClusterRequest()),
        "DESCRIBE",
        CLUSTER_RES,
    ),
    "DescribeConfigs": (
        _admin(
            "DescribeConfigs",
            M.DescribeConfigsRequest(resources=[M.ConfigResource(type=M.TOPIC, name="t1")]),
        ),
        "DESCRIBE_CONFIGS",
        "TOPIC t1",
    ),
    "AlterConfigs": (
        _admin(
            "AlterConfigs",
            M.AlterConfigsRequest(resources=[M.AlterConfigsResource(type=M.BROKER, name="1")]),
        ),
        "ALTER_CONFIGS",
        CLUSTER_RES,
    ),
    "ElectLeaders": (_admin("ElectLeaders", M.ElectLeadersRequest()), "ALTER", CLUSTER_RES),
    "AlterPartitionReassignments": (
        _admin("AlterPartitionReassignments", M.AlterPartitionReassignmentsRequest()),
        "ALTER",
        CLUSTER_RES,
    ),
    "ListPartitionReassignments": (
        _admin("ListPartitionReassignments", M.ListPartitionReassignmentsRequest()),
        "DESCRIBE",
        CLUSTER_RES,
    ),
    "UnregisterBroker": (
        _admin("UnregisterBroker", M.UnregisterBrokerRequest(broker_id=9)),
        "ALTER",
        CLUSTER_RES,
    ),
    "DescribeFeatures": (
        _admin("DescribeFeatures", M.DescribeFeaturesRequest()),
        "DESCRIBE",
        CLUSTER_RES,
    ),
    "UpdateFeatures": (_admin("UpdateFeatures", M.UpdateFeaturesRequest()), "ALTER", CLUSTER_RES),
    "CreateAcls": (_admin("CreateAcls", M.CreateAclsRequest()), "ALTER", CLUSTER_RES),
    "DeleteAcls": (_admin("DeleteAcls", M.DeleteAclsRequest()), "ALTER", CLUSTER_RES),
    "DescribeAcls": (_admin("DescribeAcls", M.DescribeAclsRequest()), "DESCRIBE", CLUSTER_RES),
    "Resign": (
        lambda ch: quorum_pb2_grpc.QuorumServiceStub(ch).Resign(
            quorum_pb2.ResignRequest(), timeout=RPC_S
        ),
        "ALTER",
        CLUSTER_RES,
    ),
    "DescribeQuorum": (
        lambda ch: quorum_pb2_grpc.QuorumServiceStub(ch).DescribeQuorum(
            quorum_pb2.DescribeQuorumRequest(), timeout=RPC_S
        ),
        "DESCRIBE",
        CLUSTER_RES,
    ),
    "Put": (
        lambda ch: kv_pb2_grpc.KvServiceStub(ch).Put(
            kv_pb2.PutRequest(key="k", value=b"v"), timeout=RPC_S
        ),
        "WRITE",
        CLUSTER_RES,
    ),
    "Get": (
        lambda ch: kv_pb2_grpc.KvServiceStub(ch).Get(kv_pb2.GetRequest(key="k"), timeout=RPC_S),
        "READ",
        CLUSTER_RES,
    ),
}


def test_the_table_covers_every_admin_method() -> None:
    admin = metadata_pb2.DESCRIPTOR.services_by_name["AdminService"]
    # ListTopics is not refused: it leaves out what the caller may not see.
    assert {m.name for m in admin.methods} - {"ListTopics"} <= set(METHODS)


def _audit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == AUDIT_LOGGER]


def test_every_client_method_is_refused_without_an_acl_and_allowed_with_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)

    async def go() -> None:
        async with tls_metadata(tmp_path) as cluster:
            address = cluster.voters[await cluster.wait_active()]
            async with cluster.client(ADMIN) as admin:
                made = await admin.create_topics([_topic("t1")])
                assert made.topics[0].error == M.NONE, made.topics[0].message
            caplog.clear()
            async with dial(address, cluster.user("alice")) as channel:
                for method, (call, operation, resource) in METHODS.items():
                    code, details = await _status(call(channel))
                    assert code == "PERMISSION_DENIED", (method, code, details)
                    expected = f"User:alice is not allowed {operation} on {resource}"
                    assert details == expected, (method, details)
                lines = _audit_lines(caplog)
                # One audit line per refusal, naming who, from where, what.
                assert len(lines) == len(METHODS), lines
                for line, (method, (_, operation, resource)) in zip(
                    lines, METHODS.items(), strict=True
                ):
                    assert line.startswith(
                        f"principal=User:alice host=127.0.0.1 operation={operation} "
                        f"resource={resource} method={method} decision=DENIED"
                    ), line
                # ListTopics is answered, without the topics alice may not describe.
                listed = await metadata_pb2_grpc.AdminServiceStub(channel).ListTopics(
                    M.ListTopicsRequest(), timeout=RPC_S
                )
                assert [t.name for t in listed.topics] == []
                # The super user grants alice everything on the cluster and t1.
                async with cluster.client(ADMIN) as admin:
                    created = await admin.create_acls(
                        [
                            acl_binding("CLUSTER", "kafka-cluster", "User:alice", "ALL"),
                            acl_binding("TOPIC", "t1", "User:alice", "ALL"),
                        ]
                    )
                    assert [r.error for r in created.results] == [M.NONE, M.NONE]
                    await _everywhere(cluster, 2)
                listed = await metadata_pb2_grpc.AdminServiceStub(channel).ListTopics(
                    M.ListTopicsRequest(), timeout=RPC_S
                )
                assert [t.name for t in listed.topics] == ["t1"]
                caplog.clear()
                for method, (call, _, _) in METHODS.items():
                    code, details = await _status(call(channel))
                    assert code == "OK", (method, code, details)
                assert _audit_lines(caplog) == []

    run(go())


def _topic(name: str) -> Any:
    from metadata.client import NewTopic

    return NewTopic(name, num_partitions=1, replication_factor=1)


def _has_snapshot(cluster: Cluster, node: int) -> bool:
    return cluster.servers[node].storage.snapshots.latest() is not None


async def _everywhere(cluster: Cluster, count: int) -> None:
    """Until every node's committed image holds ``count`` ACLs."""
    await cluster.wait_for(
        lambda: all(
            len(plugin_of(s).controller.committed_image().acls) == count
            for s in cluster.servers.values()
        )
    )


def test_the_key_value_client_reports_a_refusal_as_definite(tmp_path: Path) -> None:
    async def go() -> None:
        async with tls_metadata(tmp_path) as cluster:
            addresses = list(cluster.voters.values())
            async with KvClient(addresses, credentials=cluster.user("alice")) as alice:
                with pytest.raises(ClientError, match="User:alice is not allowed WRITE"):
                    await alice.put("k", b"v")
                with pytest.raises(ClientError, match="User:alice is not allowed READ"):
                    await alice.get("k")
            async with cluster.client(ADMIN) as admin:
                await admin.create_acls(
                    [acl_binding("CLUSTER", "kafka-cluster", "User:alice", "WRITE")]
                )
            await _everywhere(cluster, 1)
            async with KvClient(addresses, credentials=cluster.user("alice")) as alice:
                await alice.put("k", b"v")
                # WRITE implies DESCRIBE, not READ.
                with pytest.raises(ClientError, match="READ on CLUSTER"):
                    await alice.get("k")

    run(go())


def test_deny_beats_allow_and_prefixes_cover_their_topics(tmp_path: Path) -> None:
    async def go() -> None:
        async with tls_metadata(tmp_path) as cluster:
            async with cluster.client(ADMIN) as admin:
                await admin.create_topics([_topic("team-a.orders"), _topic("team-a.secret")])
                await admin.create_acls(
                    [
                        acl_binding(
                            "TOPIC", "team-a.", "User:alice", "DESCRIBE", pattern_type="PREFIXED"
                        ),
                        acl_binding("TOPIC", "team-a.secret", "User:alice", "DESCRIBE", "DENY"),
                    ]
                )
                await _everywhere(cluster, 2)
            async with cluster.client("alice") as alice:
                listed = await alice.list_topics()
                assert [t.name for t in listed.topics] == ["team-a.orders"]
                described = await alice.describe_topics(["team-a.orders"])
                assert described.topics[0].name == "team-a.orders"
                with pytest.raises(PermissionDeniedError, match="DESCRIBE on TOPIC team-a.secret"):
                    await alice.describe_topics(["team-a.secret"])
                # Prefixed DESCRIBE does not grant DELETE.
                with pytest.raises(PermissionDeniedError, match="DELETE on TOPIC team-a.orders"):
                    await alice.delete_topics(["team-a.orders"])
            # CREATE on a prefix lets alice create topics under it only.
            async with cluster.client(ADMIN) as admin:
                await admin.create_acls(
                    [
                        acl_binding(
                            "TOPIC", "team-a.", "User:alice", "CREATE", pattern_type="PREFIXED"
                        )
                    ]
                )
                deleted = await admin.delete_acls([AclFilter(permission="DENY")])
                assert [len(r.deleted) for r in deleted.results] == [1]
                await _everywhere(cluster, 2)
            async with cluster.client("alice") as alice:
                made = await alice.create_topics([_topic("team-a.new")])
                assert made.topics[0].error == M.NONE
                with pytest.raises(PermissionDeniedError, match="CREATE on TOPIC team-b.new"):
                    await alice.create_topics([_topic("team-b.new")])
                # The deleted DENY no longer hides the secret topic.
                listed = await alice.list_topics()
                assert [t.name for t in listed.topics] == [
                    "team-a.new",
                    "team-a.orders",
                    "team-a.secret",
                ]

    run(go())


async def _acl_then_records(
    cluster: TlsMetadataCluster, binding: metadata_pb2.AclBinding, prefix: str
) -> None:
    """One ACL binding, then enough records after it (topics ``<prefix>0``
    to ``<prefix>7``) for every node to snapshot past it; every node holds
    the binding."""
    async with cluster.client(ADMIN) as admin:
        await admin.create_acls([binding])
        for i in range(8):
            await admin.create_topics([_topic(f"{prefix}{i}")])
    await _everywhere(cluster, 1)


def test_acls_survive_a_restart_and_a_snapshot(tmp_path: Path) -> None:
    options = replace(FAST, snapshot_every_offsets=5)

    async def go() -> None:
        async with tls_metadata(tmp_path, options) as cluster:
            await _acl_then_records(
                cluster,
                acl_binding("CLUSTER", "kafka-cluster", "User:alice", "DESCRIBE"),
                "filler-",
            )
            for n in list(cluster.servers):
                await cluster.wait_for(functools.partial(_has_snapshot, cluster, n))
            for n in list(cluster.servers):
                await cluster.stop(n, resign=False)
            for n in cluster.voters:
                await cluster.start(n)
            await cluster.wait_active()
            # Every node loaded the binding back (from its snapshot and log).
            await _everywhere(cluster, 1)
            async with cluster.client("alice") as alice:
                described = await alice.describe_cluster()
                assert described.cluster_id == CLUSTER_ID
                with pytest.raises(PermissionDeniedError, match="ALTER on CLUSTER"):
                    await alice.elect_leaders(M.PREFERRED)

    run(go())


def test_a_new_node_gets_the_acls_from_the_leaders_snapshot(tmp_path: Path) -> None:
    options = replace(FAST, snapshot_every_offsets=5)

    async def go() -> None:
        async with tls_metadata(tmp_path, options) as cluster:
            await _acl_then_records(
                cluster,
                acl_binding("TOPIC", "t", "User:alice", "DESCRIBE", pattern_type="PREFIXED"),
                "t",
            )
            leader = await cluster.wait_leader()
            # The leader's log no longer starts at 0: a new node must install
            # its snapshot, not replay the ACL's record.
            await cluster.wait_for(lambda: leader.node.status().log_start_offset > 0, 15.0)
            new = next(n for n in cluster.voters if n != leader.config.node_id)
            await cluster.stop(new, resign=False)
            shutil.rmtree(tmp_path / f"node-{new}")
            format_storage(tmp_path / f"node-{new}", CLUSTER_ID, new, cluster.voters.keys())
            server = await cluster.start(new)
            await cluster.wait_for(
                lambda: len(plugin_of(server).controller.committed_image().acls) == 1, 15.0
            )
            assert server.storage.snapshots.latest() is not None
            # The new node enforces them: a stale read it answers itself.
            async with MetadataClient(
                [cluster.voters[new]], credentials=cluster.user("alice")
            ) as c:
                described = await c.describe_topics(["t3"], linearizable=False)
                assert described.topics[0].name == "t3"
                with pytest.raises(PermissionDeniedError, match="DELETE on TOPIC t3"):
                    await c.delete_topics(["t3"])

    run(go())


def _registration(broker_id: int) -> metadata_pb2.RegisterBrokerRequest:
    return metadata_pb2.RegisterBrokerRequest(
        broker_id=broker_id,
        cluster_id=CLUSTER_ID,
        incarnation_id=new_uuid(),
        endpoints=[
            metadata_pb2.Endpoint(
                name="BROKER", host="127.0.0.1", port=9092, security_protocol="SSL"
            )
        ],
        features=[
            metadata_pb2.SupportedFeature(name="metadata.version", min_version=1, max_version=1)
        ],
    )


def test_a_broker_certificate_speaks_only_for_its_own_broker_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)

    async def go() -> None:
        async with tls_metadata(tmp_path) as cluster:
            address = cluster.voters[await cluster.wait_active()]
            async with dial(address, cluster.broker(7)) as channel:
                stub = metadata_pb2_grpc.BrokerLifecycleServiceStub(channel)
                own = await stub.RegisterBroker(_registration(7), timeout=RPC_S)
                assert own.error == M.NONE, own.message
                caplog.clear()
                code, details = await _status(stub.RegisterBroker(_registration(8), timeout=RPC_S))
                assert code == "PERMISSION_DENIED"
                assert details == (
                    f"Broker:7 (kq://{CLUSTER_ID}/broker/7) may not call RegisterBroker as broker 8"
                )
                for method, request in (
                    ("BrokerHeartbeat", M.BrokerHeartbeatRequest(broker_id=8, broker_epoch=1)),
                    ("AlterPartition", M.AlterPartitionRequest(broker_id=8, broker_epoch=1)),
                    (
                        "AllocateProducerIds",
                        M.AllocateProducerIdsRequest(broker_id=8, broker_epoch=1),
                    ),
                ):
                    code, details = await _status(getattr(stub, method)(request, timeout=RPC_S))
                    assert code == "PERMISSION_DENIED", method
                    assert f"may not call {method} as broker 8" in details
                assert len(_audit_lines(caplog)) == 4
                # Its own heartbeat goes through.
                beat = await stub.BrokerHeartbeat(
                    M.BrokerHeartbeatRequest(broker_id=7, broker_epoch=own.broker_epoch),
                    timeout=RPC_S,
                )
                assert beat.error == M.NONE, beat.message
            # A user's certificate, even the super user's, is not a broker.
            async with dial(address, cluster.user(ADMIN)) as channel:
                stub = metadata_pb2_grpc.BrokerLifecycleServiceStub(channel)
                code, details = await _status(stub.RegisterBroker(_registration(7), timeout=RPC_S))
                assert code == "PERMISSION_DENIED"
                assert "User:admin" in details and "as broker 7" in details

    run(go())

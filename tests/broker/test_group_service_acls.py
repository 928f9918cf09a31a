"""The group service enforces the metadata image's ACLs for the caller its
certificate names (mutual TLS): Read on the group to heartbeat and commit,
Read on each topic committed, Describe (implied by Read) to describe or
fetch offsets, Delete to delete; a refusal names the principal, the
operation and the resource, and writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from broker.errors import Errors
from broker.group_service import GroupService
from kqproto import groups_pb2, groups_pb2_grpc
from metadata.acls import AclOperation, AclResourceType
from metadata.authorizer import AuthorizerSettings
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.tls import TlsFiles, dial
from server.certs import issue
from tests.broker.images import topic
from tests.broker.test_group_coordinator import KEY, Brokers
from tests.broker.test_service import CLUSTER, Certs, acl, certs  # noqa: F401 (fixture)

E = Errors


@contextlib.asynccontextmanager
async def serving(service: GroupService, issued: Certs) -> AsyncIterator[str]:
    server = grpc.aio.server()
    groups_pb2_grpc.add_GroupServiceServicer_to_server(service, server)
    paths = issue(
        issued.folder, Identity.node(CLUSTER, IdentityRole.BROKER, 1), hosts=("127.0.0.1",)
    )
    tls = TlsFiles(issued.folder / "ca.crt", paths.cert, paths.key)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def commit_request(group: str, *topics: str) -> groups_pb2.OffsetCommitRequest:
    return groups_pb2.OffsetCommitRequest(
        group_id=group,
        member_epoch=-1,
        topics=[
            groups_pb2.OffsetCommitTopic(
                name=name, partitions=[groups_pb2.OffsetCommitPartition(partition=0, offset=3)]
            )
            for name in topics
        ],
    )


def test_group_acls(certs: Certs) -> None:  # noqa: F811 (the fixture)
    async def body() -> None:
        brokers = Brokers()
        brokers.step_and_publish(
            *topic("t", "id-t", (1, 2, 3)),
            *topic("u", "id-u", (1, 2, 3)),
            acl("g1", "User:alice", AclOperation.READ, "g", resource=AclResourceType.GROUP),
            acl("t1", "User:alice", AclOperation.READ, "t"),
        )
        service = GroupService(
            brokers.coordinators[1], authorizer=AuthorizerSettings(super_users=frozenset())
        )

        async def replicate() -> None:
            while True:
                brokers.replicate_and_wake(1)
                await asyncio.sleep(0.005)

        replicating = asyncio.create_task(replicate())
        try:
            await brokers.loaded(1)
            async with serving(service, certs) as address:
                channel = dial(address, certs.user("alice"))
                stub = groups_pb2_grpc.GroupServiceStub(channel)
                log = brokers.log(1, KEY)
                # Commit: the group allowed, one topic allowed, the other not.
                answer = await stub.OffsetCommit(commit_request("g", "t", "u"))
                assert answer.error == E.NONE, answer.message
                codes = [(t.name, t.partitions[0].error) for t in answer.topics]
                assert codes == [("t", E.NONE), ("u", E.TOPIC_AUTHORIZATION_FAILED)]
                assert "User:alice" in answer.topics[1].partitions[0].message
                # Another group: refused whole, nothing written.
                before = log.log_end_offset
                refused = await stub.OffsetCommit(commit_request("h", "t"))
                assert refused.error == E.GROUP_AUTHORIZATION_FAILED
                assert "User:alice" in refused.message and "READ" in refused.message
                assert " h" in refused.message
                beat = await stub.ConsumerGroupHeartbeat(
                    groups_pb2.ConsumerGroupHeartbeatRequest(
                        group_id="h",
                        member_epoch=0,
                        rebalance_timeout_ms=1000,
                        subscribed_topic_names=groups_pb2.TopicNames(names=["t"]),
                    )
                )
                assert beat.error == E.GROUP_AUTHORIZATION_FAILED
                # Subscribing by name needs Describe on the topic.
                beat = await stub.ConsumerGroupHeartbeat(
                    groups_pb2.ConsumerGroupHeartbeatRequest(
                        group_id="g",
                        member_epoch=0,
                        rebalance_timeout_ms=1000,
                        subscribed_topic_names=groups_pb2.TopicNames(names=["u"]),
                    )
                )
                assert beat.error == E.TOPIC_AUTHORIZATION_FAILED and "u" in beat.message
                assert log.log_end_offset == before
                # Describe is implied by Read; Delete is not.
                fetched = await stub.OffsetFetch(groups_pb2.OffsetFetchRequest(group_id="g"))
                assert [(t.name, t.partitions[0].offset) for t in fetched.topics] == [("t", 3)]
                described = await stub.DescribeGroups(
                    groups_pb2.DescribeGroupsRequest(group_ids=["g", "h"])
                )
                assert [d.error for d in described.groups] == [
                    E.NONE,
                    E.GROUP_AUTHORIZATION_FAILED,
                ]
                deleted = await stub.DeleteGroups(groups_pb2.DeleteGroupsRequest(group_ids=["g"]))
                assert deleted.results[0].error == E.GROUP_AUTHORIZATION_FAILED
                assert "DELETE" in deleted.results[0].message
                listed = await stub.ListGroups(groups_pb2.ListGroupsRequest())
                assert [g.group_id for g in listed.groups] == ["g"]
                await channel.close()
        finally:
            replicating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replicating
            await brokers.stop()

    asyncio.run(asyncio.wait_for(body(), 60))

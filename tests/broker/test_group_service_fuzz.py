"""Malformed heartbeats and commits never crash the group service and
never change stored state: each damaged request (one damage applied to a
valid one) is refused with an error naming what was wrong, and the offsets
partition's log and the coordinator's groups are as they were; random
requests (Hypothesis-built fields) are answered, never raised."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import Errors
from broker.group_service import GroupService
from kqproto import groups_pb2
from tests.broker.group.harness import dump
from tests.broker.test_group_coordinator import KEY, Brokers, turns
from tests.broker.test_service_fuzz import PlaintextContext

Heartbeat = groups_pb2.ConsumerGroupHeartbeatRequest


def join(**fields: Any) -> Heartbeat:
    request = Heartbeat(
        group_id="g",
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=1000,
        subscribed_topic_names=groups_pb2.TopicNames(names=["t"]),
        owned=groups_pb2.Assignment(),
    )
    for name, value in fields.items():
        if isinstance(value, groups_pb2.Assignment | groups_pb2.TopicNames):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    return request


def owned(topic_id: str, *partitions: int) -> groups_pb2.Assignment:
    return groups_pb2.Assignment(
        topics=[groups_pb2.TopicPartitions(topic_id=topic_id, partitions=list(partitions))]
    )


# (damaged request given the member's id and epoch, the error it must get)
DAMAGED_HEARTBEATS: list[tuple[str, Callable[[str, int], Heartbeat], Errors]] = [
    ("empty group", lambda m, e: join(group_id=""), Errors.INVALID_REQUEST),
    ("long group", lambda m, e: join(group_id="g" * 256), Errors.INVALID_REQUEST),
    ("epoch -2", lambda m, e: join(member_epoch=-2), Errors.INVALID_REQUEST),
    ("epoch 3 no id", lambda m, e: join(member_epoch=3), Errors.INVALID_REQUEST),
    ("join owning", lambda m, e: join(owned=owned("id-t", 0)), Errors.INVALID_REQUEST),
    ("owned bad id", lambda m, e: join(owned=owned("", 0)), Errors.INVALID_REQUEST),
    ("owned bad partition", lambda m, e: join(owned=owned("id-t", -4)), Errors.INVALID_REQUEST),
    ("join no timeout", lambda m, e: join(rebalance_timeout_ms=0), Errors.INVALID_REQUEST),
    ("bad regex", lambda m, e: join(subscribed_topic_regex="(x"), Errors.INVALID_REQUEST),
    ("assignor", lambda m, e: join(server_assignor="nope"), Errors.UNSUPPORTED_ASSIGNOR),
    (
        "no subscription",
        lambda m, e: Heartbeat(group_id="g", member_epoch=0, rebalance_timeout_ms=10),
        Errors.INVALID_REQUEST,
    ),
    (
        "unknown member",
        lambda m, e: Heartbeat(group_id="g", member_id="ghost", member_epoch=e),
        Errors.UNKNOWN_MEMBER_ID,
    ),
    (
        "epoch ahead",
        lambda m, e: Heartbeat(group_id="g", member_id=m, member_epoch=e + 7, owned=owned("x")),
        Errors.FENCED_MEMBER_EPOCH,
    ),
    (
        "leave unknown",
        lambda m, e: Heartbeat(group_id="g", member_id="ghost", member_epoch=-1),
        Errors.UNKNOWN_MEMBER_ID,
    ),
]


def commit(
    member: str, epoch: int, *parts: groups_pb2.OffsetCommitPartition, group: str = "g"
) -> groups_pb2.OffsetCommitRequest:
    return groups_pb2.OffsetCommitRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        topics=[groups_pb2.OffsetCommitTopic(name="t", partitions=list(parts))],
    )


P = groups_pb2.OffsetCommitPartition
DAMAGED_COMMITS: list[tuple[str, Callable[[str, int], groups_pb2.OffsetCommitRequest], Errors]] = [
    ("stale", lambda m, e: commit(m, e + 1, P(partition=0, offset=1)), Errors.STALE_MEMBER_EPOCH),
    ("unknown", lambda m, e: commit("x", e, P(partition=0, offset=1)), Errors.UNKNOWN_MEMBER_ID),
    ("outside", lambda m, e: commit("", -1, P(partition=0, offset=1)), Errors.UNKNOWN_MEMBER_ID),
    ("empty group", lambda m, e: commit(m, e, P(offset=1), group=""), Errors.INVALID_GROUP_ID),
    ("long group", lambda m, e: commit(m, e, P(offset=1), group="g" * 300), Errors.INVALID_REQUEST),
    ("negative offset", lambda m, e: commit(m, e, P(offset=-3)), Errors.INVALID_REQUEST),
    ("negative partition", lambda m, e: commit(m, e, P(partition=-1)), Errors.INVALID_REQUEST),
    ("epoch -5", lambda m, e: commit(m, e, P(offset=3, leader_epoch=-5)), Errors.INVALID_REQUEST),
    (
        "metadata",
        lambda m, e: commit(m, e, P(partition=0, offset=3, metadata="x" * 5000)),
        Errors.OFFSET_METADATA_TOO_LARGE,
    ),
]  # fmt: skip


class Setup:
    """A loaded coordinator on broker 1 with one member and one commit."""

    def __init__(self) -> None:
        self.brokers = Brokers()
        for coordinator in self.brokers.coordinators.values():
            coordinator.topic = dataclasses.replace(coordinator.topic, commit_timeout_ms=200)
        self.service = GroupService(self.brokers.coordinators[1])
        self.member = ""
        self.epoch = 0

    async def replicated(self, call: Any) -> Any:
        task = asyncio.ensure_future(call)
        await turns()
        self.brokers.replicate_and_wake()
        return await task

    async def seed(self) -> None:
        await self.brokers.loaded(1)
        joined = await self.replicated(self.service.ConsumerGroupHeartbeat(join(), CTX))
        assert joined.error == Errors.NONE, joined.message
        self.member, self.epoch = joined.member_id, joined.member_epoch
        answer = await self.replicated(
            self.service.OffsetCommit(commit(self.member, self.epoch, P(offset=5)), CTX)
        )
        assert answer.topics[0].partitions[0].error == Errors.NONE

    def stored(self) -> tuple[int, object]:
        partition_log = self.brokers.log(1, KEY)
        context = self.brokers.coordinators[1]._contexts[0]
        return partition_log.log_end_offset, dump(context.shard.groups)


CTX = PlaintextContext()


def run(body: Callable[[Setup], Any]) -> None:
    async def main() -> None:
        setup = Setup()
        try:
            await setup.seed()
            await asyncio.wait_for(body(setup), 60)
        finally:
            await setup.brokers.stop()

    asyncio.run(main())


def test_damaged_requests_are_refused_and_change_nothing() -> None:
    async def body(setup: Setup) -> None:
        for name, damaged, code in DAMAGED_HEARTBEATS:
            before = setup.stored()
            answer = await setup.service.ConsumerGroupHeartbeat(
                damaged(setup.member, setup.epoch), CTX
            )
            assert answer.error == code, (name, answer)
            assert answer.message, name
            assert not answer.HasField("assignment"), name
            assert setup.stored() == before, name
        for name, damaged_commit, code in DAMAGED_COMMITS:
            before = setup.stored()
            committed = await setup.service.OffsetCommit(
                damaged_commit(setup.member, setup.epoch), CTX
            )
            codes = {committed.error} | {p.error for t in committed.topics for p in t.partitions}
            assert committed.error == code or codes == {Errors.NONE, code}, (name, committed)
            assert setup.stored() == before, name

    run(body)


names = st.sampled_from(["g", "g", "", "h", "x" * 300, "\x00"])
assignments = st.builds(
    groups_pb2.Assignment,
    topics=st.lists(
        st.builds(
            groups_pb2.TopicPartitions,
            topic_id=st.sampled_from(["id-t", "", "bogus"]),
            partitions=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
        ),
        max_size=2,
    ),
)
heartbeats = st.builds(
    Heartbeat,
    group_id=names,
    member_id=st.sampled_from(["", "ghost", "x" * 300]),
    member_epoch=st.integers(-(2**31), 2**31 - 1),
    rebalance_timeout_ms=st.integers(-(2**31), 2**31 - 1),
    subscribed_topic_names=st.one_of(
        st.none(), st.builds(groups_pb2.TopicNames, names=st.lists(names, max_size=3))
    ),
    subscribed_topic_regex=st.one_of(st.none(), st.sampled_from(["", ".*", "(", "t|u"])),
    server_assignor=st.one_of(st.none(), st.sampled_from(["uniform", "range", "", "zz"])),
    owned=st.one_of(st.none(), assignments),
)
commits = st.builds(
    groups_pb2.OffsetCommitRequest,
    group_id=names,
    member_id=st.sampled_from(["", "ghost"]),
    member_epoch=st.integers(-(2**31), 2**31 - 1),
    topics=st.lists(
        st.builds(
            groups_pb2.OffsetCommitTopic,
            name=names,
            partitions=st.lists(
                st.builds(
                    P,
                    partition=st.integers(-(2**31), 2**31 - 1),
                    offset=st.integers(-(2**63), 2**63 - 1),
                    leader_epoch=st.integers(-(2**31), 2**31 - 1),
                    metadata=st.text(max_size=20),
                ),
                max_size=3,
            ),
        ),
        max_size=2,
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(heartbeats, commits), min_size=1, max_size=8))
def test_random_requests_are_answered(requests: list[Any]) -> None:
    async def body(setup: Setup) -> None:
        for request in requests:
            answer: Any = (
                await setup.service.ConsumerGroupHeartbeat(request, CTX)
                if isinstance(request, Heartbeat)
                else await setup.service.OffsetCommit(request, CTX)
            )
            Errors(answer.error)  # a code of Kafka's

    run(body)

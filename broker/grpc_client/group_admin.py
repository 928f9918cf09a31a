"""The admin client's consumer-group half (Kafka's ``Admin.listConsumerGroups``,
``describeConsumerGroups``, ``listConsumerGroupOffsets``,
``alterConsumerGroupOffsets``, ``deleteConsumerGroups`` and
``deleteConsumerGroupOffsets``), what ``kq groups`` is built on.

- ``list_groups`` asks EVERY broker (each answers only the groups it
  coordinates, as Kafka's ``ListConsumerGroupsHandler`` does) and merges the
  answers; a broker that does not answer makes the whole listing an error
  naming it, never a silently shorter list.
- The other calls go to the group's coordinator through
  :class:`GroupCoordinatorClient` (NOT_COORDINATOR hints followed,
  COORDINATOR_NOT_AVAILABLE and LOAD_IN_PROGRESS waited out until the
  timeout).
- ``alter_group_offsets`` commits outside membership (member id "", epoch
  -1), which the coordinator allows only for a group without members; its
  UNKNOWN_MEMBER_ID refusal is raised as :class:`GroupHasMembersError`.
- ``plan_reset`` computes ``kafka-consumer-groups.sh --reset-offsets``'s new
  offsets (``ResetOffsetsCommand``), each kept within the partition's
  [log start, high watermark] as Kafka's ``checkOffsetsRange`` does.

Errors raise :class:`BrokerClientError` naming the group (and partition).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar, cast

import grpc

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.admin import Admin, OffsetSpec
from broker.grpc_client.coordinator import GroupCoordinatorClient, GroupStub
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.metadata_cache import PERMANENT_REFUSALS, MetadataCache
from kqproto import groups_pb2, groups_pb2_grpc
from quorum.driver.tls import TlsFiles

__all__ = [
    "CommittedOffset",
    "GroupAdmin",
    "GroupDescription",
    "GroupHasMembersError",
    "GroupListing",
    "GroupNotFoundError",
    "MemberDescription",
    "PartitionLag",
    "ResetKind",
    "ResetSpec",
]

M = TypeVar("M")


class GroupNotFoundError(BrokerClientError):
    """The group does not exist (GROUP_ID_NOT_FOUND)."""

    def __init__(self, group_id: str) -> None:
        super().__init__(int(Errors.GROUP_ID_NOT_FOUND), f"group {group_id!r} does not exist")
        self.group_id = group_id


class GroupHasMembersError(BrokerClientError):
    """An admin's commit or reset refused because the group has members
    (the coordinator's UNKNOWN_MEMBER_ID to a commit outside membership)."""

    def __init__(self, group_id: str, detail: str) -> None:
        super().__init__(
            int(Errors.UNKNOWN_MEMBER_ID),
            f"group {group_id!r} has active members; stop them first ({detail})",
        )
        self.group_id = group_id


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    group_type: str
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    member_epoch: int
    state: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """``ConsumerGroupDescription``; ``coordinator`` is ``host:port``."""

    group_id: str
    state: str
    assignor: str
    group_epoch: int
    members: tuple[MemberDescription, ...]
    coordinator_id: int
    coordinator: str

    def owner(self, tp: TopicPartition) -> MemberDescription | None:
        """The member the partition is assigned to, if any."""
        for member in self.members:
            if tp in member.assignment:
                return member
        return None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """A partition's committed offset (None: the group has none), its high
    watermark (log end as consumers see it) and the lag between them."""

    committed: int | None
    log_end: int

    @property
    def lag(self) -> int | None:
        return None if self.committed is None else max(0, self.log_end - self.committed)


class ResetKind(enum.Enum):
    EARLIEST = "to-earliest"
    LATEST = "to-latest"
    OFFSET = "to-offset"
    DATETIME = "to-datetime"
    SHIFT_BY = "shift-by"


@dataclass(frozen=True, slots=True)
class ResetSpec:
    """A reset strategy; ``value`` is the offset, the time in ms or the
    shift (unused for earliest and latest)."""

    kind: ResetKind
    value: int = 0

    def __post_init__(self) -> None:
        if self.kind is ResetKind.OFFSET and self.value < 0:
            raise ValueError(f"--to-offset must be >= 0, not {self.value}")
        if self.kind is ResetKind.DATETIME and self.value < 0:
            raise ValueError(f"--to-datetime must be at or after 1970, not {self.value} ms")


async def _at_coordinator(
    client: GroupCoordinatorClient,
    what: str,
    method: Callable[[GroupStub, float], Awaitable[M]],
    timeout_ms: int,
) -> M:
    """``client.call``: its answer protocol declares ``error: int``, which
    mypy does not match with the generated messages' enum-typed ``error``,
    so the call is typed here by the method's own answer type."""
    answer: M = await client.call(what, cast(Any, method), timeout_ms)
    return answer


def _partitions(assignment: groups_pb2.Assignment) -> tuple[TopicPartition, ...]:
    return tuple(
        sorted(
            TopicPartition(t.topic or t.topic_id, p)
            for t in assignment.topics
            for p in t.partitions
        )
    )


def _topics(partitions: Iterable[TopicPartition]) -> list[groups_pb2.TopicPartitionNumbers]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [
        groups_pb2.TopicPartitionNumbers(name=t, partitions=sorted(p)) for t, p in by_topic.items()
    ]


class GroupAdmin:
    """Consumer groups over the brokers (module docstring)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
    ) -> None:
        self.admin = Admin(
            bootstrap,
            tls=tls,
            credentials=credentials,
            timeout_ms=timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self.timeout_ms = timeout_ms
        self.metadata: MetadataCache = self.admin.metadata
        self._coordinators: dict[str, GroupCoordinatorClient] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.admin.close()

    def coordinator(self, group_id: str) -> GroupCoordinatorClient:
        if not group_id:
            raise ValueError("a group id is not empty")
        client = self._coordinators.get(group_id)
        if client is None:
            client = self._coordinators[group_id] = GroupCoordinatorClient(self.metadata, group_id)
        return client

    async def _call(
        self, group_id: str, what: str, method: Callable[[GroupStub, float], Awaitable[M]]
    ) -> M:
        return await _at_coordinator(self.coordinator(group_id), what, method, self.timeout_ms)

    # -- listing ------------------------------------------------------------------

    async def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Every broker's groups (in ``states`` if given), by group id."""
        await self.metadata.refresh()
        wanted = list(states)
        brokers = dict(self.metadata.brokers)

        async def one(node: int, address: str) -> groups_pb2.ListGroupsResponse:
            stub: GroupStub = groups_pb2_grpc.GroupServiceStub(self.metadata.channel(address))
            try:
                answer = await stub.ListGroups(
                    groups_pb2.ListGroupsRequest(states=wanted), timeout=self.timeout_ms / 1000
                )
            except grpc.aio.AioRpcError as error:
                code = (
                    Errors.GROUP_AUTHORIZATION_FAILED
                    if error.code() in PERMANENT_REFUSALS
                    else Errors.BROKER_NOT_AVAILABLE
                )
                raise BrokerClientError(
                    int(code),
                    f"ListGroups at broker {node} ({address}): {error.code().name} "
                    f"{error.details()}; the listing would miss the groups it coordinates",
                ) from None
            if answer.error != Errors.NONE:
                raise BrokerClientError(
                    answer.error, f"ListGroups at broker {node} ({address}): {answer.message}"
                )
            return answer

        answers = await asyncio.gather(*(one(n, a) for n, a in sorted(brokers.items())))
        found: dict[str, GroupListing] = {}
        for answer in answers:
            for g in answer.groups:
                # During a coordinator move two brokers may both list a
                # group; one listing is kept.
                found.setdefault(
                    g.group_id,
                    GroupListing(g.group_id, g.state, g.group_type or "consumer", g.coordinator_id),
                )
        return [found[g] for g in sorted(found)]

    # -- describing ---------------------------------------------------------------

    async def describe_group(self, group_id: str) -> GroupDescription:
        """The group as its coordinator describes it;
        :class:`GroupNotFoundError` if it does not exist."""
        client = self.coordinator(group_id)

        async def call(stub: GroupStub, timeout_s: float) -> groups_pb2.GroupDescription:
            answer = await stub.DescribeGroups(
                groups_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=timeout_s
            )
            if answer.error != Errors.NONE:
                # A top-level refusal: as the group's own answer.
                return groups_pb2.GroupDescription(
                    group_id=group_id, error=answer.error, message=answer.message
                )
            return answer.groups[0]

        found = await _at_coordinator(client, "DescribeGroups", call, self.timeout_ms)
        if found.error == Errors.GROUP_ID_NOT_FOUND:
            raise GroupNotFoundError(group_id)
        if found.error != Errors.NONE:
            raise BrokerClientError(
                found.error, f"DescribeGroups of group {group_id!r}: {found.message}"
            )
        return GroupDescription(
            group_id=group_id,
            state=found.state,
            assignor=found.assignor,
            group_epoch=found.group_epoch,
            members=tuple(
                MemberDescription(
                    member_id=m.member_id,
                    client_id=m.client_id,
                    host=m.client_host,
                    instance_id=m.instance_id if m.HasField("instance_id") else None,
                    member_epoch=m.member_epoch,
                    state=m.state,
                    assignment=_partitions(m.assignment),
                )
                for m in found.members
            ),
            coordinator_id=client.node_id,
            coordinator=client.address or "",
        )

    async def describe_groups(self, group_ids: Sequence[str]) -> dict[str, GroupDescription]:
        """Each group at its coordinator (the first failure raises)."""
        ids = list(dict.fromkeys(group_ids))
        found = await asyncio.gather(*(self.describe_group(g) for g in ids))
        return dict(zip(ids, found, strict=True))

    # -- offsets ------------------------------------------------------------------

    async def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """The group's committed offsets (OffsetFetch): every partition it
        has one for, or those asked for (None where it has none)."""
        wanted = None if partitions is None else sorted(set(partitions))

        async def call(stub: GroupStub, timeout_s: float) -> groups_pb2.OffsetFetchResponse:
            return await stub.OffsetFetch(
                groups_pb2.OffsetFetchRequest(
                    group_id=group_id, topics=_topics(wanted or ()), member_epoch=-1
                ),
                timeout=timeout_s,
            )

        if wanted == []:
            return {}
        answer = await _at_coordinator(
            self.coordinator(group_id), "OffsetFetch", call, self.timeout_ms
        )
        if answer.error != Errors.NONE:
            raise BrokerClientError(
                answer.error, f"OffsetFetch of group {group_id!r}: {answer.message}"
            )
        out: dict[TopicPartition, CommittedOffset | None] = {}
        for topic in answer.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                if p.error != Errors.NONE:
                    raise BrokerClientError(
                        p.error, f"OffsetFetch of group {group_id!r}, {tp}: {p.message}"
                    )
                out[tp] = (
                    None
                    if p.offset < 0
                    else CommittedOffset(
                        p.offset, p.leader_epoch, p.metadata, p.commit_timestamp_ms
                    )
                )
        return dict(sorted(out.items()))

    async def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> None:
        """Commit ``offsets`` for the group outside membership; refused
        (:class:`GroupHasMembersError`) while the group has members.  A
        partition refused raises naming it (the others may be committed)."""
        for tp, offset in offsets.items():
            if offset < 0:
                raise ValueError(f"{tp}: offset {offset} is negative")
        by_topic: dict[str, list[groups_pb2.OffsetCommitPartition]] = {}
        for tp, offset in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                groups_pb2.OffsetCommitPartition(
                    partition=tp.partition, offset=offset, leader_epoch=-1
                )
            )
        request = groups_pb2.OffsetCommitRequest(
            group_id=group_id,
            member_id="",
            member_epoch=-1,
            topics=[
                groups_pb2.OffsetCommitTopic(name=t, partitions=p) for t, p in by_topic.items()
            ],
        )

        async def call(stub: GroupStub, timeout_s: float) -> groups_pb2.OffsetCommitResponse:
            return await stub.OffsetCommit(request, timeout=timeout_s)

        if not offsets:
            return
        answer = await _at_coordinator(
            self.coordinator(group_id), "OffsetCommit", call, self.timeout_ms
        )
        if answer.error == Errors.UNKNOWN_MEMBER_ID:
            raise GroupHasMembersError(group_id, answer.message)
        if answer.error != Errors.NONE:
            raise BrokerClientError(
                answer.error, f"OffsetCommit of group {group_id!r}: {answer.message}"
            )
        refused = [
            f"{topic.name}-{p.partition}: {Errors(p.error).name} {p.message}"
            for topic in answer.topics
            for p in topic.partitions
            if p.error != Errors.NONE
        ]
        if refused:
            raise BrokerClientError(
                int(Errors.INVALID_REQUEST),
                f"OffsetCommit of group {group_id!r} refused " + "; ".join(refused),
            )

    async def delete_groups(self, group_ids: Sequence[str]) -> dict[str, BrokerClientError | None]:
        """Delete each group (only a group without members): None where it
        was deleted, else the error naming why not."""
        ids = list(dict.fromkeys(group_ids))

        async def one(group_id: str) -> BrokerClientError | None:
            async def call(stub: GroupStub, timeout_s: float) -> groups_pb2.DeleteGroupResult:
                answer = await stub.DeleteGroups(
                    groups_pb2.DeleteGroupsRequest(group_ids=[group_id]), timeout=timeout_s
                )
                if answer.error != Errors.NONE:
                    return groups_pb2.DeleteGroupResult(
                        group_id=group_id, error=answer.error, message=answer.message
                    )
                return answer.results[0]

            result = await _at_coordinator(
                self.coordinator(group_id), "DeleteGroups", call, self.timeout_ms
            )
            if result.error == Errors.NONE:
                return None
            if result.error == Errors.GROUP_ID_NOT_FOUND:
                return GroupNotFoundError(group_id)
            if result.error == Errors.NON_EMPTY_GROUP:
                return BrokerClientError(
                    result.error,
                    f"group {group_id!r} is not empty ({result.message}); stop its members first",
                )
            return BrokerClientError(
                result.error, f"DeleteGroups of group {group_id!r}: {result.message}"
            )

        results = await asyncio.gather(*(one(g) for g in ids))
        return dict(zip(ids, results, strict=True))

    async def delete_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> None:
        """Delete the group's offsets of ``partitions`` (OffsetDelete); a
        topic the group subscribes to is refused."""
        wanted = sorted(set(partitions))

        async def call(stub: GroupStub, timeout_s: float) -> groups_pb2.OffsetDeleteResponse:
            return await stub.OffsetDelete(
                groups_pb2.OffsetDeleteRequest(group_id=group_id, topics=_topics(wanted)),
                timeout=timeout_s,
            )

        if not wanted:
            return
        answer = await _at_coordinator(
            self.coordinator(group_id), "OffsetDelete", call, self.timeout_ms
        )
        if answer.error == Errors.GROUP_ID_NOT_FOUND:
            raise GroupNotFoundError(group_id)
        if answer.error != Errors.NONE:
            raise BrokerClientError(
                answer.error, f"OffsetDelete of group {group_id!r}: {answer.message}"
            )
        refused = [
            (p.error, f"{topic.name}-{p.partition}: {p.message}")
            for topic in answer.topics
            for p in topic.partitions
            if p.error != Errors.NONE
        ]
        if refused:
            raise BrokerClientError(
                refused[0][0],
                f"OffsetDelete of group {group_id!r} refused " + "; ".join(m for _, m in refused),
            )

    # -- lag and resets -----------------------------------------------------------

    async def topic_partitions(self, topic: str) -> list[TopicPartition]:
        """Every partition of ``topic`` (:class:`UnknownTopicError` if none)."""
        return [TopicPartition(topic, p.partition) for p in await self.admin.topic(topic)]

    async def group_lag(
        self, group_id: str, partitions: Iterable[TopicPartition] = ()
    ) -> dict[TopicPartition, PartitionLag]:
        """Per partition with a committed offset (and each of ``partitions``,
        e.g. those assigned to members): committed offset against the high
        watermark (ListOffsets latest)."""
        committed = await self.list_group_offsets(group_id)
        every = sorted(set(committed) | set(partitions))
        if not every:
            return {}
        ends = await self.admin.list_offsets(dict.fromkeys(every, OffsetSpec.LATEST))
        out = {}
        for tp in every:
            current = committed.get(tp)
            out[tp] = PartitionLag(None if current is None else current.offset, ends[tp].offset)
        return out

    async def plan_reset(
        self, group_id: str, partitions: Iterable[TopicPartition], spec: ResetSpec
    ) -> dict[TopicPartition, int]:
        """The new offset of each partition under ``spec``
        (``ResetOffsetsCommand.prepareOffsetsToReset``): within [log start,
        high watermark]; shift-by from the committed offset (a partition
        without one is refused, as Kafka's ``resetByShiftBy`` refuses it);
        to-datetime's partitions with no record that late go to the high
        watermark."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        earliest = await self.admin.list_offsets(dict.fromkeys(wanted, OffsetSpec.EARLIEST))
        latest = await self.admin.list_offsets(dict.fromkeys(wanted, OffsetSpec.LATEST))

        def clamp(tp: TopicPartition, offset: int) -> int:
            return min(max(offset, earliest[tp].offset), latest[tp].offset)

        if spec.kind is ResetKind.EARLIEST:
            return {tp: earliest[tp].offset for tp in wanted}
        if spec.kind is ResetKind.LATEST:
            return {tp: latest[tp].offset for tp in wanted}
        if spec.kind is ResetKind.OFFSET:
            return {tp: clamp(tp, spec.value) for tp in wanted}
        if spec.kind is ResetKind.DATETIME:
            found = await self.admin.list_offsets(dict.fromkeys(wanted, spec.value))
            return {
                tp: latest[tp].offset if found[tp].offset < 0 else clamp(tp, found[tp].offset)
                for tp in wanted
            }
        committed = await self.list_group_offsets(group_id, wanted)
        out = {}
        for tp in wanted:
            current = committed.get(tp)
            if current is None:
                raise BrokerClientError(
                    int(Errors.INVALID_REQUEST),
                    f"group {group_id!r} has no committed offset for {tp} to shift",
                )
            out[tp] = clamp(tp, current.offset + spec.value)
        return out

"""The gRPC servicer of consumer groups (``kq.groups.GroupService``,
proto/kqproto/groups.proto): the shape of each request checked, the ACLs
of the metadata image enforced, then the group coordinator asked.

ACLs as Kafka's ``KafkaApis``: Describe on the group to find its
coordinator, fetch its offsets or describe it; Read on the group to
heartbeat and commit, and Read on every topic committed (Describe on every
topic subscribed by name, and on every topic whose offsets are fetched);
Delete on the group to delete it or its offsets; ListGroups shows the
groups the caller may describe (all of them with Describe on the cluster).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from broker.access import Caller, Permissions, broker_endpoint, caller_of
from broker.codec import error_to_proto as _pb
from broker.errors import Errors
from broker.group.api import (
    CommitPartition,
    GroupDescription,
    HeartbeatRequest,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    TxnOffsetCommitRequest,
)
from broker.group.placement import OFFSETS_TOPIC, partition_for
from broker.group.types import Partitions, by_topic
from broker.group_coordinator import CoordinatorFailure, GroupCoordinator
from kqproto import groups_pb2, groups_pb2_grpc
from metadata.acls import CLUSTER_NAME, AclOperation, AclResourceType
from metadata.authorizer import AuthorizerSettings
from metadata.image import MetadataImage

__all__ = ["GroupService"]

log = logging.getLogger("kq.broker.groups")

# Kafka's limits on strings it stores (group ids, member ids are UUIDs).
_MAX_ID = 255


class _Answered(Protocol):
    @property
    def error(self) -> Errors: ...

    @property
    def message(self) -> str: ...


_A = TypeVar("_A", bound=_Answered)


class _Invalid(Exception):
    """A malformed request: INVALID_REQUEST naming the field."""


def _owned(assignment: groups_pb2.Assignment, where: str) -> Partitions:
    out = set()
    for i, topic in enumerate(assignment.topics):
        if not topic.topic_id:
            raise _Invalid(f"{where}.topics[{i}].topic_id is empty")
        for partition in topic.partitions:
            if partition < 0:
                raise _Invalid(f"{where}.topics[{i}] names partition {partition}")
            out.add((topic.topic_id, partition))
    return frozenset(out)


def _assignment(partitions: Partitions, image: MetadataImage) -> groups_pb2.Assignment:
    out = groups_pb2.Assignment()
    for topic_id, numbers in by_topic(partitions).items():
        topic = image.topics.get(topic_id)
        out.topics.add(
            topic_id=topic_id, partitions=numbers, topic="" if topic is None else topic.name
        )
    return out


def _check_id(value: str, field: str) -> None:
    if len(value) > _MAX_ID:
        raise _Invalid(f"{field} is {len(value)} characters long (at most {_MAX_ID})")


class GroupService(groups_pb2_grpc.GroupServiceServicer):
    def __init__(
        self,
        coordinator: GroupCoordinator,
        *,
        listener: str = "BROKER",
        authorizer: AuthorizerSettings | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.listener = listener
        self.authorizer = authorizer or AuthorizerSettings()
        self.permissions = Permissions(self._image, self.authorizer)
        self._may = self.permissions.may

    def _image(self) -> MetadataImage:
        return self.coordinator.replicas.image

    def _may_group(
        self, caller: Caller, operation: AclOperation, group_id: str, method: str
    ) -> bool:
        return self._may(caller, operation, AclResourceType.GROUP, group_id, method)

    def _refused(
        self, response: Any, caller: Caller, operation: AclOperation, group_id: str, method: str
    ) -> bool:
        """Whether the ACLs refuse ``operation`` on the group: if so the
        response says so (``GROUP_AUTHORIZATION_FAILED``)."""
        return self.permissions.refused(
            response,
            caller,
            operation,
            AclResourceType.GROUP,
            group_id,
            method,
            _pb(Errors.GROUP_AUTHORIZATION_FAILED),
            f"group {group_id}",
        )

    def _coordinator(self, group_id: str) -> groups_pb2.Coordinator:
        """Where the image says ``group_id``'s coordinator is."""
        image = self._image()
        topic = image.topic_by_name(OFFSETS_TOPIC)
        if topic is None:
            return groups_pb2.Coordinator(
                group_id=group_id,
                error=_pb(Errors.COORDINATOR_NOT_AVAILABLE),
                message=f"the offsets topic {OFFSETS_TOPIC} does not exist yet",
                node_id=-1,
                partition=-1,
            )
        partition = partition_for(group_id, len(topic.partitions))
        registration = topic.partition(partition)
        leader = -1 if registration is None else registration.leader
        endpoint = None if leader < 0 else broker_endpoint(image, self.listener, leader)
        if endpoint is None:
            return groups_pb2.Coordinator(
                group_id=group_id,
                error=_pb(Errors.COORDINATOR_NOT_AVAILABLE),
                message=f"{OFFSETS_TOPIC}-{partition} has no leader reachable on "
                f"listener {self.listener}",
                node_id=-1,
                partition=partition,
            )
        return groups_pb2.Coordinator(
            group_id=group_id,
            node_id=leader,
            host=endpoint.host,
            port=endpoint.port,
            partition=partition,
        )

    async def _ask(self, response: Any, group_id: str, call: Awaitable[_A]) -> _A | None:
        """The coordinator's answer, or None once ``response`` says why there
        is none: this broker cannot serve the group (with the coordinator's
        whereabouts), or the coordinator refused the whole request."""
        try:
            answer = await call
        except CoordinatorFailure as failure:
            self._failure(response, failure, group_id)
            return None
        if answer.error is not Errors.NONE:
            response.error, response.message = _pb(answer.error), answer.message
            return None
        return answer

    def _failure(self, out: Any, failure: CoordinatorFailure, group_id: str) -> None:
        out.error, out.message = _pb(failure.code), failure.message
        if failure.code is Errors.NOT_COORDINATOR:
            out.coordinator.CopyFrom(self._coordinator(group_id))

    # -- FindCoordinator ------------------------------------------------------------

    async def FindCoordinator(
        self, request: groups_pb2.FindCoordinatorRequest, context: Any
    ) -> groups_pb2.FindCoordinatorResponse:
        caller = await caller_of(context)
        response = groups_pb2.FindCoordinatorResponse()
        for group_id in request.group_ids:
            if not group_id:
                response.coordinators.add(
                    group_id=group_id,
                    error=_pb(Errors.INVALID_REQUEST),
                    message="group id is empty",
                    node_id=-1,
                    partition=-1,
                )
                continue
            if not self._may_group(caller, AclOperation.DESCRIBE, group_id, "FindCoordinator"):
                response.coordinators.add(
                    group_id=group_id,
                    error=_pb(Errors.GROUP_AUTHORIZATION_FAILED),
                    message=f"{caller.describe()} is not allowed DESCRIBE on group {group_id}",
                    node_id=-1,
                    partition=-1,
                )
                continue
            found = self._coordinator(group_id)
            if found.partition < 0:
                # The first use of groups creates the topic (Kafka's
                # AutoTopicCreationManager for internal topics).
                self.coordinator.ensure_offsets_topic()
            response.coordinators.append(found)
        return response

    # -- ConsumerGroupHeartbeat -----------------------------------------------------

    async def ConsumerGroupHeartbeat(
        self, request: groups_pb2.ConsumerGroupHeartbeatRequest, context: Any
    ) -> groups_pb2.ConsumerGroupHeartbeatResponse:
        caller = await caller_of(context)
        response = groups_pb2.ConsumerGroupHeartbeatResponse(
            member_id=request.member_id, member_epoch=request.member_epoch
        )
        try:
            _check_id(request.group_id, "group_id")
            _check_id(request.member_id, "member_id")
            owned = _owned(request.owned, "owned") if request.HasField("owned") else None
            names = (
                tuple(request.subscribed_topic_names.names)
                if request.HasField("subscribed_topic_names")
                else None
            )
        except _Invalid as error:
            response.error, response.message = _pb(Errors.INVALID_REQUEST), str(error)
            return response
        if self._refused(
            response, caller, AclOperation.READ, request.group_id, "ConsumerGroupHeartbeat"
        ):
            return response
        for name in names or ():
            if name and not self._may(
                caller, AclOperation.DESCRIBE, AclResourceType.TOPIC, name, "ConsumerGroupHeartbeat"
            ):
                response.error = _pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                response.message = f"{caller.describe()} is not allowed DESCRIBE on topic {name}"
                return response
        heartbeat = HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id if request.HasField("instance_id") else None,
            rack_id=request.rack_id if request.HasField("rack_id") else None,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            subscribed_topic_names=names,
            subscribed_topic_regex=(
                request.subscribed_topic_regex
                if request.HasField("subscribed_topic_regex")
                else None
            ),
            server_assignor=(
                request.server_assignor if request.HasField("server_assignor") else None
            ),
            owned=owned,
            client_id=request.client_id,
            client_host=caller.host,
        )
        try:
            answer = await self.coordinator.heartbeat(heartbeat)
        except CoordinatorFailure as failure:
            self._failure(response, failure, request.group_id)
            return response
        response.error, response.message = _pb(answer.error), answer.message
        response.member_id, response.member_epoch = answer.member_id, answer.member_epoch
        response.heartbeat_interval_ms = answer.heartbeat_interval_ms
        if answer.assignment is not None:
            response.assignment.CopyFrom(_assignment(answer.assignment, self._image()))
        return response

    # -- offsets --------------------------------------------------------------------

    async def OffsetCommit(
        self, request: groups_pb2.OffsetCommitRequest, context: Any
    ) -> groups_pb2.OffsetCommitResponse:
        caller = await caller_of(context)
        response = groups_pb2.OffsetCommitResponse()
        try:
            _check_id(request.group_id, "group_id")
            _check_id(request.member_id, "member_id")
        except _Invalid as error:
            response.error, response.message = _pb(Errors.INVALID_REQUEST), str(error)
            return response
        if self._refused(response, caller, AclOperation.READ, request.group_id, "OffsetCommit"):
            return response

        def commit(partitions: tuple[CommitPartition, ...]) -> Awaitable[OffsetCommitResponse]:
            return self.coordinator.commit_offsets(
                OffsetCommitRequest(
                    request.group_id, request.member_id, request.member_epoch, partitions
                )
            )

        return await self._commit(response, caller, request, "OffsetCommit", commit)

    async def TxnOffsetCommit(
        self, request: groups_pb2.TxnOffsetCommitRequest, context: Any
    ) -> groups_pb2.OffsetCommitResponse:
        """Offsets in a transaction (KIP-98, KIP-447): Read on the group and
        on each topic, Write on the transactional id."""
        caller = await caller_of(context)
        response = groups_pb2.OffsetCommitResponse()
        try:
            _check_id(request.group_id, "group_id")
            _check_id(request.member_id, "member_id")
            _check_id(request.transactional_id, "transactional_id")
            if not request.transactional_id:
                raise _Invalid("transactional_id is empty")
            if request.producer_id < 0 or request.producer_epoch < 0:
                raise _Invalid(
                    f"producer_id {request.producer_id} and producer_epoch "
                    f"{request.producer_epoch}: a transaction's are not negative"
                )
        except _Invalid as error:
            response.error, response.message = _pb(Errors.INVALID_REQUEST), str(error)
            return response
        tid = request.transactional_id
        if not self._may(
            caller, AclOperation.WRITE, AclResourceType.TRANSACTIONAL_ID, tid, "TxnOffsetCommit"
        ):
            response.error = _pb(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            response.message = f"{caller.describe()} is not allowed WRITE on transactional id {tid}"
            return response
        if self._refused(response, caller, AclOperation.READ, request.group_id, "TxnOffsetCommit"):
            return response

        def commit(partitions: tuple[CommitPartition, ...]) -> Awaitable[OffsetCommitResponse]:
            return self.coordinator.txn_commit_offsets(
                TxnOffsetCommitRequest(
                    tid,
                    request.group_id,
                    request.producer_id,
                    request.producer_epoch,
                    request.member_id,
                    request.member_epoch,
                    partitions,
                )
            )

        return await self._commit(response, caller, request, "TxnOffsetCommit", commit)

    async def _commit(
        self,
        response: groups_pb2.OffsetCommitResponse,
        caller: Caller,
        request: Any,
        method: str,
        commit: Callable[[tuple[CommitPartition, ...]], Awaitable[OffsetCommitResponse]],
    ) -> groups_pb2.OffsetCommitResponse:
        """A commit's partitions: those whose topic the caller may not Read
        refused here, the others committed by ``commit``; the answer in the
        request's order."""
        # (topic, partition) -> (error, message) of partitions refused here
        refused: dict[tuple[str, int], tuple[Errors, str]] = {}
        partitions: list[CommitPartition] = []
        order: list[tuple[str, int]] = []
        for topic in request.topics:
            allowed = bool(topic.name) and self._may(
                caller, AclOperation.READ, AclResourceType.TOPIC, topic.name, method
            )
            for part in topic.partitions:
                order.append((topic.name, part.partition))
                if topic.name and not allowed:
                    refused[(topic.name, part.partition)] = (
                        Errors.TOPIC_AUTHORIZATION_FAILED,
                        f"{caller.describe()} is not allowed READ on topic {topic.name}",
                    )
                    continue
                partitions.append(
                    CommitPartition(
                        topic.name, part.partition, part.offset, part.leader_epoch, part.metadata
                    )
                )
        answer = await self._ask(response, request.group_id, commit(tuple(partitions)))
        if answer is None:
            return response
        results = iter(answer.partitions)
        by_topic_out: dict[str, groups_pb2.TopicResult] = {}
        for topic_name, partition in order:
            topic_out = by_topic_out.get(topic_name)
            if topic_out is None:
                topic_out = by_topic_out[topic_name] = response.topics.add(name=topic_name)
            if (topic_name, partition) in refused:
                code, message = refused[(topic_name, partition)]
            else:
                result = next(results)
                code, message = result.error, result.message
            topic_out.partitions.add(partition=partition, error=_pb(code), message=message)
        return response

    async def OffsetFetch(
        self, request: groups_pb2.OffsetFetchRequest, context: Any
    ) -> groups_pb2.OffsetFetchResponse:
        caller = await caller_of(context)
        response = groups_pb2.OffsetFetchResponse()
        if self._refused(response, caller, AclOperation.DESCRIBE, request.group_id, "OffsetFetch"):
            return response
        wanted: tuple[tuple[str, int], ...] | None = None
        if request.topics:
            wanted = tuple((t.name, p) for t in request.topics for p in t.partitions)
        fetch = OffsetFetchRequest(
            request.group_id,
            wanted,
            request.member_id,
            request.member_epoch if request.member_id else -1,
            request.require_stable,
        )
        answer = await self._ask(response, request.group_id, self.coordinator.fetch_offsets(fetch))
        if answer is None:
            return response
        allowed: dict[str, bool] = {}
        topics_out: dict[str, groups_pb2.OffsetFetchTopic] = {}
        for offset in answer.offsets:
            if offset.topic not in allowed:
                allowed[offset.topic] = self._may(
                    caller,
                    AclOperation.DESCRIBE,
                    AclResourceType.TOPIC,
                    offset.topic,
                    "OffsetFetch",
                )
            if not allowed[offset.topic] and wanted is None:
                continue  # not shown: the caller may not know the topic
            topic_out = topics_out.get(offset.topic)
            if topic_out is None:
                topic_out = topics_out[offset.topic] = response.topics.add(name=offset.topic)
            part = topic_out.partitions.add(partition=offset.partition)
            if not allowed[offset.topic]:
                part.offset, part.leader_epoch, part.commit_timestamp_ms = -1, -1, -1
                part.error = _pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                part.message = (
                    f"{caller.describe()} is not allowed DESCRIBE on topic {offset.topic}"
                )
                continue
            part.offset, part.leader_epoch = offset.offset, offset.leader_epoch
            part.metadata, part.commit_timestamp_ms = offset.metadata, offset.commit_timestamp_ms
            if offset.error is not Errors.NONE:
                # UNSTABLE_OFFSET_COMMIT: a transaction's commit is pending.
                part.error = _pb(offset.error)
                part.message = (
                    f"{offset.topic}-{offset.partition} has a transactional offset commit "
                    "not yet ended; retry"
                )
        return response

    async def OffsetDelete(
        self, request: groups_pb2.OffsetDeleteRequest, context: Any
    ) -> groups_pb2.OffsetDeleteResponse:
        caller = await caller_of(context)
        response = groups_pb2.OffsetDeleteResponse()
        if self._refused(response, caller, AclOperation.DELETE, request.group_id, "OffsetDelete"):
            return response
        refused: set[str] = set()
        partitions: list[tuple[str, int]] = []
        for topic in request.topics:
            if not self._may(
                caller, AclOperation.READ, AclResourceType.TOPIC, topic.name, "OffsetDelete"
            ):
                refused.add(topic.name)
                continue
            partitions.extend((topic.name, p) for p in topic.partitions)
        answer = await self._ask(
            response,
            request.group_id,
            self.coordinator.delete_offsets(request.group_id, partitions),
        )
        if answer is None:
            return response
        results = {(r.topic, r.partition): r for r in answer.partitions}
        for topic in request.topics:
            topic_out = response.topics.add(name=topic.name)
            for partition in topic.partitions:
                if topic.name in refused:
                    topic_out.partitions.add(
                        partition=partition,
                        error=_pb(Errors.TOPIC_AUTHORIZATION_FAILED),
                        message=f"{caller.describe()} is not allowed READ on topic {topic.name}",
                    )
                    continue
                result = results[(topic.name, partition)]
                topic_out.partitions.add(
                    partition=partition, error=_pb(result.error), message=result.message
                )
        return response

    # -- groups -----------------------------------------------------------------------

    async def ListGroups(
        self, request: groups_pb2.ListGroupsRequest, context: Any
    ) -> groups_pb2.ListGroupsResponse:
        caller = await caller_of(context)
        response = groups_pb2.ListGroupsResponse()
        everything = self._may(
            caller, AclOperation.DESCRIBE, AclResourceType.CLUSTER, CLUSTER_NAME, "ListGroups"
        )
        for listing in self.coordinator.list_groups(request.states):
            if everything or self._may_group(
                caller, AclOperation.DESCRIBE, listing.group_id, "ListGroups"
            ):
                response.groups.add(
                    group_id=listing.group_id,
                    state=listing.state,
                    group_type=listing.group_type,
                    coordinator_id=self.coordinator.broker_id,
                )
        return response

    async def DescribeGroups(
        self, request: groups_pb2.DescribeGroupsRequest, context: Any
    ) -> groups_pb2.DescribeGroupsResponse:
        caller = await caller_of(context)
        response = groups_pb2.DescribeGroupsResponse()
        for group_id in request.group_ids:
            out = response.groups.add(group_id=group_id)
            if self._refused(out, caller, AclOperation.DESCRIBE, group_id, "DescribeGroups"):
                continue
            try:
                description = await self.coordinator.describe_group(group_id)
            except CoordinatorFailure as failure:
                self._failure(out, failure, group_id)
                continue
            self._describe(out, description)
        return response

    def _describe(self, out: groups_pb2.GroupDescription, group: GroupDescription) -> None:
        image = self._image()
        out.error, out.message = _pb(group.error), group.message
        out.state, out.group_epoch = group.state, group.group_epoch
        out.assignment_epoch, out.assignor = group.assignment_epoch, group.assignor
        for member in group.members:
            member_out = out.members.add(
                member_id=member.member_id,
                client_id=member.client_id,
                client_host=member.client_host,
                subscribed_topic_names=member.subscribed_topic_names,
                member_epoch=member.member_epoch,
                state=member.state,
            )
            if member.instance_id is not None:
                member_out.instance_id = member.instance_id
            if member.rack_id is not None:
                member_out.rack_id = member.rack_id
            if member.subscribed_topic_regex is not None:
                member_out.subscribed_topic_regex = member.subscribed_topic_regex
            member_out.assignment.CopyFrom(_assignment(member.assignment, image))
            member_out.pending_revocation.CopyFrom(_assignment(member.pending_revocation, image))
            member_out.target.CopyFrom(_assignment(member.target, image))

    async def DeleteGroups(
        self, request: groups_pb2.DeleteGroupsRequest, context: Any
    ) -> groups_pb2.DeleteGroupsResponse:
        caller = await caller_of(context)
        response = groups_pb2.DeleteGroupsResponse()
        allowed = [
            g
            for g in request.group_ids
            if self._may_group(caller, AclOperation.DELETE, g, "DeleteGroups")
        ]
        results = {r.group_id: r for r in await self.coordinator.delete_groups(allowed)}
        for group_id in request.group_ids:
            out = response.results.add(group_id=group_id)
            result = results.get(group_id)
            if result is None:
                out.error = _pb(Errors.GROUP_AUTHORIZATION_FAILED)
                out.message = f"{caller.describe()} is not allowed DELETE on group {group_id}"
                continue
            out.error, out.message = _pb(result.error), result.message
            if result.error is Errors.NOT_COORDINATOR:
                out.coordinator.CopyFrom(self._coordinator(group_id))
        return response

"""What the group coordinator's core takes and answers: the requests of
KIP-848's ``ConsumerGroupHeartbeat`` and of the offset and group admin
APIs, already checked for shape by the service, and their answers.

Errors are :class:`broker.errors.Errors`; a refusal carries a message
naming what was wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from broker.coordinator_result import CoordinatorRefusal, CoordinatorResult
from broker.errors import Errors
from broker.group.records import CoordinatorRecord
from broker.group.types import Partitions

__all__ = [
    "CommitPartition",
    "DeleteGroupResult",
    "GroupDescription",
    "GroupError",
    "GroupListing",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "MemberDescription",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "PartitionError",
    "PartitionOffset",
    "Result",
    "TopicMetadata",
    "TopicsView",
    "TxnOffsetCommitRequest",
]

T = TypeVar("T")


class GroupError(CoordinatorRefusal):
    """A refusal of a whole group request: ``code`` and a message naming why."""


@dataclass(frozen=True, slots=True)
class Result(CoordinatorResult[CoordinatorRecord, T]):
    """A decision of the group coordinator: its records and its answer."""


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: str
    name: str
    partitions: int


class TopicsView(Protocol):
    """The topics of the metadata image, as the coordinator needs them."""

    def topic(self, name: str) -> TopicMetadata | None: ...

    def names(self) -> Iterable[str]: ...


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """``ConsumerGroupHeartbeatRequest``: ``None`` is "unchanged since the
    last heartbeat" for the fields a member sends only when they change."""

    group_id: str
    member_id: str
    # 0 joins, -1 leaves, otherwise the member's current epoch.
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    # -1: unchanged.
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    # "" clears the pattern.
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    # The partitions the member holds now, or None if it did not say.
    owned: Partitions | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error: Errors = Errors.NONE
    message: str = ""
    member_id: str = ""
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # The partitions the member is to own now (its assignment less what it
    # must revoke); None with an error.
    assignment: Partitions | None = None


@dataclass(frozen=True, slots=True)
class CommitPartition:
    topic: str
    partition: int
    # The next offset to read.
    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    # "" and -1 for a commit outside group membership (an admin's reset,
    # a consumer that assigns itself partitions): the group must have no
    # members.
    member_id: str
    member_epoch: int
    partitions: tuple[CommitPartition, ...]


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequest:
    """``TxnOffsetCommitRequest`` (v4+, KIP-447): offsets committed inside
    the producer's transaction, visible once its COMMIT marker is in the
    offsets partition; answered as an :class:`OffsetCommitRequest`."""

    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    # The consumer's group metadata (KIP-447), a member's id and epoch (KIP-848's
    # generation); "" and -1 for a producer that does not send it.
    member_id: str
    member_epoch: int
    partitions: tuple[CommitPartition, ...]


@dataclass(frozen=True, slots=True)
class PartitionError:
    topic: str
    partition: int
    error: Errors = Errors.NONE
    message: str = ""


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    error: Errors = Errors.NONE
    message: str = ""
    partitions: tuple[PartitionError, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    group_id: str
    # None: every partition the group has an offset for.
    partitions: tuple[tuple[str, int], ...] | None = None
    # A member's fetch is checked as its commits are (KIP-848); "" and -1
    # for anyone else's.
    member_id: str = ""
    member_epoch: int = -1
    # OffsetFetch v7+ RequireStable (KIP-447): a partition with a pending
    # transactional offset commit answers UNSTABLE_OFFSET_COMMIT.
    require_stable: bool = False


@dataclass(frozen=True, slots=True)
class PartitionOffset:
    topic: str
    partition: int
    # -1 if the group has no offset for it.
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    # UNSTABLE_OFFSET_COMMIT (offset -1) for a require_stable fetch of a
    # partition with a pending transactional offset commit.
    error: Errors = Errors.NONE


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    error: Errors = Errors.NONE
    message: str = ""
    offsets: tuple[PartitionOffset, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    group_type: str = "consumer"


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    member_epoch: int
    state: str
    assignment: Partitions
    pending_revocation: Partitions
    target: Partitions


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: Errors = Errors.NONE
    message: str = ""
    state: str = "Dead"
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: tuple[MemberDescription, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class DeleteGroupResult:
    group_id: str
    error: Errors = Errors.NONE
    message: str = ""

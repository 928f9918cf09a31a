"""The records of the offsets topic (``__consumer_offsets``), as the group
coordinator writes and replays them: a key and a value per record, the
value ``None`` for a tombstone.  They follow Kafka's coordinator records
(``group-coordinator/src/main/resources/common/message/*Key.json`` and
``*Value.json``, KIP-848), with their key types as numbers.

Every record is keyed so that the latest value of each key is the whole
truth: replaying a log and replaying its compaction (only the last record
of each key, tombstones perhaps gone) build the same groups.  That is what
makes a group's state independent of compaction and of the order of
unrelated keys (the Redpanda CORE-16998 class of bugs, brokers.md §4).

The bytes of keys and values are :mod:`broker.group.codec`'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.group.types import MemberState, Partitions

__all__ = [
    "NO_OFFSET",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "CoordinatorRecord",
    "CurrentAssignmentKey",
    "CurrentAssignmentValue",
    "GroupMetadataKey",
    "GroupMetadataValue",
    "Key",
    "MemberMetadataKey",
    "MemberMetadataValue",
    "OffsetCommitKey",
    "OffsetCommitValue",
    "RecordType",
    "SubscriptionMetadataKey",
    "SubscriptionMetadataValue",
    "TargetAssignmentMemberKey",
    "TargetAssignmentMemberValue",
    "TargetAssignmentMetadataKey",
    "TargetAssignmentMetadataValue",
    "Value",
]


# A record's batch context when it is replayed (Kafka's
# ``RecordBatch.NO_PRODUCER_ID`` and ``NO_PRODUCER_EPOCH``): a record of a
# batch that is not transactional has no producer.  Only OffsetCommit
# records are ever written transactionally (``TxnOffsetCommit``, KIP-98).
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# A record replayed without its offset in the offsets partition.
NO_OFFSET = -1


class RecordType(enum.IntEnum):
    """The key's type, the first field of every key (Kafka's key version)."""

    OFFSET_COMMIT = 1
    GROUP_METADATA = 3  # ConsumerGroupMetadata: the group epoch
    SUBSCRIPTION_METADATA = 4  # ConsumerGroupPartitionMetadata
    MEMBER_METADATA = 5  # ConsumerGroupMemberMetadata
    TARGET_ASSIGNMENT_METADATA = 6  # ConsumerGroupTargetAssignmentMetadata
    TARGET_ASSIGNMENT_MEMBER = 7  # ConsumerGroupTargetAssignmentMember
    CURRENT_ASSIGNMENT = 8  # ConsumerGroupCurrentMemberAssignment


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    # The next offset to read (OffsetCommit's committedOffset).
    offset: int
    # The leader epoch of the last record consumed (KIP-320), -1 if unknown.
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    # Bumped by every change of membership, subscriptions or the subscribed
    # topics' partitions; the target assignment is recomputed for it.
    epoch: int


@dataclass(frozen=True, slots=True)
class SubscriptionMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class SubscriptionMetadataValue:
    # (topic id, topic name, partition count) of every subscribed topic that
    # exists, sorted by name: a change of it bumps the group epoch.
    topics: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True, slots=True)
class MemberMetadataKey:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    # Sorted.
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class TargetAssignmentMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class TargetAssignmentMetadataValue:
    # The group epoch the target assignment was computed for.
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class TargetAssignmentMemberKey:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class TargetAssignmentMemberValue:
    partitions: Partitions


@dataclass(frozen=True, slots=True)
class CurrentAssignmentKey:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class CurrentAssignmentValue:
    member_epoch: int
    # The epoch before the last bump: a heartbeat that carries it, owning
    # no more than is assigned, is one whose answer was lost, not a zombie.
    previous_member_epoch: int
    state: MemberState
    assigned: Partitions
    # Partitions the member still owns and must give up before they are
    # handed to another member.
    pending_revocation: Partitions


Key = (
    OffsetCommitKey
    | GroupMetadataKey
    | SubscriptionMetadataKey
    | MemberMetadataKey
    | TargetAssignmentMetadataKey
    | TargetAssignmentMemberKey
    | CurrentAssignmentKey
)

Value = (
    OffsetCommitValue
    | GroupMetadataValue
    | SubscriptionMetadataValue
    | MemberMetadataValue
    | TargetAssignmentMetadataValue
    | TargetAssignmentMemberValue
    | CurrentAssignmentValue
)


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """One record of the offsets topic: ``value`` is ``None`` for a
    tombstone (the key's state is gone)."""

    key: Key
    value: Value | None

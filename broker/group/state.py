"""The groups of one offsets partition, as replaying its records builds
them (Kafka's ``ConsumerGroup``, ``ConsumerGroupMember``,
``OffsetMetadataManager``).

Replay is the only way state changes, and it is an upsert or a delete of
one key's state: the groups after a log are a function of the last record
of each key, so a compacted log builds the same groups as the full one
(:mod:`broker.group.records`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker.group.records import (
    CoordinatorRecord,
    CurrentAssignmentKey,
    CurrentAssignmentValue,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataKey,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    SubscriptionMetadataKey,
    SubscriptionMetadataValue,
    TargetAssignmentMemberKey,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataKey,
    TargetAssignmentMetadataValue,
)
from broker.group.types import MemberState, Partitions

__all__ = ["ConsumerGroup", "GroupState", "Groups", "Member"]


class GroupState(enum.Enum):
    """``ConsumerGroup.ConsumerGroupState`` (kafka-consumer-groups --state)."""

    EMPTY = "Empty"
    # The group epoch is ahead of the target assignment's.
    ASSIGNING = "Assigning"
    # Some member has not reached the target assignment yet.
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class Member:
    """One member, from its three keys: a member is in the group while its
    metadata record is (the other two follow it)."""

    member_id: str
    metadata: MemberMetadataValue | None = None
    target: Partitions | None = None
    current: CurrentAssignmentValue | None = None

    @property
    def member_epoch(self) -> int:
        return 0 if self.current is None else self.current.member_epoch

    @property
    def previous_member_epoch(self) -> int:
        return 0 if self.current is None else self.current.previous_member_epoch

    @property
    def state(self) -> MemberState:
        return MemberState.STABLE if self.current is None else self.current.state

    @property
    def assigned(self) -> Partitions:
        return frozenset() if self.current is None else self.current.assigned

    @property
    def pending_revocation(self) -> Partitions:
        return frozenset() if self.current is None else self.current.pending_revocation

    def owned(self) -> Partitions:
        """What the coordinator counts as this member's: assigned or still
        to be revoked.  No two members' ``owned`` meet."""
        return self.assigned | self.pending_revocation

    def is_empty(self) -> bool:
        return self.metadata is None and self.target is None and self.current is None


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    subscription: SubscriptionMetadataValue | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # (topic name, partition) -> the committed offset
    offsets: dict[tuple[str, int], OffsetCommitValue] = field(default_factory=dict)
    # (topic id, partition) -> the member that owns it (assigned or pending
    # revocation).  Invariant: the inverse of every member's ``owned()``;
    # kept by replay of the members' current assignments.
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    # Whether the group's own keys (epoch, subscription, target) exist: a
    # group of committed offsets alone has none (commits of a consumer that
    # assigns partitions itself, Kafka's "simple" group).
    has_metadata: bool = False

    def live_members(self) -> Iterator[Member]:
        """Members with metadata, by member id."""
        for member_id in sorted(self.members):
            member = self.members[member_id]
            if member.metadata is not None:
                yield member

    def member(self, member_id: str) -> Member | None:
        member = self.members.get(member_id)
        return member if member is not None and member.metadata is not None else None

    def member_count(self) -> int:
        return sum(1 for _ in self.live_members())

    def state(self) -> GroupState:
        members = list(self.live_members())
        if not members:
            return GroupState.EMPTY
        if self.epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        for member in members:
            if member.member_epoch != self.assignment_epoch or (
                member.state is not MemberState.STABLE
            ):
                return GroupState.RECONCILING
        return GroupState.STABLE

    def owner_of(self, partition: tuple[str, int]) -> str | None:
        return self.owners.get(partition)

    def subscribed_topic_names(self) -> frozenset[str]:
        names: set[str] = set()
        for member in self.live_members():
            assert member.metadata is not None
            names.update(member.metadata.subscribed_topic_names)
        return frozenset(names)

    def is_gone(self) -> bool:
        """Nothing of the group is left: no keys at all."""
        return not self.has_metadata and not self.offsets and not self.members

    # -- replay ---------------------------------------------------------------

    def _member(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None:
            member = self.members[member_id] = Member(member_id)
        return member

    def _drop_if_empty(self, member: Member) -> None:
        if member.is_empty():
            del self.members[member.member_id]

    def _set_current(self, member: Member, value: CurrentAssignmentValue | None) -> None:
        for partition in member.owned():
            if self.owners.get(partition) == member.member_id:
                del self.owners[partition]
        member.current = value
        for partition in member.owned():
            self.owners[partition] = member.member_id

    def replay(self, record: CoordinatorRecord) -> None:
        key, value = record.key, record.value
        if isinstance(key, OffsetCommitKey):
            where = (key.topic, key.partition)
            if value is None:
                self.offsets.pop(where, None)
            else:
                assert isinstance(value, OffsetCommitValue)
                self.offsets[where] = value
        elif isinstance(key, GroupMetadataKey):
            if value is None:
                self.epoch = 0
            else:
                assert isinstance(value, GroupMetadataValue)
                self.epoch = value.epoch
            self._metadata_changed()
        elif isinstance(key, SubscriptionMetadataKey):
            assert value is None or isinstance(value, SubscriptionMetadataValue)
            self.subscription = value
            self._metadata_changed()
        elif isinstance(key, TargetAssignmentMetadataKey):
            if value is None:
                self.assignment_epoch = 0
            else:
                assert isinstance(value, TargetAssignmentMetadataValue)
                self.assignment_epoch = value.assignment_epoch
            self._metadata_changed()
        elif isinstance(key, MemberMetadataKey):
            member = self._member(key.member_id)
            assert value is None or isinstance(value, MemberMetadataValue)
            member.metadata = value
            self._drop_if_empty(member)
        elif isinstance(key, TargetAssignmentMemberKey):
            member = self._member(key.member_id)
            if value is None:
                member.target = None
            else:
                assert isinstance(value, TargetAssignmentMemberValue)
                member.target = value.partitions
            self._drop_if_empty(member)
        elif isinstance(key, CurrentAssignmentKey):
            member = self._member(key.member_id)
            assert value is None or isinstance(value, CurrentAssignmentValue)
            self._set_current(member, value)
            self._drop_if_empty(member)
        else:  # pragma: no cover - the Key union is closed
            raise TypeError(f"unknown record key {key!r}")

    def _metadata_changed(self) -> None:
        self.has_metadata = (
            self.epoch != 0 or self.assignment_epoch != 0 or self.subscription is not None
        )


def _group_id(record: CoordinatorRecord) -> str:
    return record.key.group_id


class Groups:
    """Every group of one offsets partition, by group id."""

    def __init__(self) -> None:
        self._groups: dict[str, ConsumerGroup] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator[ConsumerGroup]:
        for group_id in sorted(self._groups):
            yield self._groups[group_id]

    def get(self, group_id: str) -> ConsumerGroup | None:
        return self._groups.get(group_id)

    def replay(self, record: CoordinatorRecord) -> None:
        group_id = _group_id(record)
        group = self._groups.get(group_id)
        if group is None:
            if record.value is None:
                return  # a tombstone of a key already gone
            group = self._groups[group_id] = ConsumerGroup(group_id)
        group.replay(record)
        if group.is_gone():
            del self._groups[group_id]

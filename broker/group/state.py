"""The groups of one offsets partition, as replaying its records builds
them (Kafka's ``ConsumerGroup``, ``ConsumerGroupMember``,
``OffsetMetadataManager``).

Replay is the only way state changes, and it is an upsert or a delete of
one key's state: the groups after a log are a function of the last record
of each key, so a compacted log builds the same groups as the full one
(:mod:`broker.group.records`).

Transactional offset commits (KIP-98's ``TxnOffsetCommit``) are the one
exception: an OffsetCommit record replayed with a producer id is *pending*
(Kafka's ``OffsetMetadataManager.pendingTransactionalOffsets``), invisible
to the group until its transaction's marker.  A COMMIT marker makes each
of the producer's pending offsets the committed one unless the committed
offset's record is newer in the log; an ABORT marker drops them
(``replayEndTransactionMarker``).  Kafka's log cleaner drops aborted
records before their markers and never cleans past the last stable offset,
so a compacted log still builds the same groups.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker.group.records import (
    NO_OFFSET,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
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

__all__ = ["ConsumerGroup", "GroupState", "Groups", "Member", "PendingOffset"]


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
    # (topic name, partition) -> the offset in the offsets partition of the
    # record of its committed offset (Kafka's ``OffsetAndMetadata.recordOffset``),
    # NO_OFFSET if it was replayed without one.  A transaction's COMMIT
    # marker compares it with its pending offset's.
    record_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
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

    def set_offset(self, where: tuple[str, int], value: OffsetCommitValue, offset: int) -> None:
        """The committed offset of ``where`` is ``value``, whose record is at
        ``offset`` in the offsets partition."""
        self.offsets[where] = value
        self.record_offsets[where] = offset

    def replay(self, record: CoordinatorRecord, offset: int = NO_OFFSET) -> None:
        key, value = record.key, record.value
        if isinstance(key, OffsetCommitKey):
            where = (key.topic, key.partition)
            if value is None:
                self.offsets.pop(where, None)
                self.record_offsets.pop(where, None)
            else:
                assert isinstance(value, OffsetCommitValue)
                self.set_offset(where, value, offset)
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


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """A transactional offset commit waiting for its transaction's marker."""

    value: OffsetCommitValue
    # Its record's offset in the offsets partition.
    record_offset: int
    producer_epoch: int


def _group_id(record: CoordinatorRecord) -> str:
    return record.key.group_id


class Groups:
    """Every group of one offsets partition, by group id, and the
    transactional offset commits pending in them."""

    def __init__(self) -> None:
        self._groups: dict[str, ConsumerGroup] = {}
        # producer id -> group id -> (topic, partition) -> its pending offset
        # (Kafka's ``pendingTransactionalOffsets``).
        self._pending: dict[int, dict[str, dict[tuple[str, int], PendingOffset]]] = {}
        # group id -> the producers with pending offsets in it (Kafka's
        # ``openTransactionsByGroup``).  Invariant: the inverse of
        # ``_pending``'s first two levels, with no empty entries.
        self._open: dict[str, set[int]] = {}
        # The offset of the last record replayed with one: they must increase.
        self._last_offset = NO_OFFSET

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator[ConsumerGroup]:
        for group_id in sorted(self._groups):
            yield self._groups[group_id]

    def get(self, group_id: str) -> ConsumerGroup | None:
        return self._groups.get(group_id)

    # -- transactional offsets ----------------------------------------------------

    def has_pending(self, group_id: str, where: tuple[str, int] | None = None) -> bool:
        """Whether a transaction has a pending offset in the group (for the
        partition ``where``, if named): Kafka's ``hasPendingTransactionalOffsets``."""
        for producer_id in self._open.get(group_id, ()):
            if where is None or where in self._pending[producer_id][group_id]:
                return True
        return False

    def pending_offsets(self, group_id: str) -> dict[int, dict[tuple[str, int], PendingOffset]]:
        """The group's pending offsets, by producer id, then partition."""
        return {
            producer_id: dict(self._pending[producer_id][group_id])
            for producer_id in sorted(self._open.get(group_id, ()))
        }

    def producers(self) -> list[int]:
        """The producers with pending offsets (open transactions), sorted."""
        return sorted(self._pending)

    def _drop_pending(self, group_id: str, where: tuple[str, int]) -> None:
        """A tombstone of ``where`` drops every transaction's pending offset
        for it too (``OffsetMetadataManager.replay``)."""
        for producer_id in sorted(self._open.get(group_id, ())):
            by_group = self._pending[producer_id]
            parts = by_group[group_id]
            parts.pop(where, None)
            if not parts:
                del by_group[group_id]
                self._open[group_id].discard(producer_id)
                if not by_group:
                    del self._pending[producer_id]
        if not self._open.get(group_id, True):
            del self._open[group_id]

    def replay_end_transaction_marker(
        self, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """A transaction marker of ``producer_id`` in the offsets partition
        (Kafka's ``OffsetMetadataManager.replayEndTransactionMarker``).
        COMMIT: each of the producer's pending offsets becomes its group's
        committed offset unless the committed offset's record is newer in
        the log (a plain commit written after the transactional one, before
        the marker, wins: Kafka compares ``recordOffset``); ABORT: they are
        dropped.  A producer with nothing pending is no change.  The marker's
        epoch is the partition log's to check (a marker of an older epoch
        than the producer's is refused there), as in Kafka."""
        del producer_epoch  # checked by the partition log
        by_group = self._pending.pop(producer_id, None)
        if by_group is None:
            return
        for group_id in sorted(by_group):
            producers = self._open[group_id]
            producers.discard(producer_id)
            if not producers:
                del self._open[group_id]
            group = self._groups[group_id]
            if commit:
                for where, pending in sorted(by_group[group_id].items()):
                    if (
                        where not in group.offsets
                        or pending.record_offset > group.record_offsets[where]
                    ):
                        group.set_offset(where, pending.value, pending.record_offset)
            self._drop_if_gone(group_id)

    # -- replay ---------------------------------------------------------------------

    def replay(
        self,
        record: CoordinatorRecord,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        offset: int = NO_OFFSET,
    ) -> None:
        """One record of the offsets partition, at ``offset`` if known, of a
        transactional batch of ``producer_id`` at ``producer_epoch`` if it
        has one.  Raises :class:`ValueError` for a context no log can hold:
        only OffsetCommit records with a value are transactional, and they
        need their offset; offsets given must increase; and a plain
        OffsetCommit of a partition with a pending transactional offset
        needs its offset (the COMMIT marker compares the two)."""
        self._check_context(record, producer_id, producer_epoch, offset)
        if offset != NO_OFFSET:
            self._last_offset = offset
        key, value = record.key, record.value
        group_id = _group_id(record)
        if producer_id != NO_PRODUCER_ID:
            assert isinstance(key, OffsetCommitKey) and isinstance(value, OffsetCommitValue)
            # A group of no keys yet holds it all the same (Kafka creates its
            # "simple" group on replay); it lives while the offset is pending.
            if group_id not in self._groups:
                self._groups[group_id] = ConsumerGroup(group_id)
            self._pending.setdefault(producer_id, {}).setdefault(group_id, {})[
                (key.topic, key.partition)
            ] = PendingOffset(value, offset, producer_epoch)
            self._open.setdefault(group_id, set()).add(producer_id)
            return
        if isinstance(key, OffsetCommitKey) and value is None:
            self._drop_pending(group_id, (key.topic, key.partition))
        group = self._groups.get(group_id)
        if group is None:
            if value is None:
                return  # a tombstone of a key already gone
            group = self._groups[group_id] = ConsumerGroup(group_id)
        group.replay(record, offset)
        self._drop_if_gone(group_id)

    def _check_context(
        self, record: CoordinatorRecord, producer_id: int, producer_epoch: int, offset: int
    ) -> None:
        key, value = record.key, record.value
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            raise ValueError(
                f"producer id {producer_id} with producer epoch {producer_epoch}: both or neither"
            )
        if offset != NO_OFFSET and offset <= self._last_offset:
            raise ValueError(
                f"record at offset {offset} replayed after offset {self._last_offset}: "
                "records are replayed in log order"
            )
        if producer_id == NO_PRODUCER_ID:
            if (
                isinstance(key, OffsetCommitKey)
                and value is not None
                and offset == NO_OFFSET
                and self.has_pending(key.group_id, (key.topic, key.partition))
            ):
                raise ValueError(
                    f"OffsetCommit of {key.topic}-{key.partition} in group {key.group_id!r} "
                    "replayed without its offset while a transactional offset of it is "
                    "pending: the transaction's COMMIT marker compares their offsets"
                )
            return
        if not isinstance(key, OffsetCommitKey):
            raise ValueError(
                f"{type(key).__name__} of group {key.group_id!r} in a transactional batch "
                f"of producer {producer_id}: only OffsetCommit records are transactional"
            )
        if value is None:
            # Kafka never writes one: offsets are deleted outside transactions.
            raise ValueError(
                f"tombstone of {key.topic}-{key.partition} in group {key.group_id!r} in a "
                f"transactional batch of producer {producer_id}: transactions only commit "
                "offsets"
            )
        if offset == NO_OFFSET:
            raise ValueError(
                f"transactional OffsetCommit of {key.topic}-{key.partition} in group "
                f"{key.group_id!r} replayed without its offset"
            )

    def _drop_if_gone(self, group_id: str) -> None:
        group = self._groups.get(group_id)
        if group is not None and group.is_gone() and group_id not in self._open:
            del self._groups[group_id]

"""The group coordinator of one offsets partition: its decisions (Kafka's
``GroupMetadataManager`` and ``OffsetMetadataManager`` for KIP-848
consumer groups), decide-then-replay as the controller's.

Every handler reads the groups and returns a :class:`~broker.group.api.Result`,
the records to write and the answer; it changes no group.  Groups change
only by :meth:`GroupCoordinatorShard.replay`.  The driver replays a
decision's records as soon as they are in the leader's log, so that the
next decision sees them (the speculative state, Kafka's timeline data
structures), and answers only once they are below the high watermark;
when the partition's leadership is lost the shard is dropped and the next
leader builds a new one from the log below its high watermark.

Transactional offset commits (``TxnOffsetCommit``, KIP-98/KIP-447) are
OffsetCommit records written in the producer's transactional batch; they
replay as pending (:class:`broker.group.state.Groups`) until the
transaction's marker in the offsets partition replays
(:meth:`GroupCoordinatorShard.replay_end_transaction_marker`).

Sessions and revocation deadlines are soft state, as Kafka's timers: a
heartbeat restarts its member's session, and a shard built from the log
starts every member's session afresh (:meth:`become_loaded`).
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.errors import Errors
from broker.group.api import (
    CommitPartition,
    DeleteGroupResult,
    GroupDescription,
    GroupError,
    GroupListing,
    HeartbeatRequest,
    HeartbeatResponse,
    MemberDescription,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionError,
    PartitionOffset,
    Result,
    TopicMetadata,
    TopicsView,
    TxnOffsetCommitRequest,
)
from broker.group.reconcile import next_assignment
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
from broker.group.state import ConsumerGroup, Groups, Member
from broker.group.types import (
    LEAVE_EPOCH,
    LEAVE_STATIC_EPOCH,
    NO_EPOCH,
    AssignmentSpec,
    Assignor,
    MemberSpec,
    MemberState,
    Partitions,
)

__all__ = ["GroupConfig", "GroupCoordinatorShard", "is_internal_topic"]

_NO_ASSIGNMENT = CurrentAssignmentValue(
    member_epoch=0,
    previous_member_epoch=0,
    state=MemberState.STABLE,
    assigned=frozenset(),
    pending_revocation=frozenset(),
)


def is_internal_topic(name: str) -> bool:
    """Topics a pattern subscription never matches (Kafka excludes its
    internal topics from regex subscriptions)."""
    return name.startswith("__")


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The coordinator's settings (``GroupCoordinatorConfig``; KIP-848's
    defaults)."""

    # group.consumer.session.timeout.ms
    session_timeout_ms: int = 45_000
    # group.consumer.heartbeat.interval.ms
    heartbeat_interval_ms: int = 5_000
    # group.consumer.max.size
    max_size: int = 2**31 - 1
    # offset.metadata.max.bytes
    offset_metadata_max_bytes: int = 4096
    # offsets.retention.minutes (7 days), in ms
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    # offsets.retention.check.interval.ms: how often expiry is looked for.
    offsets_retention_check_interval_ms: int = 600_000
    # group.consumer.assignors: the first is the default.
    assignors: tuple[str, ...] = ("uniform", "range")


def _member_key(group_id: str, member_id: str) -> tuple[str, str]:
    return (group_id, member_id)


class GroupCoordinatorShard:
    """The groups of one offsets partition and the decisions on them."""

    def __init__(
        self,
        config: GroupConfig,
        assignors: Mapping[str, Assignor],
        rng: random.Random,
    ) -> None:
        missing = [name for name in config.assignors if name not in assignors]
        if not config.assignors or missing:
            raise ValueError(f"group.consumer.assignors names unknown assignors: {missing}")
        self.config = config
        self.groups = Groups()
        self._assignors = assignors
        self._rng = rng
        # (group, member) -> when its session ends, in ms
        self._sessions: dict[tuple[str, str], int] = {}
        # (group, member) -> when it must have revoked, in ms
        self._revocations: dict[tuple[str, str], int] = {}
        self._patterns: dict[str, re.Pattern[str]] = {}
        # When offsets expiry is next looked for.
        self._next_expiry_ms: int | None = None

    # -- replay ---------------------------------------------------------------

    def replay(
        self,
        record: CoordinatorRecord,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        offset: int = NO_OFFSET,
    ) -> None:
        """One record of the offsets partition, in log order
        (``GroupCoordinatorShard.replay``).  ``producer_id`` and
        ``producer_epoch`` are its batch's if the batch is transactional
        (then it is a pending transactional offset commit), else the
        defaults.  ``offset`` is the record's offset in the partition: a
        transactional record needs it, and so does a plain OffsetCommit of a
        partition with a pending transactional offset, since the COMMIT
        marker keeps whichever is newer in the log; the runtime passes it
        for every record it knows it of.  A context no log holds raises
        :class:`ValueError` (:meth:`broker.group.state.Groups.replay`)."""
        self.groups.replay(record, producer_id, producer_epoch, offset)
        key = record.key
        if isinstance(key, MemberMetadataKey) and record.value is None:
            self._sessions.pop(_member_key(key.group_id, key.member_id), None)
            self._revocations.pop(_member_key(key.group_id, key.member_id), None)

    def replay_end_transaction_marker(
        self, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """A COMMIT (``commit``) or ABORT marker of ``producer_id`` in the
        offsets partition, in log order with the records
        (``GroupCoordinatorShard.replayEndTransactionMarker``): the
        producer's pending offsets become committed (each unless the group's
        committed offset for it is newer in the log) or are dropped."""
        self.groups.replay_end_transaction_marker(producer_id, producer_epoch, commit)

    def become_loaded(self, now_ms: int) -> None:
        """The log is replayed: every member's session starts now, and every
        member still revoking has its rebalance timeout from now
        (``GroupMetadataManager.onLoaded``)."""
        self._sessions.clear()
        self._revocations.clear()
        for group in self.groups:
            for member in group.live_members():
                key = _member_key(group.group_id, member.member_id)
                self._sessions[key] = now_ms + self.config.session_timeout_ms
                if member.state is MemberState.UNREVOKED_PARTITIONS:
                    assert member.metadata is not None
                    self._revocations[key] = now_ms + member.metadata.rebalance_timeout_ms

    # -- ConsumerGroupHeartbeat -------------------------------------------------

    def consumer_group_heartbeat(
        self, request: HeartbeatRequest, topics: TopicsView, now_ms: int
    ) -> Result[HeartbeatResponse]:
        try:
            self._check_heartbeat(request)
            if request.member_epoch == LEAVE_EPOCH:
                return self._leave(request)
            if request.member_epoch == LEAVE_STATIC_EPOCH:
                return self._leave_static(request)
            return self._heartbeat(request, topics, now_ms)
        except GroupError as error:
            return Result(
                (),
                HeartbeatResponse(
                    error=error.code,
                    message=error.message,
                    member_id=request.member_id,
                    member_epoch=request.member_epoch,
                ),
            )

    def _check_heartbeat(self, request: HeartbeatRequest) -> None:
        """``throwIfConsumerGroupHeartbeatRequestIsInvalid``."""
        if not request.group_id:
            raise GroupError(Errors.INVALID_REQUEST, "group_id is empty")
        if request.member_epoch < LEAVE_STATIC_EPOCH:
            raise GroupError(
                Errors.INVALID_REQUEST,
                f"member_epoch {request.member_epoch}: must be 0 (join), -1 (leave), -2 (a "
                "static member's leave for now) or the member's epoch",
            )
        if request.member_epoch == LEAVE_STATIC_EPOCH and request.instance_id is None:
            raise GroupError(
                Errors.INVALID_REQUEST,
                "member_epoch -2 (a static member's leave) needs the member's instance_id",
            )
        if request.member_epoch != NO_EPOCH and not request.member_id:
            raise GroupError(Errors.INVALID_REQUEST, "member_id is empty")
        if request.member_epoch == NO_EPOCH and request.owned:
            raise GroupError(
                Errors.INVALID_REQUEST,
                "owned partitions must be empty when joining (member_epoch 0)",
            )
        if request.server_assignor is not None and request.server_assignor not in (
            self.config.assignors
        ):
            raise GroupError(
                Errors.UNSUPPORTED_ASSIGNOR,
                f"server_assignor {request.server_assignor!r} is not one of "
                f"{', '.join(self.config.assignors)}",
            )
        if request.subscribed_topic_regex:
            self._pattern(request.subscribed_topic_regex)
        if request.subscribed_topic_names is not None:
            for name in request.subscribed_topic_names:
                if not name:
                    raise GroupError(
                        Errors.INVALID_REQUEST, "subscribed_topic_names holds an empty name"
                    )

    def _pattern(self, regex: str) -> re.Pattern[str]:
        pattern = self._patterns.get(regex)
        if pattern is None:
            try:
                pattern = re.compile(regex)
            except re.error as error:
                raise GroupError(
                    Errors.INVALID_REQUEST,
                    f"subscribed_topic_regex {regex!r} is not a regular expression: {error}",
                ) from None
            if len(self._patterns) > 1024:
                self._patterns.clear()
            self._patterns[regex] = pattern
        return pattern

    def _new_member_id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _known_member(self, group_id: str, member_id: str) -> tuple[ConsumerGroup, Member]:
        group = self.groups.get(group_id)
        member = None if group is None else group.member(member_id)
        if group is None or member is None:
            raise GroupError(
                Errors.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {group_id!r}",
            )
        return group, member

    def _heartbeat(
        self, request: HeartbeatRequest, topics: TopicsView, now_ms: int
    ) -> Result[HeartbeatResponse]:
        group_id = request.group_id
        group = self.groups.get(group_id) or ConsumerGroup(group_id)
        records: list[CoordinatorRecord] = []
        # A static member's earlier instance this join takes over.
        replaced: Member | None = None
        if request.member_epoch == NO_EPOCH:
            member_id = request.member_id or self._new_member_id()
            member = group.member(member_id)
            if request.instance_id is not None and member is None:
                replaced = self._released_instance(group, request.instance_id, member_id)
            if member is None and replaced is None:
                self._check_new_member(group, request)
            owned: Partitions | None = frozenset()
        else:
            group, member = self._known_member(group_id, request.member_id)
            member_id = member.member_id
            if request.instance_id is not None:
                self._check_instance(group, member, request.instance_id)
            self._check_member_epoch(group_id, member, request)
            owned = request.owned
        if replaced is not None:
            records.extend(self._replace(group, replaced))
            gone = _member_key(group_id, replaced.member_id)
            self._sessions.pop(gone, None)
            self._revocations.pop(gone, None)
        if member is not None:
            old = member.metadata
        else:
            old = None if replaced is None else replaced.metadata
        metadata = self._member_metadata(old, request)
        if metadata != old or replaced is not None:
            records.append(CoordinatorRecord(MemberMetadataKey(group_id, member_id), metadata))
        subscriptions = {
            m.member_id: m.metadata
            for m in group.live_members()
            if m.metadata is not None and m is not replaced
        }
        subscriptions[member_id] = metadata
        bump = old is None or (
            old.subscribed_topic_names != metadata.subscribed_topic_names
            or old.subscribed_topic_regex != metadata.subscribed_topic_regex
        )
        resolved = {mid: self._resolve(meta, topics) for mid, meta in subscriptions.items()}
        subscription = SubscriptionMetadataValue(
            tuple(
                sorted(
                    {(t.topic_id, t.name, t.partitions) for ts in resolved.values() for t in ts},
                    key=lambda t: (t[1], t[0]),
                )
            )
        )
        if subscription != group.subscription:
            records.append(CoordinatorRecord(SubscriptionMetadataKey(group_id), subscription))
            bump = True
        group_epoch = group.epoch + 1 if bump else group.epoch
        if bump:
            records.append(
                CoordinatorRecord(GroupMetadataKey(group_id), GroupMetadataValue(group_epoch))
            )
        targets = {
            m.member_id: m.target or frozenset() for m in group.live_members() if m is not replaced
        }
        if replaced is not None:
            # The new instance takes the old one's target and partitions:
            # no rebalance (KIP-848's static membership).
            targets[member_id] = replaced.target or frozenset()
            records.append(
                CoordinatorRecord(
                    TargetAssignmentMemberKey(group_id, member_id),
                    TargetAssignmentMemberValue(targets[member_id]),
                )
            )
        assignment_epoch = group.assignment_epoch
        if group_epoch > assignment_epoch:
            spec = AssignmentSpec(
                members={
                    mid: MemberSpec(
                        topic_ids=frozenset(t.topic_id for t in resolved[mid]),
                        rack=meta.rack_id,
                        instance_id=meta.instance_id,
                        current=targets.get(mid, frozenset()),
                    )
                    for mid, meta in sorted(subscriptions.items())
                },
                topics={t[0]: t[2] for t in subscription.topics},
            )
            new_targets = self._assignor_for(subscriptions).assign(spec)
            for mid in sorted(new_targets):
                had = group.members.get(mid)
                had_target = targets.get(mid) if had is None else had.target
                if had_target != new_targets[mid]:
                    records.append(
                        CoordinatorRecord(
                            TargetAssignmentMemberKey(group_id, mid),
                            TargetAssignmentMemberValue(frozenset(new_targets[mid])),
                        )
                    )
            records.append(
                CoordinatorRecord(
                    TargetAssignmentMetadataKey(group_id),
                    TargetAssignmentMetadataValue(group_epoch),
                )
            )
            assignment_epoch = group_epoch
            targets = {mid: frozenset(parts) for mid, parts in new_targets.items()}
        if replaced is not None:
            # The old instance's partitions, at epoch 0 as any join; the
            # step below moves it to the target's epoch.
            current = CurrentAssignmentValue(
                member_epoch=NO_EPOCH,
                previous_member_epoch=NO_EPOCH,
                state=MemberState.STABLE,
                assigned=replaced.assigned,
                pending_revocation=frozenset(),
            )
        elif member is None or member.current is None:
            current = _NO_ASSIGNMENT
        else:
            current = member.current
        updated = next_assignment(
            current,
            assignment_epoch,
            targets.get(member_id, frozenset()),
            owned,
            group.owner_of,
            member_id,
        )
        if member is None or member.current != updated:
            records.append(CoordinatorRecord(CurrentAssignmentKey(group_id, member_id), updated))
        key = _member_key(group_id, member_id)
        self._sessions[key] = now_ms + self.config.session_timeout_ms
        if updated.state is MemberState.UNREVOKED_PARTITIONS:
            if (
                current.state is not MemberState.UNREVOKED_PARTITIONS
                or key not in self._revocations
            ):
                self._revocations[key] = now_ms + metadata.rebalance_timeout_ms
        else:
            self._revocations.pop(key, None)
        return Result(
            tuple(records),
            HeartbeatResponse(
                member_id=member_id,
                member_epoch=updated.member_epoch,
                heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                assignment=updated.assigned,
            ),
        )

    # -- static membership (KIP-848: group.instance.id) ------------------------------

    @staticmethod
    def _static_member(group: ConsumerGroup, instance_id: str) -> Member | None:
        for m in group.live_members():
            if m.metadata is not None and m.metadata.instance_id == instance_id:
                return m
        return None

    def _released_instance(
        self, group: ConsumerGroup, instance_id: str, member_id: str
    ) -> Member | None:
        """The earlier member of ``instance_id`` that a join replaces, if
        any; only one that left for now (epoch -2) may be
        (``throwIfInstanceIdIsUnreleased``)."""
        holder = self._static_member(group, instance_id)
        if holder is None or holder.member_id == member_id:
            return None
        if holder.member_epoch != LEAVE_STATIC_EPOCH:
            raise GroupError(
                Errors.UNRELEASED_INSTANCE_ID,
                f"instance id {instance_id!r} of group {group.group_id!r} is held by member "
                f"{holder.member_id!r}, which has not left: it leaves with epoch -2, or its "
                "session ends",
            )
        return holder

    def _check_instance(self, group: ConsumerGroup, member: Member, instance_id: str) -> None:
        """``throwIfStaticMemberIsUnknown`` and ``throwIfInstanceIdIsFenced``."""
        holder = self._static_member(group, instance_id)
        if holder is None:
            raise GroupError(
                Errors.UNKNOWN_MEMBER_ID,
                f"no member of group {group.group_id!r} has instance id {instance_id!r}",
            )
        if holder is not member:
            raise GroupError(
                Errors.FENCED_INSTANCE_ID,
                f"instance id {instance_id!r} of group {group.group_id!r} belongs to member "
                f"{holder.member_id!r}, not {member.member_id!r}: a newer instance took it over",
            )

    @staticmethod
    def _replace(group: ConsumerGroup, replaced: Member) -> list[CoordinatorRecord]:
        """The old instance's records removed, with no bump of the group
        epoch (``replaceMember``); the new member's follow."""
        gid, mid = group.group_id, replaced.member_id
        return [
            CoordinatorRecord(CurrentAssignmentKey(gid, mid), None),
            CoordinatorRecord(TargetAssignmentMemberKey(gid, mid), None),
            CoordinatorRecord(MemberMetadataKey(gid, mid), None),
        ]

    def _leave_static(self, request: HeartbeatRequest) -> Result[HeartbeatResponse]:
        """A static member leaves for now (``consumerGroupStaticMemberGroupLeave``):
        it stays in the group at epoch -2 with the partitions it was
        assigned (those it was revoking are released), until its session
        ends or its instance joins again and takes them over."""
        group, member = self._known_member(request.group_id, request.member_id)
        assert request.instance_id is not None  # _check_heartbeat
        self._check_instance(group, member, request.instance_id)
        current = member.current or _NO_ASSIGNMENT
        left = CurrentAssignmentValue(
            member_epoch=LEAVE_STATIC_EPOCH,
            previous_member_epoch=current.member_epoch,
            state=MemberState.STABLE,
            assigned=current.assigned,
            pending_revocation=frozenset(),
        )
        self._revocations.pop(_member_key(group.group_id, member.member_id), None)
        records: tuple[CoordinatorRecord, ...] = ()
        if left != member.current:
            records = (
                CoordinatorRecord(CurrentAssignmentKey(group.group_id, member.member_id), left),
            )
        return Result(
            records,
            HeartbeatResponse(member_id=member.member_id, member_epoch=LEAVE_STATIC_EPOCH),
        )

    def _check_new_member(self, group: ConsumerGroup, request: HeartbeatRequest) -> None:
        if request.subscribed_topic_names is None and not request.subscribed_topic_regex:
            raise GroupError(
                Errors.INVALID_REQUEST,
                "subscribed_topic_names or subscribed_topic_regex must be set when joining",
            )
        if request.rebalance_timeout_ms <= 0:
            raise GroupError(
                Errors.INVALID_REQUEST,
                f"rebalance_timeout_ms {request.rebalance_timeout_ms} must be positive when "
                "joining",
            )
        if group.member_count() >= self.config.max_size:
            raise GroupError(
                Errors.GROUP_MAX_SIZE_REACHED,
                f"group {group.group_id!r} has reached its maximum of "
                f"{self.config.max_size} members",
            )

    def _check_member_epoch(self, group_id: str, member: Member, request: HeartbeatRequest) -> None:
        """``throwIfMemberEpochIsInvalid``: a member ahead of its epoch, or
        behind it other than by one lost answer, is a zombie."""
        received, expected = request.member_epoch, member.member_epoch
        if received == expected:
            return
        if (
            received < expected
            and received == member.previous_member_epoch
            and request.owned is not None
            and request.owned <= member.assigned
        ):
            return  # the answer that bumped its epoch was lost
        raise GroupError(
            Errors.FENCED_MEMBER_EPOCH,
            f"member {member.member_id!r} of group {group_id!r} sent epoch {received}; its "
            f"epoch is {expected}: it must give up its partitions and rejoin",
        )

    def _member_metadata(
        self, old: MemberMetadataValue | None, request: HeartbeatRequest
    ) -> MemberMetadataValue:
        names = (
            tuple(sorted(set(request.subscribed_topic_names)))
            if request.subscribed_topic_names is not None
            else (() if old is None else old.subscribed_topic_names)
        )
        if request.subscribed_topic_regex is not None:
            regex = request.subscribed_topic_regex or None
        else:
            regex = None if old is None else old.subscribed_topic_regex
        return MemberMetadataValue(
            instance_id=request.instance_id if old is None else old.instance_id,
            rack_id=request.rack_id if request.rack_id is not None or old is None else old.rack_id,
            client_id=request.client_id or ("" if old is None else old.client_id),
            client_host=request.client_host or ("" if old is None else old.client_host),
            subscribed_topic_names=names,
            subscribed_topic_regex=regex,
            rebalance_timeout_ms=(
                request.rebalance_timeout_ms
                if request.rebalance_timeout_ms > 0 or old is None
                else old.rebalance_timeout_ms
            ),
            server_assignor=(
                request.server_assignor
                if request.server_assignor is not None or old is None
                else old.server_assignor
            ),
        )

    def _resolve(self, metadata: MemberMetadataValue, topics: TopicsView) -> list[TopicMetadata]:
        """The existing topics a member subscribes to, by name or pattern."""
        found: dict[str, TopicMetadata] = {}
        for name in metadata.subscribed_topic_names:
            topic = topics.topic(name)
            if topic is not None:
                found[name] = topic
        if metadata.subscribed_topic_regex:
            pattern = self._pattern(metadata.subscribed_topic_regex)
            for name in topics.names():
                if name not in found and not is_internal_topic(name) and pattern.fullmatch(name):
                    topic = topics.topic(name)
                    if topic is not None:
                        found[name] = topic
        return [found[name] for name in sorted(found)]

    def _assignor_for(self, subscriptions: Mapping[str, MemberMetadataValue]) -> Assignor:
        """The group's assignor: the one most members ask for, the default
        if none asks (``ConsumerGroup.preferredServerAssignor``)."""
        counts: dict[str, int] = {}
        for meta in subscriptions.values():
            if meta.server_assignor is not None:
                counts[meta.server_assignor] = counts.get(meta.server_assignor, 0) + 1
        if not counts:
            return self._assignors[self.config.assignors[0]]
        name = max(sorted(counts), key=lambda n: counts[n])
        return self._assignors[name]

    # -- leaving and fencing ----------------------------------------------------

    def _leave(self, request: HeartbeatRequest) -> Result[HeartbeatResponse]:
        group, member = self._known_member(request.group_id, request.member_id)
        records = self._remove_members(group, [member.member_id])
        return Result(
            tuple(records),
            HeartbeatResponse(member_id=member.member_id, member_epoch=LEAVE_EPOCH),
        )

    def _remove_members(
        self, group: ConsumerGroup, member_ids: Iterable[str]
    ) -> list[CoordinatorRecord]:
        """The tombstones of members and one bump of the group epoch, so that
        the target assignment is computed again
        (``GroupMetadataManager.removeMember``)."""
        records: list[CoordinatorRecord] = []
        for member_id in sorted(set(member_ids)):
            records.append(CoordinatorRecord(CurrentAssignmentKey(group.group_id, member_id), None))
            records.append(
                CoordinatorRecord(TargetAssignmentMemberKey(group.group_id, member_id), None)
            )
            records.append(CoordinatorRecord(MemberMetadataKey(group.group_id, member_id), None))
        if records:
            records.append(
                CoordinatorRecord(
                    GroupMetadataKey(group.group_id), GroupMetadataValue(group.epoch + 1)
                )
            )
        return records

    def tick(self, now_ms: int) -> Result[list[tuple[str, str, str]]]:
        """Members whose session ended or who did not revoke within their
        rebalance timeout are removed; offsets past retention expire.  The
        answer lists (group, member, why) for each member removed."""
        expired: dict[str, dict[str, str]] = {}
        for (group_id, member_id), deadline in self._sessions.items():
            if deadline <= now_ms:
                expired.setdefault(group_id, {})[member_id] = "session timed out"
        for (group_id, member_id), deadline in self._revocations.items():
            if deadline <= now_ms:
                expired.setdefault(group_id, {}).setdefault(
                    member_id, "did not revoke its partitions within its rebalance timeout"
                )
        records: list[CoordinatorRecord] = []
        removed: list[tuple[str, str, str]] = []
        for group_id in sorted(expired):
            group = self.groups.get(group_id)
            gone = {
                mid: why
                for mid, why in expired[group_id].items()
                if group is not None and group.member(mid) is not None
            }
            # Members already gone lose their timers here; the others when
            # their tombstones replay (so a write that fails is decided again
            # by the next tick).
            for mid in expired[group_id]:
                if mid not in gone:
                    self._sessions.pop(_member_key(group_id, mid), None)
                    self._revocations.pop(_member_key(group_id, mid), None)
            if group is None or not gone:
                continue
            records.extend(self._remove_members(group, gone))
            removed.extend((group_id, mid, why) for mid, why in sorted(gone.items()))
        if self._next_expiry_ms is None:
            self._next_expiry_ms = now_ms
        if now_ms >= self._next_expiry_ms:
            self._next_expiry_ms = now_ms + self.config.offsets_retention_check_interval_ms
            removing = {g for g, _, _ in removed}
            for group in self.groups:
                if group.group_id not in removing:
                    records.extend(self._expire_offsets(group, now_ms))
        return Result(tuple(records), removed)

    def _expire_offsets(self, group: ConsumerGroup, now_ms: int) -> list[CoordinatorRecord]:
        """Offsets of topics the group does not subscribe to expire
        ``offsets.retention.minutes`` after their commit; an empty group
        whose offsets are all gone is deleted (KIP-848's
        ``OffsetMetadataManager.cleanupExpiredOffsets``).  A partition with
        a pending transactional offset does not expire yet, and a group
        with one is not deleted (Kafka's ``hasPendingTransactionalOffsets``
        and ``openTransactionsByGroup``)."""
        subscribed = group.subscribed_topic_names()
        records: list[CoordinatorRecord] = []
        left = 0
        for (topic, partition), value in sorted(group.offsets.items()):
            if (
                topic not in subscribed
                and value.commit_timestamp_ms + self.config.offsets_retention_ms <= now_ms
                and not self.groups.has_pending(group.group_id, (topic, partition))
            ):
                records.append(
                    CoordinatorRecord(OffsetCommitKey(group.group_id, topic, partition), None)
                )
            else:
                left += 1
        # An empty group goes once its offsets are: with this pass's, or at a
        # later pass, e.g. once the transaction that held them back has ended (Kafka's
        # ``cleanupExpiredOffsets`` answers "all expired" for a group with no
        # offsets and no open transaction, and ``maybeDeleteGroup`` deletes it
        # if it is empty).
        if left == 0 and group.member_count() == 0 and not self.groups.has_pending(group.group_id):
            records.extend(_group_tombstones(group))
        return records

    # -- offsets ------------------------------------------------------------------

    def _check_group_member(
        self, group: ConsumerGroup | None, group_id: str, member_id: str, member_epoch: int
    ) -> None:
        """``ConsumerGroup.validateOffsetCommit``: outside membership only
        when the group has no members; a member's epoch must be its current
        one (a fenced or stale member's commit is refused)."""
        members = 0 if group is None else group.member_count()
        if member_epoch < 0 and members == 0:
            return
        member = None if group is None else group.member(member_id)
        if member is None:
            raise GroupError(
                Errors.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {group_id!r}"
                + (f" (it has {members} members)" if member_epoch < 0 and members else ""),
            )
        if member_epoch != member.member_epoch:
            raise GroupError(
                Errors.STALE_MEMBER_EPOCH,
                f"member {member_id!r} of group {group_id!r} sent epoch {member_epoch}; its "
                f"epoch is {member.member_epoch}",
            )

    def commit_offsets(
        self, request: OffsetCommitRequest, now_ms: int
    ) -> Result[OffsetCommitResponse]:
        if not request.group_id:
            return Result((), OffsetCommitResponse(Errors.INVALID_GROUP_ID, "group_id is empty"))
        group = self.groups.get(request.group_id)
        try:
            self._check_group_member(
                group, request.group_id, request.member_id, request.member_epoch
            )
        except GroupError as error:
            return Result((), OffsetCommitResponse(error.code, error.message))
        return self._commit_records(request.group_id, request.partitions, now_ms)

    def txn_commit_offsets(
        self, request: TxnOffsetCommitRequest, now_ms: int
    ) -> Result[OffsetCommitResponse]:
        """``TxnOffsetCommit`` (``OffsetMetadataManager.commitTransactionalOffset``).

        The records are OffsetCommit records as :meth:`commit_offsets`'s.
        The runtime writes them as one TRANSACTIONAL batch with the
        request's producer id and epoch (after the partition log's check
        that the producer's transaction is ongoing, KIP-890), replays each
        with that producer id and epoch and its offset, and answers once
        they are committed.  They stay pending until the transaction's
        marker: the group's offsets change only at its COMMIT.

        Checks (``validateTransactionalOffsetCommit``): member id "" with
        epoch -1 is a producer that sends no group metadata and is accepted
        whatever the group's members (a group that does not exist is
        created by the records, a "simple" group, as for a commit outside
        membership); otherwise the member must be in the group
        (``UNKNOWN_MEMBER_ID``) at its current epoch
        (``STALE_MEMBER_EPOCH``; Kafka answers ``ILLEGAL_GENERATION``,
        TxnOffsetCommit's code for it), or the group have no members and
        the epoch be negative, as for :meth:`commit_offsets`.  Partitions
        are checked as :meth:`commit_offsets` checks them."""
        if not request.group_id:
            return Result((), OffsetCommitResponse(Errors.INVALID_GROUP_ID, "group_id is empty"))
        if not request.transactional_id:
            return Result(
                (), OffsetCommitResponse(Errors.INVALID_REQUEST, "transactional_id is empty")
            )
        if request.producer_id < 0 or request.producer_epoch < 0:
            return Result(
                (),
                OffsetCommitResponse(
                    Errors.INVALID_REQUEST,
                    f"producer id {request.producer_id} and epoch {request.producer_epoch}: "
                    "a transaction's are not negative",
                ),
            )
        if request.member_id or request.member_epoch != -1:
            try:
                self._check_group_member(
                    self.groups.get(request.group_id),
                    request.group_id,
                    request.member_id,
                    request.member_epoch,
                )
            except GroupError as error:
                return Result((), OffsetCommitResponse(error.code, error.message))
        return self._commit_records(request.group_id, request.partitions, now_ms)

    def _commit_records(
        self, group_id: str, partitions: Iterable[CommitPartition], now_ms: int
    ) -> Result[OffsetCommitResponse]:
        """The OffsetCommit records of the partitions that pass
        :meth:`_check_commit`, and each partition's answer."""
        records: list[CoordinatorRecord] = []
        results: list[PartitionError] = []
        seen: set[tuple[str, int]] = set()
        for part in partitions:
            refusal = self._check_commit(part, seen)
            results.append(
                PartitionError(part.topic, part.partition, *(refusal or (Errors.NONE, "")))
            )
            if refusal is None:
                records.append(
                    CoordinatorRecord(
                        OffsetCommitKey(group_id, part.topic, part.partition),
                        OffsetCommitValue(
                            offset=part.offset,
                            leader_epoch=part.leader_epoch,
                            metadata=part.metadata,
                            commit_timestamp_ms=now_ms,
                        ),
                    )
                )
        return Result(tuple(records), OffsetCommitResponse(partitions=tuple(results)))

    def _check_commit(
        self, part: CommitPartition, seen: set[tuple[str, int]]
    ) -> tuple[Errors, str] | None:
        where = f"{part.topic}-{part.partition}"
        if not part.topic:
            return Errors.INVALID_REQUEST, "topic is empty"
        if part.partition < 0:
            return Errors.INVALID_REQUEST, f"{where}: partition is negative"
        if (part.topic, part.partition) in seen:
            return Errors.INVALID_REQUEST, f"{where} is named twice"
        seen.add((part.topic, part.partition))
        if part.offset < 0:
            return Errors.INVALID_REQUEST, f"{where}: offset {part.offset} is negative"
        if part.leader_epoch < -1:
            return Errors.INVALID_REQUEST, f"{where}: leader epoch {part.leader_epoch} is below -1"
        size = len(part.metadata.encode("utf-8"))
        if size > self.config.offset_metadata_max_bytes:
            return (
                Errors.OFFSET_METADATA_TOO_LARGE,
                f"{where}: metadata of {size} bytes exceeds offset.metadata.max.bytes "
                f"{self.config.offset_metadata_max_bytes}",
            )
        return None

    def fetch_offsets(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        """Read-only: the driver answers it once every earlier write has
        committed, so it never shows an offset that could still be lost.
        Pending transactional offsets are never shown; with
        ``require_stable`` a partition that has one answers
        ``UNSTABLE_OFFSET_COMMIT`` (KIP-447; the client retries until the
        transaction ends).  As Kafka, a fetch of every partition lists the
        committed ones only."""
        group = self.groups.get(request.group_id)
        if request.member_epoch >= 0 or request.member_id:
            try:
                self._check_group_member(
                    group, request.group_id, request.member_id, request.member_epoch
                )
            except GroupError as error:
                return OffsetFetchResponse(error.code, error.message)
        offsets = {} if group is None else group.offsets
        wanted = sorted(offsets) if request.partitions is None else list(request.partitions)
        out = []
        for topic, partition in wanted:
            value = offsets.get((topic, partition))
            if request.require_stable and self.groups.has_pending(
                request.group_id, (topic, partition)
            ):
                out.append(
                    PartitionOffset(
                        topic,
                        partition,
                        -1,
                        error=Errors.UNSTABLE_OFFSET_COMMIT,
                    )
                )
            elif value is None:
                out.append(PartitionOffset(topic, partition, -1))
            else:
                out.append(
                    PartitionOffset(
                        topic,
                        partition,
                        value.offset,
                        value.leader_epoch,
                        value.metadata,
                        value.commit_timestamp_ms,
                    )
                )
        return OffsetFetchResponse(offsets=tuple(out))

    def delete_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> Result[OffsetCommitResponse]:
        """``OffsetDelete``: not of a topic the group subscribes to."""
        group = self.groups.get(group_id)
        if group is None:
            return Result(
                (),
                OffsetCommitResponse(Errors.GROUP_ID_NOT_FOUND, f"group {group_id!r} not found"),
            )
        subscribed = group.subscribed_topic_names()
        records: list[CoordinatorRecord] = []
        results: list[PartitionError] = []
        for topic, partition in partitions:
            if topic in subscribed:
                results.append(
                    PartitionError(
                        topic,
                        partition,
                        Errors.GROUP_SUBSCRIBED_TO_TOPIC,
                        f"group {group_id!r} still subscribes to {topic}",
                    )
                )
                continue
            results.append(PartitionError(topic, partition))
            if (topic, partition) in group.offsets:
                records.append(CoordinatorRecord(OffsetCommitKey(group_id, topic, partition), None))
        return Result(tuple(records), OffsetCommitResponse(partitions=tuple(results)))

    # -- groups -----------------------------------------------------------------

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        wanted = {s.lower() for s in states}
        out = []
        for group in self.groups:
            state = group.state().value
            if not wanted or state.lower() in wanted:
                out.append(GroupListing(group.group_id, state))
        return out

    def describe_group(self, group_id: str) -> GroupDescription:
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(
                group_id, Errors.GROUP_ID_NOT_FOUND, f"group {group_id!r} not found"
            )
        members = []
        subscriptions = {}
        for member in group.live_members():
            meta = member.metadata
            assert meta is not None
            subscriptions[member.member_id] = meta
            members.append(
                MemberDescription(
                    member_id=member.member_id,
                    instance_id=meta.instance_id,
                    rack_id=meta.rack_id,
                    client_id=meta.client_id,
                    client_host=meta.client_host,
                    subscribed_topic_names=meta.subscribed_topic_names,
                    subscribed_topic_regex=meta.subscribed_topic_regex,
                    member_epoch=member.member_epoch,
                    state=member.state.name,
                    assignment=member.assigned,
                    pending_revocation=member.pending_revocation,
                    target=member.target or frozenset(),
                )
            )
        return GroupDescription(
            group_id=group_id,
            state=group.state().value,
            group_epoch=group.epoch,
            assignment_epoch=group.assignment_epoch,
            assignor=self._assignor_for(subscriptions).name,
            members=tuple(members),
        )

    def delete_groups(self, group_ids: Iterable[str]) -> Result[list[DeleteGroupResult]]:
        """``DeleteGroups``: only a group without members; its offsets and
        keys are all tombstoned, and a partition with only a pending
        transactional offset gets a tombstone too, which drops it
        (``OffsetMetadataManager.deleteAllOffsets``)."""
        records: list[CoordinatorRecord] = []
        results: list[DeleteGroupResult] = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is None:
                results.append(
                    DeleteGroupResult(
                        group_id, Errors.GROUP_ID_NOT_FOUND, f"group {group_id!r} not found"
                    )
                )
                continue
            count = group.member_count()
            if count:
                results.append(
                    DeleteGroupResult(
                        group_id,
                        Errors.NON_EMPTY_GROUP,
                        f"group {group_id!r} has {count} members",
                    )
                )
                continue
            pending = {
                where for parts in self.groups.pending_offsets(group_id).values() for where in parts
            }
            for topic, partition in sorted(set(group.offsets) | pending):
                records.append(CoordinatorRecord(OffsetCommitKey(group_id, topic, partition), None))
            records.extend(_group_tombstones(group))
            results.append(DeleteGroupResult(group_id))
        return Result(tuple(records), results)


def _group_tombstones(group: ConsumerGroup) -> list[CoordinatorRecord]:
    """The group's own keys, and those of members left without metadata."""
    records: list[CoordinatorRecord] = []
    for member_id in sorted(group.members):
        records.append(CoordinatorRecord(CurrentAssignmentKey(group.group_id, member_id), None))
        records.append(
            CoordinatorRecord(TargetAssignmentMemberKey(group.group_id, member_id), None)
        )
        records.append(CoordinatorRecord(MemberMetadataKey(group.group_id, member_id), None))
    if group.has_metadata:
        records.append(CoordinatorRecord(TargetAssignmentMetadataKey(group.group_id), None))
        records.append(CoordinatorRecord(SubscriptionMetadataKey(group.group_id), None))
        records.append(CoordinatorRecord(GroupMetadataKey(group.group_id), None))
    return records

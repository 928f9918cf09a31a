"""The shapes the group coordinator's pure core shares: partitions as sets
of (topic id, partition), the member states of KIP-848's reconciliation,
and what an assignor is given and returns.

Assignments name topics by id, as KIP-848's records do, so that a topic
deleted and created again under the same name is a different topic to the
group; committed offsets name topics by name, as ``__consumer_offsets``
does (``OffsetCommitKey``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "NO_EPOCH",
    "LEAVE_EPOCH",
    "LEAVE_STATIC_EPOCH",
    "AssignmentSpec",
    "Assignor",
    "MemberSpec",
    "MemberState",
    "Partitions",
    "by_topic",
]

# (topic id, partition)
Partitions = frozenset[tuple[str, int]]

# A member's epoch in a heartbeat: 0 joins (KIP-848 ConsumerGroupHeartbeat).
NO_EPOCH = 0
# -1 leaves the group.
LEAVE_EPOCH = -1
# -2: a static member (one with an instance id) leaves for now, keeping its
# partitions until its session ends or its instance joins again
# (KIP-848's LEAVE_GROUP_STATIC_MEMBER_EPOCH).
LEAVE_STATIC_EPOCH = -2


class MemberState(enum.IntEnum):
    """Where a member is on its way to its target assignment
    (``MemberState.java`` of Kafka's group coordinator)."""

    # At its target's epoch, owning all of its target that is free.
    STABLE = 0
    # Must revoke partitions before it may move to the target epoch; its
    # epoch stays the old one until it says (by its owned partitions) that
    # it has.
    UNREVOKED_PARTITIONS = 1
    # At the target epoch, but some partitions of its target are still
    # owned (assigned or pending revocation) by other members.
    UNRELEASED_PARTITIONS = 2


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """A member as an assignor sees it (``MemberSubscriptionAndAssignmentImpl``)."""

    # The topic ids it subscribes to that exist.
    topic_ids: frozenset[str]
    rack: str | None = None
    instance_id: str | None = None
    # Its current target assignment, for assignors that keep what they can.
    current: Partitions = frozenset()


@dataclass(frozen=True, slots=True)
class AssignmentSpec:
    """What one assignment is computed from (``GroupSpec`` plus the
    subscribed topics' metadata)."""

    # member id -> its subscription and current target
    members: Mapping[str, MemberSpec]
    # topic id -> partition count, for every topic some member subscribes to
    topics: Mapping[str, int]


class Assignor(Protocol):
    """A server-side assignor (KIP-848 ``ConsumerGroupPartitionAssignor``):
    pure and deterministic, so that every coordinator computes the same
    target from the same group."""

    @property
    def name(self) -> str: ...

    def assign(self, spec: AssignmentSpec) -> dict[str, Partitions]:
        """The target assignment: every member of ``spec`` is a key (with
        an empty set if it gets nothing); each partition of a subscribed
        topic goes to exactly one member subscribed to its topic."""
        ...


def by_topic(partitions: Partitions) -> dict[str, tuple[int, ...]]:
    """``partitions`` grouped by topic id, each topic's partitions sorted
    (the shape of the records and of the heartbeat's answer)."""
    out: dict[str, list[int]] = {}
    for topic_id, partition in partitions:
        out.setdefault(topic_id, []).append(partition)
    return {topic_id: tuple(sorted(parts)) for topic_id, parts in sorted(out.items())}

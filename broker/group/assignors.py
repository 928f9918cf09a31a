"""The server-side assignors of consumer groups (KIP-848): from a group's
subscriptions, its subscribed topics' partition counts and its current
target assignment, the next target assignment.

Both are pure and deterministic: every member id and topic id is sorted
before it decides anything, so the answer depends on the spec's contents
and never on the iteration order of its dicts and sets (whose order for
strings changes from one process to the next with the hash seed).  Two
coordinators, or one before and after a restart, compute the same target
from the same group.

What both read of the spec: a member's subscription is its ``topic_ids``
that ``spec.topics`` knows (a topic missing there does not exist); a
partition of its ``current`` counts only if its topic is in that
subscription and its number is below the topic's count (a topic deleted,
a partition count that shrank with a re-created topic, a topic no longer
subscribed: dropped, as Kafka's builders drop them).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from broker.group.types import AssignmentSpec, Assignor, Partitions

__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "RangeAssignor",
    "UniformAssignor",
    "UnknownAssignorError",
    "assignor",
]

TopicPartition = tuple[str, int]


class UnknownAssignorError(ValueError):
    """A group asked for a server-side assignor the coordinator does not
    have (Kafka answers UNSUPPORTED_ASSIGNOR)."""


# ---------------------------------------------------------------------------
# What both assignors read of the spec.


def _subscriptions(spec: AssignmentSpec) -> dict[str, frozenset[str]]:
    """Every member (sorted by id) -> the topics it subscribes to that exist."""
    for topic_id, count in spec.topics.items():
        if count < 0:
            raise ValueError(f"topic {topic_id!r} has a negative partition count {count}")
    return {
        member_id: frozenset(t for t in spec.members[member_id].topic_ids if t in spec.topics)
        for member_id in sorted(spec.members)
    }


def _subscribers(subscriptions: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
    """Every subscribed topic (sorted by id) -> its subscribers sorted by id.
    A topic of ``spec.topics`` nobody subscribes to is not a key."""
    out: dict[str, list[str]] = {}
    for member_id in sorted(subscriptions):
        for topic_id in subscriptions[member_id]:
            out.setdefault(topic_id, []).append(member_id)
    return {topic_id: out[topic_id] for topic_id in sorted(out)}


def _valid_current(
    spec: AssignmentSpec, subscriptions: Mapping[str, frozenset[str]]
) -> dict[str, list[TopicPartition]]:
    """Every member -> the partitions of its current target it may keep,
    sorted.  A partition two members claim (a current assignment the
    coordinator never writes, but a spec can say) stays with the member
    whose id sorts first, so that nothing is ever assigned twice."""
    claimed: set[TopicPartition] = set()
    out: dict[str, list[TopicPartition]] = {}
    for member_id, subscribed in subscriptions.items():
        keep = []
        for topic_id, partition in sorted(spec.members[member_id].current):
            if (
                topic_id in subscribed
                and 0 <= partition < spec.topics[topic_id]
                and (topic_id, partition) not in claimed
            ):
                claimed.add((topic_id, partition))
                keep.append((topic_id, partition))
        out[member_id] = keep
    return out


# ---------------------------------------------------------------------------
# The uniform assignor.


def _assign_homogeneous(
    spec: AssignmentSpec,
    subscriptions: Mapping[str, frozenset[str]],
    current: Mapping[str, list[TopicPartition]],
) -> dict[str, set[TopicPartition]]:
    """Every member subscribes to the same topics (Kafka's
    ``OptimizedUniformAssignmentBuilder``, later
    ``UniformHomogeneousAssignmentBuilder``): with N partitions and M members
    each member gets N // M, and N % M of them one more.

    Each member keeps up to N // M of its current partitions, and one more
    if it had more and an extra is still free (members in id order take the
    extras); the partitions left are dealt round-robin, sorted by topic and
    partition so that each topic spreads over the members, to the members
    below N // M first and then, one each, to members that did not take an
    extra."""
    members = list(subscriptions)
    topics = sorted(next(iter(subscriptions.values())))
    total = sum(spec.topics[t] for t in topics)
    quota, extras = divmod(total, len(members))

    target: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for member_id in members:
        mine = current[member_id]
        keep = min(len(mine), quota)
        if len(mine) > quota and extras > 0:
            keep += 1
            extras -= 1
        target[member_id].update(mine[:keep])
        taken.update(mine[:keep])

    free = [(t, p) for t in topics for p in range(spec.topics[t]) if (t, p) not in taken]
    next_free = 0
    # Below the quota: round-robin, so each member's share spans the topics.
    short = deque((m, quota - len(target[m])) for m in members if len(target[m]) < quota)
    while short:
        member_id, need = short.popleft()
        target[member_id].add(free[next_free])
        next_free += 1
        if need > 1:
            short.append((member_id, need - 1))
    # What is left is one extra each for as many members, among those at the
    # quota (every member is, now; the ones above it took their extra).
    for member_id in members:
        if next_free == len(free):
            break
        if len(target[member_id]) == quota:
            target[member_id].add(free[next_free])
            next_free += 1
    assert next_free == len(free), "the homogeneous quotas left partitions unassigned"
    return target


@dataclass(slots=True)
class _Held:
    """The partitions of one topic one member holds during the
    heterogeneous balancing: those of its current target (``kept``) are
    given away last, so that moves cost as little stickiness as they can."""

    kept: list[int] = field(default_factory=list)
    fresh: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kept) + len(self.fresh)

    def give(self) -> int:
        return self.fresh.pop() if self.fresh else self.kept.pop()


def _assign_heterogeneous(
    spec: AssignmentSpec,
    subscriptions: Mapping[str, frozenset[str]],
    current: Mapping[str, list[TopicPartition]],
) -> dict[str, set[TopicPartition]]:
    """Members subscribe to different topics (Kafka's
    ``GeneralUniformAssignmentBuilder``, later
    ``UniformHeterogeneousAssignmentBuilder``), in three steps:

    1. every member keeps all of its valid current partitions;
    2. each partition left goes to the least loaded subscriber of its topic
       (ties to the smaller member id), topics with the most partitions per
       subscriber first and then those with fewer subscribers, as Kafka's
       builder sorts them, partitions of topics that tie interleaved;
    3. balance: while a partition of some topic is held by a member with at
       least two more partitions than another subscriber of that topic, one
       moves from the most loaded holder to the least loaded subscriber.

    The end is Kafka's balance for different subscriptions: no partition can
    move to another of its topic's subscribers that has two or more fewer
    partitions than its owner.  Step 3 ends because every move lowers the
    sum of the squares of the members' counts."""
    subscribers = _subscribers(subscriptions)
    count = dict.fromkeys(subscriptions, 0)
    held: dict[str, dict[str, _Held]] = {t: {} for t in subscribers}
    owned: set[TopicPartition] = set()
    for member_id, mine in current.items():
        for topic_id, partition in mine:
            held[topic_id].setdefault(member_id, _Held()).kept.append(partition)
            owned.add((topic_id, partition))
        count[member_id] = len(mine)

    # Step 2.  Counts only grow here, so a heap entry's count is at most the
    # member's: an entry at the top whose count is the member's is the least
    # loaded subscriber (the others are at least as loaded as their entries).
    def order(topic_id: str) -> tuple[Fraction, int, str]:
        n_subscribers = len(subscribers[topic_id])
        return (-Fraction(spec.topics[topic_id], n_subscribers), n_subscribers, topic_id)

    heaps: dict[str, list[tuple[int, str]]] = {}
    rank = {t: order(t)[:2] for t in subscribers}
    unassigned = sorted(
        ((t, p) for t in subscribers for p in range(spec.topics[t]) if (t, p) not in owned),
        key=lambda tp: (*rank[tp[0]], tp[1], tp[0]),
    )
    for topic_id, partition in unassigned:
        heap = heaps.get(topic_id)
        if heap is None:
            heap = heaps[topic_id] = [(count[m], m) for m in subscribers[topic_id]]
            heapq.heapify(heap)
        while heap[0][0] != count[heap[0][1]]:
            heapq.heapreplace(heap, (count[heap[0][1]], heap[0][1]))
        member_id = heap[0][1]
        held[topic_id].setdefault(member_id, _Held()).fresh.append(partition)
        count[member_id] += 1
        heapq.heapreplace(heap, (count[member_id], member_id))

    # Step 3.  A topic's rule reads only its subscribers' counts and who holds
    # its partitions; a move changes two members' counts, so the topics those
    # two subscribe to are checked again.
    pending = deque(t for t in sorted(subscribers, key=order) if len(subscribers[t]) > 1)
    queued = set(pending)
    while pending:
        topic_id = pending.popleft()
        queued.discard(topic_id)
        changed = _balance_topic(subscribers[topic_id], held[topic_id], count)
        for member_id in sorted(changed):
            for other in sorted(subscriptions[member_id]):
                if other not in queued and other != topic_id and len(subscribers[other]) > 1:
                    pending.append(other)
                    queued.add(other)

    target: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for topic_id, holders in held.items():
        for member_id, have in holders.items():
            target[member_id].update((topic_id, p) for p in (*have.kept, *have.fresh))
    return target


def _balance_topic(
    subscribers: list[str], holders: dict[str, _Held], count: dict[str, int]
) -> set[str]:
    """Move partitions of one topic from its most loaded holder to its least
    loaded subscriber while they differ by two or more; the members whose
    counts changed.  Heap entries are dropped when their count is no longer
    the member's (each change pushes a new one)."""
    most = [(-count[m], m) for m in sorted(holders) if holders[m]]
    least = [(count[m], m) for m in subscribers]
    heapq.heapify(most)
    heapq.heapify(least)
    changed: set[str] = set()
    while True:
        while most and (-most[0][0] != count[most[0][1]] or not holders[most[0][1]]):
            heapq.heappop(most)
        while least[0][0] != count[least[0][1]]:
            heapq.heappop(least)
        if not most:
            return changed
        giver, taker = most[0][1], least[0][1]
        if count[giver] - count[taker] < 2:
            return changed
        holders.setdefault(taker, _Held()).fresh.append(holders[giver].give())
        count[giver] -= 1
        count[taker] += 1
        changed.update((giver, taker))
        heapq.heappush(most, (-count[taker], taker))
        heapq.heappush(least, (count[taker], taker))
        heapq.heappush(least, (count[giver], giver))
        if holders[giver]:
            heapq.heappush(most, (-count[giver], giver))


@dataclass(frozen=True, slots=True)
class UniformAssignor:
    """Kafka's ``UniformAssignor`` (KIP-848's default): sticky and balanced.

    With every member subscribed to the same topics, members' counts differ
    by at most one and each member keeps up to its quota of its current
    partitions (:func:`_assign_homogeneous`).  Otherwise each member keeps
    what it has, then partitions move only where one topic's subscribers
    differ by two or more (:func:`_assign_heterogeneous`).  Members
    subscribed to no existing topic get nothing."""

    @property
    def name(self) -> str:
        return "uniform"

    def assign(self, spec: AssignmentSpec) -> dict[str, Partitions]:
        subscriptions = _subscriptions(spec)
        current = _valid_current(spec, subscriptions)
        if len(set(subscriptions.values())) == 1:
            target = _assign_homogeneous(spec, subscriptions, current)
        else:
            target = _assign_heterogeneous(spec, subscriptions, current)
        return {m: frozenset(target[m]) for m in subscriptions}


# ---------------------------------------------------------------------------
# The range assignor.


@dataclass(frozen=True, slots=True)
class RangeAssignor:
    """Kafka's server-side ``RangeAssignor``, co-partitioned ranges: per
    topic, its subscribers sorted by member id and its partitions split in
    contiguous ranges in that order, n // m each and one more to each of the
    first n % m.  Members with the same subscription therefore get the same
    partition numbers of topics with the same partition count (a join of
    co-partitioned topics reads matching partitions in one member).

    Unlike Kafka's KIP-848 range assignor this one is not sticky: it
    ignores the current assignment, and a member joining or leaving shifts
    the ranges of the members after it."""

    @property
    def name(self) -> str:
        return "range"

    def assign(self, spec: AssignmentSpec) -> dict[str, Partitions]:
        subscriptions = _subscriptions(spec)
        target: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
        for topic_id, members in _subscribers(subscriptions).items():
            size, bigger = divmod(spec.topics[topic_id], len(members))
            start = 0
            for i, member_id in enumerate(members):
                end = start + size + (1 if i < bigger else 0)
                target[member_id].update((topic_id, p) for p in range(start, end))
                start = end
        return {m: frozenset(target[m]) for m in subscriptions}


# ---------------------------------------------------------------------------
# The registry.

DEFAULT_ASSIGNOR = "uniform"

ASSIGNORS: Mapping[str, Assignor] = MappingProxyType(
    {a.name: a for a in (UniformAssignor(), RangeAssignor())}
)


def assignor(name: str | None) -> Assignor:
    """The assignor a group names (``None``: the default, as when a
    heartbeat leaves ``ServerAssignor`` null)."""
    chosen = DEFAULT_ASSIGNOR if name is None else name
    found = ASSIGNORS.get(chosen)
    if found is None:
        raise UnknownAssignorError(
            f"unknown server-side assignor {chosen!r}; known: {', '.join(sorted(ASSIGNORS))}"
        )
    return found

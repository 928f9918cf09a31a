"""A consumer's membership of its group (Kafka's ``ConsumerMembershipManager``
and ``AbstractMembershipManager``, KIP-848's "consumer" protocol): pure, time
enters as ``now_ms``.

The driver's loop::

    request = member.heartbeat_to_send(now_ms)        # ConsumerGroupHeartbeat
    member.step_heartbeat_response(answer, now_ms)     # or step_heartbeat_failure
    step = member.rebalance_step()                     # on the poll path
    ...commit (REVOKE with auto-commit), call the listener...
    member.complete(step, now_ms)

Rules (KIP-848; ``AbstractMembershipManager``):

- Joining sends member epoch 0 with the subscription (topic names or a
  regex, which the coordinator resolves), the rebalance timeout, the server
  assignor if set and an empty owned set. Every later heartbeat sends the
  member id and epoch, the full subscription and the owned partitions (by
  topic id): always correct, at the cost of a few bytes.
- An answer's assignment is the member's target. Reconciliation revokes
  first (held - target: the driver commits their consumed offsets when
  auto-commit is on, then calls ``on_partitions_revoked``, then the member
  drops them), then assigns (target - held: ``on_partitions_assigned``),
  then acknowledges: a heartbeat at once with the new owned set. Until a
  revocation completes the partitions stay owned in the heartbeats, so the
  coordinator gives them to nobody else before their offsets are committed.
- ``held`` is exactly what the listener was told: a partition is assigned
  only when not held, revoked or lost only when held; one step is handed out
  at a time.
- ``FENCED_MEMBER_EPOCH`` and ``UNKNOWN_MEMBER_ID``: the partitions are lost
  (``on_partitions_lost``, no commit: another member may own them already),
  then the member rejoins with epoch 0, keeping its member id
  (``transitionToFenced``). ``NOT_COORDINATOR``,
  ``COORDINATOR_NOT_AVAILABLE``, ``COORDINATOR_LOAD_IN_PROGRESS`` and lost
  requests: the heartbeat is sent again after the back-off (finding the
  coordinator is the driver's). Any other error is fatal: the partitions are
  lost and the error is raised by the next poll.
- Heartbeats go every ``heartbeat_interval_ms`` of the last answer, at once
  when joining, acknowledging or leaving; one at a time.
- Leaving (close, unsubscribe): revoke everything held (commit, callback),
  then a heartbeat with epoch -1.
- ``max_poll_interval_ms`` (``max.poll.interval.ms``): a member whose
  application has not polled for that long leaves the group at once
  (epoch -1, state STALE, ``transitionToStale``) so its partitions go to
  members that do make progress; the next poll tells the listener they are
  lost and rejoins with epoch 0.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors

__all__ = [
    "AssignedTopic",
    "AutoCommitTimer",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "Membership",
    "MembershipConfig",
    "MemberState",
    "RebalanceKind",
    "RebalanceStep",
    "FENCED",
    "RETRIABLE",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "LEAVE_STATIC_EPOCH",
]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
# A static member (with an instance id) leaves for now: the coordinator keeps
# its partitions until its session ends or its instance joins again
# (MembershipManagerImpl.leaveGroupEpoch).
LEAVE_STATIC_EPOCH = -2

# The member's partitions went to others: lose them and rejoin.
FENCED = frozenset({Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID})
# Ask again after the back-off (the driver finds the coordinator again).
RETRIABLE = frozenset(
    {
        Errors.NOT_COORDINATOR,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
        Errors.REQUEST_TIMED_OUT,
    }
)


class MemberState(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"
    JOINING = "joining"
    RECONCILING = "reconciling"
    ACKNOWLEDGING = "acknowledging"
    STABLE = "stable"
    FENCED = "fenced"
    PREPARE_LEAVING = "prepare_leaving"
    LEAVING = "leaving"
    STALE = "stale"
    FATAL = "fatal"


class RebalanceKind(enum.Enum):
    REVOKE = "revoke"  # commit (auto-commit), on_partitions_revoked, then drop
    ASSIGN = "assign"  # on_partitions_assigned, then hold
    LOSE = "lose"  # on_partitions_lost, no commit, then drop


@dataclass(frozen=True, slots=True)
class RebalanceStep:
    kind: RebalanceKind
    partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    group_id: str
    client_id: str = ""
    rebalance_timeout_ms: int = 300_000  # max.poll.interval.ms, as Kafka sends
    max_poll_interval_ms: int = 300_000
    server_assignor: str | None = None
    instance_id: str | None = None
    retry_backoff_ms: int = 100

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must not be empty")
        for name in ("rebalance_timeout_ms", "max_poll_interval_ms", "retry_backoff_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat request (owned by topic id)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] | None
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: tuple[tuple[str, tuple[int, ...]], ...] | None
    client_id: str


@dataclass(frozen=True, slots=True)
class AssignedTopic:
    """Partitions of one topic in an answer; ``name`` is "" if the driver
    could not resolve the topic id (neither the answer nor the metadata)."""

    topic_id: str
    name: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: Errors = Errors.NONE
    message: str = ""
    member_id: str = ""
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # None: unchanged since the last answer.
    assignment: tuple[AssignedTopic, ...] | None = None


class Membership:
    """One consumer's membership of its group (module docstring)."""

    def __init__(self, config: MembershipConfig) -> None:
        self.config = config
        self.state = MemberState.UNSUBSCRIBED
        self.member_id = ""
        self.member_epoch = JOIN_EPOCH
        self.topics: tuple[str, ...] | None = None
        self.pattern: str | None = None
        # What the listener was told the consumer holds.
        self.held: frozenset[TopicPartition] = frozenset()
        # The last assignment received, by topic id; names as resolved.
        self.target: frozenset[tuple[str, int]] = frozenset()
        self.names: dict[str, str] = {}
        self.ids: dict[str, str] = {}
        self.error: Errors | None = None
        self.error_message = ""
        self.heartbeat_interval_ms = 0
        self._next_heartbeat_ms = 0
        self._in_flight = False
        self._leave_in_flight = False
        self._in_step: RebalanceStep | None = None
        self._last_poll_ms: int | None = None
        # Leave then stop (close, unsubscribe) or leave then rejoin (stale).
        self._after_leave = MemberState.UNSUBSCRIBED

    # -- the application's calls ----------------------------------------------

    def subscribe(
        self, topics: Iterable[str] | None = None, pattern: str | None = None, now_ms: int = 0
    ) -> None:
        """Join with these topic names or this pattern (replacing the
        subscription; the next heartbeat carries it)."""
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to topic names or to a pattern, exactly one")
        if topics is not None:
            names = tuple(sorted(set(topics)))
            if not names or any(not isinstance(t, str) or not t for t in names):
                raise ValueError(f"subscribe needs non-empty topic names, not {topics!r}")
            self.topics, self.pattern = names, None
        else:
            if not pattern:
                raise ValueError("subscribe needs a non-empty pattern")
            self.topics, self.pattern = None, pattern
        if self.state in (MemberState.UNSUBSCRIBED, MemberState.LEAVING):
            self._join()
        self._next_heartbeat_ms = now_ms  # the new subscription at once

    def leave(self) -> None:
        """Close or unsubscribe: revoke what is held, then leave (epoch -1;
        -2 for a static member, which the coordinator keeps for its
        session)."""
        self._after_leave = MemberState.UNSUBSCRIBED
        if self.state in (MemberState.UNSUBSCRIBED, MemberState.FATAL):
            return
        if self.state is MemberState.STALE:
            # Already out of the group: only the listener is still to be
            # told its partitions are lost (the next rebalance step).
            if not self.held and self._in_step is None:
                self._left()
            return
        if self.member_epoch == JOIN_EPOCH and not self.held and not self.member_id:
            self.state = MemberState.UNSUBSCRIBED  # never joined: nothing to leave
            return
        self.state = MemberState.PREPARE_LEAVING
        self._maybe_leave_now()

    def on_poll(self, now_ms: int) -> None:
        """The application polled (``max.poll.interval.ms`` starts again). A
        stale member rejoins once its partitions are lost."""
        self._last_poll_ms = now_ms
        if self.state is MemberState.STALE and not self.held and self._in_step is None:
            if self._after_leave is MemberState.STALE:
                self._join()
            else:
                self._left()  # closed meanwhile: no rejoin

    def tick(self, now_ms: int) -> None:
        """Leave proactively if the application stopped polling
        (``maybeTransitionToLeaveGroupStaleMember``)."""
        if (
            self._last_poll_ms is not None
            and now_ms - self._last_poll_ms > self.config.max_poll_interval_ms
            and self.state
            in (
                MemberState.JOINING,
                MemberState.RECONCILING,
                MemberState.ACKNOWLEDGING,
                MemberState.STABLE,
            )
        ):
            self._after_leave = MemberState.STALE
            self.state = MemberState.LEAVING
            self._next_heartbeat_ms = now_ms

    @property
    def is_subscribed(self) -> bool:
        return self.topics is not None or self.pattern is not None

    # -- heartbeats -----------------------------------------------------------

    def heartbeat_to_send(self, now_ms: int) -> HeartbeatRequest | None:
        """The heartbeat to send now, if one is due; the driver then owes
        ``step_heartbeat_response`` or ``step_heartbeat_failure``."""
        if self._in_flight or self.state in (
            MemberState.UNSUBSCRIBED,
            MemberState.FENCED,
            MemberState.PREPARE_LEAVING,
            MemberState.STALE,
            MemberState.FATAL,
        ):
            return None
        if now_ms < self._next_heartbeat_ms:
            return None
        self._in_flight = True
        leaving = self.state is MemberState.LEAVING
        # Which heartbeat the next answer is for: a leave decided while a
        # heartbeat was in flight still has to be sent.
        self._leave_in_flight = leaving
        if leaving:
            epoch = LEAVE_EPOCH if self.config.instance_id is None else LEAVE_STATIC_EPOCH
        else:
            epoch = self.member_epoch
        owned: dict[str, list[int]] = {}
        for tp in self.held:
            owned.setdefault(self.ids[tp.topic], []).append(tp.partition)
        return HeartbeatRequest(
            group_id=self.config.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            instance_id=self.config.instance_id,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            subscribed_topic_names=None if leaving else self.topics,
            subscribed_topic_regex=None if leaving else self.pattern,
            server_assignor=None if leaving else self.config.server_assignor,
            owned=None
            if leaving
            else tuple(sorted((t, tuple(sorted(p))) for t, p in owned.items())),
            client_id=self.config.client_id,
        )

    def heartbeat_in_flight(self) -> bool:
        return self._in_flight

    def next_heartbeat_ms(self) -> int:
        return self._next_heartbeat_ms

    def step_heartbeat_failure(self, now_ms: int) -> None:
        """No answer came (lost connection, no coordinator): again after the
        back-off."""
        self._in_flight = False
        self._next_heartbeat_ms = now_ms + self.config.retry_backoff_ms
        if self.state is MemberState.LEAVING and self._leave_in_flight:
            # Kafka does not retry a leave: the session timeout removes it.
            self._left()
        elif self.state is MemberState.LEAVING:
            self._next_heartbeat_ms = 0  # the leave itself is still to go

    def step_heartbeat_response(self, answer: HeartbeatAnswer, now_ms: int) -> None:
        self._in_flight = False
        if self.state is MemberState.LEAVING:
            if self._leave_in_flight:
                self._left()
            else:
                # The answer to a heartbeat sent before the leave: send the
                # leave now (treating this as its answer left the member in
                # the group until its session ended).
                self._next_heartbeat_ms = 0
            return
        if self.state in (
            MemberState.UNSUBSCRIBED,
            MemberState.STALE,
            MemberState.FATAL,
            MemberState.PREPARE_LEAVING,
        ):
            return  # an answer for a membership given up or being given up
        if answer.error in RETRIABLE:
            self._next_heartbeat_ms = now_ms + self.config.retry_backoff_ms
            return
        if answer.error in FENCED:
            # transitionToFenced: keep the member id, lose everything, rejoin at 0.
            self.target = frozenset()
            self.state = MemberState.FENCED
            self._maybe_rejoin()
            return
        if answer.error is not Errors.NONE:
            self.error, self.error_message = answer.error, answer.message
            self.state = MemberState.FATAL
            return
        self.member_id = answer.member_id or self.member_id
        self.member_epoch = answer.member_epoch
        self.heartbeat_interval_ms = answer.heartbeat_interval_ms
        self._next_heartbeat_ms = now_ms + answer.heartbeat_interval_ms
        if answer.assignment is not None:
            previous = self.target
            self._take_assignment(answer.assignment)
            if (
                self.target == previous
                and self.state is not MemberState.RECONCILING
                and self._in_step is None
                and self.held == self._resolved_target()
            ):
                # The assignment it holds, said again (the coordinator
                # answers it on every heartbeat): nothing to reconcile or
                # acknowledge, so the next heartbeat waits for the interval
                # instead of going at once, every round trip, for ever.
                self.state = MemberState.STABLE
            else:
                self.state = MemberState.RECONCILING
                self._maybe_acknowledge(now_ms)
        elif self.state in (MemberState.JOINING, MemberState.ACKNOWLEDGING):
            self.state = MemberState.STABLE

    def _take_assignment(self, topics: tuple[AssignedTopic, ...]) -> None:
        target: set[tuple[str, int]] = set()
        for topic in topics:
            if topic.name:
                self.names[topic.topic_id] = topic.name
                self.ids[topic.name] = topic.topic_id
            target.update((topic.topic_id, p) for p in topic.partitions)
        self.target = frozenset(target)

    def resolve_names(self, names: Mapping[str, str]) -> None:
        """Topic ids the metadata now names (an assignment came with some
        unresolved)."""
        for topic_id, name in names.items():
            if name:
                self.names[topic_id] = name
                self.ids[name] = topic_id

    def unresolved(self) -> frozenset[str]:
        return frozenset(t for t, _ in self.target if t not in self.names)

    def _resolved_target(self) -> frozenset[TopicPartition]:
        return frozenset(
            TopicPartition(self.names[t], p) for t, p in self.target if t in self.names
        )

    # -- reconciliation -------------------------------------------------------

    def rebalance_step(self) -> RebalanceStep | None:
        """What the driver must do for the listener now (one step at a time,
        on the application's poll path); None if nothing."""
        if self._in_step is not None:
            return None
        step = self._next_step()
        self._in_step = step
        return step

    def _next_step(self) -> RebalanceStep | None:
        if self.state in (MemberState.FENCED, MemberState.FATAL, MemberState.STALE):
            return RebalanceStep(RebalanceKind.LOSE, self.held) if self.held else None
        if self.state is MemberState.PREPARE_LEAVING:
            return RebalanceStep(RebalanceKind.REVOKE, self.held) if self.held else None
        if self.state is MemberState.RECONCILING:
            target = self._resolved_target()
            revoked = self.held - target
            if revoked:
                return RebalanceStep(RebalanceKind.REVOKE, revoked)
            added = target - self.held
            if added:
                return RebalanceStep(RebalanceKind.ASSIGN, added)
        return None

    def complete(self, step: RebalanceStep, now_ms: int) -> None:
        """The driver did ``step`` (committed, called the listener): the
        held set follows what the listener was told, whatever happened to
        the membership meanwhile."""
        if step is not self._in_step:
            raise ValueError(f"complete({step}) but the step handed out is {self._in_step}")
        self._in_step = None
        if step.kind is RebalanceKind.ASSIGN:
            self.held = self.held | step.partitions
        else:
            self.held = self.held - step.partitions
        if self.state is MemberState.RECONCILING:
            self._maybe_acknowledge(now_ms)
        elif self.state is MemberState.FENCED:
            self._maybe_rejoin()
        elif self.state is MemberState.PREPARE_LEAVING:
            self._maybe_leave_now()
        elif self.state is MemberState.STALE and not self.held:
            if self._after_leave is MemberState.STALE:
                if self._last_poll_ms is not None:
                    self.on_poll(self._last_poll_ms)
            else:
                self._left()

    def _maybe_acknowledge(self, now_ms: int) -> None:
        # Reconciled once the held set is the (resolved) target: tell the
        # coordinator at once (ACKNOWLEDGING).
        if self._in_step is None and self.held == self._resolved_target():
            self.state = MemberState.ACKNOWLEDGING
            self._next_heartbeat_ms = now_ms

    def _maybe_rejoin(self) -> None:
        if not self.held and self._in_step is None:
            self._join()

    def _maybe_leave_now(self) -> None:
        if not self.held and self._in_step is None:
            self.state = MemberState.LEAVING
            self._next_heartbeat_ms = 0

    def _join(self) -> None:
        self.state = MemberState.JOINING
        self.member_epoch = JOIN_EPOCH
        self.target = frozenset()
        self._next_heartbeat_ms = 0

    def _left(self) -> None:
        self.member_epoch = JOIN_EPOCH
        self.target = frozenset()
        if self._after_leave is MemberState.STALE:
            self.state = MemberState.STALE
        else:
            self.state = MemberState.UNSUBSCRIBED
            self.topics = self.pattern = None
            self.member_id = ""

    def left(self) -> bool:
        """Nothing more to send: unsubscribed (after a leave) or fatal."""
        return self.state in (MemberState.UNSUBSCRIBED, MemberState.FATAL)


class AutoCommitTimer:
    """``enable.auto.commit``/``auto.commit.interval.ms``: whether a commit
    is due. The driver asks at the START of each poll, before any record is
    returned, and commits the positions as they are then: the offsets after
    the records earlier polls returned, which the application has processed
    since it polls again (``ConsumerCoordinator.maybeAutoCommitOffsetsAsync``
    in ``KafkaConsumer.poll``; the commit must never include the records the
    same poll is about to return)."""

    def __init__(self, interval_ms: int, now_ms: int) -> None:
        if interval_ms < 1:
            raise ValueError(f"auto_commit_interval_ms must be >= 1, not {interval_ms}")
        self.interval_ms = interval_ms
        self._next_ms = now_ms + interval_ms

    def maybe_due(self, now_ms: int) -> bool:
        if now_ms < self._next_ms:
            return False
        self._next_ms = now_ms + self.interval_ms
        return True

"""The KRaft consensus core: a pure, deterministic state machine.

Inputs: messages (:meth:`RaftCore.step`), the passage of time
(:meth:`RaftCore.tick`, with the caller's ``now_ms``), proposals
(:meth:`RaftCore.propose`), resignation (:meth:`RaftCore.resign`) and
snapshots taken by the state machine (:meth:`RaftCore.snapshot_created`).
Output: a :class:`quorum.ready.Ready`, carried out by the driver and
acknowledged with :meth:`RaftCore.advance`.  The core imports no clock, no
I/O and no global randomness; randomness comes from the injected
``random.Random``.

Protocol: KIP-595 (pull-based Raft for Kafka), KIP-996 (pre-vote),
KIP-630 (snapshots) and check-quorum (KAFKA-15489).

Role transitions (the transition table, as Kafka's ``QuorumState``).  "Newer
epoch" means a response, a BeginQuorumEpoch, an EndQuorumEpoch or a real Vote
request from a voter carrying an epoch above ours (fetch requests and
pre-votes change nothing): we move to that epoch, as Follower if the message
names a live leader, else as Unattached.  That row applies to every role and
is not repeated::

    Unattached  -> Prospective  election timeout (voters)
                -> Follower     BeginQuorumEpoch, or a vote or fetch response
                                naming a leader of our epoch we did not know
    Prospective -> Candidate    a majority granted the pre-vote (KIP-996)
                -> Follower     BeginQuorumEpoch, or a vote response naming a
                                leader of our epoch other than the one we
                                timed out on
                -> Unattached   we granted a real vote
                -> Prospective  election timeout (a new pre-vote round)
    Candidate   -> Leader       a majority granted the vote
                -> Follower     as Prospective
                -> Prospective  election timeout, or the backoff after a
                                majority refused
    Leader      -> Resigned     resign(), or check-quorum failed
    Resigned    -> Prospective  election timeout
    Follower    -> Prospective  fetch timeout (voters); EndQuorumEpoch or a
                                NOT_LEADER answer from the leader shortens it
                -> Unattached   fetch timeout (observers)

A node that restarts comes back Resigned if its quorum state says it led
(Kafka: it may not lead that epoch again), Follower if it names another
leader, else Unattached.
Observers (nodes not in the voter set) are only ever Unattached or Follower.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import bugs
from bugs import Bug
from quorum.config import QuorumConfig
from quorum.log import LogError, RaftLog
from quorum.majority import VoteResult, committed_offset, vote_result
from quorum.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
    epoch_out_of_range,
)
from quorum.ready import Ready, SnapshotChunk
from quorum.storage import LogStore, QuorumStateStore, SnapshotStore, StorageCorruptError
from quorum.types import (
    MAX_EPOCH,
    Batch,
    BatchKind,
    LeaderAndEpoch,
    LeaderChange,
    NodeId,
    OffsetAndEpoch,
    QuorumState,
    Role,
    SnapshotId,
    VoterSet,
)

# Requests: what a node may receive from a non-voter (observers fetch).
_REQUESTS = (
    VoteRequest,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
)

__all__ = [
    "InvalidProposalError",
    "NotLeaderError",
    "ProposeResult",
    "RaftCore",
    "ReadBarrier",
    "ReplicaStatus",
    "SafetyError",
    "Status",
]


class NotLeaderError(Exception):
    """A proposal reached a node that is not the leader."""

    def __init__(self, leader_id: NodeId | None, epoch: int) -> None:
        known = f"the leader is {leader_id}" if leader_id is not None else "no leader is known"
        super().__init__(f"not the leader; {known} in epoch {epoch}")
        self.leader_id = leader_id
        self.epoch = epoch


class InvalidProposalError(ValueError):
    """A proposal that can never be appended (empty, or not bytes)."""


class SafetyError(Exception):
    """The protocol was asked to do something that would lose committed data.

    Raised instead of acting: a correct cluster never raises it, so the
    simulator treats it as a violation and a real node stops.
    """


@dataclass(frozen=True, slots=True)
class ProposeResult:
    """Where a proposal will commit if the leader keeps its epoch."""

    base_offset: int
    last_offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class ReadBarrier:
    """A linearizable read in progress (Raft thesis §6.4, read index).

    The read may be served from the local state machine once
    :meth:`RaftCore.read_confirmed` says so and everything below
    ``read_index`` has been applied.
    """

    epoch: int
    read_index: int
    # Fetches the leader had processed when the read began; a majority of
    # voters must fetch after this to confirm the leadership.
    fetch_seq: int


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """The leader's view of one replica (KIP-595/KIP-836 DescribeQuorum)."""

    node_id: NodeId
    is_voter: bool
    log_end_offset: int
    last_fetch_ms: int | None
    last_caught_up_ms: int | None


@dataclass(frozen=True, slots=True)
class Status:
    node_id: NodeId
    role: Role
    epoch: int
    leader_id: NodeId | None
    voted_for: NodeId | None
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_epoch: int
    is_voter: bool
    replicas: tuple[ReplicaStatus, ...] = ()


@dataclass(slots=True)
class _Progress:
    """Leader-side state of one replica's fetching."""

    node_id: NodeId
    is_voter: bool
    # Invariant: the fetcher's log matches the leader's below end_offset
    # (it was validated against the leader's log by epoch).
    end_offset: int = 0
    last_fetch_ms: int | None = None
    last_caught_up_ms: int | None = None
    # The high watermark last sent to this replica: a fetch is parked only
    # when it would bring neither data nor a newer high watermark.
    hw_sent: int = -1
    # The leader's fetch counter when this replica last fetched (read index).
    last_fetch_seq: int = 0


class RaftCore:
    """One replica of the quorum.  Not thread-safe; one caller at a time."""

    def __init__(
        self,
        node_id: NodeId,
        voters: VoterSet,
        *,
        log_store: LogStore,
        state_store: QuorumStateStore,
        snapshot_store: SnapshotStore,
        rng: random.Random,
        now_ms: int,
        config: QuorumConfig | None = None,
    ) -> None:
        self.node_id = node_id
        self.voters = voters
        self.config = config or QuorumConfig()
        self._rng = rng
        self._snapshots = snapshot_store
        self._now = now_ms
        self._msgs: list[Message] = []

        # -- durable state as loaded; startup reconciliation ---------------
        snapshot = snapshot_store.latest()
        batches = log_store.read_all()
        self._pending_reset: SnapshotId | None = None
        self._pending_truncate: int | None = None
        self._pending_compact: SnapshotId | None = None
        self._pending_chunks: list[SnapshotChunk] = []
        self._pending_load: SnapshotId | None = None
        self._log = RaftLog()
        self._init_log(snapshot, batches)
        state = state_store.read() or QuorumState()
        for what, epoch in (
            ("snapshot", -1 if snapshot is None else snapshot.epoch),
            ("quorum state", state.epoch),
            ("log", self._log.last_epoch),
        ):
            if epoch > MAX_EPOCH:
                # Nothing a node wrote itself: it never holds such an epoch.
                raise StorageCorruptError(
                    f"the stored {what} holds epoch {epoch}, past the largest a node "
                    f"may hold ({MAX_EPOCH}, so that it can still leave it)"
                )
        self._state = state
        self._state_dirty = False
        if state.epoch < self._log.last_epoch:
            # The log holds batches of an epoch the quorum state has not
            # reached (a lost or stale quorum-state file).  As Kafka's
            # QuorumState.initialize does, move to the log's epoch with no
            # vote and no leader: the epoch never goes back.
            state = QuorumState(self._log.last_epoch, None, None)
            self._set_state(state)

        # Invariant: the high watermark never decreases while this core lives
        # and never passes the log end offset.  It is not persisted (as in
        # Kafka): after a restart it starts from the snapshot.
        self._high_watermark = self._log.start_offset
        # Invariant: applied <= high_watermark; batches below applied were
        # handed to the state machine (or covered by a loaded snapshot).
        self._applied = 0
        if snapshot is not None:
            self._pending_load = snapshot
            self._applied = snapshot.end_offset
        # Durability of the log as the core knows it: batches below
        # stable_end are on disk; batches from unstable_from have not yet
        # been handed to the driver.  Invariant: stable_end <= unstable_from.
        self._stable_end = self._log.end_offset
        self._unstable_from = self._log.end_offset
        self._handed_end: int | None = None
        self._outstanding: Ready | None = None
        self._reported_leader: LeaderAndEpoch | None = None

        # -- role state ------------------------------------------------------
        self._role = Role.UNATTACHED
        self._election_deadline = 0
        self._fetch_deadline = 0
        self._leader_resigned = False
        # The one fetch (or FetchSnapshot) in flight: (leader, request id, sent).
        self._fetch_inflight: tuple[NodeId, int, int] | None = None
        # Starts at a random point so that the ids of this incarnation do not
        # repeat those of an earlier one, whose answers may still arrive.
        self._request_seq = rng.getrandbits(48)
        # No fetch before this time (backoff after an error answer).
        self._next_fetch_ms = 0
        self._snapshot_fetch: tuple[SnapshotId, int] | None = None  # id, position
        self._bootstrap_target: NodeId | None = None
        self._granted: set[NodeId] = set()
        self._rejected: set[NodeId] = set()
        self._vote_sent_ms: dict[NodeId, int] = {}
        self._lost_elections = 0
        self._backing_off = False
        self._progress: dict[NodeId, _Progress] = {}
        self._epoch_start_offset = 0
        self._leader_since_ms = 0
        self._parked_fetches: dict[NodeId, tuple[FetchRequest, int]] = {}
        self._begin_epoch_deadline = 0
        # Fetches processed as leader; orders fetches after a read began.
        self._fetch_seq = 0
        # Resigned: the successor order, who has not acknowledged
        # EndQuorumEpoch yet, and when to send it again.
        self._successors: tuple[NodeId, ...] = ()
        self._end_epoch_unacked: set[NodeId] = set()
        self._end_epoch_resend_ms = 0

        # Kafka's QuorumState.initialize: a node that was leader comes back
        # Resigned (it may not lead its old epoch again); one that knew a
        # leader comes back its follower; otherwise unattached.
        if state.leader_id == node_id and self.is_voter:
            # It no longer knows how caught up each voter is: successors in
            # id order, so that one of them starts at once.
            self._become_resigned()
        elif state.leader_id is not None and state.leader_id != node_id:
            self._become_follower_role(state.leader_id)
        else:
            self._become_unattached_role()

    # ------------------------------------------------------------------
    # public queries

    @property
    def role(self) -> Role:
        return self._role

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def leader_id(self) -> NodeId | None:
        return self._state.leader_id

    @property
    def at_last_epoch(self) -> bool:
        """True at MAX_EPOCH: no election can start, since the next epoch
        would not fit in an int32 (the node still follows a leader of this
        epoch)."""
        return self._state.epoch >= MAX_EPOCH

    @property
    def voted_for(self) -> NodeId | None:
        return self._state.voted_for

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def log(self) -> RaftLog:
        """Read-only view of the log (do not mutate)."""
        return self._log

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    @property
    def applied_offset(self) -> int:
        return self._applied

    @property
    def epoch_start_offset(self) -> int:
        return self._epoch_start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._log.end_offset

    def status(self) -> Status:
        replicas: tuple[ReplicaStatus, ...] = ()
        if self._role is Role.LEADER:
            rows = [ReplicaStatus(self.node_id, True, self._log.end_offset, self._now, self._now)]
            for p in sorted(self._progress.values(), key=lambda p: p.node_id):
                rows.append(
                    ReplicaStatus(
                        p.node_id, p.is_voter, p.end_offset, p.last_fetch_ms, p.last_caught_up_ms
                    )
                )
            replicas = tuple(rows)
        return Status(
            node_id=self.node_id,
            role=self._role,
            epoch=self.epoch,
            leader_id=self.leader_id,
            voted_for=self.voted_for,
            high_watermark=self._high_watermark,
            log_start_offset=self._log.start_offset,
            log_end_offset=self._log.end_offset,
            last_epoch=self._log.last_epoch,
            is_voter=self.is_voter,
            replicas=replicas,
        )

    def next_deadline_ms(self) -> int:
        """When :meth:`tick` must next be called.  A value at or before the
        current time means "now"; every timer reported here is consumed or
        moved by the tick that handles it, so a driver never spins."""
        deadlines: list[int] = []
        if self._role is Role.LEADER:
            check_quorum = self._check_quorum_deadline()
            if check_quorum is not None:
                deadlines.append(check_quorum)
            deadlines.append(self._begin_epoch_deadline)
            deadlines.extend(d for _, d in self._parked_fetches.values())
        elif self._role is Role.FOLLOWER:
            deadlines.append(self._fetch_deadline)
            if self._fetch_inflight is not None:
                deadlines.append(self._fetch_inflight[2] + self._fetch_retry_ms())
            else:
                deadlines.append(self._next_fetch_ms)
        elif self._role is Role.UNATTACHED and not self.is_voter:
            deadlines.append(self._fetch_deadline)
        else:
            deadlines.append(self._election_deadline)
            if self._role is Role.RESIGNED and self._end_epoch_unacked:
                deadlines.append(self._end_epoch_resend_ms)
            if self._role in (Role.PROSPECTIVE, Role.CANDIDATE):
                deadlines.extend(
                    t + self.config.request_timeout_ms for t in self._vote_sent_ms.values()
                )
        return min(deadlines)

    def _check_quorum_deadline(self) -> int | None:
        """When check-quorum would next fail if no voter fetched again: the
        moment the (majority - 1)-th most recent voter fetch grows too old."""
        need = self.voters.majority() - 1  # the leader counts itself
        if need <= 0:
            return None
        window = self.config.check_quorum_timeout_ms
        fetches = sorted(
            (
                p.last_fetch_ms
                for p in self._progress.values()
                if p.is_voter and p.last_fetch_ms is not None
            ),
            reverse=True,
        )
        if len(fetches) < need:
            return self._leader_since_ms + window
        return max(fetches[need - 1], self._leader_since_ms) + window

    # ------------------------------------------------------------------
    # inputs

    def tick(self, now_ms: int) -> None:
        """Let time pass: fire every timer due at ``now_ms``."""
        self._advance_clock(now_ms)
        if self._role is Role.LEADER:
            self._tick_leader()
        elif self._role is Role.FOLLOWER:
            self._tick_follower()
        elif self._role is Role.UNATTACHED:
            self._tick_unattached()
        elif self._role in (Role.PROSPECTIVE, Role.CANDIDATE):
            self._tick_election()
        elif self._role is Role.RESIGNED:
            self._tick_resigned()

    def step(self, msg: Message, now_ms: int) -> None:
        """Handle one message addressed to this node."""
        self._advance_clock(now_ms)
        if msg.dst != self.node_id:
            return
        if msg.src == self.node_id:
            # A node never messages itself: a forged or misrouted message.
            self._refuse(msg, ErrorCode.INVALID_REQUEST)
            return
        if epoch_out_of_range(msg) is not None:
            # Any path that adopts an epoch (a newer epoch's message, a
            # leader's batches, a snapshot) would take this one to an epoch
            # it could never leave: refuse the whole message, change nothing.
            self._refuse(msg, ErrorCode.INVALID_REQUEST)
            return
        if (
            isinstance(msg, BeginQuorumEpochRequest | EndQuorumEpochRequest)
            and (msg.src not in self.voters or msg.leader_id != msg.src)
        ) or (not isinstance(msg, _REQUESTS) and msg.src not in self.voters):
            # Only a voter leads, announces or ends an epoch, and only voters
            # answer the requests that carry epochs (the transition table's
            # "from a voter"): a non-voter cannot move our epoch.
            self._refuse(msg, ErrorCode.INCONSISTENT_VOTER_SET)
            return
        match msg:
            case VoteRequest():
                self._step_vote_request(msg)
            case VoteResponse():
                self._step_vote_response(msg)
            case BeginQuorumEpochRequest():
                self._step_begin_quorum_epoch_request(msg)
            case BeginQuorumEpochResponse():
                self._maybe_follow_newer_epoch(msg.epoch, msg.leader_id)
            case EndQuorumEpochRequest():
                self._step_end_quorum_epoch_request(msg)
            case EndQuorumEpochResponse():
                if not self._maybe_follow_newer_epoch(msg.epoch, msg.leader_id) and (
                    msg.epoch == self.epoch and msg.error is ErrorCode.NONE
                ):
                    self._end_epoch_unacked.discard(msg.src)
            case FetchRequest():
                self._step_fetch_request(msg)
            case FetchResponse():
                self._step_fetch_response(msg)
            case FetchSnapshotRequest():
                self._step_fetch_snapshot_request(msg)
            case FetchSnapshotResponse():
                self._step_fetch_snapshot_response(msg)
            case _:
                raise TypeError(f"unknown message type {type(msg).__name__}")

    def propose(self, records: Sequence[bytes], now_ms: int) -> ProposeResult:
        """Append ``records`` as one batch of the leader's epoch.

        Raises :class:`NotLeaderError` on any node but the active leader and
        :class:`InvalidProposalError` for an empty or non-bytes proposal.
        """
        self._advance_clock(now_ms)
        if self._role is not Role.LEADER:
            raise NotLeaderError(self._live_leader_id(), self.epoch)
        if not records:
            raise InvalidProposalError("a proposal needs at least one record")
        for i, record in enumerate(records):
            if not isinstance(record, bytes):
                raise InvalidProposalError(f"record {i} is {type(record).__name__}, not bytes")
        batch = Batch(self._log.end_offset, self.epoch, tuple(records))
        self._append_as_leader(batch)
        return ProposeResult(batch.base_offset, batch.last_offset, batch.epoch)

    def report_unreachable(self, node: NodeId, now_ms: int) -> None:
        """The transport could not reach ``node`` at all (connection refused
        or reset: etcd's ReportUnreachable).

        If ``node`` is our leader, a crashed leader is the likely cause: we
        stop counting it as live (so we grant pre-votes) and campaign after a
        short random delay instead of a whole fetch timeout.  Pre-vote keeps
        this harmless when only our link failed: voters that still hear the
        leader refuse, and its BeginQuorumEpoch re-sends bring us back.
        """
        self._advance_clock(now_ms)
        if self._role is not Role.FOLLOWER or node != self.leader_id:
            return
        self._leader_resigned = True
        if self.is_voter:
            delay = self._rng.randrange(max(1, self.config.election_timeout_ms // 2))
        else:
            delay = 0  # an observer just looks for the leader elsewhere
        self._fetch_deadline = min(self._fetch_deadline, self._now + delay)
        self._fetch_inflight = None

    def begin_read(self, now_ms: int) -> ReadBarrier | None:
        """Start a linearizable read (Raft thesis §6.4, adapted to KIP-595's
        pull replication).

        The read index is the current high watermark, which must already
        cover a record of this leader's epoch (until then the leader does not
        know the full committed prefix: returns None, try again shortly).
        Parked fetches are answered at once so the followers fetch again
        without waiting out the long poll; once a majority of voters has
        fetched after this call, no newer leader can have committed anything
        before it: a newer epoch needs a majority that moved past ours, and
        epochs never go back.  Raises :class:`NotLeaderError` off the leader.
        """
        self._advance_clock(now_ms)
        if self._role is not Role.LEADER:
            raise NotLeaderError(self._live_leader_id(), self.epoch)
        if self._high_watermark <= self._epoch_start_offset:
            return None
        self._complete_parked_fetches()
        return ReadBarrier(self.epoch, self._high_watermark, self._fetch_seq)

    def read_confirmed(self, barrier: ReadBarrier) -> bool:
        """Whether a majority of voters (this leader counts) has fetched
        since ``barrier`` began, in the same epoch, with this node still
        leading it.  Raises :class:`NotLeaderError` if leadership was lost."""
        if self._role is not Role.LEADER or self.epoch != barrier.epoch:
            raise NotLeaderError(self._live_leader_id(), self.epoch)
        fresh = 1 + sum(
            1
            for p in self._progress.values()
            if p.is_voter and p.last_fetch_seq > barrier.fetch_seq
        )
        return fresh >= self.voters.majority()

    def resign(
        self, preferred_successors: Sequence[NodeId] = (), now_ms: int | None = None
    ) -> bool:
        """Give up leadership gracefully (KIP-595 EndQuorumEpoch).

        Voters named in ``preferred_successors`` come first in the successor
        order, then the rest by log end offset; the first starts its election
        at once.  Returns False if this node is not the leader.
        """
        if now_ms is not None:
            self._advance_clock(now_ms)
        if self._role is not Role.LEADER:
            return False
        self._become_resigned(preferred_successors)
        return True

    def snapshot_created(self, snapshot_id: SnapshotId) -> None:
        """The state machine stored a snapshot covering ``snapshot_id``.

        The snapshot must cover only applied (hence committed) batches and end
        at a batch boundary with the log's epoch there.  The core then drops
        the log prefix it covers (KIP-630).
        """
        if snapshot_id.end_offset > self._applied:
            raise ValueError(
                f"snapshot {snapshot_id} covers offsets beyond the applied offset {self._applied}"
            )
        if snapshot_id.end_offset <= self._log.start_offset:
            return
        try:
            self._log.compact_to(snapshot_id)
        except LogError as exc:
            raise ValueError(f"cannot compact the log to {snapshot_id}: {exc}") from exc
        self._pending_compact = snapshot_id

    # ------------------------------------------------------------------
    # the Ready contract

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        return bool(
            self._msgs
            or self._state_dirty
            or self._pending_chunks
            or self._pending_reset
            or self._pending_truncate is not None
            or self._unstable_from < self._log.end_offset
            or self._pending_compact
            or self._pending_load
            or self._applied_target() > self._applied
            or self._leader_and_epoch() != self._reported_leader
        )

    def ready(self) -> Ready | None:
        """The next batch of work for the driver, or None (see quorum.ready)."""
        if not self.has_ready():
            return None
        entries = self._log.between(self._unstable_from, self._log.end_offset)
        load = self._pending_load
        applied = self._applied
        if load is None and applied < self._log.start_offset:
            # Our applied state is older than the log start: a snapshot was
            # installed; the state machine must load it.
            load = self._log.snapshot
        if load is not None:
            applied = max(applied, load.end_offset)
        committed = _up_to_bytes(
            self._log.between(applied, self._applied_target()), self.config.max_apply_bytes
        )
        if committed:
            applied = committed[-1].end_offset
        leader = self._leader_and_epoch()
        early: list[Message] = []
        late: list[Message] = []
        for msg in self._msgs:
            # Leader replication answers may overlap its own fsync (thesis
            # §10.2.1); everything else waits for the disk (votes, fetch
            # offsets, epoch announcements).
            if self._role is Role.LEADER and isinstance(msg, FetchResponse | FetchSnapshotResponse):
                early.append(msg)
            else:
                late.append(msg)
        # Q5 (deliberate bug, off unless injected): new entries are written
        # but not fsynced before the messages that count them leave (a
        # follower's next fetch offset, the leader's own end at advance()).
        sync_entries = bool(entries) and not bugs.on(Bug.ACK_BEFORE_FSYNC)
        ready = Ready(
            snapshot_chunks=tuple(self._pending_chunks),
            reset_to_snapshot=self._pending_reset,
            truncate_to=self._pending_truncate,
            entries=entries,
            compact_to=self._pending_compact,
            quorum_state=self._state_to_persist() if self._state_dirty else None,
            must_sync=bool(
                sync_entries
                or self._state_dirty
                or self._pending_reset
                or self._pending_truncate is not None
            ),
            messages=tuple(late),
            early_messages=tuple(early),
            load_snapshot=load,
            committed=committed,
            high_watermark=self._high_watermark,
            role=self._role,
            leader_change=leader if leader != self._reported_leader else None,
        )
        if ready.is_empty():  # (must_sync implies a non-empty Ready)
            return None
        self._msgs = []
        self._state_dirty = False
        self._pending_chunks = []
        self._pending_reset = None
        self._pending_truncate = None
        self._pending_compact = None
        self._pending_load = None
        self._applied = applied
        self._unstable_from = self._log.end_offset
        self._handed_end = self._log.end_offset
        self._reported_leader = leader
        self._outstanding = ready
        return ready

    def advance(self, ready: Ready) -> None:
        """The driver has carried out ``ready``: what it persisted is durable."""
        if ready is not self._outstanding:
            raise ValueError("advance() must be given the Ready returned by the last ready()")
        self._outstanding = None
        if self._handed_end is not None:
            self._stable_end = min(self._handed_end, self._log.end_offset)
            self._handed_end = None
        if self._role is Role.LEADER:
            # The leader's own log end counts toward the high watermark only
            # once it is durable.
            self._maybe_update_high_watermark()

    def _state_to_persist(self) -> QuorumState:
        """The quorum state the driver writes: ours, vote included (Raft
        Figure 3.1: votedFor is persistent state, durable before the grant
        leaves, so a restarted voter cannot vote twice in one epoch)."""
        state = self._state
        if state.voted_for is not None and bugs.on(Bug.FORGET_VOTE):
            # Q3 (deliberate bug): the vote is kept in memory only; after a
            # restart the voter may grant the same epoch to another node.
            return QuorumState(state.epoch, None, state.leader_id)
        return state

    # ------------------------------------------------------------------
    # helpers

    def _advance_clock(self, now_ms: int) -> None:
        # Time never goes backward for the core, whatever the caller's clock.
        if now_ms > self._now:
            self._now = now_ms

    def _send(self, msg: Message) -> None:
        self._msgs.append(msg)

    def _leader_and_epoch(self) -> LeaderAndEpoch:
        return LeaderAndEpoch(self.leader_id, self.epoch)

    def _applied_target(self) -> int:
        return min(self._high_watermark, self._log.end_offset)

    def _random_election_timeout(self) -> int:
        t = self.config.election_timeout_ms
        return t + self._rng.randrange(t)

    def _exponential_backoff_ms(self, attempt: int) -> int:
        """retry_backoff_ms * 2^attempt, capped at election_backoff_max_ms
        (KIP-595's backoffs after a lost election and by successor place)."""
        return min(
            self.config.election_backoff_max_ms,
            self.config.retry_backoff_ms * (1 << min(attempt, 16)),
        )

    def _fetch_retry_ms(self) -> int:
        return self.config.fetch_max_wait_ms + self.config.request_timeout_ms

    def _set_state(self, state: QuorumState) -> None:
        # Invariant: the epoch never decreases.  (One vote per epoch is the
        # rule of _may_grant_vote; the simulator checks it from outside.)
        if state.epoch < self._state.epoch:
            raise SafetyError(f"epoch would go back from {self._state.epoch} to {state.epoch}")
        if state.epoch > MAX_EPOCH:
            raise SafetyError(f"epoch {state.epoch} is past the largest one ({MAX_EPOCH})")
        if state != self._state:
            self._state = state
            self._state_dirty = True

    def _init_log(self, snapshot: SnapshotId | None, batches: list[Batch]) -> None:
        """Rebuild the log from the stores, repairing what a crash can leave.

        A crash between finishing a downloaded snapshot and clearing the log
        leaves a snapshot next to an older log: keep the log's suffix only if
        the log holds the snapshot's last batch (same end offset and epoch,
        hence by log matching the same prefix); otherwise the snapshot
        replaces the log.
        """
        try:
            if snapshot is None:
                self._log = RaftLog(None, batches)
                return
            self._log = RaftLog(snapshot)
            if not batches:
                return
            if batches[0].base_offset == snapshot.end_offset and batches[0].epoch >= snapshot.epoch:
                self._log.append(batches)
            elif any(
                b.end_offset == snapshot.end_offset and b.epoch == snapshot.epoch for b in batches
            ):
                self._log.append([b for b in batches if b.base_offset >= snapshot.end_offset])
                self._pending_compact = snapshot
            else:
                self._pending_reset = snapshot
        except LogError as exc:
            raise StorageCorruptError(f"the stored log is inconsistent: {exc}") from exc

    # ------------------------------------------------------------------
    # role changes (become_*)

    def _clear_role_state(self) -> None:
        self._fetch_inflight = None
        self._snapshot_fetch = None
        self._leader_resigned = False
        self._granted = set()
        self._rejected = set()
        self._vote_sent_ms = {}
        self._backing_off = False
        self._progress = {}
        self._parked_fetches = {}
        self._successors = ()
        self._end_epoch_unacked = set()

    def _become_unattached_role(self) -> None:
        self._clear_role_state()
        self._role = Role.UNATTACHED
        self._election_deadline = self._now + self._random_election_timeout()
        self._fetch_deadline = self._now
        self._bootstrap_target = None

    def _become_unattached(self, epoch: int, voted_for: NodeId | None = None) -> None:
        """Learned of a newer epoch with no known leader."""
        if voted_for is None and epoch == self.epoch:
            voted_for = self.voted_for
        self._set_state(QuorumState(epoch, voted_for, None))
        self._become_unattached_role()

    def _become_follower_role(self, leader_id: NodeId) -> None:
        self._clear_role_state()
        self._role = Role.FOLLOWER
        self._lost_elections = 0
        self._next_fetch_ms = self._now
        self._fetch_deadline = self._now + self.config.fetch_timeout_ms
        self._maybe_send_fetch()

    def _become_follower(self, epoch: int, leader_id: NodeId) -> None:
        if leader_id == self.node_id:
            raise SafetyError(
                f"node {self.node_id} told it leads epoch {epoch} but it did not win it"
            )
        voted = self.voted_for if epoch == self.epoch else None
        self._set_state(QuorumState(epoch, voted, leader_id))
        self._become_follower_role(leader_id)

    def _become_prospective(self) -> None:
        """KIP-996: ask at the current epoch whether an election could win."""
        if not self.is_voter:
            self._become_unattached_role()
            return
        self._clear_role_state()
        self._role = Role.PROSPECTIVE
        self._election_deadline = self._now + self._random_election_timeout()
        if self.at_last_epoch:
            # The election would open MAX_EPOCH + 1, which no int32 holds:
            # ask no one, and keep waiting for a leader of this epoch (a
            # prospective follows one that announces itself, KIP-996).
            return
        self._granted = {self.node_id}
        self._bcast_vote_requests(pre_vote=True)
        self._maybe_win_election()

    def _become_candidate(self) -> None:
        """Raft §3.4: new epoch, vote for self (durably), ask the voters."""
        self._clear_role_state()
        self._set_state(QuorumState(self.epoch + 1, self.node_id, None))
        self._role = Role.CANDIDATE
        self._election_deadline = self._now + self._random_election_timeout()
        self._granted = {self.node_id}
        self._bcast_vote_requests(pre_vote=False)
        self._maybe_win_election()

    def _become_leader(self) -> None:
        granting = tuple(sorted(self._granted))
        self._clear_role_state()
        self._role = Role.LEADER
        self._set_state(QuorumState(self.epoch, self.node_id, self.node_id))
        self._leader_since_ms = self._now
        self._lost_elections = 0
        for node in self.voters.sorted():
            if node != self.node_id:
                self._progress[node] = _Progress(node, True)
        # KIP-595: open the epoch with a LeaderChange record.  Until it
        # commits, the high watermark cannot move (Raft thesis §3.6.2: a
        # leader commits entries of earlier terms only by committing one of
        # its own term; this is the Figure 8 rule).
        self._epoch_start_offset = self._log.end_offset
        record = LeaderChange(self.node_id, tuple(self.voters.sorted()), granting)
        self._append_as_leader(
            Batch(self._log.end_offset, self.epoch, (record.encode(),), BatchKind.LEADER_CHANGE)
        )
        self._bcast_begin_quorum_epoch()

    def _become_resigned(self, preferred: Sequence[NodeId] = ()) -> None:
        """Stop leading this epoch and ask the voters to elect a successor
        (KIP-595 EndQuorumEpoch): the preferred ones first, then the rest by
        log end offset as last fetched, the most caught up first."""
        known = {p.node_id: p.end_offset for p in self._progress.values() if p.is_voter}
        others = [v for v in self.voters.sorted() if v != self.node_id]
        order = list(dict.fromkeys(n for n in preferred if n in self.voters and n != self.node_id))
        order += sorted((v for v in others if v not in order), key=lambda v: (-known.get(v, 0), v))
        parked = [req for _, (req, _deadline) in sorted(self._parked_fetches.items())]
        self._clear_role_state()
        self._role = Role.RESIGNED
        for req in parked:
            self._send(self._fetch_error(req, ErrorCode.NOT_LEADER))
        self._election_deadline = self._now + self._random_election_timeout()
        self._successors = tuple(order)
        self._end_epoch_unacked = set(order)
        self._send_end_quorum_epoch()

    def _send_end_quorum_epoch(self) -> None:
        for node in self._successors:
            if node in self._end_epoch_unacked:
                self._send(
                    EndQuorumEpochRequest(
                        self.node_id, node, self.epoch, self.node_id, self._successors
                    )
                )
        self._end_epoch_resend_ms = self._now + self.config.request_timeout_ms

    def _tick_resigned(self) -> None:
        if self._now >= self._election_deadline:
            self._become_prospective()
        elif self._end_epoch_unacked and self._now >= self._end_epoch_resend_ms:
            self._send_end_quorum_epoch()

    # ------------------------------------------------------------------
    # elections

    def _bcast_vote_requests(self, pre_vote: bool) -> None:
        for node in self.voters.sorted():
            if node != self.node_id:
                self._send_vote_request(node, pre_vote)

    def _send_vote_request(self, node: NodeId, pre_vote: bool) -> None:
        self._vote_sent_ms[node] = self._now
        self._send(
            VoteRequest(
                self.node_id,
                node,
                self.epoch,
                self._log.last_epoch,
                self._log.end_offset,
                pre_vote,
            )
        )

    def _maybe_win_election(self) -> bool:
        result = vote_result(self.voters.voters, self._granted, self._rejected)
        if result is VoteResult.WON:
            if self._role is Role.PROSPECTIVE:
                if self.at_last_epoch:
                    # Granted pre-votes it never asked for (it asks none at
                    # the last epoch): there is no epoch to campaign in.
                    return False
                self._become_candidate()
            else:
                self._become_leader()
            return True
        if result is VoteResult.LOST and not self._backing_off:
            # Lost: back off (binary exponential with jitter, KIP-595) before
            # the next pre-vote so that competing candidates spread out.
            self._lost_elections += 1
            self._backing_off = True
            cap = self._exponential_backoff_ms(self._lost_elections)
            self._election_deadline = self._now + 1 + self._rng.randrange(max(cap, 1))
            self._vote_sent_ms = {}
        return False

    def _log_is_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        """Raft §3.6.1, as KIP-595 phrases it: the candidate's (last epoch,
        end offset) is at least ours."""
        return OffsetAndEpoch(last_epoch, end_offset) >= self._log.last_offset_and_epoch()

    def _step_vote_request(self, req: VoteRequest) -> None:
        if req.pre_vote:
            self._step_pre_vote_request(req)
            return
        if req.epoch < self.epoch:
            self._send(self._vote_response(req, False, ErrorCode.FENCED_LEADER_EPOCH))
            return
        if not self.is_voter or req.src not in self.voters:
            self._send(self._vote_response(req, False, ErrorCode.INCONSISTENT_VOTER_SET))
            return
        if req.epoch > self.epoch:
            self._become_unattached(req.epoch)
        granted = self._may_grant_vote(req)
        if granted:
            # The vote goes into the quorum state, which the Ready contract
            # makes durable before the response below is sent (Raft §3.8).
            self._set_state(QuorumState(self.epoch, req.src, None))
            if self._role is not Role.UNATTACHED:
                self._become_unattached_role()
            else:
                self._election_deadline = self._now + self._random_election_timeout()
        self._send(self._vote_response(req, granted))

    def _may_grant_vote(self, req: VoteRequest) -> bool:
        """One vote per epoch (Raft §3.4), only for an up-to-date log
        (§3.6.1).  The deliberate bug Q2 breaks the first rule, to show
        the simulator notices."""
        if self._role in (Role.LEADER, Role.FOLLOWER, Role.RESIGNED, Role.CANDIDATE):
            return False
        if self.leader_id is not None:
            return False  # the epoch already has a leader (we may have timed out on it)
        if (
            self.voted_for is not None
            and self.voted_for != req.src
            # Q2 (deliberate bug): a second vote in an epoch already voted in.
            and not bugs.on(Bug.DOUBLE_VOTE)
        ):
            return False
        return self._log_is_up_to_date(req.last_epoch, req.end_offset)

    def _step_pre_vote_request(self, req: VoteRequest) -> None:
        """KIP-996: nothing changes here; the answer only says whether a real
        vote could be granted and whether we still hear from a leader."""
        if req.epoch < self.epoch:
            self._send(self._vote_response(req, False, ErrorCode.FENCED_LEADER_EPOCH))
            return
        if not self.is_voter or req.src not in self.voters:
            self._send(self._vote_response(req, False, ErrorCode.INCONSISTENT_VOTER_SET))
            return
        live_leader = self._role is Role.LEADER or (
            self._role is Role.FOLLOWER and not self._leader_resigned
        )
        granted = not live_leader and self._log_is_up_to_date(req.last_epoch, req.end_offset)
        self._send(self._vote_response(req, granted))

    def _vote_response(
        self, req: VoteRequest, granted: bool, error: ErrorCode = ErrorCode.NONE
    ) -> VoteResponse:
        return VoteResponse(
            self.node_id,
            req.src,
            self.epoch,
            self._live_leader_id(),
            granted,
            req.pre_vote,
            error,
        )

    def _live_leader_id(self) -> NodeId | None:
        """The leader we still hear from, if any.  A resigned leader, or one
        whose followers were told it resigned, is not named: a prospective
        told of it would go back to following a leader that is gone."""
        if self._role is Role.LEADER:
            return self.node_id
        if self._role is Role.FOLLOWER and not self._leader_resigned:
            return self.leader_id
        return None

    def _step_vote_response(self, resp: VoteResponse) -> None:
        if self._maybe_follow_newer_epoch(resp.epoch, resp.leader_id):
            return
        if (
            resp.epoch == self.epoch
            and resp.leader_id is not None
            and resp.leader_id != self.node_id
            and resp.leader_id != self.leader_id
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE, Role.CANDIDATE)
        ):
            # Someone leads our epoch and we did not know: follow it.  A
            # leader we already knew is one we timed out on; a voter that
            # still names it has merely not timed out yet.  Going back to it
            # would let staggered timeouts keep every voter from campaigning
            # at once after the leader dies.  If it is in fact alive, its
            # BeginQuorumEpoch re-sends bring us back.
            self._become_follower(self.epoch, resp.leader_id)
            return
        expected = Role.PROSPECTIVE if resp.pre_vote else Role.CANDIDATE
        if self._role is not expected or resp.epoch != self.epoch:
            return
        self._vote_sent_ms.pop(resp.src, None)
        if resp.granted:
            self._granted.add(resp.src)
        else:
            self._rejected.add(resp.src)
        self._maybe_win_election()

    def _tick_election(self) -> None:
        if self._now >= self._election_deadline:
            # A candidate that neither won nor lost in time, or finished its
            # backoff, goes back to asking first (KIP-996).
            self._become_prospective()
            return
        if self._backing_off:
            return
        pre_vote = self._role is Role.PROSPECTIVE
        for node, sent in sorted(self._vote_sent_ms.items()):
            if self._now >= sent + self.config.request_timeout_ms:
                self._send_vote_request(node, pre_vote)

    # ------------------------------------------------------------------
    # epochs and leaders

    def _maybe_follow_newer_epoch(self, epoch: int, leader_id: NodeId | None) -> bool:
        """Any message from a newer epoch moves us to it (Raft §3.3)."""
        if epoch > self.epoch:
            if leader_id is not None and leader_id != self.node_id:
                self._become_follower(epoch, leader_id)
            else:
                self._become_unattached(epoch)
            return True
        return False

    def _refuse(self, msg: Message, error: ErrorCode) -> None:
        """Answer a request we will not act on with ``error``; drop a
        response (there is no one to tell)."""
        live = self._live_leader_id()
        match msg:
            case VoteRequest():
                self._send(self._vote_response(msg, False, error))
            case BeginQuorumEpochRequest():
                self._send(BeginQuorumEpochResponse(self.node_id, msg.src, self.epoch, live, error))
            case EndQuorumEpochRequest():
                self._send(EndQuorumEpochResponse(self.node_id, msg.src, self.epoch, live, error))
            case FetchRequest():
                self._send(self._fetch_error(msg, error))
            case FetchSnapshotRequest():
                self._send(
                    FetchSnapshotResponse(
                        self.node_id,
                        msg.src,
                        self.epoch,
                        live,
                        error,
                        msg.snapshot_id,
                        msg.position,
                        0,
                        b"",
                        msg.request_id,
                    )
                )

    def _step_begin_quorum_epoch_request(self, req: BeginQuorumEpochRequest) -> None:
        if req.epoch < self.epoch:
            self._refuse(req, ErrorCode.FENCED_LEADER_EPOCH)
            return
        if req.epoch > self.epoch or self.leader_id is None:
            self._become_follower(req.epoch, req.leader_id)
        elif self.leader_id != req.leader_id:
            raise SafetyError(
                f"two leaders in epoch {req.epoch}: {self.leader_id} and {req.leader_id}"
            )
        elif self._role is Role.FOLLOWER:
            if not self._leader_resigned:  # a stale copy must not revive it
                self._fetch_deadline = self._now + self.config.fetch_timeout_ms
        else:
            # KIP-996: a prospective that hears from its leader follows again.
            self._become_follower_role(req.leader_id)
        self._send(
            BeginQuorumEpochResponse(self.node_id, req.src, self.epoch, self._live_leader_id())
        )

    def _bcast_begin_quorum_epoch(self) -> None:
        """Announce the epoch to every voter that has not fetched from us
        within a fetch timeout (at the start of the epoch: to all of them).
        KIP-595 re-sends it every half fetch timeout, so a voter that missed
        it, or came back from a partition, still learns who leads."""
        for node, progress in sorted(self._progress.items()):
            recent = progress.last_fetch_ms is not None and (
                self._now - progress.last_fetch_ms < self.config.fetch_timeout_ms
            )
            if progress.is_voter and not recent:
                self._send(BeginQuorumEpochRequest(self.node_id, node, self.epoch, self.node_id))
        self._begin_epoch_deadline = self._now + max(1, self.config.fetch_timeout_ms // 2)

    def _step_end_quorum_epoch_request(self, req: EndQuorumEpochRequest) -> None:
        if req.epoch < self.epoch:
            self._refuse(req, ErrorCode.FENCED_LEADER_EPOCH)
            return
        if req.epoch > self.epoch:
            self._become_unattached(req.epoch)
        self._send(
            EndQuorumEpochResponse(self.node_id, req.src, self.epoch, self._live_leader_id())
        )
        if not self.is_voter or (self.leader_id is not None and req.leader_id != self.leader_id):
            return
        # KIP-595: voters earlier in the successor list start sooner, with a
        # strictly exponential backoff by position, so the most caught-up
        # voter usually wins.  The leader counts as gone for pre-votes.
        if self.node_id in req.preferred_successors:
            pos = req.preferred_successors.index(self.node_id)
            delay = 0 if pos == 0 else self._exponential_backoff_ms(pos)
        else:
            delay = self._random_election_timeout()
        if self._role is Role.FOLLOWER:
            self._leader_resigned = True
            self._fetch_deadline = self._now + delay
        elif self._role is Role.UNATTACHED:
            self._election_deadline = self._now + delay
        if delay == 0:
            self.tick(self._now)

    # ------------------------------------------------------------------
    # replication: the leader side

    def _append_as_leader(self, batch: Batch) -> None:
        self._log.append([batch])
        self._complete_parked_fetches()

    def _validate_fetch(self, req: FetchRequest) -> FetchResponse | None:
        """Kafka's validateOffsetAndEpoch: None if the fetcher's log matches
        ours at ``fetch_offset``; otherwise a response naming the divergence
        or the snapshot to fetch."""
        log = self._log
        snapshot = log.snapshot
        if snapshot is not None and (
            req.fetch_offset < log.start_offset
            or (req.fetch_offset == log.start_offset and req.last_fetched_epoch != snapshot.epoch)
        ):
            return self._fetch_response(req, snapshot_id=snapshot)
        if req.fetch_offset == 0 and req.last_fetched_epoch == 0:
            return None
        end = log.end_offset_for_epoch(req.last_fetched_epoch)
        if end.epoch != req.last_fetched_epoch or end.offset < req.fetch_offset:
            if (
                snapshot is not None
                and end.offset <= log.start_offset
                and (end.epoch != snapshot.epoch)
            ):
                # The divergence lies in the prefix we compacted: we cannot
                # name it, but our snapshot replaces it (KIP-630).
                return self._fetch_response(req, snapshot_id=snapshot)
            return self._fetch_response(req, diverging=end)
        return None

    def _fetch_response(
        self,
        req: FetchRequest,
        *,
        batches: tuple[Batch, ...] = (),
        diverging: OffsetAndEpoch | None = None,
        snapshot_id: SnapshotId | None = None,
    ) -> FetchResponse:
        progress = self._progress.get(req.src)
        if progress is not None:
            progress.hw_sent = self._high_watermark
        return FetchResponse(
            self.node_id,
            req.src,
            self.epoch,
            self._live_leader_id(),
            ErrorCode.NONE,
            req.fetch_offset,
            self._high_watermark,
            batches,
            diverging,
            snapshot_id,
            self._log.start_offset,
            req.request_id,
        )

    def _fetch_error(self, req: FetchRequest, error: ErrorCode) -> FetchResponse:
        return FetchResponse(
            self.node_id,
            req.src,
            self.epoch,
            self._live_leader_id(),
            error,
            req.fetch_offset,
            self._high_watermark,
            (),
            None,
            None,
            self._log.start_offset,
            req.request_id,
        )

    def _step_fetch_request(self, req: FetchRequest) -> None:
        if req.fetch_offset < 0 or req.last_fetched_epoch < 0 or req.max_bytes <= 0:
            self._send(self._fetch_error(req, ErrorCode.INVALID_REQUEST))
            return
        if req.epoch > self.epoch:
            self._send(self._fetch_error(req, ErrorCode.UNKNOWN_LEADER_EPOCH))
            return
        if self._role is not Role.LEADER:
            self._send(self._fetch_error(req, ErrorCode.NOT_LEADER))
            return
        if req.epoch < self.epoch:
            # Tell a fetcher of an old epoch who leads now.
            self._send(self._fetch_error(req, ErrorCode.FENCED_LEADER_EPOCH))
            return
        progress = self._progress.get(req.src)
        if progress is None:
            progress = self._progress[req.src] = _Progress(req.src, req.src in self.voters)
        progress.last_fetch_ms = self._now
        self._fetch_seq += 1
        progress.last_fetch_seq = self._fetch_seq
        self._parked_fetches.pop(req.src, None)
        problem = self._validate_fetch(req)
        if problem is not None:
            self._send(problem)
            return
        if req.fetch_offset >= self._log.end_offset:
            progress.last_caught_up_ms = self._now
        if progress.end_offset != req.fetch_offset:
            # May go backward (the fetcher truncated); that only makes the
            # high watermark computation more conservative.
            progress.end_offset = req.fetch_offset
            if progress.is_voter:
                self._maybe_update_high_watermark()
        batches = self._log.read(req.fetch_offset, min(req.max_bytes, self.config.fetch_max_bytes))
        if batches or req.max_wait_ms <= 0 or progress.hw_sent != self._high_watermark:
            self._send(self._fetch_response(req, batches=batches))
        else:
            # Long poll: answer when there is new data, a new high
            # watermark, or the wait is over.  (A fetch that itself moved the
            # high watermark is answered at once, above: the fetcher has not
            # seen the new one.)
            wait = min(req.max_wait_ms, self.config.fetch_max_wait_ms)
            self._parked_fetches[req.src] = (req, self._now + wait)

    def _complete_parked_fetches(self, only_due: bool = False) -> None:
        for src, (req, deadline) in sorted(self._parked_fetches.items()):
            if only_due and self._now < deadline:
                continue
            del self._parked_fetches[src]
            batches = self._log.read(
                req.fetch_offset, min(req.max_bytes, self.config.fetch_max_bytes)
            )
            self._send(self._fetch_response(req, batches=batches))

    def _maybe_update_high_watermark(self) -> bool:
        """Kafka's LeaderState.maybeUpdateHighWatermark.

        The new high watermark is the offset a majority of voters has
        durably reached (the leader counts its durable log end).  It moves
        only forward, and only past the start of the leader's own epoch.
        Returns True if it moved.
        """
        if bugs.on(Bug.COMMIT_WITHOUT_MAJORITY):
            # Q1 (deliberate bug): the leader's own durable end, no majority.
            candidate = self._stable_end
        else:
            acked = {n: p.end_offset for n, p in self._progress.items() if p.is_voter}
            acked[self.node_id] = self._stable_end
            candidate = committed_offset(self.voters.voters, acked)
        if candidate > self._epoch_start_offset and candidate > self._high_watermark:
            self._high_watermark = candidate
            self._complete_parked_fetches()
            return True
        return False

    def _tick_leader(self) -> None:
        self._complete_parked_fetches(only_due=True)
        if self._maybe_resign_without_quorum():
            return
        if self._now >= self._begin_epoch_deadline:
            self._bcast_begin_quorum_epoch()

    def _maybe_resign_without_quorum(self) -> bool:
        """Check-quorum (KAFKA-15489): a leader that a majority of voters has
        not fetched from within 1.5 fetch timeouts steps down, so a leader cut
        off from the quorum stops serving as if it still led."""
        deadline = self._check_quorum_deadline()
        if deadline is None or self._now < deadline:
            return False
        self._become_resigned()
        return True

    def _step_fetch_snapshot_request(self, req: FetchSnapshotRequest) -> None:
        def reply(
            error: ErrorCode, position: int = req.position, size: int = 0, data: bytes = b""
        ) -> None:
            self._send(
                FetchSnapshotResponse(
                    self.node_id,
                    req.src,
                    self.epoch,
                    self._live_leader_id(),
                    error,
                    req.snapshot_id,
                    position,
                    size,
                    data,
                    req.request_id,
                )
            )

        if req.max_bytes <= 0:
            reply(ErrorCode.INVALID_REQUEST)
            return
        if req.epoch > self.epoch:
            reply(ErrorCode.UNKNOWN_LEADER_EPOCH)
            return
        if self._role is not Role.LEADER:
            reply(ErrorCode.NOT_LEADER)
            return
        if req.epoch < self.epoch:
            reply(ErrorCode.FENCED_LEADER_EPOCH)
            return
        progress = self._progress.get(req.src)
        if progress is None:
            progress = self._progress[req.src] = _Progress(req.src, req.src in self.voters)
        progress.last_fetch_ms = self._now
        size = self._snapshots.size(req.snapshot_id)
        if size is None:
            reply(ErrorCode.SNAPSHOT_NOT_FOUND)
            return
        if req.position < 0 or req.position > size:
            reply(ErrorCode.POSITION_OUT_OF_RANGE, size=size)
            return
        chunk = self._snapshots.read(
            req.snapshot_id, req.position, min(req.max_bytes, self.config.snapshot_chunk_bytes)
        )
        reply(ErrorCode.NONE, req.position, size, chunk)

    # ------------------------------------------------------------------
    # replication: the follower (and observer) side

    def _fetch_target(self) -> NodeId | None:
        if self._role is Role.FOLLOWER:
            return self.leader_id
        if self._role is Role.UNATTACHED and not self.is_voter:
            return self._bootstrap_target
        return None

    def _maybe_send_fetch(self) -> bool:
        target = self._fetch_target()
        if target is None or self._fetch_inflight is not None or self._now < self._next_fetch_ms:
            return False
        if self._snapshot_fetch is not None:
            snapshot_id, position = self._snapshot_fetch
            self._request_seq += 1
            self._send(
                FetchSnapshotRequest(
                    self.node_id,
                    target,
                    self.epoch,
                    snapshot_id,
                    position,
                    self.config.snapshot_chunk_bytes,
                    self._request_seq,
                )
            )
            self._fetch_inflight = (target, self._request_seq, self._now)
            return True
        self._request_seq += 1
        self._send(
            FetchRequest(
                self.node_id,
                target,
                self.epoch,
                self._log.end_offset,
                self._log.last_epoch,
                self.config.fetch_max_wait_ms,
                self.config.fetch_max_bytes,
                self._request_seq,
            )
        )
        self._fetch_inflight = (target, self._request_seq, self._now)
        return True

    def _tick_follower(self) -> None:
        if self._now >= self._fetch_deadline:
            if self.is_voter:
                # KIP-996: a prospective remembers the leader it timed out on.
                self._become_prospective()
            else:
                self._become_unattached(self.epoch)
                self._tick_unattached()
            return
        if self._fetch_inflight is not None and (
            self._now >= self._fetch_inflight[2] + self._fetch_retry_ms()
        ):
            self._fetch_inflight = None
        self._maybe_send_fetch()

    def _tick_unattached(self) -> None:
        if self.is_voter:
            if self._now >= self._election_deadline:
                self._become_prospective()
            return
        # An observer looks for the leader by asking voters in turn.
        if self._now >= self._fetch_deadline:
            others = [v for v in self.voters.sorted() if v != self._bootstrap_target]
            self._bootstrap_target = self._rng.choice(others or self.voters.sorted())
            self._fetch_inflight = None
            self._fetch_deadline = self._now + self.config.request_timeout_ms
            self._maybe_send_fetch()

    def _step_fetch_response(self, resp: FetchResponse) -> None:
        if self._maybe_follow_newer_epoch(resp.epoch, resp.leader_id):
            return
        inflight = self._fetch_inflight
        if inflight is None or inflight[:2] != (resp.src, resp.request_id):
            return  # stale, duplicated or answered after a retry
        self._fetch_inflight = None
        if self._role is Role.UNATTACHED and not self.is_voter:
            # An observer's bootstrap fetch: learn who leads.
            if (
                resp.leader_id is not None
                and resp.leader_id != self.node_id
                and resp.epoch >= self.epoch
            ):
                self._become_follower(resp.epoch, resp.leader_id)
            return
        if self._role is not Role.FOLLOWER:
            return
        if (
            resp.epoch != self.epoch
            or resp.src != self.leader_id
            or resp.error is not ErrorCode.NONE
        ):
            if resp.error is ErrorCode.NOT_LEADER and resp.src == self.leader_id:
                # Our leader says it no longer leads our epoch (it resigned,
                # or restarted and came back resigned): it is gone for
                # pre-votes, and we campaign within an election timeout
                # unless EndQuorumEpoch already set an earlier start by our
                # place among the preferred successors.
                self._leader_resigned = True
                self._fetch_deadline = min(
                    self._fetch_deadline, self._now + self._random_election_timeout()
                )
            self._next_fetch_ms = self._now + self.config.retry_backoff_ms
            self._maybe_send_fetch()
            return
        if not self._leader_resigned:
            self._fetch_deadline = self._now + self.config.fetch_timeout_ms
        if resp.snapshot_id is not None:
            self._snapshot_fetch = (resp.snapshot_id, 0)
        elif resp.diverging is not None:
            # Our log past the divergence may still differ from the leader's,
            # so its high watermark says nothing about our entries yet.
            self._truncate_diverging(resp.diverging)
        else:
            # The leader validated our log up to fetch_offset, and what we
            # append continues it: our whole log now matches the leader's, so
            # its high watermark applies to it.
            self._maybe_append_as_follower(resp.batches)
            self._update_follower_high_watermark(resp.high_watermark)
        self._maybe_send_fetch()

    def _truncate_diverging(self, diverging: OffsetAndEpoch) -> None:
        """KIP-595 divergence: truncate to where our log can still match the
        leader's (Kafka's truncateToEndOffset), never below what is known
        committed."""
        local = self._log.end_offset_for_epoch(diverging.epoch)
        if local.epoch == diverging.epoch:
            offset = min(local.offset, diverging.offset)
        else:
            offset = local.offset
        if offset < self._high_watermark:
            raise SafetyError(
                f"node {self.node_id} asked to truncate to {offset}, below its high "
                f"watermark {self._high_watermark}"
            )
        self._truncate(offset)

    def _truncate(self, offset: int) -> None:
        new_end = self._log.truncate_to(offset)
        self._stable_end = min(self._stable_end, new_end)
        if self._handed_end is not None:
            self._handed_end = min(self._handed_end, new_end)
        if new_end < self._unstable_from:
            self._unstable_from = new_end
            self._pending_truncate = (
                new_end if self._pending_truncate is None else min(self._pending_truncate, new_end)
            )

    def _maybe_append_as_follower(self, batches: Iterable[Batch]) -> bool:
        """Append the batches that continue our log; False if they do not."""
        fresh = [b for b in batches if b.base_offset >= self._log.end_offset]
        if not fresh or fresh[0].base_offset != self._log.end_offset:
            return False  # not contiguous with our log: a stale response
        self._log.append(fresh)
        return True

    def _update_follower_high_watermark(self, leader_hw: int) -> None:
        # The leader's high watermark may be above our log end (we lag) or
        # below our previous one (a new leader that has not yet committed in
        # its epoch): keep ours monotonic and within our log.
        new_hw = min(leader_hw, self._log.end_offset)
        if new_hw > self._high_watermark:
            self._high_watermark = new_hw

    def _step_fetch_snapshot_response(self, resp: FetchSnapshotResponse) -> None:
        if self._maybe_follow_newer_epoch(resp.epoch, resp.leader_id):
            return
        inflight = self._fetch_inflight
        if (
            inflight is None
            or self._snapshot_fetch is None
            or inflight[:2] != (resp.src, resp.request_id)
            or self._snapshot_fetch != (resp.snapshot_id, resp.position)
        ):
            return
        self._fetch_inflight = None
        if self._role is not Role.FOLLOWER:
            return
        if resp.epoch != self.epoch or resp.error is not ErrorCode.NONE:
            # The snapshot is gone or changed, or the leader is: start over
            # with a fetch after a backoff.
            self._snapshot_fetch = None
            self._next_fetch_ms = self._now + self.config.retry_backoff_ms
            self._maybe_send_fetch()
            return
        if not self._leader_resigned:
            self._fetch_deadline = self._now + self.config.fetch_timeout_ms
        end = resp.position + len(resp.data)
        done = end >= resp.size
        if not done and not resp.data:
            self._snapshot_fetch = None  # no progress possible: refetch
        else:
            self._pending_chunks.append(
                SnapshotChunk(resp.snapshot_id, resp.position, resp.data, done)
            )
            if done:
                self._install_snapshot(resp.snapshot_id)
            else:
                self._snapshot_fetch = (resp.snapshot_id, end)
        self._maybe_send_fetch()

    def _install_snapshot(self, snapshot_id: SnapshotId) -> None:
        """A downloaded snapshot replaces the whole log (KIP-630).  Snapshots
        cover only committed offsets, so the high watermark may move up to
        its end."""
        self._snapshot_fetch = None
        self._log.reset_to(snapshot_id)
        self._pending_reset = snapshot_id
        self._pending_truncate = None
        self._stable_end = snapshot_id.end_offset
        self._unstable_from = snapshot_id.end_offset
        self._handed_end = None
        if snapshot_id.end_offset > self._high_watermark:
            self._high_watermark = snapshot_id.end_offset
        self._pending_load = snapshot_id


def _up_to_bytes(batches: tuple[Batch, ...], limit: int) -> tuple[Batch, ...]:
    """The leading batches within ``limit`` bytes (at least one)."""
    size = 0
    for i, batch in enumerate(batches):
        size += batch.size_bytes
        if size > limit and i > 0:
            return batches[:i]
    return batches

"""The replica state machine of one partition on one broker (Kafka's
``Partition`` for the leader side, the partition's part of
``ReplicaFetcherThread`` for the follower side).

Inputs: registrations from the metadata image (:meth:`PartitionReplica.become_leader`,
:meth:`~PartitionReplica.become_follower`), a follower's fetch
(:meth:`~PartitionReplica.step_fetch`), a producer's batch
(:meth:`~PartitionReplica.append_as_leader`), the answer to our fetch
(:meth:`~PartitionReplica.step_fetch_answer`), the controller's answer to an
AlterPartition, and time (:meth:`~PartitionReplica.tick_isr`, ``now_ms``
arguments). Outputs are frozen dataclasses (:mod:`broker.replica.types`):
the answer to send, the AlterPartition to send, the truncation done. The
decisions are the pure functions of :mod:`broker.replica.leader` and
:mod:`broker.replica.follower`; this class holds the state and applies them
to the log. No clock, I/O or threads (``tests/broker/test_purity.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import bugs
from broker.errors import Errors, ReplicaError, from_partition_log_error
from broker.replica.follower import (
    divergence_truncation,
    follower_high_watermark,
    follower_log_start,
    is_current_fetch,
    out_of_range,
)
from broker.replica.leader import (
    AlterPartitionErrorAction,
    ChangeKind,
    IsrState,
    PendingChange,
    RemoteReplica,
    acks_check,
    alter_partition_error_action,
    check_current_leader_epoch,
    effective_min_isr,
    fetch_divergence,
    high_watermark_candidate,
    is_follower_in_sync,
    is_replica_isr_eligible,
    low_watermark,
    out_of_sync_replicas,
    reset_replica,
    update_fetch_state,
)
from broker.replica.seam import BrokerView, ReplicaLog
from broker.replica.types import (
    NO_EPOCH,
    UNKNOWN_OFFSET,
    AcksCheck,
    AlterPartitionRequest,
    AlterPartitionResult,
    BrokerState,
    DeleteRecordsCheck,
    DeleteRecordsResult,
    FetchAnswer,
    FetchRequest,
    FollowerOutcome,
    FollowerStep,
    LeaderFetchOutcome,
    ReplicaConfig,
    Restart,
    Role,
    Truncation,
)
from bugs import Bug
from metadata.image import PartitionRegistration
from metadata.records import NO_LEADER, LeaderRecoveryState
from partition_log.batch import BatchHeader
from partition_log.errors import Errors as LogErrors
from partition_log.errors import PartitionLogError
from partition_log.log import AppendInfo, AppendOrigin
from partition_log.log_config import CleanupPolicy

__all__ = ["LeaderAppend", "PartitionReplica"]

# ProduceRequest acks: none, the leader, the whole ISR.
_ACKS = (0, 1, -1)


@dataclass(frozen=True, slots=True)
class LeaderAppend:
    """A batch appended as leader: its offsets, the leader epoch it was
    written in (the acks=all check names it), and whether the HW moved."""

    info: AppendInfo
    leader_epoch: int
    high_watermark_moved: bool


class PartitionReplica:
    """One partition's replica on broker ``broker_id``, over its ``log``."""

    def __init__(
        self,
        broker_id: int,
        log: ReplicaLog,
        config: ReplicaConfig,
        brokers: BrokerView,
    ) -> None:
        self.broker_id = broker_id
        self.log = log
        self.config = config
        self.brokers = brokers
        self.role = Role.NONE
        self.leader_id = NO_LEADER
        self.leader_epoch = NO_EPOCH
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        # The eligible leader replicas of the registration (KIP-966).
        self.elr: tuple[int, ...] = ()
        self.isr_state = IsrState(())
        # Leader side: what we know of each follower, and our LEO when this
        # epoch began (Partition.leaderEpochStartOffsetOpt).
        self.remotes: dict[int, RemoteReplica] = {}
        self.leader_epoch_start_offset: int | None = None
        # Follower side: fenced by the leader until newer metadata
        # (onPartitionFenced).
        self.fenced = False
        # Only with B2 (truncation by offset): truncated once to a leader's
        # end offset, the follower fetches without a last fetched epoch
        # until it follows another leader, as before KIP-279.
        self.by_offset = False

    # -- state ------------------------------------------------------------------

    @property
    def isr(self) -> tuple[int, ...]:
        return self.isr_state.isr

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        return self.isr_state.maximal_isr

    @property
    def min_isr(self) -> int:
        if bugs.on(Bug.IGNORE_MIN_ISR):
            return 1  # R10: min.insync.replicas ignored, a leader alone suffices
        return effective_min_isr(self.config.min_insync_replicas, max(len(self.replicas), 1))

    @property
    def is_under_min_isr(self) -> bool:
        """The committed ISR is below min ISR (``Partition.isUnderMinIsr``)."""
        return len(self.isr_state.isr) < self.min_isr

    def _is_stale(self, registration: PartitionRegistration, role: Role) -> bool:
        """An image older than what we hold (``makeLeader``/``makeFollower``
        skip a partition epoch below theirs), or the same one again."""
        if registration.leader_epoch < self.leader_epoch:
            return True
        if registration.partition_epoch < self.partition_epoch:
            return True
        return (
            registration.partition_epoch == self.partition_epoch
            and registration.leader_epoch == self.leader_epoch
            and self.role is role
        )

    def _check_replica(self, registration: PartitionRegistration) -> None:
        """A broker that is no replica of the partition stops its replica
        instead (the broker's job); it neither leads nor follows."""
        if self.broker_id not in registration.replicas:
            raise ValueError(
                f"broker {self.broker_id} is not a replica of this partition "
                f"(replicas {list(registration.replicas)})"
            )

    def _leader_hint(self) -> tuple[int, int]:
        return self.leader_id, self.leader_epoch

    # -- metadata: become leader or follower ---------------------------------------

    def become_leader(self, registration: PartitionRegistration, now_ms: int) -> bool:
        """``Partition.makeLeader``: whether anything changed (False for a
        stale image). At a new leader epoch the epoch is recorded at our LEO
        in the epoch cache before anything is accepted (KIP-279), and a new
        leader forgets its followers' LEOs. A leader elected uncleanly
        (RECOVERING) marks its log RECOVERED and reports it in its next
        AlterPartition (KIP-704). The HW is then re-checked (the ISR may be
        down to us)."""
        if registration.leader != self.broker_id:
            raise ValueError(
                f"broker {self.broker_id} cannot become leader of a partition led by "
                f"{registration.leader}"
            )
        self._check_replica(registration)
        if self._is_stale(registration, Role.LEADER):
            if (registration.leader_epoch, registration.partition_epoch) == (
                self.leader_epoch,
                self.partition_epoch,
            ):
                # The state an AlterPartition answer already committed here:
                # the image adds its ELR, which the answer does not carry
                # (KIP-966) and the low watermark waits for.
                self.elr = registration.elr
            return False
        is_new_leader = self.role is not Role.LEADER
        if registration.leader_epoch > self.leader_epoch or is_new_leader:
            start = self.log.log_end_offset
            if not bugs.on(Bug.NO_EPOCH_START_ENTRY):  # B3: no (epoch, LEO) until an append
                self.log.maybe_assign_epoch_start_offset(registration.leader_epoch)
            remotes: dict[int, RemoteReplica] = {}
            for broker_id in registration.replicas:
                if broker_id == self.broker_id:
                    continue
                remotes[broker_id] = reset_replica(
                    self.remotes.get(broker_id, RemoteReplica(broker_id)),
                    now_ms,
                    is_new_leader=is_new_leader,
                    in_sync=broker_id in registration.isr,
                )
            self.remotes = remotes
            self.leader_epoch_start_offset = start
        else:
            # Same epoch (an ISR or reassignment change): followers keep
            # their state; replicas added get a fresh one.
            self.remotes = {
                b: self.remotes.get(b, RemoteReplica(b))
                for b in registration.replicas
                if b != self.broker_id
            }
        self.role = Role.LEADER
        self.leader_id = self.broker_id
        self.leader_epoch = registration.leader_epoch
        self.partition_epoch = registration.partition_epoch
        self.replicas = registration.replicas
        self.elr = registration.elr
        # Any AlterPartition in flight is superseded by the image (its answer
        # will no longer match the pending state and is ignored).
        self.isr_state = IsrState(tuple(sorted(registration.isr)), LeaderRecoveryState.RECOVERED)
        self.fenced = False
        self.maybe_increment_leader_hw(now_ms)
        return True

    def become_follower(self, registration: PartitionRegistration, now_ms: int) -> bool:
        """``Partition.makeFollower``: follow ``registration.leader`` from our
        LEO. The log is **not** truncated to the HW (KIP-101); divergence is
        found by fetching with our latest epoch. Whether anything changed."""
        del now_ms  # followers keep no timers; kept for a uniform signature
        if registration.leader == self.broker_id:
            raise ValueError(
                f"broker {self.broker_id} leads this partition in the registration; "
                "call become_leader"
            )
        self._check_replica(registration)
        if self._is_stale(registration, Role.FOLLOWER):
            return False
        self.role = Role.FOLLOWER
        self.leader_id = registration.leader
        self.leader_epoch = registration.leader_epoch
        self.partition_epoch = registration.partition_epoch
        self.replicas = registration.replicas
        self.elr = registration.elr
        self.isr_state = IsrState(
            tuple(sorted(registration.isr)), registration.leader_recovery_state
        )
        self.remotes = {}
        self.leader_epoch_start_offset = None
        self.fenced = False
        self.by_offset = False
        if bugs.on(Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER):
            # B1, the rule before KIP-101: "It truncates its log to the high
            # watermark".
            self.log.truncate_to(self.log.high_watermark)
        return True

    # -- leader: the HW, the ISR, AlterPartition --------------------------------

    def _eligible(self, replica: RemoteReplica) -> bool:
        return is_replica_isr_eligible(replica, self.brokers)

    def maybe_increment_leader_hw(self, now_ms: int) -> bool:
        """``Partition.maybeIncrementLeaderHW``: never under min ISR
        (KAFKA-15583); otherwise the minimum LEO over the maximal ISR and
        caught-up eligible replicas. Whether the HW moved."""
        if self.role is not Role.LEADER:
            return False
        if self.is_under_min_isr and not bugs.on(Bug.HW_UNDER_MIN_ISR):  # B6: moves anyway
            return False
        if bugs.on(Bug.HW_AT_LEADER_LEO):
            candidate = self.log.log_end_offset  # B5: the ISR ignored
        else:
            candidate = high_watermark_candidate(
                self.log.log_end_offset,
                self.remotes.values(),
                self.isr_state.maximal_isr,
                now_ms,
                self.config.replica_lag_time_max_ms,
                self._eligible,
            )
        if candidate <= self.log.high_watermark:
            return False
        return self.log.maybe_increment_high_watermark(candidate)

    def _broker_states(self, isr: tuple[int, ...]) -> tuple[BrokerState, ...]:
        """``addBrokerEpochToIsr``: our own registration's epoch, and each
        follower's from its fetches (-1 when unknown)."""
        states = []
        for broker_id in isr:
            if broker_id == self.broker_id:
                registration = self.brokers.registration(broker_id)
                epoch = registration.epoch if registration is not None else -1
            else:
                remote = self.remotes.get(broker_id)
                epoch = -1 if remote is None or remote.broker_epoch is None else remote.broker_epoch
            states.append(BrokerState(broker_id, epoch))
        return tuple(states)

    def _prepare(self, kind: ChangeKind, replicas: tuple[int, ...]) -> AlterPartitionRequest:
        """``prepareIsrExpand``/``prepareIsrShrink``: the request, and the
        pending state that remembers the last committed one."""
        current = self.isr_state
        if kind is ChangeKind.EXPAND:
            new_isr = tuple(sorted({*current.isr, *replicas}))
        else:
            new_isr = tuple(b for b in current.isr if b not in replicas)
        request = AlterPartitionRequest(
            self.broker_id,
            self.leader_epoch,
            self.partition_epoch,
            self._broker_states(new_isr),
            current.leader_recovery_state,
        )
        self.isr_state = IsrState(
            current.isr,
            current.leader_recovery_state,
            PendingChange(kind, replicas, request, current),
        )
        return request

    def _maybe_expand_isr(self, replica: RemoteReplica) -> AlterPartitionRequest | None:
        """``Partition.maybeExpandIsr``: one change in flight; an eligible
        replica not in the ISR whose LEO reached the HW and our epoch start."""
        state = self.isr_state
        if (
            state.is_inflight
            or replica.broker_id in state.isr
            # B8: fenced, shutting-down and stale-epoch replicas taken in too.
            or (not self._eligible(replica) and not bugs.on(Bug.EXPAND_WITH_INELIGIBLE))
            or not is_follower_in_sync(
                replica.log_end_offset, self.log.high_watermark, self.leader_epoch_start_offset
            )
        ):
            return None
        return self._prepare(ChangeKind.EXPAND, (replica.broker_id,))

    def tick_isr(self, now_ms: int) -> AlterPartitionRequest | None:
        """``Partition.maybeShrinkIsr`` (the ``isr-expiration`` task): the ISR
        members not caught up within ``replica.lag.time.max.ms`` leave, unless
        a change is in flight. The shrink counts for the HW only once
        committed."""
        if self.role is not Role.LEADER or self.isr_state.is_inflight:
            return None
        out = out_of_sync_replicas(
            self.isr_state.isr,
            self.broker_id,
            self.remotes,
            self.log.log_end_offset,
            now_ms,
            self.config.replica_lag_time_max_ms,
        )
        if not out:
            return None
        return self._prepare(ChangeKind.SHRINK, out)

    def step_alter_partition_result(
        self, request: AlterPartitionRequest, result: AlterPartitionResult, now_ms: int
    ) -> bool:
        """``Partition.handleAlterPartitionUpdate``: an answer for a request
        no longer pending, with another leader epoch or an older partition
        epoch is ignored; else the ISR is committed and the HW re-checked
        (KAFKA-13091). Whether the HW moved."""
        pending = self.isr_state.pending
        if self.role is not Role.LEADER or pending is None or pending.request != request:
            return False
        if (
            result.leader_epoch != self.leader_epoch
            or result.partition_epoch < self.partition_epoch
        ):
            return False
        self.isr_state = IsrState(tuple(sorted(result.isr)), result.leader_recovery_state)
        self.partition_epoch = result.partition_epoch
        return self.maybe_increment_leader_hw(now_ms)

    def step_alter_partition_error(
        self, request: AlterPartitionRequest, error: Errors
    ) -> AlterPartitionRequest | None:
        """``Partition.handleAlterPartitionError``: the request to send again
        (retry), or None (reset to the committed ISR, or wait for new
        metadata, or the answer was for a request no longer pending)."""
        pending = self.isr_state.pending
        if self.role is not Role.LEADER or pending is None or pending.request != request:
            return None
        action = alter_partition_error_action(error)
        if action is AlterPartitionErrorAction.RESET:
            self.isr_state = pending.last_committed
            return None
        if action is AlterPartitionErrorAction.WAIT:
            return None
        return request

    # -- leader: fetches and produces ---------------------------------------------

    def _refusal(self, error: Errors, message: str) -> LeaderFetchOutcome:
        leader, epoch = self._leader_hint()
        if error is Errors.OFFSET_OUT_OF_RANGE:
            # With our log's bounds, which the follower's out_of_range needs
            # (kq's answer in place of Kafka's ListOffsets round trip).
            log = self.log
            return LeaderFetchOutcome(
                FetchAnswer(
                    error,
                    log.high_watermark,
                    log.log_start_offset,
                    log.log_end_offset,
                    current_leader=leader,
                    current_leader_epoch=epoch,
                    message=message,
                )
            )
        return LeaderFetchOutcome(
            FetchAnswer(error, current_leader=leader, current_leader_epoch=epoch, message=message)
        )

    def _not_leader_message(self) -> str:
        return f"broker {self.broker_id} does not lead this partition (leader {self.leader_id})"

    def _require_leader(self) -> None:
        """``Partition.leaderLogIfLocal``: ``NOT_LEADER_OR_FOLLOWER`` unless
        this replica leads."""
        if self.role is not Role.LEADER:
            raise ReplicaError(Errors.NOT_LEADER_OR_FOLLOWER, self._not_leader_message())

    def step_fetch(self, request: FetchRequest, now_ms: int) -> LeaderFetchOutcome:
        """Answer a follower's fetch (``Partition.fetchRecords`` then
        ``updateFollowerFetchState``): epoch checks, the divergence check,
        a read up to the LEO, then the follower's state, an ISR expansion and
        the HW. The answer's HW is the one before this fetch moved it."""
        if self.role is not Role.LEADER:
            return self._refusal(Errors.NOT_LEADER_OR_FOLLOWER, self._not_leader_message())
        epoch_error = check_current_leader_epoch(request.current_leader_epoch, self.leader_epoch)
        if epoch_error is not Errors.NONE:
            return self._refusal(
                epoch_error,
                f"current leader epoch {request.current_leader_epoch}, the partition's is "
                f"{self.leader_epoch}",
            )
        replica = self.remotes.get(request.replica_id)
        if replica is None:
            # Partition.followerReplicaOrThrow (KAFKA-13837): with a leader
            # epoch, "the tuple (replicaId, leaderEpoch) is not yet
            # recognized as valid, which causes the follower to retry" (a
            # replica being added); without one, an old follower that was
            # removed.
            return self._refusal(
                Errors.NOT_LEADER_OR_FOLLOWER
                if request.current_leader_epoch in (None, NO_EPOCH)
                else Errors.UNKNOWN_LEADER_EPOCH,
                f"replica {request.replica_id} is not a follower of this partition "
                f"(replicas {list(self.replicas)})",
            )
        log = self.log
        high_watermark = log.high_watermark
        log_start, log_end = log.log_start_offset, log.log_end_offset
        leader, epoch = self._leader_hint()
        divergence = fetch_divergence(
            log.epoch_cache,
            log_start_offset=log_start,
            log_end_offset=log_end,
            fetch_offset=request.fetch_offset,
            # R2: no divergence check, the leader reads at the follower's offset.
            last_fetched_epoch=NO_EPOCH
            if bugs.on(Bug.NO_DIVERGENCE_CHECK)
            else request.last_fetched_epoch,
        )
        if isinstance(divergence, Errors):
            return self._refusal(
                divergence,
                f"fetch at {request.fetch_offset} with last fetched epoch "
                f"{request.last_fetched_epoch}: log [{log_start}, {log_end}), epochs "
                f"{[(e.epoch, e.start_offset) for e in log.epoch_cache.entries]}",
            )
        if divergence is not None:
            # No records, and the follower's state is not updated.
            return LeaderFetchOutcome(
                FetchAnswer(
                    Errors.NONE,
                    high_watermark,
                    log_start,
                    log_end,
                    diverging_epoch=divergence,
                    current_leader=leader,
                    current_leader_epoch=epoch,
                )
            )
        try:
            records = log.read(request.fetch_offset, request.max_bytes)
        except PartitionLogError as error:
            return self._refusal(from_partition_log_error(error), str(error.args[0]))
        # Stale broker epoch (KIP-903): Replica.updateFetchStateOrThrow.
        registration = self.brokers.registration(request.replica_id)
        cached = None if registration is None or registration.fenced else registration.epoch
        if request.replica_epoch != -1 and cached is not None and cached > request.replica_epoch:
            return self._refusal(
                Errors.NOT_LEADER_OR_FOLLOWER,
                f"replica {request.replica_id} fetched with broker epoch {request.replica_epoch}, "
                f"its registration has {cached}",
            )
        previous_end = replica.log_end_offset
        previous_low = self._low_watermark()
        replica = update_fetch_state(
            replica,
            fetch_offset=request.fetch_offset,
            log_start_offset=request.log_start_offset,
            fetch_time_ms=now_ms,
            leader_end_offset=log_end,
            broker_epoch=request.replica_epoch,
        )
        self.remotes[replica.broker_id] = replica
        alter = self._maybe_expand_isr(replica)
        moved = False
        if previous_end != replica.log_end_offset or alter is not None:
            moved = self.maybe_increment_leader_hw(now_ms)
        answer = FetchAnswer(
            Errors.NONE,
            high_watermark,
            log_start,
            log_end,
            records=records,
            current_leader=leader,
            current_leader_epoch=epoch,
        )
        return LeaderFetchOutcome(answer, alter, moved, self._low_watermark() > previous_low)

    def append_as_leader(
        self,
        batch_bytes: bytes,
        required_acks: int,
        now_ms: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        marker_bumps_epoch: bool = False,
    ) -> LeaderAppend:
        """``Partition.appendRecordsToLeader``: acks=all under min ISR is refused
        before anything is written (``NOT_ENOUGH_REPLICAS``, a definite
        failure); else the log appends it in our epoch, and the HW is
        re-checked (the ISR may be just us).  ``marker_bumps_epoch``: a
        transaction version 2 marker (the producer state's check)."""
        self._require_leader()
        if required_acks not in _ACKS:
            raise ReplicaError(
                Errors.INVALID_REQUIRED_ACKS, f"acks {required_acks}: must be 0, 1 or -1 (all)"
            )
        if required_acks == -1 and self.is_under_min_isr:
            raise ReplicaError(
                Errors.NOT_ENOUGH_REPLICAS,
                f"the ISR {list(self.isr)} is smaller than min.insync.replicas {self.min_isr}",
            )
        try:
            info = self.log.append_as_leader(
                batch_bytes,
                self.leader_epoch,
                now_ms,
                origin=origin,
                marker_bumps_epoch=marker_bumps_epoch,
            )
        except PartitionLogError as error:
            raise ReplicaError(from_partition_log_error(error), str(error.args[0])) from None
        return LeaderAppend(info, self.leader_epoch, self.maybe_increment_leader_hw(now_ms))

    def check_enough_replicas_reach_offset(
        self, required_offset: int, leader_epoch: int
    ) -> AcksCheck:
        """The acks=all decision for a batch appended in ``leader_epoch``
        ending before ``required_offset``. A partition no longer led here in
        that epoch answers ``NOT_LEADER_OR_FOLLOWER`` (indefinite: the records
        may be on the new leader; Kafka completes the delayed produce so when
        it becomes follower, KAFKA-13574)."""
        if self.role is not Role.LEADER or leader_epoch != self.leader_epoch:
            return AcksCheck(True, Errors.NOT_LEADER_OR_FOLLOWER)
        return acks_check(
            self.log.high_watermark, required_offset, self.min_isr, len(self.maximal_isr)
        )

    # -- leader: DeleteRecords -----------------------------------------------------

    def _alive(self, broker_id: int) -> bool:
        """``MetadataCache.hasAliveBroker``: registered and not fenced."""
        registration = self.brokers.registration(broker_id)
        return registration is not None and not registration.fenced

    def _low_watermark(self) -> int:
        return low_watermark(
            self.log.log_start_offset,
            self.remotes.values(),
            self._alive,
            (*self.isr_state.maximal_isr, *self.elr),
        )

    def low_watermark(self) -> int:
        """``Partition.lowWatermarkIfLeader``, also over the ISR and ELR
        members on fenced brokers (see
        :func:`broker.replica.leader.low_watermark`)."""
        self._require_leader()
        return self._low_watermark()

    def delete_records(self, offset: int, now_ms: int) -> DeleteRecordsResult:
        """``Partition.deleteRecordsOnLeader``: raise the leader's log start to
        ``offset`` (-1: the HW), never above the HW (``OFFSET_OUT_OF_RANGE``,
        nothing moved). Only the leader's log moves here; each follower
        moves its own from the leader's log start in its next fetch answer
        (:meth:`step_fetch_answer`), and the request waits until the low
        watermark reaches ``offset`` (:meth:`check_delete_records`,
        ``DelayedDeleteRecords``)."""
        self._require_leader()
        if CleanupPolicy.DELETE not in self.log.config.cleanup_policy:
            # Partition.deleteRecordsOnLeader: a compacted topic keeps every
            # key's latest record; only its cleaner removes records.
            raise ReplicaError(
                Errors.POLICY_VIOLATION,
                "records of this partition cannot be deleted: its topic's cleanup.policy "
                "is compact, not delete",
            )
        if offset < UNKNOWN_OFFSET:
            raise ReplicaError(
                Errors.OFFSET_OUT_OF_RANGE, f"delete records offset {offset} is not valid"
            )
        requested = self.log.high_watermark if offset == UNKNOWN_OFFSET else offset
        try:
            self.log.delete_records(requested, now_ms)
        except PartitionLogError as error:
            raise ReplicaError(from_partition_log_error(error), str(error.args[0])) from None
        return DeleteRecordsResult(requested, self._low_watermark())

    def check_delete_records(self, required_offset: int) -> DeleteRecordsCheck:
        """``DelayedDeleteRecords.tryComplete`` for this partition: done when
        the low watermark reached ``required_offset``; a partition no longer
        led here is done with ``NOT_LEADER_OR_FOLLOWER``."""
        if self.role is not Role.LEADER:
            return DeleteRecordsCheck(True, error=Errors.NOT_LEADER_OR_FOLLOWER)
        lowest = self._low_watermark()
        return DeleteRecordsCheck(lowest >= required_offset, lowest)

    def latest_offset(self) -> int:
        """ListOffsets(latest) for a consumer: the HW, or
        ``OFFSET_NOT_AVAILABLE`` while a new leader's HW is below its epoch
        start (KIP-207: "latest" never goes backwards)."""
        if self.role is not Role.LEADER:
            raise ReplicaError(
                Errors.NOT_LEADER_OR_FOLLOWER, f"broker {self.broker_id} does not lead"
            )
        start = self.leader_epoch_start_offset
        if start is not None and start > self.log.high_watermark:
            raise ReplicaError(
                Errors.OFFSET_NOT_AVAILABLE,
                f"the high watermark {self.log.high_watermark} is below the leader epoch "
                f"start offset {start}",
            )
        return self.log.high_watermark

    # -- follower -----------------------------------------------------------------

    def next_fetch_request(self, broker_epoch: int) -> FetchRequest | None:
        """The follower's next fetch (``ReplicaFetcherThread.buildFetch``): from
        our LEO, with the latest epoch of our log as the last fetched epoch
        (KIP-595) and the leader epoch we believe in; None when not
        following or fenced."""
        if self.role is not Role.FOLLOWER or self.leader_id == NO_LEADER or self.fenced:
            return None
        log = self.log
        return FetchRequest(
            replica_id=self.broker_id,
            replica_epoch=broker_epoch,
            current_leader_epoch=self.leader_epoch,
            fetch_offset=log.log_end_offset,
            # B2: after a truncation by offset, fetches carry no epoch.
            last_fetched_epoch=NO_EPOCH
            if self.by_offset and bugs.on(Bug.TRUNCATE_BY_OFFSET)
            else log.epoch_cache.latest_epoch,
            log_start_offset=log.log_start_offset,
            max_bytes=self.config.replica_fetch_max_bytes,
        )

    def _truncate(self, offset: int, completed: bool) -> Truncation:
        before = self.log.log_end_offset
        self.log.truncate_to(offset)
        return Truncation(before, self.log.log_end_offset, completed)

    def _restart(self, offset: int, now_ms: int) -> Restart:
        """``truncateFullyAndStartAt``: the log emptied and restarted at
        ``offset``; its log start, end and HW are ``offset`` and its epoch
        cache empty, so the next fetch asks from there with no last fetched
        epoch (the leader has nothing of ours left to compare)."""
        log = self.log
        before = Restart(log.log_start_offset, log.log_end_offset, offset)
        log.truncate_fully_and_start_at(offset, now_ms)
        return before

    def _append_as_follower(self, records: bytes, now_ms: int) -> Restart | None:
        """Append the leader's batches; if the log is empty and the first
        batch starts below its end but reaches it, restart the log at
        that batch's first offset and append it (``Partition.
        appendRecordsToFollowerOrFutureReplica``'s answer to
        ``UnexpectedAppendOffsetException``): a DeleteRecords put the
        leader's log start inside a batch, and a follower that restarted at
        that start (or fetches its first offset) is served the whole batch,
        which starts earlier. The restart, or None."""
        log = self.log
        try:
            log.append_as_follower(records, now_ms)
            return None
        except PartitionLogError as refusal:
            if refusal.code is not LogErrors.OFFSET_OUT_OF_RANGE:
                raise
            # The batches scanned whole before this refusal. Kafka asks for
            # log end == log start; no bytes is the same, and also covers a
            # restart a crash cut short (an empty segment left beside the
            # empty old one).
            first = BatchHeader.parse(records)
            end = log.log_end_offset
            if log.size or not first.base_offset < end <= first.last_offset:
                raise
        restart = self._restart(first.base_offset, now_ms)
        log.append_as_follower(records, now_ms)
        return restart

    def _follow_log_start(self, leader_log_start_offset: int, now_ms: int) -> int | None:
        """After the HW, the log start follows the leader's
        (``ReplicaFetcherThread.processPartitionData``:
        ``maybeIncrementLogStartOffset(leaderLogStartOffset,
        LeaderOffsetIncremented)``), so that records a DeleteRecords or the
        leader's retention removed are gone here too and stay gone when this
        replica leads. Never backwards, never past our HW
        (:func:`~broker.replica.follower.follower_log_start`). Where it
        moved to, or None."""
        log = self.log
        # An unknown start (-1) is below ours and moves nothing.
        target = follower_log_start(leader_log_start_offset, log.high_watermark)
        if target <= log.log_start_offset:
            return None
        log.delete_records(target, now_ms)
        return log.log_start_offset

    def step_fetch_answer(
        self, request: FetchRequest, answer: FetchAnswer, now_ms: int
    ) -> FollowerOutcome:
        """Handle the leader's answer to ``request`` (``processFetchRequest``)."""
        log = self.log
        if self.role is not Role.FOLLOWER or not is_current_fetch(
            request, self.leader_epoch, log.log_end_offset, self.fenced
        ):
            return FollowerOutcome(FollowerStep.STALE)
        error = answer.error
        if error is Errors.NONE and answer.diverging_epoch is not None:
            if bugs.on(Bug.TRUNCATE_BY_OFFSET):
                # B2, KIP-279 undone (KAFKA-6361): cut at the leader's end of
                # that epoch whether or not our log has the epoch, then fetch
                # by offset alone.
                self.by_offset = True
                offset = min(answer.diverging_epoch.end_offset, log.log_end_offset)
                return FollowerOutcome(FollowerStep.FETCH, self._truncate(offset, True))
            # truncateOnFetchResponse (KAFKA-10554).
            step = divergence_truncation(
                log.epoch_cache, log.log_end_offset, log.high_watermark, answer.diverging_epoch
            )
            return FollowerOutcome(FollowerStep.FETCH, self._truncate(step.offset, step.completed))
        if error is Errors.NONE:
            appended_to = None
            restart = None
            if answer.records:
                try:
                    restart = self._append_as_follower(answer.records, now_ms)
                except PartitionLogError as refusal:
                    return FollowerOutcome(
                        FollowerStep.BACKOFF, error=from_partition_log_error(refusal)
                    )
                appended_to = log.log_end_offset
            moved = log.maybe_increment_high_watermark(
                follower_high_watermark(answer.high_watermark, log.log_end_offset)
            )
            try:
                started_at = self._follow_log_start(answer.log_start_offset, now_ms)
            except PartitionLogError as refusal:
                # The records and the HW stand; the start follows on the
                # next answer.
                return FollowerOutcome(
                    FollowerStep.BACKOFF,
                    appended_to=appended_to,
                    high_watermark_moved=moved,
                    error=from_partition_log_error(refusal),
                )
            return FollowerOutcome(
                FollowerStep.FETCH,
                appended_to=appended_to,
                high_watermark_moved=moved,
                restart=restart,
                log_start_moved_to=started_at,
            )
        if error is Errors.OFFSET_OUT_OF_RANGE:
            action = out_of_range(
                log.log_end_offset, answer.log_start_offset, answer.log_end_offset
            )
            if action.truncate_to is not None:
                try:
                    truncation = self._truncate(action.truncate_to, True)
                except PartitionLogError as refusal:
                    return FollowerOutcome(
                        FollowerStep.BACKOFF, error=from_partition_log_error(refusal)
                    )
                return FollowerOutcome(FollowerStep.FETCH, truncation, error=error)
            if action.start_at is not None:
                # The leader's log starts past ours (its retention or
                # DeleteRecords removed all we lack): everything we hold is
                # below its log start, gone there too, so the log restarts
                # at that start and fetches on (fetchOffsetAndTruncate's
                # truncateFullyAndStartAt). Our HW rises to it.
                before_hw = log.high_watermark
                try:
                    restart = self._restart(action.start_at, now_ms)
                except PartitionLogError as refusal:
                    return FollowerOutcome(
                        FollowerStep.BACKOFF, error=from_partition_log_error(refusal)
                    )
                return FollowerOutcome(
                    FollowerStep.FETCH,
                    high_watermark_moved=log.high_watermark != before_hw,
                    restart=restart,
                    error=error,
                )
            return FollowerOutcome(FollowerStep.FETCH, error=error)
        if error is Errors.FENCED_LEADER_EPOCH:
            self.fenced = True
            return FollowerOutcome(FollowerStep.WAIT_FOR_METADATA, error=error)
        return FollowerOutcome(FollowerStep.BACKOFF, error=error)

"""The replica state machine as the simulator runs it: Kafka's rules, or,
with a :class:`~broker.sim.config.Bug` switched on, one of them broken on
purpose. Without bugs :class:`SimReplica` is :class:`PartitionReplica`
unchanged (every override defers to it)."""

from __future__ import annotations

from dataclasses import replace

from broker.errors import Errors
from broker.replica import PartitionReplica
from broker.replica.leader import ChangeKind, RemoteReplica, high_watermark_candidate
from broker.replica.seam import BrokerView, ReplicaLog
from broker.replica.types import (
    NO_EPOCH,
    AlterPartitionRequest,
    FetchAnswer,
    FetchRequest,
    FollowerOutcome,
    FollowerStep,
    LeaderFetchOutcome,
    ReplicaConfig,
    Role,
)
from broker.sim.config import Bug
from metadata.image import PartitionRegistration

__all__ = ["SimReplica"]


class SimReplica(PartitionReplica):
    """A :class:`PartitionReplica` with the simulator's bug switches."""

    def __init__(
        self,
        broker_id: int,
        log: ReplicaLog,
        config: ReplicaConfig,
        brokers: BrokerView,
        bugs: frozenset[Bug] = frozenset(),
    ) -> None:
        super().__init__(broker_id, log, config, brokers)
        self.bugs = bugs
        # TRUNCATE_BY_OFFSET: truncated once by offset, the follower fetches
        # by offset alone until it follows another leader (as before KIP-279).
        self.by_offset = False

    @property
    def min_isr(self) -> int:
        if Bug.IGNORE_MIN_ISR in self.bugs:
            return 1
        return super().min_isr

    def become_follower(self, registration: PartitionRegistration, now_ms: int) -> bool:
        changed = super().become_follower(registration, now_ms)
        if changed:
            self.by_offset = False
        if changed and Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER in self.bugs:
            # The rule before KIP-101: "It truncates its log to the high
            # watermark".
            self.log.truncate_to(self.log.high_watermark)
        return changed

    def maybe_increment_leader_hw(self, now_ms: int) -> bool:
        if Bug.HW_UNDER_MIN_ISR not in self.bugs:
            return super().maybe_increment_leader_hw(now_ms)
        # KAFKA-15583 undone: no strict min ISR check.
        if self.role is not Role.LEADER:
            return False
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

    def _maybe_expand_isr(self, replica: RemoteReplica) -> AlterPartitionRequest | None:
        if Bug.EXPAND_WITHOUT_EPOCH_START not in self.bugs:
            return super()._maybe_expand_isr(replica)
        # KAFKA-7128 undone: in sync once at the HW, whatever the epoch start.
        state = self.isr_state
        if (
            state.is_inflight
            or replica.broker_id in state.isr
            or not self._eligible(replica)
            or replica.log_end_offset < self.log.high_watermark
        ):
            return None
        return self._prepare(ChangeKind.EXPAND, (replica.broker_id,))

    def step_fetch(self, request: FetchRequest, now_ms: int) -> LeaderFetchOutcome:
        if Bug.NO_DIVERGENCE_CHECK in self.bugs:
            # A fetch without a last fetched epoch is never checked for
            # divergence: the leader reads at the follower's offset.
            request = replace(request, last_fetched_epoch=NO_EPOCH)
        return super().step_fetch(request, now_ms)

    def step_fetch_answer(
        self, request: FetchRequest, answer: FetchAnswer, now_ms: int
    ) -> FollowerOutcome:
        diverging = answer.diverging_epoch
        if (
            Bug.TRUNCATE_BY_OFFSET in self.bugs
            and diverging is not None
            and answer.error is Errors.NONE
            and self.role is Role.FOLLOWER
            and request.current_leader_epoch == self.leader_epoch
            and request.fetch_offset == self.log.log_end_offset
            and not self.fenced
        ):
            # KIP-279 undone: cut at the leader's end of that epoch, whether
            # or not our log has the epoch.
            offset = min(diverging.end_offset, self.log.log_end_offset)
            self.by_offset = True
            return FollowerOutcome(FollowerStep.FETCH, self._truncate(offset, True))
        return super().step_fetch_answer(request, answer, now_ms)

    def next_fetch_request(self, broker_epoch: int) -> FetchRequest | None:
        request = super().next_fetch_request(broker_epoch)
        if request is not None and self.by_offset:
            request = replace(request, last_fetched_epoch=NO_EPOCH)
        return request

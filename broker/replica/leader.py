"""The leader's decisions for one partition (Kafka's ``Partition.scala`` and
``Replica.scala``), as pure functions over values; :mod:`broker.replica.partition`
applies them to the log and the partition's state.

Rules and their sources (brokers.md §1.3, §1.4, §1.7, §1.8):

- A request's leader epoch: older than ours is ``FENCED_LEADER_EPOCH``,
  newer is ``UNKNOWN_LEADER_EPOCH``, absent is not checked
  (``Partition.checkCurrentLeaderEpoch``, KIP-320).
- A follower's last fetched epoch is checked against our epoch cache: an
  epoch whose end we cannot tell, or a fetch below our log start, is
  ``OFFSET_OUT_OF_RANGE``; an epoch we do not have, or one that ends before
  the fetch offset, is answered with ``DivergingEpoch`` and no records
  (``Partition.readRecords``, KIP-595, KAFKA-10487).
- ``lastCaughtUpTimeMs``: a fetch at our LEO makes the follower caught up at
  the fetch time, a fetch at our LEO of its previous fetch makes it caught
  up at the previous fetch time (``Replica.updateFetchStateOrThrow``).
- The HW is the minimum LEO over the maximal ISR and the caught-up eligible
  replicas, and does not move while the ISR is below min ISR
  (``Partition.maybeIncrementLeaderHW``, KAFKA-15583).
- A follower joins the ISR only if eligible (unfenced, not shutting down, at
  its current broker epoch: KIP-841, KIP-903) and its LEO is at least the HW
  and the leader's epoch start offset (KAFKA-7128).
- An ISR member leaves when not caught up for ``replica.lag.time.max.ms``
  (``Partition.getOutOfSyncReplicas``).
- AlterPartition errors (``Partition.handleAlterPartitionError``).
- The low watermark, which a DeleteRecords waits for, is the smallest log
  start over the leader and every follower on a live broker, as their
  fetches reported it (``Partition.lowWatermarkIfLeader``), and over every
  ISR and ELR member even on a fenced broker (kq's addition: KIP-966 may
  elect one that never fetched the delete).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import bugs
from broker.errors import Errors
from broker.replica.seam import BrokerView
from broker.replica.types import (
    NO_EPOCH,
    UNKNOWN_OFFSET,
    AcksCheck,
    AlterPartitionRequest,
    DivergingEpoch,
)
from bugs import Bug
from metadata.records import LeaderRecoveryState
from partition_log.epoch_cache import LeaderEpochCache

__all__ = [
    "AlterPartitionErrorAction",
    "IsrState",
    "PendingChange",
    "RemoteReplica",
    "acks_check",
    "alter_partition_error_action",
    "check_current_leader_epoch",
    "consumer_read_bound",
    "effective_min_isr",
    "fetch_divergence",
    "high_watermark_candidate",
    "is_broker_epoch_isr_eligible",
    "is_follower_in_sync",
    "is_replica_isr_eligible",
    "low_watermark",
    "out_of_sync_replicas",
    "reset_replica",
    "update_fetch_state",
]


# -- the leader's view of one follower (Kafka's Replica / ReplicaState) -----------


@dataclass(frozen=True, slots=True)
class RemoteReplica:
    """What the leader knows of one follower, from its fetches."""

    broker_id: int
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    # The leader's LEO and the time at the follower's previous fetch.
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0
    # The broker epoch its fetches carried (KIP-903); None before any fetch
    # in this leadership.
    broker_epoch: int | None = None

    def is_caught_up(self, leader_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        """``ReplicaState.isCaughtUp``: at the leader's LEO, or caught up within
        the last ``max_lag_ms``."""
        return (
            leader_end_offset == self.log_end_offset
            or now_ms - self.last_caught_up_time_ms <= max_lag_ms
        )


def reset_replica(
    replica: RemoteReplica, now_ms: int, *, is_new_leader: bool, in_sync: bool
) -> RemoteReplica:
    """``Replica.resetReplicaState`` at a new leader epoch: an ISR member is
    caught up now (so it is not shrunk at once), any other at time 0 (so it
    does not hold the HW back); a new leader forgets what it knew of the
    follower's log (its LEO is unknown until it fetches in this epoch, so the
    HW cannot move before then: brokers.md rule 3)."""
    caught_up = now_ms if in_sync else 0
    if is_new_leader:
        return RemoteReplica(replica.broker_id, last_caught_up_time_ms=caught_up)
    return replace(replica, last_caught_up_time_ms=caught_up)


def update_fetch_state(
    replica: RemoteReplica,
    *,
    fetch_offset: int,
    log_start_offset: int,
    fetch_time_ms: int,
    leader_end_offset: int,
    broker_epoch: int,
) -> RemoteReplica:
    """``Replica.updateFetchStateOrThrow`` (the stale broker epoch is checked
    by the caller first)."""
    if fetch_offset >= leader_end_offset:
        caught_up = max(replica.last_caught_up_time_ms, fetch_time_ms)
    elif fetch_offset >= replica.last_fetch_leader_log_end_offset:
        caught_up = max(replica.last_caught_up_time_ms, replica.last_fetch_time_ms)
    else:
        caught_up = replica.last_caught_up_time_ms
    return RemoteReplica(
        replica.broker_id,
        log_start_offset=log_start_offset,
        log_end_offset=fetch_offset,
        last_fetch_leader_log_end_offset=leader_end_offset,
        last_fetch_time_ms=fetch_time_ms,
        last_caught_up_time_ms=caught_up,
        broker_epoch=broker_epoch,
    )


# -- the ISR state (Kafka's PartitionState) -------------------------------------------


class ChangeKind(enum.Enum):
    EXPAND = "expand"
    SHRINK = "shrink"


@dataclass(frozen=True, slots=True)
class PendingChange:
    """An AlterPartition in flight (``PendingExpandIsr``/``PendingShrinkIsr``)."""

    kind: ChangeKind
    # The replica joining (EXPAND) or the replicas leaving (SHRINK).
    replicas: tuple[int, ...]
    request: AlterPartitionRequest
    last_committed: IsrState


@dataclass(frozen=True, slots=True)
class IsrState:
    """The committed ISR and recovery state, and the change in flight."""

    isr: tuple[int, ...]
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    pending: PendingChange | None = None

    @property
    def is_inflight(self) -> bool:
        return self.pending is not None

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR plus a pending expansion (KIP-497: "we assume that the new
        replica will make it into the ISR", which only makes the HW
        stricter); a pending shrink does not count until committed, "as this
        could erroneously advance the HW if the AlterPartition were to
        fail"."""
        pending = self.pending
        if pending is not None and pending.kind is ChangeKind.EXPAND:
            return tuple(sorted({*self.isr, *pending.replicas}))
        if pending is not None and bugs.on(Bug.PENDING_SHRINK_COUNTS):
            # B7: the shrink counts before the controller committed it.
            return tuple(b for b in self.isr if b not in pending.replicas)
        return self.isr


# -- checks on a follower's fetch ------------------------------------------------------


def check_current_leader_epoch(requested: int | None, local: int) -> Errors:
    """``Partition.checkCurrentLeaderEpoch`` (KIP-320)."""
    if requested is None or requested == NO_EPOCH:
        return Errors.NONE
    if requested < local:
        return Errors.FENCED_LEADER_EPOCH
    if requested > local:
        return Errors.UNKNOWN_LEADER_EPOCH
    return Errors.NONE


def fetch_divergence(
    cache: LeaderEpochCache,
    *,
    log_start_offset: int,
    log_end_offset: int,
    fetch_offset: int,
    last_fetched_epoch: int,
) -> Errors | DivergingEpoch | None:
    """``Partition.readRecords``' check of ``LastFetchedEpoch``: an error, a
    divergence to answer, or None (read at ``fetch_offset``)."""
    if last_fetched_epoch == NO_EPOCH:
        return None
    end = cache.end_offset_for_epoch(last_fetched_epoch, log_end_offset)
    if end.undefined or end.epoch == NO_EPOCH:
        # "Could not determine the end offset of the last fetched epoch".
        return Errors.OFFSET_OUT_OF_RANGE
    if fetch_offset < log_start_offset:
        # Checked before divergence: the follower must restart at our start.
        return Errors.OFFSET_OUT_OF_RANGE
    if end.epoch < last_fetched_epoch or end.end_offset < fetch_offset:
        return DivergingEpoch(end.epoch, end.end_offset)
    return None


# -- eligibility and the ISR ------------------------------------------------------------


def is_broker_epoch_isr_eligible(stored: int | None, cached: int | None) -> bool:
    """``Partition.isBrokerEpochIsrEligible`` (KIP-903): the follower fetched
    in this leadership, is registered and alive, and its fetches carried its
    current broker epoch (or -1, an old follower)."""
    return stored is not None and cached is not None and (stored == -1 or stored == cached)


def is_replica_isr_eligible(replica: RemoteReplica | None, brokers: BrokerView) -> bool:
    """``Partition.isReplicaIsrEligible``: unfenced, not in controlled
    shutdown (KIP-841) and at its current broker epoch (KIP-903)."""
    if replica is None:
        return False
    registration = brokers.registration(replica.broker_id)
    if registration is None:
        return False
    # MetadataCache.getAliveBrokerEpoch: only an unfenced broker has one.
    cached = None if registration.fenced else registration.epoch
    return (
        not registration.fenced
        and not registration.in_controlled_shutdown
        and is_broker_epoch_isr_eligible(replica.broker_epoch, cached)
    )


def is_follower_in_sync(
    follower_end_offset: int, high_watermark: int, leader_epoch_start_offset: int | None
) -> bool:
    """``Partition.isFollowerInSync``: at least the HW **and** the leader's
    epoch start offset (KAFKA-7128: "otherwise, if there is committed data
    between current leader's HW and LEO, the replica may become the leader
    before it fetches the committed data and the data will be lost")."""
    if bugs.on(Bug.EXPAND_WITHOUT_EPOCH_START):
        return follower_end_offset >= high_watermark  # B4: KAFKA-7128 undone
    return (
        follower_end_offset >= high_watermark
        and leader_epoch_start_offset is not None
        and follower_end_offset >= leader_epoch_start_offset
    )


def out_of_sync_replicas(
    isr: Iterable[int],
    leader_id: int,
    remotes: Mapping[int, RemoteReplica],
    leader_end_offset: int,
    now_ms: int,
    max_lag_ms: int,
) -> tuple[int, ...]:
    """``Partition.getOutOfSyncReplicas``: the ISR members (not the leader)
    not caught up within ``replica.lag.time.max.ms``, stuck or slow alike."""
    out = []
    for broker_id in isr:
        if broker_id == leader_id:
            continue
        replica = remotes.get(broker_id)
        if replica is not None and not replica.is_caught_up(leader_end_offset, now_ms, max_lag_ms):
            out.append(broker_id)
    return tuple(sorted(out))


def effective_min_isr(min_insync_replicas: int, replication_factor: int) -> int:
    """``Partition.effectiveMinIsr``: min ISR capped by the replication factor."""
    return min(min_insync_replicas, replication_factor)


def high_watermark_candidate(
    leader_end_offset: int,
    remotes: Iterable[RemoteReplica],
    maximal_isr: Iterable[int],
    now_ms: int,
    max_lag_ms: int,
    eligible: Callable[[RemoteReplica], bool],
) -> int:
    """``Partition.maybeIncrementLeaderHW``'s new HW: the leader's LEO held
    back by every replica of the maximal ISR and every caught-up eligible
    replica not in it yet ("otherwise the follower's log end offset may keep
    falling behind the HW … and therefore will never be added to ISR"). An
    unknown LEO (-1) holds it back entirely."""
    members = set(maximal_isr)
    new_hw = leader_end_offset
    for replica in remotes:
        wait_for = replica.broker_id in members or (
            replica.is_caught_up(leader_end_offset, now_ms, max_lag_ms) and eligible(replica)
        )
        if wait_for and replica.log_end_offset < new_hw:
            new_hw = replica.log_end_offset
    return new_hw


# -- DeleteRecords -------------------------------------------------------------------------


def low_watermark(
    leader_log_start_offset: int,
    remotes: Iterable[RemoteReplica],
    alive: Callable[[int], bool],
    electable: Iterable[int] = (),
) -> int:
    """The smallest log start offset over the leader's log and the followers
    it waits for, each as its last fetch in this leadership reported it (-1
    before any, which holds the low watermark at -1 until it fetches).

    ``Partition.lowWatermarkIfLeader`` waits for every follower on a live
    broker (``metadataCache.hasAliveBroker``), in the ISR or not, and not
    for a fenced broker's, which learns the log start from its first fetch
    answer once back. kq also waits for every replica in ``electable`` (the
    ISR and the ELR) even on a fenced broker: since KIP-966 the controller
    may elect an ELR member, which left the ISR because its broker was
    fenced, as soon as it is unfenced and before it fetched, and its log
    would bring the deleted records back (the broker simulation's
    ``deleted-stay-deleted`` found it). Kafka's rule predates the ELR; with
    this one a DeleteRecords answered NONE is on every replica that can be
    elected cleanly, and one that cannot wait for a fenced ELR member
    answers ``REQUEST_TIMED_OUT``."""
    waited_for = set(electable)
    lowest = leader_log_start_offset
    for replica in remotes:
        counted = alive(replica.broker_id) or replica.broker_id in waited_for
        if counted and replica.log_start_offset < lowest:
            lowest = replica.log_start_offset
    return lowest


# -- consumers -----------------------------------------------------------------------------


def consumer_read_bound(high_watermark: int, log_end_offset: int) -> int:
    """Where a consumer's read of the leader's log stops: the HW, so that a
    consumer sees only committed records, which no failover truncates
    (``Partition.fetchRecords`` with ``FetchIsolation.HIGH_WATERMARK``;
    KAFKA-2334, and brokers.md §1.3). Followers read up to the LEO."""
    if bugs.on(Bug.CONSUME_TO_LEO):
        return log_end_offset  # B10: uncommitted records reach consumers
    return high_watermark


# -- produce -------------------------------------------------------------------------------


def acks_check(
    high_watermark: int, required_offset: int, min_isr: int, maximal_isr_size: int
) -> AcksCheck:
    """``Partition.checkEnoughReplicasReachOffset`` for a leader: done when the
    HW reached ``required_offset`` (the batch's last offset + 1), with
    ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` if the ISR is below min ISR by then
    (the data is committed all the same)."""
    if high_watermark >= required_offset:
        if min_isr <= maximal_isr_size:
            return AcksCheck(True, Errors.NONE)
        return AcksCheck(True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    return AcksCheck(False)


# -- AlterPartition answers ----------------------------------------------------------------


class AlterPartitionErrorAction(enum.Enum):
    # Back to the last committed ISR: the controller says it did not apply it.
    RESET = "reset"
    # Stay pending until new metadata arrives (become_leader resets it).
    WAIT = "wait"
    # Send the same request again.
    RETRY = "retry"


_RESET = frozenset({Errors.OPERATION_NOT_ATTEMPTED, Errors.INELIGIBLE_REPLICA})
_WAIT = frozenset(
    {
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.UNKNOWN_TOPIC_ID,
        Errors.FENCED_LEADER_EPOCH,
        Errors.INVALID_UPDATE_VERSION,
        Errors.INVALID_REQUEST,
        Errors.NEW_LEADER_ELECTED,
    }
)


def alter_partition_error_action(error: Errors) -> AlterPartitionErrorAction:
    """``Partition.handleAlterPartitionError``: reset only when the
    controller explicitly promises it did not apply the change ("we only do
    this if the controller has explicitly responded"); wait for metadata on
    errors that newer metadata resolves; retry anything else."""
    if error is Errors.NONE:
        raise ValueError("an AlterPartition error must not be NONE")
    if error in _RESET:
        return AlterPartitionErrorAction.RESET
    if error in _WAIT:
        return AlterPartitionErrorAction.WAIT
    return AlterPartitionErrorAction.RETRY

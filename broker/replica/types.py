"""The inputs and outputs of the replica state machine of one partition:
frozen dataclasses, as the Raft core's messages (``quorum/messages.py``).

Field names follow Kafka's messages (``FetchRequest.json``,
``FetchResponse.json``, ``AlterPartitionRequest.json``); ``-1`` is Kafka's
"absent" wherever Kafka uses it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.errors import Errors
from metadata.records import LeaderRecoveryState

__all__ = [
    "NO_EPOCH",
    "UNKNOWN_OFFSET",
    "AcksCheck",
    "AlterPartitionRequest",
    "AlterPartitionResult",
    "BrokerState",
    "DeleteRecordsCheck",
    "DeleteRecordsResult",
    "DivergingEpoch",
    "FetchAnswer",
    "FetcherConfig",
    "FetchRequest",
    "FollowerOutcome",
    "FollowerStep",
    "LeaderFetchOutcome",
    "ReplicaConfig",
    "Restart",
    "Role",
    "Truncation",
]

# Kafka's "absent" epoch (RecordBatch.NO_PARTITION_LEADER_EPOCH, the -1 of
# ReplicaEpoch and LastFetchedEpoch) and UnifiedLog.UnknownOffset.
NO_EPOCH = -1
UNKNOWN_OFFSET = -1


class Role(enum.Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The broker and topic configs the replica reads, with Kafka's defaults."""

    # replica.lag.time.max.ms: an ISR member not caught up for this long is
    # shrunk out (ReplicationConfigs).
    replica_lag_time_max_ms: int = 30_000
    # min.insync.replicas (topic config); the effective value is capped by
    # the replication factor (Partition.effectiveMinIsr).
    min_insync_replicas: int = 1
    # replica.fetch.max.bytes
    replica_fetch_max_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.replica_lag_time_max_ms <= 0:
            raise ValueError(
                f"replica_lag_time_max_ms must be positive, not {self.replica_lag_time_max_ms}"
            )
        if self.min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be >= 1, not {self.min_insync_replicas}")
        if self.replica_fetch_max_bytes <= 0:
            raise ValueError(
                f"replica_fetch_max_bytes must be positive, not {self.replica_fetch_max_bytes}"
            )


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    """The broker configs a follower's fetch from one leader carries for all
    its partitions (``ReplicaFetcherThread``'s MinBytes and MaxWaitMs of the
    FetchRequest), with Kafka's defaults."""

    # replica.fetch.min.bytes: the leader answers once this many bytes are
    # there for the whole fetch...
    min_bytes: int = 1
    # replica.fetch.wait.max.ms: ...or this long has passed.
    max_wait_ms: int = 500

    def __post_init__(self) -> None:
        if self.min_bytes < 1:
            raise ValueError(f"min_bytes must be positive, not {self.min_bytes}")
        if self.max_wait_ms < 1:
            raise ValueError(f"max_wait_ms must be positive, not {self.max_wait_ms}")


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A follower's fetch of one partition (``FetchRequest`` v15+)."""

    replica_id: int
    # ReplicaState.ReplicaEpoch: the follower's broker epoch (KIP-903), -1
    # when it does not know it.
    replica_epoch: int
    # CurrentLeaderEpoch (KIP-320); None: absent (no check, old clients).
    current_leader_epoch: int | None
    fetch_offset: int
    # LastFetchedEpoch (KIP-595); NO_EPOCH: absent (an empty log).
    last_fetched_epoch: int
    log_start_offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    """FetchResponse's ``DivergingEpoch``: the largest epoch the leader has at
    most the follower's last fetched one, and where it ends in the leader's
    log."""

    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """The leader's answer for one partition (``FetchResponse``).

    ``high_watermark`` is the HW when the read was made, before this fetch
    moved it (Kafka's ``LogReadInfo.highWatermark``): a follower learns a HW
    one round trip late, which is KIP-101's scenario 1. ``log_end_offset``
    is the leader's LEO, which kq sends so that a follower answered
    ``OFFSET_OUT_OF_RANGE`` needs no ListOffsets round trip.
    ``current_leader``/``current_leader_epoch`` are KIP-951's hint."""

    error: Errors
    high_watermark: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    diverging_epoch: DivergingEpoch | None = None
    records: bytes = b""
    current_leader: int = -1
    current_leader_epoch: int = NO_EPOCH
    message: str = ""
    # A read_committed consumer's read: the last stable offset it read up
    # to, and the aborted transactions (producer id, first offset) that
    # overlap the records (FetchResponse.AbortedTransactions).
    last_stable_offset: int = UNKNOWN_OFFSET
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerState:
    """An ISR member in AlterPartition: its id and the broker epoch the leader
    saw in its fetches (-1 if unknown; KAFKA-14617, KIP-903)."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    """One partition's ISR change to send to the controller (KIP-497)."""

    leader_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[BrokerState, ...]
    # RECOVERED once a leader elected uncleanly has made its log the truth
    # (KIP-704).
    leader_recovery_state: LeaderRecoveryState

    @property
    def isr(self) -> tuple[int, ...]:
        return tuple(member.broker_id for member in self.new_isr)


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    """The controller's answer to an AlterPartition: the partition's state
    after it (``LeaderAndIsr``)."""

    leader_id: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    leader_recovery_state: LeaderRecoveryState


@dataclass(frozen=True, slots=True)
class LeaderFetchOutcome:
    """What answering a follower's fetch did: the answer to send, an
    AlterPartition to send (an ISR expansion), whether the HW moved (delayed
    acks=all produces may complete)."""

    answer: FetchAnswer
    alter_partition: AlterPartitionRequest | None = None
    high_watermark_moved: bool = False
    # The fetch raised the follower's log start as the leader knows it, and
    # with it the low watermark: delayed DeleteRecords may complete
    # (Partition.updateFollowerFetchState's leaderLWIncremented).
    low_watermark_moved: bool = False


@dataclass(frozen=True, slots=True)
class AcksCheck:
    """``Partition.checkEnoughReplicasReachOffset``: ``done`` with ``error``
    (NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER), or not
    done yet (keep waiting)."""

    done: bool
    error: Errors = Errors.NONE


@dataclass(frozen=True, slots=True)
class DeleteRecordsResult:
    """``Partition.deleteRecordsOnLeader``'s ``LogDeleteRecordsResult``: the
    offset the leader's log start was raised to (-1 asked for the HW) and
    the partition's low watermark right after."""

    requested_offset: int
    low_watermark: int


@dataclass(frozen=True, slots=True)
class DeleteRecordsCheck:
    """``DelayedDeleteRecords.tryComplete`` for one partition: ``done`` once
    the low watermark reached the requested offset (``error`` NONE) or the
    partition is no longer led here (``NOT_LEADER_OR_FOLLOWER``), with the
    low watermark to answer (-1 with an error)."""

    done: bool
    low_watermark: int = UNKNOWN_OFFSET
    error: Errors = Errors.NONE


@dataclass(frozen=True, slots=True)
class Truncation:
    """A truncation the follower did: from ``log_end_offset`` to ``offset``;
    ``completed`` false when it must hear from the leader again (KIP-279)."""

    log_end_offset: int
    offset: int
    completed: bool


@dataclass(frozen=True, slots=True)
class Restart:
    """The follower's log emptied and restarted at ``offset``, the leader's
    log start, which lay past its whole log ``[log_start_offset,
    log_end_offset)`` (Kafka's ``truncateFullyAndStartAt`` in
    ``AbstractFetcherThread.fetchOffsetAndTruncate``). Not a truncation
    below a committed HW: the records it dropped are gone from the leader's
    log too, and its HW rises to ``offset``."""

    log_start_offset: int
    log_end_offset: int
    offset: int


class FollowerStep(enum.Enum):
    """What the follower does after a fetch answer."""

    # Fetch again (at once or after the fetch wait).
    FETCH = "fetch"
    # Back off, then fetch again (retriable errors: UNKNOWN_LEADER_EPOCH,
    # NOT_LEADER_OR_FOLLOWER while the metadata catches up).
    BACKOFF = "backoff"
    # Stop fetching until newer metadata (FENCED_LEADER_EPOCH:
    # AbstractFetcherThread.onPartitionFenced).
    WAIT_FOR_METADATA = "wait_for_metadata"
    # The answer was for an older fetch state: ignored.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class FollowerOutcome:
    """What handling a fetch answer did on the follower."""

    step: FollowerStep
    truncation: Truncation | None = None
    appended_to: int | None = None
    high_watermark_moved: bool = False
    # The leader's log started past this follower's whole log
    # (OFFSET_OUT_OF_RANGE with a log start above our log end): the log was
    # emptied and restarted there, and the follower fetches on from it.
    restart: Restart | None = None
    error: Errors = Errors.NONE
    # The log start was raised to the leader's (its DeleteRecords or
    # retention): where it now is, or None if it did not move.
    log_start_moved_to: int | None = None

    @property
    def start_at(self) -> int | None:
        """Where the log was restarted (the leader's log start, now our log
        start, log end and HW; Kafka's ``truncateFullyAndStartAt``), or
        None if it was not."""
        return None if self.restart is None else self.restart.offset

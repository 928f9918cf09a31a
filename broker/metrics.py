"""What the broker's data plane reports to its metrics (the seam).

The replica manager and the service tell a :class:`BrokerMetrics` what
happened; the process gives them one that keeps Prometheus counters
(``server.broker_metrics``), tests and the simulator the no-op
:data:`NO_METRICS`. The seam is pure (no clock, no I/O): a latency arrives
as seconds measured by the caller, so the replica manager stays pure and
``broker/`` needs no exporter.

The meanings are Kafka's (``BrokerTopicMetrics``, ``RequestMetrics``,
``ReplicaManager``'s ISR meters), as docs/brokers.md lists them:

- an ISR shrink or expansion counts once the controller has committed it
  (``Partition.handleAlterPartitionUpdate`` then
  ``PendingShrinkIsr``/``PendingExpandIsr.notifyListener``: ``markShrink``,
  ``markExpand``);
- bytes and messages in are a producer's batches appended to a leader's log
  (``ReplicaManager.appendToLocalLog``: ``bytesInRate``,
  ``messagesInRate``); a follower's appends are replication bytes in
  (``ReplicaFetcherThread.processPartitionData``);
- every answered Produce, FetchConsumer (a consumer's Fetch) and
  FetchFollower (a replica's, over Fetch or ReplicaFetch) counts once with
  its time from arrival to answer (``RequestMetrics``' ``RequestsPerSec`` and
  ``TotalTimeMs``) and each error code of its answer (``ErrorsPerSec``: the
  top-level error, else each partition's, ``NONE`` included); the records
  a fetch answers are bytes out, or replication bytes out for a follower;
- each partition of a Produce or Fetch counts towards
  ``TotalProduceRequestsPerSec``/``TotalFetchRequestsPerSec``, and towards
  ``FailedProduceRequestsPerSec``/``FailedFetchRequestsPerSec`` when its
  error is a failure of the broker (:func:`is_failure`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from broker.errors import Errors
from broker.replica.leader import ChangeKind

__all__ = [
    "NO_METRICS",
    "BrokerMetrics",
    "NoMetrics",
    "RequestKind",
    "is_failure",
]


class RequestKind(enum.Enum):
    """Kafka's ``request`` tag of ``RequestMetrics``."""

    PRODUCE = "Produce"
    # A consumer's fetch.
    FETCH = "FetchConsumer"
    # A replica's fetch (``replica_state`` set), on Fetch or ReplicaFetch.
    FETCH_FOLLOWER = "FetchFollower"


# The partition errors Kafka does not count as failed requests: the
# client's view of leadership or of the topic is stale, or the request was
# refused before the log was asked (ReplicaManager.appendToLocalLog and
# readFromLog answer these without marking failedProduceRequestRate /
# failedFetchRequestRate; KafkaApis refuses the others before the
# ReplicaManager sees them), or a delayed produce ended waiting for the ISR
# (DelayedProduce, after the append).
_NOT_FAILURES = frozenset(
    {
        Errors.NONE,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.FENCED_LEADER_EPOCH,
        Errors.KAFKA_STORAGE_ERROR,
        Errors.TOPIC_AUTHORIZATION_FAILED,
        Errors.CLUSTER_AUTHORIZATION_FAILED,
        Errors.INVALID_REQUEST,
        Errors.INVALID_REQUIRED_ACKS,
    }
)
_PRODUCE_NOT_FAILURES = _NOT_FAILURES | {
    # RecordTooLargeException, CorruptRecordException.
    Errors.MESSAGE_TOO_LARGE,
    Errors.CORRUPT_MESSAGE,
    # DelayedProduce's outcomes: the records were appended.
    Errors.REQUEST_TIMED_OUT,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
}
_FETCH_NOT_FAILURES = _NOT_FAILURES | {
    Errors.UNKNOWN_TOPIC_ID,
    Errors.INCONSISTENT_TOPIC_ID,
    # handleOffsetOutOfRangeError: a consumer's position past the log.
    Errors.OFFSET_OUT_OF_RANGE,
}


def is_failure(request: RequestKind, error: Errors) -> bool:
    """Whether a partition answered ``error`` counts as a failed produce or
    fetch (Kafka's ``FailedProduceRequestsPerSec`` /
    ``FailedFetchRequestsPerSec``): the broker could not do what a valid
    request asked (``NOT_ENOUGH_REPLICAS``, ``INVALID_RECORD``, a producer
    state refusal, an unexpected error), not a stale client."""
    if request is RequestKind.PRODUCE:
        return error not in _PRODUCE_NOT_FAILURES
    return error not in _FETCH_NOT_FAILURES


class BrokerMetrics(Protocol):
    """What the data plane reports."""

    def isr_changed(self, kind: ChangeKind) -> None:
        """The controller committed an ISR shrink or expansion this broker
        asked for as leader."""

    def appended(self, size: int, records: int) -> None:
        """A producer's batch of ``size`` bytes and ``records`` records is
        in a leader's log."""

    def replicated(self, size: int) -> None:
        """A follower appended ``size`` bytes fetched from its leader."""

    def answered(
        self,
        request: RequestKind,
        seconds: float,
        error: Errors,
        partitions: Sequence[Errors],
        records_size: int,
    ) -> None:
        """A request answered after ``seconds``: its top-level ``error``,
        each partition's error (empty after a top-level error), and the
        bytes of records it carried back (fetches)."""


class NoMetrics:
    """Reports nothing (tests, the simulator)."""

    def isr_changed(self, kind: ChangeKind) -> None:
        return None

    def appended(self, size: int, records: int) -> None:
        return None

    def replicated(self, size: int) -> None:
        return None

    def answered(
        self,
        request: RequestKind,
        seconds: float,
        error: Errors,
        partitions: Sequence[Errors],
        records_size: int,
    ) -> None:
        return None


NO_METRICS: BrokerMetrics = NoMetrics()

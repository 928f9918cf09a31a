"""How the producer client reads each answer: retriable or not, and what a
failure tells about the records (the queue workload's ``ok``, ``fail`` and
``info``).

Retriable is Kafka's ``RetriableException`` hierarchy (``Errors.java``,
brokers.md §6.3). "May have been written" is kq's reading of each answer
(brokers.md §1.2 and §5.1): the broker refused before appending (nothing
written by that attempt), or it cannot tell (the records may be in the log:
``NOT_LEADER_OR_FOLLOWER`` per KAFKA-13574, timeouts, a lost connection,
``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` whose records are in the log).

A batch that fails is ``fail`` (definite: none of its records is in the
log) only if no attempt of it may have been written; otherwise ``info``
(unknown). A batch that succeeds is ``ok``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.errors import Errors

__all__ = [
    "FORCE_CLOSED",
    "MAY_HAVE_WRITTEN",
    "NETWORK_EXCEPTION",
    "RETRIABLE",
    "TRANSACTION_ABORTED",
    "BrokerClientError",
    "BufferExhaustedError",
    "DeliveryError",
    "InvalidProducerEpochError",
    "Outcome",
    "ProducerClosedError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "TransactionAbortableError",
    "TransactionFatalError",
    "TransactionStateError",
    "code_name",
    "is_retriable",
]

# Errors.java NETWORK_EXCEPTION: the client's own code for a connection that
# failed before an answer arrived (not answered by brokers, hence not in
# broker.errors).
NETWORK_EXCEPTION = 13
# Client-side errors without a broker code (Kafka's TimeoutException,
# BufferExhaustedException, KafkaException on close): -1 with their name.
CLIENT_ERROR = -1
# The name of the error a forced close gives every record not yet complete
# (RecordAccumulator.abortIncompleteBatches' KafkaException).
FORCE_CLOSED = "KafkaException"
# The name of the error a transaction's abort gives the records it drops
# before they were sent (Kafka's TransactionAbortedException).
TRANSACTION_ABORTED = "TransactionAbortedException"


class Outcome(enum.Enum):
    """What a completed send tells about its records (Jepsen's types)."""

    OK = "ok"  # written, at the offset given (or an unknown one, -1)
    FAIL = "fail"  # definitely not written
    INFO = "info"  # unknown: may or may not be in the log


# Errors.java: the codes whose exception is a RetriableException.
RETRIABLE: frozenset[int] = frozenset(
    {
        Errors.CORRUPT_MESSAGE,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.REQUEST_TIMED_OUT,
        Errors.NOT_ENOUGH_REPLICAS,
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        Errors.KAFKA_STORAGE_ERROR,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.OFFSET_NOT_AVAILABLE,
        NETWORK_EXCEPTION,
    }
)

# Answers after which the attempt's records may be in the log. Every other
# answer is a refusal before the append (Partition.appendRecordsToLeader,
# UnifiedLog's validation and producer-state checks), so nothing of the
# attempt was written.
MAY_HAVE_WRITTEN: frozenset[int] = frozenset(
    {
        Errors.UNKNOWN_SERVER_ERROR,
        Errors.NOT_LEADER_OR_FOLLOWER,  # KAFKA-13574: lost leadership while acks=all waited
        Errors.REQUEST_TIMED_OUT,  # the purgatory timed out after the append
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,  # appended, ISR below min at completion
        Errors.KAFKA_STORAGE_ERROR,  # a log directory failed, perhaps mid-append
        NETWORK_EXCEPTION,  # the request may have arrived
    }
)


def is_retriable(code: int) -> bool:
    return code in RETRIABLE


def code_name(code: int) -> str:
    if code == NETWORK_EXCEPTION:
        return "NETWORK_EXCEPTION"
    try:
        return Errors(code).name
    except ValueError:
        return f"ERROR_{code}"


@dataclass(frozen=True, slots=True)
class DeliveryError:
    """Why a record's send failed: Kafka's error name and code (-1 for the
    client's own, such as a delivery timeout), a message naming what and
    where, and whether the records are definitely not in the log."""

    name: str
    code: int
    message: str
    outcome: Outcome

    def __post_init__(self) -> None:
        if self.outcome is Outcome.OK:
            raise ValueError("a delivery error's outcome is fail or info, not ok")

    def __str__(self) -> str:
        return f"{self.name}: {self.message} ({self.outcome.value})"


class ProducerClosedError(Exception):
    """The producer is closed: it takes no more records."""


class RecordTooLargeError(ValueError):
    """A record larger than ``max.request.size`` or ``buffer.memory``
    (Kafka's ``RecordTooLargeException``, refused before it is queued)."""


class BufferExhaustedError(Exception):
    """``buffer.memory`` is full: the caller waits for batches to complete
    (up to ``max.block.ms``) and appends again (Kafka's ``BufferPool``
    blocking, then ``BufferExhaustedException``)."""


class BrokerClientError(Exception):
    """A broker refused a request, or a request could not be completed:
    ``code`` is Kafka's error code (``broker.errors.Errors``, -1 for the
    client's own), ``message`` names what and where. (What the gRPC
    clients raise; ``broker.grpc_client.errors`` exports it.)"""

    def __init__(self, code: int, message: str, name: str | None = None) -> None:
        self.name = name or code_name(code)
        super().__init__(f"{self.name}: {message}")
        self.code = code
        self.message = message


class TransactionStateError(BrokerClientError):
    """A transactional call made in a state that does not allow it (Kafka's
    ``IllegalStateException``): ``begin_transaction`` twice, ``send``
    outside a transaction or before ``init_transactions``, a commit while
    an abort is under way. Nothing was done; the producer's state is
    unchanged."""

    def __init__(self, message: str) -> None:
        super().__init__(CLIENT_ERROR, message, "IllegalStateException")


class TransactionFatalError(BrokerClientError):
    """The transactional producer cannot go on (Kafka's ``FATAL_ERROR``
    state): every later call raises it again and every record not yet
    complete fails; only ``close`` is left. ``code`` is the answer that
    made it fatal."""


class ProducerFencedError(TransactionFatalError):
    """Another producer with the same transactional id took over (its
    InitProducerId bumped the epoch): Kafka's ``ProducerFencedException``,
    for ``PRODUCER_FENCED`` and for ``INVALID_PRODUCER_EPOCH`` from the
    transaction coordinator."""


class InvalidProducerEpochError(ProducerFencedError):
    """A partition's leader refused a transactional batch with
    ``INVALID_PRODUCER_EPOCH``: the epoch was ended under the producer (the
    coordinator aborted the transaction on its timeout, or another producer
    fenced it), so with an epoch bumped at every end (KIP-890) the producer
    is fenced."""


class TransactionAbortableError(BrokerClientError):
    """The current transaction cannot commit (Kafka's ``ABORTABLE_ERROR``
    state): a send failed definitively inside it, a partition or the
    group's offsets could not join it. The application calls
    ``abort_transaction`` and may then begin another. ``code`` and the
    message are those of the failure."""

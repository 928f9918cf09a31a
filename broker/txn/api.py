"""What the transaction coordinator's core takes and answers: the answers
of ``InitProducerId``, ``AddPartitionsToTxn``, ``AddOffsetsToTxn``,
``EndTxn`` and the admin reads, the markers the runtime must write, and
the producer-id allocator it draws new ids from.

Errors are :class:`broker.errors.Errors`; a refusal carries a message
naming what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from broker.coordinator_result import CoordinatorRefusal, CoordinatorResult
from broker.errors import Errors
from broker.txn.records import TxnRecord
from broker.txn.types import TRANSACTION_VERSION, Partitions, TransactionState

__all__ = [
    "AddPartitionsResponse",
    "CompleteTxnResponse",
    "EndTxnResponse",
    "InitProducerIdResponse",
    "PendingMarkers",
    "ProducerIdAllocator",
    "Result",
    "TransactionDescription",
    "TransactionListing",
    "TxnError",
    "TxnMarker",
    "verification_error",
]

T = TypeVar("T")


class TxnError(CoordinatorRefusal):
    """A refusal of a whole transactional request: ``code`` and a message
    naming why."""


@dataclass(frozen=True, slots=True)
class Result(CoordinatorResult[TxnRecord, T]):
    """A decision of the transaction coordinator: its records and its answer."""


class ProducerIdAllocator(Protocol):
    """One new producer id per call, never one given before (the broker's
    block of ids from the controller, KIP-730).  The runtime keeps ids at
    hand so that deciding never waits; an id drawn for a decision whose
    records are never written is skipped, as Kafka skips it.  Synchronous,
    unlike :class:`broker.producer_ids.ProducerIdSource`, the async seam a
    runtime would draw its ids at hand from."""

    def next_producer_id(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT or ABORT control batch to write to one partition of a
    transaction (``WriteTxnMarkersRequest``'s ``TxnMarkerEntry``, one
    partition): with the transaction's bumped epoch, so that the partition
    fences the ended epoch's late writes (KIP-890 part 2).
    ``transaction_version`` 2 says so to the partition, which then refuses
    a marker not past the epoch of the transaction open there (a late copy
    of an earlier transaction's, KAFKA-19446); 0 and 1 (an administrator's
    abort of a hanging transaction, a version 1 end) are checked only for
    older epochs."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    transaction_version: int = 0

    @property
    def bumps_epoch(self) -> bool:
        return self.transaction_version >= TRANSACTION_VERSION


@dataclass(frozen=True, slots=True)
class PendingMarkers:
    """A transaction in PREPARE_COMMIT or PREPARE_ABORT: the markers the
    runtime must write, after which it calls
    :meth:`~broker.txn.coordinator.TransactionCoordinatorShard.complete_txn`
    with this transaction's id, producer id and epoch (Kafka's
    ``TransactionMarkerChannelManager.addTxnMarkersToSend`` and its
    completion)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    # Sorted by (topic, partition); empty for the abort of a transaction
    # with no partitions (complete it at once).
    markers: tuple[TxnMarker, ...]


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse:
    error: Errors
    message: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    # The fence of an ongoing transaction: its abort's markers.
    pending: PendingMarkers | None = None


@dataclass(frozen=True, slots=True)
class AddPartitionsResponse:
    error: Errors
    message: str = ""


@dataclass(frozen=True, slots=True)
class EndTxnResponse:
    """``EndTxnResponse`` v5 (KIP-890 part 2): the producer id and epoch the
    producer continues with."""

    error: Errors
    message: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    pending: PendingMarkers | None = None


@dataclass(frozen=True, slots=True)
class CompleteTxnResponse:
    error: Errors
    message: str = ""


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """``ListTransactionsResponse.TransactionState``."""

    transactional_id: str
    producer_id: int
    state: TransactionState


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """``DescribeTransactionsResponse.TransactionState``."""

    error: Errors
    transactional_id: str
    message: str = ""
    state: TransactionState | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = 0
    start_ms: int = -1
    partitions: Partitions = frozenset()


# What a failed KIP-890 verification answered, as the write it refused
# answers it: the coordinator's own troubles are retriable for the producer
# (NOT_ENOUGH_REPLICAS, a definite failure it retries), a fenced producer is
# INVALID_PRODUCER_EPOCH as the partition's own epoch check would say.
_AS_WRITE_ERROR = {
    Errors.NOT_COORDINATOR: Errors.NOT_ENOUGH_REPLICAS,
    Errors.COORDINATOR_NOT_AVAILABLE: Errors.NOT_ENOUGH_REPLICAS,
    Errors.COORDINATOR_LOAD_IN_PROGRESS: Errors.NOT_ENOUGH_REPLICAS,
    Errors.CONCURRENT_TRANSACTIONS: Errors.NOT_ENOUGH_REPLICAS,
    Errors.REQUEST_TIMED_OUT: Errors.NOT_ENOUGH_REPLICAS,
    Errors.UNKNOWN_SERVER_ERROR: Errors.NOT_ENOUGH_REPLICAS,
    Errors.PRODUCER_FENCED: Errors.INVALID_PRODUCER_EPOCH,
}


def verification_error(error: Errors) -> Errors:
    """A failed verification's error as the write it refused answers it
    (a produce's, a TxnOffsetCommit's)."""
    return _AS_WRITE_ERROR.get(error, error)

"""Finding hanging transactions, the decision without I/O (Kafka's
``FindHangingTransactionsCommand``, KIP-664), and what the transactions
admin reads from the brokers.

A hanging transaction is one a partition still has open (its producer's
``current_txn_start_offset`` >= 0) that no coordinator will ever end: its
last stable offset stops there, and every ``read_committed`` reader with
it.  The admin (``broker.grpc_client.txn_admin``) finds them in three
steps, the I/O between them its own:

1. :func:`candidates`: from each partition leader's producers
   (DescribeProducers), the open transactions whose producer last wrote
   longer ago than the longest transaction timeout a coordinator allows
   (``transaction.max.timeout.ms``): a healthy transaction cannot be that
   old, since its coordinator would have aborted it.
2. ListTransactions filtered by the candidates' producer ids names each
   one's transactional id; DescribeTransactions describes those ids.
3. :func:`hanging_reason`, over each candidate: hanging unless its
   producer id still belongs to a transactional id whose transaction is
   Ongoing, PrepareCommit or PrepareAbort with this partition in it (the
   coordinator will end it: its markers are still to come).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.client.producer_batch import TopicPartition

__all__ = [
    "ACTIVE_STATES",
    "DEFAULT_MAX_TRANSACTION_TIMEOUT_MS",
    "TRANSACTION_STATES",
    "HangingTransaction",
    "OpenTransaction",
    "ProducerState",
    "TransactionDescription",
    "TransactionListing",
    "candidates",
    "hanging_reason",
    "select_hanging",
]

# Kafka's transaction state names (TransactionState.stateName), as the
# coordinators answer them and as ListTransactions filters by them.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)

# The states in which the coordinator still has the transaction's markers
# to write: a partition it names will see its marker.
ACTIVE_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort"})

# Kafka's transaction.max.timeout.ms default (kq's transaction.max_timeout_ms).
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000


@dataclass(frozen=True, slots=True)
class ProducerState:
    """A producer as a partition's leader has it (DescribeProducers,
    Kafka's ``ProducerState``); -1 for none in ``last_sequence``,
    ``coordinator_epoch`` and ``current_txn_start_offset``."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_start_offset >= 0


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """One transaction of ListTransactions (Kafka's
    ``TransactionListing``), with the broker that listed it: its
    coordinator."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id as its coordinator describes it (Kafka's
    ``TransactionDescription``); ``transaction_start_time_ms`` is -1 when
    no transaction is open."""

    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A producer's transaction open in one partition."""

    partition: TopicPartition
    producer: ProducerState

    @property
    def start_offset(self) -> int:
        return self.producer.current_txn_start_offset

    def duration_ms(self, now_ms: int) -> int:
        """How long ago its producer last wrote to the partition."""
        return now_ms - self.producer.last_timestamp


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """An open transaction no coordinator will end, and why."""

    transaction: OpenTransaction
    reason: str


def candidates(
    producers: Mapping[TopicPartition, Iterable[ProducerState]],
    now_ms: int,
    max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
) -> list[OpenTransaction]:
    """The open transactions whose producer last wrote more than
    ``max_transaction_timeout_ms`` before ``now_ms`` (wall-clock ms, as the
    batches' timestamps), by partition and producer id."""
    if max_transaction_timeout_ms < 0:
        raise ValueError(
            f"max_transaction_timeout_ms must be >= 0, not {max_transaction_timeout_ms}"
        )
    out = [
        OpenTransaction(tp, state)
        for tp, states in producers.items()
        for state in states
        if state.has_open_transaction and now_ms - state.last_timestamp > max_transaction_timeout_ms
    ]
    return sorted(out, key=lambda t: (t.partition, t.producer.producer_id))


def hanging_reason(
    candidate: OpenTransaction,
    transactional_id: str | None,
    description: TransactionDescription | None,
) -> str | None:
    """Why ``candidate`` hangs, or None if its coordinator will end it.
    ``transactional_id`` is the id ListTransactions names for its producer
    id (None: no coordinator knows the producer); ``description`` that
    id's description (None: the id no longer exists)."""
    producer_id = candidate.producer.producer_id
    if transactional_id is None:
        return f"no transactional id has producer id {producer_id}"
    if description is None:
        return f"transactional id {transactional_id!r} no longer exists"
    if description.producer_id != producer_id:
        return (
            f"transactional id {transactional_id!r} moved on to producer id "
            f"{description.producer_id}"
        )
    if description.state not in ACTIVE_STATES:
        return f"transactional id {transactional_id!r} is {description.state}"
    if candidate.partition not in description.partitions:
        return (
            f"the {description.state} transaction of {transactional_id!r} does not include "
            f"{candidate.partition}"
        )
    return None


def select_hanging(
    found: Iterable[OpenTransaction],
    transactional_ids: Mapping[int, str],
    descriptions: Mapping[str, TransactionDescription | None],
) -> list[HangingTransaction]:
    """The candidates that hang (:func:`hanging_reason`), in their order;
    ``transactional_ids`` maps producer ids to ids, ``descriptions`` ids to
    their description (None or missing: the id no longer exists)."""
    out = []
    for candidate in found:
        tid = transactional_ids.get(candidate.producer.producer_id)
        description = None if tid is None else descriptions.get(tid)
        reason = hanging_reason(candidate, tid, description)
        if reason is not None:
            out.append(HangingTransaction(candidate, reason))
    return out

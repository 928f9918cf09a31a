"""The shapes the transaction coordinator's core shares: the states of a
transactional id with the transitions Kafka allows between them
(``TransactionState.java``), partitions as (topic name, partition), and
the producer-id and epoch limits of ``RecordBatch``/``TransactionMetadata``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_PRODUCER_EPOCH",
    "MAX_TRANSACTIONAL_ID",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "TRANSACTION_VERSION",
    "Partitions",
    "TopicPartition",
    "TransactionState",
    "is_epoch_exhausted",
    "by_topic",
]

# RecordBatch.NO_PRODUCER_ID / NO_PRODUCER_EPOCH.
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
# Short.MAX_VALUE: a producer epoch is an int16.
MAX_PRODUCER_EPOCH: Final = 2**15 - 1
# The longest transactional id kq takes (the group ids' limit; Kafka sets
# none but the record size's).
MAX_TRANSACTIONAL_ID: Final = 255
# The transaction version the coordinator speaks (KIP-890 part 2's
# TV_2: every EndTxn bumps the epoch).  Written in every record as Kafka's
# ClientTransactionVersion.
TRANSACTION_VERSION: Final = 2


def is_epoch_exhausted(epoch: int) -> bool:
    """``TransactionMetadata.isEpochExhausted``: one bump below the int16's
    top is the last, since an epoch fence may need one more."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


class TransactionState(enum.IntEnum):
    """A transactional id's state, with Kafka's ids (the int8 of
    ``TransactionLogValue.TransactionStatus``)."""

    # No transaction in progress (after InitProducerId).
    EMPTY = 0
    # Partitions have been added: a transaction is open.
    ONGOING = 1
    # EndTxn(commit) is logged; the markers are being written.
    PREPARE_COMMIT = 2
    # EndTxn(abort), a timeout or a fence is logged; the markers are being
    # written.
    PREPARE_ABORT = 3
    # Every marker of the commit is written.
    COMPLETE_COMMIT = 4
    # Every marker of the abort is written.
    COMPLETE_ABORT = 5
    # The id expired (transactional.id.expiration.ms): its key is deleted.
    DEAD = 6
    # Kafka's in-memory step before a fence's PREPARE_ABORT; never logged
    # (kq writes the fence's PREPARE_ABORT at once).
    PREPARE_EPOCH_FENCE = 7

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        """``TransactionState.validPreviousStates``."""
        return _VALID_PREVIOUS[self]

    def can_follow(self, previous: TransactionState) -> bool:
        return previous in _VALID_PREVIOUS[self]

    @property
    def is_prepare(self) -> bool:
        return self in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

    @property
    def kafka_name(self) -> str:
        """The name ``kafka-transactions describe`` prints (``stateName``)."""
        return "".join(part.capitalize() for part in self.name.split("_"))


_S = TransactionState
_ENDED = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})
_VALID_PREVIOUS: Final[dict[TransactionState, frozenset[TransactionState]]] = {
    _S.EMPTY: _ENDED,
    _S.ONGOING: _ENDED | {_S.ONGOING},
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    # KIP-890 part 2: an abort may follow an ended transaction (the client
    # aborts one whose partitions the coordinator never heard of).
    _S.PREPARE_ABORT: _ENDED | {_S.ONGOING, _S.PREPARE_EPOCH_FENCE},
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: _ENDED,
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A partition of a transaction, by topic name (the transaction log
    names topics, as ``TransactionLogValue.TransactionPartitions`` does)."""

    topic: str
    partition: int


Partitions = frozenset[TopicPartition]


def by_topic(partitions: Partitions) -> dict[str, tuple[int, ...]]:
    """``partitions`` grouped by topic, topics and partitions sorted (the
    record's layout)."""
    out: dict[str, list[int]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(tp.partition)
    return {topic: tuple(sorted(parts)) for topic, parts in sorted(out.items())}

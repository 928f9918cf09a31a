"""The records of the transaction log (``__transaction_state``), as the
transaction coordinator writes and replays them: one key per transactional
id and a value holding the id's whole state, ``None`` for a tombstone (the
id expired).  They follow Kafka's ``TransactionLogKey.json`` and
``TransactionLogValue.json`` (with KIP-890's previous and next producer id
and client transaction version), plus the last producer epoch, which Kafka
keeps only in memory and forgets on a load.

The last value of each key is the whole truth: replaying a log and
replaying its compaction build the same transactions.  Their bytes are
:mod:`broker.txn.codec`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.txn.types import Partitions, TransactionState

__all__ = ["TransactionLogKey", "TransactionLogValue", "TxnRecord"]


@dataclass(frozen=True, slots=True)
class TransactionLogKey:
    transactional_id: str


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    # The producer id the transactional id writes with.
    producer_id: int
    # The producer id before the last rotation (an exhausted epoch): a
    # retry of the request that rotated it carries it (KIP-890).
    previous_producer_id: int
    # The producer id a PREPARE_* of an exhausted epoch rotates to once it
    # completes (KIP-890 part 2), else -1.
    next_producer_id: int
    producer_epoch: int
    # The epoch before the last bump, so that a retry of the request that
    # bumped it (InitProducerId with KIP-360's expected epoch, EndTxn with
    # KIP-890's) is told the outcome instead of being fenced; -1 after a
    # fence, whose old epoch must not pass as a retry.
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    # The partitions of the open or completing transaction.
    partitions: Partitions
    last_update_ms: int
    # When the first partition of the transaction was added, -1 if none.
    start_ms: int
    client_transaction_version: int


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """One record of the transaction log: ``value`` is ``None`` for a
    tombstone."""

    key: TransactionLogKey
    value: TransactionLogValue | None

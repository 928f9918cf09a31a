"""The transactional ids of one transaction log partition, as replaying its
records builds them (Kafka's ``TransactionMetadata`` in
``TransactionStateManager``'s cache).

Replay is the only way state changes, and it is an upsert or a delete of
one id's state: the ids after a log are a function of the last record of
each key, so a compacted log builds the same state as the full one.  Replay
does not check transitions (a compacted log skips states); the coordinator
checks each transition when it decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

from broker.txn.records import TransactionLogKey, TransactionLogValue, TxnRecord
from broker.txn.types import Partitions, TransactionState

__all__ = ["TransactionMetadata", "Transactions"]


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """One transactional id's state: its key and the fields of its last
    value (:class:`~broker.txn.records.TransactionLogValue`)."""

    transactional_id: str
    producer_id: int
    previous_producer_id: int
    next_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: Partitions
    last_update_ms: int
    start_ms: int
    client_transaction_version: int

    @classmethod
    def of(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        return cls(transactional_id, **{f.name: getattr(value, f.name) for f in _VALUE_FIELDS})

    def value(self) -> TransactionLogValue:
        return TransactionLogValue(**{f.name: getattr(self, f.name) for f in _VALUE_FIELDS})

    def record(self) -> TxnRecord:
        """The record whose replay makes this the id's state."""
        return TxnRecord(TransactionLogKey(self.transactional_id), self.value())


_VALUE_FIELDS = fields(TransactionLogValue)


class Transactions:
    """transactional id -> its state, built by :meth:`replay` alone."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[str, TransactionMetadata] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[TransactionMetadata]:
        """By transactional id."""
        for transactional_id in sorted(self._by_id):
            yield self._by_id[transactional_id]

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self._by_id.get(transactional_id)

    def replay(self, record: TxnRecord) -> None:
        transactional_id = record.key.transactional_id
        if record.value is None:
            self._by_id.pop(transactional_id, None)
        else:
            self._by_id[transactional_id] = TransactionMetadata.of(transactional_id, record.value)

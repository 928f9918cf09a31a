"""A transaction coordinator shard driven as its runtime drives it (replay
a decision's records at once), with an in-memory producer-id source and
the log it wrote."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.txn.api import Result
from broker.txn.coordinator import TransactionCoordinatorShard, TxnConfig
from broker.txn.records import TxnRecord
from broker.txn.state import TransactionMetadata, Transactions


class CountingProducerIds:
    """The in-memory twin of the broker's producer-id blocks: ids from
    ``first`` up, each once."""

    def __init__(self, first: int = 1000) -> None:
        self.next = first
        self.given: list[int] = []

    def next_producer_id(self) -> int:
        self.given.append(self.next)
        self.next += 1
        return self.given[-1]


@dataclass
class Log:
    """The transaction log partition as the shard wrote it."""

    records: list[TxnRecord] = field(default_factory=list)

    def apply(self, shard: TransactionCoordinatorShard, result: Result[Any]) -> Result[Any]:
        for record in result.records:
            self.records.append(record)
            shard.replay(record)
        return result


def new_shard(
    first_producer_id: int = 1000, **config: int
) -> tuple[TransactionCoordinatorShard, Log, CountingProducerIds]:
    ids = CountingProducerIds(first_producer_id)
    return TransactionCoordinatorShard(TxnConfig(**config), ids), Log(), ids


def rebuilt(records: Iterable[TxnRecord]) -> Transactions:
    transactions = Transactions()
    for record in records:
        transactions.replay(record)
    return transactions


def compacted(records: list[TxnRecord]) -> list[TxnRecord]:
    """The last record of each key, in log order (tombstones dropped, as
    compaction eventually drops them)."""
    last = {record.key: i for i, record in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key] == i and r.value is not None]


def dump(transactions: Transactions) -> list[TransactionMetadata]:
    return list(transactions)

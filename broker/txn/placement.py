"""Which partition of the transaction log holds a transactional id, as
Kafka places it (``TransactionStateManager.partitionFor``:
``Utils.abs(transactionalId.hashCode) % transactionTopicPartitionCount``,
50 partitions by default), with the group coordinator's hash so that the
two placements cannot drift apart."""

from __future__ import annotations

from broker.group.placement import java_string_hash
from metadata.image import TRANSACTION_STATE_TOPIC

__all__ = ["TRANSACTION_STATE_TOPIC", "partition_for"]


def partition_for(transactional_id: str, partitions: int) -> int:
    """The transaction log partition of ``transactional_id`` (``Utils.abs``
    is ``n & 0x7fffffff``: Integer.MIN_VALUE maps to 0)."""
    if partitions <= 0:
        raise ValueError(f"the transaction log's partition count {partitions} is not positive")
    return (java_string_hash(transactional_id) & 0x7FFFFFFF) % partitions

"""KIP-890 part 1 on the produce path: before a leader appends the first
transactional batch of a producer's transaction to a partition, it asks
the transaction coordinator whether that partition is in the producer's
ongoing transaction at that very epoch (``AddPartitionsToTxn`` with
``verify_only``; Kafka's ``AddPartitionsToTxnManager``).  A batch that
fails is refused before anything is written.

Why: without it, a produce of a transaction that already ended (a delayed
request, a retry, KAFKA-17754's late write) or of a partition the
producer never added opens a transaction in the partition that no marker
will ever end: the last stable offset stops there and every
``read_committed`` reader with it (the hanging transaction).  With
KIP-890 part 2 every end bumps the epoch, so (producer id, epoch) names
one transaction: once its marker is in the partition, the producer
state's epoch check refuses the ended epoch's batches, and a verification
that raced with the marker is refused at the append the same way.

A batch needs no verification when the partition's producer state already
has this producer's transaction open at the batch's epoch (an earlier
batch of it was verified).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import bugs
from broker.errors import Errors
from broker.replica import Role
from broker.replica_manager import ReplicaManager
from broker.txn.api import verification_error
from broker.txn.types import TopicPartition
from bugs import Bug
from partition_log.batch import first_transactional_producer

__all__ = ["TxnVerifier", "verification_error", "verify_produce"]


class TxnVerifier(Protocol):
    """Asks the coordinator of ``transactional_id`` (here or on another
    broker) which of ``partitions`` are in the ongoing transaction of
    ``producer_id`` at ``producer_epoch``.  Every partition gets an answer;
    a coordinator that could not be asked answers them all with why."""

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> Mapping[TopicPartition, tuple[Errors, str]]: ...


def _needs_verification(
    replicas: ReplicaManager, topic: str, partition: int, producer_id: int, epoch: int
) -> bool:
    try:
        key = replicas.resolve(topic, partition)
    except Exception:  # the append refuses it with the reason
        return False
    replica = replicas.replicas.get(key)
    if replica is None or replica.role is not Role.LEADER:
        return False
    log = replicas.logs.log(key)
    if log is None:
        return False
    entry = log.producer_state.entry(producer_id)
    if entry is None or entry.current_txn_first_offset < 0:
        return not bugs.on(Bug.NO_TXN_VERIFICATION)
    if entry.epoch == epoch:
        return False
    # The open transaction is of another epoch: the batch's own is not open
    # here, so the coordinator must say (and refuses an older epoch).  B22
    # takes the open transaction for the batch's (KAFKA-18042's rule: the
    # epoch, not just the producer id, names the transaction).
    if epoch < entry.epoch and bugs.on(Bug.FENCED_EPOCH_PRODUCE):
        return False
    return not bugs.on(Bug.NO_TXN_VERIFICATION)


async def verify_produce(
    request: Any, replicas: ReplicaManager, verifier: TxnVerifier | None
) -> dict[tuple[str, int], tuple[Errors, str]]:
    """The partitions of a ``ProduceRequest`` refused before the append,
    with the produce's error and why: transactional batches without the
    request's transactional id, or whose transaction the coordinator does
    not have the partition in."""
    refused: dict[tuple[str, int], tuple[Errors, str]] = {}
    wanted: dict[tuple[int, int], list[TopicPartition]] = {}
    for topic in request.topics:
        for part in topic.partitions:
            producer = first_transactional_producer(part.records)
            if producer is None:
                continue
            if not request.transactional_id:
                refused[(topic.name, part.partition)] = (
                    Errors.INVALID_RECORD,
                    "a transactional batch in a request without a transactional_id",
                )
            elif _needs_verification(replicas, topic.name, part.partition, *producer):
                wanted.setdefault(producer, []).append(TopicPartition(topic.name, part.partition))
    for (producer_id, epoch), partitions in wanted.items():
        if verifier is None:
            found: Mapping[TopicPartition, tuple[Errors, str]] = dict.fromkeys(
                partitions,
                (Errors.COORDINATOR_NOT_AVAILABLE, "this broker has no transaction coordinator"),
            )
        else:
            found = await verifier.verify(request.transactional_id, producer_id, epoch, partitions)
        for tp in partitions:
            error, message = found.get(
                tp, (Errors.UNKNOWN_SERVER_ERROR, "the coordinator's answer left it out")
            )
            if error is Errors.NONE:
                continue
            refused[(tp.topic, tp.partition)] = (
                verification_error(error),
                f"the transaction coordinator did not verify producer {producer_id} epoch "
                f"{epoch} in {tp.topic}-{tp.partition} ({error.name}): {message}",
            )
    return refused

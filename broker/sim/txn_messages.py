"""The messages of the transaction simulation (:mod:`broker.sim.txn`):
what producers ask the coordinator and the partition leaders, what a
leader asks the coordinator (KIP-890 part 1's verification), the markers
the coordinator asks leaders to write, and their answers.

Every request carries an ``attempt`` number: a producer that sends a
request again uses a new one and waits only for that one's answer (a
timed-out request's connection is closed: its answer is never read)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import Errors
from broker.sim.cluster import ExtraBody
from broker.txn.api import TxnMarker

__all__ = [
    "AddPartitionsRequest",
    "ClientTimer",
    "CoordinatorAnswer",
    "EndTxnRequest",
    "InitPidRequest",
    "MarkerAnswer",
    "MarkerRequest",
    "ProduceAnswer",
    "TxnBody",
    "TxnProduce",
    "TxnRequest",
    "VerifyAnswer",
    "VerifyRequest",
]


class TxnBody(ExtraBody):
    """A message of the transaction simulation."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class InitPidRequest:
    transactional_id: str
    timeout_ms: int
    # KIP-360: the id and epoch of a producer that recovers (-1: a new one).
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AddPartitionsRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    # The client's name of the transaction it ends (for traces and the
    # checker; the coordinator never reads it).
    txn: tuple[str, int, int]


CoordinatorRequest = InitPidRequest | AddPartitionsRequest | EndTxnRequest


@dataclass(frozen=True, slots=True)
class TxnRequest(TxnBody):
    """A producer's request to the coordinator of its transactional id."""

    attempt: int
    producer: int
    request: CoordinatorRequest


@dataclass(frozen=True, slots=True)
class CoordinatorAnswer(TxnBody):
    attempt: int
    producer: int
    error: Errors
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TxnProduce(TxnBody):
    """A producer's transactional batch for one partition (acks=all)."""

    attempt: int
    producer: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    base_sequence: int
    partition: int
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProduceAnswer(TxnBody):
    attempt: int
    producer: int
    error: Errors
    offset: int = -1


@dataclass(frozen=True, slots=True)
class VerifyRequest(TxnBody):
    """A leader asks the coordinator whether ``partition`` is in the
    ongoing transaction of this producer id and epoch (KIP-890 part 1)."""

    verification: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partition: int


@dataclass(frozen=True, slots=True)
class VerifyAnswer(TxnBody):
    verification: int
    error: Errors


@dataclass(frozen=True, slots=True)
class MarkerRequest(TxnBody):
    """WriteTxnMarkers for one partition, stamped with the coordinator
    epoch (the leader epoch of the coordinator's transaction-state
    partition)."""

    transactional_id: str
    marker: TxnMarker
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class MarkerAnswer(TxnBody):
    transactional_id: str
    marker: TxnMarker
    error: Errors


@dataclass(frozen=True, slots=True)
class ClientTimer(TxnBody):
    """The clients' own periodic reminder (a message to themselves)."""

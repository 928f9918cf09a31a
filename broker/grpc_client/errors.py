"""What the gRPC clients raise: Kafka's error name and code with the
broker's message, and, for a record's delivery, whether it is definitely not
in the log (``fail``) or may be (``info``), as ``broker.client.errors``
reads every answer."""

from __future__ import annotations

from broker.client.errors import (
    BrokerClientError,
    DeliveryError,
    InvalidProducerEpochError,
    Outcome,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionFatalError,
    TransactionStateError,
)
from broker.errors import Errors

__all__ = [
    "BrokerClientError",
    "DeliveryFailedError",
    "InvalidProducerEpochError",
    "NoBrokerError",
    "ProducerFencedError",
    "TransactionAbortableError",
    "TransactionFatalError",
    "TransactionStateError",
    "UnknownTopicError",
]


class NoBrokerError(BrokerClientError):
    """No broker answered before the deadline: nothing was done."""

    def __init__(self, message: str) -> None:
        super().__init__(int(Errors.BROKER_NOT_AVAILABLE), message)


class UnknownTopicError(BrokerClientError):
    """The brokers' metadata has no such topic."""

    def __init__(self, topic: str, message: str | None = None) -> None:
        super().__init__(
            int(Errors.UNKNOWN_TOPIC_OR_PARTITION),
            message or f"topic {topic!r} does not exist",
        )
        self.topic = topic


class DeliveryFailedError(BrokerClientError):
    """A record's send failed. ``outcome`` says what that tells about the
    record: ``Outcome.FAIL`` definitely not in the log, ``Outcome.INFO``
    unknown (it may be, or later become, committed; docs/clients.md)."""

    def __init__(self, error: DeliveryError) -> None:
        super().__init__(error.code, f"{error.message} ({error.outcome.value})", error.name)
        self.error = error
        self.outcome: Outcome = error.outcome

    @property
    def definite(self) -> bool:
        """True if the record is definitely not in the log."""
        return self.outcome is Outcome.FAIL

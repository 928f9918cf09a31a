"""Errors of the partition log, with the names and numbers of Kafka's
``Errors.java`` (../docs/partition-log.md), so a broker answers with the code
a Kafka client knows.

Every refusal is a :class:`PartitionLogError` carrying its :class:`Errors`
code and a message naming what was wrong (the offset, the field, the file);
a refused call changes nothing, in memory or on disk.
"""

from __future__ import annotations

import enum

__all__ = ["Errors", "PartitionLogError"]


class Errors(enum.IntEnum):
    """Kafka's error codes that the partition log can answer (Errors.java)."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    # A batch larger than the log takes (MESSAGE_TOO_LARGE in Errors.java),
    # also a compressed batch that expands past the decoder's limit.
    MESSAGE_TOO_LARGE = 10
    # A batch whose CRC, size or fields do not hold (retriable for a client:
    # the bytes were damaged on their way).
    CORRUPT_MESSAGE = 2
    INVALID_RECORD = 87
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    # A non-transactional batch from a producer whose transaction is open.
    INVALID_TXN_STATE = 48
    # A transaction marker from a coordinator older than the last one seen.
    TRANSACTION_COORDINATOR_FENCED = 52
    UNKNOWN_PRODUCER_ID = 59
    KAFKA_STORAGE_ERROR = 56
    # A batch compressed with a codec whose package is not installed, KIP-110.
    UNSUPPORTED_COMPRESSION_TYPE = 76


class PartitionLogError(Exception):
    """A refusal of the partition log: ``code`` says which, the message what
    was wrong."""

    def __init__(self, code: Errors, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.args[0]}"

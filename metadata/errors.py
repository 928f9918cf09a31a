"""Error codes of the metadata layer, and the exception that carries one.

The numbers are part of the wire contract: ``proto/kqproto/metadata.proto``'s
``MetadataError`` enum mirrors them one for one (a test checks).  Names
follow Kafka's error codes where Kafka has one for the same condition.
"""

from __future__ import annotations

import enum

__all__ = ["ApiError", "Errors"]


class Errors(enum.IntEnum):
    NONE = 0
    # This controller is not the active one (see the leader hint).
    NOT_CONTROLLER = 1
    # The request is malformed; the message names the field.
    INVALID_REQUEST = 2
    TOPIC_ALREADY_EXISTS = 3
    UNKNOWN_TOPIC_OR_PARTITION = 4
    INVALID_TOPIC_NAME = 5
    INVALID_PARTITIONS = 6
    INVALID_REPLICATION_FACTOR = 7
    INVALID_REPLICA_ASSIGNMENT = 8
    INVALID_CONFIG = 9
    # A conditional config update found another current value.
    CONFIG_PRECONDITION_FAILED = 10
    # A broker id that is not registered.
    BROKER_ID_NOT_REGISTERED = 11
    # A registration of a new incarnation while the old one's session lives.
    DUPLICATE_BROKER_REGISTRATION = 12
    # The broker epoch in a request is not the broker's current one.
    STALE_BROKER_EPOCH = 13
    # AlterPartition: the leader epoch is older than the partition's.
    FENCED_LEADER_EPOCH = 14
    # AlterPartition: the leader epoch is newer than the controller knows.
    UNKNOWN_LEADER_EPOCH = 15
    # AlterPartition: the partition epoch is older than the partition's.
    INVALID_UPDATE_VERSION = 16
    # AlterPartition: the partition epoch is newer than the controller knows.
    UNKNOWN_PARTITION_EPOCH = 17
    # AlterPartition: a proposed ISR member is not registered, is fenced or
    # is shutting down (KIP-841), or its broker epoch does not match.
    INELIGIBLE_REPLICA = 18
    # AlterPartition from a broker that does not lead the partition.
    NOT_LEADER_OR_FOLLOWER = 19
    # Elections.
    PREFERRED_LEADER_NOT_AVAILABLE = 20
    ELECTION_NOT_NEEDED = 21
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 22
    # Reassignment.
    NO_REASSIGNMENT_IN_PROGRESS = 23
    # The write's outcome is unknown: it may or may not have committed.
    INDETERMINATE = 24
    # The controller did not finish in time; nothing was written.
    REQUEST_TIMED_OUT = 25
    # The controller is overloaded; nothing was written, retry later.
    THROTTLING = 26
    UNSUPPORTED_VERSION = 27
    INVALID_FEATURE_UPDATE = 28
    # A broker that must be unfenced (and not shutting down) for this.
    BROKER_NOT_AVAILABLE = 29
    UNKNOWN_SERVER_ERROR = 30


class ApiError(Exception):
    """A request refused with an error code and a message for people."""

    def __init__(self, code: Errors, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ApiError({self.code.name}, {self.message!r})"

"""The data plane's error codes, with the names and numbers of Kafka's
``Errors.java`` (brokers.md §6.3), so that a broker answers with the code a
Kafka client knows.

Every member of :class:`partition_log.errors.Errors` is here under the same
name and number (tested), and :func:`from_partition_log_error` maps a
refusal of the log to the code the broker answers with. The metadata layer's
own codes (``metadata.errors``) are kq's, not Kafka's; AlterPartition errors
reach the replica state machine under the Kafka names below
(:func:`from_name`).
"""

from __future__ import annotations

import enum

from partition_log.errors import PartitionLogError

__all__ = ["Errors", "ReplicaError", "from_name", "from_partition_log_error"]


class Errors(enum.IntEnum):
    """Kafka's error codes (Errors.java) that brokers answer or handle."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    # Fetch below the log start or past the LEO; an epoch whose end the
    # leader cannot tell (Partition.readRecords).
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    # OffsetCommit metadata longer than offset.metadata.max.bytes.
    OFFSET_METADATA_TOO_LARGE = 12
    # The group coordinator is rebuilding its groups from the offsets
    # partition (CoordinatorRuntime's loading state).
    COORDINATOR_LOAD_IN_PROGRESS = 14
    # The offsets topic is not there yet, or a write to it could not reach
    # its ISR in time (GroupCoordinatorService maps timeouts to this).
    COORDINATOR_NOT_AVAILABLE = 15
    # This broker does not lead the group's offsets partition.
    NOT_COORDINATOR = 16
    # A topic name outside the rules (Kafka's InvalidTopicException).
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    # acks=all refused before the append: ISR below min.insync.replicas.
    NOT_ENOUGH_REPLICAS = 19
    # Appended and committed, but the ISR shrank below min ISR meanwhile.
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    # A transactional request in a state that does not allow it (EndTxn's
    # commit of an aborting transaction, ...).
    INVALID_TXN_STATE = 48
    # The producer id is not the transactional id's current one.
    INVALID_PRODUCER_ID_MAPPING = 49
    # InitProducerId's timeout is not in (0, transaction.max.timeout.ms].
    INVALID_TRANSACTION_TIMEOUT = 50
    # The transactional id's last transaction is still being completed
    # (retriable: the client backs off and retries).
    CONCURRENT_TRANSACTIONS = 51
    # A transaction marker from a coordinator older than the partition's
    # last one (a replaced coordinator's).
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    # AlterPartition: the controller promises it did not apply the change.
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    UNKNOWN_PRODUCER_ID = 59
    # DeleteGroups of a group that still has members.
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    # ListOffsets(latest) on a new leader whose HW is below its epoch start
    # (KIP-207).
    OFFSET_NOT_AVAILABLE = 78
    GROUP_MAX_SIZE_REACHED = 81
    # A static member's instance id now belongs to another member id.
    FENCED_INSTANCE_ID = 82
    # OffsetDelete of a partition whose topic the group still subscribes to.
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    # OffsetFetch with require_stable (KIP-447) of a partition whose group has
    # a transactional offset commit not yet committed or aborted.
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    # A newer producer with the same transactional id took over.
    PRODUCER_FENCED = 90
    INVALID_UPDATE_VERSION = 95
    UNKNOWN_TOPIC_ID = 100
    # A fetch naming a topic id other than the topic's current one.
    INCONSISTENT_TOPIC_ID = 103
    # DescribeTransactions of a transactional id the coordinator does not have.
    TRANSACTIONAL_ID_NOT_FOUND = 105
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108
    # KIP-848: a member whose epoch is ahead of or unknown to the group must
    # give up its partitions and rejoin with epoch 0.
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    # KIP-848: an OffsetCommit whose member epoch is not the member's
    # current one (the member must refresh its epoch by a heartbeat).
    STALE_MEMBER_EPOCH = 113


class ReplicaError(Exception):
    """A refusal of the replica state machine: ``code`` says which, the
    message what was wrong. Nothing was changed."""

    def __init__(self, code: Errors, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.args[0]}"


def from_partition_log_error(error: PartitionLogError) -> Errors:
    """The broker's code for a refusal of the partition log: the same name
    and number."""
    return Errors[error.code.name]


def from_name(name: str) -> Errors:
    """The code named ``name`` (an error from another layer under Kafka's
    name, e.g. an AlterPartition answer); a name Kafka's brokers do not
    answer is refused, naming it."""
    try:
        return Errors[name]
    except KeyError:
        raise ValueError(f"no data-plane error code is named {name!r}") from None

"""The replica state machine of one partition: the leader's and the
follower's rules of Kafka's ISR replication (``Partition.scala``,
``ReplicaFetcherThread``), pure, over a :class:`~broker.replica.seam.ReplicaLog`."""

from broker.replica.partition import LeaderAppend, PartitionReplica
from broker.replica.seam import BrokerView, MappingBrokerView, ReplicaLog
from broker.replica.types import (
    AcksCheck,
    AlterPartitionRequest,
    AlterPartitionResult,
    BrokerState,
    DeleteRecordsCheck,
    DeleteRecordsResult,
    DivergingEpoch,
    FetchAnswer,
    FetcherConfig,
    FetchRequest,
    FollowerOutcome,
    FollowerStep,
    LeaderFetchOutcome,
    ReplicaConfig,
    Restart,
    Role,
    Truncation,
)

__all__ = [
    "AcksCheck",
    "AlterPartitionRequest",
    "AlterPartitionResult",
    "BrokerState",
    "BrokerView",
    "DeleteRecordsCheck",
    "DeleteRecordsResult",
    "DivergingEpoch",
    "FetchAnswer",
    "FetchRequest",
    "FetcherConfig",
    "FollowerOutcome",
    "FollowerStep",
    "LeaderAppend",
    "LeaderFetchOutcome",
    "MappingBrokerView",
    "PartitionReplica",
    "ReplicaConfig",
    "ReplicaLog",
    "Restart",
    "Role",
    "Truncation",
]

"""kq's consensus layer: KRaft (KIP-595, KIP-996, KIP-630) as a pure core.

The public API of the core; drivers (gRPC, RocksDB) wrap it without changing
it.  See ``docs/quorum.md`` for the protocol as implemented.
"""

from quorum.config import QuorumConfig
from quorum.core import (
    InvalidProposalError,
    NotLeaderError,
    ProposeResult,
    RaftCore,
    ReadBarrier,
    ReplicaStatus,
    SafetyError,
    Status,
)
from quorum.ready import Ready, SnapshotChunk
from quorum.storage import LogStore, QuorumStateStore, SnapshotStore, StorageCorruptError
from quorum.types import (
    Batch,
    BatchKind,
    LeaderAndEpoch,
    LeaderChange,
    NodeId,
    OffsetAndEpoch,
    QuorumState,
    Role,
    SnapshotId,
    VoterSet,
)

__all__ = [
    "Batch",
    "BatchKind",
    "InvalidProposalError",
    "LeaderAndEpoch",
    "LeaderChange",
    "LogStore",
    "NodeId",
    "NotLeaderError",
    "OffsetAndEpoch",
    "ProposeResult",
    "QuorumConfig",
    "QuorumState",
    "QuorumStateStore",
    "RaftCore",
    "ReadBarrier",
    "Ready",
    "ReplicaStatus",
    "Role",
    "SafetyError",
    "SnapshotChunk",
    "SnapshotId",
    "SnapshotStore",
    "Status",
    "StorageCorruptError",
    "VoterSet",
]

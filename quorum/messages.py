"""The messages of the KRaft protocol as the core sees them.

Every message names its sender (``src``) and receiver (``dst``); the transport
never interprets them.  The gRPC contracts in ``proto/kqproto/raft.proto`` carry the
same fields; the driver converts between the two.  The transport may lose,
delay, duplicate or reorder any message (Kafka's ``NetworkChannel`` contract),
so every handler tolerates stale and repeated messages.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from quorum.types import MAX_EPOCH, Batch, NodeId, OffsetAndEpoch, SnapshotId

__all__ = [
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "ErrorCode",
    "FetchRequest",
    "FetchResponse",
    "FetchSnapshotRequest",
    "FetchSnapshotResponse",
    "Message",
    "VoteRequest",
    "VoteResponse",
    "epoch_out_of_range",
]


class ErrorCode(enum.IntEnum):
    NONE = 0
    # The request's epoch is older than the receiver's (Kafka FENCED_LEADER_EPOCH).
    FENCED_LEADER_EPOCH = 1
    # The request's epoch is newer than the receiver knows (UNKNOWN_LEADER_EPOCH).
    UNKNOWN_LEADER_EPOCH = 2
    # The receiver is not the leader of the request's epoch.
    NOT_LEADER = 3
    # FetchSnapshot named a snapshot the leader does not have.
    SNAPSHOT_NOT_FOUND = 4
    # FetchSnapshot asked for a position past the snapshot's end.
    POSITION_OUT_OF_RANGE = 5
    # A voter-only request where the sender or the receiver is not a voter.
    INCONSISTENT_VOTER_SET = 6
    # A field is out of range (a negative offset, a non-positive size).
    INVALID_REQUEST = 7


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """KIP-595 Vote; with ``pre_vote`` it is KIP-996's pre-vote.

    ``epoch`` is the candidate's epoch: for a real vote the new epoch, for a
    pre-vote the prospective's current epoch (nothing is bumped yet).
    ``last_epoch``/``end_offset`` describe the candidate's log.
    """

    src: NodeId
    dst: NodeId
    epoch: int
    last_epoch: int
    end_offset: int
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class VoteResponse:
    """``epoch`` and ``leader_id`` are the responder's view."""

    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId | None
    granted: bool
    pre_vote: bool
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    """The new leader announces itself; needed because replication is
    pull-based and followers would otherwise not know whom to fetch from."""

    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId | None
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    """A resigning leader asks voters to elect a successor; voters earlier in
    ``preferred_successors`` start sooner.  The order: the successors the
    caller of ``resign`` preferred, then the others by log end offset, the
    most caught up first."""

    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId
    preferred_successors: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId | None
    error: ErrorCode = ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Pull replication (KIP-595).  ``fetch_offset`` is the fetcher's log end
    offset and ``last_fetched_epoch`` the epoch of its last batch; ``epoch`` is
    the fetcher's current epoch.  The leader may hold the request up to
    ``max_wait_ms`` when it has nothing new (long poll)."""

    src: NodeId
    dst: NodeId
    epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    max_bytes: int
    # Chosen by the fetcher, unique per request (a counter starting at a
    # random value in each incarnation), echoed in the response: a delayed or
    # duplicated response is never taken for the current one.
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """At most one of ``diverging`` and ``snapshot_id`` is set.

    ``diverging`` names the largest epoch the leader has at or below the
    fetcher's ``last_fetched_epoch`` and its end offset: the fetcher truncates
    to it.  ``snapshot_id`` means the fetcher's log cannot continue from the
    leader's retained log (its fetch offset is below the log start, or at the
    log start with another epoch, or the divergence lies in the compacted
    prefix): fetch that snapshot.  ``request_id`` matches the response to its
    request; ``fetch_offset`` echoes the request for readers of the response.
    """

    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId | None
    error: ErrorCode
    fetch_offset: int
    high_watermark: int
    batches: tuple[Batch, ...] = ()
    diverging: OffsetAndEpoch | None = None
    snapshot_id: SnapshotId | None = None
    log_start_offset: int = 0
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    """KIP-630: read ``snapshot_id`` from ``position`` in chunks."""

    src: NodeId
    dst: NodeId
    epoch: int
    snapshot_id: SnapshotId
    position: int
    max_bytes: int
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    src: NodeId
    dst: NodeId
    epoch: int
    leader_id: NodeId | None
    error: ErrorCode
    snapshot_id: SnapshotId
    position: int
    size: int
    data: bytes = b""
    request_id: int = 0


Message = (
    VoteRequest
    | VoteResponse
    | BeginQuorumEpochRequest
    | BeginQuorumEpochResponse
    | EndQuorumEpochRequest
    | EndQuorumEpochResponse
    | FetchRequest
    | FetchResponse
    | FetchSnapshotRequest
    | FetchSnapshotResponse
)


def _epochs(msg: Message) -> list[tuple[str, int]]:
    """Every epoch a message carries, by field name."""
    out = [("epoch", msg.epoch)]
    match msg:
        case VoteRequest():
            out.append(("last_epoch", msg.last_epoch))
        case FetchRequest():
            out.append(("last_fetched_epoch", msg.last_fetched_epoch))
        case FetchResponse():
            out += [(f"batches[{i}].epoch", b.epoch) for i, b in enumerate(msg.batches)]
            if msg.diverging is not None:
                out.append(("diverging.epoch", msg.diverging.epoch))
            if msg.snapshot_id is not None:
                out.append(("snapshot_id.epoch", msg.snapshot_id.epoch))
        case FetchSnapshotRequest() | FetchSnapshotResponse():
            out.append(("snapshot_id.epoch", msg.snapshot_id.epoch))
    return out


def epoch_out_of_range(msg: Message) -> str | None:
    """Why ``msg`` carries an epoch no node may hold (outside 0..MAX_EPOCH),
    naming the field; None if every epoch in it is in range.  Acting on such
    a message would move a node to an epoch it could never leave (or that
    storage cannot hold), so the core refuses it whole."""
    for name, value in _epochs(msg):
        if not 0 <= value <= MAX_EPOCH:
            return (
                f"{type(msg).__name__} from node {msg.src}: {name} {value} is outside "
                f"0..{MAX_EPOCH} (an epoch is an int32 and a node must be able to leave it)"
            )
    return None

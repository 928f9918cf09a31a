"""Conversion between the core's messages and the gRPC contract.

``proto/kqproto/raft.proto`` mirrors :mod:`quorum.messages` field for field; node
ids that may be absent travel as -1.  Every record batch carries a CRC-32C
that is checked on receipt, and every field is range-checked, so a malformed
or corrupted message is refused with :class:`WireError` naming the problem
before it reaches the core.
"""

from __future__ import annotations

from kqproto import raft_pb2 as pb
from quorum.driver.codec import batch_crc
from quorum.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum.types import MAX_EPOCH, Batch, BatchKind, NodeId, OffsetAndEpoch, SnapshotId

__all__ = ["MAX_EPOCH", "WireError", "from_pb", "to_pb"]

_MAX_NODE = 2**31 - 1


class WireError(ValueError):
    """A message that cannot be a valid protocol message."""


def _nid(value: NodeId | None) -> int:
    return -1 if value is None else value


def _opt_node(value: int, field: str) -> NodeId | None:
    if value == -1:
        return None
    return _node(value, field)


def _node(value: int, field: str) -> NodeId:
    if not 0 <= value <= _MAX_NODE:
        raise WireError(f"{field} must be a node id (0..{_MAX_NODE}), got {value}")
    return value


def _non_negative(value: int, field: str) -> int:
    if value < 0:
        raise WireError(f"{field} must not be negative, got {value}")
    return value


def _epoch(value: int, field: str = "epoch") -> int:
    if not 0 <= value <= MAX_EPOCH:
        raise WireError(f"{field} must be in 0..{MAX_EPOCH}, got {value}")
    return value


def _error(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        raise WireError(f"unknown error code {value}") from None


def batch_to_pb(batch: Batch) -> pb.RecordBatch:
    return pb.RecordBatch(
        base_offset=batch.base_offset,
        epoch=batch.epoch,
        kind=int(batch.kind),  # type: ignore[arg-type]
        records=list(batch.records),
        crc32c=batch_crc(batch),
    )


def batch_from_pb(msg: pb.RecordBatch) -> Batch:
    if not msg.records:
        raise WireError(f"record batch at offset {msg.base_offset} has no records")
    try:
        kind = BatchKind(msg.kind)
    except ValueError:
        raise WireError(
            f"record batch at offset {msg.base_offset}: unknown kind {msg.kind}"
        ) from None
    batch = Batch(
        _non_negative(msg.base_offset, "base_offset"),
        _epoch(msg.epoch, "batch epoch"),
        tuple(msg.records),
        kind,
    )
    if batch_crc(batch) != msg.crc32c:
        raise WireError(f"record batch at offset {batch.base_offset} fails its CRC-32C check")
    return batch


def _snapshot_id(msg: pb.SnapshotId) -> SnapshotId:
    return SnapshotId(
        _non_negative(msg.end_offset, "snapshot end_offset"),
        _epoch(msg.epoch, "snapshot epoch"),
    )


def to_pb(msg: Message, cluster_id: str) -> object:
    """The protobuf form of a core message (requests carry ``cluster_id``)."""
    match msg:
        case VoteRequest():
            return pb.VoteRequest(
                cluster_id=cluster_id,
                src=msg.src,
                dst=msg.dst,
                epoch=msg.epoch,
                last_epoch=msg.last_epoch,
                end_offset=msg.end_offset,
                pre_vote=msg.pre_vote,
            )
        case VoteResponse():
            return pb.VoteResponse(
                src=msg.src,
                dst=msg.dst,
                error=int(msg.error),  # type: ignore[arg-type]
                epoch=msg.epoch,
                leader_id=_nid(msg.leader_id),
                granted=msg.granted,
                pre_vote=msg.pre_vote,
            )
        case BeginQuorumEpochRequest():
            return pb.BeginQuorumEpochRequest(
                cluster_id=cluster_id,
                src=msg.src,
                dst=msg.dst,
                epoch=msg.epoch,
                leader_id=msg.leader_id,
            )
        case BeginQuorumEpochResponse():
            return pb.BeginQuorumEpochResponse(
                src=msg.src,
                dst=msg.dst,
                error=int(msg.error),  # type: ignore[arg-type]
                epoch=msg.epoch,
                leader_id=_nid(msg.leader_id),
            )
        case EndQuorumEpochRequest():
            return pb.EndQuorumEpochRequest(
                cluster_id=cluster_id,
                src=msg.src,
                dst=msg.dst,
                epoch=msg.epoch,
                leader_id=msg.leader_id,
                preferred_successors=list(msg.preferred_successors),
            )
        case EndQuorumEpochResponse():
            return pb.EndQuorumEpochResponse(
                src=msg.src,
                dst=msg.dst,
                error=int(msg.error),  # type: ignore[arg-type]
                epoch=msg.epoch,
                leader_id=_nid(msg.leader_id),
            )
        case FetchRequest():
            return pb.FetchRequest(
                cluster_id=cluster_id,
                src=msg.src,
                dst=msg.dst,
                epoch=msg.epoch,
                fetch_offset=msg.fetch_offset,
                last_fetched_epoch=msg.last_fetched_epoch,
                max_wait_ms=msg.max_wait_ms,
                max_bytes=msg.max_bytes,
                request_id=msg.request_id,
            )
        case FetchResponse():
            out = pb.FetchResponse(
                src=msg.src,
                dst=msg.dst,
                error=int(msg.error),  # type: ignore[arg-type]
                epoch=msg.epoch,
                leader_id=_nid(msg.leader_id),
                fetch_offset=msg.fetch_offset,
                high_watermark=msg.high_watermark,
                log_start_offset=msg.log_start_offset,
                batches=[batch_to_pb(b) for b in msg.batches],
                request_id=msg.request_id,
            )
            if msg.diverging is not None:
                out.diverging.offset = msg.diverging.offset
                out.diverging.epoch = msg.diverging.epoch
            if msg.snapshot_id is not None:
                out.snapshot_id.end_offset = msg.snapshot_id.end_offset
                out.snapshot_id.epoch = msg.snapshot_id.epoch
            return out
        case FetchSnapshotRequest():
            return pb.FetchSnapshotRequest(
                cluster_id=cluster_id,
                src=msg.src,
                dst=msg.dst,
                epoch=msg.epoch,
                snapshot_id=pb.SnapshotId(
                    end_offset=msg.snapshot_id.end_offset, epoch=msg.snapshot_id.epoch
                ),
                position=msg.position,
                max_bytes=msg.max_bytes,
                request_id=msg.request_id,
            )
        case FetchSnapshotResponse():
            return pb.FetchSnapshotResponse(
                src=msg.src,
                dst=msg.dst,
                error=int(msg.error),  # type: ignore[arg-type]
                epoch=msg.epoch,
                leader_id=_nid(msg.leader_id),
                snapshot_id=pb.SnapshotId(
                    end_offset=msg.snapshot_id.end_offset, epoch=msg.snapshot_id.epoch
                ),
                position=msg.position,
                size=msg.size,
                data=msg.data,
                request_id=msg.request_id,
            )
    raise TypeError(f"not a protocol message: {type(msg).__name__}")  # pragma: no cover


def from_pb(msg: object) -> Message:
    """The core message for a protobuf message; WireError if it is malformed."""
    match msg:
        case pb.VoteRequest():
            return VoteRequest(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _epoch(msg.last_epoch, "last_epoch"),
                _non_negative(msg.end_offset, "end_offset"),
                msg.pre_vote,
            )
        case pb.VoteResponse():
            return VoteResponse(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _opt_node(msg.leader_id, "leader_id"),
                msg.granted,
                msg.pre_vote,
                _error(msg.error),
            )
        case pb.BeginQuorumEpochRequest():
            return BeginQuorumEpochRequest(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _node(msg.leader_id, "leader_id"),
            )
        case pb.BeginQuorumEpochResponse():
            return BeginQuorumEpochResponse(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _opt_node(msg.leader_id, "leader_id"),
                _error(msg.error),
            )
        case pb.EndQuorumEpochRequest():
            return EndQuorumEpochRequest(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _node(msg.leader_id, "leader_id"),
                tuple(_node(n, "preferred_successors") for n in msg.preferred_successors),
            )
        case pb.EndQuorumEpochResponse():
            return EndQuorumEpochResponse(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _opt_node(msg.leader_id, "leader_id"),
                _error(msg.error),
            )
        case pb.FetchRequest():
            return FetchRequest(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _non_negative(msg.fetch_offset, "fetch_offset"),
                _epoch(msg.last_fetched_epoch, "last_fetched_epoch"),
                _non_negative(msg.max_wait_ms, "max_wait_ms"),
                _non_negative(msg.max_bytes, "max_bytes"),
                msg.request_id,
            )
        case pb.FetchResponse():
            diverging = (
                OffsetAndEpoch(
                    _epoch(msg.diverging.epoch, "diverging epoch"),
                    _non_negative(msg.diverging.offset, "diverging offset"),
                )
                if msg.HasField("diverging")
                else None
            )
            snapshot = _snapshot_id(msg.snapshot_id) if msg.HasField("snapshot_id") else None
            if diverging is not None and snapshot is not None:
                raise WireError("a fetch response names both a divergence and a snapshot")
            return FetchResponse(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _opt_node(msg.leader_id, "leader_id"),
                _error(msg.error),
                _non_negative(msg.fetch_offset, "fetch_offset"),
                _non_negative(msg.high_watermark, "high_watermark"),
                tuple(batch_from_pb(b) for b in msg.batches),
                diverging,
                snapshot,
                _non_negative(msg.log_start_offset, "log_start_offset"),
                msg.request_id,
            )
        case pb.FetchSnapshotRequest():
            return FetchSnapshotRequest(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _snapshot_id(msg.snapshot_id),
                msg.position,
                msg.max_bytes,
                msg.request_id,
            )
        case pb.FetchSnapshotResponse():
            return FetchSnapshotResponse(
                _node(msg.src, "src"),
                _node(msg.dst, "dst"),
                _epoch(msg.epoch),
                _opt_node(msg.leader_id, "leader_id"),
                _error(msg.error),
                _snapshot_id(msg.snapshot_id),
                _non_negative(msg.position, "position"),
                _non_negative(msg.size, "size"),
                msg.data,
                msg.request_id,
            )
    raise WireError(f"not a raft protocol message: {type(msg).__name__}")

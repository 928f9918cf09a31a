"""One-line, deterministic descriptions of the core's messages and batches,
for the interaction scenarios (tests/quorum/testdata).

Notation:

- ``a..b`` is the offsets ``a`` to ``b - 1``: ``b`` is an end offset
  (exclusive), as Kafka counts them.
- ``last=E/O`` is a log's last epoch ``E`` and end offset ``O`` (what a
  Vote request compares, epoch first).
- In messages a batch is ``a..b@E`` with ``LC`` added for a LeaderChange
  control batch; in ``log`` output it is ``a..b epoch=E kind records``.
- A snapshot id is ``end/epoch``.
"""

from __future__ import annotations

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
from quorum.types import Batch, BatchKind, LeaderChange, QuorumState, SnapshotId

__all__ = [
    "describe_batch",
    "describe_batch_short",
    "describe_message",
    "describe_snapshot",
    "describe_state",
    "group",
]


def group(ids: tuple[int, ...] | list[int]) -> str:
    return "(" + ",".join(str(i) for i in ids) + ")"


def describe_snapshot(sid: SnapshotId) -> str:
    return f"{sid.end_offset}/{sid.epoch}"


def describe_batch_short(batch: Batch) -> str:
    lc = " LC" if batch.kind is BatchKind.LEADER_CHANGE else ""
    return f"{batch.base_offset}..{batch.end_offset}@{batch.epoch}{lc}"


def describe_batch(batch: Batch) -> str:
    head = f"{batch.base_offset}..{batch.end_offset} epoch={batch.epoch}"
    if batch.kind is BatchKind.LEADER_CHANGE:
        lc = LeaderChange.decode(batch.records[0])
        return (
            f"{head} leader-change leader={lc.leader_id} voters={group(lc.voters)} "
            f"granting={group(lc.granting_voters)}"
        )
    records = " ".join(r.decode("utf-8", "backslashreplace") for r in batch.records)
    return f"{head} data {records}"


def describe_state(state: QuorumState) -> str:
    voted = "-" if state.voted_for is None else str(state.voted_for)
    leader = "-" if state.leader_id is None else str(state.leader_id)
    return f"epoch={state.epoch} voted={voted} leader={leader}"


def _error(error: ErrorCode) -> str:
    return "" if error is ErrorCode.NONE else f" err={error.name}"


def _leader(leader_id: int | None) -> str:
    return "" if leader_id is None else f" leader={leader_id}"


def describe_message(msg: Message) -> str:
    head = f"{msg.src}->{msg.dst}"
    match msg:
        case VoteRequest():
            kind = "pre-vote " if msg.pre_vote else ""
            return f"{head} Vote {kind}epoch={msg.epoch} last={msg.last_epoch}/{msg.end_offset}"
        case VoteResponse():
            kind = "pre-vote " if msg.pre_vote else ""
            verdict = "granted" if msg.granted else "rejected"
            return (
                f"{head} VoteResp {kind}{verdict} epoch={msg.epoch}"
                f"{_leader(msg.leader_id)}{_error(msg.error)}"
            )
        case BeginQuorumEpochRequest():
            return f"{head} BeginEpoch epoch={msg.epoch} leader={msg.leader_id}"
        case BeginQuorumEpochResponse():
            return f"{head} BeginEpochResp epoch={msg.epoch}{_leader(msg.leader_id)}" + _error(
                msg.error
            )
        case EndQuorumEpochRequest():
            return (
                f"{head} EndEpoch epoch={msg.epoch} leader={msg.leader_id} "
                f"successors={group(msg.preferred_successors)}"
            )
        case EndQuorumEpochResponse():
            return f"{head} EndEpochResp epoch={msg.epoch}{_leader(msg.leader_id)}" + _error(
                msg.error
            )
        case FetchRequest():
            return (
                f"{head} Fetch epoch={msg.epoch} offset={msg.fetch_offset} "
                f"last-epoch={msg.last_fetched_epoch}"
            )
        case FetchResponse():
            parts = [f"{head} FetchResp epoch={msg.epoch}{_leader(msg.leader_id)}"]
            if msg.error is not ErrorCode.NONE:
                parts.append(f"err={msg.error.name}")
            parts.append(f"offset={msg.fetch_offset} hw={msg.high_watermark}")
            if msg.diverging is not None:
                parts.append(f"diverging=epoch {msg.diverging.epoch} end {msg.diverging.offset}")
            if msg.snapshot_id is not None:
                parts.append(f"snapshot={describe_snapshot(msg.snapshot_id)}")
            if msg.batches:
                parts.append(" ".join(describe_batch_short(b) for b in msg.batches))
            elif msg.diverging is None and msg.snapshot_id is None and not msg.error:
                parts.append("(empty)")
            return " ".join(parts)
        case FetchSnapshotRequest():
            return (
                f"{head} FetchSnapshot epoch={msg.epoch} "
                f"snapshot={describe_snapshot(msg.snapshot_id)} position={msg.position}"
            )
        case FetchSnapshotResponse():
            parts = [f"{head} FetchSnapshotResp epoch={msg.epoch}{_leader(msg.leader_id)}"]
            if msg.error is not ErrorCode.NONE:
                parts.append(f"err={msg.error.name}")
            parts.append(f"snapshot={describe_snapshot(msg.snapshot_id)}")
            end = msg.position + len(msg.data)
            parts.append(f"bytes={msg.position}..{end} of {msg.size}")
            return " ".join(parts)
    raise TypeError(f"unknown message {msg!r}")

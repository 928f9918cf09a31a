"""The one contract between the pure core and whatever drives it.

``RaftCore.ready()`` returns a :class:`Ready` when there is work; the driver
carries it out in exactly this order, then calls ``RaftCore.advance(ready)``:

0. **Send** ``early_messages``: they may leave before step 1 completes (and
   a driver should send them first, so that replication overlaps the fsync).
   They are only the leader's answers to fetches, carrying its new batches
   and its high watermark.  This is Raft thesis §10.2.1: a leader may write
   to its disk in parallel with replicating, because it counts its own log
   toward the high watermark only once ``advance`` says it is durable, and
   the high watermark it sends counts only durable copies.
1. **Persist.**  In this order: write ``snapshot_chunks`` to the snapshot
   store (``finish`` the snapshot whose chunk says ``done``); if
   ``reset_to_snapshot`` is set, clear the log store; apply ``truncate_to``;
   append ``entries``; apply ``compact_to`` (delete the log prefix it covers);
   write ``quorum_state``.  If ``must_sync`` is true, flush (fsync) the log and
   quorum-state stores before going on.
2. **Send** ``messages``.  Nothing in them may leave the node before step 1
   is durable: a vote grant is sent only once the vote is on disk, and a
   fetch names an offset only once the entries below it are on disk.
3. **Apply.**  If ``load_snapshot`` is set, load that snapshot into the state
   machine first; then apply ``committed`` batches in order.
4. **Advance:** ``core.advance(ready)``.

The core may be stepped again between ``ready()`` and ``advance()``; it will
not hand out a second Ready until the first is advanced.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorum.messages import Message
from quorum.types import Batch, LeaderAndEpoch, QuorumState, Role, SnapshotId

__all__ = ["Ready", "SnapshotChunk"]


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Bytes of a snapshot being downloaded from the leader (KIP-630)."""

    snapshot_id: SnapshotId
    position: int
    data: bytes
    # The last chunk: the snapshot is complete and must be finished atomically.
    done: bool


@dataclass(frozen=True, slots=True)
class Ready:
    # -- 1. persist -------------------------------------------------------
    snapshot_chunks: tuple[SnapshotChunk, ...] = ()
    reset_to_snapshot: SnapshotId | None = None
    truncate_to: int | None = None
    entries: tuple[Batch, ...] = ()
    compact_to: SnapshotId | None = None
    quorum_state: QuorumState | None = None
    # True when entries or quorum state must be durable before step 2.
    must_sync: bool = False
    # -- 2. send (0: early_messages may go before step 1 completes) --------
    messages: tuple[Message, ...] = ()
    early_messages: tuple[Message, ...] = ()
    # -- 3. apply ---------------------------------------------------------
    load_snapshot: SnapshotId | None = None
    committed: tuple[Batch, ...] = ()
    # -- information for the driver and its listeners ----------------------
    high_watermark: int = 0
    role: Role = Role.UNATTACHED
    # Set when the known leader or epoch changed since the last Ready.
    leader_change: LeaderAndEpoch | None = None

    def is_empty(self) -> bool:
        return not (
            self.snapshot_chunks
            or self.reset_to_snapshot
            or self.truncate_to is not None
            or self.entries
            or self.compact_to
            or self.quorum_state
            or self.messages
            or self.early_messages
            or self.load_snapshot
            or self.committed
            or self.leader_change
        )

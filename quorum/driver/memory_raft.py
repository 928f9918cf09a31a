"""The in-memory twin of :class:`quorum.driver.raft_client.RaftClient`.

A quorum of one, held in memory, driven by the test: it leads the epochs it
is told to (:meth:`MemoryRaftClient.become_leader` writes the epoch's
LeaderChange batch, as a real leader does first), queues what is submitted,
and commits it into the state machine when told (:meth:`commit`) or at once
(``auto_commit``).  Losing leadership (:meth:`lose_leadership`) drops every
uncommitted batch, as a deposed leader's unreplicated tail is truncated,
and their writers learn it as a real node tells them: the outcome is
unknown (:class:`IndeterminateError`).  Time is virtual (:meth:`advance`).

The state machine above it (the metadata controller's, say) runs on it
exactly as on a :class:`~quorum.driver.node.QuorumNode`, with no network,
disk or real clock: the seam is the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from quorum.driver.raft_client import (
    IndeterminateError,
    NodeStoppedError,
    NotLeaderError,
    ProposalOutcome,
)
from quorum.listener import StateMachine
from quorum.types import Batch, BatchKind, LeaderAndEpoch, LeaderChange, NodeId

__all__ = ["MemoryRaftClient"]


@dataclass(slots=True)
class _Pending:
    batch: Batch
    future: asyncio.Future[ProposalOutcome]


class MemoryRaftClient:
    """Implements :class:`quorum.driver.raft_client.RaftClient`."""

    def __init__(
        self,
        state_machine: StateMachine,
        node_id: NodeId = 1,
        *,
        auto_commit: bool = True,
        max_batch_records: int = 10_000,
        max_batch_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.state_machine = state_machine
        self._node_id = node_id
        self.auto_commit = auto_commit
        self._max_records = max_batch_records
        self._max_bytes = max_batch_bytes
        self._leader = LeaderAndEpoch(None, 0)
        # Invariant: the committed log ends at the state machine's applied
        # offset; pending batches follow it without gaps.
        self._pending: list[_Pending] = []
        self._now_ms = 0
        self.stopped = False

    # -- what the test drives -------------------------------------------------------

    def become_leader(self, epoch: int | None = None) -> int:
        """Lead ``epoch`` (default: the next one): its LeaderChange batch is
        written and committed at once.  Returns the epoch."""
        epoch = self._leader.epoch + 1 if epoch is None else epoch
        if epoch <= self._leader.epoch:
            raise ValueError(f"epoch {epoch} is not after {self._leader.epoch}")
        self._drop_pending()
        self._leader = LeaderAndEpoch(self._node_id, epoch)
        self.state_machine.handle_leader_change(self._leader)
        record = LeaderChange(self._node_id, (self._node_id,), (self._node_id,)).encode()
        self.state_machine.handle_commit(
            Batch(self.state_machine.applied_offset, epoch, (record,), BatchKind.LEADER_CHANGE)
        )
        return epoch

    def lose_leadership(self, leader: NodeId | None = None) -> None:
        """Another node (``leader``, or none known) takes the next epoch; what
        this node had not committed is lost."""
        self._drop_pending()
        self._leader = LeaderAndEpoch(leader, self._leader.epoch + 1)
        self.state_machine.handle_leader_change(self._leader)

    def commit(self, count: int | None = None) -> int:
        """Commit the oldest ``count`` pending batches (default: all) into the
        state machine, resolving their writers' futures; returns how many."""
        done = 0
        while self._pending and (count is None or done < count):
            pending = self._pending.pop(0)
            results = self.state_machine.handle_commit(pending.batch)
            if not pending.future.done():
                pending.future.set_result(
                    ProposalOutcome(pending.batch.base_offset, pending.batch.epoch, tuple(results))
                )
            done += 1
        return done

    def advance(self, ms: int) -> None:
        """Move the virtual clock forward."""
        self._now_ms += ms

    def stop(self) -> None:
        self.stopped = True
        for pending in self._pending:
            if not pending.future.done():
                pending.future.set_exception(NodeStoppedError("the node stopped"))
        self._pending.clear()

    @property
    def pending_batches(self) -> int:
        return len(self._pending)

    # -- RaftClient ----------------------------------------------------------------

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    @property
    def max_batch_records(self) -> int:
        return self._max_records

    @property
    def max_batch_bytes(self) -> int:
        return self._max_bytes

    def leader_and_epoch(self) -> LeaderAndEpoch:
        return self._leader

    def now_ms(self) -> int:
        return self._now_ms

    def next_offset(self) -> int:
        if self._pending:
            return self._pending[-1].batch.end_offset
        return self.state_machine.applied_offset

    def submit(
        self, records: Sequence[bytes], epoch: int
    ) -> tuple[int, asyncio.Future[ProposalOutcome]]:
        if self.stopped:
            raise NodeStoppedError("the node is not running")
        size = sum(len(r) for r in records)
        if not records or len(records) > self._max_records or size > self._max_bytes:
            raise ValueError(
                f"a write of {len(records)} records and {size} bytes does not fit in one batch"
            )
        if self._leader.leader_id != self._node_id or epoch != self._leader.epoch:
            raise NotLeaderError(self._leader.leader_id, self._leader.epoch)
        base = self.next_offset()
        future: asyncio.Future[ProposalOutcome] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(Batch(base, epoch, tuple(records)), future))
        if self.auto_commit:
            # After the caller has queued and replayed, as a real node
            # commits no sooner than its next turn on the loop.
            asyncio.get_running_loop().call_soon(self.commit)
        return base, future

    async def read_barrier(self, timeout_s: float) -> int:
        if self.stopped:
            raise NodeStoppedError("the node is not running")
        if self._leader.leader_id != self._node_id:
            raise NotLeaderError(self._leader.leader_id, self._leader.epoch)
        return self.state_machine.applied_offset

    # -- inside ------------------------------------------------------------------------

    def _drop_pending(self) -> None:
        for pending in self._pending:
            if not pending.future.done():
                pending.future.set_exception(
                    IndeterminateError("leadership was lost before the write committed")
                )
        self._pending.clear()

"""The seam between the quorum and the state machine it replicates.

Kafka's ``RaftClient.Listener`` (handleCommit, handleLoadSnapshot,
handleLeaderChange), plus what a node needs to take snapshots.  The node
calls it in log order on one task, after the batches are committed; the
state machine changes only here (decide, then replay).  A node's state
machine is a :class:`quorum.shared_log.SharedLog` of its plug-ins' (the
metadata controller's :class:`metadata.state_machine.ControllerStateMachine`,
the key-value store's :class:`kvstore.state_machine.KvStateMachine`); the
other half of the seam, what those plug-ins may ask of the quorum, is
:class:`quorum.driver.raft_client.RaftClient`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from quorum.types import Batch, LeaderAndEpoch, SnapshotId

__all__ = ["StateMachine"]


class StateMachine(Protocol):
    @property
    def applied_offset(self) -> int:
        """End offset of the last batch applied (or loaded from a snapshot)."""
        ...

    def handle_commit(self, batch: Batch) -> Sequence[object]:
        """Apply one committed batch; returns one result per record, handed
        to whoever proposed it.  Must be deterministic: every replica
        computes the same state and results."""
        ...

    def handle_load_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        """Replace the whole state by a snapshot's (on start-up, or when a
        follower installs one from the leader)."""
        ...

    def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        """The known leader or epoch changed."""
        ...

    def snapshot(self) -> bytes:
        """The state as of :attr:`applied_offset`, as bytes."""
        ...

    def capture_snapshot(self) -> Callable[[], bytes]:
        """Capture the state as of :attr:`applied_offset` cheaply, now, and
        return a function that turns the capture into the snapshot's bytes.

        The node calls the function in another thread while it goes on
        applying (hashicorp/raft's FSM.Snapshot/Persist split), so the
        capture must not share anything the state machine later mutates."""
        ...

"""The quorum as the state machines above it see it: one narrow interface.

Kafka's ``RaftClient`` (raft/src/main/java/org/apache/kafka/raft/RaftClient.java)
is how its controller and brokers use the metadata quorum: the leader and
epoch, ``scheduleAppend(epoch, records)`` that says the offset the records
will get, batch limits, and listeners for committed batches.  kq's is
:class:`RaftClient`; :class:`quorum.driver.node.QuorumNode` implements it,
and so does its in-memory twin
:class:`quorum.driver.memory_raft.MemoryRaftClient`, on which the metadata
controller runs in tests without a network, a disk or a clock of its own.

The listener side of the seam is :class:`quorum.listener.StateMachine`:
committed batches are applied to it in log order, on the node's task,
before the futures of :meth:`RaftClient.submit` resolve.

The errors a caller handles are defined here, so that nothing above the
node needs the node's module:

- :class:`NotLeaderError` (from the core): refused at once, nothing written;
- :class:`BusyError`: too much is waiting to commit; nothing written;
- :class:`IndeterminateError`: the outcome is unknown (may have committed);
- :class:`NodeStoppedError`: the node stopped or failed;
- :class:`ReadTimeoutError`: a read barrier was not confirmed in time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from quorum.core import NotLeaderError
from quorum.types import LeaderAndEpoch, NodeId

__all__ = [
    "BusyError",
    "IndeterminateError",
    "NodeStoppedError",
    "NotLeaderError",
    "ProposalOutcome",
    "RaftClient",
    "ReadTimeoutError",
    "propose",
]


class IndeterminateError(Exception):
    """A write's outcome is unknown: it may or may not have committed."""


class NodeStoppedError(Exception):
    """The node stopped (or failed) before the request completed."""


class ReadTimeoutError(Exception):
    """A linearizable read could not be confirmed in time; it had no effect."""


class BusyError(Exception):
    """Too many writes are waiting to commit; this one was refused (it had no
    effect) and may be retried later."""


@dataclass(frozen=True, slots=True)
class ProposalOutcome:
    """Where a submitted write committed: the offset and epoch of its first
    record, and the state machine's result for each of its records."""

    offset: int
    epoch: int
    results: tuple[object, ...]


class RaftClient(Protocol):
    """What a state machine's driver (the active controller, later a broker)
    may ask of the quorum.  All calls are made on the event loop the node
    runs on."""

    @property
    def node_id(self) -> NodeId:
        """This node's id."""
        ...

    @property
    def max_batch_records(self) -> int:
        """Most records one :meth:`submit` may carry (one log batch)."""
        ...

    @property
    def max_batch_bytes(self) -> int:
        """Most bytes of records one :meth:`submit` may carry."""
        ...

    def leader_and_epoch(self) -> LeaderAndEpoch:
        """The current epoch and its leader as this node knows them;
        ``leader_id == node_id`` exactly while this node leads the epoch
        (Kafka's ``RaftClient.leaderAndEpoch``)."""
        ...

    def now_ms(self) -> int:
        """The node's monotonic clock in milliseconds (the one its own
        timeouts use)."""
        ...

    def next_offset(self) -> int:
        """The offset the next record submitted now will get, if this node
        stays leader of its epoch (Kafka's ``logEndOffset`` plus what is
        queued)."""
        ...

    def submit(
        self, records: Sequence[bytes], epoch: int
    ) -> tuple[int, asyncio.Future[ProposalOutcome]]:
        """Queue ``records`` as one batch of ``epoch``, or refuse them at once
        (NotLeaderError if this node does not lead ``epoch``, BusyError,
        ValueError past the batch limits, NodeStoppedError; nothing queued).
        Returns the offset the first record will get, exact while this node
        leads ``epoch`` (Kafka's ``scheduleAppend``), and a future of the
        outcome, resolved once the batch committed and was applied."""
        ...

    async def read_barrier(self, timeout_s: float) -> int:
        """Wait until a linearizable read may be served from the local state
        machine (read index confirmed by a quorum round and applied);
        returns the read index.  NotLeaderError off the leader,
        ReadTimeoutError, NodeStoppedError."""
        ...


async def propose(
    client: RaftClient, records: Sequence[bytes], timeout_s: float
) -> ProposalOutcome:
    """Submit ``records`` for the epoch this node leads and wait for the
    outcome.  NotLeaderError at once off the leader (nothing was written);
    IndeterminateError if leadership was lost, or time ran out, before this
    node learned whether they committed; BusyError, ValueError,
    NodeStoppedError as :meth:`RaftClient.submit`."""
    known = client.leader_and_epoch()
    if known.leader_id != client.node_id:
        raise NotLeaderError(known.leader_id, known.epoch)
    _, future = client.submit(records, known.epoch)
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        raise IndeterminateError(
            f"no outcome within {timeout_s:.3f}s: the write may or may not have committed"
        ) from None

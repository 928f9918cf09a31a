"""Helpers for driving one :class:`quorum.core.RaftCore` by hand in unit tests.

:class:`Driver` owns one core and its in-memory stores and carries out each
``Ready`` exactly as ``quorum/sim/node.py`` does (persist, fsync if asked,
send, apply, advance).  The "sent" messages are returned to the test instead
of going to a network, so a test looks at them and feeds answers back.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quorum.config import QuorumConfig
from quorum.core import RaftCore
from quorum.memory import MemoryStores
from quorum.messages import (
    BeginQuorumEpochRequest,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum.ready import Ready
from quorum.types import Batch, NodeId, OffsetAndEpoch, QuorumState, Role, SnapshotId, VoterSet

__all__ = [
    "CONFIG",
    "Driver",
    "batch",
    "batches_of",
    "fetch_reply",
    "make_leader",
    "of_type",
    "snapshot_reply",
]

# Small, round numbers so that deadlines in the tests are easy to read.
CONFIG = QuorumConfig(
    election_timeout_ms=1000,
    fetch_timeout_ms=2000,
    election_backoff_max_ms=1000,
    retry_backoff_ms=20,
    fetch_max_wait_ms=500,
    request_timeout_ms=1000,
    fetch_max_bytes=1 << 20,
    snapshot_chunk_bytes=10,
    check_quorum_factor=1.5,
)

M = TypeVar("M")


def of_type(messages: Iterable[object], kind: type[M]) -> list[M]:
    """The messages of one type, in order."""
    return [m for m in messages if isinstance(m, kind)]


def batch(base: int, epoch: int, n: int = 1, payload: bytes = b"r") -> Batch:
    """A data batch of ``n`` records at ``base`` in ``epoch``."""
    return Batch(base, epoch, tuple(payload + bytes([i % 256]) for i in range(n)))


def batches_of(*spec: tuple[int, int], start: int = 0) -> list[Batch]:
    """Contiguous batches from ``start``: each ``(epoch, records)``."""
    out: list[Batch] = []
    base = start
    for epoch, n in spec:
        out.append(batch(base, epoch, n))
        base += n
    return out


R = TypeVar("R", FetchResponse, FetchSnapshotResponse)
_replace: Callable[..., Any] = dataclasses.replace


def _echo(resp: R, req: FetchRequest | FetchSnapshotRequest) -> R:
    """Copy the request's correlation id (if the protocol has one) into the
    response, as a leader answering that very request would."""
    names = {f.name for f in dataclasses.fields(resp)}
    if "request_id" in names and hasattr(req, "request_id"):
        echoed: R = _replace(resp, request_id=req.request_id)
        return echoed
    return resp


def fetch_reply(
    req: FetchRequest,
    *,
    error: ErrorCode = ErrorCode.NONE,
    high_watermark: int = 0,
    batches: tuple[Batch, ...] = (),
    diverging: OffsetAndEpoch | None = None,
    snapshot_id: SnapshotId | None = None,
    src: NodeId | None = None,
    epoch: int | None = None,
) -> FetchResponse:
    """The answer of ``req``'s destination (the leader of ``req.epoch``)."""
    sender = req.dst if src is None else src
    return _echo(
        FetchResponse(
            sender,
            req.src,
            req.epoch if epoch is None else epoch,
            req.dst,
            error,
            req.fetch_offset,
            high_watermark,
            batches,
            diverging,
            snapshot_id,
        ),
        req,
    )


def snapshot_reply(
    req: FetchSnapshotRequest,
    data: bytes,
    size: int,
    *,
    error: ErrorCode = ErrorCode.NONE,
) -> FetchSnapshotResponse:
    """The leader's answer to ``req``: ``data`` from ``req.position``."""
    return _echo(
        FetchSnapshotResponse(
            req.dst, req.src, req.epoch, req.dst, error, req.snapshot_id, req.position, size, data
        ),
        req,
    )


@dataclass
class Driver:
    """One node: stores + core, driven by hand with an explicit clock."""

    node_id: NodeId
    voters: VoterSet
    stores: MemoryStores = field(default_factory=MemoryStores.new)
    config: QuorumConfig = CONFIG
    seed: int = 0
    now: int = 0
    readies: list[Ready] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = self._new_core()

    @classmethod
    def new(
        cls,
        node_id: NodeId = 1,
        voters: Sequence[NodeId] = (1, 2, 3),
        *,
        log: Sequence[Batch] = (),
        state: QuorumState | None = None,
        snapshot: tuple[SnapshotId, bytes] | None = None,
        config: QuorumConfig = CONFIG,
        seed: int = 0,
        now: int = 0,
    ) -> Driver:
        """A node whose stores already hold (durably) ``log``, ``state`` and
        ``snapshot``.  Its first Readies are not yet carried out."""
        stores = MemoryStores.new()
        if log:
            stores.log.append(list(log))
            stores.log.flush()
        if state is not None:
            stores.state.write(state)
            stores.state.flush()
        if snapshot is not None:
            stores.snapshots.create(*snapshot)
        return cls(node_id, VoterSet.of(*voters), stores, config, seed, now)

    def _new_core(self) -> RaftCore:
        return RaftCore(
            self.node_id,
            self.voters,
            log_store=self.stores.log,
            state_store=self.stores.state,
            snapshot_store=self.stores.snapshots,
            rng=random.Random(self.seed),
            now_ms=self.now,
            config=self.config,
        )

    def restart(self, rng: random.Random | None = None) -> None:
        """Crash (losing unflushed writes) and start a new core."""
        self.stores.crash(rng)
        self.core = self._new_core()

    # -- the Ready contract, as quorum/sim/node.py carries it out ------------

    def persist(self, ready: Ready) -> None:
        self.stores.persist(ready)

    def drain(self) -> list[Message]:
        """Carry out every pending Ready; return the messages "sent"."""
        sent: list[Message] = []
        while (ready := self.core.ready()) is not None:
            self.readies.append(ready)
            sent.extend(ready.early_messages)
            self.persist(ready)
            sent.extend(ready.messages)
            self.core.advance(ready)
        return sent

    # -- inputs, each followed by carrying out the Readies -------------------

    def step(self, msg: Message, at: int | None = None) -> list[Message]:
        if at is not None:
            self.now = at
        self.core.step(msg, self.now)
        return self.drain()

    def tick(self, at: int) -> list[Message]:
        self.now = at
        self.core.tick(at)
        return self.drain()

    def propose(self, *records: bytes) -> list[Message]:
        self.core.propose(list(records), self.now)
        return self.drain()

    # -- common exchanges ----------------------------------------------------

    def fetch(
        self,
        src: NodeId,
        offset: int,
        last_epoch: int,
        *,
        epoch: int | None = None,
        max_wait_ms: int = 0,
        max_bytes: int = 1 << 20,
        at: int | None = None,
    ) -> list[Message]:
        """Step a FetchRequest from ``src`` (at the core's epoch by default)."""
        req = FetchRequest(
            src,
            self.node_id,
            self.core.epoch if epoch is None else epoch,
            offset,
            last_epoch,
            max_wait_ms,
            max_bytes,
        )
        return self.step(req, at)

    def fetch_to_end(self, src: NodeId, at: int | None = None) -> list[Message]:
        """``src`` fetches at this node's whole log, as a caught-up replica."""
        log = self.core.log
        return self.fetch(src, log.end_offset, log.last_epoch, at=at)

    def elect(self, granting: Sequence[NodeId] | None = None) -> list[Message]:
        """Time out, win the pre-vote and the vote; returns the messages sent."""
        others = [v for v in self.voters.sorted() if v != self.node_id]
        grant = others[: self.voters.majority() - 1] if granting is None else granting
        sent = self.tick(self.now + 2 * self.config.election_timeout_ms)
        for pre_vote in (True, False):
            if self.core.role is Role.LEADER:
                break
            for voter in grant:
                sent += self.step(
                    VoteResponse(voter, self.node_id, self.core.epoch, None, True, pre_vote)
                )
        assert self.core.role is Role.LEADER, self.core.role
        return sent

    def begin_epoch(self, leader: NodeId, epoch: int) -> list[Message]:
        return self.step(BeginQuorumEpochRequest(leader, self.node_id, epoch, leader))

    def vote_request(
        self, src: NodeId, epoch: int, last_epoch: int, end_offset: int, *, pre_vote: bool = False
    ) -> list[Message]:
        return self.step(VoteRequest(src, self.node_id, epoch, last_epoch, end_offset, pre_vote))


def make_leader(
    node_id: NodeId = 1,
    voters: Sequence[NodeId] = (1, 2, 3),
    *,
    log: Sequence[Batch] = (),
    state: QuorumState | None = None,
    snapshot: tuple[SnapshotId, bytes] | None = None,
    config: QuorumConfig = CONFIG,
) -> Driver:
    """A node that has just won an election, every Ready carried out."""
    d = Driver.new(node_id, voters, log=log, state=state, snapshot=snapshot, config=config)
    d.drain()
    d.elect()
    return d

"""The asyncio driver of one quorum node.

One task owns the :class:`quorum.core.RaftCore` and runs the Ready contract
(:mod:`quorum.ready`) exactly: step the inputs, then for each Ready persist
(one write batch, synced when required, in a worker thread so the event loop
keeps serving), send, apply to the state machine, advance.

Group commit: proposals waiting while a Ready is being persisted are appended
together as one batch (up to ``max_batch_records``), so one fsync and one
replication round serve many writes.  When other writes are already in
flight, a new one waits up to ``append_linger_ms`` for company; an idle
node appends at once, so a lone write pays no linger.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import bugs
from bugs import Bug
from quorum.config import QuorumConfig
from quorum.core import NotLeaderError, RaftCore, ReadBarrier, SafetyError, Status
from quorum.driver.metrics import NodeMetrics
from quorum.driver.raft_client import (
    BusyError,
    IndeterminateError,
    NodeStoppedError,
    ProposalOutcome,
    ReadTimeoutError,
    propose,
)
from quorum.driver.rpc_guard import DEFAULT_MAX_CALLS_PER_CALLER, DEFAULT_MAX_REQUEST_ITEMS
from quorum.driver.tls import DEFAULT_MAX_MESSAGE_BYTES
from quorum.listener import StateMachine
from quorum.messages import Message, VoteResponse
from quorum.ready import Ready
from quorum.storage import NodeStorage
from quorum.types import Batch, LeaderAndEpoch, NodeId, Role, SnapshotId, VoterSet

__all__ = [
    "BusyError",
    "IndeterminateError",
    "NodeOptions",
    "NodeStoppedError",
    "ProposalOutcome",
    "QuorumNode",
    "ReadTimeoutError",
]

log = logging.getLogger("kq.node")

# Persist on the event loop while writes take less than this on average.
INLINE_PERSIST_S = 0.0005
# Room in a message for what is not batch or snapshot bytes (ids, offsets,
# each batch's header fields).
MESSAGE_OVERHEAD_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class NodeOptions:
    quorum: QuorumConfig = field(default_factory=QuorumConfig)
    # Group commit: a write waits at most this long for others to join its
    # batch, and only while other writes are in flight.
    append_linger_ms: float = 2.0
    max_batch_records: int = 10_000
    # Most bytes of records in one appended batch (a single larger proposal
    # is refused): every batch must fit in one fetch answer.
    max_batch_bytes: int = 4 * 1024 * 1024
    # Take a state-machine snapshot after this many new offsets (0: never),
    # or after this many bytes of newly applied records (0: never; Kafka's
    # metadata.log.max.record.bytes.between.snapshots is 20 MiB).  Either
    # way, not before the new records amount to the last snapshot's size:
    # writing a snapshot costs the size of the whole state, so this keeps
    # the cost proportional to what was applied.
    snapshot_every_offsets: int = 100_000
    snapshot_every_bytes: int = 64 * 1024 * 1024
    # Back-pressure: records queued or appended but not yet committed; past
    # this, new proposals are refused with BusyError.
    max_pending_records: int = 200_000
    # DSCP value (0..63) marking the IP packets of this node's gRPC server
    # and of its channels to its peers; 0: none.  Lets a firewall tell one
    # node's traffic from another's when they share a host (the chaos
    # harness's local partitions).
    dscp: int = 0
    # What one caller may ask of the node's gRPC server (docs/operations.md,
    # "Limits"): the largest message it and the node's channels send or
    # receive (a larger one is RESOURCE_EXHAUSTED); the most items (elements
    # of repeated fields, at any depth) in one request; the most calls one
    # caller (a certificate's identity over TLS, a host in plaintext) may
    # have in flight; the most concurrent streams on one connection.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_request_items: int = DEFAULT_MAX_REQUEST_ITEMS
    max_calls_per_caller: int = DEFAULT_MAX_CALLS_PER_CALLER
    max_streams_per_connection: int = 100

    def __post_init__(self) -> None:
        if not 0 <= self.dscp <= 63:
            raise ValueError(f"dscp must be in 0..63, got {self.dscp}")
        for name in (
            "max_request_items",
            "max_calls_per_caller",
            "max_streams_per_connection",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        # A fetch answer carries up to fetch_max_bytes of batches, and at
        # least one whole batch; a snapshot chunk up to snapshot_chunk_bytes.
        need = (
            max(self.quorum.fetch_max_bytes, self.max_batch_bytes, self.quorum.snapshot_chunk_bytes)
            + MESSAGE_OVERHEAD_BYTES
        )
        if self.max_message_bytes < need:
            raise ValueError(
                f"max_message_bytes ({self.max_message_bytes}) must be at least {need}: the "
                "largest of quorum.fetch_max_bytes, max_batch_bytes and "
                f"quorum.snapshot_chunk_bytes, plus {MESSAGE_OVERHEAD_BYTES} for the rest of "
                "the message, or fetch answers could not reach the followers"
            )


@dataclass(slots=True)
class _Proposal:
    records: tuple[bytes, ...]
    future: asyncio.Future[ProposalOutcome]
    queued_at: float
    size: int = 0


@dataclass(slots=True)
class _Inflight:
    """A batch appended by this node as leader, waiting to commit."""

    base_offset: int
    epoch: int
    end_offset: int
    # (proposal future, first record index within the batch, record count,
    # when the proposal arrived)
    parts: list[tuple[asyncio.Future[ProposalOutcome], int, int, float]]


Send = Callable[[Message], None]


class QuorumNode:
    """A running quorum member (voter or observer); implements
    :class:`quorum.driver.raft_client.RaftClient` for the state machine
    above it."""

    def __init__(
        self,
        node_id: NodeId,
        voters: VoterSet,
        storage: NodeStorage,
        state_machine: StateMachine,
        options: NodeOptions | None = None,
        rng: random.Random | None = None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self.node_id = node_id
        self.voters = voters
        self.storage = storage
        self.state_machine = state_machine
        self.options = options or NodeOptions()
        self.metrics = metrics
        self._rng = rng or random.Random()
        self._send: Send = lambda msg: None
        self._origin = time.monotonic()
        # Say what this start restores, so that a node's log shows whether
        # the vote it granted in an epoch survived its restart (Raft thesis
        # §3.8: votedFor is persistent; KIP-595's quorum-state file).
        stored = storage.state.read()
        log.info(
            "node %d restored quorum state: epoch %d, voted for %s, leader %s",
            node_id,
            0 if stored is None else stored.epoch,
            "none" if stored is None or stored.voted_for is None else stored.voted_for,
            "none" if stored is None or stored.leader_id is None else stored.leader_id,
        )
        self.core = RaftCore(
            node_id,
            voters,
            log_store=storage.log,
            state_store=storage.state,
            snapshot_store=storage.snapshots,
            rng=self._rng,
            now_ms=self.now_ms(),
            config=self.options.quorum,
        )
        self._inbox: list[Message] = []
        self._persist_ewma_s = 0.0
        # Bytes of records applied since the last snapshot, and that
        # snapshot's size.
        self._applied_bytes = 0
        self._last_snapshot_bytes = 0
        # The snapshot being encoded and written in the background, if any.
        self._snapshot_task: asyncio.Task[None] | None = None
        self._last_role = self.core.role
        self._offloaded = 0
        self._metrics_at = 0.0
        self._unreachable: set[NodeId] = set()
        self._proposals: list[_Proposal] = []
        self._inflight: dict[int, _Inflight] = {}
        self._reads: list[tuple[ReadBarrier | None, asyncio.Future[int], float]] = []
        self._wakeup = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"kq-io-{node_id}")
        self._stopping = False
        self.failure: BaseException | None = None
        self.last_snapshot_offset = self.core.log.start_offset

    # -- time ------------------------------------------------------------

    def now_ms(self) -> int:
        """Monotonic milliseconds since this node started (the core's clock)."""
        return int((time.monotonic() - self._origin) * 1000)

    def wall_ms(self, core_ms: int | None) -> int:
        """Wall-clock epoch milliseconds of a core timestamp (-1 for None)."""
        if core_ms is None:
            return -1
        return int((time.time() - (time.monotonic() - self._origin) + core_ms / 1000) * 1000)

    # -- lifecycle ----------------------------------------------------------

    def start(self, send: Send) -> None:
        """Start the node's task on the running loop; ``send`` transmits."""
        self._send = send
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"kq-node-{self.node_id}"
        )
        self._wakeup.set()

    async def stop(self, resign: bool = True, timeout_s: float = 2.0) -> None:
        """Stop; a leader first resigns (EndQuorumEpoch) and lets it go out."""
        if self._task is None:
            return
        if resign and self.core.role is Role.LEADER:
            self.core.resign((), self.now_ms())
            self._wakeup.set()
            deadline = time.monotonic() + min(timeout_s, 0.5)
            while self.core.has_ready() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.02)  # let the EndQuorumEpoch RPCs leave
        self._stopping = True
        self._wakeup.set()
        try:
            await asyncio.wait_for(self._task, timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()
        self._fail_all(NodeStoppedError("the node stopped"))
        self._io.shutdown(wait=True)
        self._task = None

    # -- inputs -------------------------------------------------------------

    def deliver(self, msg: Message) -> None:
        """A message from a peer (already validated by the transport)."""
        self._inbox.append(msg)
        self._wakeup.set()

    def report_unreachable(self, node: NodeId) -> None:
        """The transport could not connect to ``node`` (see the core)."""
        self._unreachable.add(node)
        self._wakeup.set()

    async def propose(self, records: Sequence[bytes], timeout_s: float) -> ProposalOutcome:
        """Replicate ``records`` (as part of one batch) and apply them
        (:func:`quorum.driver.raft_client.propose`)."""
        return await propose(self, records, timeout_s)

    def next_offset(self) -> int:
        """The offset the next record submitted now will get, if this node
        stays leader of its epoch (see :meth:`submit`)."""
        return self.core.log_end_offset + sum(len(p.records) for p in self._proposals)

    # -- RaftClient --------------------------------------------------------------

    @property
    def max_batch_records(self) -> int:
        return self.options.max_batch_records

    @property
    def max_batch_bytes(self) -> int:
        return self.options.max_batch_bytes

    def leader_and_epoch(self) -> LeaderAndEpoch:
        live = self.core.role in (Role.FOLLOWER, Role.LEADER)
        return LeaderAndEpoch(self.core.leader_id if live else None, self.core.epoch)

    def submit(
        self, records: Sequence[bytes], epoch: int | None = None
    ) -> tuple[int, asyncio.Future[ProposalOutcome]]:
        """Queue ``records`` for the log, or refuse them at once (raising
        NotLeaderError, also when ``epoch`` is given and this node does not
        lead it; BusyError, ValueError or NodeStoppedError; nothing was
        queued).  Returns the offset the first record will get, and a future
        of the outcome.

        The offset is exact while this node stays leader of its epoch:
        queued records are appended in order, and a leader appends nothing
        else after its epoch's first batch.  The active controller relies on
        it to write a broker's epoch, which is its record's offset (KIP-631,
        Kafka's nextWriteOffset)."""
        self._check_running()
        size = sum(len(r) for r in records)
        if size > self.options.max_batch_bytes or len(records) > self.options.max_batch_records:
            raise ValueError(
                f"a write of {len(records)} records and {size} bytes does not fit in one batch "
                f"(at most {self.options.max_batch_records} records and "
                f"{self.options.max_batch_bytes} bytes)"
            )
        if self.core.role is not Role.LEADER or (epoch is not None and epoch != self.core.epoch):
            raise self._not_leader()
        queued = sum(len(p.records) for p in self._proposals)
        pending = queued + sum(i.end_offset - i.base_offset for i in self._inflight.values())
        if pending + len(records) > self.options.max_pending_records:
            raise BusyError(
                f"{pending} records are waiting to commit (limit "
                f"{self.options.max_pending_records}); try again later"
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ProposalOutcome] = loop.create_future()
        # Its caller may stop waiting (its time ran out, it was cancelled,
        # or it waits on a later batch only) while the write goes on: unlike
        # a read, a write is never withdrawn, as its offset was promised and
        # it may still commit.  A failure that comes later (NotLeaderError,
        # IndeterminateError, NodeStoppedError) is then read here, or asyncio
        # reports "Future exception was never retrieved"; a caller that
        # still waits gets it all the same.
        future.add_done_callback(_read_outcome)
        self._proposals.append(_Proposal(tuple(records), future, time.monotonic(), size))
        self._wakeup.set()
        return self.core.log_end_offset + queued, future

    async def read_barrier(self, timeout_s: float) -> int:
        """Wait until a linearizable read may be served from the local state
        machine (read index confirmed by a quorum round and applied); returns
        the read index.  NotLeaderError off the leader, ReadTimeoutError."""
        self._check_running()
        if self.core.role is not Role.LEADER:
            raise self._not_leader()
        if bugs.on(Bug.READ_WITHOUT_BARRIER):
            # Q4 (deliberate bug): no commit in this epoch, no quorum round
            # (Raft thesis §6.4): a deposed leader that has not noticed yet
            # serves its stale state.
            return self.state_machine.applied_offset
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._reads.append((None, future, time.monotonic()))
        self._wakeup.set()
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise ReadTimeoutError(
                f"could not confirm leadership within {timeout_s:.3f}s"
            ) from None
        finally:
            # A read nobody waits for any more (its time ran out, or its
            # caller was cancelled) is cancelled, and _check_reads drops it.
            # Left pending, it would later be failed (NotLeaderError at a
            # leader change, NodeStoppedError at a stop) with nobody to
            # retrieve the exception, which asyncio reports as "Future
            # exception was never retrieved".  Unlike a write, a read has no
            # effect, so abandoning it is always safe.
            future.cancel()

    def resign(self, preferred: Sequence[NodeId] = ()) -> bool:
        ok = self.core.resign(tuple(preferred), self.now_ms())
        self._wakeup.set()
        return ok

    def status(self) -> Status:
        return self.core.status()

    def _not_leader(self) -> NotLeaderError:
        known = self.leader_and_epoch()
        return NotLeaderError(known.leader_id, known.epoch)

    def _check_running(self) -> None:
        if self._task is None or self._stopping:
            raise NodeStoppedError("the node is not running")
        if self.failure is not None:
            raise NodeStoppedError(f"the node failed: {self.failure}")

    # -- the loop -----------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._stopping:
                    break
                now = self.now_ms()
                inbox, self._inbox = self._inbox, []
                for msg in inbox:
                    self.core.step(msg, now)
                unreachable, self._unreachable = self._unreachable, set()
                for node in sorted(unreachable):
                    self.core.report_unreachable(node, now)
                if now >= self.core.next_deadline_ms():
                    self.core.tick(now)
                self._maybe_append_proposals(loop)
                self._check_reads()
                await self._process_readies(loop)
                self._note_role()
                self._arm_timer(loop)
        except SafetyError as exc:
            # The protocol refused to act against committed data: stop rather
            # than serve anything more (never observed; the simulator checks).
            log.critical("node %d stopping: %s", self.node_id, exc)
            self.failure = exc
        except Exception as exc:  # pragma: no cover - defensive: report and stop
            log.exception("node %d stopping after an unexpected error", self.node_id)
            self.failure = exc
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self.failure is not None:
                self._fail_all(NodeStoppedError(f"the node failed: {self.failure}"))

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadlines = [self.core.next_deadline_ms()]
        if self._proposals:
            deadlines.append(self._linger_deadline_ms())
        if self._reads:
            deadlines.append(self.now_ms() + 1)
        delay = max(0.0, (min(deadlines) - self.now_ms()) / 1000)
        self._timer = loop.call_later(delay, self._wakeup.set)

    def _linger_deadline_ms(self) -> int:
        oldest = self._proposals[0].queued_at
        return int((oldest - self._origin) * 1000 + self.options.append_linger_ms)

    def _maybe_append_proposals(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._proposals:
            return
        if self.core.role is not Role.LEADER:
            err = self._not_leader()
            for p in self._proposals:
                if not p.future.done():
                    p.future.set_exception(err)
            self._proposals.clear()
            return
        count = sum(len(p.records) for p in self._proposals)
        size = sum(p.size for p in self._proposals)
        if (
            self._inflight
            and count < self.options.max_batch_records
            and size < self.options.max_batch_bytes
            and self.now_ms() < self._linger_deadline_ms()
        ):
            return  # linger for company while earlier writes are in flight
        while self._proposals:
            taken: list[_Proposal] = []
            records: list[bytes] = []
            batch_bytes = 0
            while self._proposals and (
                not records
                or (
                    len(records) + len(self._proposals[0].records) <= self.options.max_batch_records
                    and batch_bytes + self._proposals[0].size <= self.options.max_batch_bytes
                )
            ):
                p = self._proposals.pop(0)
                if p.future.done():
                    continue
                taken.append(p)
                records.extend(p.records)
                batch_bytes += p.size
            if not records:
                continue
            result = self.core.propose(records, self.now_ms())
            parts = []
            index = 0
            for p in taken:
                parts.append((p.future, index, len(p.records), p.queued_at))
                index += len(p.records)
            if self.metrics is not None:
                self.metrics.appended_records.inc(len(records))
                self.metrics.appended_batches.inc()
            self._inflight[result.base_offset] = _Inflight(
                result.base_offset, result.epoch, result.last_offset + 1, parts
            )

    def _check_reads(self) -> None:
        if not self._reads:
            return
        now = self.now_ms()
        pending = []
        for barrier, future, started in self._reads:
            if future.done():
                continue
            try:
                if barrier is None:
                    barrier = self.core.begin_read(now)
                if (
                    barrier is not None
                    and self.core.read_confirmed(barrier)
                    and self.state_machine.applied_offset >= barrier.read_index
                ):
                    future.set_result(barrier.read_index)
                    continue
            except NotLeaderError as exc:
                future.set_exception(exc)
                continue
            pending.append((barrier, future, started))
        self._reads = pending

    async def _process_readies(self, loop: asyncio.AbstractEventLoop) -> None:
        while (ready := self.core.ready()) is not None:
            # 0. leader replication answers overlap the fsync (ready.py).
            for msg in ready.early_messages:
                self._send(msg)
            # 1. persist: one write batch, fsynced when required.
            if _needs_persist(ready):
                await self._persist(loop, ready)
            # 2. send.
            for msg in ready.messages:
                self._send(msg)
                if isinstance(msg, VoteResponse) and msg.granted and not msg.pre_vote:
                    # Logged once the vote is durable (step 1), as the
                    # vote-durability check reads it.
                    log.info(
                        "node %d granted its vote in epoch %d to node %d",
                        self.node_id,
                        msg.epoch,
                        msg.dst,
                    )
            self._log_changes(ready)
            # 3. apply.
            self._apply(ready)
            # 4. advance.
            self.core.advance(ready)
            if self.metrics is not None:
                self.metrics.observe_ready(ready)
                now_s = time.monotonic()
                if ready.leader_change is not None or now_s - self._metrics_at > 0.1:
                    self._metrics_at = now_s
                    self.metrics.observe_status(self.core.status(), self.now_ms())
            self._maybe_snapshot(loop)
            # Messages that arrived while persisting are stepped before the
            # next Ready, so one fsync covers them too.
            if self._inbox:
                now = self.now_ms()
                inbox, self._inbox = self._inbox, []
                for msg in inbox:
                    self.core.step(msg, now)
            self._maybe_append_proposals(loop)
            self._check_reads()
            # Let the servers run between Readies: a node catching up on a
            # long log applies it in bounded steps (QuorumConfig.max_apply_bytes).
            await asyncio.sleep(0)

    async def _persist(self, loop: asyncio.AbstractEventLoop, ready: Ready) -> None:
        """Write on the loop while writes are fast (a thread hand-off costs
        more than a fast fsync), in the I/O thread once they are not, so a
        slow disk never stalls the loop for long.  The choice follows a
        moving average of recent write times."""
        if self._persist_ewma_s < INLINE_PERSIST_S:
            start = time.perf_counter()
            self.storage.persist(ready)
            elapsed = time.perf_counter() - start
        else:
            start = time.perf_counter()
            await loop.run_in_executor(self._io, self.storage.persist, ready)
            elapsed = time.perf_counter() - start
            # Measured across the hand-off; keep probing the inline path now
            # and then so a disk that became fast again is noticed.
            self._offloaded += 1
            if self._offloaded % 64 == 0:
                elapsed = min(elapsed, INLINE_PERSIST_S / 2)
        self._persist_ewma_s = 0.8 * self._persist_ewma_s + 0.2 * elapsed

    def _apply(self, ready: Ready) -> None:
        sm = self.state_machine
        if ready.load_snapshot is not None:
            sid = ready.load_snapshot
            size = self.storage.snapshots.size(sid)
            if size is None:
                raise RuntimeError(f"snapshot {sid} to load is missing")
            sm.handle_load_snapshot(sid, self.storage.snapshots.read(sid, 0, size))
            self.last_snapshot_offset = sid.end_offset
            log.info("node %d loaded snapshot %d-%d", self.node_id, sid.end_offset, sid.epoch)
            self._fail_inflight_below(sid.end_offset)
        if ready.leader_change is not None:
            sm.handle_leader_change(ready.leader_change)
            self._log_leader_change(ready.leader_change, ready.role)
        for batch in ready.committed:
            self._applied_bytes += batch.size_bytes
            results = sm.handle_commit(batch)
            self._resolve(batch, results)

    def _resolve(self, batch: Batch, results: Sequence[object]) -> None:
        for base in [b for b in self._inflight if b < batch.end_offset]:
            inflight = self._inflight.pop(base)
            committed = base == batch.base_offset and inflight.epoch == batch.epoch
            now = time.monotonic()
            for future, first, count, queued_at in inflight.parts:
                if future.done():
                    continue
                if committed and self.metrics is not None:
                    self.metrics.commit_latency.observe(now - queued_at)
                if committed:
                    future.set_result(
                        ProposalOutcome(
                            batch.base_offset + first,
                            batch.epoch,
                            tuple(results[first : first + count]),
                        )
                    )
                else:
                    # Another batch committed at this offset: ours never will.
                    future.set_exception(self._not_leader())

    def _fail_inflight_below(self, offset: int) -> None:
        for base in [b for b in self._inflight if b < offset]:
            for future, _, _, _ in self._inflight.pop(base).parts:
                if not future.done():
                    future.set_exception(
                        IndeterminateError(
                            "a snapshot replaced the log before the write's outcome was seen"
                        )
                    )

    def _note_role(self) -> None:
        """Say in words how the node's role changed (elections are logged
        with the leader change they produce)."""
        role = self.core.role
        if role is self._last_role:
            return
        n, epoch = self.node_id, self.core.epoch
        if self._last_role is Role.LEADER:
            log.info("node %d resigned leadership of epoch %d", n, epoch)
        if role is Role.PROSPECTIVE and self.core.at_last_epoch:
            log.error(
                "node %d has no live leader and cannot start an election: epoch %d is the "
                "last an int32 leaves room after; it follows a leader of this epoch if one "
                "announces itself",
                n,
                epoch,
            )
        elif role is Role.PROSPECTIVE:
            log.info("node %d has no live leader; asking for pre-votes in epoch %d", n, epoch)
        elif role is Role.CANDIDATE:
            log.info("node %d is a candidate in epoch %d", n, epoch)
        self._last_role = role

    def _log_changes(self, ready: Ready) -> None:
        """Say in words what this Ready did to the log."""
        n = self.node_id
        self._note_role()
        if ready.truncate_to is not None:
            log.warning(
                "node %d truncated its log to offset %d: it diverged from the leader's",
                n,
                ready.truncate_to,
            )
        if ready.reset_to_snapshot is not None:
            sid = ready.reset_to_snapshot
            log.info(
                "node %d replaced its log by the leader's snapshot %d-%d",
                n,
                sid.end_offset,
                sid.epoch,
            )

    def _log_leader_change(self, leader: LeaderAndEpoch, role: Role) -> None:
        if role is Role.LEADER:
            log.info("node %d elected leader of epoch %d", self.node_id, leader.epoch)
        elif leader.leader_id is not None:
            log.info(
                "node %d follows leader %d in epoch %d",
                self.node_id,
                leader.leader_id,
                leader.epoch,
            )
        else:
            log.info(
                "node %d in epoch %d with no known leader (%s)",
                self.node_id,
                leader.epoch,
                role.value,
            )

    def _maybe_snapshot(self, loop: asyncio.AbstractEventLoop) -> None:
        every = self.options.snapshot_every_offsets
        every_bytes = self.options.snapshot_every_bytes
        applied = self.state_machine.applied_offset
        by_offsets = every > 0 and applied - self.last_snapshot_offset >= every
        by_bytes = every_bytes > 0 and self._applied_bytes >= every_bytes
        if not (by_offsets or by_bytes) or applied <= self.last_snapshot_offset:
            return
        writing = self._snapshot_task is not None and not self._snapshot_task.done()
        if self._applied_bytes < self._last_snapshot_bytes or writing:
            return  # amortise (a snapshot costs the whole state); one at a time
        epoch = self.core.log.epoch_of_end(applied)
        if epoch is None or not self.core.log.batch_ending_at(applied):
            return
        sid = SnapshotId(applied, epoch)
        # Capture now, encode and write in the I/O thread while the node goes
        # on (one snapshot at a time); the log is compacted when it is done.
        self.last_snapshot_offset = applied
        self._applied_bytes = 0
        encode = self.state_machine.capture_snapshot()
        self._snapshot_task = loop.create_task(self._write_snapshot(loop, sid, encode))

    async def _write_snapshot(
        self, loop: asyncio.AbstractEventLoop, sid: SnapshotId, encode: Callable[[], bytes]
    ) -> None:
        try:

            def write() -> int:
                data = encode()
                self.storage.snapshots.create(sid, data)
                return len(data)

            size = await loop.run_in_executor(self._io, write)
            if self._stopping or self.failure is not None:
                return
            self.core.snapshot_created(sid)
            self._last_snapshot_bytes = size
            self._wakeup.set()  # the compaction goes out in the next Ready
            log.info(
                "node %d wrote snapshot %d-%d (%d bytes)",
                self.node_id,
                sid.end_offset,
                sid.epoch,
                size,
            )
        except Exception:
            log.exception(
                "node %d could not write snapshot %d-%d", self.node_id, sid.end_offset, sid.epoch
            )

    def _fail_all(self, exc: BaseException) -> None:
        for p in self._proposals:
            if not p.future.done():
                p.future.set_exception(exc)
        self._proposals.clear()
        for inflight in self._inflight.values():
            for future, _, _, _ in inflight.parts:
                if not future.done():
                    future.set_exception(IndeterminateError(str(exc)))
        self._inflight.clear()
        for _, read, _ in self._reads:
            if not read.done():
                read.set_exception(exc)
        self._reads.clear()


def _read_outcome(future: asyncio.Future[ProposalOutcome]) -> None:
    if not future.cancelled():
        future.exception()


def _needs_persist(ready: Ready) -> bool:
    return bool(
        ready.snapshot_chunks
        or ready.reset_to_snapshot
        or ready.truncate_to is not None
        or ready.entries
        or ready.compact_to
        or ready.quorum_state
    )

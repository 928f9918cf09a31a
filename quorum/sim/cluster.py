"""A simulated cluster: nodes, network, a client workload and the checker."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from quorum.config import QuorumConfig
from quorum.core import NotLeaderError, RaftCore
from quorum.messages import Message
from quorum.sim.history import SimHistory
from quorum.sim.invariants import InvariantChecker, Violation
from quorum.sim.network import Network, NetworkConditions
from quorum.sim.node import CoreFactory, NodeHooks, SimNode
from quorum.sim.scheduler import EventScheduler
from quorum.types import Batch, NodeId, Role, SnapshotId, VoterSet

__all__ = ["SimCluster", "SimConfig", "SimResult"]

# Fast timeouts keep simulated runs short in events; the protocol is the
# same at any scale of time.
SIM_QUORUM_CONFIG = QuorumConfig(
    election_timeout_ms=300,
    fetch_timeout_ms=600,
    election_backoff_max_ms=300,
    retry_backoff_ms=20,
    fetch_max_wait_ms=200,
    request_timeout_ms=250,
    fetch_max_bytes=2048,
    snapshot_chunk_bytes=64,
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    voters: int = 3
    observers: int = 0
    quorum: QuorumConfig = SIM_QUORUM_CONFIG
    min_delay_ms: int = 1
    max_delay_ms: int = 10
    # The client proposes one batch this often, to the node it believes leads.
    propose_interval_ms: int = 50
    # Take a snapshot after this many newly applied offsets (0: never).
    snapshot_every: int = 40


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    ok: bool
    violation: str | None
    events: int
    virtual_ms: int
    messages_sent: int
    messages_dropped: int
    proposals: int
    acknowledged: int
    elections: int
    max_epoch: int
    committed_offset: int
    trace: tuple[str, ...] = field(default=(), repr=False)


class SimCluster:
    def __init__(
        self,
        seed: int,
        config: SimConfig | None = None,
        core_factory: CoreFactory = RaftCore,
        history: SimHistory | None = None,
    ) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
        self.scheduler = EventScheduler()
        self.network = Network(
            self.scheduler,
            random.Random(self.rng.getrandbits(64)),
            self._deliver,
            NetworkConditions(self.config.min_delay_ms, self.config.max_delay_ms),
        )
        self.voter_ids = list(range(1, self.config.voters + 1))
        self.observer_ids = [self.config.voters + i for i in range(1, self.config.observers + 1)]
        voters = VoterSet(frozenset(self.voter_ids))
        self.checker = InvariantChecker(frozenset(self.voter_ids))
        hooks = NodeHooks(self._send, self._on_apply, self._on_load)
        self.nodes: dict[NodeId, SimNode] = {
            n: SimNode(
                n, voters, self.config.quorum, core_factory, hooks, self.config.snapshot_every
            )
            for n in self.voter_ids + self.observer_ids
        }
        self.trace: list[str] = []
        self._last_seen: dict[NodeId, tuple[Role, int, NodeId | None]] = {}
        self.pending: dict[tuple[int, int], tuple[bytes, ...]] = {}
        self.acked: dict[tuple[int, int], tuple[bytes, ...]] = {}
        self.proposals = 0
        self.client_running = False
        # Records the run as a history and node exports (None: not recorded).
        self.history = history
        if history is not None:
            history.bind(lambda: self.scheduler.now, sorted(self.nodes))

    # -- plumbing ------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.scheduler.now

    def log(self, text: str) -> None:
        self.trace.append(f"t={self.now:>7} {text}")

    def start(self) -> None:
        for node in self.nodes.values():
            self._start_node(node)

    def _start_node(self, node: SimNode) -> None:
        node.start(self.now, random.Random(self.rng.getrandbits(64)))
        self._after(node)

    def _send(self, msg: Message) -> None:
        self.checker.on_send(self.nodes[msg.src], msg)
        self.network.send(msg)

    def _deliver(self, msg: Message) -> None:
        node = self.nodes.get(msg.dst)
        if node is None or node.core is None:
            return
        node.core.step(msg, self.now)
        self._after(node)

    def _after(self, node: SimNode) -> None:
        node.process_ready()
        self._schedule_timer(node)
        self._observe(node)

    def _schedule_timer(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        node.timer_generation += 1
        generation = node.timer_generation
        self.scheduler.at(core.next_deadline_ms(), lambda: self._on_timer(node, generation))

    def _on_timer(self, node: SimNode, generation: int) -> None:
        if generation != node.timer_generation or node.core is None:
            return
        node.core.tick(self.now)
        if node.core.next_deadline_ms() <= self.now:
            node.idle_ticks += 1
            if node.idle_ticks > 100:
                raise Violation(
                    "TimerSpin",
                    f"node {node.node_id} keeps asking for a tick at {self.now} "
                    f"({node.core.role.value})",
                )
        else:
            node.idle_ticks = 0
        self._after(node)

    def _observe(self, touched: SimNode | None = None) -> None:
        """Log role changes and check the invariants.  An event changes only
        the node it ran on (``touched``, a restarted node included); a crash
        passes None so every node is looked at."""
        changed = [touched] if touched is not None else list(self.nodes.values())
        for node in changed:
            core = node.core
            if core is None:
                continue
            seen = (core.role, core.epoch, core.leader_id)
            if self._last_seen.get(node.node_id) != seen:
                self._last_seen[node.node_id] = seen
                if self.history is not None:
                    self.history.changed(node.node_id, core.role.value, core.epoch, core.leader_id)
                leader = f" leader={core.leader_id}" if core.leader_id is not None else ""
                self.log(
                    f"n{node.node_id} {core.role.value} epoch={core.epoch}{leader} "
                    f"log={core.log.start_offset}..{core.log.end_offset} hw={core.high_watermark}"
                )
        self.checker.check(changed, self.nodes.values())

    def _on_apply(self, node: NodeId, batch: Batch, chain: bytes) -> None:
        self.checker.on_apply(node, batch, chain)
        key = (batch.base_offset, batch.epoch)
        records = self.pending.pop(key, None)
        if records is not None:
            if records != batch.records:
                raise Violation(
                    "ConsistentCommittedData",
                    f"proposal at {key} committed with other records",
                )
            self.acked[key] = records
        if self.history is not None:
            self.history.applied(node, batch)

    def _on_load(self, node: NodeId, sid: SnapshotId, chain: bytes) -> None:
        self.checker.on_load(node, sid, chain)

    # -- control -------------------------------------------------------------

    def run_for(self, duration_ms: int) -> None:
        self.scheduler.run_until(self.now + duration_ms)

    def run_until(self, predicate: object, timeout_ms: int) -> bool:
        """Run events until ``predicate()`` holds; False on timeout."""
        assert callable(predicate)
        deadline = self.now + timeout_ms
        while not predicate():
            nxt = self.scheduler.next_time()
            if nxt is None or nxt > deadline:
                self.scheduler.now = max(self.now, deadline)
                return bool(predicate())
            self.scheduler.run_next()
        return True

    @contextmanager
    def fault(self, f: str, value: dict[str, object], *, record: bool = True) -> Iterator[None]:
        """Record the fault the body makes as a nemesis op, if recording (and
        ``record``).  If the body raises, the op stays open (the run ends)."""
        history = self.history if record else None
        if history is not None:
            history.fault_begin(f, value)
        yield
        if history is not None:
            history.fault_end()

    def network_faulted(self) -> bool:
        """Whether a partition, loss or duplication is in force."""
        c = self.network.conditions
        return bool(self.network.blocked) or c.drop_rate > 0 or c.duplicate_rate > 0

    def crash(self, node_id: NodeId, lose_all_unflushed: bool = False) -> None:
        node = self.nodes[node_id]
        if node.core is None:
            return
        with self.fault("kill", {"nodes": [node_id]}):
            node.crash(None if lose_all_unflushed else self.rng)
            self.log(f"n{node_id} CRASH")
            self._observe()

    def restart(self, node_id: NodeId) -> None:
        node = self.nodes[node_id]
        if node.core is not None:
            return
        with self.fault("start", {"nodes": [node_id]}):
            self.log(f"n{node_id} RESTART")
            self._start_node(node)

    def resign(self, node_id: NodeId, preferred: tuple[NodeId, ...] = ()) -> bool:
        """Ask ``node_id`` to resign leadership gracefully (EndQuorumEpoch)."""
        node = self.nodes[node_id]
        if node.core is None:
            return False
        if self.history is not None:
            self.history.fault_begin("resign", {"nodes": [node_id], "successors": list(preferred)})
        resigned = node.core.resign(preferred, self.now)
        if self.history is not None:
            self.history.fault_end(resigned, "not-leader")
        if not resigned:
            return False
        self.log(f"n{node_id} RESIGN preferred={list(preferred)}")
        self._after(node)
        return True

    def leader(self) -> SimNode | None:
        """The live leader of the highest epoch, if any."""
        best: SimNode | None = None
        best_epoch = -1
        for node in self.nodes.values():
            core = node.core
            if core is not None and core.role is Role.LEADER and core.epoch > best_epoch:
                best, best_epoch = node, core.epoch
        return best

    def propose(self, records: tuple[bytes, ...]) -> tuple[int, int] | None:
        """Propose to the node that looks like the leader; returns the
        (offset, epoch) the proposal will commit at, or None if none leads."""
        node = self.leader()
        if node is None or node.core is None:
            return None
        history = self.history
        process = history.invoke_write(node.node_id, records) if history is not None else 0
        try:
            result = node.core.propose(records, self.now)
        except NotLeaderError:
            if history is not None:
                history.refused(process)
            return None
        self.proposals += 1
        key = (result.base_offset, result.epoch)
        self.pending[key] = records
        if history is not None:
            history.appended(process, *key)
        self._after(node)
        return key

    def start_client(self) -> None:
        if self.client_running:
            return
        self.client_running = True
        self.scheduler.after(self.config.propose_interval_ms, self._client_step)

    def stop_client(self) -> None:
        self.client_running = False

    def _client_step(self) -> None:
        if not self.client_running:
            return
        count = 1 + self.rng.randrange(3)
        self.propose(tuple(f"s{self.seed}-p{self.proposals}-r{i}".encode() for i in range(count)))
        self.scheduler.after(self.config.propose_interval_ms, self._client_step)

    # -- final checks ----------------------------------------------------------

    def check_converged(self) -> None:
        """ConsistentCommittedData at the end: every live node applied the
        same prefix, and every acknowledged proposal is in it."""
        live = [n for n in self.nodes.values() if n.core is not None]
        ends = {n.node_id: n.machine.applied_end for n in live}
        if len(set(ends.values())) != 1:
            raise Violation("Convergence", f"nodes applied different prefixes: {ends}")
        chains = {n.machine.chain for n in live}
        if len(chains) != 1:
            raise Violation("ConsistentCommittedData", "equal applied offsets, different chains")
        end = next(iter(ends.values()))
        for (base, epoch), records in sorted(self.acked.items()):
            if base >= end:
                raise Violation(
                    "LostAcknowledgedWrite",
                    f"proposal at offset {base} epoch {epoch} was acknowledged but the "
                    f"final committed log ends at {end}",
                )
            applied = self.checker.applied_batches.get(base)
            if applied != (epoch, records):
                raise Violation(
                    "LostAcknowledgedWrite",
                    f"proposal at offset {base} epoch {epoch} was acknowledged but "
                    f"offset {base} holds {applied}",
                )

    def all_applied(self, offset: int) -> bool:
        return all(
            n.machine.applied_end >= offset for n in self.nodes.values() if n.core is not None
        )

    def result(self, violation: str | None) -> SimResult:
        return SimResult(
            seed=self.seed,
            ok=violation is None,
            violation=violation,
            events=self.scheduler.events_run,
            virtual_ms=self.now,
            messages_sent=self.network.sent,
            messages_dropped=self.network.dropped,
            proposals=self.proposals,
            acknowledged=len(self.acked),
            elections=len(self.checker.leaders),
            max_epoch=max(self.checker.epochs.values(), default=0),
            committed_offset=self.checker.max_committed,
            trace=tuple(self.trace),
        )

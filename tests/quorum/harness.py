"""An interaction environment for the consensus core: real ``RaftCore``s
driven through ``quorum.sim.node.SimNode`` (stores, the Ready contract, a
hash-chain state machine), a *manual* network and a manual clock.  Scenario
scripts (tests/quorum/testdata/*.txt, run by tests/datadriven.py) drive it
one command at a time; nothing happens unless a command makes it happen.

Network: a message a node sends is queued, not delivered, until ``deliver``
or ``stabilize`` hands it to its destination.  Messages across a partition,
or to a node that is down, are dropped when they would be delivered.

Time: a global virtual clock moved only by ``advance``; output shows it as
``t=``.  ``campaign`` and ``tick`` run a single node's clock ahead (printed
as a jump); from then on that node's clock stays that far ahead of the
global one, as a skewed clock would, and all its timers keep their lengths.

After every input to a node (a message, a timer, a command) the simulator's
``InvariantChecker`` checks every node, so every scenario also proves the
safety properties it passes through.

Output: each input to a node (a delivered message, a timer shown as
``t=<global time> nN tick``) is a line, and what it caused is indented
below it: role changes (``n1 becomes candidate epoch=2``), then the node's
Ready in the order the driver carries it out: ``writes snapshot``,
``replaces its log``, ``truncates``, ``appends``, ``compacts``, ``persists``
(quorum state), ``fsync``, ``sends`` (queued), ``hw=`` (the high watermark
moved), ``loads snapshot``, ``applies``.

Commands (message and batch notation in tests/quorum/describe.py):

- ``add-nodes voters=(1,2,3) [observers=(4)] [snapshot-every=N] [seed=S]``
- ``campaign N``: run N's timers (its clock only) until it asks for votes.
- ``tick N [ms=X]``: fire N's next timer, or run N's clock X ms ahead.
- ``advance ms=X``: move the global clock, firing every node's due timers in
  time order (nodes in id order at the same instant).
- ``deliver [from=N] [to=N] [drop]``: deliver (or drop) the queued messages
  that match, in the order sent; what they cause stays queued.
- ``stabilize``: deliver until nothing is queued (the clock stands still).
- ``propose N rec...``, ``resign N [preferred=(..)]``, ``snapshot N``
- ``partition (1) (2,3)``, ``heal``, ``crash N``, ``restart N``
- ``status [N]``, ``roles``, ``log N``, ``hw``, ``queued``

Any command given the bare word ``quiet`` prints nothing (for set-up steps
that other scenarios show in full); a query afterwards shows the outcome.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from quorum.config import QuorumConfig
from quorum.core import InvalidProposalError, NotLeaderError, RaftCore
from quorum.messages import Message, VoteRequest
from quorum.ready import Ready
from quorum.sim.invariants import InvariantChecker
from quorum.sim.node import NodeHooks, SimNode
from quorum.types import NodeId, Role, SnapshotId, VoterSet
from tests.datadriven import CmdArg, TestData
from tests.quorum.describe import (
    describe_batch,
    describe_batch_short,
    describe_message,
    describe_snapshot,
    describe_state,
)

__all__ = ["CONFIG", "InteractionEnv"]

# Small round numbers so scripts can reason about time, and tiny sizes so
# that fetches return about one batch and snapshots travel in several chunks.
CONFIG = QuorumConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=200,
    election_backoff_max_ms=100,
    retry_backoff_ms=20,
    fetch_max_wait_ms=50,
    request_timeout_ms=100,
    fetch_max_bytes=32,
    snapshot_chunk_bytes=48,
)

MAX_SPIN = 50  # timer firings of one node at one instant before we call it a spin
MAX_DELIVERIES = 10_000  # per stabilize


class TracedCore(RaftCore):
    """A RaftCore that describes every Ready it hands out, in the order the
    driver carries it out (persist, fsync, send, apply)."""

    def __init__(self, env: InteractionEnv, *args: Any, **kwargs: Any) -> None:
        self._env = env
        super().__init__(*args, **kwargs)

    def ready(self) -> Ready | None:
        ready = super().ready()
        if ready is not None:
            self._env.describe_ready(self.node_id, ready)
        return ready

    def snapshot_created(self, snapshot_id: SnapshotId) -> None:
        if snapshot_id.end_offset > self.log.start_offset:
            self._env.emit(f"n{self.node_id} takes snapshot {describe_snapshot(snapshot_id)}")
        super().snapshot_created(snapshot_id)


class InteractionEnv:
    def __init__(self) -> None:
        self.nodes: dict[NodeId, SimNode] = {}
        self.queue: list[Message] = []
        self.now = 0
        # How far each node's clock runs ahead of the global one.
        self.skew: dict[NodeId, int] = {}
        self.groups: list[set[NodeId]] = []
        self.checker: InvariantChecker | None = None
        self.seed = 0
        self.out: list[str] = []
        self.indent = ""
        self._seen: dict[NodeId, tuple[Role, int, NodeId | None]] = {}
        self._hw: dict[NodeId, int] = {}

    # -- output ------------------------------------------------------------

    def emit(self, line: str) -> None:
        self.out.append(self.indent + line)

    def describe_ready(self, node_id: NodeId, r: Ready) -> None:
        n = f"n{node_id}"
        early = " (before the fsync)" if r.must_sync else ""
        for msg in r.early_messages:
            self.emit(f"{n} sends {describe_message(msg)}{early}")
        for chunk in r.snapshot_chunks:
            end = chunk.position + len(chunk.data)
            done = " (complete)" if chunk.done else ""
            name = describe_snapshot(chunk.snapshot_id)
            self.emit(f"{n} writes snapshot {name} bytes {chunk.position}..{end}{done}")
        if r.reset_to_snapshot is not None:
            self.emit(f"{n} replaces its log by snapshot {describe_snapshot(r.reset_to_snapshot)}")
        if r.truncate_to is not None:
            self.emit(f"{n} truncates its log to {r.truncate_to}")
        if r.entries:
            self.emit(f"{n} appends " + " ".join(describe_batch_short(b) for b in r.entries))
        if r.compact_to is not None:
            sid = r.compact_to
            self.emit(
                f"{n} compacts its log to {sid.end_offset} (snapshot {describe_snapshot(sid)})"
            )
        if r.quorum_state is not None:
            self.emit(f"{n} persists {describe_state(r.quorum_state)}")
        if r.must_sync:
            self.emit(f"{n} fsync")
        for msg in r.messages:
            self.emit(f"{n} sends {describe_message(msg)}")
        if r.high_watermark != self._hw.get(node_id, 0):
            self._hw[node_id] = r.high_watermark
            self.emit(f"{n} hw={r.high_watermark}")
        if r.load_snapshot is not None:
            self.emit(f"{n} loads snapshot {describe_snapshot(r.load_snapshot)}")
        if r.committed:
            self.emit(f"{n} applies " + " ".join(describe_batch_short(b) for b in r.committed))

    def _note_role(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        seen = (core.role, core.epoch, core.leader_id)
        if self._seen.get(node.node_id) != seen:
            self._seen[node.node_id] = seen
            leader = f" leader={core.leader_id}" if core.role is Role.FOLLOWER else ""
            self.emit(f"n{node.node_id} becomes {core.role.value} epoch={core.epoch}{leader}")

    # -- plumbing ------------------------------------------------------------

    def handle(self, td: TestData) -> str:
        self.out = []
        handler = getattr(self, "cmd_" + td.cmd.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown command {td.cmd!r}")
        quiet = CmdArg("quiet") in td.args
        td.args = [a for a in td.args if a != CmdArg("quiet")]
        handler(td)
        if quiet:
            return ""
        return "".join(line + "\n" for line in self.out)

    def _node(self, node_id: NodeId) -> SimNode:
        if node_id not in self.nodes:
            raise ValueError(f"no node {node_id}")
        return self.nodes[node_id]

    def _up(self, node_id: NodeId) -> tuple[SimNode, RaftCore]:
        node = self._node(node_id)
        if node.core is None:
            raise ValueError(f"node {node_id} is down")
        return node, node.core

    def _node_arg(self, td: TestData, index: int = 0) -> NodeId:
        return int(td.pos()[index].key)

    def _time(self, node_id: NodeId) -> int:
        """A node's own clock: the global clock plus how far ahead it runs."""
        return self.now + self.skew.get(node_id, 0)

    def _input(self, node: SimNode, action: Callable[[RaftCore], None]) -> None:
        """Give one input to a node, then carry out its Ready and check."""
        core = node.core
        assert core is not None
        action(core)
        self._note_role(node)
        node.process_ready()
        self._check()

    def _check(self) -> None:
        assert self.checker is not None
        self.checker.check(self.nodes.values())

    def _send(self, msg: Message) -> None:
        # The checker's Ready-contract checks on a leaving message: a granted
        # vote is durable, a fetch offset is durable.
        assert self.checker is not None
        self.checker.on_send(self.nodes[msg.src], msg)
        self.queue.append(msg)

    def _blocked(self, src: NodeId, dst: NodeId) -> bool:
        gs = [g for g in self.groups if src in g or dst in g]
        return bool(gs) and not any(src in g and dst in g for g in gs)

    def _start(self, node: SimNode) -> None:
        rng = random.Random(f"{self.seed}:{node.node_id}:{node.incarnation + 1}")
        node.start(self._time(node.node_id), rng)
        assert node.core is not None
        self._seen.pop(node.node_id, None)
        self._hw[node.node_id] = node.core.high_watermark

    # -- setup -----------------------------------------------------------------

    def cmd_add_nodes(self, td: TestData) -> None:
        if self.nodes:
            raise ValueError("add-nodes: the cluster already exists")
        voters = td.int_list("voters")
        observers = td.int_list("observers")
        self.seed = td.int_arg("seed", 0)
        every = td.int_arg("snapshot-every", 0)
        voter_set = VoterSet(frozenset(voters))
        self.checker = InvariantChecker(frozenset(voters))
        hooks = NodeHooks(self._send, self.checker.on_apply, self.checker.on_load)

        def factory(*args: Any, **kwargs: Any) -> RaftCore:
            return TracedCore(self, *args, **kwargs)

        for n in voters + observers:
            node = SimNode(n, voter_set, CONFIG, factory, hooks, every)
            self.nodes[n] = node
            self._start(node)
            self._input(node, lambda core: None)

    # -- time ------------------------------------------------------------------

    def _fire(self, node: SimNode) -> list[Message]:
        """Tick ``node`` at its clock; returns what it sent."""
        at = self._time(node.node_id)
        mark, sent = len(self.out), len(self.queue)
        self.indent = "  "
        try:
            self._input(node, lambda core: core.tick(at))
        finally:
            self.indent = ""
        if len(self.out) > mark:
            self.out.insert(mark, f"t={self.now} n{node.node_id} tick")
        return self.queue[sent:]

    def _jump(self, node_id: NodeId, to: int) -> None:
        """Run one node's clock ahead to ``to`` (its own time)."""
        delta = to - self._time(node_id)
        if delta > 0:
            self.skew[node_id] = self.skew.get(node_id, 0) + delta
            self.emit(f"n{node_id}'s clock jumps {delta}ms ahead")

    def cmd_campaign(self, td: TestData) -> None:
        node, core = self._up(self._node_arg(td))
        if not core.is_voter or core.role is Role.LEADER:
            raise ValueError(f"node {node.node_id} cannot campaign ({core.role.value})")
        for _ in range(MAX_SPIN):
            self._jump(node.node_id, core.next_deadline_ms())
            sent = self._fire(node)
            if core.role is Role.LEADER or any(isinstance(m, VoteRequest) for m in sent):
                return
        raise AssertionError(f"node {node.node_id} never started an election")

    def cmd_tick(self, td: TestData) -> None:
        node, core = self._up(self._node_arg(td))
        if not td.has("ms"):
            self._jump(node.node_id, core.next_deadline_ms())
            self._fire(node)
            return
        target = self._time(node.node_id) + td.int_arg("ms")
        for _ in range(MAX_SPIN):
            if core.next_deadline_ms() > target:
                self._jump(node.node_id, target)
                return
            self._jump(node.node_id, core.next_deadline_ms())
            self._fire(node)
        raise AssertionError(f"node {node.node_id}'s timer spins at {self._time(node.node_id)}")

    def cmd_advance(self, td: TestData) -> None:
        target = self.now + td.int_arg("ms")
        spins: dict[tuple[NodeId, int], int] = {}
        while True:
            # When each node's next timer is due, in global time.
            due = {
                n: node.core.next_deadline_ms() - self.skew.get(n, 0)
                for n, node in sorted(self.nodes.items())
                if node.core is not None
            }
            if not due or min(due.values()) > target:
                break
            self.now = max(self.now, min(due.values()))
            for n, node in sorted(self.nodes.items()):
                core = node.core
                if core is None or core.next_deadline_ms() > self._time(n):
                    continue
                key = (n, self.now)
                spins[key] = spins.get(key, 0) + 1
                if spins[key] > MAX_SPIN:
                    raise AssertionError(f"node {n}'s timer spins at {self.now}")
                self._fire(node)
        self.now = target

    # -- the network -----------------------------------------------------------

    def _deliver(self, msg: Message) -> None:
        text = describe_message(msg)
        node = self.nodes.get(msg.dst)
        if self._blocked(msg.src, msg.dst):
            self.emit(f"{text} [dropped: partition]")
            return
        if node is None or node.core is None:
            self.emit(f"{text} [dropped: n{msg.dst} down]")
            return
        self.emit(text)
        at = self._time(msg.dst)
        self.indent = "  "
        try:
            self._input(node, lambda core: core.step(msg, at))
        finally:
            self.indent = ""

    def cmd_deliver(self, td: TestData) -> None:
        src = td.int_arg("from", -1)
        dst = td.int_arg("to", -1)
        drop = td.has("drop")
        batch = [m for m in self.queue if (src < 0 or m.src == src) and (dst < 0 or m.dst == dst)]
        if not batch:
            self.emit("no messages")
        for msg in batch:
            self.queue.remove(msg)
            if drop:
                self.emit(f"{describe_message(msg)} [dropped]")
            else:
                self._deliver(msg)

    def cmd_stabilize(self, td: TestData) -> None:
        count = 0
        while self.queue:
            count += 1
            if count > MAX_DELIVERIES:
                raise AssertionError("stabilize: messages keep flowing")
            self._deliver(self.queue.pop(0))

    def cmd_queued(self, td: TestData) -> None:
        for msg in self.queue:
            self.emit(describe_message(msg))
        if not self.queue:
            self.emit("no messages")

    def cmd_partition(self, td: TestData) -> None:
        self.groups = [{int(v) for v in a.vals} for a in td.pos()]

    def cmd_heal(self, td: TestData) -> None:
        self.groups = []

    # -- node commands -----------------------------------------------------------

    def cmd_propose(self, td: TestData) -> None:
        args = td.pos()
        node, _ = self._up(int(args[0].key))
        records = [a.key.encode() for a in args[1:]]

        def propose(core: RaftCore) -> None:
            try:
                result = core.propose(records, self._time(node.node_id))
            except (NotLeaderError, InvalidProposalError) as exc:
                self.emit(f"n{node.node_id} rejects the proposal: {exc}")
                return
            self.emit(
                f"n{node.node_id} accepts the proposal at "
                f"{result.base_offset}..{result.last_offset + 1} epoch={result.epoch}"
            )

        self._input(node, propose)

    def cmd_resign(self, td: TestData) -> None:
        node, _ = self._up(self._node_arg(td))
        preferred: Sequence[NodeId] = td.int_list("preferred")

        def resign(core: RaftCore) -> None:
            if not core.resign(preferred, self._time(node.node_id)):
                self.emit(f"n{node.node_id} is not the leader")

        self._input(node, resign)

    def cmd_snapshot(self, td: TestData) -> None:
        node, _ = self._up(self._node_arg(td))

        def snapshot(core: RaftCore) -> None:
            sid, data = node.machine.snapshot()
            node.stores.snapshots.create(sid, data)
            self.emit(
                f"n{node.node_id} stores snapshot {describe_snapshot(sid)} ({len(data)} bytes)"
            )
            core.snapshot_created(sid)

        self._input(node, snapshot)

    def cmd_crash(self, td: TestData) -> None:
        node, _ = self._up(self._node_arg(td))
        log, state = node.stores.log, node.stores.state
        lost_log = log.read_all() != log.durable_batches()
        lost_state = state.read() != state.durable()
        node.crash(None)
        self.emit(f"n{node.node_id} crashes")
        if lost_log:
            self.emit(f"n{node.node_id} loses unflushed log writes")
        if lost_state:
            self.emit(f"n{node.node_id} loses its unflushed quorum state")
        self._seen.pop(node.node_id, None)
        self._check()

    def cmd_restart(self, td: TestData) -> None:
        node = self._node(self._node_arg(td))
        if node.core is not None:
            raise ValueError(f"node {node.node_id} is up")
        self._start(node)
        core = node.core
        assert core is not None
        state = node.stores.state.read()
        stored = describe_state(state) if state is not None else "nothing"
        self.emit(
            f"n{node.node_id} restarts: stored {stored}, "
            f"log {core.log.start_offset}..{core.log.end_offset}"
        )
        self._input(node, lambda core: None)

    # -- queries -------------------------------------------------------------------

    def cmd_status(self, td: TestData) -> None:
        ids = [int(a.key) for a in td.pos()] or sorted(self.nodes)
        for n in ids:
            core = self._node(n).core
            if core is None:
                self.emit(f"n{n} down")
                continue
            s = core.status()
            kind = "" if s.is_voter else " observer"
            leader = "-" if s.leader_id is None else str(s.leader_id)
            voted = "-" if s.voted_for is None else str(s.voted_for)
            ahead = self.skew.get(n, 0)
            skew = f" clock=+{ahead}ms" if ahead else ""
            self.emit(
                f"n{n}{kind} {s.role.value} epoch={s.epoch} leader={leader} voted={voted} "
                f"hw={s.high_watermark} log={s.log_start_offset}..{s.log_end_offset} "
                f"last-epoch={s.last_epoch} applied={core.applied_offset}{skew}"
            )
            for r in s.replicas:
                if r.node_id == n:
                    continue
                role = "voter" if r.is_voter else "observer"
                ago = (
                    "never"
                    if r.last_fetch_ms is None
                    else f"{self._time(n) - r.last_fetch_ms}ms ago"
                )
                self.emit(f"  n{r.node_id} {role} end={r.log_end_offset} last fetch {ago}")

    def cmd_roles(self, td: TestData) -> None:
        for n, node in sorted(self.nodes.items()):
            core = node.core
            if core is None:
                self.emit(f"n{n} down")
                continue
            leader = "-" if core.leader_id is None else str(core.leader_id)
            self.emit(f"n{n} {core.role.value} epoch={core.epoch} leader={leader}")

    def cmd_log(self, td: TestData) -> None:
        node = self._node(self._node_arg(td))
        if node.core is not None:
            snapshot, batches = node.core.log.snapshot, list(node.core.log.batches())
        else:
            # A node that is down has only what it stored durably.
            self.emit(f"n{node.node_id} is down; it stored:")
            snapshot = node.stores.snapshots.latest()
            batches = node.stores.log.durable_batches()
        if snapshot is not None:
            self.emit(f"snapshot {describe_snapshot(snapshot)}")
        for batch in batches:
            self.emit(describe_batch(batch))
        if snapshot is None and not batches:
            self.emit("empty")

    def cmd_hw(self, td: TestData) -> None:
        parts = []
        for n, node in sorted(self.nodes.items()):
            parts.append(
                f"n{n}=" + ("down" if node.core is None else str(node.core.high_watermark))
            )
        self.emit(" ".join(parts))

"""One simulated node: stores, a core and a state machine, driven exactly
as the Ready contract says (persist, send, apply, advance)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from quorum.config import QuorumConfig
from quorum.core import RaftCore
from quorum.memory import MemoryStores
from quorum.messages import Message
from quorum.ready import Ready
from quorum.sim.machine import HashChainMachine
from quorum.types import Batch, NodeId, SnapshotId, VoterSet

__all__ = ["CoreFactory", "SimNode"]

CoreFactory = Callable[..., RaftCore]


@dataclass(slots=True)
class NodeHooks:
    send: Callable[[Message], None]
    on_apply: Callable[[NodeId, Batch, bytes], None]
    on_load: Callable[[NodeId, SnapshotId, bytes], None]


@dataclass(slots=True)
class SimNode:
    node_id: NodeId
    voters: VoterSet
    config: QuorumConfig
    core_factory: CoreFactory
    hooks: NodeHooks
    snapshot_every: int
    stores: MemoryStores = field(default_factory=MemoryStores.new)
    core: RaftCore | None = None
    machine: HashChainMachine = field(default_factory=HashChainMachine)
    incarnation: int = 0
    timer_generation: int = 0
    readies: int = 0
    # Consecutive ticks after which a timer was still due (a spinning driver).
    idle_ticks: int = 0

    @property
    def up(self) -> bool:
        return self.core is not None

    def start(self, now_ms: int, rng: random.Random) -> None:
        self.incarnation += 1
        self.machine = HashChainMachine()
        self.core = self.core_factory(
            self.node_id,
            self.voters,
            log_store=self.stores.log,
            state_store=self.stores.state,
            snapshot_store=self.stores.snapshots,
            rng=rng,
            now_ms=now_ms,
            config=self.config,
        )

    def crash(self, rng: random.Random | None) -> None:
        """Kill the process: memory is gone, unflushed writes may be lost."""
        self.core = None
        self.timer_generation += 1
        self.stores.crash(rng)

    def process_ready(self) -> None:
        core = self.core
        assert core is not None
        while True:
            ready = core.ready()
            if ready is None:
                return
            self.readies += 1
            for msg in ready.early_messages:
                self.hooks.send(msg)
            self.stores.persist(ready)
            for msg in ready.messages:
                self.hooks.send(msg)
            self._apply(ready)
            core.advance(ready)
            self._maybe_snapshot()

    def _apply(self, ready: Ready) -> None:
        if ready.load_snapshot is not None:
            sid = ready.load_snapshot
            self.machine.load(sid, self.stores.snapshots.get(sid))
            self.hooks.on_load(self.node_id, sid, self.machine.chain)
        for batch in ready.committed:
            self.machine.apply(batch)
            self.hooks.on_apply(self.node_id, batch, self.machine.chain)

    def _maybe_snapshot(self) -> None:
        core = self.core
        assert core is not None
        if self.snapshot_every <= 0:
            return
        since = self.machine.applied_end - core.log.start_offset
        if self.machine.applied_end and since >= self.snapshot_every:
            sid, data = self.machine.snapshot()
            self.stores.snapshots.create(sid, data)
            core.snapshot_created(sid)

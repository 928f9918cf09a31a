"""A simulated network: per-message delay, loss, duplication and partitions.

Reordering comes from independent random delays.  A partition is a set of
blocked directed links; ``heal`` clears them all.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from quorum.messages import Message
from quorum.sim.scheduler import EventScheduler
from quorum.types import NodeId

__all__ = ["Network", "NetworkConditions"]


@dataclass(slots=True)
class NetworkConditions:
    min_delay_ms: int = 1
    max_delay_ms: int = 10
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0


@dataclass(slots=True)
class Network:
    scheduler: EventScheduler
    rng: random.Random
    deliver: Callable[[Message], None]
    conditions: NetworkConditions = field(default_factory=NetworkConditions)
    blocked: set[tuple[NodeId, NodeId]] = field(default_factory=set)
    sent: int = 0
    dropped: int = 0

    def send(self, msg: Message) -> None:
        self.sent += 1
        if (msg.src, msg.dst) in self.blocked:
            self.dropped += 1
            return
        c = self.conditions
        if c.drop_rate and self.rng.random() < c.drop_rate:
            self.dropped += 1
            return
        copies = 2 if c.duplicate_rate and self.rng.random() < c.duplicate_rate else 1
        for _ in range(copies):
            delay = self.rng.randint(c.min_delay_ms, c.max_delay_ms)
            self.scheduler.after(delay, partial(self._arrive, msg))

    def _arrive(self, msg: Message) -> None:
        # A partition made while the message was in flight also stops it.
        if (msg.src, msg.dst) in self.blocked:
            self.dropped += 1
            return
        self.deliver(msg)

    def partition(self, *groups: Iterable[NodeId]) -> None:
        """Only nodes within the same group can talk."""
        sets = [set(g) for g in groups]
        every = set().union(*sets)
        for a in every:
            for b in every:
                if a != b and not any(a in g and b in g for g in sets):
                    self.blocked.add((a, b))

    def isolate(self, node: NodeId, others: Iterable[NodeId]) -> None:
        for o in others:
            if o != node:
                self.blocked.add((node, o))
                self.blocked.add((o, node))

    def heal(self) -> None:
        self.blocked.clear()
        self.conditions = NetworkConditions(
            self.conditions.min_delay_ms, self.conditions.max_delay_ms
        )

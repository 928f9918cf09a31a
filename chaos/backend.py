"""What a chaos test needs of a cluster: :class:`ClusterBackend`, and the
network topologies its faults are built from.

A backend runs one cluster (local processes, containers, ...) and injects
faults into it.  Network faults all come down to one primitive,
:meth:`ClusterBackend.block`: the set of ordered node pairs ``(a, b)``
whose traffic from ``a`` to ``b`` is dropped.  The topology builders below
are pure functions from node ids to such sets:

- :func:`partition_pairs`: nodes talk only within their group;
- :func:`isolate`: one node cut off from all others;
- :func:`halves`: two halves that cannot reach each other;
- :func:`majorities_ring`: every node hears from a majority, no two from
  the same one (one-directional);
- :func:`bridge`: two halves joined only through one node that reaches both.

A one-directional block drops packets, so over TCP it also breaks every
connection the other way (its acknowledgements are dropped): with gRPC,
``(a, b)`` blocked means a and b cannot exchange RPCs in either direction,
but the remaining pairs still make the topologies above.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "Blocked",
    "ClusterBackend",
    "bridge",
    "halves",
    "isolate",
    "majorities_ring",
    "partition_pairs",
    "reaches",
]

Blocked = frozenset[tuple[int, int]]
"""Ordered pairs ``(a, b)``: traffic from node a to node b is dropped."""


@runtime_checkable
class ClusterBackend(Protocol):
    """A cluster under test and its faults.

    Node ids are the cluster's voter ids.  Every fault lasts until it is
    undone (:meth:`resume`, :meth:`restart`, :meth:`heal`) or :meth:`stop`.
    """

    @property
    def nodes(self) -> Sequence[int]:
        """The node ids, ascending."""
        ...

    async def start(self) -> None:
        """Format and start every node; return once a leader is elected."""
        ...

    async def stop(self) -> None:
        """Stop every node, heal every fault and remove all the backend
        created (processes, firewall rules, data).  Safe to call twice and
        after a failed :meth:`start`."""
        ...

    async def kill(self, node: int) -> None:
        """SIGKILL ``node``; it stays down until :meth:`restart`."""
        ...

    async def restart(self, node: int) -> None:
        """Start ``node`` again with its data (stopping it first if it runs);
        return once it answers."""
        ...

    async def pause(self, node: int) -> None:
        """SIGSTOP ``node``: it holds its connections but answers nothing."""
        ...

    async def resume(self, node: int) -> None:
        """SIGCONT a paused ``node``."""
        ...

    async def partition(self, groups: Sequence[Collection[int]]) -> None:
        """Nodes talk only within their group; a node in no group talks to
        none.  Replaces any earlier network fault."""
        ...

    async def block(self, pairs: Collection[tuple[int, int]]) -> None:
        """Drop traffic from ``a`` to ``b`` for each ``(a, b)``, and no other
        traffic between nodes.  Replaces any earlier network fault.
        Clients of the cluster are never blocked."""
        ...

    async def heal(self) -> None:
        """Undo every network fault (the same as ``block(())``)."""
        ...

    def addresses(self) -> Mapping[int, str]:
        """Each node's client address, ``host:port``."""
        ...

    async def collect(self, run_dir: Path) -> None:
        """Stop every node and write what it left into the run folder
        ``run_dir``: text logs under ``logs/`` and each node's exports
        under ``nodes/<id>/`` (``docs/history-format.md``)."""
        ...


# -- topologies --------------------------------------------------------------------


def _check_nodes(nodes: Iterable[int]) -> list[int]:
    out = sorted(set(nodes))
    if not out:
        raise ValueError("no nodes")
    return out


def partition_pairs(nodes: Iterable[int], groups: Sequence[Collection[int]]) -> Blocked:
    """The pairs to block so that nodes talk only within their group (a node
    in no group is isolated).  A node in two groups is an error."""
    all_nodes = _check_nodes(nodes)
    group_of: dict[int, int] = {}
    for i, group in enumerate(groups):
        for n in group:
            if n not in all_nodes:
                raise ValueError(f"node {n} of group {i} is not one of {all_nodes}")
            if n in group_of:
                raise ValueError(f"node {n} is in groups {group_of[n]} and {i}")
            group_of[n] = i
    return frozenset(
        (a, b)
        for a in all_nodes
        for b in all_nodes
        if a != b and (a not in group_of or b not in group_of or group_of[a] != group_of[b])
    )


def isolate(nodes: Iterable[int], node: int) -> Blocked:
    """``node`` can reach no other node, nor they it."""
    all_nodes = _check_nodes(nodes)
    if node not in all_nodes:
        raise ValueError(f"node {node} is not one of {all_nodes}")
    return partition_pairs(all_nodes, [[node], [n for n in all_nodes if n != node]])


def halves(nodes: Iterable[int], rng: random.Random | None = None) -> Blocked:
    """Two halves (the first ``n // 2`` nodes, and the rest: a majority)
    that cannot reach each other; shuffled first with ``rng`` if given."""
    order = _check_nodes(nodes)
    if rng is not None:
        rng.shuffle(order)
    cut = len(order) // 2
    return partition_pairs(order, [order[:cut], order[cut:]])


def majorities_ring(nodes: Iterable[int], rng: random.Random | None = None) -> Blocked:
    """Every node hears from a majority (itself and the next ones around a
    ring), and no two nodes from the same majority.  Needs at least three
    nodes.  Node ``order[k]`` hears from ``order[k .. k + m - 1]`` (mod n,
    ``m = n // 2 + 1``); traffic from any other node to it is blocked."""
    order = _check_nodes(nodes)
    if len(order) < 3:
        raise ValueError(f"a majorities ring needs at least 3 nodes, got {len(order)}")
    if rng is not None:
        rng.shuffle(order)
    n = len(order)
    m = n // 2 + 1
    pairs: set[tuple[int, int]] = set()
    for k, node in enumerate(order):
        hears = {order[(k + j) % n] for j in range(m)}
        pairs.update((src, node) for src in order if src not in hears)
    return frozenset(pairs)


def bridge(nodes: Iterable[int], rng: random.Random | None = None) -> Blocked:
    """Two halves that cannot reach each other, and one node (the bridge)
    that reaches both.  Needs at least three nodes; the bridge is the middle
    one of the (shuffled, if ``rng``) order."""
    order = _check_nodes(nodes)
    if len(order) < 3:
        raise ValueError(f"a bridge needs at least 3 nodes, got {len(order)}")
    if rng is not None:
        rng.shuffle(order)
    mid = len(order) // 2
    left, right = order[:mid], order[mid + 1 :]
    return frozenset(pair for a in left for b in right for pair in ((a, b), (b, a)))


def reaches(pairs: Collection[tuple[int, int]], nodes: Iterable[int]) -> dict[int, set[int]]:
    """For each node, the nodes it hears from (itself included) under ``pairs``."""
    all_nodes = _check_nodes(nodes)
    blocked = set(pairs)
    return {b: {a for a in all_nodes if (a, b) not in blocked} for b in all_nodes}

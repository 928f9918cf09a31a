"""What a chaos test needs of a cluster: :class:`ClusterBackend`, and the
network topologies its faults are built from.

A backend runs one cluster (local processes, containers, ...) and injects
faults into it.  A network topology is a list of *groups* of node ids with
one rule: **two nodes can talk if and only if some group holds both; a node
in no group talks to nobody**.  Disjoint groups split the cluster; groups
may overlap, to make links that are not transitive (the bridge, the ring).
The builders below are pure functions from node ids to such groups
(:data:`Groups`):

- :func:`isolate`: one node cut off from all others;
- :func:`halves`: two halves that cannot reach each other;
- :func:`bridge`: two halves that share one node (the bridge);
- :func:`majorities_ring`: 2-node groups around a ring, so that every node
  talks to a majority (itself included) and no two to the same one;
- :func:`partition_groups`: one of them by its kind name
  (:data:`TOPOLOGIES`), shuffled by a given :class:`random.Random`.

Backends carry groups out with the one primitive :meth:`ClusterBackend.block`:
the set of ordered node pairs ``(a, b)`` whose traffic from ``a`` to ``b``
is dropped, :func:`partition_pairs` of the groups.  A one-directional block
drops packets, so over TCP it also breaks every connection the other way
(its acknowledgements are dropped): with gRPC, ``(a, b)`` blocked means a
and b cannot exchange RPCs in either direction.  :func:`reaches` and
:func:`majority_available` say who hears whom under a network fault.

The other network fault, :meth:`ClusterBackend.packet`, makes every link
between two nodes slow and lossy without cutting any off
(:func:`check_packet` checks its numbers).

A backend's cluster runs mutual TLS unless made insecure
(:attr:`ClusterBackend.security_protocol`): its nodes' certificates come
from a CA of the run's own, the harness's clients present the admin user's
(:meth:`ClusterBackend.client_credentials`), and
:meth:`ClusterBackend.rotate_certs` re-issues the nodes' certificates while
they run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

if TYPE_CHECKING:
    import grpc

__all__ = [
    "TOPOLOGIES",
    "Blocked",
    "ClusterBackend",
    "Groups",
    "bridge",
    "check_packet",
    "halves",
    "isolate",
    "majorities_ring",
    "majority_available",
    "partition_groups",
    "partition_pairs",
    "reaches",
]

Blocked = frozenset[tuple[int, int]]
"""Ordered pairs ``(a, b)``: traffic from node a to node b is dropped."""

Groups = tuple[tuple[int, ...], ...]
"""A network topology: two nodes talk if and only if some group holds both."""

TOPOLOGIES: Final = ("isolate-one", "halves", "majorities-ring", "bridge")
"""The kinds :func:`partition_groups` builds."""


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
        """Two nodes can talk if and only if some group holds both (groups
        may overlap); a node in no group talks to nobody.  The same as
        ``block(partition_pairs(nodes, groups))``.  Replaces any earlier
        network fault."""
        ...

    async def block(self, pairs: Collection[tuple[int, int]]) -> None:
        """Drop traffic from ``a`` to ``b`` for each ``(a, b)``, and no other
        traffic between nodes.  Replaces any earlier network fault.
        Clients of the cluster are never blocked."""
        ...

    async def packet(self, drop: float, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Slow, lossy links: every packet from one node to another is
        dropped with probability ``drop``, and the others are delayed by a
        time drawn uniformly from ``[delay_ms - jitter_ms, delay_ms +
        jitter_ms]`` (never negative) (:func:`check_packet`).  Replaces any
        earlier network fault; :meth:`heal` ends it.  Packets are not
        duplicated."""
        ...

    async def heal(self) -> None:
        """Undo every network fault (the same as ``block(())``)."""
        ...

    def addresses(self) -> Mapping[int, str]:
        """Each node's client address, ``host:port``."""
        ...

    @property
    def security_protocol(self) -> str:
        """``"SSL"`` (mutual TLS, the default) or ``"PLAINTEXT"`` (insecure)."""
        ...

    def client_credentials(self, broker: int | None = None) -> grpc.ChannelCredentials | None:
        """What clients of the cluster present: the admin user's certificate,
        or with ``broker`` that broker's own (its lifecycle calls must come
        from it); None for a plaintext cluster.  Valid once :meth:`start`
        began."""
        ...

    async def rotate_certs(self, nodes: Sequence[int]) -> None:
        """Re-issue the certificate and key of each of ``nodes`` from the
        cluster's CA (new key, new serial), replacing the files atomically
        while the nodes run (or are down): each picks them up on its next
        handshake, without a restart.  :class:`RuntimeError` for a
        plaintext cluster."""
        ...

    async def collect(self, run_dir: Path, start_unix_ns: int | None = None) -> None:
        """Stop every node and write what it left into the run folder
        ``run_dir``: text logs under ``logs/`` and each node's exports
        under ``nodes/<id>/`` (``docs/history-format.md``), change times
        counting from ``start_unix_ns`` (the run's start; default: when the
        nodes were started)."""
        ...


def check_packet(drop: float, delay_ms: float, jitter_ms: float) -> None:
    """:class:`ValueError` naming the first bad number of a packet fault:
    ``drop`` is a probability, the delay and jitter are milliseconds from
    0 to 60000."""
    if not (math.isfinite(drop) and 0.0 <= drop <= 1.0):
        raise ValueError(f"drop must be a probability in [0, 1], got {drop}")
    for what, ms in (("delay_ms", delay_ms), ("jitter_ms", jitter_ms)):
        if not (math.isfinite(ms) and 0.0 <= ms <= 60_000.0):
            raise ValueError(f"{what} must be in [0, 60000] milliseconds, got {ms}")


# -- topologies --------------------------------------------------------------------


def _check_nodes(nodes: Iterable[int]) -> list[int]:
    out = sorted(set(nodes))
    if not out:
        raise ValueError("no nodes")
    return out


def _groups(*groups: Iterable[int]) -> Groups:
    """Each group sorted, empty ones left out."""
    return tuple(g for g in (tuple(sorted(group)) for group in groups) if g)


def partition_pairs(nodes: Iterable[int], groups: Iterable[Collection[int]]) -> Blocked:
    """The pairs to block so that two nodes talk if and only if some group
    holds both (groups may overlap; a node in no group talks to nobody)."""
    all_nodes = _check_nodes(nodes)
    known = set(all_nodes)
    peers: dict[int, set[int]] = {n: {n} for n in all_nodes}
    for i, group in enumerate(groups):
        members = set(group)
        for n in members:
            if n not in known:
                raise ValueError(f"node {n} of group {i} is not one of {all_nodes}")
            peers[n] |= members
    return frozenset((a, b) for a in all_nodes for b in all_nodes if b not in peers[a])


def isolate(nodes: Iterable[int], node: int) -> Groups:
    """``node`` talks to no other node: ``node`` alone, and the rest."""
    all_nodes = _check_nodes(nodes)
    if node not in all_nodes:
        raise ValueError(f"node {node} is not one of {all_nodes}")
    return _groups([node], [n for n in all_nodes if n != node])


def _order(nodes: Iterable[int], rng: random.Random | None, least: int, what: str) -> list[int]:
    order = _check_nodes(nodes)
    if len(order) < least:
        raise ValueError(f"{what} needs at least {least} nodes, got {len(order)}")
    if rng is not None:
        rng.shuffle(order)
    return order


def halves(nodes: Iterable[int], rng: random.Random | None = None) -> Groups:
    """Two halves (the first ``n // 2`` nodes, and the rest: a majority)
    that cannot reach each other; shuffled first with ``rng`` if given.
    Needs at least two nodes."""
    order = _order(nodes, rng, 2, "halves")
    cut = len(order) // 2
    return _groups(order[:cut], order[cut:])


def bridge(nodes: Iterable[int], rng: random.Random | None = None) -> Groups:
    """Two halves that cannot reach each other, and one node (the bridge)
    in both, so that it reaches every node.  Needs at least three nodes; the
    bridge is the middle one of the (shuffled, if ``rng``) order."""
    order = _order(nodes, rng, 3, "a bridge")
    mid = len(order) // 2
    return _groups(order[: mid + 1], order[mid:])


def majorities_ring(nodes: Iterable[int], rng: random.Random | None = None) -> Groups:
    """Nodes on a ring (the shuffled, if ``rng``, order) in 2-node groups,
    each with its ``r = (n // 2 + 1) // 2`` nearest neighbours on each side:
    every node talks to ``2r + 1`` nodes (itself included), at least a
    majority (exactly one with 5 nodes), and no two nodes to the same ones.
    Needs at least five nodes (with fewer, no two-way ring has distinct
    majorities)."""
    order = _order(nodes, rng, 5, "a majorities ring")
    n = len(order)
    reach = (n // 2 + 1) // 2
    pairs = {
        tuple(sorted((order[i], order[(i + d) % n]))) for i in range(n) for d in range(1, reach + 1)
    }
    return tuple(sorted(pairs))


def partition_groups(kind: str, nodes: Iterable[int], rng: random.Random) -> Groups:
    """The groups of a partition of kind ``kind`` (:data:`TOPOLOGIES`) of
    ``nodes``, shuffled with ``rng``: ``isolate-one`` cuts off a node drawn
    by ``rng``."""
    if kind == "isolate-one":
        order = _order(nodes, rng, 1, "isolate-one")
        return isolate(order, order[0])
    if kind == "halves":
        return halves(nodes, rng)
    if kind == "majorities-ring":
        return majorities_ring(nodes, rng)
    if kind == "bridge":
        return bridge(nodes, rng)
    raise ValueError(f"unknown partition kind {kind!r}; known: {', '.join(TOPOLOGIES)}")


def reaches(pairs: Collection[tuple[int, int]], nodes: Iterable[int]) -> dict[int, set[int]]:
    """For each node, the nodes it hears from (itself included) under the
    blocked ``pairs``."""
    all_nodes = _check_nodes(nodes)
    blocked = set(pairs)
    return {b: {a for a in all_nodes if (a, b) not in blocked} for b in all_nodes}


def majority_available(
    nodes: Collection[int], down: Iterable[int], groups: Iterable[Collection[int]] | None = None
) -> bool:
    """Whether some up node talks to a majority of ``nodes`` that are up
    (itself included), so that a leader can commit, under the partition
    ``groups`` (``None``: the network is whole)."""
    out = set(down)
    up = [n for n in nodes if n not in out]
    if not up:
        return False
    need = len(set(nodes)) // 2 + 1
    if groups is None:
        return len(up) >= need
    hears = reaches(partition_pairs(nodes, groups), nodes)
    return any(len(hears[u].intersection(up)) >= need for u in up)

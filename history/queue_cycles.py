"""Elle's cycles over a queue history's transactions (pure).

Jepsen's Kafka analysis (``jepsen.tests.kafka``, its ``analysis``) hands a
graph of dependencies between transactions to Elle (``elle.core``,
``elle.graph``), which finds its strongly connected components and looks for
cycles inside each.  Here the graph's nodes are ops (invoke indexes) and its
edges are given (:class:`Edge`: ``ww``, one op's value immediately before
another's in a key's version order; ``wr``, one op polled a value another
sent); :func:`find_cycles` classifies them:

- ``G0``: a cycle of ``ww`` edges alone, one per non-trivial component of
  the ``ww`` graph (Elle's G0, write cycles);
- ``G1c``: a cycle of ``wr`` edges alone, one per non-trivial component of
  the ``wr`` graph: every op on it polled a value the one before it sent;
- ``G1c-ww``: Elle's G1c that needs a ``ww`` edge: one per non-trivial
  component of the whole graph that holds a ``wr`` edge between two of its
  ops and no op of a ``G1c`` cycle.

The witness of a component is a shortest cycle through a fixed place of it,
so that every checker reports the same one: through its least op (``G0``,
``G1c``), or through its least ``wr`` edge (``G1c-ww``: the edge, then a
shortest path back).  Between two ops, the least edge of the kinds a search
may use is the one a cycle takes (edges order by kind, key, values), and a
breadth-first search visits an op's successors in ascending order.  The
components come from Tarjan's algorithm, iterative (no recursion limit);
each search is linear in its component's edges.

``spark_verify.cycles`` is the same algorithm for the Spark job, which
collects the edges (one per pair of ops and kind) to the driver.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CYCLE_CHECKS",
    "Cycle",
    "Edge",
    "find_cycles",
    "least_edges",
    "shortest_path",
    "strongly_connected",
]

CYCLE_CHECKS: Final = ("G0", "G1c-ww", "G1c")
"""The cycle checks, in the order they are reported."""


@dataclass(frozen=True, slots=True, order=True)
class Edge:
    """``src`` -> ``dst`` of ``kind`` (``ww`` or ``wr``) on ``key``;
    ``values`` the values (JSON texts): ``[v1, v2]`` of a ``ww`` edge (src's
    then dst's), ``[v]`` of a ``wr`` edge (the value dst polled)."""

    kind: str
    key: str
    values: tuple[str, ...]
    src: int
    dst: int

    def rank(self) -> tuple[str, str, tuple[str, ...]]:
        return (self.kind, self.key, self.values)


@dataclass(frozen=True, slots=True)
class Cycle:
    """A cycle found: its check, its ops in order (the first is where it
    starts and ends) and its edges (edge i goes from ops[i] to ops[i+1])."""

    check: str
    ops: tuple[int, ...]
    edges: tuple[Edge, ...]


Graph = Mapping[int, Mapping[int, Edge]]
"""Per op, per successor, the one edge a cycle takes between them."""


def least_edges(edges: Iterable[Edge], kinds: Iterable[str]) -> dict[int, dict[int, Edge]]:
    """The graph of ``edges`` of ``kinds``: between two ops, the least edge."""
    wanted = set(kinds)
    out: dict[int, dict[int, Edge]] = {}
    for e in edges:
        if e.kind not in wanted or e.src == e.dst:
            continue
        succ = out.setdefault(e.src, {})
        old = succ.get(e.dst)
        if old is None or e.rank() < old.rank():
            succ[e.dst] = e
    return out


def strongly_connected(graph: Graph) -> list[list[int]]:
    """The non-trivial strongly connected components of ``graph`` (two ops
    or more; a graph here has no self-loop), each sorted, in order of their
    least op.  Tarjan's algorithm with an explicit stack."""
    nodes = sorted(set(graph) | {d for succ in graph.values() for d in succ})
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[int, Iterable[int]]] = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    pushed = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                comp: list[int] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: c[0])


def shortest_path(graph: Graph, start: int, target: int, within: set[int]) -> list[Edge] | None:
    """A shortest path of edges from ``start`` to ``target`` (a cycle when
    they are one op) through ops of ``within``: breadth first, successors in
    ascending order, the first path found."""
    parent: dict[int, Edge] = {}
    seen = {start}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for w in sorted(graph.get(u, {})):
            if w not in within:
                continue
            e = graph[u][w]
            if w == target:
                path = [e]
                while path[-1].src != start:
                    path.append(parent[path[-1].src])
                return path[::-1]
            if w not in seen:
                seen.add(w)
                parent[w] = e
                queue.append(w)
    return None


def _cycle(check: str, path: Sequence[Edge]) -> Cycle:
    return Cycle(check, tuple(e.src for e in path), tuple(path))


def find_cycles(edges: Iterable[Edge]) -> list[Cycle]:
    """The ``G0``, ``G1c`` and ``G1c-ww`` cycles of a graph of one history
    (the module's docstring), in :data:`CYCLE_CHECKS` order, each check's by
    its component's least op."""
    all_edges = list(edges)
    ww = least_edges(all_edges, ["ww"])
    wr = least_edges(all_edges, ["wr"])
    both = least_edges(all_edges, ["ww", "wr"])
    out: list[Cycle] = []
    for comp in strongly_connected(ww):
        path = shortest_path(ww, comp[0], comp[0], set(comp))
        if path is not None:
            out.append(_cycle("G0", path))
    wr_comps = strongly_connected(wr)
    in_g1c = {op for comp in wr_comps for op in comp}
    for comp in strongly_connected(both):
        if in_g1c.intersection(comp):
            continue
        members = set(comp)
        inside = sorted(
            (e for src in comp for e in wr.get(src, {}).values() if e.dst in members),
            key=lambda e: (e.src, e.dst),
        )
        if not inside:
            continue
        first = inside[0]
        back = shortest_path(both, first.dst, first.src, members)
        if back is not None:
            out.append(_cycle("G1c-ww", [first, *back]))
    for comp in wr_comps:
        path = shortest_path(wr, comp[0], comp[0], set(comp))
        if path is not None:
            out.append(_cycle("G1c", path))
    return out

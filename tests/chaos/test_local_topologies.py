"""The pure network topologies of chaos.backend."""

from __future__ import annotations

import random

import pytest

from chaos.backend import (
    ClusterBackend,
    bridge,
    halves,
    isolate,
    majorities_ring,
    partition_pairs,
    reaches,
)
from chaos.local import LocalCluster

NODES = [1, 2, 3, 4, 5]


def test_partition_pairs_block_across_groups_and_isolate_the_rest() -> None:
    pairs = partition_pairs([1, 2, 3, 4], [[1, 2], [3]])
    hears = reaches(pairs, [1, 2, 3, 4])
    assert hears == {1: {1, 2}, 2: {1, 2}, 3: {3}, 4: {4}}
    assert partition_pairs(NODES, [NODES]) == frozenset()
    with pytest.raises(ValueError, match="groups 0 and 1"):
        partition_pairs(NODES, [[1, 2], [2, 3]])
    with pytest.raises(ValueError, match="not one of"):
        partition_pairs(NODES, [[9]])


def test_isolate_cuts_one_node_both_ways() -> None:
    pairs = isolate(NODES, 3)
    assert pairs == {(3, n) for n in NODES if n != 3} | {(n, 3) for n in NODES if n != 3}
    with pytest.raises(ValueError):
        isolate(NODES, 7)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_halves_are_a_minority_and_a_majority(seed: int | None) -> None:
    rng = None if seed is None else random.Random(seed)
    hears = reaches(halves(NODES, rng), NODES)
    sides = {frozenset(v) for v in hears.values()}
    assert sorted(len(s) for s in sides) == [2, 3]
    assert set().union(*sides) == set(NODES)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
@pytest.mark.parametrize("seed", [None, 7])
def test_majorities_ring_each_hears_a_distinct_majority(n: int, seed: int | None) -> None:
    nodes = list(range(1, n + 1))
    rng = None if seed is None else random.Random(seed)
    hears = reaches(majorities_ring(nodes, rng), nodes)
    for node, view in hears.items():
        assert node in view
        assert len(view) == n // 2 + 1
    assert len({frozenset(v) for v in hears.values()}) == n
    with pytest.raises(ValueError, match="at least 3"):
        majorities_ring([1, 2])


@pytest.mark.parametrize("n", [3, 4, 5])
def test_bridge_reaches_both_halves_which_do_not_reach_each_other(n: int) -> None:
    nodes = list(range(1, n + 1))
    hears = reaches(bridge(nodes), nodes)
    middle = nodes[n // 2]
    assert hears[middle] == set(nodes)
    left, right = set(nodes[: n // 2]), set(nodes[n // 2 + 1 :])
    for a in left:
        assert hears[a] == left | {middle}
    for b in right:
        assert hears[b] == right | {middle}
    with pytest.raises(ValueError):
        bridge([1, 2])


def test_the_local_cluster_is_a_backend(tmp_path: object) -> None:
    assert isinstance(LocalCluster("unused", 3), ClusterBackend)

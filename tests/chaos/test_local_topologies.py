"""The pure network topologies of chaos.backend: groups, and the pairs that
carry them out."""

from __future__ import annotations

import random

import pytest

from chaos.backend import (
    TOPOLOGIES,
    ClusterBackend,
    Groups,
    bridge,
    halves,
    isolate,
    majorities_ring,
    majority_available,
    partition_groups,
    partition_pairs,
    reaches,
)
from chaos.local import LocalCluster
from chaos.nemesis import PARTITION_KINDS

NODES = [1, 2, 3, 4, 5]


def views(groups: Groups, nodes: list[int]) -> dict[int, set[int]]:
    return reaches(partition_pairs(nodes, groups), nodes)


def test_partition_pairs_block_across_groups_and_isolate_the_rest() -> None:
    pairs = partition_pairs([1, 2, 3, 4], [[1, 2], [3]])
    hears = reaches(pairs, [1, 2, 3, 4])
    assert hears == {1: {1, 2}, 2: {1, 2}, 3: {3}, 4: {4}}
    assert partition_pairs(NODES, [NODES]) == frozenset()
    assert reaches(partition_pairs(NODES, []), NODES) == {n: {n} for n in NODES}
    with pytest.raises(ValueError, match="not one of"):
        partition_pairs(NODES, [[9]])


def test_overlapping_groups_talk_iff_some_group_holds_both() -> None:
    pairs = partition_pairs(NODES, [[1, 2], [2, 3], [3, 4, 5]])
    assert reaches(pairs, NODES) == {
        1: {1, 2},
        2: {1, 2, 3},
        3: {2, 3, 4, 5},
        4: {3, 4, 5},
        5: {3, 4, 5},
    }
    # Symmetric: a pair is blocked both ways or not at all.
    assert all((b, a) in pairs for a, b in pairs)


def test_isolate_cuts_one_node_both_ways() -> None:
    groups = isolate(NODES, 3)
    assert groups == ((3,), (1, 2, 4, 5))
    pairs = partition_pairs(NODES, groups)
    assert pairs == {(3, n) for n in NODES if n != 3} | {(n, 3) for n in NODES if n != 3}
    with pytest.raises(ValueError):
        isolate(NODES, 7)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_halves_are_a_minority_and_a_majority(seed: int | None) -> None:
    rng = None if seed is None else random.Random(seed)
    groups = halves(NODES, rng)
    assert sorted(len(g) for g in groups) == [2, 3]
    sides = {frozenset(v) for v in views(groups, NODES).values()}
    assert sorted(len(s) for s in sides) == [2, 3]
    assert set().union(*sides) == set(NODES)
    with pytest.raises(ValueError):
        halves([1])


@pytest.mark.parametrize("n", [5, 6, 7, 8, 9])
@pytest.mark.parametrize("seed", [None, 7])
def test_majorities_ring_each_hears_a_distinct_majority(n: int, seed: int | None) -> None:
    nodes = list(range(1, n + 1))
    rng = None if seed is None else random.Random(seed)
    groups = majorities_ring(nodes, rng)
    assert all(len(g) == 2 for g in groups)
    hears = views(groups, nodes)
    for node, view in hears.items():
        assert node in view
        assert n // 2 + 1 <= len(view) < n
    if n == 5:
        assert all(len(view) == 3 for view in hears.values())
    assert len({frozenset(v) for v in hears.values()}) == n
    with pytest.raises(ValueError, match="at least 5"):
        majorities_ring([1, 2, 3, 4])


@pytest.mark.parametrize("n", [3, 4, 5])
def test_bridge_reaches_both_halves_which_do_not_reach_each_other(n: int) -> None:
    nodes = list(range(1, n + 1))
    groups = bridge(nodes)
    middle = nodes[n // 2]
    left, right = set(nodes[: n // 2]), set(nodes[n // 2 + 1 :])
    assert groups == (tuple(sorted(left | {middle})), tuple(sorted(right | {middle})))
    hears = views(groups, nodes)
    assert hears[middle] == set(nodes)
    for a in left:
        assert hears[a] == left | {middle}
    for b in right:
        assert hears[b] == right | {middle}
    with pytest.raises(ValueError):
        bridge([1, 2])


@pytest.mark.parametrize("kind", TOPOLOGIES)
@pytest.mark.parametrize("seed", range(5))
def test_partition_groups_by_kind(kind: str, seed: int) -> None:
    nodes = list(range(1, 8))
    groups = partition_groups(kind, nodes, random.Random(seed))
    assert groups == partition_groups(kind, nodes, random.Random(seed))
    assert all(list(g) == sorted(g) and g for g in groups)
    assert set().union(*groups) == set(nodes)
    # Each kind splits the cluster but leaves a majority that can commit.
    assert partition_pairs(nodes, groups)
    assert majority_available(nodes, [], groups)
    with pytest.raises(ValueError, match="unknown partition kind"):
        partition_groups("isolate-leader", nodes, random.Random(seed))


def test_the_nemesis_kinds_are_the_topologies_and_the_leader_intent() -> None:
    assert set(PARTITION_KINDS) == {*TOPOLOGIES, "isolate-leader"}


def test_majority_available() -> None:
    assert majority_available([1, 2, 3], [])
    assert majority_available([1, 2, 3], [1])
    assert not majority_available([1, 2, 3], [1, 2])
    assert not majority_available([1, 2, 3], [1, 2, 3])
    assert not majority_available([1, 2, 3], [3], ((1,), (2, 3)))
    assert not majority_available([1, 2, 3], [], ())
    ring = majorities_ring(NODES)
    assert majority_available(NODES, [], ring)
    assert not majority_available(NODES, [1, 3], ring)
    assert majority_available(NODES, [1, 2], bridge(NODES))
    assert not majority_available(NODES, [3], bridge(NODES))


def test_the_local_cluster_is_a_backend(tmp_path: object) -> None:
    assert isinstance(LocalCluster("unused", 3), ClusterBackend)

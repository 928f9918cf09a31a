"""Replica placement (metadata/placement.py)."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.errors import ApiError, Errors
from metadata.placement import UsableBroker, place, rack_alternated, validate_assignment


@contextlib.contextmanager
def refused(code: Errors, message: str) -> Iterator[None]:
    with pytest.raises(ApiError) as info:
        yield
    assert info.value.code is code, info.value
    assert info.value.message == message


class FirstChoice(random.Random):
    """A random source that always draws 0: the start index and the first
    shift of Kafka's examples."""

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return 0


def brokers_without_racks(n: int) -> list[UsableBroker]:
    return [UsableBroker(i, None, False) for i in range(n)]


# -- worked examples ----------------------------------------------------------


def test_kafka_example_without_racks() -> None:
    # The table in the comment of Kafka's AdminUtils.assignReplicasToBrokers:
    # 5 brokers, 10 partitions, 3 replicas, start index 0 and shift 0.
    assert place(0, 10, 3, brokers_without_racks(5), FirstChoice()) == [
        (0, 1, 2),
        (1, 2, 3),
        (2, 3, 4),
        (3, 4, 0),
        (4, 0, 1),
        # Partition 5 starts a new round: the followers shift by one more.
        (0, 2, 3),
        (1, 3, 4),
        (2, 4, 0),
        (3, 0, 1),
        (4, 1, 2),
    ]


def test_kafka_example_rack_alternated_list() -> None:
    # The example of Kafka's AdminUtils.getRackAlternatedBrokerList.
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    brokers = [UsableBroker(i, rack, False) for i, rack in racks.items()]
    assert rack_alternated(brokers) == [0, 3, 1, 5, 4, 2]
    assert rack_alternated(list(reversed(brokers))) == [0, 3, 1, 5, 4, 2]
    assert rack_alternated([]) == []


def test_rack_aware_example_skips_a_second_replica_in_the_same_rack() -> None:
    # Racks a: 0, 1; b: 2.  Rack-alternated list: 0, 2, 1.
    brokers = [
        UsableBroker(0, "a", False),
        UsableBroker(1, "a", False),
        UsableBroker(2, "b", False),
    ]
    # p0: leader 0 (a), next candidate 2 (b).  p1: leader 2, next 1.  p2:
    # leader 1 (a), next candidate 0 is in rack a, so 2.  p3 starts a new
    # round (shift 1): leader 0, candidate 1 is in rack a, so 2.
    assert place(0, 4, 2, brokers, FirstChoice()) == [(0, 2), (2, 1), (1, 2), (0, 2)]


def test_start_partition_continues_the_leader_rotation() -> None:
    brokers = brokers_without_racks(4)
    assert [r[0] for r in place(6, 4, 1, brokers, FirstChoice())] == [2, 3, 0, 1]


def test_fenced_brokers_are_not_used() -> None:
    brokers = [UsableBroker(i, None, i in (1, 3)) for i in range(5)]
    for seed in range(20):
        assignment = place(0, 12, 3, brokers, random.Random(seed))
        assert {b for replicas in assignment for b in replicas} == {0, 2, 4}


def test_the_random_source_picks_the_first_leader() -> None:
    brokers = brokers_without_racks(3)
    first_leaders = {place(0, 1, 1, brokers, random.Random(seed))[0][0] for seed in range(50)}
    assert first_leaders == {0, 1, 2}


# -- refusals -----------------------------------------------------------------


def test_replication_factor_below_one() -> None:
    brokers = brokers_without_racks(3)
    message = "replication factor must be at least 1, not 0"
    with refused(Errors.INVALID_REPLICATION_FACTOR, message):
        place(0, 1, 0, brokers, random.Random(0))
    with refused(
        Errors.INVALID_REPLICATION_FACTOR, "replication factor must be at least 1, not -1"
    ):
        place(0, 1, -1, brokers, random.Random(0))


def test_partitions_below_one() -> None:
    brokers = brokers_without_racks(3)
    with refused(Errors.INVALID_PARTITIONS, "number of partitions must be at least 1, not 0"):
        place(0, 0, 1, brokers, random.Random(0))


def test_replication_factor_above_the_available_brokers() -> None:
    brokers = brokers_without_racks(3) + [UsableBroker(3, None, True)]
    message = "replication factor 4 is larger than the number of available brokers (3)"
    with refused(Errors.INVALID_REPLICATION_FACTOR, message):
        place(0, 1, 4, brokers, random.Random(0))
    message = "replication factor 1 is larger than the number of available brokers (0)"
    with refused(Errors.INVALID_REPLICATION_FACTOR, message):
        place(0, 1, 1, [], random.Random(0))


def test_some_brokers_without_a_rack() -> None:
    brokers = [
        UsableBroker(1, "a", False),
        UsableBroker(2, None, False),
        UsableBroker(3, "b", False),
    ]
    message = (
        "not all brokers have rack information: broker 2 has no rack while the others have one"
    )
    with refused(Errors.INVALID_REPLICA_ASSIGNMENT, message):
        place(0, 1, 1, brokers, random.Random(0))
    brokers.append(UsableBroker(7, None, False))
    message = (
        "not all brokers have rack information: brokers 2, 7 have no rack while the others have one"
    )
    with refused(Errors.INVALID_REPLICA_ASSIGNMENT, message):
        place(0, 1, 1, brokers, random.Random(0))


def test_a_fenced_broker_without_a_rack_does_not_matter() -> None:
    brokers = [
        UsableBroker(1, "a", False),
        UsableBroker(2, None, True),
        UsableBroker(3, "b", False),
    ]
    assert sorted(place(0, 1, 2, brokers, random.Random(0))[0]) == [1, 3]


def test_caller_bugs() -> None:
    brokers = brokers_without_racks(3)
    with pytest.raises(ValueError, match="start_partition must not be negative, not -1"):
        place(-1, 1, 1, brokers, random.Random(0))
    with pytest.raises(ValueError, match="broker 1 is listed twice"):
        place(0, 1, 1, [*brokers, UsableBroker(1, None, True)], random.Random(0))


# -- properties ---------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn, *, balanced: bool = False) -> list[UsableBroker]:
    """Unfenced brokers (with, if ``balanced``, as many in every rack, or no
    racks at all), shuffled, plus some fenced ones."""
    if draw(st.booleans()):
        n = draw(st.integers(1, 10))
        racks: list[str | None] = [None] * n
    elif balanced:
        num_racks, per_rack = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        racks = [f"rack{r}" for r in range(num_racks) for _ in range(per_rack)]
    else:
        racks = draw(st.lists(st.sampled_from(["x", "y", "z", "w"]), min_size=1, max_size=10))
    ids = draw(st.lists(st.integers(0, 100), min_size=len(racks), max_size=len(racks), unique=True))
    brokers = [UsableBroker(i, rack, False) for i, rack in zip(ids, racks, strict=True)]
    fenced_ids = draw(st.lists(st.integers(101, 120), max_size=3, unique=True))
    brokers += [UsableBroker(i, draw(st.sampled_from(racks)), True) for i in fenced_ids]
    return draw(st.permutations(brokers))


@st.composite
def requests(
    draw: st.DrawFn, *, balanced: bool = False
) -> tuple[list[UsableBroker], int, int, int, int]:
    brokers = draw(clusters(balanced=balanced))
    usable = sum(1 for b in brokers if not b.fenced)
    rf = draw(st.integers(1, usable))
    start = draw(st.integers(0, 40))
    num = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32))
    return brokers, start, num, rf, seed


def unfenced(brokers: Sequence[UsableBroker]) -> list[UsableBroker]:
    return [b for b in brokers if not b.fenced]


@settings(max_examples=200, deadline=None)
@given(requests())
def test_replica_lists_are_well_formed(
    request: tuple[list[UsableBroker], int, int, int, int],
) -> None:
    brokers, start, num, rf, seed = request
    assignment = place(start, num, rf, brokers, random.Random(seed))
    usable_ids = {b.id for b in unfenced(brokers)}
    assert len(assignment) == num
    for replicas in assignment:
        assert len(replicas) == rf
        assert len(set(replicas)) == rf
        assert set(replicas) <= usable_ids
    # A placement is valid input to the manual check too.
    validate_assignment(assignment, {b.id: b for b in brokers}, start_partition=start)


@settings(max_examples=200, deadline=None)
@given(requests())
def test_leaders_are_spread_evenly(request: tuple[list[UsableBroker], int, int, int, int]) -> None:
    # Whatever the racks: leaders take the rack-alternated list in turn.
    brokers, start, num, rf, seed = request
    assignment = place(start, num, rf, brokers, random.Random(seed))
    leaders = Counter(replicas[0] for replicas in assignment)
    counts = [leaders[b.id] for b in unfenced(brokers)]
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == num


@settings(max_examples=200, deadline=None)
@given(requests(balanced=True))
def test_followers_are_spread_evenly(
    request: tuple[list[UsableBroker], int, int, int, int],
) -> None:
    # With balanced racks (or none), partitions p with equal p // n (a
    # round, n brokers) put every broker in rf - 1 follower slots of a whole
    # round and in at most rf - 1 of a partial one.
    brokers, start, num, rf, seed = request
    assignment = place(start, num, rf, brokers, random.Random(seed))
    usable = unfenced(brokers)
    n = len(usable)
    rounds: dict[int, list[tuple[int, ...]]] = {}
    for partition, replicas in enumerate(assignment, start):
        rounds.setdefault(partition // n, []).append(replicas)
    for members in rounds.values():
        followers = Counter(b for replicas in members for b in replicas[1:])
        for broker in usable:
            if len(members) == n:
                assert followers[broker.id] == rf - 1
            else:
                assert followers[broker.id] <= rf - 1


@settings(max_examples=200, deadline=None)
@given(requests())
def test_replicas_span_as_many_racks_as_they_can(
    request: tuple[list[UsableBroker], int, int, int, int],
) -> None:
    brokers, start, num, rf, seed = request
    usable = unfenced(brokers)
    rack_of = {b.id: b.rack for b in usable}
    num_racks = len(set(rack_of.values()))
    for replicas in place(start, num, rf, brokers, random.Random(seed)):
        assert len({rack_of[b] for b in replicas}) == min(rf, num_racks)


@settings(max_examples=200, deadline=None)
@given(requests(), st.randoms(use_true_random=False))
def test_placement_is_deterministic(
    request: tuple[list[UsableBroker], int, int, int, int], shuffler: random.Random
) -> None:
    brokers, start, num, rf, seed = request
    first = place(start, num, rf, brokers, random.Random(seed))
    assert place(start, num, rf, brokers, random.Random(seed)) == first
    # The order in which brokers are given does not matter.
    shuffled = list(brokers)
    shuffler.shuffle(shuffled)
    assert place(start, num, rf, shuffled, random.Random(seed)) == first


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_rack_alternated_list_interleaves_racks(brokers: list[UsableBroker]) -> None:
    arranged = rack_alternated(brokers)
    assert sorted(arranged) == sorted(b.id for b in brokers)
    rack_of = {b.id: b.rack or "" for b in brokers}
    racks = sorted(set(rack_of.values()))
    # Within a rack, brokers come by id.
    for rack in racks:
        in_rack = [b for b in arranged if rack_of[b] == rack]
        assert in_rack == sorted(in_rack)
    # The list is made of turns; each turn takes the next broker of every
    # rack that has one left, racks in name order.
    position = 0
    depth = 0
    while position < len(arranged):
        turn = [r for r in racks if sum(1 for v in rack_of.values() if v == r) > depth]
        taken = [rack_of[b] for b in arranged[position : position + len(turn)]]
        assert taken == turn
        position += len(turn)
        depth += 1


# -- manual assignments -------------------------------------------------------

REGISTERED = {i: UsableBroker(i, None, i == 3) for i in range(1, 5)}


def test_valid_manual_assignments() -> None:
    validate_assignment([[1, 2, 3], [2, 3, 4]], REGISTERED)
    # A fenced broker may be named.
    validate_assignment([[3]], REGISTERED)
    validate_assignment([[4, 1]], REGISTERED, start_partition=5, replication_factor=2)


@pytest.mark.parametrize(
    ("assignment", "kwargs", "message"),
    [
        ([], {}, "the replica assignment has no partition"),
        ([[1], []], {}, "partition 1 has no replicas"),
        ([[1, 2, 1]], {}, "partition 0's replicas [1, 2, 1] list broker 1 more than once"),
        (
            [[1, 2], [2, 1, 2, 1]],
            {},
            "partition 1's replicas [2, 1, 2, 1] list brokers 1, 2 more than once",
        ),
        ([[1, 9]], {}, "partition 0's replicas [1, 9] name broker 9, which is not registered"),
        (
            [[1, 2], [9, 1, 0]],
            {"start_partition": 3},
            "partition 4's replicas [9, 1, 0] name brokers 9, 0, which are not registered",
        ),
        (
            [[1, 2, 4], [1, 2]],
            {},
            "partition 1 has 2 replicas [1, 2] but partition 0 has 3: every partition of a"
            " topic needs the same number of replicas",
        ),
        (
            [[1, 2], [1, 2, 4]],
            {"start_partition": 6},
            "partition 7 has 3 replicas [1, 2, 4] but partition 6 has 2: every partition of a"
            " topic needs the same number of replicas",
        ),
        (
            [[1, 2]],
            {"start_partition": 2, "replication_factor": 3},
            "partition 2 has 2 replicas [1, 2] but the topic's replication factor is 3: every"
            " partition of a topic needs the same number of replicas",
        ),
    ],
)
def test_bad_manual_assignments(
    assignment: list[list[int]], kwargs: dict[str, int], message: str
) -> None:
    with refused(Errors.INVALID_REPLICA_ASSIGNMENT, message):
        validate_assignment(assignment, REGISTERED, **kwargs)

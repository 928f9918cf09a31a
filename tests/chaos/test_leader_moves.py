"""The leadership moves of the nemesis without the cluster: the schedule of
``reassign`` and ``elect-leader``, and the plans of :mod:`chaos.leader_moves`
(which partition, which replicas).  A real run that carries them out is in
test_leader_moves_run."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.leader_moves import (
    ELECT,
    REASSIGN,
    REVERT,
    Move,
    PartitionView,
    plan_election,
    plan_reassign,
    plan_revert,
)
from chaos.nemesis import (
    BROKER_KINDS,
    ELECT_LEADER_KIND,
    FAULT_KINDS,
    LEADER_MOVE_KINDS,
    REASSIGN_KIND,
    Action,
    nemesis_op,
    schedule,
)
from chaos.runner import NEMESES, RunConfig, expand_nemesis
from tests.chaos.fault_schedules import elections_during_partitions

NODES = [1, 2, 3, 4, 5, 6, 7]
BROKERS = [4, 5, 6, 7]


def _view(
    partition: int = 0,
    leader: int = 4,
    replicas: tuple[int, ...] = (4, 5, 6),
    isr: tuple[int, ...] = (4, 5, 6),
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
) -> PartitionView:
    return PartitionView("queue", partition, leader, replicas, isr, adding, removing)


# -- the schedule ---------------------------------------------------------------


def test_the_kinds_are_nemesis_names_that_need_brokers() -> None:
    assert LEADER_MOVE_KINDS == (REASSIGN_KIND, ELECT_LEADER_KIND) == ("reassign", "elect-leader")
    for kind in LEADER_MOVE_KINDS:
        assert kind in FAULT_KINDS and kind in BROKER_KINDS and kind in NEMESES
    assert expand_nemesis(["elect-leader", "reassign"], 6) == ["reassign", "elect-leader"]
    with pytest.raises(ValueError, match="need brokers"):
        RunConfig(workload="register", faults=("elect-leader",)).check()
    RunConfig(workload="queue", faults=("reassign", "elect-leader")).check()


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    kinds=st.lists(
        st.sampled_from(["reassign", "elect-leader", "kill", "pause", "isolate-one"]),
        min_size=1,
        unique=True,
    ),
    max_concurrent=st.integers(1, 3),
    duration=st.floats(1, 90),
    interval=st.floats(0.2, 5),
    period=st.floats(0.5, 20),
    quiet=st.floats(0, 5),
)
def test_every_reassignment_is_reverted_within_its_fault_period(
    seed: int,
    kinds: list[str],
    max_concurrent: int,
    duration: float,
    interval: float,
    period: float,
    quiet: float,
) -> None:
    acts = schedule(
        random.Random(seed),
        NODES,
        kinds,
        duration_s=duration,
        interval_s=interval,
        fault_period_s=period,
        quiet_s=quiet,
        max_concurrent=max_concurrent,
    )
    in_force = False
    for a in acts:
        if a.f == ELECT_LEADER_KIND:
            assert "elect-leader" in kinds
            assert a.kind == ELECT_LEADER_KIND and a.target == "partition" and not a.nodes
        if a.f == REASSIGN_KIND:
            assert "reassign" in kinds and a.target == "partition" and not a.nodes
            if a.kind == "revert":
                assert in_force, "a revert with no reassignment in force"
                in_force = False
            else:
                assert a.kind == REASSIGN_KIND and not in_force, "two reassignments at once"
                in_force = True
    assert not in_force, "a reassignment left in force at the end of the schedule"
    if "elect-leader" in kinds and len(kinds) == 1 and duration > 2 * interval:
        assert any(a.f == ELECT_LEADER_KIND for a in acts)


def test_a_reassignment_is_reverted_before_the_quiet_period() -> None:
    acts = schedule(
        random.Random(3),
        NODES,
        ["reassign"],
        duration_s=40,
        interval_s=2,
        fault_period_s=10,
        quiet_s=5,
    )
    starts = [a.time_s for a in acts if a.f == "reassign" and a.kind == "reassign"]
    reverts = [a.time_s for a in acts if a.f == "reassign" and a.kind == "revert"]
    assert starts and len(starts) == len(reverts)
    for s, r in zip(starts, reverts, strict=True):
        assert s <= r
        # The fault periods are [0, 10), [15, 25), [30, 40): the revert
        # comes in its reassignment's period at the latest.
        assert r - (r // 15) * 15 <= 10


def test_an_unresolved_move_has_no_history_op() -> None:
    # The runner records the move it resolved (chaos.leader_moves), never
    # the intent.
    with pytest.raises(ValueError, match="resolve"):
        nemesis_op(Action(1.0, "elect-leader", kind="elect-leader", target="partition"))


# -- the plans ----------------------------------------------------------------------


def test_a_reassignment_moves_the_leaders_replica_to_a_spare_broker() -> None:
    move = plan_reassign([_view()], BROKERS, (), random.Random(1))
    assert move == Move(REASSIGN, REASSIGN, "queue", 0, (5, 6, 7), (4, 5, 6), 4)
    assert move.value() == {
        "partition": "queue-0",
        "replicas": [5, 6, 7],
        "previous": [4, 5, 6],
        "leader": 4,
    }


def test_a_reassignment_skips_spare_brokers_that_are_down() -> None:
    move = plan_reassign([_view()], BROKERS, (7,), random.Random(1))
    # No spare up: the replicas are reordered so that a follower is preferred.
    assert move is not None and move.f == REASSIGN
    assert set(move.replicas) == {4, 5, 6} and move.replicas[0] in (5, 6)
    assert move.previous == (4, 5, 6)


def test_without_a_spare_broker_a_reassignment_reorders() -> None:
    for seed in range(20):
        move = plan_reassign([_view(leader=5, isr=(5, 6))], [4, 5, 6], (), random.Random(seed))
        # 4 is out of the ISR: only 6 may be preferred instead of the leader.
        assert move is not None and move.replicas == (6, 4, 5)


def test_no_plan_when_no_partition_allows_one() -> None:
    alone = _view(isr=(4,))
    assert plan_reassign([alone], [4, 5, 6], (), random.Random(0)) is None
    assert plan_election([alone], (), random.Random(0)) is None
    # Followers in the ISR but down (paused or killed).
    assert plan_election([_view()], (5, 6), random.Random(0)) is None
    # No leader, or a reassignment already in progress.
    assert plan_election([_view(leader=-1)], (), random.Random(0)) is None
    moving = _view(replicas=(5, 6, 7, 4), adding=(7,), removing=(4,))
    assert plan_reassign([moving], BROKERS, (), random.Random(0)) is None
    assert plan_election([moving], (), random.Random(0)) is None
    # The partition a reassignment holds is avoided.
    assert plan_election([_view()], (), random.Random(0), avoid=("queue-0",)) is None


def test_an_election_prefers_an_up_isr_member_other_than_the_leader() -> None:
    seen: set[int] = set()
    for seed in range(30):
        move = plan_election([_view(isr=(4, 5, 6))], (6,), random.Random(seed))
        assert move is not None and move.f == ELECT and move.kind == ELECT
        assert move.replicas[0] == 5 and sorted(move.replicas) == [4, 5, 6]
        seen.add(move.replicas[0])
        assert move.value()["preferred"] == 5
    both: set[int] = set()
    for seed in range(30):
        move = plan_election([_view(partition=1)], (), random.Random(seed))
        assert move is not None
        both.add(move.replicas[0])
        assert move.replicas[1:] == tuple(r for r in (4, 5, 6) if r != move.replicas[0])
    assert both == {5, 6}


def test_the_plans_draw_among_the_partitions() -> None:
    parts = [_view(partition=0), _view(partition=1, leader=5), _view(partition=2, leader=6)]
    drawn = {plan_election(parts, (), random.Random(s)).partition for s in range(40)}  # type: ignore[union-attr]
    assert drawn == {0, 1, 2}


def test_a_revert_goes_back_to_the_replicas_found() -> None:
    move = Move(REASSIGN, REASSIGN, "queue", 1, (5, 6, 7), (4, 5, 6), 4)
    now = _view(partition=1, leader=5, replicas=(5, 6, 7), isr=(5, 6, 7))
    back = plan_revert(move, now)
    assert back == Move(REASSIGN, REVERT, "queue", 1, (4, 5, 6), (5, 6, 7), 5)
    assert back.value() == {
        "partition": "queue-1",
        "replicas": [4, 5, 6],
        "previous": [5, 6, 7],
        "leader": 5,
        "kind": "revert",
    }
    unknown = plan_revert(move, None)
    assert unknown.replicas == (4, 5, 6) and unknown.previous == (5, 6, 7)
    assert unknown.leader == -1


def test_elections_also_come_while_another_fault_is_in_force() -> None:
    acts = schedule(
        random.Random(5),
        NODES,
        ["isolate-follower", "elect-leader"],
        duration_s=60,
        interval_s=1.0,
        fault_period_s=12,
        quiet_s=2,
    )
    assert elections_during_partitions(acts) > 0
    # Without the kind the schedule draws nothing more: a seed's schedule of
    # other faults stays what it was.
    alone = schedule(
        random.Random(5), NODES, ["isolate-follower"], duration_s=60, interval_s=1.0,
        fault_period_s=12, quiet_s=2,
    )  # fmt: skip
    assert alone and all(a.f in ("partition", "heal") for a in alone)


def test_a_recipe_passes_its_timeouts_to_the_run() -> None:
    # The catalogue's B18 recipe shortens the producer's timeouts (its
    # delivery and request timeouts derive from the run's op and client
    # timeouts), so a recipe carries them to the run and names them.
    from bugs import Bug
    from chaos.catalogue import RECIPES, Recipe

    recipe = Recipe("queue", ("elect-leader",), ("G1a",), op_timeout_s=2.0, client_timeout_s=1.0)
    config = recipe.config(name="t", bugs=frozenset(), seed=1, runs_dir="r")
    assert (config.op_timeout_s, config.client_timeout_s) == (2.0, 1.0)
    assert "timeouts=2/1s" in recipe.describe()
    default = Recipe("queue", ("elect-leader",), ("G1a",))
    assert "timeouts" not in default.describe()
    assert default.config(name="t", bugs=frozenset(), seed=1, runs_dir="r").op_timeout_s == 5.0
    b18 = RECIPES[Bug.HARNESS_NOT_LEADER_AS_FAIL]
    assert "elect-leader" in b18.nemesis and b18.client_timeout_s < b18.op_timeout_s


def test_no_election_comes_during_a_fault_that_runs_alone() -> None:
    for seed in range(30):
        acts = schedule(
            random.Random(seed),
            NODES,
            ["kill-majority", "strand-partition-leader", "elect-leader"],
            duration_s=60,
            interval_s=1.0,
            fault_period_s=30,
            quiet_s=2,
        )
        alone = False
        for a in acts:
            if a.kind in ("kill-majority", "strand-partition-leader") and a.f in (
                "kill",
                "partition",
            ):
                alone = True
            elif a.f == "start" and a.kind in ("kill-majority", "strand-partition-leader"):
                alone = False
            elif a.f == ELECT_LEADER_KIND:
                assert not alone, (seed, a)

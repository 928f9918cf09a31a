"""Fault schedules: shapes of the actions and properties of schedules."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.nemesis import (
    BROKER_KINDS,
    FAULT_KINDS,
    NETWORK_KINDS,
    PARTITION_KINDS,
    Action,
    action_ops,
    majority_available,
    nemesis_op,
    packet_fault,
    resolve,
    schedule,
)
from history.ops import check_well_formed, op_problems


def replay(
    actions: list[Action], nodes: list[int]
) -> list[tuple[float, dict[int | str, str], bool, int]]:
    """The state after each action: (time, node -> kill/pause (``"leader"``:
    a kill of the leader, node unknown), network fault (partition or packet)
    in force, faults in force); asserts the pairing rules on the way."""
    down: dict[int | str, str] = {}
    partition: Action | None = None
    majority: tuple[int, ...] | None = None
    states = []
    for a in actions:
        if a.f in ("kill", "pause") and a.target == "leader":
            assert a.f == "kill" and a.kind == "kill-leader" and not a.nodes, a
            assert "leader" not in down and majority is None
            down["leader"] = "kill"
        elif a.f in ("kill", "pause"):
            assert len(a.nodes) == 1 or a.kind == "kill-majority", a
            if a.kind == "kill-majority":
                assert majority is None and not down and partition is None, a
                assert len(a.nodes) == len(nodes) // 2 + 1
                majority = a.nodes
            else:
                assert majority is None, "a fault started while a majority is down"
            for n in a.nodes:
                assert n in nodes and n not in down, a
                down[n] = a.f
        elif a.f in ("start", "resume") and a.target == "leader":
            assert a.f == "start" and a.kind == "kill-leader" and not a.nodes, a
            assert down.pop("leader") == "kill"
        elif a.f in ("start", "resume"):
            if a.kind == "kill-majority":
                assert a.nodes == majority, a
                majority = None
            else:
                assert len(a.nodes) == 1 and a.nodes != majority, a
            for n in a.nodes:
                assert down.pop(n) == {"start": "kill", "resume": "pause"}[a.f], a
        elif a.f in ("partition", "packet"):
            assert partition is None, "two network faults at once"
            assert majority is None, "a fault started while a majority is down"
            partition = a
        elif a.f == "rotate-certs":
            # Instant: every node's certificate, nothing left in force.
            assert a.nodes == tuple(nodes) and not a.groups and a.target is None, a
        else:
            assert a.f == "heal", a
            partition = None
        faults = len(down) - (len(majority) - 1 if majority else 0) + (partition is not None)
        states.append((a.time_s, dict(down), partition is not None, faults))
    return states


def test_rotations_come_in_fault_periods_for_every_node_and_leave_nothing_in_force() -> None:
    acts = schedule(
        random.Random(3),
        [1, 2, 3],
        ["rotate-certs"],
        duration_s=30,
        interval_s=1.0,
        fault_period_s=5.0,
        quiet_s=2.0,
    )
    rotations = [a for a in acts if a.f == "rotate-certs"]
    assert len(rotations) >= 10 and acts[-1].f == "heal"
    assert {a.f for a in acts} == {"rotate-certs", "heal"}
    assert all(a.nodes == (1, 2, 3) for a in rotations)
    for a in rotations:
        assert (a.time_s % 7.0) <= 5.0, a  # in a fault period, never in a quiet one
    assert nemesis_op(rotations[0]) == ("rotate-certs", {"nodes": [1, 2, 3]})
    # With lasting faults, rotations come while they are in force too.
    mixed = schedule(
        random.Random(4), [1, 2, 3], ["kill", "rotate-certs"], duration_s=60, max_concurrent=2
    )
    states = replay(mixed, [1, 2, 3])
    during = [
        a
        for a, before in zip(mixed[1:], states, strict=False)
        if a.f == "rotate-certs" and before[1]
    ]
    assert during, "no rotation while a node was down"


def test_action_values_are_the_documented_shapes() -> None:
    assert nemesis_op(Action(0, "kill", nodes=(2,))) == ("kill", {"nodes": [2]})
    assert nemesis_op(Action(0, "resume", nodes=(2,))) == ("resume", {"nodes": [2]})
    assert nemesis_op(Action(0, "heal")) == ("heal", {})
    part = Action(0, "partition", groups=((1,), (2, 3)), kind="halves")
    assert nemesis_op(part) == ("partition", {"groups": [[1], [2, 3]], "kind": "halves"})
    intent = Action(0, "partition", kind="isolate-leader", target="leader")
    with pytest.raises(ValueError):
        nemesis_op(intent)
    assert nemesis_op(resolve(intent, 2, [1, 2, 3])) == (
        "partition",
        {"groups": [[2], [1, 3]], "kind": "isolate-leader"},
    )
    with pytest.raises(ValueError):
        resolve(intent, 9, [1, 2, 3])
    inv, done = action_ops(Action(0, "kill", nodes=(1,)), index=4, invoke_ns=10, complete_ns=20)
    assert (inv.index, inv.type, done.index, done.type, done.value) == (
        4,
        "invoke",
        5,
        "ok",
        {"nodes": [1]},
    )
    assert op_problems(inv) == [] and op_problems(done) == []
    with pytest.raises(ValueError):
        action_ops(Action(0, "heal"), index=0, invoke_ns=0, complete_ns=0, type="fail")


def test_a_packet_fault_has_the_documented_value_and_moderate_numbers() -> None:
    rng = random.Random(7)
    faults = [packet_fault(1.0, rng) for _ in range(200)]
    for a in faults:
        assert (a.time_s, a.f, a.nodes, a.groups, a.target) == (1.0, "packet", (), (), None)
        assert a.drop in (0.1, 0.2, 0.3)
        assert 50 <= a.delay_ms <= 150 and 10 <= a.jitter_ms <= 50
        assert a.delay_ms - a.jitter_ms >= 0
    assert len({(a.drop, a.delay_ms, a.jitter_ms) for a in faults}) > 20
    a = Action(0, "packet", drop=0.2, delay_ms=100, jitter_ms=20)
    assert nemesis_op(a) == ("packet", {"drop": 0.2, "duplicate": 0.0, "max_delay_ms": 120})
    inv, done = action_ops(a, index=0, invoke_ns=1, complete_ns=2)
    assert op_problems(inv) == [] and op_problems(done) == []
    heal = action_ops(Action(0, "heal"), index=2, invoke_ns=3, complete_ns=4)
    assert check_well_formed([inv, done, *heal]) == []
    # Unended, it is a fault left in force.
    assert [p.kind for p in check_well_formed([inv, done])] == ["nemesis-unended"]


def test_a_packet_fault_is_a_network_fault_ended_by_heal_never_with_a_partition() -> None:
    assert "packet" in NETWORK_KINDS and "packet" not in PARTITION_KINDS
    for seed in range(20):
        acts = schedule(
            random.Random(seed),
            [1, 2, 3],
            ["packet", "halves", "kill"],
            duration_s=60,
            interval_s=0.5,
            max_concurrent=3,
        )
        assert any(a.f == "packet" for a in acts)
        replay(acts, [1, 2, 3])  # asserts one network fault at a time, each healed
    only = schedule(random.Random(1), [1, 2, 3], ["packet"], duration_s=30, interval_s=1)
    assert {a.f for a in only} == {"packet", "heal"}
    assert [a.f for a in only[:2]] == ["packet", "heal"]
    with pytest.raises(ValueError, match="packet"):
        schedule(random.Random(), [1], ["packet"], duration_s=1)


def test_partition_kinds() -> None:
    nodes = [1, 2, 3, 4, 5]
    for kind in PARTITION_KINDS:
        acts = schedule(random.Random(3), nodes, [kind], duration_s=5, interval_s=1, quiet_s=0)
        parts = [a for a in acts if a.f == "partition"]
        assert parts and all(a.kind == kind for a in parts)
    ring = next(
        a
        for a in schedule(random.Random(1), nodes, ["majorities-ring"], duration_s=5, interval_s=1)
        if a.f == "partition"
    )
    # Each node sees exactly a majority, and no two see the same one.
    views = {n: frozenset(m for g in ring.groups if n in g for m in g) for n in nodes}
    assert all(len(v) == 3 for v in views.values())
    assert len(set(views.values())) == 5
    bridge = next(
        a
        for a in schedule(random.Random(1), nodes, ["bridge"], duration_s=5, interval_s=1)
        if a.f == "partition"
    )
    (shared,) = set(bridge.groups[0]) & set(bridge.groups[1])
    assert set(bridge.groups[0]) | set(bridge.groups[1]) == set(nodes)


def test_majority_available() -> None:
    assert majority_available([1, 2, 3], [])
    assert majority_available([1, 2, 3], [1])
    assert not majority_available([1, 2, 3], [1, 2])
    assert not majority_available([1, 2, 3], [3], ((1,), (2, 3)))
    ring = ((1, 2), (2, 3), (3, 4), (4, 5), (1, 5))
    assert majority_available([1, 2, 3, 4, 5], [], ring)
    assert not majority_available([1, 2, 3, 4, 5], [1, 3], ring)


def test_bad_arguments() -> None:
    rng = random.Random()
    with pytest.raises(ValueError):
        schedule(rng, [1, 2, 3], ["crash"], duration_s=1)
    with pytest.raises(ValueError):
        schedule(rng, [1, 2, 3], ["majorities-ring"], duration_s=1)
    with pytest.raises(ValueError):
        schedule(rng, [1, 1, 2], ["kill"], duration_s=1)
    with pytest.raises(ValueError):
        schedule(rng, [1, 2, 3], ["kill"], duration_s=1, max_concurrent=0)


def test_no_faults_is_a_lone_heal() -> None:
    assert schedule(random.Random(), [1, 2, 3], [], duration_s=10) == [Action(0.0, "heal")]


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    n=st.integers(3, 7),
    # The broker kinds' intents are resolved by the runner from the
    # partitions' metadata (test_broker_kinds_are_intents_ended_by_their_own_end).
    kinds=st.lists(
        st.sampled_from([k for k in FAULT_KINDS if k not in BROKER_KINDS]), min_size=1, unique=True
    ),
    max_concurrent=st.integers(1, 4),
    keep_majority=st.booleans(),
    duration=st.floats(1, 120),
    interval=st.floats(0.1, 5),
    period=st.floats(0.5, 20),
    quiet=st.floats(0, 10),
)
def test_schedule_properties(
    seed: int,
    n: int,
    kinds: list[str],
    max_concurrent: int,
    keep_majority: bool,
    duration: float,
    interval: float,
    period: float,
    quiet: float,
) -> None:
    nodes = list(range(1, n + 1))
    if n < 5 and "majorities-ring" in kinds:
        kinds.remove("majorities-ring")
        if not kinds:
            return
    start = 3.0
    acts = schedule(
        random.Random(seed),
        nodes,
        kinds,
        duration_s=duration,
        interval_s=interval,
        fault_period_s=period,
        quiet_s=quiet,
        max_concurrent=max_concurrent,
        keep_majority=keep_majority,
        start_s=start,
    )
    times = [a.time_s for a in acts]
    assert times == sorted(times)
    assert start <= times[0] and times[-1] <= start + duration
    assert acts[-1].f == "heal"
    states = replay(acts, nodes)
    # Every fault started is ended.
    assert states[-1][1] == {} and not states[-1][2]
    for a, (_, down, _, faults) in zip(acts, states, strict=True):
        assert faults <= max_concurrent
        assert a.f in (
            "kill", "start", "pause", "resume", "partition", "packet", "heal", "rotate-certs"
        )  # fmt: skip
        if a.f == "rotate-certs":
            assert "rotate-certs" in kinds
        if a.f == "partition":
            assert a.kind in kinds and (a.target == "leader") == (a.kind == "isolate-leader")
        if a.f == "packet":
            assert "packet" in kinds and not a.nodes and not a.groups and a.target is None
            assert 0.1 <= a.drop <= 0.3 and 50 <= a.delay_ms <= 150 and 10 <= a.jitter_ms <= 50
        if a.f in ("kill", "pause"):
            assert (a.kind or a.f) in kinds
            assert (a.target == "leader") == (a.kind == "kill-leader")
        if "leader" in down:
            # While the leader is down (node unknown) no node is targeted.
            assert a.f not in ("kill", "pause") or a.target == "leader"
    if keep_majority:
        partition: Action | None = None
        out: set[int] = set()
        leader_out = False
        for a in acts:
            if a.kind == "kill-majority":
                continue  # asked for by name; it is alone in force (replay)
            if a.f in ("kill", "pause"):
                out |= set(a.nodes)
                leader_out = leader_out or a.target == "leader"
            elif a.f in ("start", "resume"):
                out -= set(a.nodes)
                leader_out = leader_out and a.target != "leader"
            elif a.f == "partition":
                partition = a
            elif a.f == "rotate-certs":
                pass  # no node is cut off or down
            else:
                partition = None  # a heal, or a packet fault: it cuts no node off
            leaders = nodes if partition is not None and partition.target else [None]
            killed: list[int | None] = [n for n in nodes if n not in out] if leader_out else [None]
            for leader in leaders:
                p = (
                    partition
                    if leader is None or partition is None
                    else resolve(partition, leader, nodes)
                )
                for k in killed:
                    lost = out | ({k} if k is not None else set())
                    assert majority_available(nodes, lost, p.groups if p else None)
    # Nothing happens in a quiet period, and nothing is in force in one.
    cycle = period + quiet
    eps = 1e-6
    for a in acts[:-1]:
        phase = (a.time_s - start) % cycle
        assert phase <= period + eps or phase >= cycle - eps, (a, phase)
    for k in range(int(duration // cycle) + 1):
        quiet_from = start + k * cycle + period
        before = [st for st, a in zip(states, acts, strict=True) if a.time_s <= quiet_from + eps]
        if before and quiet_from + eps < start + duration:
            assert before[-1][1] == {} and not before[-1][2]
    # The history ops of the whole schedule, resolved, are well formed.
    ops = []
    killed_leader = nodes[0]
    before = [(0.0, {}, False, 0), *states[:-1]]
    for i, a, (_, down, _, _) in zip(range(len(acts)), acts, before, strict=True):
        if a.f == "kill" and a.target == "leader":
            killed_leader = min(n for n in nodes if n not in down)
        target = killed_leader if a.f in ("kill", "start") else nodes[0]
        inv, done = action_ops(
            resolve(a, target, nodes), index=2 * i, invoke_ns=i * 10, complete_ns=i * 10 + 5
        )
        ops += [inv, done]
    assert check_well_formed(ops) == []


def test_kill_leader_is_an_intent_resolved_at_run_time() -> None:
    acts = schedule(random.Random(5), [1, 2, 3], ["kill-leader"], duration_s=10, interval_s=1)
    kill = next(a for a in acts if a.f == "kill")
    start = next(a for a in acts if a.f == "start")
    assert (kill.target, kill.kind, kill.nodes) == ("leader", "kill-leader", ())
    assert (start.target, start.kind) == ("leader", "kill-leader")
    with pytest.raises(ValueError):
        nemesis_op(kill)
    assert nemesis_op(resolve(kill, 2, [1, 2, 3])) == (
        "kill",
        {"nodes": [2], "kind": "kill-leader"},
    )
    assert nemesis_op(resolve(start, 2, [1, 2, 3])) == (
        "start",
        {"nodes": [2], "kind": "kill-leader"},
    )


@pytest.mark.parametrize("n", [3, 4, 5])
def test_kill_majority_kills_a_majority_at_once_and_restarts_it_at_once(n: int) -> None:
    nodes = list(range(1, n + 1))
    acts = schedule(random.Random(n), nodes, ["kill-majority"], duration_s=30, interval_s=1)
    kills = [a for a in acts if a.f == "kill"]
    starts = [a for a in acts if a.f == "start"]
    assert kills and [a.nodes for a in kills] == [a.nodes for a in starts]
    for a in kills:
        assert len(a.nodes) == n // 2 + 1 and not majority_available(nodes, a.nodes)
        assert nemesis_op(a) == ("kill", {"nodes": list(a.nodes), "kind": "kill-majority"})
    replay(acts, nodes)


def test_kill_majority_is_alone_in_force_even_with_other_faults() -> None:
    nodes = [1, 2, 3, 4, 5]
    for seed in range(20):
        acts = schedule(
            random.Random(seed),
            nodes,
            ["kill-majority", "kill", "pause", "halves"],
            duration_s=60,
            interval_s=0.5,
            max_concurrent=3,
        )
        replay(acts, nodes)  # asserts nothing else is in force with a majority down


def test_kill_majority_needs_three_nodes() -> None:
    with pytest.raises(ValueError, match="kill-majority"):
        schedule(random.Random(), [1, 2], ["kill-majority"], duration_s=1)


def test_broker_kinds_are_intents_ended_by_their_own_end() -> None:
    nodes = [1, 2, 3, 4, 5, 6]
    kinds = ["kill-partition-leader", "pause-partition-leader", "isolate-follower"]
    acts = schedule(random.Random(11), nodes, kinds, duration_s=60, interval_s=1)
    seen = {a.kind for a in acts if a.kind}
    assert seen == set(kinds)
    in_force: str | None = None
    for a in acts:
        if a.kind in ("kill-partition-leader", "pause-partition-leader"):
            assert a.target == "partition-leader" and a.nodes == ()
            if a.f in ("kill", "pause"):
                assert in_force is None  # one node-aimed intent at a time
                assert a.f == ("kill" if a.kind == "kill-partition-leader" else "pause")
                in_force = a.kind
            else:
                assert in_force == a.kind
                assert a.f == ("start" if a.kind == "kill-partition-leader" else "resume")
                in_force = None
        if a.kind == "isolate-follower":
            assert a.f == "partition" and a.target == "follower" and a.groups == ()
    assert in_force is None

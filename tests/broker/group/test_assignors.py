"""The server-side assignors (broker/group/assignors.py) on random groups:
random topics and partition counts, random subscriptions (some naming a
topic that does not exist), random current assignments (some naming a
deleted topic or a partition beyond the count, some claimed twice).

- both: every partition of a subscribed topic has one owner, subscribed to
  its topic, and nothing else is assigned; the answer does not depend on the
  spec's insertion order;
- uniform: counts differ by at most one for one subscription; for different
  subscriptions no partition can move to another subscriber of its topic
  with two or more fewer partitions (Kafka's general builder's balance);
  sticky: a member keeps its quota of its current, a second run on the
  first's answer changes nothing, nor does a run on a balanced current
  that is not its own answer, a member joining takes partitions only
  from those above the new quota, a member leaving moves only its own;
- range: each topic split in contiguous ranges over its subscribers in id
  order, n // m each and one more for the first n % m.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.group.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    RangeAssignor,
    UniformAssignor,
    UnknownAssignorError,
    assignor,
)
from broker.group.types import AssignmentSpec, Assignor, MemberSpec, Partitions

ROOT = Path(__file__).resolve().parents[3]

UNIFORM = UniformAssignor()
RANGE = RangeAssignor()

TOPICS = ["t-orders", "t-users", "t-clicks", "t-zeta", "t-a"]
# Subscribed, never in ``spec.topics``: a deleted topic.
GONE = "t-gone"
# Ids whose sorted order is neither insertion nor numeric order.
MEMBERS = ["m1", "m10", "m2", "a", "Z", "m-9", "zz", "b3", "c", "m0"]


def subscribed_topics(spec: AssignmentSpec) -> dict[str, set[str]]:
    """Each existing topic someone subscribes to -> its subscribers."""
    out: dict[str, set[str]] = {}
    for member_id, member in spec.members.items():
        for topic_id in member.topic_ids:
            if topic_id in spec.topics:
                out.setdefault(topic_id, set()).add(member_id)
    return out


def valid_current(spec: AssignmentSpec, member_id: str) -> Partitions:
    member = spec.members[member_id]
    return frozenset(
        (t, p)
        for t, p in member.current
        if t in member.topic_ids and t in spec.topics and p < spec.topics[t]
    )


@st.composite
def specs(
    draw: st.DrawFn, *, homogeneous: bool = False, disjoint: bool = False, min_members: int = 1
) -> AssignmentSpec:
    """A random group.  ``homogeneous``: every member names the same topics.
    ``disjoint``: no partition is in two members' current (what a
    coordinator's own targets look like); otherwise some may be."""
    topic_ids = draw(st.lists(st.sampled_from(TOPICS), unique=True, max_size=len(TOPICS)))
    topics = {t: draw(st.integers(0, 12)) for t in topic_ids}
    member_ids = draw(st.lists(st.sampled_from(MEMBERS), unique=True, min_size=min_members))
    # Mostly existing topics and partitions, some deleted or beyond the count.
    named = st.sampled_from([*topic_ids, GONE])
    names = st.frozensets(named)
    common = draw(names)
    subscriptions = {m: common if homogeneous else draw(names) for m in member_ids}
    # Each partition (and two beyond each count, and two of a deleted topic)
    # is in the current of nobody or of a random member, or of one member
    # that holds much of the group; sometimes in a second member's too.
    owners = st.sampled_from([None, *member_ids])
    hog = draw(owners)
    current: dict[str, set[tuple[str, int]]] = {m: set() for m in member_ids}
    for topic_id in [*topic_ids, GONE]:
        for partition in range(topics.get(topic_id, 0) + 2):
            owner = hog if hog is not None and draw(st.booleans()) else draw(owners)
            if owner is not None:
                current[owner].add((topic_id, partition))
            if not disjoint and draw(st.integers(0, 9)) == 0:
                second = draw(owners)
                if second is not None:
                    current[second].add((topic_id, partition))
    return AssignmentSpec(
        members={
            m: MemberSpec(topic_ids=subscriptions[m], current=frozenset(current[m]))
            for m in member_ids
        },
        topics=topics,
    )


def with_current(
    spec: AssignmentSpec,
    current: Mapping[str, Partitions],
    *,
    add: str | None = None,
    remove: str | None = None,
) -> AssignmentSpec:
    """``spec`` with ``current`` as every member's current target, and
    perhaps one member more (with the first member's subscription) or less."""
    members = {
        m: MemberSpec(topic_ids=s.topic_ids, current=current[m])
        for m, s in spec.members.items()
        if m != remove
    }
    if add is not None:
        members[add] = MemberSpec(topic_ids=next(iter(spec.members.values())).topic_ids)
    return AssignmentSpec(members=members, topics=spec.topics)


def counts(result: Mapping[str, Partitions]) -> dict[str, int]:
    return {m: len(ps) for m, ps in result.items()}


BOTH = pytest.mark.parametrize("chosen", [UNIFORM, RANGE], ids=lambda a: a.name)


# ---------------------------------------------------------------------------
# Both assignors.


@BOTH
@given(spec=specs())
def test_each_subscribed_partition_has_one_subscribed_owner(
    chosen: Assignor, spec: AssignmentSpec
) -> None:
    result = chosen.assign(spec)
    assert set(result) == set(spec.members), "every member is a key, and only members"
    subscribed = subscribed_topics(spec)
    owners: dict[tuple[str, int], list[str]] = {}
    for member_id, partitions in result.items():
        for tp in partitions:
            owners.setdefault(tp, []).append(member_id)
    expected = {(t, p) for t in subscribed for p in range(spec.topics[t])}
    assert set(owners) == expected, "assigned partitions differ from the subscribed ones"
    for (topic_id, partition), who in owners.items():
        assert len(who) == 1, f"{topic_id}/{partition} is assigned to {sorted(who)}"
        assert who[0] in subscribed[topic_id], f"{who[0]} does not subscribe to {topic_id}"


@BOTH
@given(spec=specs(), data=st.data())
def test_the_answer_does_not_depend_on_insertion_order(
    chosen: Assignor, spec: AssignmentSpec, data: st.DataObject
) -> None:
    rng = data.draw(st.randoms(use_true_random=False))
    again = AssignmentSpec(
        members={
            m: MemberSpec(
                topic_ids=frozenset(rng.sample(sorted(s.topic_ids), len(s.topic_ids))),
                current=frozenset(rng.sample(sorted(s.current), len(s.current))),
            )
            for m, s in rng.sample(sorted(spec.members.items()), len(spec.members))
        },
        topics=dict(rng.sample(sorted(spec.topics.items()), len(spec.topics))),
    )
    assert chosen.assign(again) == chosen.assign(spec)


# ---------------------------------------------------------------------------
# Uniform: balance.


@given(spec=specs(homogeneous=True))
def test_uniform_one_subscription_counts_differ_by_at_most_one(spec: AssignmentSpec) -> None:
    sizes = counts(UNIFORM.assign(spec))
    assert max(sizes.values()) - min(sizes.values()) <= 1, sizes


@given(spec=specs())
def test_uniform_no_partition_can_move_to_a_subscriber_two_below_its_owner(
    spec: AssignmentSpec,
) -> None:
    result = UNIFORM.assign(spec)
    sizes = counts(result)
    subscribed = subscribed_topics(spec)
    for owner, partitions in result.items():
        for topic_id, partition in partitions:
            for other in subscribed[topic_id]:
                assert sizes[other] >= sizes[owner] - 1, (
                    f"{topic_id}/{partition} of {owner} ({sizes[owner]}) could move to "
                    f"{other} ({sizes[other]})"
                )


# ---------------------------------------------------------------------------
# Uniform: stickiness.


@given(spec=specs(homogeneous=True, disjoint=True))
def test_uniform_one_subscription_each_member_keeps_its_quota_of_current(
    spec: AssignmentSpec,
) -> None:
    result = UNIFORM.assign(spec)
    total = sum(spec.topics[t] for t in subscribed_topics(spec))
    quota = total // len(spec.members)
    for member_id, partitions in result.items():
        mine = valid_current(spec, member_id)
        assert len(partitions & mine) >= min(len(mine), quota), member_id


@given(spec=st.one_of(specs(), specs(homogeneous=True)))
def test_uniform_a_second_run_on_the_first_answer_changes_nothing(spec: AssignmentSpec) -> None:
    first = UNIFORM.assign(spec)
    assert UNIFORM.assign(with_current(spec, first)) == first


@given(spec=st.one_of(specs(), specs(homogeneous=True)))
def test_uniform_keeps_a_balanced_current_that_is_not_its_own_answer(spec: AssignmentSpec) -> None:
    """The answer for the same group with its member ids swapped in reverse
    order is balanced and covers every partition but differs from this
    group's own answer: as a current assignment it must stay as it is."""
    ids = sorted(spec.members)
    swap = dict(zip(ids, reversed(ids), strict=True))
    swapped = AssignmentSpec(
        members={swap[m]: MemberSpec(topic_ids=s.topic_ids) for m, s in spec.members.items()},
        topics=spec.topics,
    )
    other = UNIFORM.assign(swapped)
    current = {m: other[swap[m]] for m in spec.members}
    assert UNIFORM.assign(with_current(spec, current)) == current


@given(spec=specs(homogeneous=True))
def test_uniform_a_member_joining_takes_only_what_the_others_must_give(
    spec: AssignmentSpec,
) -> None:
    before = UNIFORM.assign(spec)
    newcomer = next(m for m in [*MEMBERS, "new"] if m not in spec.members)
    after = UNIFORM.assign(with_current(spec, before, add=newcomer))
    total = sum(len(ps) for ps in before.values())
    floor = total // (len(spec.members) + 1)
    for member_id, had in before.items():
        now = after[member_id]
        assert now <= had, f"{member_id} was given {sorted(now - had)} of another old member"
        assert len(had) - len(now) <= max(0, len(had) - floor), member_id


@given(spec=specs(homogeneous=True, min_members=2), data=st.data())
def test_uniform_a_member_leaving_moves_only_its_partitions(
    spec: AssignmentSpec, data: st.DataObject
) -> None:
    before = UNIFORM.assign(spec)
    leaver = data.draw(st.sampled_from(sorted(spec.members)))
    after = UNIFORM.assign(with_current(spec, before, remove=leaver))
    for member_id, now in after.items():
        assert before[member_id] <= now, f"{member_id} lost {sorted(before[member_id] - now)}"


# ---------------------------------------------------------------------------
# Range.


@given(spec=specs())
def test_range_splits_each_topic_in_contiguous_ranges_in_member_order(
    spec: AssignmentSpec,
) -> None:
    result = RANGE.assign(spec)
    for topic_id, subscribers in subscribed_topics(spec).items():
        n, members = spec.topics[topic_id], sorted(subscribers)
        start = 0
        for i, member_id in enumerate(members):
            size = n // len(members) + (1 if i < n % len(members) else 0)
            got = sorted(p for t, p in result[member_id] if t == topic_id)
            assert got == list(range(start, start + size)), (topic_id, member_id, got)
            start += size


def test_range_gives_members_of_one_subscription_the_same_partition_numbers() -> None:
    both = frozenset({"t-orders", "t-users"})
    spec = AssignmentSpec(
        members={m: MemberSpec(topic_ids=both) for m in ["c", "a", "b"]},
        topics={"t-orders": 7, "t-users": 7},
    )
    result = RANGE.assign(spec)
    assert result["a"] == {(t, p) for t in both for p in (0, 1, 2)}
    assert result["b"] == {(t, p) for t in both for p in (3, 4)}
    assert result["c"] == {(t, p) for t in both for p in (5, 6)}


# ---------------------------------------------------------------------------
# Edges, the registry, the hash seed.


@BOTH
def test_members_of_no_existing_topic_get_nothing(chosen: Assignor) -> None:
    spec = AssignmentSpec(
        members={
            "a": MemberSpec(topic_ids=frozenset({GONE}), current=frozenset({(GONE, 0)})),
            "b": MemberSpec(topic_ids=frozenset()),
            "c": MemberSpec(topic_ids=frozenset({"t-a"})),
        },
        topics={"t-a": 3, "t-users": 4},
    )
    assert chosen.assign(spec) == {
        "a": frozenset(),
        "b": frozenset(),
        "c": frozenset({("t-a", 0), ("t-a", 1), ("t-a", 2)}),
    }
    assert chosen.assign(AssignmentSpec(members={}, topics={"t-a": 3})) == {}


@BOTH
def test_a_negative_partition_count_is_refused(chosen: Assignor) -> None:
    spec = AssignmentSpec(
        members={"a": MemberSpec(topic_ids=frozenset({"t-a"}))}, topics={"t-a": -1}
    )
    with pytest.raises(ValueError, match="t-a.*negative partition count -1"):
        chosen.assign(spec)


def test_the_registry_names_its_assignors() -> None:
    assert set(ASSIGNORS) == {"uniform", "range"}
    assert all(a.name == name for name, a in ASSIGNORS.items())
    assert DEFAULT_ASSIGNOR == "uniform"
    assert assignor(None) is ASSIGNORS["uniform"]
    assert isinstance(assignor("range"), RangeAssignor)
    assert isinstance(assignor("uniform"), UniformAssignor)


def test_an_unknown_assignor_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(UnknownAssignorError) as caught:
        assignor("sticky")
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert "'sticky'" in message
    assert "range" in message and "uniform" in message


_ASSIGN_IN_A_PROCESS = """
import json, sys
from broker.group.assignors import ASSIGNORS
from broker.group.types import AssignmentSpec, MemberSpec
out = []
for members, topics in json.load(sys.stdin):
    spec = AssignmentSpec(
        members={m: MemberSpec(frozenset(subs), current=frozenset(map(tuple, cur)))
                 for m, (subs, cur) in members.items()},
        topics=topics,
    )
    for name in sorted(ASSIGNORS):
        result = ASSIGNORS[name].assign(spec)
        out.append({m: sorted(ps) for m, ps in sorted(result.items())})
print(json.dumps(out))
"""


def random_groups(rng: random.Random, n: int) -> list[object]:
    """``n`` groups as JSON: members with random subscriptions (half of the
    groups with one subscription) and random, overlapping currents."""
    groups: list[object] = []
    for i in range(n):
        topics = {f"topic-{t}": rng.randint(0, 30) for t in range(rng.randint(1, 8))}
        common = rng.sample(sorted(topics), rng.randint(1, len(topics)))
        members = {}
        for m in range(rng.randint(1, 12)):
            subs = common if i % 2 else rng.sample(sorted(topics), rng.randint(1, len(topics)))
            cur = [(t, rng.randint(0, 32)) for t in subs for _ in range(rng.randint(0, 8))]
            members[f"member-{m}"] = (subs, cur)
        groups.append((members, topics))
    return groups


def test_the_answer_does_not_depend_on_the_processes_hash_seed() -> None:
    """Strings hash differently in each process (PYTHONHASHSEED), and so the
    iteration order of the spec's sets: two coordinators must still compute
    the same target from the same group."""
    groups = json.dumps(random_groups(random.Random(11), 60))
    outputs = []
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", _ASSIGN_IN_A_PROCESS],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            input=groups,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(json.loads(done.stdout))
    assert len(outputs[0]) == 120
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_large_group_spreads_every_topic() -> None:
    """200 members over 40 topics of 50 partitions: one subscription, so each
    member holds 10, dealt round-robin so that each is of another topic."""
    topics = {f"t{i:02}": 50 for i in range(40)}
    every = frozenset(topics)
    spec = AssignmentSpec(
        members={f"m{i:03}": MemberSpec(topic_ids=every) for i in range(200)}, topics=topics
    )
    result = UNIFORM.assign(spec)
    assert {len(ps) for ps in result.values()} == {10}
    assert {len({t for t, _ in ps}) for ps in result.values()} == {10}
    rng = random.Random(7)
    # A second run from the first answer with a fifth of the members gone.
    gone = set(rng.sample(sorted(result), 40))
    again = UNIFORM.assign(
        AssignmentSpec(
            members={
                m: MemberSpec(topic_ids=every, current=result[m]) for m in result if m not in gone
            },
            topics=topics,
        )
    )
    assert {len(ps) for ps in again.values()} == {12, 13}
    assert all(result[m] <= again[m] for m in again)

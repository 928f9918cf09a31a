"""One partition's next state: elections, ISR changes and reassignment
steps (metadata/partition_change.py)."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.image import PartitionRegistration
from metadata.partition_change import Election, PartitionChange, reassignment_replicas
from metadata.records import NO_LEADER, NO_LEADER_CHANGE, LeaderRecoveryState

RECOVERING = LeaderRecoveryState.RECOVERING
RECOVERED = LeaderRecoveryState.RECOVERED


def change(p: PartitionRegistration, live: Iterable[int], **kwargs: object) -> PartitionChange:
    ids = set(live)
    c = PartitionChange("T", 0, p, lambda b: b in ids)
    for key, value in kwargs.items():
        setattr(c, key, value)
    return c


def after(p: PartitionRegistration, live: Iterable[int], **kwargs: object) -> PartitionRegistration:
    record = change(p, live, **kwargs).build()
    assert record is not None
    assert (record.topic_id, record.partition_id) == ("T", 0)
    return p.merge(record)


P = PartitionRegistration((1, 2, 3), (1, 2, 3), leader=1, leader_epoch=4, partition_epoch=7)


# -- nothing to do ---------------------------------------------------------------------


def test_no_op_returns_none() -> None:
    assert change(P, [1, 2, 3]).build() is None
    assert change(P, [1, 2, 3], target_isr=(1, 2, 3)).build() is None
    assert change(P, [1, 2, 3], target_replicas=(1, 2, 3)).build() is None
    # A preferred election where the preferred replica leads already.
    assert change(P, [1, 2, 3], election=Election.PREFERRED).build() is None
    # An unclean election of a partition whose leader is fine.
    assert change(P, [1, 2, 3], election=Election.UNCLEAN).build() is None
    # "Recovered" of a partition that was never recovering.
    assert change(P, [1, 2, 3], recovered=True).build() is None
    # A leaderless partition with nobody to elect stays as it is.
    offline = PartitionRegistration((1, 2), (1,), leader=NO_LEADER)
    assert change(offline, []).build() is None
    assert change(offline, [], election=Election.UNCLEAN).build() is None


def test_only_changed_fields_are_written() -> None:
    record = change(P, [1, 2, 3], target_isr=(1, 2)).build()
    assert record is not None
    assert record.isr == (1, 2)
    assert record.leader == NO_LEADER_CHANGE
    assert record.replicas is None and record.adding_replicas is None
    assert record.removing_replicas is None and record.leader_recovery_state is None
    new = P.merge(record)
    assert (new.leader, new.leader_epoch, new.partition_epoch) == (1, 4, 8)


# -- elections -------------------------------------------------------------------------


def test_online_keeps_a_valid_leader() -> None:
    new = after(P, [1, 3], target_isr=(1, 3))
    assert new.leader == 1 and new.leader_epoch == 4


def test_online_moves_leadership_from_an_inactive_leader() -> None:
    # The first active ISR member in replica order.
    new = after(P, [2, 3])
    assert new.leader == 2 and new.leader_epoch == 5 and new.partition_epoch == 8
    new = after(P, [3], target_isr=(2, 3))
    assert new.leader == 3 and new.isr == (2, 3)


def test_online_never_takes_a_replica_outside_the_isr() -> None:
    p = PartitionRegistration((1, 2, 3), (1,), leader=1)
    new = after(p, [2, 3])
    assert new.leader == NO_LEADER
    assert new.isr == (1,)
    assert new.leader_recovery_state is RECOVERED


def test_preferred_election() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2, 3), leader=2, leader_epoch=3)
    new = after(p, [1, 2, 3], election=Election.PREFERRED)
    assert new.leader == 1 and new.leader_epoch == 4
    # The preferred replica outside the ISR or inactive: as ONLINE (the
    # current leader stays).
    assert change(p, [2, 3], election=Election.PREFERRED).build() is None
    out_of_isr = PartitionRegistration((1, 2, 3), (2, 3), leader=2)
    assert change(out_of_isr, [1, 2, 3], election=Election.PREFERRED).build() is None
    # ... or, if the leader cannot lead either, the first that can.
    new = after(p, [3], election=Election.PREFERRED)
    assert new.leader == 3


def test_unclean_election_prefers_a_clean_one() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2), leader=1)
    new = after(p, [2, 3], election=Election.UNCLEAN)
    assert new.leader == 2 and new.isr == (1, 2)
    assert new.leader_recovery_state is RECOVERED


def test_unclean_election() -> None:
    # No ISR member can lead: any active replica, the ISR shrinks to it and
    # it is RECOVERING (KIP-704).
    p = PartitionRegistration((1, 2, 3), (1,), leader=NO_LEADER, leader_epoch=2)
    new = after(p, [3, 2], election=Election.UNCLEAN)
    assert new.leader == 2
    assert new.isr == (2,)
    assert new.leader_recovery_state is RECOVERING
    assert new.leader_epoch == 3
    # Nobody active at all: no leader; the last ISR member stays.
    assert change(p, [], election=Election.UNCLEAN).build() is None


def test_the_last_isr_members_go_to_the_elr_when_the_partition_goes_offline() -> None:
    # KIP-966 replaces Kafka's old "keep the last ISR member": the ISR may be
    # empty, and the members that left it below min ISR are the ELR.
    p = PartitionRegistration((1, 2), (1,), leader=1, leader_epoch=1)
    new = after(p, [2], target_isr=())
    assert new.leader == NO_LEADER and new.isr == () and new.elr == (1,)
    assert new.leader_epoch == 2
    # With two members leaving at once, both are eligible.
    p = PartitionRegistration((1, 2, 3), (2, 1), leader=2)
    new = after(p, [3], target_isr=())
    assert new.leader == NO_LEADER and new.isr == () and new.elr == (1, 2)


def test_recovered_leader() -> None:
    p = PartitionRegistration((1, 2), (1,), leader=1, leader_recovery_state=RECOVERING)
    new = after(p, [1, 2], recovered=True)
    assert new.leader_recovery_state is RECOVERED
    assert new.leader == 1 and new.leader_epoch == p.leader_epoch
    # Recovered with a bigger ISR in one change.
    new = after(p, [1, 2], recovered=True, target_isr=(1, 2))
    assert new.isr == (1, 2) and new.leader_recovery_state is RECOVERED
    # Without the flag, the state stays.
    new = after(p, [1, 2], target_isr=(1, 2))
    assert new.leader_recovery_state is RECOVERING


def test_bump_leader_epoch_keeps_the_leader() -> None:
    new = after(P, [1, 2, 3], bump_leader_epoch=True)
    assert new.leader == 1 and new.leader_epoch == P.leader_epoch + 1


# -- reassignment --------------------------------------------------------------------------


def test_reassignment_replicas() -> None:
    # Target first, then the replicas being removed.
    assert reassignment_replicas((1, 2, 3), (3, 4, 5)) == ((3, 4, 5, 1, 2), (4, 5), (1, 2))
    assert reassignment_replicas((1, 2), (2, 1)) == ((2, 1), (), ())
    assert reassignment_replicas((1, 2, 3), (1, 2)) == ((1, 2, 3), (), (3,))


def start_reassignment(
    p: PartitionRegistration, target: tuple[int, ...], live: Iterable[int]
) -> PartitionRegistration:
    replicas, adding, removing = reassignment_replicas(p.replicas, target)
    return after(p, live, target_replicas=replicas, target_adding=adding, target_removing=removing)


def test_reassignment_completes_when_the_adding_replicas_join_the_isr() -> None:
    p = PartitionRegistration((1, 2, 3), (1, 2, 3), leader=1, leader_epoch=1)
    moving = start_reassignment(p, (3, 4, 5), [1, 2, 3, 4, 5])
    assert moving.replicas == (3, 4, 5, 1, 2)
    assert moving.adding_replicas == (4, 5) and moving.removing_replicas == (1, 2)
    assert moving.leader == 1 and moving.leader_epoch == 1
    assert moving.is_reassigning and moving.target_replicas() == (3, 4, 5)
    # One of the two joins: not yet.
    half = after(moving, [1, 2, 3, 4, 5], target_isr=(1, 2, 3, 4))
    assert half.is_reassigning and half.isr == (1, 2, 3, 4)
    # Both: the reassignment completes, the removed replicas leave the ISR,
    # the leader (being removed) moves and the leader epoch grows.
    done = after(half, [1, 2, 3, 4, 5], target_isr=(1, 2, 3, 4, 5))
    assert done.replicas == (3, 4, 5)
    assert done.isr == (3, 4, 5)
    assert done.adding_replicas == () and done.removing_replicas == ()
    assert done.leader == 3 and done.leader_epoch == 2
    assert not done.is_reassigning


def test_completing_a_reassignment_bumps_the_leader_epoch_even_if_the_leader_stays() -> None:
    p = PartitionRegistration((1, 2), (1, 2), leader=1, leader_epoch=5)
    moving = start_reassignment(p, (1, 3), [1, 2, 3])
    done = after(moving, [1, 2, 3], target_isr=(1, 2, 3))
    assert done.replicas == (1, 3) and done.leader == 1
    assert done.leader_epoch == 6


def test_a_reassignment_that_only_removes_completes_at_once() -> None:
    # Nothing to add: done in the same change, and the leader epoch grows
    # because a replica went away.
    p = PartitionRegistration((1, 2, 3), (1, 2, 3), leader=1, leader_epoch=5)
    done = start_reassignment(p, (1, 2), [1, 2, 3])
    assert done.replicas == (1, 2) and done.isr == (1, 2)
    assert not done.is_reassigning
    assert done.leader == 1 and done.leader_epoch == 6


def test_a_reassignment_does_not_complete_into_an_empty_isr() -> None:
    # The only ISR member is being removed and the adding replica has not
    # joined: keep going.
    p = PartitionRegistration((1,), (1,), leader=1)
    moving = start_reassignment(p, (2,), [1, 2])
    assert moving.replicas == (2, 1) and moving.is_reassigning and moving.leader == 1


# -- properties ---------------------------------------------------------------------------


@st.composite
def partitions(draw: st.DrawFn) -> tuple[PartitionRegistration, set[int]]:
    replicas = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)))
    isr = tuple(b for b in replicas if draw(st.booleans()))
    if draw(st.booleans()):
        isr = isr or replicas[:1]
    # KIP-966: the ELR is disjoint from the ISR, the last-known ELR from both.
    elr = tuple(b for b in replicas if b not in isr and draw(st.booleans()))
    last_known = tuple(b for b in replicas if b not in isr + elr and draw(st.booleans()))
    live = set(draw(st.lists(st.integers(0, 5), max_size=6, unique=True)))
    leader = draw(st.sampled_from([NO_LEADER, *(b for b in isr if b in live)]))
    return (
        PartitionRegistration(
            replicas,
            isr,
            leader=leader,
            leader_epoch=draw(st.integers(0, 9)),
            partition_epoch=draw(st.integers(0, 9)),
            elr=elr,
            last_known_elr=last_known,
        ),
        live,
    )


@settings(max_examples=400, deadline=None)
@given(partitions(), st.sampled_from(Election), st.integers(1, 4), st.booleans(), st.data())
def test_every_change_keeps_the_invariants(
    state: tuple[PartitionRegistration, set[int]],
    election: Election,
    min_isr: int,
    last_known_leader: bool,
    data: st.DataObject,
) -> None:
    p, live = state
    target_isr = None
    if data.draw(st.booleans()):
        target_isr = tuple(b for b in p.isr if data.draw(st.booleans()))
    unclean_shutdown = tuple(b for b in p.replicas if data.draw(st.booleans()))
    record = change(
        p,
        live,
        election=election,
        target_isr=target_isr,
        min_isr=min_isr,
        unclean_shutdown=unclean_shutdown,
        use_last_known_leader=last_known_leader,
    ).build()
    if record is None:
        return
    new = p.merge(record)
    assert new.partition_epoch == p.partition_epoch + 1
    assert new.leader_epoch >= p.leader_epoch
    if new.leader != p.leader:
        assert new.leader_epoch == p.leader_epoch + 1
    assert set(new.isr) <= set(new.replicas)
    assert set(new.elr) <= set(new.replicas) and set(new.last_known_elr) <= set(new.replicas)
    assert not set(new.elr) & set(new.isr), "the ELR and the ISR are disjoint"
    assert not set(new.last_known_elr) & set(new.isr)
    if not last_known_leader:
        assert not set(new.last_known_elr) & set(new.elr)
    else:
        # The last-known ELR holds the last known leader alone (Kafka's
        # maybeUpdateLastKnownLeader): set when the ISR empties, kept while
        # the partition has no leader, forgotten once it has one.
        if p.isr and not new.isr and p.leader != NO_LEADER:
            assert new.last_known_elr == (p.leader,)
        elif new.has_leader:
            assert new.last_known_elr == ()
        else:
            assert new.last_known_elr in (p.last_known_elr, ())
    assert not set(new.elr) - set(p.elr) - set(p.isr), "the ELR only takes old ISR members"
    asked_isr = target_isr if target_isr is not None else p.isr
    elected_from_elr = new.has_leader and new.leader not in asked_isr
    if len(new.isr) >= min_isr and not elected_from_elr:
        # (After an election from the ELR, Kafka leaves the others in it:
        # the next change clears them.)
        assert new.elr == ()
        if not last_known_leader or new.has_leader:
            assert new.last_known_elr == ()
    elected_last_known = (
        last_known_leader
        and new.has_leader
        and new.leader != p.leader
        and p.last_known_elr == (new.leader,)
        and new.leader not in set(asked_isr) | set(p.elr)
    )
    if elected_last_known:
        # KIP-966's last resort, never while an ISR or ELR member could
        # lead: unclean (RECOVERING, the ISR itself alone), live, and the
        # ISR and ELR asked for were empty.
        assert new.leader in live and new.isr == (new.leader,)
        assert new.leader_recovery_state is LeaderRecoveryState.RECOVERING
        assert new.elr == () and new.last_known_elr == ()
        assert not asked_isr
        return
    if new.has_leader:
        assert new.leader in new.isr
        assert new.leader in live
    if election is not Election.UNCLEAN:
        # A clean election never grows the ISR beyond the old ISR and ELR,
        # and elects from the ELR only when the ISR is empty.
        assert set(new.isr) <= set(p.isr) | set(p.elr)
        if new.leader != p.leader and new.has_leader and new.leader not in p.isr:
            assert new.leader in p.elr and new.isr == (new.leader,)
            assert not asked_isr
        assert new.leader_recovery_state is p.leader_recovery_state

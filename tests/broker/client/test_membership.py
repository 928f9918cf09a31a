"""The member state machine (KIP-848 consumer protocol): join, revoke before
assign, acknowledge, fenced -> lost -> rejoin at epoch 0, leave, the max
poll interval, fatal errors, auto-commit's timing; random answer sequences
keep the owned set and the listener calls legal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client.consumer import ConsumerCore, FetchAnswer, LeaderInfo
from broker.client.membership import (
    LEAVE_EPOCH,
    LEAVE_STATIC_EPOCH,
    AssignedTopic,
    AutoCommitTimer,
    HeartbeatAnswer,
    Membership,
    MembershipConfig,
    MemberState,
    RebalanceKind,
)
from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from partition_log.batch import build_batch
from partition_log.records import Record

ID = "id-t"


def tp(p: int) -> TopicPartition:
    return TopicPartition("t", p)


def assignment(*parts: int) -> tuple[AssignedTopic, ...]:
    return (AssignedTopic(ID, "t", tuple(parts)),)


def ok(epoch: int, *parts: int, member: str = "m1", interval: int = 1000) -> HeartbeatAnswer:
    return HeartbeatAnswer(
        member_id=member,
        member_epoch=epoch,
        heartbeat_interval_ms=interval,
        assignment=assignment(*parts),
    )


def member(**overrides: object) -> Membership:
    m = Membership(MembershipConfig("g", client_id="c", **overrides))  # type: ignore[arg-type]
    m.subscribe(["t"])
    return m


def run_steps(m: Membership, log: list[tuple[RebalanceKind, frozenset[TopicPartition]]]) -> None:
    while (step := m.rebalance_step()) is not None:
        log.append((step.kind, step.partitions))
        m.complete(step, 0)


def test_join_sends_epoch_zero_with_the_subscription_then_assigns() -> None:
    m = member(server_assignor="range")
    join = m.heartbeat_to_send(0)
    assert join is not None
    assert (join.member_id, join.member_epoch, join.subscribed_topic_names) == ("", 0, ("t",))
    assert join.owned == () and join.server_assignor == "range"
    assert m.heartbeat_to_send(0) is None  # one at a time
    m.step_heartbeat_response(ok(1, 0, 1), 0)
    assert m.state is MemberState.RECONCILING
    log: list[tuple[RebalanceKind, frozenset[TopicPartition]]] = []
    run_steps(m, log)
    assert log == [(RebalanceKind.ASSIGN, frozenset({tp(0), tp(1)}))]
    assert m.state is MemberState.ACKNOWLEDGING
    ack = m.heartbeat_to_send(0)  # at once, not after the interval
    assert ack is not None
    assert (ack.member_id, ack.member_epoch, ack.owned) == ("m1", 1, ((ID, (0, 1)),))
    m.step_heartbeat_response(HeartbeatAnswer(member_id="m1", member_epoch=1,
                                              heartbeat_interval_ms=1000), 5)  # fmt: skip
    assert m.state is MemberState.STABLE
    assert m.heartbeat_to_send(1004) is None
    assert m.heartbeat_to_send(1005) is not None


def test_revoke_comes_before_assign_and_before_the_acknowledgement() -> None:
    m = member()
    m.heartbeat_to_send(0)
    m.step_heartbeat_response(ok(1, 0, 1), 0)
    run_steps(m, [])
    m.heartbeat_to_send(0)
    m.step_heartbeat_response(ok(2, 1, 2), 10)
    step = m.rebalance_step()
    assert step is not None and step.kind is RebalanceKind.REVOKE
    assert step.partitions == {tp(0)}
    # Until the driver has committed and called the listener, partition 0
    # is still owned (the coordinator must not give it away) and no
    # acknowledgement goes.
    assert m.held == {tp(0), tp(1)}
    assert m.state is MemberState.RECONCILING
    assert m.rebalance_step() is None  # one step at a time
    hb = m.heartbeat_to_send(2000)
    assert hb is not None and hb.owned == ((ID, (0, 1)),)
    m.step_heartbeat_response(HeartbeatAnswer(member_id="m1", member_epoch=2,
                                              heartbeat_interval_ms=1000), 2000)  # fmt: skip
    m.complete(step, 2001)
    assert m.held == {tp(1)}
    step = m.rebalance_step()
    assert step is not None and step.kind is RebalanceKind.ASSIGN
    assert step.partitions == {tp(2)}
    m.complete(step, 2002)
    assert m.state is MemberState.ACKNOWLEDGING
    ack = m.heartbeat_to_send(2002)
    assert ack is not None and ack.owned == ((ID, (1, 2)),) and ack.member_epoch == 2


def test_fenced_loses_the_partitions_and_rejoins_at_epoch_zero_with_its_id() -> None:
    for error in (Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID):
        m = member()
        m.heartbeat_to_send(0)
        m.step_heartbeat_response(ok(3, 0), 0)
        run_steps(m, [])
        m.heartbeat_to_send(0)
        m.step_heartbeat_response(HeartbeatAnswer(error=error), 1)
        assert m.state is MemberState.FENCED
        assert m.heartbeat_to_send(10_000) is None  # not before the loss is told
        log: list[tuple[RebalanceKind, frozenset[TopicPartition]]] = []
        run_steps(m, log)
        assert log == [(RebalanceKind.LOSE, frozenset({tp(0)}))]
        rejoin = m.heartbeat_to_send(2)
        assert rejoin is not None
        assert (rejoin.member_id, rejoin.member_epoch, rejoin.owned) == ("m1", 0, ())


def test_retriable_errors_retry_after_the_backoff_and_keep_the_partitions() -> None:
    m = member(retry_backoff_ms=50)
    m.heartbeat_to_send(0)
    m.step_heartbeat_response(ok(1, 0), 0)
    run_steps(m, [])
    for error in (Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                  Errors.COORDINATOR_NOT_AVAILABLE):  # fmt: skip
        assert m.heartbeat_to_send(100) is not None
        m.step_heartbeat_response(HeartbeatAnswer(error=error), 100)
        assert m.heartbeat_to_send(149) is None
        assert m.held == {tp(0)} and m.rebalance_step() is None
        m.step_heartbeat_failure(0)  # harmless: nothing in flight
    m.heartbeat_to_send(150)
    m.step_heartbeat_failure(150)
    assert m.heartbeat_to_send(199) is None and m.heartbeat_to_send(200) is not None


def test_other_errors_are_fatal_and_lose_the_partitions() -> None:
    for error in (Errors.GROUP_AUTHORIZATION_FAILED, Errors.INVALID_REQUEST,
                  Errors.UNSUPPORTED_ASSIGNOR):  # fmt: skip
        m = member()
        m.heartbeat_to_send(0)
        m.step_heartbeat_response(ok(1, 0), 0)
        run_steps(m, [])
        m.heartbeat_to_send(0)
        m.step_heartbeat_response(HeartbeatAnswer(error=error, message="no"), 1)
        assert m.state is MemberState.FATAL and m.error is error
        log: list[tuple[RebalanceKind, frozenset[TopicPartition]]] = []
        run_steps(m, log)
        assert log == [(RebalanceKind.LOSE, frozenset({tp(0)}))]
        assert m.heartbeat_to_send(10_000) is None


def test_leave_revokes_then_sends_epoch_minus_one() -> None:
    m = member()
    m.heartbeat_to_send(0)
    m.step_heartbeat_response(ok(1, 0, 1), 0)
    run_steps(m, [])
    m.leave()
    assert m.state is MemberState.PREPARE_LEAVING
    assert m.heartbeat_to_send(0) is None  # not before the revocation
    log: list[tuple[RebalanceKind, frozenset[TopicPartition]]] = []
    run_steps(m, log)
    assert log == [(RebalanceKind.REVOKE, frozenset({tp(0), tp(1)}))]
    leave = m.heartbeat_to_send(0)
    assert leave is not None and leave.member_epoch == LEAVE_EPOCH and leave.member_id == "m1"
    m.step_heartbeat_response(HeartbeatAnswer(member_id="m1", member_epoch=-1), 1)
    assert m.state is MemberState.UNSUBSCRIBED and m.left()


def test_a_static_member_leaves_with_epoch_minus_two() -> None:
    """KIP-848: with an instance id the leave is -2, so that the
    coordinator keeps its partitions for its next instance."""
    m = member(instance_id="i-1")
    first = m.heartbeat_to_send(0)
    assert first is not None and first.instance_id == "i-1"
    m.step_heartbeat_response(ok(1, 0, 1), 0)
    run_steps(m, [])
    m.leave()
    run_steps(m, [])
    leave = m.heartbeat_to_send(0)
    assert leave is not None and leave.member_epoch == LEAVE_STATIC_EPOCH
    assert leave.instance_id == "i-1"
    m.step_heartbeat_response(HeartbeatAnswer(member_id="m1", member_epoch=-2), 1)
    assert m.left()


def test_max_poll_interval_leaves_then_the_next_poll_rejoins() -> None:
    m = member(max_poll_interval_ms=1000)
    m.on_poll(0)
    m.heartbeat_to_send(0)
    m.step_heartbeat_response(ok(1, 0), 0)
    run_steps(m, [])
    m.tick(1000)
    assert m.state is MemberState.ACKNOWLEDGING  # not yet past the interval
    m.tick(1001)
    assert m.state is MemberState.LEAVING
    leave = m.heartbeat_to_send(1001)
    assert leave is not None and leave.member_epoch == LEAVE_EPOCH
    m.step_heartbeat_response(HeartbeatAnswer(), 1002)
    assert m.state is MemberState.STALE
    assert m.heartbeat_to_send(5000) is None  # no rejoin without a poll
    m.on_poll(5000)
    log: list[tuple[RebalanceKind, frozenset[TopicPartition]]] = []
    run_steps(m, log)
    assert log == [(RebalanceKind.LOSE, frozenset({tp(0)}))]
    rejoin = m.heartbeat_to_send(5000)
    assert rejoin is not None and rejoin.member_epoch == 0 and rejoin.member_id == "m1"


def test_closing_a_stale_member_loses_its_partitions_and_does_not_rejoin() -> None:
    m = member(max_poll_interval_ms=1000)
    m.on_poll(0)
    m.heartbeat_to_send(0)
    m.step_heartbeat_response(ok(1, 0), 0)
    run_steps(m, [])
    m.tick(1001)
    m.heartbeat_to_send(1001)
    m.step_heartbeat_response(HeartbeatAnswer(), 1002)
    assert m.state is MemberState.STALE
    m.leave()  # close before the application polls again
    assert not m.left()
    log: list[tuple[RebalanceKind, frozenset[TopicPartition]]] = []
    run_steps(m, log)
    assert log == [(RebalanceKind.LOSE, frozenset({tp(0)}))]
    assert m.state is MemberState.UNSUBSCRIBED and m.left()
    assert m.heartbeat_to_send(5000) is None


def records(offsets: range, epoch: int = 4) -> bytes:
    return build_batch(
        [Record(o, 0, None, b"v%d" % o) for o in offsets],
        base_offset=offsets[0],
        partition_leader_epoch=epoch,
    )


def test_auto_commit_commits_what_earlier_polls_returned() -> None:
    """The driver's poll order: the commit due at the start of a poll takes
    the positions BEFORE this poll's records (Jepsen's Bufstream finding: a
    commit of the records being returned loses them if the consumer dies
    before processing them)."""
    core = ConsumerCore()
    core.assign([tp(0)])
    core.seek(tp(0), 0)
    timer = AutoCommitTimer(100, now_ms=0)
    core.fetch_requests({tp(0): LeaderInfo(1, 4)})
    core.on_fetch_answer(tp(0), FetchAnswer(0, high_watermark=10, records=records(range(10))))

    def poll(now_ms: int) -> tuple[dict[TopicPartition, int] | None, list[int]]:
        # Consumer.poll's order: the auto-commit first, then the records.
        commit = core.positions() if timer.maybe_due(now_ms) else None
        return commit, [r.offset for r in core.poll(max_records=5)]

    assert poll(0) == (None, [0, 1, 2, 3, 4])
    commit, returned = poll(100)
    assert returned == [5, 6, 7, 8, 9]
    assert commit == {tp(0): 5}  # not 10: records 5..9 are not processed yet


# -- random answer sequences ------------------------------------------------------

ANSWERS = st.one_of(
    st.builds(
        lambda parts, epoch: ("ok", frozenset(parts), epoch),
        st.sets(st.integers(0, 4), max_size=5),
        st.integers(1, 20),
    ),
    st.sampled_from(
        [
            ("err", Errors.FENCED_MEMBER_EPOCH, 0),
            ("err", Errors.UNKNOWN_MEMBER_ID, 0),
            ("err", Errors.NOT_COORDINATOR, 0),
            ("err", Errors.COORDINATOR_LOAD_IN_PROGRESS, 0),
            ("err", Errors.GROUP_AUTHORIZATION_FAILED, 0),
            ("none", None, 0),
            ("lost", None, 0),
            ("steps", None, 0),
            ("leave", None, 0),
            ("stall", None, 0),
            ("poll", None, 0),
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ANSWERS, max_size=40))
def test_random_answers_keep_owned_within_the_assignment_and_callbacks_legal(
    events: list[tuple[str, object, int]],
) -> None:
    m = member(max_poll_interval_ms=1000)
    now = 0
    m.on_poll(now)
    told: set[TopicPartition] = set()  # what the listener believes it holds
    last_assignment: frozenset[TopicPartition] = frozenset()
    revoking: frozenset[TopicPartition] = frozenset()

    def do_steps() -> None:
        nonlocal revoking
        while (step := m.rebalance_step()) is not None:
            if step.kind is RebalanceKind.ASSIGN:
                assert not (step.partitions & told), "assigned twice without a revoke"
                assert step.partitions <= last_assignment
                told.update(step.partitions)
            else:
                assert step.partitions <= told, "revoked or lost what was not assigned"
                told.difference_update(step.partitions)
            revoking = frozenset()
            m.complete(step, now)

    for kind, value, epoch in events:
        now += 100
        m.tick(now)
        request = m.heartbeat_to_send(now)
        if request is not None and request.owned is not None:
            owned = {TopicPartition(m.names[t], p) for t, ps in request.owned for p in ps}
            assert owned == told  # owned is what the listener holds
            # Held partitions beyond the last assignment are only those
            # whose revocation is waiting for the commit and the listener.
            if m.state is not MemberState.RECONCILING:
                assert owned <= last_assignment
            if request.member_epoch == 0:
                assert owned == set()
        if kind == "steps":
            do_steps()
        elif kind == "leave":
            m.leave()
        elif kind == "stall":
            now += 2000
        elif kind == "poll":
            m.on_poll(now)
            do_steps()
        if request is None:
            continue
        if kind == "ok":
            parts = value
            assert isinstance(parts, frozenset)
            last_assignment = frozenset(tp(p) for p in parts)
            m.step_heartbeat_response(ok(epoch, *sorted(parts)), now)
        elif kind == "err":
            assert isinstance(value, Errors)
            m.step_heartbeat_response(HeartbeatAnswer(error=value), now)
            if value in (Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID):
                last_assignment = frozenset()
        elif kind == "lost":
            m.step_heartbeat_failure(now)
        else:
            same = max(m.member_epoch, 1)
            m.step_heartbeat_response(HeartbeatAnswer(member_id="m1", member_epoch=same), now)
    do_steps()
    assert m.held == told


def stable_member() -> Membership:
    m = member()
    assert m.heartbeat_to_send(0) is not None
    m.step_heartbeat_response(ok(1, 0, 1), 0)
    run_steps(m, [])
    assert m.heartbeat_to_send(0) is not None  # the acknowledgement
    m.step_heartbeat_response(ok(1, 0, 1), 0)
    assert m.state is MemberState.STABLE
    return m


def test_the_same_assignment_said_again_waits_for_the_interval() -> None:
    """The coordinator answers the assignment on every heartbeat: one that
    is already held is not a reconciliation, and the next heartbeat waits
    for the interval (acknowledging it at once heartbeated every round trip)."""
    m = stable_member()
    assert m.heartbeat_to_send(999) is None
    assert m.heartbeat_to_send(1000) is not None
    m.step_heartbeat_response(ok(1, 0, 1), 1000)
    assert m.state is MemberState.STABLE
    assert m.rebalance_step() is None
    assert m.heartbeat_to_send(1000) is None
    assert m.heartbeat_to_send(1999) is None
    assert m.heartbeat_to_send(2000) is not None


def test_a_join_answered_with_nothing_yet_is_stable_and_waits() -> None:
    m = member()
    assert m.heartbeat_to_send(0) is not None
    m.step_heartbeat_response(ok(2), 0)  # every partition still owned by others
    assert m.state is MemberState.STABLE and m.member_epoch == 2
    assert m.heartbeat_to_send(1) is None


def test_a_leave_decided_while_a_heartbeat_is_in_flight_is_still_sent() -> None:
    m = stable_member()
    beat = m.heartbeat_to_send(1000)
    assert beat is not None and beat.member_epoch == 1
    m.leave()
    run_steps(m, [])  # revoked: the leave is due
    assert m.state is MemberState.LEAVING
    m.step_heartbeat_response(ok(1, 0, 1), 1001)  # the earlier heartbeat's answer
    assert not m.left()
    leave = m.heartbeat_to_send(1001)
    assert leave is not None and leave.member_epoch == LEAVE_EPOCH
    m.step_heartbeat_response(HeartbeatAnswer(member_id="m1", member_epoch=-1), 1002)
    assert m.left()


def test_a_heartbeat_lost_before_the_leave_still_sends_the_leave() -> None:
    m = stable_member()
    assert m.heartbeat_to_send(1000) is not None
    m.leave()
    run_steps(m, [])
    m.step_heartbeat_failure(1001)
    assert not m.left()
    leave = m.heartbeat_to_send(1001)
    assert leave is not None and leave.member_epoch == LEAVE_EPOCH
    m.step_heartbeat_failure(1002)  # a leave is not retried
    assert m.left()

"""Static membership (KIP-848 with ``group.instance.id``): a static member
that leaves with epoch -2 keeps its partitions, and its instance joining
again under a new member id takes them over with no rebalance; an instance
id held by a member that has not left is refused; a replaced member is
fenced; a static member whose session ends is removed as any other."""

from __future__ import annotations

from broker.errors import Errors
from broker.group.api import HeartbeatRequest, HeartbeatResponse
from broker.group.shard import GroupCoordinatorShard
from broker.group.types import LEAVE_STATIC_EPOCH
from tests.broker.group.harness import (
    Client,
    Log,
    MapTopics,
    compacted,
    dump,
    heartbeat,
    new_shard,
    owners_disjoint,
    rebuilt,
)

TOPICS = MapTopics({"t": 4})


def join(
    shard: GroupCoordinatorShard, log: Log, instance: str, now_ms: int = 0, member_id: str = ""
) -> HeartbeatResponse:
    result = shard.consumer_group_heartbeat(
        HeartbeatRequest(
            "g",
            member_id,
            0,
            instance_id=instance,
            rebalance_timeout_ms=60_000,
            subscribed_topic_names=("t",),
            owned=frozenset(),
        ),
        TOPICS,
        now_ms,
    )
    log.apply(shard, result)
    return result.response


def beat(
    shard: GroupCoordinatorShard,
    log: Log,
    answer: HeartbeatResponse,
    instance: str | None,
    epoch: int | None = None,
    now_ms: int = 0,
) -> HeartbeatResponse:
    result = shard.consumer_group_heartbeat(
        HeartbeatRequest(
            "g",
            answer.member_id,
            answer.member_epoch if epoch is None else epoch,
            instance_id=instance,
            owned=answer.assignment,
        ),
        TOPICS,
        now_ms,
    )
    log.apply(shard, result)
    return result.response


def test_a_static_member_that_leaves_for_now_is_taken_over_without_a_rebalance() -> None:
    shard, log = new_shard(), Log()
    a = join(shard, log, "a-1")
    b = Client("g", ("t",))
    heartbeat(shard, log, b, TOPICS, 0)
    a = beat(shard, log, a, "a-1")  # revokes what b's join took
    heartbeat(shard, log, b, TOPICS, 0)
    group = shard.groups.get("g")
    assert group is not None
    held, epoch = a.assignment, group.epoch
    assert held and held.isdisjoint(b.held) and len(held) == 2
    # a's process stops: it leaves for now, keeping its partitions.
    left = beat(shard, log, a, "a-1", epoch=LEAVE_STATIC_EPOCH)
    assert left.error is Errors.NONE and left.member_epoch == LEAVE_STATIC_EPOCH
    member = group.member(a.member_id)
    assert member is not None and member.member_epoch == LEAVE_STATIC_EPOCH
    assert member.assigned == held and group.epoch == epoch
    heartbeat(shard, log, b, TOPICS, 0)
    assert b.held.isdisjoint(held)  # nobody else is given them meanwhile
    # Its next process joins with the same instance id and a new member id.
    again = join(shard, log, "a-1")
    assert again.error is Errors.NONE and again.member_id != a.member_id
    assert again.assignment == held and again.member_epoch == epoch
    assert group.epoch == epoch  # no rebalance
    assert group.member(a.member_id) is None
    owners_disjoint(shard.groups)
    # The replaced member is gone; the log rebuilds the same groups.
    assert beat(shard, log, a, "a-1").error is Errors.UNKNOWN_MEMBER_ID
    assert dump(rebuilt(log.records)) == dump(shard.groups)
    assert dump(rebuilt(compacted(log.records))) == dump(shard.groups)


def test_an_instance_id_held_by_a_member_that_has_not_left_is_refused() -> None:
    shard, log = new_shard(), Log()
    a = join(shard, log, "a-1")
    other = join(shard, log, "a-1")
    assert other.error is Errors.UNRELEASED_INSTANCE_ID
    assert "has not left" in other.message
    group = shard.groups.get("g")
    assert group is not None and group.member_count() == 1
    # The holder itself may rejoin at epoch 0 with its own member id.
    assert join(shard, log, "a-1", member_id=a.member_id).error is Errors.NONE


def test_a_member_speaking_for_another_instance_is_fenced() -> None:
    shard, log = new_shard(), Log()
    a = join(shard, log, "a-1")
    b = join(shard, log, "b-1")
    refused = shard.consumer_group_heartbeat(
        HeartbeatRequest("g", b.member_id, b.member_epoch, instance_id="a-1"), TOPICS, 0
    )
    assert refused.response.error is Errors.FENCED_INSTANCE_ID and refused.records == ()
    unknown = shard.consumer_group_heartbeat(
        HeartbeatRequest("g", a.member_id, a.member_epoch, instance_id="c-1"), TOPICS, 0
    )
    assert unknown.response.error is Errors.UNKNOWN_MEMBER_ID and unknown.records == ()
    no_instance = shard.consumer_group_heartbeat(
        HeartbeatRequest("g", a.member_id, LEAVE_STATIC_EPOCH), TOPICS, 0
    )
    assert no_instance.response.error is Errors.INVALID_REQUEST
    assert "instance_id" in no_instance.response.message


def test_a_static_member_whose_session_ends_is_removed_and_its_partitions_move() -> None:
    shard, log = new_shard(), Log()
    a = join(shard, log, "a-1", now_ms=0)
    b = Client("g", ("t",))
    heartbeat(shard, log, b, TOPICS, 0)
    a = beat(shard, log, a, "a-1")
    beat(shard, log, a, "a-1", epoch=LEAVE_STATIC_EPOCH)
    session = shard.config.session_timeout_ms
    # b keeps heartbeating; a's session (from its last heartbeat) ends.
    for now in range(1_000, session + 1_000, 1_000):
        heartbeat(shard, log, b, TOPICS, now)
    log.apply(shard, shard.tick(session + 1))
    group = shard.groups.get("g")
    assert group is not None and group.member(a.member_id) is None
    heartbeat(shard, log, b, TOPICS, session + 2)
    assert len(b.held) == 4

"""The group coordinator's decisions, one rule at a time (KIP-848)."""

from __future__ import annotations

import pytest

from broker.errors import Errors
from broker.group.api import (
    CommitPartition,
    HeartbeatRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
)
from broker.group.state import GroupState
from broker.group.types import MemberState
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

T = "id-t"


def parts(*numbers: int) -> frozenset[tuple[str, int]]:
    return frozenset((T, n) for n in numbers)


def test_a_first_member_gets_every_partition() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 4})
    a = Client("g", ("t",))
    response = heartbeat(shard, log, a, topics, 0)
    assert response.error is Errors.NONE and response.member_id
    assert response.member_epoch == 1 and a.held == parts(0, 1, 2, 3)
    group = shard.groups.get("g")
    assert group is not None and group.state() is GroupState.STABLE
    assert response.heartbeat_interval_ms == shard.config.heartbeat_interval_ms


def test_a_partition_moves_only_after_its_owner_revoked_it() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 4})
    a = Client("g", ("t",), revoke_at_once=False)
    b = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    heartbeat(shard, log, b, topics, 0)
    # b joined: group epoch 2, but a still holds what b's target names.
    assert b.epoch == 2 and b.held == frozenset()
    group = shard.groups.get("g")
    assert group is not None and group.member(b.member_id).state is (  # type: ignore[union-attr]
        MemberState.UNRELEASED_PARTITIONS
    )
    heartbeat(shard, log, a, topics, 0)  # told to give two up; still holds them
    member_a = group.member(a.member_id)
    assert member_a is not None and member_a.state is MemberState.UNREVOKED_PARTITIONS
    assert a.epoch == 1 and len(a.to_revoke) == 2
    heartbeat(shard, log, b, topics, 0)
    assert b.held == frozenset()  # still not released
    heartbeat(shard, log, a, topics, 0)  # revoked now
    assert a.epoch == 2 and len(a.held) == 2
    heartbeat(shard, log, b, topics, 0)
    assert len(b.held) == 2 and a.held.isdisjoint(b.held)
    assert group.state() is GroupState.STABLE
    owners_disjoint(shard.groups)


def test_a_member_that_says_nothing_of_its_partitions_keeps_them_pending() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 2})
    a, b = Client("g", ("t",)), Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    heartbeat(shard, log, b, topics, 0)
    request = HeartbeatRequest("g", a.member_id, a.epoch, owned=None)
    for _ in range(2):
        result = shard.consumer_group_heartbeat(request, topics, 0)
        log.apply(shard, result)
    group = shard.groups.get("g")
    assert group is not None
    member = group.member(a.member_id)
    assert member is not None and member.state is MemberState.UNREVOKED_PARTITIONS


@pytest.mark.parametrize("delta", [1, 5])
def test_an_epoch_ahead_is_fenced(delta: int) -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 2})
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    result = shard.consumer_group_heartbeat(
        HeartbeatRequest("g", a.member_id, a.epoch + delta, owned=a.held), topics, 0
    )
    assert result.response.error is Errors.FENCED_MEMBER_EPOCH and result.records == ()
    assert "rejoin" in result.response.message


def test_the_previous_epoch_is_taken_when_the_answer_was_lost() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 4})
    a, b = Client("g", ("t",)), Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    heartbeat(shard, log, b, topics, 0)
    heartbeat(shard, log, a, topics, 0)  # a is told to revoke two
    heartbeat(shard, log, a, topics, 0)  # it has: epoch 2 with 2 partitions
    assert a.epoch == 2
    # The answer was lost: a heartbeats again at epoch 1 owning its 2.
    lost = HeartbeatRequest("g", a.member_id, 1, owned=a.held)
    assert shard.consumer_group_heartbeat(lost, topics, 0).response.error is Errors.NONE
    # Owning more than it is assigned at the old epoch is a zombie.
    zombie = HeartbeatRequest("g", a.member_id, 1, owned=parts(0, 1, 2, 3))
    assert (
        shard.consumer_group_heartbeat(zombie, topics, 0).response.error
        is Errors.FENCED_MEMBER_EPOCH
    )


def test_unknown_members_and_groups() -> None:
    shard, topics = new_shard(), MapTopics({"t": 1})
    for request in (
        HeartbeatRequest("g", "nobody", 3, owned=frozenset()),
        HeartbeatRequest("g", "nobody", -1),
    ):
        response = shard.consumer_group_heartbeat(request, topics, 0).response
        assert response.error is Errors.UNKNOWN_MEMBER_ID and "nobody" in response.message


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (HeartbeatRequest("", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("t",)),
         Errors.INVALID_REQUEST, "group_id"),
        (HeartbeatRequest("g", "m", -3), Errors.INVALID_REQUEST, "member_epoch -3"),
        (HeartbeatRequest("g", "", 4), Errors.INVALID_REQUEST, "member_id"),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1), Errors.INVALID_REQUEST,
         "subscribed_topic_names"),
        (HeartbeatRequest("g", "m", 0, subscribed_topic_names=("t",)), Errors.INVALID_REQUEST,
         "rebalance_timeout_ms"),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("t",),
                          owned=parts(0)), Errors.INVALID_REQUEST, "owned"),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_regex="(t"),
         Errors.INVALID_REQUEST, "regular expression"),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("t",),
                          server_assignor="sticky"), Errors.UNSUPPORTED_ASSIGNOR, "sticky"),
    ],
)  # fmt: skip
def test_bad_heartbeats_are_refused_and_write_nothing(
    request_: HeartbeatRequest, code: Errors, words: str
) -> None:
    shard = new_shard()
    result = shard.consumer_group_heartbeat(request_, MapTopics({"t": 1}), 0)
    assert result.response.error is code and words in result.response.message
    assert result.records == ()


def test_leaving_frees_the_partitions_and_bumps_the_epoch() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 2})
    a, b = Client("g", ("t",)), Client("g", ("t",))
    for client in (a, b, a, b):
        heartbeat(shard, log, client, topics, 0)
    group = shard.groups.get("g")
    assert group is not None
    epoch = group.epoch
    result = shard.consumer_group_heartbeat(HeartbeatRequest("g", a.member_id, -1), topics, 0)
    log.apply(shard, result)
    assert result.response.member_epoch == -1
    assert group.member(a.member_id) is None and group.epoch == epoch + 1
    heartbeat(shard, log, b, topics, 0)
    assert b.held == parts(0, 1)
    owners_disjoint(shard.groups)


def test_a_session_that_ends_removes_its_member() -> None:
    shard, log, topics = new_shard(session_timeout_ms=1000), Log(), MapTopics({"t": 2})
    a, b = Client("g", ("t",)), Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    heartbeat(shard, log, b, topics, 500)
    tick = shard.tick(999)
    assert tick.records == () and tick.response == []
    tick = shard.tick(1000)
    assert tick.response == [("g", a.member_id, "session timed out")]
    log.apply(shard, tick)
    group = shard.groups.get("g")
    assert group is not None and group.member(a.member_id) is None
    heartbeat(shard, log, a, topics, 1001)
    assert a.fenced  # it must rejoin


def test_a_member_that_does_not_revoke_in_time_is_removed() -> None:
    shard, log, topics = new_shard(session_timeout_ms=10**9), Log(), MapTopics({"t": 2})
    a = Client("g", ("t",), revoke_at_once=False, rebalance_timeout_ms=100)
    b = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    heartbeat(shard, log, b, topics, 0)
    request = HeartbeatRequest("g", a.member_id, a.epoch, owned=a.held)
    log.apply(shard, shard.consumer_group_heartbeat(request, topics, 10))  # told to revoke
    log.apply(shard, shard.consumer_group_heartbeat(request, topics, 50))  # still holds it
    assert shard.tick(109).response == []
    tick = shard.tick(110)
    assert [(g, m) for g, m, _ in tick.response] == [("g", a.member_id)]
    assert "rebalance timeout" in tick.response[0][2]


def test_commits_of_members_need_their_current_epoch() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 2})
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    commit = (CommitPartition("t", 0, 10, leader_epoch=3, metadata="m"),)
    stale = shard.commit_offsets(OffsetCommitRequest("g", a.member_id, a.epoch - 1, commit), 5)
    assert stale.response.error is Errors.STALE_MEMBER_EPOCH and stale.records == ()
    unknown = shard.commit_offsets(OffsetCommitRequest("g", "x", a.epoch, commit), 5)
    assert unknown.response.error is Errors.UNKNOWN_MEMBER_ID
    outside = shard.commit_offsets(OffsetCommitRequest("g", "", -1, commit), 5)
    assert outside.response.error is Errors.UNKNOWN_MEMBER_ID
    assert "1 members" in outside.response.message
    ok = shard.commit_offsets(OffsetCommitRequest("g", a.member_id, a.epoch, commit), 5)
    assert ok.response.error is Errors.NONE and len(ok.records) == 1
    log.apply(shard, ok)
    fetched = shard.fetch_offsets(OffsetFetchRequest("g", (("t", 0), ("t", 1))))
    assert [(o.offset, o.leader_epoch, o.metadata) for o in fetched.offsets] == [
        (10, 3, "m"),
        (-1, -1, ""),
    ]


def test_commits_outside_membership_go_to_a_group_without_members() -> None:
    shard, log = new_shard(), Log()
    result = shard.commit_offsets(
        OffsetCommitRequest("simple", "", -1, (CommitPartition("t", 0, 7),)), 1
    )
    log.apply(shard, result)
    assert result.response.partitions[0].error is Errors.NONE
    group = shard.groups.get("simple")
    assert group is not None and group.state() is GroupState.EMPTY
    assert shard.fetch_offsets(OffsetFetchRequest("simple")).offsets[0].offset == 7


def test_bad_commit_partitions_are_refused_one_by_one() -> None:
    shard = new_shard(offset_metadata_max_bytes=4)
    result = shard.commit_offsets(
        OffsetCommitRequest(
            "g",
            "",
            -1,
            (
                CommitPartition("t", 0, 1),
                CommitPartition("t", 0, 2),
                CommitPartition("t", 1, -5),
                CommitPartition("t", -1, 1),
                CommitPartition("t", 2, 1, metadata="toolong"),
                CommitPartition("", 3, 1),
                CommitPartition("t", 4, 1, leader_epoch=-2),
            ),
        ),
        0,
    )
    codes = [(p.error, p.message) for p in result.response.partitions]
    assert codes[0] == (Errors.NONE, "")
    assert codes[1][0] is Errors.INVALID_REQUEST and "twice" in codes[1][1]
    assert codes[2][0] is Errors.INVALID_REQUEST and "-5" in codes[2][1]
    assert codes[3][0] is Errors.INVALID_REQUEST and "negative" in codes[3][1]
    assert codes[4][0] is Errors.OFFSET_METADATA_TOO_LARGE and "7 bytes" in codes[4][1]
    assert codes[5][0] is Errors.INVALID_REQUEST and "topic" in codes[5][1]
    assert codes[6][0] is Errors.INVALID_REQUEST and "-2" in codes[6][1]
    assert len(result.records) == 1


def test_empty_group_id_commit() -> None:
    result = new_shard().commit_offsets(OffsetCommitRequest("", "", -1, ()), 0)
    assert result.response.error is Errors.INVALID_GROUP_ID


def test_delete_groups_only_when_empty_and_offset_delete_not_of_subscribed_topics() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 1, "u": 1})
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    for topic in ("t", "u"):
        log.apply(
            shard,
            shard.commit_offsets(
                OffsetCommitRequest("g", a.member_id, a.epoch, (CommitPartition(topic, 0, 1),)), 0
            ),
        )
    deleted = shard.delete_offsets("g", [("t", 0), ("u", 0)])
    assert [p.error for p in deleted.response.partitions] == [
        Errors.GROUP_SUBSCRIBED_TO_TOPIC,
        Errors.NONE,
    ]
    log.apply(shard, deleted)
    refused = shard.delete_groups(["g", "nope"])
    assert [r.error for r in refused.response] == [
        Errors.NON_EMPTY_GROUP,
        Errors.GROUP_ID_NOT_FOUND,
    ]
    assert refused.records == ()
    log.apply(
        shard, shard.consumer_group_heartbeat(HeartbeatRequest("g", a.member_id, -1), topics, 0)
    )
    result = shard.delete_groups(["g"])
    assert result.response[0].error is Errors.NONE
    log.apply(shard, result)
    assert shard.groups.get("g") is None
    assert rebuilt(log.records).get("g") is None


def test_offsets_expire_only_off_subscription_and_an_empty_group_goes_with_them() -> None:
    day = 24 * 3600 * 1000
    shard, log = new_shard(offsets_retention_ms=day, offsets_retention_check_interval_ms=0), Log()
    topics = MapTopics({"t": 1, "u": 1})
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    for topic in ("t", "u"):
        log.apply(
            shard,
            shard.commit_offsets(
                OffsetCommitRequest("g", a.member_id, a.epoch, (CommitPartition(topic, 0, 1),)), 0
            ),
        )
    shard._sessions.clear()  # keep the member: this test is about offsets
    expired = shard.tick(day)
    assert [r.key for r in expired.records] == [
        r.key for r in expired.records if getattr(r.key, "topic", None) == "u"
    ]
    assert len(expired.records) == 1
    log.apply(shard, expired)
    log.apply(
        shard, shard.consumer_group_heartbeat(HeartbeatRequest("g", a.member_id, -1), topics, 0)
    )
    assert shard.tick(day - 1).records == ()  # "t" was committed at 0: expires at `day`
    gone = shard.tick(day)
    log.apply(shard, gone)
    assert shard.groups.get("g") is None and rebuilt(log.records).get("g") is None


def test_list_and_describe() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 3})
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    log.apply(
        shard,
        shard.commit_offsets(OffsetCommitRequest("h", "", -1, (CommitPartition("t", 0, 1),)), 0),
    )
    assert [(g.group_id, g.state) for g in shard.list_groups()] == [
        ("g", "Stable"),
        ("h", "Empty"),
    ]
    assert [g.group_id for g in shard.list_groups(["empty"])] == ["h"]
    description = shard.describe_group("g")
    assert description.state == "Stable" and description.assignor == "uniform"
    assert description.members[0].assignment == parts(0, 1, 2)
    assert shard.describe_group("x").error is Errors.GROUP_ID_NOT_FOUND


def test_a_new_partition_bumps_the_group_epoch_and_is_assigned() -> None:
    shard, log, topics = new_shard(), Log(), MapTopics({"t": 1})
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    topics.set("t", 3)
    heartbeat(shard, log, a, topics, 0)
    assert a.epoch == 2 and a.held == parts(0, 1, 2)


def test_pattern_subscriptions_skip_internal_topics() -> None:
    shard, log = new_shard(), Log()
    topics = MapTopics({"orders": 1, "other": 1, "__consumer_offsets": 1})
    result = shard.consumer_group_heartbeat(
        HeartbeatRequest("g", "", 0, rebalance_timeout_ms=1, subscribed_topic_regex="o.*|__.*"),
        topics,
        0,
    )
    assert result.response.assignment == frozenset({("id-orders", 0), ("id-other", 0)})
    log.apply(shard, result)


def test_replaying_the_log_or_its_compaction_builds_the_same_groups() -> None:
    shard, log, topics = new_shard(session_timeout_ms=100), Log(), MapTopics({"t": 6})
    clients = [Client("g", ("t",)) for _ in range(3)]
    for now in range(0, 60, 10):
        for client in clients:
            heartbeat(shard, log, client, topics, now)
    log.apply(
        shard,
        shard.commit_offsets(
            OffsetCommitRequest(
                "g", clients[0].member_id, clients[0].epoch, (CommitPartition("t", 0, 4),)
            ),
            60,
        ),
    )
    log.apply(shard, shard.tick(1000))  # every session ended
    assert dump(rebuilt(log.records)) == dump(shard.groups)
    assert dump(rebuilt(compacted(log.records))) == dump(shard.groups)


def test_offsets_expiry_is_looked_for_once_per_check_interval() -> None:
    shard, log = new_shard(offsets_retention_ms=10, offsets_retention_check_interval_ms=100), Log()
    log.apply(
        shard,
        shard.commit_offsets(OffsetCommitRequest("g", "", -1, (CommitPartition("t", 0, 1),)), 0),
    )
    assert shard.tick(5).records == ()  # looked: not yet due
    assert shard.tick(50).records == ()  # due, but not looked for before 105
    assert shard.tick(104).records == ()
    expired = shard.tick(105)
    assert len(expired.records) == 1
    log.apply(shard, expired)
    assert shard.groups.get("g") is None  # a group of offsets alone goes with them

"""Transactional offset commits (KIP-98's TxnOffsetCommit, KIP-447's
RequireStable): pending by producer until the transaction's marker, the
newer record in the log wins at a COMMIT, an ABORT drops them
(Kafka's ``OffsetMetadataManager``)."""

from __future__ import annotations

import pytest

from broker.errors import Errors
from broker.group.api import (
    CommitPartition,
    HeartbeatRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    Result,
    TxnOffsetCommitRequest,
)
from broker.group.records import (
    NO_OFFSET,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    CoordinatorRecord,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
)
from broker.group.shard import GroupCoordinatorShard
from broker.group.state import GroupState
from tests.broker.group.harness import (
    Client,
    Log,
    MapTopics,
    TxnLog,
    compacted_txn,
    dump,
    heartbeat,
    new_shard,
    replayed,
)

P, Q = 4000, 4001


def txn(
    offset: int,
    *,
    group: str = "g",
    producer: int = P,
    epoch: int = 0,
    member: str = "",
    member_epoch: int = -1,
    partition: int = 0,
    metadata: str = "",
) -> TxnOffsetCommitRequest:
    return TxnOffsetCommitRequest(
        transactional_id=f"tx-{producer}",
        group_id=group,
        producer_id=producer,
        producer_epoch=epoch,
        member_id=member,
        member_epoch=member_epoch,
        partitions=(CommitPartition("t", partition, offset, metadata=metadata),),
    )


def plain(offset: int, group: str = "g", partition: int = 0) -> OffsetCommitRequest:
    return OffsetCommitRequest(group, "", -1, (CommitPartition("t", partition, offset),))


def committed(shard: GroupCoordinatorShard, group: str = "g", partition: int = 0) -> int:
    fetched = shard.fetch_offsets(OffsetFetchRequest(group, (("t", partition),)))
    assert fetched.error is Errors.NONE
    return fetched.offsets[0].offset


def commit_txn(
    shard: GroupCoordinatorShard, log: TxnLog, request: TxnOffsetCommitRequest, now: int = 0
) -> None:
    result = shard.txn_commit_offsets(request, now)
    assert result.response.error is Errors.NONE, result.response
    assert all(p.error is Errors.NONE for p in result.response.partitions)
    log.write(shard, result, request.producer_id, request.producer_epoch)


def test_the_records_are_a_plain_commits() -> None:
    shard = new_shard()
    request = txn(5, metadata="m")
    as_txn = shard.txn_commit_offsets(request, 7)
    as_plain = shard.commit_offsets(OffsetCommitRequest("g", "", -1, request.partitions), 7)
    assert as_txn == as_plain
    assert as_txn.records == (
        CoordinatorRecord(OffsetCommitKey("g", "t", 0), OffsetCommitValue(5, -1, "m", 7)),
    )
    assert shard.groups.get("g") is None  # decided, not replayed


def test_pending_offsets_are_invisible_until_the_commit_marker() -> None:
    shard, log = new_shard(), TxnLog()
    commit_txn(shard, log, txn(5))
    # The group exists (Kafka's simple group), with nothing committed yet.
    group = shard.groups.get("g")
    assert group is not None and group.state() is GroupState.EMPTY
    assert group.offsets == {}
    assert committed(shard) == -1
    assert shard.fetch_offsets(OffsetFetchRequest("g")).offsets == ()
    assert shard.groups.has_pending("g") and shard.groups.has_pending("g", ("t", 0))
    assert not shard.groups.has_pending("g", ("t", 1))
    assert shard.groups.producers() == [P]
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 5
    assert not shard.groups.has_pending("g") and shard.groups.producers() == []
    group = shard.groups.get("g")
    assert group is not None and group.record_offsets == {("t", 0): 0}


def test_an_abort_drops_them_and_a_group_of_nothing_else_goes() -> None:
    shard, log = new_shard(), TxnLog()
    log.write(shard, shard.commit_offsets(plain(3, group="h"), 0))
    commit_txn(shard, log, txn(5))
    commit_txn(shard, log, txn(6, group="h"))
    log.marker(shard, P, 1, commit=False)
    assert shard.groups.get("g") is None
    assert committed(shard, "h") == 3
    assert shard.groups.producers() == []
    assert dump(replayed(log.entries)) == dump(shard.groups)


def test_a_marker_of_a_producer_with_nothing_pending_changes_nothing() -> None:
    shard, log = new_shard(), TxnLog()
    log.write(shard, shard.commit_offsets(plain(3), 0))
    before = dump(shard.groups)
    log.marker(shard, P, 1, commit=True)
    log.marker(shard, Q, 1, commit=False)
    assert dump(shard.groups) == before


def test_a_plain_commit_written_after_the_transactional_one_wins() -> None:
    shard, log = new_shard(), TxnLog()
    commit_txn(shard, log, txn(5))  # offset 0
    log.write(shard, shard.commit_offsets(plain(9), 0))  # offset 1
    assert committed(shard) == 9
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 9  # the transactional record is older in the log
    group = shard.groups.get("g")
    assert group is not None and group.record_offsets == {("t", 0): 1}
    assert not shard.groups.has_pending("g")


def test_a_transactional_commit_written_after_a_plain_one_wins_when_committed() -> None:
    shard, log = new_shard(), TxnLog()
    log.write(shard, shard.commit_offsets(plain(9), 0))  # offset 0
    commit_txn(shard, log, txn(5))  # offset 1: a rewind inside the transaction
    assert committed(shard) == 9
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 5


def test_a_later_record_of_the_same_transaction_replaces_the_earlier() -> None:
    shard, log = new_shard(), TxnLog()
    commit_txn(shard, log, txn(5))
    commit_txn(shard, log, txn(6))
    assert shard.groups.pending_offsets("g")[P][("t", 0)].value.offset == 6
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 6


def test_two_producers_end_apart() -> None:
    shard, log = new_shard(), TxnLog()
    commit_txn(shard, log, txn(5, producer=P))
    commit_txn(shard, log, txn(7, producer=Q, partition=1))
    commit_txn(shard, log, txn(8, producer=Q))
    assert sorted(shard.groups.pending_offsets("g")) == [P, Q]
    log.marker(shard, Q, 1, commit=True)
    assert (committed(shard, partition=0), committed(shard, partition=1)) == (8, 7)
    assert shard.groups.has_pending("g", ("t", 0))  # P's is still open
    assert not shard.groups.has_pending("g", ("t", 1))
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 8  # P's record (offset 0) is older than Q's (offset 2)
    assert dump(replayed(log.entries)) == dump(shard.groups)


def test_require_stable_answers_unstable_offset_commit() -> None:
    shard, log = new_shard(), TxnLog()
    log.write(shard, shard.commit_offsets(plain(3), 0))
    log.write(shard, shard.commit_offsets(plain(4, partition=1), 0))
    commit_txn(shard, log, txn(5))
    wanted = (("t", 0), ("t", 1), ("t", 2))
    stable = shard.fetch_offsets(OffsetFetchRequest("g", wanted, require_stable=True))
    assert [(o.offset, o.error) for o in stable.offsets] == [
        (-1, Errors.UNSTABLE_OFFSET_COMMIT),
        (4, Errors.NONE),
        (-1, Errors.NONE),
    ]
    every = shard.fetch_offsets(OffsetFetchRequest("g", require_stable=True))
    assert [(o.partition, o.error) for o in every.offsets] == [
        (0, Errors.UNSTABLE_OFFSET_COMMIT),
        (1, Errors.NONE),
    ]
    # Without require_stable the committed offset is shown.
    loose = shard.fetch_offsets(OffsetFetchRequest("g", wanted))
    assert [(o.offset, o.error) for o in loose.offsets] == [
        (3, Errors.NONE),
        (4, Errors.NONE),
        (-1, Errors.NONE),
    ]
    log.marker(shard, P, 1, commit=True)
    stable = shard.fetch_offsets(OffsetFetchRequest("g", wanted, require_stable=True))
    assert [(o.offset, o.error) for o in stable.offsets] == [
        (5, Errors.NONE),
        (4, Errors.NONE),
        (-1, Errors.NONE),
    ]


def test_commits_outside_membership_whatever_the_members_and_members_at_their_epoch() -> None:
    shard, log, topics, txn_log = new_shard(), Log(), MapTopics({"t": 2}), TxnLog()
    a = Client("g", ("t",))
    heartbeat(shard, log, a, topics, 0)
    for request, code in [
        # A producer sending no group metadata: accepted though "g" has a member
        # (Kafka's validateOffsetCommit for a transactional commit).
        (txn(1), Errors.NONE),
        (txn(1, member=a.member_id, member_epoch=a.epoch), Errors.NONE),
        (txn(1, member=a.member_id, member_epoch=a.epoch - 1), Errors.STALE_MEMBER_EPOCH),
        (txn(1, member=a.member_id, member_epoch=a.epoch + 1), Errors.STALE_MEMBER_EPOCH),
        (txn(1, member="x", member_epoch=a.epoch), Errors.UNKNOWN_MEMBER_ID),
        (txn(1, member="", member_epoch=a.epoch), Errors.UNKNOWN_MEMBER_ID),
        # A member id with epoch -1 is a member's commit, as for OffsetCommit.
        (txn(1, member="x", member_epoch=-1), Errors.UNKNOWN_MEMBER_ID),
        # A group that does not exist: only outside membership.
        (txn(1, group="new", member="x", member_epoch=3), Errors.UNKNOWN_MEMBER_ID),
        (txn(1, group="new"), Errors.NONE),
    ]:
        result = shard.txn_commit_offsets(request, 0)
        assert result.response.error is code, (request, result.response)
        assert (result.records == ()) is (code is not Errors.NONE)
        if code is Errors.NONE:
            txn_log.write(shard, result, request.producer_id, request.producer_epoch)
    assert sorted(shard.groups.pending_offsets("new")) == [P]


def test_whole_request_refusals() -> None:
    shard = new_shard()
    good = txn(1)
    for request, code, words in [
        (TxnOffsetCommitRequest("tx", "", P, 0, "", -1, ()), Errors.INVALID_GROUP_ID, "group"),
        (TxnOffsetCommitRequest("", "g", P, 0, "", -1, ()), Errors.INVALID_REQUEST, "transact"),
        (
            TxnOffsetCommitRequest("tx", "g", -1, 0, "", -1, good.partitions),
            Errors.INVALID_REQUEST,
            "producer id -1",
        ),
        (
            TxnOffsetCommitRequest("tx", "g", P, -1, "", -1, good.partitions),
            Errors.INVALID_REQUEST,
            "epoch -1",
        ),
    ]:
        result = shard.txn_commit_offsets(request, 0)
        assert result.response.error is code and words in result.response.message
        assert result.records == () and result.response.partitions == ()


def test_bad_partitions_are_refused_one_by_one() -> None:
    shard = new_shard(offset_metadata_max_bytes=4)
    request = TxnOffsetCommitRequest(
        "tx",
        "g",
        P,
        0,
        "",
        -1,
        (
            CommitPartition("t", 0, 1, metadata="ok"),
            CommitPartition("t", 1, 1, metadata="toolong"),
            CommitPartition("t", 0, 2),
            CommitPartition("t", 2, -1),
        ),
    )
    result = shard.txn_commit_offsets(request, 0)
    codes = [(p.error, p.message) for p in result.response.partitions]
    assert codes[0] == (Errors.NONE, "")
    assert codes[1][0] is Errors.OFFSET_METADATA_TOO_LARGE and "7 bytes" in codes[1][1]
    assert codes[2][0] is Errors.INVALID_REQUEST and "twice" in codes[2][1]
    assert codes[3][0] is Errors.INVALID_REQUEST and "-1" in codes[3][1]
    assert [r.key for r in result.records] == [OffsetCommitKey("g", "t", 0)]


def test_deleting_the_group_drops_its_pending_offsets() -> None:
    shard, log = new_shard(), TxnLog()
    log.write(shard, shard.commit_offsets(plain(3), 0))
    commit_txn(shard, log, txn(5))
    commit_txn(shard, log, txn(6, partition=1))  # pending only
    commit_txn(shard, log, txn(7, group="h", producer=P))
    deleted = shard.delete_groups(["g"])
    assert [r.error for r in deleted.response] == [Errors.NONE]
    assert [r.key for r in deleted.records] == [
        OffsetCommitKey("g", "t", 0),
        OffsetCommitKey("g", "t", 1),
    ]
    log.write(shard, deleted)
    assert shard.groups.get("g") is None
    assert list(shard.groups.pending_offsets("h")) == [P]  # another group's stay
    log.marker(shard, P, 1, commit=True)
    assert shard.groups.get("g") is None  # nothing came back
    assert committed(shard, "h") == 7
    assert dump(replayed(log.entries)) == dump(shard.groups)


def test_a_plain_tombstone_drops_every_producers_pending_offset_of_its_partition() -> None:
    shard, log = new_shard(), TxnLog()
    commit_txn(shard, log, txn(5, producer=P))
    commit_txn(shard, log, txn(6, producer=Q))
    commit_txn(shard, log, txn(7, producer=Q, partition=1))
    log.write(shard, shard.delete_offsets("g", [("t", 0)]))
    tombstone = CoordinatorRecord(OffsetCommitKey("g", "t", 0), None)
    # OffsetDelete writes tombstones of committed offsets only; write one as
    # DeleteGroups does for a pending partition.
    log.write(shard, Result((tombstone,), None))
    assert shard.groups.pending_offsets("g") == {
        Q: {("t", 1): shard.groups.pending_offsets("g")[Q][("t", 1)]}
    }
    log.marker(shard, P, 1, commit=True)
    log.marker(shard, Q, 1, commit=True)
    assert (committed(shard, partition=0), committed(shard, partition=1)) == (-1, 7)
    assert dump(replayed(log.entries)) == dump(shard.groups)


def test_expiry_waits_for_pending_offsets() -> None:
    day = 24 * 3600 * 1000
    shard = new_shard(offsets_retention_ms=day, offsets_retention_check_interval_ms=0)
    log = TxnLog()
    log.write(shard, shard.commit_offsets(plain(3), 0))
    log.write(shard, shard.commit_offsets(plain(4, partition=1), 0))
    commit_txn(shard, log, txn(5))
    expired = shard.tick(day)
    # Partition 1 expires; partition 0 has a pending offset, and the group
    # stays while it has one.
    assert [r.key for r in expired.records] == [OffsetCommitKey("g", "t", 1)]
    log.write(shard, expired)
    log.marker(shard, P, 1, commit=False)
    gone = shard.tick(day)
    assert [r.key for r in gone.records] == [OffsetCommitKey("g", "t", 0)]
    log.write(shard, gone)
    assert shard.groups.get("g") is None


def test_a_group_of_pending_offsets_alone_is_not_deleted_by_expiry() -> None:
    day = 24 * 3600 * 1000
    shard = new_shard(offsets_retention_ms=day, offsets_retention_check_interval_ms=0)
    log = TxnLog()
    log.write(shard, shard.commit_offsets(plain(3), 0))
    commit_txn(shard, log, txn(5, partition=1))
    expired = shard.tick(day)
    # The committed offset expires, but no group tombstones: a transaction
    # is open in the group.
    assert [r.key for r in expired.records] == [OffsetCommitKey("g", "t", 0)]
    log.write(shard, expired)
    assert shard.groups.get("g") is not None
    log.marker(shard, P, 1, commit=True)
    assert committed(shard, partition=1) == 5


def test_the_group_tombstones_of_expiry_are_held_back_by_a_pending_offset() -> None:
    # A group with metadata (a member came and went) and its only committed
    # offset expired: its keys are tombstoned only once no transaction is open.
    day = 24 * 3600 * 1000
    shard = new_shard(offsets_retention_ms=day, offsets_retention_check_interval_ms=0)
    log, member_log, topics = TxnLog(), Log(), MapTopics({"u": 1})
    a = Client("g", ("u",))
    heartbeat(shard, member_log, a, topics, 0)
    leave = HeartbeatRequest("g", a.member_id, -1)
    member_log.apply(shard, shard.consumer_group_heartbeat(leave, topics, 0))
    log.write(shard, shard.commit_offsets(plain(3), 0))
    commit_txn(shard, log, txn(5, partition=1))
    held = shard.tick(day)
    assert not any(isinstance(r.key, GroupMetadataKey) for r in held.records)
    log.write(shard, held)
    log.marker(shard, P, 1, commit=False)
    freed = shard.tick(day)
    assert any(isinstance(r.key, GroupMetadataKey) for r in freed.records)


# -- replay contexts no log holds -------------------------------------------------------

OFFSET = CoordinatorRecord(OffsetCommitKey("g", "t", 0), OffsetCommitValue(5, -1, "", 0))


@pytest.mark.parametrize(
    ("record", "producer_id", "producer_epoch", "offset", "words"),
    [
        (CoordinatorRecord(OffsetCommitKey("g", "t", 0), None), P, 0, 10, "tombstone"),
        (
            CoordinatorRecord(GroupMetadataKey("g"), GroupMetadataValue(1)),
            P,
            0,
            10,
            "only OffsetCommit",
        ),
        (OFFSET, P, 0, NO_OFFSET, "without its offset"),
        (OFFSET, P, NO_PRODUCER_EPOCH, 10, "both or neither"),
        (OFFSET, NO_PRODUCER_ID, 0, 10, "both or neither"),
        (OFFSET, P, 0, 2, "log order"),
        (OFFSET, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, 2, "log order"),
        (OFFSET, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_OFFSET, "pending"),
    ],
)
def test_a_replay_no_log_holds_raises_and_changes_nothing(
    record: CoordinatorRecord, producer_id: int, producer_epoch: int, offset: int, words: str
) -> None:
    shard, log = new_shard(), TxnLog()
    log.write(shard, shard.commit_offsets(plain(3, partition=1), 0))
    log.write(shard, shard.commit_offsets(plain(3, partition=2), 0))
    commit_txn(shard, log, txn(5))  # offset 2
    before = dump(shard.groups)
    with pytest.raises(ValueError, match=words):
        shard.replay(record, producer_id, producer_epoch, offset)
    assert dump(shard.groups) == before
    # The log goes on from where it was: the failed replay took no offset.
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 5


def test_a_plain_commit_without_its_offset_is_fine_with_nothing_pending() -> None:
    shard, log = new_shard(), TxnLog()
    shard.replay(OFFSET)  # offset unknown: older than any transactional record
    commit_txn(shard, log, txn(7))
    other = CoordinatorRecord(OffsetCommitKey("g", "t", 1), OffsetCommitValue(1, -1, "", 0))
    shard.replay(other)  # another partition: no comparison to make
    log.marker(shard, P, 1, commit=True)
    assert committed(shard) == 7


def test_a_compacted_log_builds_the_same_groups() -> None:
    shard, log = new_shard(), TxnLog()
    commit_txn(shard, log, txn(5, producer=P))
    log.write(shard, shard.commit_offsets(plain(9), 0))
    commit_txn(shard, log, txn(6, producer=Q))
    log.marker(shard, P, 1, commit=True)
    log.marker(shard, Q, 1, commit=False)
    assert committed(shard) == 9
    kept = compacted_txn(log.entries)
    assert len(kept) == 3  # the plain commit and the two markers
    assert dump(replayed(kept)) == dump(shard.groups)

"""The consumer's group calls without brokers: auto-commit at the start of
poll commits what earlier polls returned, never the records the same poll
returns; close commits; assign and subscribe exclude each other; subscribe
needs a group id; a commit refused for ownership raises CommitFailedError
(to commit_async's callback too); on_commit hears only what was stored;
committed reads offsets and epochs."""

from __future__ import annotations

import asyncio

import pytest

from broker.client.consumer import FetchAnswer, LeaderInfo
from broker.client.membership import AutoCommitTimer
from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.group import (
    CommitError,
    CommitFailedError,
    IllegalStateError,
    OffsetAndEpoch,
)
from kqproto import groups_pb2
from tests.broker.client.test_membership import records
from tests.broker.grpc_client.test_coordinator import pb

TP = TopicPartition("t", 0)


def offline(subscribe: bool) -> tuple[Consumer, list[dict[TopicPartition, OffsetAndEpoch]]]:
    """A consumer whose network calls are replaced: records are fed to its
    core directly, commits are recorded."""
    consumer = Consumer(["127.0.0.1:1"], group_id="g", auto_commit_interval_ms=1)
    group = consumer._group
    assert group is not None
    commits: list[dict[TopicPartition, OffsetAndEpoch]] = []

    async def commit(offsets: dict[TopicPartition, OffsetAndEpoch]) -> None:
        commits.append(dict(offsets))

    async def nothing() -> None:
        return None

    group.commit = commit  # type: ignore[assignment,method-assign]
    group.start = lambda: None  # type: ignore[method-assign]
    consumer._update_positions = nothing  # type: ignore[method-assign]
    consumer._send_fetches = lambda: None  # type: ignore[method-assign]
    if subscribe:
        consumer.subscribe(["t"])
        consumer.core.assign([TP])  # as an assignment would
    else:
        consumer.assign([TP])
    consumer.core.seek(TP, 0)
    consumer.core.fetch_requests({TP: LeaderInfo(1, 4)})
    consumer.core.on_fetch_answer(TP, FetchAnswer(0, high_watermark=10, records=records(range(10))))
    # Due at every poll: what is committed is the point.
    consumer._auto_commit = AutoCommitTimer(1, now_ms=-10)
    return consumer, commits


@pytest.mark.parametrize("subscribe", [True, False], ids=["subscribed", "assigned"])
def test_auto_commit_takes_the_positions_before_the_poll_returns_records(subscribe: bool) -> None:
    async def body() -> None:
        consumer, commits = offline(subscribe)
        first = await consumer.poll(100, max_records=5)
        assert [r.offset for r in first] == [0, 1, 2, 3, 4]
        assert commits == [{TP: (0, -1)}]  # nothing processed yet
        consumer._auto_commit = AutoCommitTimer(1, now_ms=-10)
        second = await consumer.poll(100, max_records=5)
        assert [r.offset for r in second] == [5, 6, 7, 8, 9]
        # The first poll's records are processed (the application polled
        # again); the second poll's are not: 5, not 10.
        assert commits[-1] == {TP: (5, 4)}
        if not subscribe:
            await consumer.close()
            assert commits[-1] == {TP: (10, 4)}  # close commits what was returned

    asyncio.run(body())


def test_subscribe_needs_a_group_id_and_excludes_assign() -> None:
    async def body() -> None:
        plain = Consumer(["127.0.0.1:1"])
        with pytest.raises(ValueError, match="group_id"):
            plain.subscribe(["t"])
        with pytest.raises(ValueError, match="group_id"):
            await plain.commit({TP: 1})
        grouped = Consumer(["127.0.0.1:1"], group_id="g")
        grouped.assign([TP])
        with pytest.raises(IllegalStateError, match="not both"):
            grouped.subscribe(["t"])
        other = Consumer(["127.0.0.1:1"], group_id="g")
        other.subscribe(pattern="t.*")
        assert other.subscription() == "t.*"
        with pytest.raises(IllegalStateError, match="not both"):
            other.assign([TP])
        with pytest.raises(ValueError, match="exactly one"):
            other.subscribe(["t"], pattern="t.*")
        for consumer in (plain, grouped, other):
            await consumer.close()

    asyncio.run(body())


def answering(consumer: Consumer, answer: object) -> list[object]:
    """The coordinator answers every call with ``answer``; requests kept."""
    group = consumer._group
    assert group is not None
    sent: list[object] = []

    async def call(what: str, method: object, timeout_ms: int, trace: object = None) -> object:
        class Stub:
            async def OffsetCommit(self, request: object, timeout: float) -> object:
                sent.append(request)
                return answer

            OffsetFetch = OffsetCommit

        return await method(Stub(), 1.0)  # type: ignore[operator]

    group.coordinator.call = call  # type: ignore[assignment,method-assign]
    return sent


def test_a_refused_commit_raises_commit_failed_and_reaches_the_async_callback() -> None:
    async def body() -> None:
        consumer = Consumer(["127.0.0.1:1"], group_id="g")
        refused = groups_pb2.OffsetCommitResponse(error=pb(Errors.STALE_MEMBER_EPOCH))
        sent = answering(consumer, refused)
        with pytest.raises(CommitFailedError, match="no longer owns") as stale:
            await consumer.commit({TP: 7})
        assert stale.value.definite  # refused before anything was written
        request = sent[-1]
        assert isinstance(request, groups_pb2.OffsetCommitRequest)
        # Outside membership: no member id, epoch -1.
        assert (request.member_id, request.member_epoch) == ("", -1)
        assert [(t.name, p.partition, p.offset, p.leader_epoch) for t in request.topics
                for p in t.partitions] == [("t", 0, 7, -1)]  # fmt: skip
        seen: list[tuple[object, BaseException | None]] = []
        task = consumer.commit_async({TP: (8, 3)}, lambda o, e: seen.append((o, e)))
        with pytest.raises(CommitFailedError):
            await task
        assert seen[0][0] == {TP: (8, 3)} and isinstance(seen[0][1], CommitFailedError)
        partly = groups_pb2.OffsetCommitResponse(
            topics=[
                groups_pb2.TopicResult(
                    name="t",
                    partitions=[groups_pb2.PartitionResult(
                        partition=0, error=pb(Errors.TOPIC_AUTHORIZATION_FAILED))],
                )
            ]
        )  # fmt: skip
        answering(consumer, partly)
        with pytest.raises(BrokerClientError, match="t-0") as raised:
            await consumer.commit({TP: 9})
        assert not isinstance(raised.value, CommitFailedError)
        assert isinstance(raised.value, CommitError) and raised.value.definite
        # One partition stored, the other refused: not a definite failure.
        two = {TP: 9, TopicPartition("t", 1): 4}
        mixed = groups_pb2.OffsetCommitResponse(
            topics=[
                groups_pb2.TopicResult(
                    name="t",
                    partitions=[
                        groups_pb2.PartitionResult(partition=0),
                        groups_pb2.PartitionResult(
                            partition=1, error=pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                        ),
                    ],
                )
            ]
        )
        answering(consumer, mixed)
        with pytest.raises(CommitError, match="t-1") as partial:
            await consumer.commit(two)
        assert not partial.value.definite
        # Appended, then the leadership moved before the HW passed it.
        answering(consumer, groups_pb2.OffsetCommitResponse(error=pb(Errors.NOT_COORDINATOR)))
        with pytest.raises(CommitError) as moved:
            await consumer.commit({TP: 9})
        assert not moved.value.definite
        answering(consumer, groups_pb2.OffsetCommitResponse())
        ok: list[tuple[object, BaseException | None]] = []
        await consumer.commit_async({TP: 9}, lambda o, e: ok.append((o, e)))
        assert ok == [({TP: (9, -1)}, None)]
        await consumer.close()

    asyncio.run(body())


def test_on_commit_is_told_only_the_partitions_the_coordinator_stored() -> None:
    async def body() -> None:
        told: list[dict[TopicPartition, OffsetAndEpoch]] = []
        consumer = Consumer(["127.0.0.1:1"], group_id="g", on_commit=told.append)
        one = TopicPartition("t", 1)
        answering(consumer, groups_pb2.OffsetCommitResponse(error=pb(Errors.NOT_COORDINATOR)))
        with pytest.raises(CommitError):
            await consumer.commit({TP: 9})
        assert told == []  # a refusal of the whole request stores nothing
        mixed = groups_pb2.OffsetCommitResponse(
            topics=[
                groups_pb2.TopicResult(
                    name="t",
                    partitions=[
                        groups_pb2.PartitionResult(partition=0),
                        groups_pb2.PartitionResult(
                            partition=1, error=pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                        ),
                    ],
                )
            ]
        )
        answering(consumer, mixed)
        with pytest.raises(CommitError, match="t-1"):
            await consumer.commit({TP: (9, 2), one: 4})
        assert told == [{TP: (9, 2)}]  # partition 0 was stored, 1 was not
        answering(consumer, groups_pb2.OffsetCommitResponse(topics=[
            groups_pb2.TopicResult(name="t", partitions=[
                groups_pb2.PartitionResult(partition=0), groups_pb2.PartitionResult(partition=1)
            ])
        ]))  # fmt: skip
        await consumer.commit({TP: 10, one: 5})
        assert told[-1] == {TP: (10, -1), one: (5, -1)}

        # The callback's own failure does not fail the commit.
        def broken(offsets: dict[TopicPartition, OffsetAndEpoch]) -> None:
            raise RuntimeError("the application's bug")

        assert consumer._group is not None
        consumer._group.on_commit = broken
        await consumer.commit({TP: 11, one: 6})
        await consumer.close()
        with pytest.raises(ValueError, match="on_commit needs a group_id"):
            Consumer(["127.0.0.1:1"], on_commit=told.append)

    asyncio.run(body())


def test_committed_reads_offset_and_epoch_and_none_where_absent() -> None:
    async def body() -> None:
        consumer = Consumer(["127.0.0.1:1"], group_id="g")
        answering(
            consumer,
            groups_pb2.OffsetFetchResponse(
                topics=[
                    groups_pb2.OffsetFetchTopic(
                        name="t",
                        partitions=[
                            groups_pb2.OffsetFetchPartition(partition=0, offset=42, leader_epoch=2),
                            groups_pb2.OffsetFetchPartition(partition=1, offset=-1),
                        ],
                    )
                ]
            ),
        )
        found = await consumer.committed([TP, ("t", 1)])
        assert found == {TP: (42, 2), TopicPartition("t", 1): None}
        await consumer.close()

    asyncio.run(body())

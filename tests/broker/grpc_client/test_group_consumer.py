"""The consumer's group calls without brokers: auto-commit at the start of
poll commits what earlier polls returned, never the records the same poll
returns; close commits; assign and subscribe exclude each other; subscribe
needs a group id."""

from __future__ import annotations

import asyncio

import pytest

from broker.client.consumer import FetchAnswer, LeaderInfo
from broker.client.membership import AutoCommitTimer
from broker.client.producer_batch import TopicPartition
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.group import IllegalStateError, OffsetAndEpoch
from tests.broker.client.test_membership import records

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

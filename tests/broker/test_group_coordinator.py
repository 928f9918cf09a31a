"""The group coordinator at run time over three in-memory brokers' replicas
of the offsets topic: answers wait for the high watermark, a leadership
change drops the coordinator with its waiting answers, and a new one
rebuilds its groups from the log below the high watermark only
(KAFKA-20634's scenario)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker.errors import Errors
from broker.group.api import CommitPartition, OffsetCommitRequest, OffsetFetchRequest
from broker.group.placement import OFFSETS_TOPIC
from broker.group_coordinator import (
    CoordinatorFailure,
    GroupCoordinator,
    OffsetsTopicSettings,
    ShardState,
)
from broker.purgatory import Purgatory
from metadata.image import TopicIdPartition
from tests.broker.images import change, topic
from tests.broker.test_replica_manager import Cluster, batch

T = TypeVar("T")
KEY = TopicIdPartition("id-offsets", 0)


class Brokers(Cluster):
    """Three brokers, each with a group coordinator on its replica manager."""

    def __init__(self, with_topic: bool = True) -> None:
        super().__init__()
        self.purgatories = {b: Purgatory() for b in self.brokers}
        self.created = 0

        async def create() -> None:
            self.created += 1

        self.coordinators = {
            b: GroupCoordinator(
                b,
                manager,
                self.purgatories[b],
                topic=OffsetsTopicSettings(partitions=1, commit_timeout_ms=60_000),
                now_ms=lambda: self.now,
                create_offsets_topic=create,
            )
            for b, manager in self.brokers.items()
        }
        if with_topic:
            self.step_and_publish(*topic(OFFSETS_TOPIC, "id-offsets", (1, 2, 3)))

    def step_and_publish(self, *records: object) -> None:
        self.step(*records)  # type: ignore[arg-type]
        for b, coordinator in self.coordinators.items():
            coordinator.on_image(self.brokers[b].image)
            self.purgatories[b].wake_all()

    def replicate_and_wake(self, rounds: int = 3) -> None:
        self.replicate(rounds)
        for purgatory in self.purgatories.values():
            purgatory.wake_all()

    async def loaded(self, broker: int) -> None:
        for _ in range(100):
            if self.coordinators[broker].shard_states().get(0) is ShardState.ACTIVE:
                return
            self.replicate_and_wake(1)
            await asyncio.sleep(0)
        raise AssertionError(
            f"broker {broker} did not load: {self.coordinators[broker].shard_states()}"
        )

    async def stop(self) -> None:
        for coordinator in self.coordinators.values():
            await coordinator.stop()


def commit(offset: int, group: str = "g") -> OffsetCommitRequest:
    return OffsetCommitRequest(group, "", -1, (CommitPartition("t", 0, offset),))


def run(body: Callable[[Brokers], Awaitable[T]], with_topic: bool = True) -> T:
    async def main() -> T:
        brokers = Brokers(with_topic)
        try:
            return await asyncio.wait_for(body(brokers), 30)
        finally:
            await brokers.stop()

    return asyncio.run(main())


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_commit_is_answered_only_once_below_the_high_watermark() -> None:
    async def body(brokers: Brokers) -> None:
        await brokers.loaded(1)
        task = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(5)))
        await turns()
        assert not task.done()  # in the leader's log, not yet on the followers
        brokers.replicate_and_wake()
        answer = await task
        assert [p.error for p in answer.partitions] == [Errors.NONE]
        fetched = await brokers.coordinators[1].fetch_offsets(OffsetFetchRequest("g"))
        assert [o.offset for o in fetched.offsets] == [5]

    run(body)


def test_only_the_leader_coordinates() -> None:
    async def body(brokers: Brokers) -> None:
        await brokers.loaded(1)
        for b in (2, 3):
            try:
                await brokers.coordinators[b].commit_offsets(commit(1))
            except CoordinatorFailure as failure:
                assert failure.code is Errors.NOT_COORDINATOR and failure.partition == 0
            else:
                raise AssertionError("a follower answered a commit")

    run(body)


def test_a_commit_lost_with_its_leader_is_answered_not_coordinator_and_stays_lost() -> None:
    """KAFKA-20634: the old coordinator must not answer success for a
    commit its log loses, and the new one must not show it."""

    async def body(brokers: Brokers) -> None:
        await brokers.loaded(1)
        first = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(5)))
        await turns()
        brokers.replicate_and_wake()
        await first
        lost = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(9)))
        await turns()
        assert not lost.done()
        # Broker 2 takes over without having fetched offset 9's record.
        brokers.step_and_publish(change("id-offsets", 0, leader=2, isr=(2, 3)))
        try:
            await lost
        except CoordinatorFailure as failure:
            assert failure.code is Errors.NOT_COORDINATOR
        else:
            raise AssertionError("a commit not below the high watermark was answered")
        await brokers.loaded(2)
        fetched = await brokers.coordinators[2].fetch_offsets(OffsetFetchRequest("g"))
        assert [o.offset for o in fetched.offsets] == [5]

    run(body)


def test_a_new_coordinator_answers_load_in_progress_until_it_has_the_earlier_records() -> None:
    async def body(brokers: Brokers) -> None:
        await brokers.loaded(1)
        for offset in (3, 4):
            task = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(offset)))
            await turns()
            brokers.replicate_and_wake()
            await task
        brokers.step_and_publish(change("id-offsets", 0, leader=3))
        try:
            await brokers.coordinators[3].fetch_offsets(OffsetFetchRequest("g"))
        except CoordinatorFailure as failure:
            assert failure.code is Errors.COORDINATOR_LOAD_IN_PROGRESS
        else:
            raise AssertionError("answered before loading")
        await brokers.loaded(3)
        fetched = await brokers.coordinators[3].fetch_offsets(OffsetFetchRequest("g"))
        assert [o.offset for o in fetched.offsets] == [4]
        assert brokers.coordinators[1].shard_states() == {}

    run(body)


def test_no_offsets_topic_asks_for_it() -> None:
    async def body(brokers: Brokers) -> None:
        try:
            await brokers.coordinators[1].commit_offsets(commit(1))
        except CoordinatorFailure as failure:
            assert failure.code is Errors.COORDINATOR_NOT_AVAILABLE
            assert OFFSETS_TOPIC in failure.message
        await turns()
        assert brokers.created == 1

    run(body, with_topic=False)


def test_a_read_waits_for_every_earlier_write() -> None:
    async def body(brokers: Brokers) -> None:
        await brokers.loaded(1)
        write = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(7)))
        await turns()
        read = asyncio.create_task(brokers.coordinators[1].fetch_offsets(OffsetFetchRequest("g")))
        await turns()
        assert not read.done()  # it would show 7, which could still be lost
        brokers.replicate_and_wake()
        await write
        assert [o.offset for o in (await read).offsets] == [7]

    run(body)


def test_the_lag_of_each_commit_is_the_partitions_hw_less_the_committed_offset() -> None:
    """``lags()`` (the ``kq_broker_group_lag`` gauge): per group and
    partition committed at this coordinator, the high watermark the broker
    knows of it less the committed offset; nothing for groups coordinated
    elsewhere or partitions of topics it does not know."""

    async def body(brokers: Brokers) -> None:
        brokers.step_and_publish(*topic("t", "id-t", (1, 2, 3)))
        t0 = TopicIdPartition("id-t", 0)
        for value in (b"a", b"b", b"c", b"d"):
            brokers.brokers[1].append(t0, batch(value), -1, brokers.now)
        brokers.replicate_and_wake()
        await brokers.loaded(1)
        task = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(1)))
        other = asyncio.create_task(brokers.coordinators[1].commit_offsets(commit(9, "late")))
        ghost = OffsetCommitRequest("g", "", -1, (CommitPartition("gone", 0, 2),))
        missing = asyncio.create_task(brokers.coordinators[1].commit_offsets(ghost))
        await turns()
        brokers.replicate_and_wake()
        await asyncio.gather(task, other, missing)
        assert brokers.coordinators[1].lags() == [("g", "t", 0, 3), ("late", "t", 0, 0)]
        assert brokers.coordinators[2].lags() == []  # not the coordinator

    run(body)

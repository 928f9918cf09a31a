"""Fetch sessions on the ReplicaFetch stream (broker/fetch_session.py,
``BrokerService._session_fetch``), over a real gRPC server with mutual TLS:
a follower's incremental fetches list only what changed and are answered
only with news, an idle follower stays in the ISR, and the session's
malformed requests are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest

import broker.fetch_session
from broker.codec import answers_in, replica_fetch_request
from broker.fetch_session import FollowerFetchSession
from kqproto import broker_pb2, broker_pb2_grpc
from metadata.image import MetadataImage, TopicIdPartition
from quorum.driver.tls import dial
from tests.broker.images import EPOCHS, topic
from tests.broker.test_service import Brokers, Certs, E, batch, certs, produce, run, serving

__all__ = ["certs"]

KEYS = [TopicIdPartition("id-t", p) for p in range(3)]


class Follower:
    """Broker 2's side of the stream to broker 1, as the broker process
    runs it."""

    def __init__(self, brokers: Brokers, stub: Any) -> None:
        self.brokers = brokers
        self.stub = stub
        self.stream: Any = stub.ReplicaFetch()
        self.session = FollowerFetchSession()

    def _states(self, keys: Iterable[TopicIdPartition] | None) -> Any:
        return self.brokers.managers[2].next_fetch_request(1, EPOCHS[2], keys)

    async def round(
        self, max_wait_ms: int = 0, image: MetadataImage | None = None
    ) -> dict[TopicIdPartition, Any]:
        fetch = self.session.next_fetch(self._states)
        assert fetch is not None
        await self.stream.write(
            replica_fetch_request(
                2,
                EPOCHS[2],
                fetch.listed,
                image or self.brokers.md.image,
                max_wait_ms=max_wait_ms,
                incremental=fetch.incremental,
                forgotten=fetch.forgotten,
            )
        )
        response = await self.stream.read()
        assert response.error == E.NONE, response.message
        answered = self.session.answered(answers_in(response))
        for key, (request, answer) in answered.items():
            self.brokers.managers[2].step_fetch_answer(key, request, answer, self.brokers.now)
        return {key: answer for key, (_, answer) in answered.items()}


def three_partitions() -> Brokers:
    return Brokers(*topic("t", "id-t", (1, 2), (1, 2), (1, 2)))


@asynccontextmanager
async def connected(brokers: Brokers, certs: Certs) -> AsyncIterator[tuple[Any, Follower]]:
    """A user's stub on broker 1, and broker 2 as its follower on a stream."""
    async with (
        serving(brokers, certs) as address,
        dial(address, certs.user("admin")) as client,
        dial(address, certs.broker(2)) as replica,
    ):
        follower = Follower(brokers, broker_pb2_grpc.BrokerServiceStub(replica))
        yield broker_pb2_grpc.BrokerServiceStub(client), follower
        await follower.stream.done_writing()


def test_incremental_fetches_answer_only_the_partitions_with_news(certs: Certs) -> None:
    brokers = three_partitions()

    async def body() -> None:
        async with connected(brokers, certs) as (stub, follower):
            # The full request: every partition answered.
            assert sorted(await follower.round()) == KEYS
            # Nothing new: an empty answer once the wait is over.
            assert await follower.round(max_wait_ms=50) == {}
            # A write to partition 1 wakes the waiting fetch: only it.
            waiting = follower.round(max_wait_ms=5_000)
            await stub.Produce(produce("t", 1, batch(b"x")))
            got = await waiting
            assert list(got) == [KEYS[1]] and got[KEYS[1]].records
            # The follower lists partition 1 at its new offset; the leader's
            # HW moves, which is news for it alone.
            got = await follower.round()
            if not got:  # the HW's move woke the session after its read
                got = await follower.round()
            assert list(got) == [KEYS[1]] and got[KEYS[1]].high_watermark == 1
            assert brokers.log(2, "t").log_end_offset == 0  # partition 0's log
            assert brokers.managers[2].logs.log(KEYS[1]).high_watermark == 1  # type: ignore[union-attr]

    run(body)


def test_a_forgotten_partition_is_no_longer_answered(certs: Certs) -> None:
    brokers = three_partitions()

    async def body() -> None:
        async with connected(brokers, certs) as (stub, follower):
            stream = follower.stream
            await follower.round()
            request = replica_fetch_request(
                2, EPOCHS[2], {}, brokers.md.image, incremental=True, forgotten=[KEYS[2]]
            )
            await stream.write(request)
            assert answers_in(await stream.read()) == {}
            await stub.Produce(produce("t", 2, batch(b"gone")))
            await stub.Produce(produce("t", 0, batch(b"kept")))
            await stream.write(
                replica_fetch_request(2, EPOCHS[2], {}, brokers.md.image, incremental=True)
            )
            assert list(answers_in(await stream.read())) == [KEYS[0]]

    run(body)


def test_an_idle_follower_stays_in_the_isr(certs: Certs) -> None:
    """Its partitions are not read while nothing changes (Kafka's leader
    reads every partition of a session on each fetch), and it stays in the
    ISR past the lag time: at the leader's log end it is caught up whatever
    the time. A stopped follower behind the leader still leaves."""
    brokers = three_partitions()

    async def body() -> None:
        async with connected(brokers, certs) as (stub, follower):
            await follower.round()
            for _ in range(6):  # 48 s of idle fetches
                brokers.now += 8_000
                assert await follower.round() == {}
            assert brokers.managers[1].tick_isr(brokers.now) == []
            # Partition 0 written; the follower fetches it once, then stops.
            await stub.Produce(produce("t", 0, batch(b"x")))
            assert list(await follower.round()) == [KEYS[0]]

    run(body)
    brokers.now += 31_000
    (key, request), *others = brokers.managers[1].tick_isr(brokers.now)
    assert (key, request.isr, others) == (KEYS[0], (1,), [])


@pytest.mark.parametrize("full_reads", [True, False])
def test_a_change_that_woke_no_session_reaches_the_follower_at_the_next_full_read(
    certs: Certs, monkeypatch: pytest.MonkeyPatch, full_reads: bool
) -> None:
    """Every quarter of replica.lag.time.max.ms (30 s here) the leader reads
    the whole session: a write that woke no session (appended to the log
    behind the service's back) is answered then. Without those full reads
    it is never answered."""
    if not full_reads:
        monkeypatch.setattr(broker.fetch_session, "_full_read_interval", lambda lag_ms: 10**12)
    brokers = three_partitions()

    async def body() -> None:
        async with connected(brokers, certs) as (stub, follower):
            await follower.round()
            # The first fetch moved the followers' positions, which woke the
            # partitions: read again once.
            await follower.round()
            assert await follower.round() == {}
            brokers.managers[1].append(KEYS[2], batch(b"quiet"), 1, brokers.now)
            assert await follower.round() == {}
            brokers.now += 7_499
            assert await follower.round() == {}
            brokers.now += 1
            got = await follower.round()
            if full_reads:
                assert list(got) == [KEYS[2]] and got[KEYS[2]].records
            else:
                assert got == {}

    run(body)


def test_a_topic_the_leader_did_not_know_yet_is_listed_again_once_it_does(certs: Certs) -> None:
    """The follower's image has a new topic before the leader's: the leader
    refuses its partition (UNKNOWN_TOPIC_ID) and does not hold it;
    the follower lists it again, and once the leader's image has it, it
    replicates. Listed only once, it would never be fetched."""
    brokers = three_partitions()

    async def body() -> None:
        async with connected(brokers, certs) as (stub, follower):
            await follower.round()
            before = brokers.managers[1].image
            brokers.md.step(*topic("u", "id-u", (1, 2)))
            brokers.managers[2].apply_delta(brokers.md.image, brokers.now)
            follower.session.mark_all()
            refused = await follower.round(image=brokers.md.image)
            new = TopicIdPartition("id-u", 0)
            assert refused[new].error == E.UNKNOWN_TOPIC_ID
            assert brokers.managers[1].image is before
            brokers.managers[1].apply_delta(brokers.md.image, brokers.now)
            brokers.service.wake()
            await stub.Produce(produce("u", 0, batch(b"late")))
            got = await follower.round()
            assert got[new].records
            assert brokers.managers[2].logs.log(new).log_end_offset == 1  # type: ignore[union-attr]

    run(body)


def test_malformed_session_requests_are_refused(certs: Certs) -> None:
    brokers = three_partitions()

    async def body() -> None:
        async with connected(brokers, certs) as (stub, follower):
            full = brokers.follower_fetch()
            assert full is not None
            incremental = broker_pb2.FetchRequest()
            incremental.CopyFrom(full)
            incremental.incremental = True
            unary: Any = await follower.stub.Fetch(incremental)
            assert unary.error == E.INVALID_REQUEST and "ReplicaFetch" in unary.message
            stream = follower.stream
            await stream.write(incremental)
            first: Any = await stream.read()
            assert first.error == E.INVALID_REQUEST and "first full" in first.message
            forgetting = broker_pb2.FetchRequest()
            forgetting.CopyFrom(full)
            forgetting.forgotten.add(topic_id="id-t", partitions=[0])
            await stream.write(forgetting)
            refused: Any = await stream.read()
            assert refused.error == E.INVALID_REQUEST and "incremental" in refused.message
            await stream.write(full)
            assert len((await stream.read()).topics[0].partitions) == 3
            forgetting.incremental = True
            forgetting.forgotten[0].partitions[0] = -1
            await stream.write(forgetting)
            negative: Any = await stream.read()
            assert negative.error == E.INVALID_REQUEST and "negative" in negative.message

    run(body)

"""Malformed requests never crash the broker's service and never change
stored data: Hypothesis-built Produce, Fetch and Metadata messages (random
fields, damaged batches) straight into the servicer on a plaintext
connection (every caller allowed, so every check past the ACLs is reached),
the log files compared before and after."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import Errors
from kqproto import broker_pb2
from partition_log.batch import build_batch
from partition_log.records import Record
from tests.broker.images import topic
from tests.broker.test_service import Brokers


class PlaintextContext:
    """What the servicer reads of a gRPC call on a plaintext server: no
    certificate, and the peer's address."""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted {code}: {details}")


GOOD = build_batch([Record(0, 1000, b"k", b"v")])
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Weighted toward what the broker serves, so most examples get past the
# name and ACL checks to the batch and offset checks.
names = st.sampled_from(["t", "solo", "solo", "solo", "", "nope", "t\x00", "x" * 300])


@st.composite
def damaged_batches(draw: st.DrawFn) -> bytes:
    data = bytearray(GOOD)
    # Past the base offset (which the leader assigns): every damage there is
    # in the length, the epoch, the magic, the CRC or what the CRC covers.
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(8, len(data) - 1))
        data[at] ^= draw(st.integers(1, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) if draw(st.booleans()) else bytes(data)


record_bytes = st.one_of(st.just(b""), st.binary(max_size=200), damaged_batches())
produces = st.builds(
    broker_pb2.ProduceRequest,
    acks=st.sampled_from([1, 1, 0, -1, 2, -2, 1000]),
    timeout_ms=st.sampled_from([0, 1, -1]),
    transactional_id=st.sampled_from(["", "", "", "tx"]),
    topics=st.lists(
        st.builds(
            broker_pb2.ProduceTopicData,
            name=names,
            partitions=st.lists(
                st.builds(
                    broker_pb2.ProducePartitionData,
                    partition=st.sampled_from([0, 0, 0, 1, -1, 2**31 - 1]),
                    records=record_bytes,
                ),
                max_size=3,
            ),
        ),
        max_size=3,
    ),
)
fetch_partitions = st.builds(
    broker_pb2.FetchPartition,
    partition=st.sampled_from([0, 1, -1]),
    current_leader_epoch=st.sampled_from([-2, -1, 0, 1, 2**31 - 1]),
    fetch_offset=st.one_of(st.sampled_from([0, 1, -1]), longs),
    last_fetched_epoch=st.sampled_from([-2, -1, 0, 5]),
    log_start_offset=st.sampled_from([-1, 0, 3]),
    partition_max_bytes=st.one_of(st.sampled_from([0, 1, -1]), ints),
)
fetches = st.builds(
    broker_pb2.FetchRequest,
    replica_state=st.one_of(
        st.none(),
        st.builds(
            broker_pb2.ReplicaState,
            replica_id=st.sampled_from([-1, 1, 2, 3, 99]),
            replica_epoch=st.sampled_from([-1, 0, 200]),
        ),
    ),
    max_wait_ms=st.sampled_from([0, -1, 1]),
    min_bytes=st.sampled_from([0, 1, -1, 2**31 - 1]),
    max_bytes=st.one_of(st.sampled_from([0, 1, -1]), ints),
    isolation_level=st.sampled_from([0, 1]),
    topics=st.lists(
        st.builds(
            broker_pb2.FetchTopic,
            topic=names,
            topic_id=st.sampled_from(["", "id-t", "id-s", "bogus"]),
            partitions=st.lists(fetch_partitions, max_size=3),
        ),
        max_size=3,
    ),
)
metadatas = st.builds(
    broker_pb2.MetadataRequest, topics=st.lists(names, max_size=4), all_topics=st.booleans()
)


def fresh() -> Brokers:
    brokers = Brokers(*topic("t", "id-t", (1, 2)), *topic("solo", "id-s", (1,)))

    async def seed() -> None:
        await brokers.service.Produce(
            broker_pb2.ProduceRequest(
                acks=1,
                topics=[
                    broker_pb2.ProduceTopicData(
                        name=name, partitions=[broker_pb2.ProducePartitionData(records=GOOD)]
                    )
                    for name in ("t", "solo")
                ],
            ),
            PlaintextContext(),
        )

    asyncio.run(seed())
    return brokers


def committed_anything(response: broker_pb2.ProduceResponse) -> bool:
    return any(p.error == Errors.NONE for t in response.topics for p in t.partitions)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.one_of(produces, fetches, metadatas), min_size=1, max_size=4))
def test_fuzzed_requests_never_crash_and_never_change_stored_data(requests: list[Any]) -> None:
    brokers = fresh()
    before = brokers.snapshot()
    service = brokers.service
    context = PlaintextContext()
    changed = False

    async def body() -> None:
        nonlocal changed
        for request in requests:
            if isinstance(request, broker_pb2.ProduceRequest):
                response = await service.Produce(request, context)
                assert isinstance(response, broker_pb2.ProduceResponse)
                changed = changed or committed_anything(response)
            elif isinstance(request, broker_pb2.FetchRequest):
                fetched = await service.Fetch(request, context)
                assert isinstance(fetched, broker_pb2.FetchResponse)
            else:
                described = await service.Metadata(request, context)
                assert isinstance(described, broker_pb2.MetadataResponse)

    asyncio.run(asyncio.wait_for(body(), 30))
    if not changed:
        assert brokers.snapshot() == before


def test_a_damaged_second_batch_leaves_the_first_unwritten() -> None:
    brokers = fresh()
    before = brokers.snapshot()
    damaged = bytearray(GOOD)
    damaged[-1] ^= 1

    async def body() -> None:
        request = broker_pb2.ProduceRequest(
            acks=1,
            topics=[
                broker_pb2.ProduceTopicData(
                    name="solo",
                    partitions=[broker_pb2.ProducePartitionData(records=GOOD + bytes(damaged))],
                )
            ],
        )
        response = await brokers.service.Produce(request, PlaintextContext())
        assert response.topics[0].partitions[0].error == Errors.CORRUPT_MESSAGE

    asyncio.run(body())
    assert brokers.snapshot() == before


def test_a_later_batch_refused_by_the_producer_state_names_what_went_in() -> None:
    brokers = fresh()
    first = build_batch(
        [Record(0, 1000, b"k", b"a")], producer_id=7, producer_epoch=0, base_sequence=0
    )
    gap = build_batch(
        [Record(0, 1000, b"k", b"b")], producer_id=7, producer_epoch=0, base_sequence=5
    )

    async def body() -> None:
        request = broker_pb2.ProduceRequest(
            acks=1,
            topics=[
                broker_pb2.ProduceTopicData(
                    name="solo",
                    partitions=[broker_pb2.ProducePartitionData(records=first + gap)],
                )
            ],
        )
        response = await brokers.service.Produce(request, PlaintextContext())
        answer = response.topics[0].partitions[0]
        assert answer.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert "after the batches from offset 1 to 1 were appended" in answer.message

    asyncio.run(body())

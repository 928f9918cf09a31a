"""The transactional producer against real brokers (three controllers,
three brokers, mutual TLS, one cluster for the module): init, two
transactions committed over two partitions and one aborted, each at the
epoch the previous EndTxn answered; a second producer with the same
transactional id fences the first, whose next call raises
ProducerFencedError and whose records fail; the records read back (the
consumer reads uncommitted and skips control batches, so the aborted
transaction's records are there too, each exactly once, at increasing
offsets with the markers' offsets between the transactions); misuse is
refused before anything is sent; an EndTxn whose answer was lost goes again
at the same epoch; offsets join a transaction with the member's identity."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from broker.client.consumer import ConsumerConfig, ConsumerRecord, IsolationLevel
from broker.client.producer_batch import ProducerConfig, TopicPartition
from broker.client.transactions import TxnState
from broker.codec import error_to_proto
from broker.errors import Errors
from broker.grpc_client import (
    Consumer,
    ConsumerGroupMetadata,
    DeliveryFailedError,
    Producer,
    ProducerFencedError,
    TransactionStateError,
)
from broker.grpc_client.coordinator import GroupCoordinatorClient
from broker.grpc_client.group_admin import GroupAdmin
from kqproto import groups_pb2
from tests.broker.grpc_client.cluster import BrokerCluster

TOPIC = "txn"
CONFIG = ProducerConfig(linger_ms=2, request_timeout_ms=10_000, delivery_timeout_ms=30_000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    running = BrokerCluster(tmp_path_factory.mktemp("txn-clients"))
    try:
        running.start()
        running.create_topic(TOPIC, 2, 3, {"min.insync.replicas": "2"})
        yield running
    finally:
        running.stop()


def producer(cluster: BrokerCluster, tid: str = "tx-1") -> Producer:
    return Producer(
        cluster.addresses,
        CONFIG,
        tls=cluster.admin_tls,
        transactional_id=tid,
        transaction_timeout_ms=30_000,
    )


async def read_all(
    cluster: BrokerCluster, count: int, isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED
) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    config = ConsumerConfig(isolation_level=isolation)
    async with Consumer(cluster.addresses, config, tls=cluster.admin_tls) as consumer:
        consumer.assign([(TOPIC, 0), (TOPIC, 1)])
        for p in (0, 1):
            consumer.seek((TOPIC, p), 0)
        deadline = asyncio.get_running_loop().time() + 20
        while len(got) < count:
            assert asyncio.get_running_loop().time() < deadline, f"only {len(got)} of {count}"
            got.extend(await consumer.poll(500))
    return got


def test_transactions_commit_abort_and_fence(cluster: BrokerCluster) -> None:
    async def body() -> None:
        first = producer(cluster)
        second: Producer | None = None
        try:
            with pytest.raises(TransactionStateError, match="init_transactions"):
                await first.send(TOPIC, b"early", partition=0)
            await first.init_transactions(30_000)
            txn = first.transactions
            assert txn is not None and txn.state is TxnState.READY
            epoch0 = txn.producer.epoch
            with pytest.raises(TransactionStateError, match="begin_transaction"):
                await first.send(TOPIC, b"outside", partition=0)

            acked = []
            for n, action in enumerate(("commit", "abort", "commit")):
                first.begin_transaction()
                with pytest.raises(TransactionStateError):
                    first.begin_transaction()
                futures = [
                    await first.send(TOPIC, b"%s-%d-%d" % (action.encode(), n, i), partition=i % 2)
                    for i in range(6)
                ]
                if action == "commit":
                    await first.commit_transaction(30_000)
                    acked.extend([await f for f in futures])
                else:
                    await first.flush()
                    await asyncio.gather(*futures)
                    await first.abort_transaction(30_000)
                # Every end bumps the epoch (KIP-890); sequences start again.
                assert txn.state is TxnState.READY
                assert txn.producer.epoch == epoch0 + n + 1
            assert {m.partition for m in acked} == {0, 1}

            # A transaction nothing joined ends without asking anyone.
            first.begin_transaction()
            await first.commit_transaction(10_000)
            assert txn.producer.epoch == epoch0 + 3

            # The same transactional id again: the first producer is fenced.
            first.begin_transaction()
            pending = await first.send(TOPIC, b"fenced", partition=0)
            await first.flush(10)
            second = producer(cluster)
            await second.init_transactions(30_000)
            assert second.transactions is not None
            assert second.transactions.producer.epoch > txn.producer.epoch
            # Its new partition's AddPartitionsToTxn is refused PRODUCER_FENCED.
            late = await first.send(TOPIC, b"late", partition=1)
            with pytest.raises(ProducerFencedError):
                await first.commit_transaction(20_000)
            assert txn.state is TxnState.FATAL_ERROR
            with pytest.raises(ProducerFencedError):
                await late
            for call in (first.commit_transaction(5_000), first.abort_transaction(5_000)):
                with pytest.raises(ProducerFencedError):
                    await call
            with pytest.raises(ProducerFencedError):
                first.begin_transaction()
            with pytest.raises(ProducerFencedError):
                await first.send(TOPIC, b"never", partition=0)
            assert pending.done()

            second.begin_transaction()
            after = await second.send(TOPIC, b"second", partition=1)
            await second.commit_transaction(30_000)
            last = await after
        finally:
            await first.close(5)
            if second is not None:
                await second.close(5)

        # Read uncommitted: every record written, each once; the fenced
        # transaction's one record too (the coordinator aborted it).
        written = 18 + 1 + 1
        got = await read_all(cluster, written)
        values = [r.value for r in got]
        assert len(values) == len(set(values)) == written
        assert b"second" in values and b"fenced" in values
        for p in (0, 1):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == sorted(offsets)
        # Each transaction's markers take an offset: the records of the
        # committed ones are not contiguous across transactions.
        by_value = {r.value: r for r in got}
        assert by_value[b"commit-2-0"].offset > by_value[b"abort-1-4"].offset + 1
        assert last.offset == by_value[b"second"].offset
        # Read committed: the committed transactions' records only, none of
        # the aborted one nor of the fenced one's.
        committed = await read_all(cluster, 13, IsolationLevel.READ_COMMITTED)
        kept = sorted(r.value or b"" for r in committed)
        assert kept == sorted(
            [b"commit-%d-%d" % (n, i) for n in (0, 2) for i in range(6)] + [b"second"]
        )

    asyncio.run(asyncio.wait_for(body(), 150))


def test_offsets_outside_a_transaction_and_a_plain_producer_are_refused(
    cluster: BrokerCluster,
) -> None:
    async def body() -> None:
        async with Producer(cluster.addresses, CONFIG, tls=cluster.admin_tls) as plain:
            with pytest.raises(TransactionStateError, match="without a transactional_id"):
                plain.begin_transaction()
            with pytest.raises(TransactionStateError):
                await plain.commit_transaction()
        async with producer(cluster, "tx-offsets") as txn_producer:
            await txn_producer.init_transactions(30_000)
            with pytest.raises(TransactionStateError, match="begin_transaction"):
                await txn_producer.send_offsets_to_transaction(
                    {TopicPartition(TOPIC, 0): 1}, ConsumerGroupMetadata("g")
                )
        async with Consumer(cluster.addresses, tls=cluster.admin_tls, group_id="g-meta") as c:
            assert c.group_metadata() == ConsumerGroupMetadata("g-meta", "", -1, None)
        async with Consumer(cluster.addresses, tls=cluster.admin_tls) as c:
            with pytest.raises(ValueError, match="group_id"):
                c.group_metadata()

    asyncio.run(asyncio.wait_for(body(), 60))


class LosingStub:
    """A TransactionService stub whose first EndTxn answers are lost after
    the coordinator handled them (the request went through)."""

    def __init__(self, stub: Any, sent: list[Any], losses: int) -> None:
        self._stub = stub
        self._sent = sent
        self._losses = losses

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def EndTxn(self, request: Any, timeout: float | None = None) -> Any:
        self._sent.append((request.producer_id, request.producer_epoch, request.committed))
        answer = await self._stub.EndTxn(request, timeout=timeout)
        if len(self._sent) <= self._losses:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="answer lost by the test",
            )
        return answer


def test_an_end_txn_whose_answer_was_lost_is_sent_again_at_the_same_epoch(
    cluster: BrokerCluster,
) -> None:
    cluster.create_topic("txn-lost", 1, 3)

    async def body() -> None:
        async with producer(cluster, "tx-lost") as p:
            await p.init_transactions(30_000)
            txn, coordinator = p.transactions, p._coordinator
            assert txn is not None and coordinator is not None
            sent: list[Any] = []
            real = coordinator.txn_stub
            losing: Any = lambda address: LosingStub(real(address), sent, 2)  # noqa: E731
            coordinator.txn_stub = losing  # type: ignore[method-assign]
            epoch = txn.producer.epoch
            p.begin_transaction()
            future = await p.send("txn-lost", b"lost-end", partition=0)
            await p.commit_transaction(30_000)
            # Three EndTxn, all at the transaction's epoch: the retries were
            # answered with the first one's outcome, bumped once.
            assert sent == [(txn.producer.producer_id, epoch, True)] * 3
            assert txn.producer.epoch == epoch + 1 and txn.state is TxnState.READY
            written = await future
            # An abort whose record was dropped before its partition was
            # asked for: nothing joined the transaction, no EndTxn.
            p.begin_transaction()
            dropped = await p.send("txn-lost", b"dropped", partition=0)
            await p.abort_transaction(30_000)
            with pytest.raises(DeliveryFailedError, match="TransactionAbortedException"):
                await dropped
            assert len(sent) == 3 and txn.producer.epoch == epoch + 1
            # An abort after the record was written: EndTxn(abort), bumped.
            p.begin_transaction()
            aborted = await p.send("txn-lost", b"aborted", partition=0)
            await p.flush()
            await aborted
            await p.abort_transaction(30_000)
            assert sent[-1] == (txn.producer.producer_id, epoch + 1, False)
            assert txn.producer.epoch == epoch + 2
        assert written.offset == 0

    asyncio.run(asyncio.wait_for(body(), 90))


def test_offsets_sent_to_a_transaction_move_the_group_only_when_it_commits(
    cluster: BrokerCluster,
) -> None:
    """Offsets outside membership ("" and -1) through the real group
    coordinator: pending (require_stable answers UNSTABLE_OFFSET_COMMIT)
    until the transaction ends; an aborted transaction's never show."""

    async def committed(group: str) -> dict[int, int]:
        async with GroupAdmin(cluster.addresses, tls=cluster.admin_tls) as admin:
            offsets = await admin.list_group_offsets(group)
        return {tp.partition: o.offset for tp, o in offsets.items() if o is not None}

    async def body() -> None:
        async with producer(cluster, "tx-offsets-real") as p:
            await p.init_transactions(30_000)
            group = ConsumerGroupMetadata("g-real")
            p.begin_transaction()
            await p.send(TOPIC, b"with-offsets", partition=0)
            await p.send_offsets_to_transaction({(TOPIC, 0): 3, (TOPIC, 1): 4}, group, 30_000)
            await p.commit_transaction(30_000)
            deadline = asyncio.get_running_loop().time() + 20
            while await committed("g-real") != {0: 3, 1: 4}:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
            p.begin_transaction()
            await p.send_offsets_to_transaction({(TOPIC, 0): 9}, group, 30_000)
            await p.abort_transaction(30_000)
            await asyncio.sleep(0.5)
            assert await committed("g-real") == {0: 3, 1: 4}

    asyncio.run(asyncio.wait_for(body(), 90))


def test_offsets_join_the_transaction_with_the_members_identity(cluster: BrokerCluster) -> None:
    """AddOffsetsToTxn at the real coordinator; the group coordinator's
    TxnOffsetCommit answers are the test's, to script its retries
    (NOT_COORDINATOR, then one partition still loading, then stored): each
    retry carries what is left,
    with the producer's id and epoch and the member's id and epoch."""
    answers = [
        (Errors.NOT_COORDINATOR, {}),
        (Errors.NONE, {0: Errors.NONE, 1: Errors.COORDINATOR_LOAD_IN_PROGRESS}),
        (Errors.NONE, {1: Errors.NONE}),
    ]
    requests: list[groups_pb2.TxnOffsetCommitRequest] = []

    async def fake(
        self: GroupCoordinatorClient, request: groups_pb2.TxnOffsetCommitRequest, timeout_s: float
    ) -> groups_pb2.OffsetCommitResponse:
        requests.append(request)
        error, parts = answers.pop(0)
        return groups_pb2.OffsetCommitResponse(
            error=error_to_proto(error),
            topics=[
                groups_pb2.TopicResult(
                    name=TOPIC,
                    partitions=[
                        groups_pb2.PartitionResult(partition=p, error=error_to_proto(e))
                        for p, e in parts.items()
                    ],
                )
            ],
        )

    async def body() -> None:
        async with producer(cluster, "tx-offsets-commit") as p:
            await p.init_transactions(30_000)
            txn = p.transactions
            assert txn is not None
            p.begin_transaction()
            await p.send_offsets_to_transaction(
                {(TOPIC, 0): 5, TopicPartition(TOPIC, 1): 9},
                ConsumerGroupMetadata("g-txn", "member-1", 4),
                30_000,
            )
            assert txn.transaction_started and not txn.pending_offsets
            await p.abort_transaction(30_000)
            assert txn.state is TxnState.READY

    original = GroupCoordinatorClient.txn_offset_commit
    GroupCoordinatorClient.txn_offset_commit = fake  # type: ignore[method-assign]
    try:
        asyncio.run(asyncio.wait_for(body(), 60))
    finally:
        GroupCoordinatorClient.txn_offset_commit = original  # type: ignore[method-assign]
    assert not answers
    sent = [
        (r.group_id, r.member_id, r.member_epoch, r.producer_epoch,
         [(t.name, q.partition, q.offset) for t in r.topics for q in t.partitions])
        for r in requests
    ]  # fmt: skip
    both = [(TOPIC, 0, 5), (TOPIC, 1, 9)]
    assert sent == [
        ("g-txn", "member-1", 4, 0, both),
        ("g-txn", "member-1", 4, 0, both),
        ("g-txn", "member-1", 4, 0, [(TOPIC, 1, 9)]),
    ]
    assert {r.transactional_id for r in requests} == {"tx-offsets-commit"}

"""The transaction coordinator at run time over three in-memory brokers
(tests/broker/txn_cluster.py): a transaction's markers reach every
partition at the bumped epoch stamped with the coordinator's epoch, a
timeout aborts and fences, a new coordinator finishes what an old one
prepared, a deposed coordinator's markers are refused, and KIP-890's
verification refuses a transactional produce the coordinator does not
vouch for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import bugs
from broker.coordinator_runtime import ShardState
from broker.errors import Errors
from broker.group.api import CommitPartition, OffsetFetchRequest, TxnOffsetCommitRequest
from broker.service import BrokerService, ServiceSettings
from broker.txn.api import TxnMarker
from broker.txn.placement import partition_for
from broker.txn.types import TRANSACTION_VERSION, TopicPartition, TransactionState
from broker.txn_coordinator import TransactionCoordinator
from broker.txn_produce import verify_produce
from bugs import Bug
from kqproto import broker_pb2
from metadata.image import TopicIdPartition
from partition_log import read_committed_batches
from partition_log.batch import BatchHeader, decode_records, split_batches
from partition_log.txn import ControlType
from tests.broker.images import change
from tests.broker.test_service_fuzz import PlaintextContext
from tests.broker.txn_cluster import (
    DATA_ID,
    OFFSETS_TOPIC_ID,
    TXN_TOPIC_ID,
    TxnBrokers,
    eventually,
    txn_batch,
)

T = TypeVar("T")
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
TIMEOUT = 60_000


async def begun(
    coordinator: TransactionCoordinator, *partitions: TopicPartition
) -> tuple[int, int]:
    """Transactional id "tx" initialized, with ``partitions`` added to its
    transaction: its producer id and epoch."""
    init = await coordinator.init_producer_id("tx", TIMEOUT)
    pid, epoch = init.producer_id, init.producer_epoch
    await coordinator.add_partitions("tx", pid, epoch, list(partitions))
    return pid, epoch


async def states_become(
    coordinator: TransactionCoordinator, states: list[TransactionState]
) -> None:
    """Wait until the coordinator's transactions are in ``states``."""
    await eventually(lambda: [t.state for t in coordinator.list_transactions()] == states)


async def only_t0_marked(b: TxnBrokers) -> None:
    """The commit's marker reached t-0 only: t-1's transaction stays open,
    its last stable offset below it once its HW passed the record."""
    assert len(b.markers(2, 0)) == 1 and b.markers(3, 1) == []
    await eventually(lambda: b.data_log(3, 1).high_watermark == 1)
    assert b.data_log(3, 1).last_stable_offset == 0


def run(body: Callable[[TxnBrokers], Awaitable[T]]) -> T:
    async def main() -> T:
        brokers = TxnBrokers()
        brokers.start()
        try:
            await brokers.loaded(1, groups=True)
            return await asyncio.wait_for(body(brokers), 30)
        finally:
            await brokers.stop()

    return asyncio.run(main())


def produce(tid: str, partition: int, records: bytes) -> broker_pb2.ProduceRequest:
    request = broker_pb2.ProduceRequest(transactional_id=tid, acks=-1, timeout_ms=1000)
    request.topics.add(name="t").partitions.add(partition=partition, records=records)
    return request


async def send(
    brokers: TxnBrokers, tid: str, partition: int, pid: int, epoch: int, seq: int, value: bytes
) -> tuple[Errors, str] | None:
    """A transactional batch to the partition's leader, verified first as
    the service does: the refusal, or None once appended."""
    leader = 2 if partition == 0 else 3
    records = txn_batch(pid, epoch, seq, value)
    refused = await verify_produce(
        produce(tid, partition, records), brokers.brokers[leader], brokers.links[leader]
    )
    if ("t", partition) in refused:
        return refused[("t", partition)]
    brokers.brokers[leader].append(TopicIdPartition(DATA_ID, partition), records, -1, brokers.now)
    return None


def test_a_commit_writes_every_marker_then_completes() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        init = await coordinator.init_producer_id("tx", TIMEOUT)
        assert init.error is Errors.NONE
        pid, epoch = init.producer_id, init.producer_epoch
        added = await coordinator.add_partitions("tx", pid, epoch, [T0, T1])
        assert added.error is Errors.NONE
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        assert await send(b, "tx", 1, pid, epoch, 0, b"b") is None
        # Open: the last stable offset stays at the transaction's start.
        assert b.data_log(2, 0).last_stable_offset == 0
        end = await coordinator.end_txn("tx", pid, epoch, True)
        assert (end.error, end.producer_id, end.producer_epoch) == (Errors.NONE, pid, epoch + 1)

        await states_become(coordinator, [TransactionState.COMPLETE_COMMIT])
        coordinator_epoch = b.md.image.partition(TXN_TOPIC_ID, 0).leader_epoch  # type: ignore[union-attr]
        for partition, leader in ((0, 2), (1, 3)):
            ((marker_pid, marker_epoch, marker),) = b.markers(leader, partition)
            assert (marker_pid, marker_epoch) == (pid, epoch + 1)
            assert marker.type is ControlType.COMMIT
            assert marker.coordinator_epoch == coordinator_epoch
        await eventually(lambda: b.data_log(2, 0).last_stable_offset == 2)
        described = await coordinator.describe_transaction("tx")
        assert described.partitions == frozenset()

    run(body)


def test_kip890_a_produce_the_coordinator_does_not_vouch_for_is_refused() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        init = await coordinator.init_producer_id("tx", TIMEOUT)
        pid, epoch = init.producer_id, init.producer_epoch
        # No AddPartitionsToTxn yet: nothing vouches for the batch.
        refused = await send(b, "tx", 0, pid, epoch, 0, b"early")
        assert refused is not None and refused[0] is Errors.INVALID_TXN_STATE, refused
        assert b.data_log(2, 0).log_end_offset == 0
        await coordinator.add_partitions("tx", pid, epoch, [T0])
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        # A partition the transaction never added is refused even now.
        refused = await send(b, "tx", 1, pid, epoch, 0, b"b")
        assert refused is not None and refused[0] is Errors.INVALID_TXN_STATE
        end = await coordinator.end_txn("tx", pid, epoch, False)
        assert end.error is Errors.NONE
        await eventually(lambda: len(b.markers(2, 0)) == 1)
        # KAFKA-17754: a delayed write of the ended transaction (its old
        # epoch) is refused; it does not land in, or open, another one.
        late = await send(b, "tx", 0, pid, epoch, 1, b"late")
        assert late is not None and late[0] is Errors.INVALID_PRODUCER_EPOCH, late
        await eventually(lambda: b.data_log(2, 0).last_stable_offset == 2)
        # The next transaction at the bumped epoch, not yet added there:
        # refused too (a hanging transaction would start here otherwise).
        early = await send(b, "tx", 0, pid, end.producer_epoch, 0, b"next")
        assert early is not None and early[0] in (
            Errors.INVALID_TXN_STATE,
            Errors.NOT_ENOUGH_REPLICAS,
        ), early
        assert b.data_log(2, 0).last_stable_offset == b.data_log(2, 0).log_end_offset

    run(body)


def test_a_request_without_transactional_id_may_not_carry_transactional_batches() -> None:
    async def body(b: TxnBrokers) -> None:
        refused = await verify_produce(
            produce("", 0, txn_batch(7, 0, 0, b"x")), b.brokers[2], b.links[2]
        )
        assert refused[("t", 0)][0] is Errors.INVALID_RECORD

    run(body)


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        init = await coordinator.init_producer_id("tx", 100)
        pid, epoch = init.producer_id, init.producer_epoch
        await coordinator.add_partitions("tx", pid, epoch, [T0])
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        b.now += 1_000
        await states_become(coordinator, [TransactionState.COMPLETE_ABORT])
        ((_, marker_epoch, marker),) = b.markers(2, 0)
        assert marker.type is ControlType.ABORT and marker_epoch == epoch + 1
        fenced = await coordinator.add_partitions("tx", pid, epoch, [T0])
        assert fenced.error is Errors.PRODUCER_FENCED
        ended = await coordinator.end_txn("tx", pid, epoch, True)
        assert ended.error is Errors.PRODUCER_FENCED

    run(body)


def test_a_new_coordinator_writes_the_markers_of_a_prepared_transaction() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0, T1)
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        # Broker 1 cannot reach anyone: the decision is logged, no marker
        # gets out.
        b.down.add(1)
        end = await coordinator.end_txn("tx", pid, epoch, True)
        assert end.error is Errors.NONE
        await asyncio.sleep(0.01)
        assert b.markers(2, 0) == []
        # The transaction log's leadership moves to broker 2.
        b.step_and_publish(change(TXN_TOPIC_ID, 0, leader=2, isr=(2, 3)))
        await b.loaded(2)
        await states_become(b.txns[2], [TransactionState.COMPLETE_COMMIT])
        new_epoch = b.md.image.partition(TXN_TOPIC_ID, 0).leader_epoch  # type: ignore[union-attr]
        for partition, leader in ((0, 2), (1, 3)):
            ((_, marker_epoch, marker),) = b.markers(leader, partition)
            assert marker.type is ControlType.COMMIT and marker_epoch == epoch + 1
            assert marker.coordinator_epoch == new_epoch
        # The deposed coordinator's markers, sent late, are refused.
        b.down.discard(1)
        sent = [m for call in b.marker_calls for m in call[2] if m.partition == 0]
        stale = await b.appenders[2].append([sent[-1]], coordinator_epoch=new_epoch - 1)
        assert next(iter(stale.values()))[0] is Errors.TRANSACTION_COORDINATOR_FENCED

    run(body)


def test_read_committed_list_offsets_stop_at_the_last_stable_offset() -> None:
    async def body(b: TxnBrokers) -> None:
        service = BrokerService(b.brokers[2], ServiceSettings("c"), purgatory=b.purgatories[2])

        async def latest(isolation: int) -> int:
            request = broker_pb2.ListOffsetsRequest(isolation_level=isolation)  # type: ignore[arg-type]
            request.topics.add(name="t").partitions.add(partition=0, timestamp=-1)
            answer = await service.ListOffsets(request, PlaintextContext())
            part = answer.topics[0].partitions[0]
            assert part.error == Errors.NONE, part.message
            return part.offset

        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0)
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        await eventually(lambda: b.data_log(2, 0).high_watermark == 1)
        assert await latest(broker_pb2.READ_UNCOMMITTED) == 1
        assert await latest(broker_pb2.READ_COMMITTED) == 0
        await coordinator.end_txn("tx", pid, epoch, True)
        await eventually(lambda: b.data_log(2, 0).high_watermark == 2)
        assert await latest(broker_pb2.READ_COMMITTED) == 2

    run(body)


def test_describe_producers_shows_the_open_transaction_until_its_marker() -> None:
    async def body(b: TxnBrokers) -> None:
        service = BrokerService(b.brokers[2], ServiceSettings("c"), purgatory=b.purgatories[2])

        async def described() -> list[tuple[int, int, int]]:
            request = broker_pb2.DescribeProducersRequest()
            request.topics.add(name="t", partitions=[0, 1])
            answer = await service.DescribeProducers(request, PlaintextContext())
            first, second = answer.topics[0].partitions
            # Broker 2 leads t-0, not t-1: that one names its leader.
            assert second.error == Errors.NOT_LEADER_OR_FOLLOWER
            assert second.current_leader.leader_id == 3
            assert first.error == Errors.NONE, first.message
            return [
                (p.producer_id, p.producer_epoch, p.current_txn_start_offset)
                for p in first.active_producers
            ]

        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0)
        assert await described() == []
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        assert await described() == [(pid, epoch, 0)]
        await coordinator.end_txn("tx", pid, epoch, False)
        await eventually(lambda: len(b.markers(2, 0)) == 1)
        assert await described() == [(pid, epoch + 1, -1)]

    run(body)


def test_offsets_committed_in_a_transaction_move_the_group_only_at_its_commit() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator, groups = b.txns[1], b.groups[1]

        def commit(pid: int, epoch: int, offset: int) -> TxnOffsetCommitRequest:
            return TxnOffsetCommitRequest(
                "tx", "g", pid, epoch, "", -1, (CommitPartition("t", 0, offset),)
            )

        async def committed() -> list[tuple[int, Errors]]:
            answer = await groups.fetch_offsets(
                OffsetFetchRequest("g", (("t", 0),), require_stable=True)
            )
            return [(o.offset, o.error) for o in answer.offsets]

        init = await coordinator.init_producer_id("tx", TIMEOUT)
        pid, epoch = init.producer_id, init.producer_epoch
        # Not yet in the transaction: the coordinator does not vouch for it.
        refused = await groups.txn_commit_offsets(commit(pid, epoch, 5))
        assert refused.error is Errors.INVALID_TXN_STATE, refused
        assert (await coordinator.add_offsets("tx", pid, epoch, "g")).error is Errors.NONE
        for offset in (5, 7):
            answer = await groups.txn_commit_offsets(commit(pid, epoch, offset))
            assert answer.error is Errors.NONE and [p.error for p in answer.partitions] == [
                Errors.NONE
            ], answer
        assert await committed() == [(-1, Errors.UNSTABLE_OFFSET_COMMIT)]
        await coordinator.end_txn("tx", pid, epoch, True)
        await states_become(coordinator, [TransactionState.COMPLETE_COMMIT])
        assert await committed() == [(7, Errors.NONE)]
        # The next transaction's offsets, aborted, never show.
        epoch += 1
        await coordinator.add_offsets("tx", pid, epoch, "g")
        assert (await groups.txn_commit_offsets(commit(pid, epoch, 9))).error is Errors.NONE
        await coordinator.end_txn("tx", pid, epoch, False)
        await states_become(coordinator, [TransactionState.COMPLETE_ABORT])
        assert await committed() == [(7, Errors.NONE)]
        # A new coordinator of the group rebuilds the same from the log.
        b.step_and_publish(change(OFFSETS_TOPIC_ID, 0, leader=2, isr=(2, 3)))
        await eventually(lambda: b.groups[2].shard_states().get(0) is ShardState.ACTIVE)
        fetched = await b.groups[2].fetch_offsets(OffsetFetchRequest("g", (("t", 0),)))
        assert [o.offset for o in fetched.offsets] == [7]

    run(body)


def test_read_committed_fetches_stop_at_the_lso_and_name_the_aborted() -> None:
    async def body(b: TxnBrokers) -> None:
        service = BrokerService(b.brokers[2], ServiceSettings("c"), purgatory=b.purgatories[2])
        coordinator = b.txns[1]

        async def fetch(isolation: int) -> tuple[list[bytes], broker_pb2.FetchPartitionResponse]:
            request = broker_pb2.FetchRequest(
                max_bytes=1 << 20,
                isolation_level=isolation,  # type: ignore[arg-type]
            )
            request.topics.add(topic="t").partitions.add(
                partition=0, fetch_offset=0, current_leader_epoch=-1, last_fetched_epoch=-1
            )
            answer = await service.Fetch(request, PlaintextContext())
            part = answer.topics[0].partitions[0]
            assert part.error == Errors.NONE, part.message
            kept = (
                read_committed_batches(part.records, part.aborted_transactions)
                if isolation
                else (memoryview(batch) for batch in split_batches(part.records))
            )
            values = [
                r.value or b""
                for batch in kept
                if not BatchHeader.parse(batch).is_control
                for r in decode_records(batch)
            ]
            return values, part

        async def transaction(value: bytes, end: bool | None) -> None:
            pid, epoch = await begun(coordinator, T0)
            assert await send(b, "tx", 0, pid, epoch, 0, value) is None
            if end is not None:
                await coordinator.end_txn("tx", pid, epoch, end)
                await eventually(
                    lambda: (
                        [t.state for t in coordinator.list_transactions()]
                        in ([TransactionState.COMPLETE_COMMIT], [TransactionState.COMPLETE_ABORT])
                    )
                )

        await transaction(b"committed", True)
        await transaction(b"aborted", False)
        await transaction(b"open", None)
        await eventually(lambda: b.data_log(2, 0).high_watermark == 5)
        values, part = await fetch(broker_pb2.READ_COMMITTED)
        assert values == [b"committed"]
        assert part.last_stable_offset == 4 and part.high_watermark == 5
        assert [(a.first_offset) for a in part.aborted_transactions] == [2]
        values, part = await fetch(broker_pb2.READ_UNCOMMITTED)
        assert values == [b"committed", b"aborted", b"open"]
        assert not part.aborted_transactions

    run(body)


def test_every_shard_aborts_its_timed_out_transactions() -> None:
    """Timeouts are checked shard by shard: ids in different partitions of
    the transaction log each time out (a check shared by all shards once
    checked only the first)."""

    async def main() -> None:
        b = TxnBrokers(txn_partitions=3, timeout_check_interval_ms=1_000)
        b.start()
        try:
            await b.loaded(1)
            ids = ["tx", "tx-1", "tx-2", "tx-3", "tx-4"]
            partitions = {partition_for(t, 3) for t in ids}
            assert len(partitions) > 1, partitions
            coordinator = b.txns[1]
            for t in ids:
                init = await coordinator.init_producer_id(t, 100)
                await coordinator.add_partitions(t, init.producer_id, init.producer_epoch, [T0])
            for _ in range(3):
                b.now += 1_500
                await asyncio.sleep(0.01)
            await eventually(
                lambda: (
                    {x.state for x in coordinator.list_transactions()}
                    == {TransactionState.COMPLETE_ABORT}
                )
            )
        finally:
            await b.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_b21_a_commit_completes_with_its_first_marker_and_leaves_the_rest_open() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0, T1)
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        assert await send(b, "tx", 1, pid, epoch, 0, b"b") is None
        with bugs.injected(Bug.PARTIAL_COMMIT_MARKERS):
            await coordinator.end_txn("tx", pid, epoch, True)
            await states_become(coordinator, [TransactionState.COMPLETE_COMMIT])
        # t-1's transaction stays open: its last stable offset stops there.
        await only_t0_marked(b)

    run(body)


def test_a_leader_that_does_not_know_the_partition_yet_is_asked_again() -> None:
    """UNKNOWN_TOPIC_OR_PARTITION from a leader (a broker just restarted,
    its metadata behind) is retried: whether the topic is gone is the
    coordinator's own metadata's to say, or the marker would be dropped and
    the transaction left open in that partition."""

    async def body(b: TxnBrokers) -> None:
        appender = b.appenders[3]
        real = appender.append
        refused: list[Any] = []

        async def lagging(markers: Any, coordinator_epoch: int) -> Any:
            if len(refused) < 3:
                refused.append(markers)
                return {
                    (m.topic, m.partition): (Errors.UNKNOWN_TOPIC_OR_PARTITION, "not yet")
                    for m in markers
                }
            return await real(markers, coordinator_epoch)

        appender.append = lagging  # type: ignore[method-assign]
        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0, T1)
        assert await send(b, "tx", 1, pid, epoch, 0, b"b") is None
        await coordinator.end_txn("tx", pid, epoch, False)
        await states_become(coordinator, [TransactionState.COMPLETE_ABORT])
        assert len(refused) == 3
        ((_, _, marker),) = b.markers(3, 1)
        assert marker.type is ControlType.ABORT

    run(body)


async def fence(b: TxnBrokers, tid: str) -> tuple[int, int]:
    """A second producer's InitProducerId for ``tid``: the first one's open
    transaction is aborted, and the new (producer id, epoch)."""
    coordinator = b.txns[1]
    for _ in range(100):
        init = await coordinator.init_producer_id(tid, TIMEOUT)
        if init.error is Errors.NONE:
            return init.producer_id, init.producer_epoch
        assert init.error is Errors.CONCURRENT_TRANSACTIONS, init
        await asyncio.sleep(0.01)
    raise AssertionError("the fenced producer's transaction never completed its abort")


def committed_values(b: TxnBrokers, leader: int, partition: int) -> list[bytes]:
    log = b.data_log(leader, partition)
    return [
        r.value or b""
        for batch in read_committed_batches(
            log.read(0, 1 << 20, log.last_stable_offset),
            log.collect_aborted_transactions(0, log.last_stable_offset),
        )
        for r in decode_records(batch)
    ]


def test_b22_a_fenced_epochs_write_joins_its_successors_transaction() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        pid, zombie = await begun(coordinator, T0)
        assert await send(b, "tx", 0, pid, zombie, 0, b"zombie-1") is None
        # Its successor fences it (the zombie's transaction is aborted) and
        # opens its own transaction in the same partition.
        pid2, epoch = await fence(b, "tx")
        assert (pid2, epoch > zombie) == (pid, True)
        await eventually(lambda: len(b.markers(2, 0)) == 1)
        await coordinator.add_partitions("tx", pid, epoch, [T0])
        assert await send(b, "tx", 0, pid, epoch, 0, b"new") is None
        # The zombie, which has not learnt it is fenced, writes on.
        refused = await send(b, "tx", 0, pid, zombie, 1, b"zombie-2")
        assert refused is not None and refused[0] in (
            Errors.INVALID_PRODUCER_EPOCH,
            Errors.PRODUCER_FENCED,
        ), refused
        with bugs.injected(Bug.FENCED_EPOCH_PRODUCE):
            assert await send(b, "tx", 0, pid, zombie, 2, b"zombie-3") is None
        # The entry keeps the successor's epoch: its own writes go on.
        assert await send(b, "tx", 0, pid, epoch, 1, b"new-2") is None
        end = await coordinator.end_txn("tx", pid, epoch, True)
        assert end.error is Errors.NONE
        log = b.data_log(2, 0)
        await eventually(lambda: log.last_stable_offset == log.log_end_offset)
        # The zombie's first write was aborted, its third committed with
        # the successor's transaction: a torn transaction.
        assert committed_values(b, 2, 0) == [b"new", b"zombie-3", b"new-2"]

    run(body)


def test_b24_without_verification_an_unadded_partitions_write_hangs() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0)
        assert await send(b, "tx", 0, pid, epoch, 0, b"a") is None
        # t-1 was never added: KIP-890 part 1 refuses the write ...
        refused = await send(b, "tx", 1, pid, epoch, 0, b"b")
        assert refused is not None and refused[0] is Errors.INVALID_TXN_STATE, refused
        # ... and without it the write opens a transaction there.
        with bugs.injected(Bug.NO_TXN_VERIFICATION):
            assert await send(b, "tx", 1, pid, epoch, 0, b"b") is None
        end = await coordinator.end_txn("tx", pid, epoch, True)
        assert end.error is Errors.NONE
        await states_become(coordinator, [TransactionState.COMPLETE_COMMIT])
        # t-1's transaction has no marker: it stays open for good.
        await only_t0_marked(b)
        assert committed_values(b, 2, 0) == [b"a"]

    run(body)


def test_a_late_copy_of_the_last_commits_marker_does_not_end_the_next_transaction() -> None:
    async def body(b: TxnBrokers) -> None:
        coordinator = b.txns[1]
        pid, epoch = await begun(coordinator, T0)
        assert await send(b, "tx", 0, pid, epoch, 0, b"first") is None
        end = await coordinator.end_txn("tx", pid, epoch, True)
        await states_become(coordinator, [TransactionState.COMPLETE_COMMIT])
        # The next transaction writes t-0 at the bumped epoch, the epoch
        # the first one's marker carried.
        bumped = end.producer_epoch
        await coordinator.add_partitions("tx", pid, bumped, [T0])
        assert await send(b, "tx", 0, pid, bumped, 0, b"second") is None
        ((_, _, marker),) = b.markers(2, 0)
        late = TxnMarker("t", 0, pid, bumped, True, TRANSACTION_VERSION)
        answer = await b.appenders[2].append([late], marker.coordinator_epoch)
        error, message = answer[("t", 0)]
        assert error is Errors.INVALID_PRODUCER_EPOCH, answer
        assert "late marker" in message
        # The second transaction is still open: nothing of it is committed.
        log = b.data_log(2, 0)
        assert len(b.markers(2, 0)) == 1
        assert committed_values(b, 2, 0) == [b"first"]
        assert log.last_stable_offset == 2
        # An administrator's abort (version 0) at that epoch still ends it.
        admin = TxnMarker("t", 0, pid, bumped, False)
        answer = await b.appenders[2].append([admin], marker.coordinator_epoch)
        assert answer[("t", 0)][0] is Errors.NONE, answer
        await eventually(lambda: log.last_stable_offset == log.log_end_offset)
        assert committed_values(b, 2, 0) == [b"first"]

    run(body)

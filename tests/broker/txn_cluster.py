"""Three in-memory brokers, each with a group coordinator, a transaction
coordinator, a marker appender and links that reach the other brokers by
calling them directly (the process's gRPC links, without the network), over
one metadata log: the transaction runtime end to end, driven by a pump
that replicates and wakes every waiter between the test's steps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from broker.coordinator_runtime import CoordinatorFailure, ShardState
from broker.errors import Errors
from broker.group.placement import OFFSETS_TOPIC
from broker.group_coordinator import GroupCoordinator, OffsetsTopicSettings
from broker.producer_ids import BlockProducerIds, CountingBlocks
from broker.purgatory import Purgatory
from broker.txn.api import TxnMarker
from broker.txn.placement import TRANSACTION_STATE_TOPIC
from broker.txn.types import TopicPartition
from broker.txn_coordinator import (
    TransactionCoordinator,
    TransactionStateTopicSettings,
    TxnCoordinatorSettings,
)
from broker.txn_markers import TxnMarkerAppender
from metadata.image import TopicIdPartition
from partition_log.batch import BatchScanner, build_batch
from partition_log.log import PartitionLog
from partition_log.records import Record
from partition_log.txn import EndTxnMarker, read_marker
from tests.broker.images import topic
from tests.broker.test_replica_manager import Cluster

TXN_TOPIC_ID = "id-txn"
TXN_KEY = TopicIdPartition(TXN_TOPIC_ID, 0)
OFFSETS_TOPIC_ID = "id-offsets"
DATA_ID = "id-t"


class Links:
    """Markers and verifications straight to the brokers' objects; a
    broker in ``down`` answers nothing (a lost connection)."""

    def __init__(self, brokers: TxnBrokers, me: int) -> None:
        self.brokers = brokers
        self.me = me

    async def write_markers(
        self, leader_id: int, markers: Sequence[TxnMarker], coordinator_epoch: int
    ) -> Mapping[tuple[str, int], tuple[Errors, str]]:
        if leader_id in self.brokers.down or self.me in self.brokers.down:
            raise ConnectionError(f"broker {leader_id} is unreachable")
        self.brokers.marker_calls.append((self.me, leader_id, tuple(markers), coordinator_epoch))
        return await self.brokers.appenders[leader_id].append(markers, coordinator_epoch)

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> Mapping[TopicPartition, tuple[Errors, str]]:
        coordinator = self.brokers.coordinator_of_txns()
        if coordinator is None or coordinator in self.brokers.down:
            return dict.fromkeys(partitions, (Errors.COORDINATOR_NOT_AVAILABLE, "none"))
        try:
            return await self.brokers.txns[coordinator].verify_partitions(
                transactional_id, producer_id, producer_epoch, partitions
            )
        except CoordinatorFailure as failure:
            return dict.fromkeys(partitions, (failure.code, failure.message))


class TxnBrokers(Cluster):
    def __init__(
        self,
        data_replicas: Sequence[tuple[int, ...]] = ((2, 1, 3), (3, 1, 2)),
        *,
        txn_partitions: int = 1,
        timeout_check_interval_ms: int = 0,
    ) -> None:
        super().__init__()
        self.purgatories = {b: Purgatory() for b in self.brokers}
        self.down: set[int] = set()
        self.marker_calls: list[tuple[int, int, tuple[TxnMarker, ...], int]] = []
        ids = BlockProducerIds(CountingBlocks(first=1000, block_size=10))
        self.groups = {
            b: GroupCoordinator(
                b,
                manager,
                self.purgatories[b],
                topic=OffsetsTopicSettings(partitions=1, commit_timeout_ms=60_000),
                now_ms=lambda: self.now,
            )
            for b, manager in self.brokers.items()
        }
        self.appenders = {
            b: TxnMarkerAppender(
                manager, self.purgatories[b], self.groups[b], now_ms=lambda: self.now
            )
            for b, manager in self.brokers.items()
        }
        self.links = {b: Links(self, b) for b in self.brokers}
        for b, group in self.groups.items():
            group.txn_verifier = self.links[b]
        self.txns = {
            b: TransactionCoordinator(
                b,
                manager,
                self.purgatories[b],
                markers=self.links[b],
                producer_ids=ids,
                topic=TransactionStateTopicSettings(
                    partitions=txn_partitions, commit_timeout_ms=60_000
                ),
                settings=TxnCoordinatorSettings(
                    timeout_check_interval_ms=timeout_check_interval_ms,
                    marker_retry_backoff_ms=1,
                ),
                offsets_partitions=1,
                now_ms=lambda: self.now,
            )
            for b, manager in self.brokers.items()
        }
        self.step_and_publish(
            *topic(TRANSACTION_STATE_TOPIC, TXN_TOPIC_ID, *[(1, 2, 3)] * txn_partitions)
        )
        self.step_and_publish(*topic(OFFSETS_TOPIC, OFFSETS_TOPIC_ID, (1, 2, 3)))
        self.step_and_publish(*topic("t", DATA_ID, *data_replicas))
        self._pump: asyncio.Task[None] | None = None

    def step_and_publish(self, *records: object) -> None:
        self.step(*records)  # type: ignore[arg-type]
        for b in self.brokers:
            image = self.brokers[b].image
            self.groups[b].on_image(image)
            self.txns[b].on_image(image)
            self.purgatories[b].wake_all()

    def wake(self) -> None:
        for purgatory in self.purgatories.values():
            purgatory.wake_all()

    def start(self) -> None:
        async def pump() -> None:
            while True:
                self.replicate(1)
                self.wake()
                await asyncio.sleep(0)

        self._pump = asyncio.get_running_loop().create_task(pump())

    def coordinator_of_txns(self) -> int | None:
        registration = self.md.image.partition(TXN_TOPIC_ID, 0)
        return None if registration is None else registration.leader

    async def loaded(self, broker: int, *, groups: bool = False) -> None:
        """The broker's transaction shard is loaded (and its group shard)."""
        for _ in range(1000):
            if self.txns[broker].shard_states().get(0) is ShardState.ACTIVE and (
                not groups or self.groups[broker].shard_states().get(0) is ShardState.ACTIVE
            ):
                return
            await asyncio.sleep(0)
        raise AssertionError(f"broker {broker} did not load: {self.txns[broker].shard_states()}")

    async def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        for txn in self.txns.values():
            await txn.stop()
        for group in self.groups.values():
            await group.stop()

    def data_log(self, broker: int, partition: int) -> PartitionLog:
        return self.log(broker, TopicIdPartition(DATA_ID, partition))

    def markers(self, broker: int, partition: int) -> list[tuple[int, int, EndTxnMarker]]:
        """(producer id, epoch, marker) of each control batch in a data log."""
        log = self.data_log(broker, partition)
        data = log.read(log.log_start_offset, 1 << 20)
        out = []
        for found in BatchScanner(data):
            if found.header.is_control:
                batch = data[found.position : found.end]
                out.append(
                    (
                        found.header.producer_id,
                        found.header.producer_epoch,
                        read_marker(batch, found.header),
                    )
                )
        return out


def txn_batch(producer_id: int, epoch: int, sequence: int, *values: bytes) -> bytes:
    return build_batch(
        [Record(i, 1000, b"k", v) for i, v in enumerate(values)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=True,
    )


async def eventually(check: object, turns: int = 5000) -> None:
    for _ in range(turns):
        if callable(check) and check():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")

"""The transaction coordinator at run time: the shards of
:class:`broker.txn.coordinator.TransactionCoordinatorShard` over the
broker's replicas of ``__transaction_state``, on the runtime every
coordinator shares (:mod:`broker.coordinator_runtime`), and the writing of
each ended transaction's markers (Kafka's ``TransactionCoordinator`` with
its ``TransactionMarkerChannelManager``).

A transaction ends in two steps.  EndTxn (or a timeout, or a fence by
InitProducerId) writes PREPARE_COMMIT or PREPARE_ABORT at the bumped epoch;
once that record is committed the decision stands and EndTxn is answered.
Then the coordinator asks the leader of each of the transaction's
partitions to append the COMMIT or ABORT marker (WriteTxnMarkers, through
the :class:`MarkerWriter` seam), stamped with its coordinator epoch (the
leader epoch of its ``__transaction_state`` partition, so a partition
refuses a deposed coordinator's markers), retrying until every partition
has it or its topic is gone; then it writes COMPLETE_COMMIT or
COMPLETE_ABORT.  A new coordinator loads the log below the high watermark
and writes the markers of every transaction it finds prepared (markers are
idempotent on the partitions).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import bugs
from broker.coordinator_runtime import (
    CoordinatorFailure,
    CoordinatorRuntime,
    InternalTopicSettings,
    ShardContext,
    StoredRecordError,
)
from broker.errors import Errors
from broker.group.placement import OFFSETS_TOPIC
from broker.producer_ids import ProducerIdsError, ProducerIdSource
from broker.purgatory import Operation, Purgatory
from broker.replica_manager import ReplicaManager
from broker.txn import codec
from broker.txn.api import (
    AddPartitionsResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    PendingMarkers,
    TransactionDescription,
    TransactionListing,
    TxnMarker,
)
from broker.txn.coordinator import TransactionCoordinatorShard, TxnConfig
from broker.txn.placement import TRANSACTION_STATE_TOPIC, partition_for
from broker.txn.records import TxnRecord
from broker.txn.types import TopicPartition, TransactionState
from bugs import Bug

__all__ = [
    "MarkerWriter",
    "TransactionCoordinator",
    "TransactionStateTopicSettings",
    "TxnCoordinatorSettings",
]

log = logging.getLogger(__name__)

TransactionStateTopicSettings = InternalTopicSettings
"""``transaction.state.log.*``: the transaction log as the coordinator
creates and writes it."""

_Context = ShardContext[TransactionCoordinatorShard]

# Errors after which a marker is written again (the partition's leader
# moved, its ISR is short, it timed out, or no answer came).
_RETRIABLE = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.NOT_ENOUGH_REPLICAS,
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        Errors.REQUEST_TIMED_OUT,
        Errors.KAFKA_STORAGE_ERROR,
        Errors.UNKNOWN_SERVER_ERROR,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.NOT_COORDINATOR,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        # A leader that has not yet learned of the partition (a broker
        # just restarted, its image behind): whether the topic is gone is
        # this coordinator's own image's to say (_leader_of), never a
        # leader's answer, or a marker would be dropped and its
        # transaction left open in the partition.
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
    }
)


@dataclass(frozen=True, slots=True)
class TxnCoordinatorSettings:
    """The coordinator's timing (``TransactionStateManagerConfig``)."""

    # transaction.abort.timed.out.transaction.cleanup.interval.ms (Kafka:
    # 10 s; kq checks at the runtime's tick, so a timeout is felt sooner).
    timeout_check_interval_ms: int = 1_000
    # The first wait before a marker is written again; doubled up to the
    # cap (TransactionMarkerChannelManager retries at its send loop).
    marker_retry_backoff_ms: int = 50
    marker_retry_backoff_max_ms: int = 1_000


class MarkerWriter(Protocol):
    """Writes markers on the leader of their partitions (WriteTxnMarkers):
    the process sends them to ``leader_id``, or appends them here if that
    is this broker.  Answers each partition's error; an exception means no
    answer came (all retried)."""

    async def write_markers(
        self, leader_id: int, markers: Sequence[TxnMarker], coordinator_epoch: int
    ) -> Mapping[tuple[str, int], tuple[Errors, str]]: ...


class _IdStock:
    """Producer ids at hand, so that a decision never waits: the shard's
    synchronous :class:`broker.txn.api.ProducerIdAllocator` over the
    broker's asynchronous source, filled before each decision that may
    draw one.  An id drawn for a decision whose records are never written
    is skipped, as Kafka skips it."""

    def __init__(self, source: ProducerIdSource | None) -> None:
        self._source = source
        self._ids: collections.deque[int] = collections.deque()

    async def fill(self, count: int = 2) -> None:
        if self._source is None:
            return
        while len(self._ids) < count:
            self._ids.append(await self._source.next_producer_id())

    def next_producer_id(self) -> int:
        if not self._ids:
            raise ProducerIdsError("no producer id at hand (the controller has not answered)")
        return self._ids.popleft()


class TransactionCoordinator(CoordinatorRuntime[TransactionCoordinatorShard, TxnRecord]):
    """Every transaction shard this broker runs, the requests on them, and
    the markers of the transactions they end."""

    holds = "transactions"
    write_operation = Operation.TXN_WRITE
    load_operation = Operation.TXN_LOAD

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        purgatory: Purgatory,
        *,
        markers: MarkerWriter | None,
        producer_ids: ProducerIdSource | None,
        config: TxnConfig | None = None,
        topic: TransactionStateTopicSettings | None = None,
        settings: TxnCoordinatorSettings | None = None,
        offsets_partitions: int = 50,
        now_ms: Callable[[], int],
        create_topic: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            broker_id,
            replicas,
            purgatory,
            topic_name=TRANSACTION_STATE_TOPIC,
            topic=topic or TransactionStateTopicSettings(),
            now_ms=now_ms,
            create_topic=create_topic,
        )
        self.config = config or TxnConfig()
        self.settings = settings or TxnCoordinatorSettings()
        # Who writes the markers; the process sets it once its links exist
        # (they need this coordinator too).  None writes nothing: every
        # marker waits, retried, until one is set.
        self.markers = markers
        # offsets.topic.num.partitions: where AddOffsetsToTxn places a
        # group whose offsets topic does not exist yet.
        self.offsets_partitions = offsets_partitions
        self._ids = _IdStock(producer_ids)
        # Each transaction whose markers are being written, by id.
        self._completing: dict[str, asyncio.Task[None]] = {}
        # When each shard's timeouts were last checked, by partition.
        self._last_timeout_check: dict[int, int] = {}

    # -- the runtime's hooks ------------------------------------------------------------

    def _new_shard(self, partition: int) -> TransactionCoordinatorShard:
        return TransactionCoordinatorShard(self.config, self._ids)

    def _partition_for(self, key: str, partitions: int) -> int:
        return partition_for(key, partitions)

    def _encode(self, record: TxnRecord) -> tuple[bytes, bytes | None]:
        return codec.encode(record)

    def _decode(self, key: bytes, value: bytes | None) -> TxnRecord:
        try:
            return codec.decode(key, value)
        except codec.TxnRecordError as error:
            raise StoredRecordError(str(error)) from None

    def _replay(
        self,
        context: _Context,
        record: TxnRecord,
        offset: int,
        producer_id: int,
        producer_epoch: int,
    ) -> None:
        context.shard.replay(record)

    def _loaded(self, context: _Context) -> None:
        for pending in context.shard.become_loaded(self.now_ms()):
            self._complete(context, pending)

    def _tick(self, context: _Context) -> None:
        now = self.now_ms()
        last = self._last_timeout_check.get(context.partition, 0)
        if now - last < self.settings.timeout_check_interval_ms:
            return
        self._last_timeout_check[context.partition] = now
        asyncio.get_running_loop().create_task(
            self._abort_timed_out(context), name=f"transactions-{self.broker_id}-timeouts"
        )

    def _extra_tasks(self) -> list[asyncio.Task[None]]:
        return list(self._completing.values())

    # -- finding an id's shard -----------------------------------------------------------

    def _context_for(self, transactional_id: str) -> _Context:
        if not transactional_id:
            raise CoordinatorFailure(Errors.INVALID_REQUEST, "transactional_id is empty")
        return self.context_for(transactional_id, f"transactional id {transactional_id!r}")

    def partition_of(self, transactional_id: str) -> int | None:
        """The id's partition of ``__transaction_state``, None while the
        topic does not exist."""
        topic = self.replicas.image.topic_by_name(TRANSACTION_STATE_TOPIC)
        return None if topic is None else partition_for(transactional_id, len(topic.partitions))

    # -- the requests ---------------------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> InitProducerIdResponse:
        """``handleInitProducerId``; a fence of an ongoing transaction
        starts its abort's markers and answers CONCURRENT_TRANSACTIONS (the
        producer retries until the abort completes)."""
        # Refused at once if not here; asked again after the wait for ids
        # (the shard may have moved meanwhile).
        self._context_for(transactional_id)
        await self._fill_ids()
        context = self._context_for(transactional_id)
        result = context.shard.init_producer_id(
            transactional_id, timeout_ms, producer_id, producer_epoch, now_ms=self.now_ms()
        )
        answer = await self._write(context, result.records, result.response)
        if answer.pending is not None:
            self._complete(context, answer.pending)
        return answer

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> AddPartitionsResponse:
        context = self._context_for(transactional_id)
        result = context.shard.add_partitions(
            transactional_id, producer_id, producer_epoch, partitions, self.now_ms()
        )
        return await self._write(context, result.records, result.response)

    async def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, tuple[Errors, str]]:
        """KIP-890 part 1's check for a partition's leader, answered once
        every earlier write of the shard has committed (an ongoing state
        that could still be lost verifies nothing)."""
        context = self._context_for(transactional_id)
        found = context.shard.verify_partitions(
            transactional_id, producer_id, producer_epoch, partitions
        )
        return await self._write(context, (), found)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> AddPartitionsResponse:
        context = self._context_for(transactional_id)
        offsets = self.replicas.image.topic_by_name(OFFSETS_TOPIC)
        count = self.offsets_partitions if offsets is None else len(offsets.partitions)
        result = context.shard.add_offsets(
            transactional_id, producer_id, producer_epoch, group_id, count, self.now_ms()
        )
        return await self._write(context, result.records, result.response)

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> EndTxnResponse:
        """``handleEndTransaction``: answered once PREPARE_COMMIT or
        PREPARE_ABORT is committed (the outcome is then decided); the
        markers are written after."""
        await self._fill_ids()
        context = self._context_for(transactional_id)
        result = context.shard.end_txn(
            transactional_id, producer_id, producer_epoch, commit, self.now_ms()
        )
        answer = await self._write(context, result.records, result.response)
        if answer.pending is not None:
            self._complete(context, answer.pending)
        return answer

    def list_transactions(
        self, states: Iterable[TransactionState] = (), producer_ids: Iterable[int] = ()
    ) -> list[TransactionListing]:
        wanted_states, wanted_ids = list(states), list(producer_ids)
        out: list[TransactionListing] = []
        for context in self.active_contexts():
            out.extend(context.shard.list_transactions(wanted_states, wanted_ids))
        return sorted(out, key=lambda t: t.transactional_id)

    async def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        context = self._context_for(transactional_id)
        return await self._write(context, (), context.shard.describe_transaction(transactional_id))

    async def _fill_ids(self) -> None:
        try:
            await self._ids.fill()
        except ProducerIdsError as error:
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE, f"no producer ids: {error}"
            ) from None

    # -- timeouts -------------------------------------------------------------------------

    async def _abort_timed_out(self, context: _Context) -> None:
        """``abortTimedOutTransactions``: each ongoing transaction past its
        timeout is aborted at a bumped epoch (its producer fenced)."""
        try:
            await self._ids.fill()
        except ProducerIdsError as error:
            log.warning("broker %d: timeouts not checked: %s", self.broker_id, error)
            return
        if not self._leads(context):
            return
        result = context.shard.tick(self.now_ms())
        if not result.records:
            return
        try:
            await self._write(context, result.records, None)
        except CoordinatorFailure as failure:
            # Checked again at the next tick: the transactions are still due.
            log.warning("broker %d: %s", self.broker_id, failure.message)
            return
        for pending in result.response:
            log.info(
                "broker %d: transactional id %r timed out: aborting at epoch %d",
                self.broker_id,
                pending.transactional_id,
                pending.producer_epoch,
            )
            self._complete(context, pending)

    # -- markers --------------------------------------------------------------------------

    def _complete(self, context: _Context, pending: PendingMarkers) -> None:
        running = self._completing.get(pending.transactional_id)
        if running is not None and not running.done():
            return
        task = asyncio.get_running_loop().create_task(
            self._write_markers_then_complete(context, pending),
            name=f"transactions-{self.broker_id}-markers-{pending.transactional_id}",
        )
        self._completing[pending.transactional_id] = task
        task.add_done_callback(lambda t: self._forget(pending.transactional_id, t))

    def _forget(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        if self._completing.get(transactional_id) is task:
            del self._completing[transactional_id]

    async def _write_markers_then_complete(
        self, context: _Context, pending: PendingMarkers
    ) -> None:
        if not await self._write_markers(context, pending):
            return
        if not self._leads(context):
            return
        result = context.shard.complete_txn(
            pending.transactional_id, pending.producer_id, pending.producer_epoch, self.now_ms()
        )
        if result.response.error is not Errors.NONE:
            log.warning(
                "broker %d: transactional id %r not completed: %s",
                self.broker_id,
                pending.transactional_id,
                result.response.message,
            )
            return
        try:
            await self._write(context, result.records, None)
        except CoordinatorFailure as failure:
            # A new coordinator loads PREPARE_* and writes the markers again.
            log.warning("broker %d: %s", self.broker_id, failure.message)

    def _leader_of(self, marker: TxnMarker) -> int | None:
        """The leader of a marker's partition, -1 while it has none, None
        if the partition is gone (its marker is no longer needed)."""
        topic = self.replicas.image.topic_by_name(marker.topic)
        if topic is None:
            return None
        registration = topic.partition(marker.partition)
        if registration is None:
            return None
        return registration.leader

    async def _write_markers(self, context: _Context, pending: PendingMarkers) -> bool:
        """Write every marker of ``pending`` (``TransactionMarkerChannelManager``):
        whether all are written, False if the coordinator lost its shard or
        a partition refused the coordinator as stale."""
        markers = pending.markers
        if pending.commit and bugs.on(Bug.PARTIAL_COMMIT_MARKERS):
            # B21: the commit completes with its first partition's marker.
            markers = markers[:1]
        remaining = {(m.topic, m.partition): m for m in markers}
        backoff = self.settings.marker_retry_backoff_ms / 1000
        while remaining:
            if not self._leads(context):
                return False
            by_leader: dict[int, list[TxnMarker]] = {}
            for tp, marker in list(remaining.items()):
                leader = self._leader_of(marker)
                if leader is None:
                    # The topic was deleted: Kafka drops its markers.
                    del remaining[tp]
                elif leader >= 0:
                    by_leader.setdefault(leader, []).append(marker)
            writer = self.markers
            sends = list(by_leader.items()) if writer is not None else []
            answers = await asyncio.gather(
                *(
                    writer.write_markers(b, ms, context.leader_epoch)
                    for b, ms in sends
                    if writer is not None
                ),
                return_exceptions=True,
            )
            for (leader, sent), answer in zip(sends, answers, strict=True):
                if isinstance(answer, BaseException):
                    if isinstance(answer, asyncio.CancelledError):
                        raise answer
                    log.info(
                        "broker %d: markers of %r to broker %d: %s",
                        self.broker_id,
                        pending.transactional_id,
                        leader,
                        answer,
                    )
                    continue
                for marker in sent:
                    tp = (marker.topic, marker.partition)
                    error, message = answer.get(
                        tp, (Errors.UNKNOWN_SERVER_ERROR, "the leader's answer left it out")
                    )
                    if error is Errors.NONE:
                        remaining.pop(tp, None)
                    elif error not in _RETRIABLE:
                        # TRANSACTION_COORDINATOR_FENCED, INVALID_PRODUCER_EPOCH:
                        # a newer coordinator decides this id now.
                        log.warning(
                            "broker %d: marker of %r on %s-%d refused (%s): %s",
                            self.broker_id,
                            pending.transactional_id,
                            marker.topic,
                            marker.partition,
                            error.name,
                            message,
                        )
                        return False
            if remaining:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.marker_retry_backoff_max_ms / 1000)
        return True

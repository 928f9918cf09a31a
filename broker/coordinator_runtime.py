"""A coordinator at run time: asyncio glue between the broker's replicas
of an internal topic and the pure decisions of a coordinator shard (Kafka's
``CoordinatorRuntime`` with its ``PartitionWriter`` and
``CoordinatorLoader``), shared by the group coordinator
(``__consumer_offsets``, :mod:`broker.group_coordinator`) and the
transaction coordinator (``__transaction_state``,
:mod:`broker.txn_coordinator`).

One shard per partition of the topic this broker leads.  When the broker
becomes the partition's leader (a new leader epoch), a new shard is built
from the partition's log: it waits until the high watermark reaches the
log end it found (every record of earlier leaders committed or gone), then
replays the records from the log start to the high watermark, never
anything from memory or from what an earlier coordinator answered.  Until
then requests are answered ``COORDINATOR_LOAD_IN_PROGRESS``.  When the
broker stops leading the partition the shard is dropped, with every answer
still waiting (``NOT_COORDINATOR``).

A write decides on the shard, appends its records to the leader's log and
replays them into the shard without awaiting in between (so the next
decision sees them), then waits until the high watermark of the same
leader epoch passes them: only then is the answer given (KAFKA-20634
answered a commit the log had lost).  A read is computed at once and
answered once every earlier write of its shard has committed, so no answer
shows state that could still be lost.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from broker.errors import Errors, ReplicaError
from broker.purgatory import Operation, Purgatory
from broker.replica import Role
from broker.replica_manager import NotLeaderError, ReplicaManager
from metadata.image import MetadataImage, TopicIdPartition
from partition_log import BatchHeader, Record, build_batch, decode_records
from partition_log.batch import NO_SEQUENCE, split_batches
from partition_log.errors import PartitionLogError
from partition_log.log import AppendOrigin
from partition_log.txn import EndTxnMarker, build_marker_batch, read_marker

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "CoordinatorFailure",
    "CoordinatorRuntime",
    "InternalTopicSettings",
    "ShardContext",
    "ShardState",
    "StoredRecordError",
]

log = logging.getLogger(__name__)

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

# How much of the log one read of a load takes.
_LOAD_READ_BYTES = 1024 * 1024
# A marker's refusals by the producer state: a stale producer or
# coordinator epoch, which no retry changes.
_FENCED_MARKER = frozenset({Errors.INVALID_PRODUCER_EPOCH, Errors.TRANSACTION_COORDINATOR_FENCED})


@dataclass(frozen=True, slots=True)
class InternalTopicSettings:
    """An internal topic as its coordinator creates and writes it
    (``GroupCoordinatorConfig``'s ``offsets.topic.*``,
    ``TransactionLogConfig``'s ``transaction.state.log.*``: the same
    defaults)."""

    # num.partitions
    partitions: int = 50
    # replication.factor
    replication_factor: int = 3
    # The topic's min.insync.replicas (at most its replication factor): a
    # write is answered only once this many replicas hold it, so that an
    # acknowledged change survives the loss of its coordinator (Kafka's
    # offsets topic takes the brokers' default, 1;
    # transaction.state.log.min.isr is 2).
    min_insync_replicas: int = 2
    # segment.bytes
    segment_bytes: int = 100 * 1024 * 1024
    # offsets.commit.timeout.ms: how long a write waits for the ISR.
    commit_timeout_ms: int = 5_000
    # How often the shards' timers (sessions, expiry, timeouts) are checked.
    tick_interval_ms: int = 100


class ShardState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"


class CoordinatorFailure(Exception):
    """A request this broker cannot serve for its key: ``code`` (one of
    NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
    COORDINATOR_LOAD_IN_PROGRESS) and why."""

    def __init__(self, code: Errors, message: str, partition: int = -1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.partition = partition


class StoredRecordError(Exception):
    """A record of the internal topic that cannot be read back: the load
    fails and the shard answers COORDINATOR_NOT_AVAILABLE naming it."""


@dataclass(eq=False)
class ShardContext(Generic[S]):
    """One shard and where it writes."""

    partition: int
    key: TopicIdPartition
    leader_epoch: int
    shard: S
    state: ShardState = ShardState.LOADING
    # The offset after the last record written (committed or not).
    last_written: int = 0
    failure: str = ""
    loader: asyncio.Task[None] | None = field(default=None, repr=False)


class CoordinatorRuntime(abc.ABC, Generic[S, R]):
    """Every shard of one internal topic this broker runs, and the writes
    and reads on them.  A subclass says how a shard is made, how its
    records are stored and read back, and what its timers do."""

    # What the shards hold, for messages ("groups", "transactions").
    holds = "records"
    write_operation = Operation.GROUP_WRITE
    load_operation = Operation.GROUP_LOAD

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        purgatory: Purgatory,
        *,
        topic_name: str,
        topic: InternalTopicSettings,
        now_ms: Callable[[], int],
        create_topic: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.replicas = replicas
        self.purgatory = purgatory
        self.topic_name = topic_name
        self.topic = topic
        self.now_ms = now_ms
        self._create_topic = create_topic
        self._creating: asyncio.Task[None] | None = None
        # Why the last attempt to create the topic failed, if it did.
        self._create_error = ""
        self._contexts: dict[int, ShardContext[S]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._stopped = False

    # -- what a subclass says -------------------------------------------------------

    @abc.abstractmethod
    def _new_shard(self, partition: int) -> S:
        """An empty shard for ``partition``."""

    @abc.abstractmethod
    def _encode(self, record: R) -> tuple[bytes, bytes | None]:
        """A record's stored key and value."""

    @abc.abstractmethod
    def _decode(self, key: bytes, value: bytes | None) -> R:
        """A stored record read back (a :class:`StoredRecordError` naming
        what is wrong if it cannot be)."""

    def _replay_stored(
        self, context: ShardContext[S], record: Record, producer_id: int, producer_epoch: int
    ) -> None:
        """Replay one stored record read back from the log; ``producer_id``
        is the batch's if it is transactional, else NO_PRODUCER_ID."""
        assert record.key is not None
        decoded = self._decode(record.key, record.value)
        self._replay(context, decoded, record.offset, producer_id, producer_epoch)

    @abc.abstractmethod
    def _replay(
        self,
        context: ShardContext[S],
        record: R,
        offset: int,
        producer_id: int,
        producer_epoch: int,
    ) -> None:
        """Replay one record just appended at ``offset``."""

    def _replay_marker(
        self, context: ShardContext[S], producer_id: int, producer_epoch: int, marker: EndTxnMarker
    ) -> None:
        """Replay a transaction's marker in the topic (only the offsets
        topic holds them: a transaction's offsets commit or abort)."""

    @abc.abstractmethod
    def _loaded(self, context: ShardContext[S]) -> None:
        """The shard has replayed the log below the HW and goes active."""

    @abc.abstractmethod
    def _tick(self, context: ShardContext[S]) -> None:
        """The shard's timers."""

    @abc.abstractmethod
    def _partition_for(self, key: str, partitions: int) -> int:
        """The partition of the topic that holds ``key``."""

    def _on_resign(self, context: ShardContext[S]) -> None:
        """The broker no longer leads ``context``'s partition."""

    def _new_context(self, partition: int, key: TopicIdPartition, epoch: int) -> bool:
        """A chance to set up a context other than by loading it; whether
        one was."""
        return False

    # -- leadership ---------------------------------------------------------------

    def shard_states(self) -> dict[int, ShardState]:
        return {p: c.state for p, c in sorted(self._contexts.items())}

    def on_image(self, image: MetadataImage) -> None:
        """After the replica manager applied an image: load a shard for
        each partition of the topic led here at a new epoch, drop the
        others."""
        if self._stopped:
            return
        topic = image.topic_by_name(self.topic_name)
        led: dict[int, tuple[TopicIdPartition, int]] = {}
        if topic is not None:
            for partition in range(len(topic.partitions)):
                key = TopicIdPartition(topic.topic_id, partition)
                replica = self.replicas.replicas.get(key)
                if replica is not None and replica.role is Role.LEADER:
                    led[partition] = (key, replica.leader_epoch)
        for partition, context in list(self._contexts.items()):
            now = led.get(partition)
            if now is None or now != (context.key, context.leader_epoch):
                self._resign(context)
        for partition, (key, epoch) in led.items():
            if partition not in self._contexts:
                self._become_coordinator(partition, key, epoch)
        if self._contexts and self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(
                self._tick_loop(), name=f"{self.holds}-{self.broker_id}-tick"
            )

    def _become_coordinator(self, partition: int, key: TopicIdPartition, epoch: int) -> None:
        if self._new_context(partition, key, epoch):
            return
        context = ShardContext(partition, key, epoch, self._new_shard(partition))
        self._contexts[partition] = context
        context.loader = asyncio.get_running_loop().create_task(
            self._load(context), name=f"{self.holds}-{self.broker_id}-load-{partition}"
        )
        log.info(
            "broker %d: loading the %s of %s-%d at leader epoch %d",
            self.broker_id,
            self.holds,
            self.topic_name,
            partition,
            epoch,
        )

    def _resign(self, context: ShardContext[S]) -> None:
        del self._contexts[context.partition]
        self._on_resign(context)
        if context.loader is not None and not context.loader.done():
            context.loader.cancel()
        log.info(
            "broker %d: no longer coordinates %s-%d (leader epoch %d)",
            self.broker_id,
            self.topic_name,
            context.partition,
            context.leader_epoch,
        )
        # Every answer waiting on it checks again and finds it gone.
        self.purgatory.wake(context.key)

    def _leads(self, context: ShardContext[S]) -> bool:
        if self._contexts.get(context.partition) is not context:
            return False
        replica = self.replicas.replicas.get(context.key)
        return (
            replica is not None
            and replica.role is Role.LEADER
            and replica.leader_epoch == context.leader_epoch
        )

    def active_contexts(self) -> list[ShardContext[S]]:
        """The loaded shards this broker still leads, by partition."""
        return [
            c
            for _, c in sorted(self._contexts.items())
            if c.state is ShardState.ACTIVE and self._leads(c)
        ]

    async def _load(self, context: ShardContext[S]) -> None:
        """Rebuild the shard from the log below the high watermark
        (``CoordinatorLoaderImpl.load``)."""
        replica = self.replicas.replicas.get(context.key)
        if replica is None:
            return
        target = replica.log.log_end_offset

        def caught_up() -> bool | None:
            if not self._leads(context):
                return False
            return True if replica.log.high_watermark >= target else None

        while True:
            found = await self.purgatory.wait_until(
                (context.key,), caught_up, 1.0, operation=self.load_operation
            )
            if found is False:
                return
            if found:
                break
        try:
            end = self._replay_log(context)
        except (PartitionLogError, StoredRecordError) as error:
            context.state = ShardState.FAILED
            context.failure = str(error)
            log.error(
                "broker %d: cannot load the %s of %s-%d: %s",
                self.broker_id,
                self.holds,
                self.topic_name,
                context.partition,
                error,
            )
            self.purgatory.wake(context.key)
            return
        context.last_written = end
        context.state = ShardState.ACTIVE
        self._loaded(context)
        log.info(
            "broker %d: loaded the %s of %s-%d up to offset %d",
            self.broker_id,
            self.holds,
            self.topic_name,
            context.partition,
            end,
        )
        self.purgatory.wake(context.key)

    def _replay_log(self, context: ShardContext[S]) -> int:
        partition_log = self.replicas.logs.log(context.key)
        if partition_log is None:
            raise StoredRecordError(f"no log for {self.topic_name}-{context.partition}")
        high_watermark = partition_log.high_watermark
        offset = partition_log.log_start_offset
        while offset < high_watermark:
            data = partition_log.read(offset, _LOAD_READ_BYTES, high_watermark)
            if not data:
                break
            for batch in split_batches(data):
                header = BatchHeader.parse(batch)
                producer = (
                    (header.producer_id, header.producer_epoch)
                    if header.is_transactional
                    else (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
                )
                if header.is_control:
                    if header.base_offset >= offset:
                        self._replay_marker(context, *producer, read_marker(batch, header))
                else:
                    for record in decode_records(batch):
                        if offset <= record.offset < high_watermark:
                            self._replay_checked(context, record, *producer)
                offset = max(offset, header.next_offset)
        return high_watermark

    def _replay_checked(
        self, context: ShardContext[S], record: Record, producer_id: int, producer_epoch: int
    ) -> None:
        if record.key is None:
            raise StoredRecordError(
                f"{self.topic_name}-{context.partition} offset {record.offset}: a record "
                "without a key"
            )
        try:
            self._replay_stored(context, record, producer_id, producer_epoch)
        except StoredRecordError as error:
            raise StoredRecordError(
                f"{self.topic_name}-{context.partition} offset {record.offset}: {error}"
            ) from None

    # -- finding a key's shard ----------------------------------------------------------

    def context_for(self, key: str, what: str) -> ShardContext[S]:
        """The active shard of ``key`` (``what`` names it in messages, e.g.
        "group 'g'"), or a :class:`CoordinatorFailure` saying why not."""
        topic = self.replicas.image.topic_by_name(self.topic_name)
        if topic is None:
            self.ensure_topic()
            why = (
                f"creating it failed: {self._create_error}"
                if self._create_error
                else "it is being created"
            )
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"the topic {self.topic_name} does not exist yet ({why})",
            )
        partition = self._partition_for(key, len(topic.partitions))
        context = self._contexts.get(partition)
        if context is None or not self._leads(context):
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR,
                f"broker {self.broker_id} does not coordinate {what} (its "
                f"partition {self.topic_name}-{partition} is led elsewhere)",
                partition,
            )
        if context.state is ShardState.LOADING:
            raise CoordinatorFailure(
                Errors.COORDINATOR_LOAD_IN_PROGRESS,
                f"broker {self.broker_id} is loading the {self.holds} of "
                f"{self.topic_name}-{partition}",
                partition,
            )
        if context.state is ShardState.FAILED:
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"broker {self.broker_id} could not load {self.topic_name}-{partition}: "
                f"{context.failure}",
                partition,
            )
        return context

    def ensure_topic(self) -> None:
        """Ask the controller for the topic, once at a time."""
        if self.replicas.image.topic_by_name(self.topic_name) is not None:
            return
        if self._create_topic is None or self._stopped:
            return
        if self._creating is not None and not self._creating.done():
            return

        async def create() -> None:
            assert self._create_topic is not None
            try:
                await self._create_topic()
            except Exception as error:  # retried by the next request
                self._create_error = str(error)
                log.warning(
                    "broker %d: creating %s failed: %s", self.broker_id, self.topic_name, error
                )
            else:
                self._create_error = ""

        self._creating = asyncio.get_running_loop().create_task(
            create(), name=f"{self.holds}-{self.broker_id}-create-topic"
        )

    # -- writing ------------------------------------------------------------------------

    def _append_batch(
        self,
        context: ShardContext[S],
        batch: bytes,
        origin: AppendOrigin,
        *,
        marker_bumps_epoch: bool = False,
    ) -> int:
        """Append one batch to the shard's partition as its leader; the
        offset of its first record.  The coordinator's own transactional
        batches and markers are ``COORDINATOR`` appends: no client sequence
        to check (Kafka's ``ProducerAppendInfo`` checks sequences of
        ``CLIENT`` appends only).  A marker the producer state refuses keeps
        its code (a stale marker is not retried)."""
        now = self.now_ms()
        try:
            appended = self.replicas.append(
                context.key,
                batch,
                -1,
                now,
                origin=origin,
                marker_bumps_epoch=marker_bumps_epoch,
            )
        except NotLeaderError as error:
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR, str(error.args[0]), context.partition
            ) from None
        except ReplicaError as error:
            if error.code in _FENCED_MARKER:
                raise CoordinatorFailure(
                    error.code,
                    f"{self.topic_name}-{context.partition}: {error.args[0]}",
                    context.partition,
                ) from None
            # NOT_ENOUGH_REPLICAS and the like: nothing was written
            # (GroupCoordinatorService maps them to this retriable code).
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"{self.topic_name}-{context.partition}: {error.args[0]}",
                context.partition,
            ) from None
        context.last_written = appended.info.last_offset + 1
        return appended.info.first_offset

    def _append(
        self,
        context: ShardContext[S],
        records: Sequence[R],
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> int:
        """Append and replay, with no await: the next decision sees these.
        With a producer id the batch is that producer's transactional batch
        (offsets committed in a transaction)."""
        now = self.now_ms()
        stored = []
        for i, record in enumerate(records):
            key, value = self._encode(record)
            stored.append(Record(offset=i, timestamp=now, key=key, value=value))
        transactional = producer_id != NO_PRODUCER_ID
        batch = build_batch(
            stored,
            base_timestamp=now,
            max_timestamp=now,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            # As Kafka's GroupMetadataManager: the coordinator's batches
            # carry sequence 0 and are never checked for it (COORDINATOR).
            base_sequence=0 if transactional else NO_SEQUENCE,
            transactional=transactional,
        )
        first = self._append_batch(
            context, batch, AppendOrigin.COORDINATOR if transactional else AppendOrigin.CLIENT
        )
        for i, record in enumerate(records):
            self._replay(context, record, first + i, producer_id, producer_epoch)
        self.purgatory.wake(context.key)
        return context.last_written

    async def write_marker(
        self,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        marker: EndTxnMarker,
        *,
        bumps_epoch: bool = False,
    ) -> None:
        """A transaction's marker on a partition of this topic that this
        broker coordinates (WriteTxnMarkers to the offsets topic, Kafka's
        ``CoordinatorRuntime.scheduleTransactionCompletion``): appended and
        replayed with no await between, answered once committed; a
        :class:`CoordinatorFailure` if the shard is not here or not
        loaded (the transaction coordinator retries)."""
        context = self._contexts.get(partition)
        if context is None or not self._leads(context):
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR,
                f"broker {self.broker_id} does not coordinate {self.topic_name}-{partition}",
                partition,
            )
        if context.state is not ShardState.ACTIVE:
            raise CoordinatorFailure(
                Errors.COORDINATOR_LOAD_IN_PROGRESS
                if context.state is ShardState.LOADING
                else Errors.COORDINATOR_NOT_AVAILABLE,
                f"broker {self.broker_id} has not loaded {self.topic_name}-{partition}",
                partition,
            )
        batch = build_marker_batch(producer_id, producer_epoch, marker, self.now_ms())
        self._append_batch(context, batch, AppendOrigin.COORDINATOR, marker_bumps_epoch=bumps_epoch)
        self._replay_marker(context, producer_id, producer_epoch, marker)
        self.purgatory.wake(context.key)
        await self._committed(context, context.last_written)

    async def _committed(self, context: ShardContext[S], end: int) -> None:
        """Wait until the high watermark of the shard's leader epoch reaches
        ``end``; a lost leadership or a timeout is a :class:`CoordinatorFailure`."""

        def check() -> bool | None:
            if not self._leads(context):
                return False
            partition_log = self.replicas.logs.log(context.key)
            if partition_log is not None and partition_log.high_watermark >= end:
                return True
            return None

        done = await self.purgatory.wait_until(
            (context.key,),
            check,
            self.topic.commit_timeout_ms / 1000,
            operation=self.write_operation,
        )
        if done is False:
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR,
                f"broker {self.broker_id} lost the leadership of "
                f"{self.topic_name}-{context.partition} before offset {end - 1} committed",
                context.partition,
            )
        if done is None:
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"{self.topic_name}-{context.partition}: the ISR did not reach offset {end} "
                f"within {self.topic.commit_timeout_ms} ms",
                context.partition,
            )

    async def _write(
        self,
        context: ShardContext[S],
        records: Sequence[R],
        response: T,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> T:
        end = (
            self._append(context, records, producer_id=producer_id, producer_epoch=producer_epoch)
            if records
            else context.last_written
        )
        await self._committed(context, end)
        return response

    # -- time ---------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.topic.tick_interval_ms / 1000)
            for context in self.active_contexts():
                self._tick(context)

    def _extra_tasks(self) -> list[asyncio.Task[None]]:
        return []

    async def stop(self) -> None:
        self._stopped = True
        tasks = [c.loader for c in self._contexts.values() if c.loader is not None]
        tasks += [t for t in (self._ticker, self._creating) if t is not None]
        tasks += self._extra_tasks()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for context in list(self._contexts.values()):
            self._resign(context)

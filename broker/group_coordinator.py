"""The group coordinator at run time: asyncio glue between the broker's
replicas of the offsets topic and the pure decisions of
:class:`broker.group.shard.GroupCoordinatorShard` (Kafka's
``CoordinatorRuntime`` with its ``PartitionWriter`` and
``CoordinatorLoader``).

One shard per partition of ``__consumer_offsets`` this broker leads.  When
the broker becomes the partition's leader (a new leader epoch), a new
shard is built from the partition's log: it waits until the high
watermark reaches the log end it found (every record of earlier leaders
committed or gone), then replays the records from the log start to the
high watermark, never anything from memory or from what an earlier
coordinator answered.  Until then requests are answered
``COORDINATOR_LOAD_IN_PROGRESS``.  When the broker stops leading the
partition the shard is dropped, with every answer still waiting
(``NOT_COORDINATOR``).

A write decides on the shard, appends its records to the leader's log and
replays them into the shard without awaiting in between (so the next
decision sees them), then waits until the high watermark of the same
leader epoch passes them: only then is the answer given (KAFKA-20634
answered a commit the log had lost).  A read is computed at once and
answered once every earlier write of its shard has committed, so no answer
shows state that could still be lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import bugs
from broker.errors import Errors, ReplicaError
from broker.group import codec
from broker.group.api import (
    DeleteGroupResult,
    GroupDescription,
    GroupListing,
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    Result,
    TopicMetadata,
)
from broker.group.assignors import ASSIGNORS
from broker.group.placement import OFFSETS_TOPIC, partition_for
from broker.group.records import CoordinatorRecord, GroupMetadataKey
from broker.group.shard import GroupConfig, GroupCoordinatorShard
from broker.purgatory import Operation, Purgatory
from broker.replica import Role
from broker.replica_manager import NotLeaderError, ReplicaManager
from bugs import Bug
from metadata.image import MetadataImage, TopicIdPartition
from partition_log import BatchHeader, Record, build_batch, decode_records
from partition_log.batch import split_batches
from partition_log.errors import PartitionLogError

__all__ = [
    "NO_GROUP_METRICS",
    "CoordinatorFailure",
    "GroupCoordinator",
    "GroupMetrics",
    "ImageTopics",
    "OffsetsTopicSettings",
    "ShardState",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# How much of the log one read of a load takes.
_LOAD_READ_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OffsetsTopicSettings:
    """The offsets topic as the coordinator creates and writes it
    (``GroupCoordinatorConfig``)."""

    # offsets.topic.num.partitions
    partitions: int = 50
    # offsets.topic.replication.factor
    replication_factor: int = 3
    # The topic's min.insync.replicas (at most its replication factor): a
    # commit is answered only once this many replicas hold it, so that an
    # acknowledged commit survives the loss of its coordinator (Kafka's
    # topic takes the brokers' default, 1).
    min_insync_replicas: int = 2
    # offsets.topic.segment.bytes
    segment_bytes: int = 100 * 1024 * 1024
    # offsets.commit.timeout.ms: how long a write waits for the ISR.
    commit_timeout_ms: int = 5_000
    # How often sessions, revocations and offset expiry are checked.
    tick_interval_ms: int = 100


class GroupMetrics(Protocol):
    """What the coordinator reports (the seam; the process's is
    ``server.broker_metrics.PrometheusBrokerMetrics``)."""

    def rebalanced(self, count: int) -> None:
        """Group epochs bumped (KIP-848: each bump is a rebalance)."""

    def commit_answered(self, seconds: float, error: Errors) -> None:
        """An OffsetCommit answered, with its time from arrival."""


class _NoGroupMetrics:
    def rebalanced(self, count: int) -> None:
        return None

    def commit_answered(self, seconds: float, error: Errors) -> None:
        return None


NO_GROUP_METRICS: GroupMetrics = _NoGroupMetrics()


class ShardState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"


class CoordinatorFailure(Exception):
    """A request this broker cannot serve for its group: ``code`` (one of
    NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
    COORDINATOR_LOAD_IN_PROGRESS) and why."""

    def __init__(self, code: Errors, message: str, partition: int = -1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.partition = partition


class ImageTopics:
    """The topics of a :class:`MetadataImage` as the shard sees them
    (:class:`broker.group.api.TopicsView`)."""

    def __init__(self, image: MetadataImage) -> None:
        self._image = image

    def topic(self, name: str) -> TopicMetadata | None:
        topic = self._image.topic_by_name(name)
        if topic is None:
            return None
        return TopicMetadata(topic.topic_id, topic.name, len(topic.partitions))

    def names(self) -> Iterable[str]:
        return (topic.name for topic in self._image.topics.values())


@dataclass(eq=False)
class _Context:
    """One shard and where it writes."""

    partition: int
    key: TopicIdPartition
    leader_epoch: int
    shard: GroupCoordinatorShard
    state: ShardState = ShardState.LOADING
    # The offset after the last record written (committed or not).
    last_written: int = 0
    failure: str = ""
    loader: asyncio.Task[None] | None = field(default=None, repr=False)


class GroupCoordinator:
    """Every shard this broker runs, and the requests on them."""

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        purgatory: Purgatory,
        *,
        config: GroupConfig | None = None,
        topic: OffsetsTopicSettings | None = None,
        now_ms: Callable[[], int],
        rng: random.Random | None = None,
        create_offsets_topic: Callable[[], Awaitable[None]] | None = None,
        metrics: GroupMetrics = NO_GROUP_METRICS,
    ) -> None:
        self.metrics = metrics
        self.broker_id = broker_id
        self.replicas = replicas
        self.purgatory = purgatory
        self.config = config or GroupConfig()
        self.topic = topic or OffsetsTopicSettings()
        self.now_ms = now_ms
        self._rng = rng or random.Random()
        self._create_offsets_topic = create_offsets_topic
        self._creating: asyncio.Task[None] | None = None
        # Why the last attempt to create the offsets topic failed, if it did.
        self._create_error = ""
        self._contexts: dict[int, _Context] = {}
        # B19 only: the shards of earlier leaderships, by partition (a
        # correct coordinator drops a shard with its leadership).
        self._remembered: dict[int, GroupCoordinatorShard] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._stopped = False

    # -- leadership ---------------------------------------------------------------

    def shard_states(self) -> dict[int, ShardState]:
        return {p: c.state for p, c in sorted(self._contexts.items())}

    def on_image(self, image: MetadataImage) -> None:
        """After the replica manager applied ``image``: load a shard for
        each offsets partition led here at a new epoch, drop the others."""
        if self._stopped:
            return
        topic = image.topic_by_name(OFFSETS_TOPIC)
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
                self._tick_loop(), name=f"groups-{self.broker_id}-tick"
            )

    def _become_coordinator(self, partition: int, key: TopicIdPartition, epoch: int) -> None:
        remembered = self._remembered.pop(partition, None)
        if remembered is not None and bugs.on(Bug.GROUP_STATE_FROM_MEMORY):
            # B19, Redpanda CORE-16998: the groups this broker held when it
            # last led the partition, not the log below the HW; what other
            # leaders wrote since (and what was truncated from under it) is
            # not in its answers.
            self._reuse(partition, key, epoch, remembered)
            return
        shard = GroupCoordinatorShard(self.config, ASSIGNORS, random.Random(self._rng.random()))
        context = _Context(partition, key, epoch, shard)
        self._contexts[partition] = context
        context.loader = asyncio.get_running_loop().create_task(
            self._load(context), name=f"groups-{self.broker_id}-load-{partition}"
        )
        log.info(
            "broker %d: loading the groups of %s-%d at leader epoch %d",
            self.broker_id,
            OFFSETS_TOPIC,
            partition,
            epoch,
        )

    def _reuse(
        self, partition: int, key: TopicIdPartition, epoch: int, shard: GroupCoordinatorShard
    ) -> None:
        replica = self.replicas.replicas[key]
        context = _Context(partition, key, epoch, shard, ShardState.ACTIVE)
        # Reads wait for the HW to reach the log end found, as a load does.
        context.last_written = replica.log.log_end_offset
        shard.become_loaded(self.now_ms())
        self._contexts[partition] = context
        log.info(
            "broker %d: coordinates %s-%d again at leader epoch %d with the groups it held",
            self.broker_id,
            OFFSETS_TOPIC,
            partition,
            epoch,
        )

    def _resign(self, context: _Context) -> None:
        del self._contexts[context.partition]
        if bugs.on(Bug.GROUP_STATE_FROM_MEMORY) and context.state is ShardState.ACTIVE:
            # B19: kept for the next leadership of the partition.
            self._remembered[context.partition] = context.shard
        if context.loader is not None and not context.loader.done():
            context.loader.cancel()
        log.info(
            "broker %d: no longer coordinates %s-%d (leader epoch %d)",
            self.broker_id,
            OFFSETS_TOPIC,
            context.partition,
            context.leader_epoch,
        )
        # Every answer waiting on it checks again and finds it gone.
        self.purgatory.wake(context.key)

    def _leads(self, context: _Context) -> bool:
        if self._contexts.get(context.partition) is not context:
            return False
        replica = self.replicas.replicas.get(context.key)
        return (
            replica is not None
            and replica.role is Role.LEADER
            and replica.leader_epoch == context.leader_epoch
        )

    async def _load(self, context: _Context) -> None:
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
                (context.key,), caught_up, 1.0, operation=Operation.GROUP_LOAD
            )
            if found is False:
                return
            if found:
                break
        try:
            end = self._replay_log(context)
        except (PartitionLogError, codec.GroupRecordError) as error:
            context.state = ShardState.FAILED
            context.failure = str(error)
            log.error(
                "broker %d: cannot load the groups of %s-%d: %s",
                self.broker_id,
                OFFSETS_TOPIC,
                context.partition,
                error,
            )
            self.purgatory.wake(context.key)
            return
        context.last_written = end
        context.shard.become_loaded(self.now_ms())
        context.state = ShardState.ACTIVE
        log.info(
            "broker %d: loaded %d groups of %s-%d up to offset %d",
            self.broker_id,
            len(context.shard.groups),
            OFFSETS_TOPIC,
            context.partition,
            end,
        )
        self.purgatory.wake(context.key)

    def _replay_log(self, context: _Context) -> int:
        partition_log = self.replicas.logs.log(context.key)
        if partition_log is None:
            raise codec.GroupRecordError(f"no log for {OFFSETS_TOPIC}-{context.partition}")
        high_watermark = partition_log.high_watermark
        offset = partition_log.log_start_offset
        while offset < high_watermark:
            data = partition_log.read(offset, _LOAD_READ_BYTES, high_watermark)
            if not data:
                break
            for batch in split_batches(data):
                header = BatchHeader.parse(batch)
                if not header.is_control:
                    for record in decode_records(batch):
                        if offset <= record.offset < high_watermark:
                            self._replay_stored(context, record)
                offset = max(offset, header.next_offset)
        return high_watermark

    def _replay_stored(self, context: _Context, record: Record) -> None:
        if record.key is None:
            raise codec.GroupRecordError(
                f"{OFFSETS_TOPIC}-{context.partition} offset {record.offset}: a record "
                "without a key"
            )
        try:
            decoded = codec.decode(record.key, record.value)
        except codec.GroupRecordError as error:
            raise codec.GroupRecordError(
                f"{OFFSETS_TOPIC}-{context.partition} offset {record.offset}: {error}"
            ) from None
        context.shard.replay(decoded)

    # -- finding a group's shard ------------------------------------------------------

    def _context_for(self, group_id: str) -> _Context:
        image = self.replicas.image
        topic = image.topic_by_name(OFFSETS_TOPIC)
        if topic is None:
            self.ensure_offsets_topic()
            why = (
                f"creating it failed: {self._create_error}"
                if self._create_error
                else "it is being created"
            )
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"the offsets topic {OFFSETS_TOPIC} does not exist yet ({why})",
            )
        partition = partition_for(group_id, len(topic.partitions))
        context = self._contexts.get(partition)
        if context is None or not self._leads(context):
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR,
                f"broker {self.broker_id} does not coordinate group {group_id!r} (its "
                f"partition {OFFSETS_TOPIC}-{partition} is led elsewhere)",
                partition,
            )
        if context.state is ShardState.LOADING:
            raise CoordinatorFailure(
                Errors.COORDINATOR_LOAD_IN_PROGRESS,
                f"broker {self.broker_id} is loading the groups of {OFFSETS_TOPIC}-{partition}",
                partition,
            )
        if context.state is ShardState.FAILED:
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"broker {self.broker_id} could not load {OFFSETS_TOPIC}-{partition}: "
                f"{context.failure}",
                partition,
            )
        return context

    def ensure_offsets_topic(self) -> None:
        """Ask the controller for the offsets topic, once at a time."""
        if self.replicas.image.topic_by_name(OFFSETS_TOPIC) is not None:
            return
        if self._create_offsets_topic is None or self._stopped:
            return
        if self._creating is not None and not self._creating.done():
            return

        async def create() -> None:
            assert self._create_offsets_topic is not None
            try:
                await self._create_offsets_topic()
            except Exception as error:  # retried by the next request
                self._create_error = str(error)
                log.warning(
                    "broker %d: creating %s failed: %s", self.broker_id, OFFSETS_TOPIC, error
                )
            else:
                self._create_error = ""

        self._creating = asyncio.get_running_loop().create_task(
            create(), name=f"groups-{self.broker_id}-create-topic"
        )

    # -- writing ------------------------------------------------------------------------

    def _append(self, context: _Context, records: Sequence[CoordinatorRecord]) -> int:
        """Append and replay, with no await: the next decision sees these."""
        now = self.now_ms()
        stored = []
        for i, record in enumerate(records):
            key, value = codec.encode(record)
            stored.append(Record(offset=i, timestamp=now, key=key, value=value))
        batch = build_batch(stored, base_timestamp=now, max_timestamp=now)
        try:
            appended = self.replicas.append(context.key, batch, -1, now)
        except NotLeaderError as error:
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR, str(error.args[0]), context.partition
            ) from None
        except ReplicaError as error:
            # NOT_ENOUGH_REPLICAS and the like: nothing was written
            # (GroupCoordinatorService maps them to this retriable code).
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"{OFFSETS_TOPIC}-{context.partition}: {error.args[0]}",
                context.partition,
            ) from None
        bumps = 0
        for record in records:
            context.shard.replay(record)
            bumps += isinstance(record.key, GroupMetadataKey) and record.value is not None
        if bumps:
            self.metrics.rebalanced(bumps)
        context.last_written = appended.info.last_offset + 1
        self.purgatory.wake(context.key)
        return context.last_written

    async def _committed(self, context: _Context, end: int) -> None:
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
            operation=Operation.GROUP_WRITE,
        )
        if done is False:
            raise CoordinatorFailure(
                Errors.NOT_COORDINATOR,
                f"broker {self.broker_id} lost the leadership of "
                f"{OFFSETS_TOPIC}-{context.partition} before offset {end - 1} committed",
                context.partition,
            )
        if done is None:
            raise CoordinatorFailure(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"{OFFSETS_TOPIC}-{context.partition}: the ISR did not reach offset {end} "
                f"within {self.topic.commit_timeout_ms} ms",
                context.partition,
            )

    async def _write(self, context: _Context, result: Result[T]) -> T:
        end = self._append(context, result.records) if result.records else context.last_written
        await self._committed(context, end)
        return result.response

    # -- the requests -------------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        context = self._context_for(request.group_id)
        result = context.shard.consumer_group_heartbeat(
            request, ImageTopics(self.replicas.image), self.now_ms()
        )
        if result.response.error is not Errors.NONE:
            return result.response
        return await self._write(context, result)

    async def commit_offsets(self, request: OffsetCommitRequest) -> OffsetCommitResponse:
        started = time.monotonic()
        error = Errors.UNKNOWN_SERVER_ERROR
        try:
            context = self._context_for(request.group_id)
            result = context.shard.commit_offsets(request, self.now_ms())
            if result.response.error is not Errors.NONE:
                error = result.response.error
                return result.response
            if bugs.on(Bug.COMMIT_BEFORE_HW):
                # B17, KAFKA-20634: answered at the append, before the HW
                # passes the commit; a leader change that truncates it loses
                # what was acknowledged.
                self._append(context, result.records)
                answer = result.response
            else:
                answer = await self._write(context, result)
            error = Errors.NONE
            return answer
        except CoordinatorFailure as failure:
            error = failure.code
            raise
        finally:
            self.metrics.commit_answered(time.monotonic() - started, error)

    def lags(self) -> list[tuple[str, str, int, int]]:
        """``(group, topic, partition, lag)`` of each committed offset of the
        groups coordinated here, whose partition has a replica on this
        broker: its high watermark (the leader's, or the one a follower last
        learned, a little behind) less the committed offset, at least 0 (a
        gauge; ``kq groups --describe`` asks the leaders for the others)."""
        image = self.replicas.image
        out: list[tuple[str, str, int, int]] = []
        for context in list(self._contexts.values()):
            if context.state is not ShardState.ACTIVE or not self._leads(context):
                continue
            for group in context.shard.groups:
                for (name, partition), committed in sorted(group.offsets.items()):
                    topic = image.topic_by_name(name)
                    log = (
                        None
                        if topic is None
                        else self.replicas.logs.log(TopicIdPartition(topic.topic_id, partition))
                    )
                    if log is not None:
                        lag = max(0, log.high_watermark - committed.offset)
                        out.append((group.group_id, name, partition, lag))
        return out

    def group_counts(self) -> dict[str, int]:
        """Groups by state over the shards loaded here (a gauge)."""
        counts: dict[str, int] = {}
        for listing in self.list_groups():
            counts[listing.state] = counts.get(listing.state, 0) + 1
        return counts

    async def fetch_offsets(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        context = self._context_for(request.group_id)
        return await self._write(context, Result((), context.shard.fetch_offsets(request)))

    async def describe_group(self, group_id: str) -> GroupDescription:
        context = self._context_for(group_id)
        answer = context.shard.describe_group(group_id)
        return await self._write(context, Result((), answer))

    async def delete_groups(self, group_ids: Sequence[str]) -> list[DeleteGroupResult]:
        """Each group at its own coordinator; those not here answer
        NOT_COORDINATOR (the caller adds where they are)."""
        by_context: dict[int, tuple[_Context, list[str]]] = {}
        out: dict[str, DeleteGroupResult] = {}
        for group_id in group_ids:
            try:
                context = self._context_for(group_id)
            except CoordinatorFailure as failure:
                out[group_id] = DeleteGroupResult(group_id, failure.code, failure.message)
                continue
            by_context.setdefault(context.partition, (context, []))[1].append(group_id)
        for context, ids in by_context.values():
            result = context.shard.delete_groups(ids)
            try:
                answers = await self._write(context, result)
            except CoordinatorFailure as failure:
                answers = [DeleteGroupResult(g, failure.code, failure.message) for g in ids]
            out.update((a.group_id, a) for a in answers)
        return [out[group_id] for group_id in group_ids]

    async def delete_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]]
    ) -> OffsetCommitResponse:
        context = self._context_for(group_id)
        result = context.shard.delete_offsets(group_id, partitions)
        if result.response.error is not Errors.NONE:
            return result.response
        return await self._write(context, result)

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """The groups of every loaded shard here (as of its speculative
        state: a listing, not an answer about one group)."""
        out: list[GroupListing] = []
        wanted = list(states)
        for context in list(self._contexts.values()):
            if context.state is ShardState.ACTIVE and self._leads(context):
                out.extend(context.shard.list_groups(wanted))
        return sorted(out, key=lambda g: g.group_id)

    # -- time ---------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.topic.tick_interval_ms / 1000)
            for context in list(self._contexts.values()):
                if context.state is not ShardState.ACTIVE or not self._leads(context):
                    continue
                self.tick(context)

    def tick(self, context: _Context) -> None:
        result = context.shard.tick(self.now_ms())
        for group_id, member_id, why in result.response:
            log.info(
                "broker %d: group %r: member %s removed: %s",
                self.broker_id,
                group_id,
                member_id,
                why,
            )
        if not result.records:
            return
        try:
            self._append(context, result.records)
        except CoordinatorFailure as failure:
            # Written again by a later tick: the members are still due.
            log.warning("broker %d: %s", self.broker_id, failure.message)

    async def stop(self) -> None:
        self._stopped = True
        tasks = [c.loader for c in self._contexts.values() if c.loader is not None]
        tasks += [t for t in (self._ticker, self._creating) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for context in list(self._contexts.values()):
            self._resign(context)

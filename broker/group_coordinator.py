"""The group coordinator at run time: the shards of
:class:`broker.group.shard.GroupCoordinatorShard` over the broker's
replicas of ``__consumer_offsets``, on the runtime every coordinator shares
(:mod:`broker.coordinator_runtime`: a new leader loads its groups from the
log below the high watermark; a write is answered once committed)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import bugs
from broker.coordinator_runtime import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    CoordinatorFailure,
    CoordinatorRuntime,
    InternalTopicSettings,
    ShardContext,
    ShardState,
    StoredRecordError,
)
from broker.errors import Errors
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
    TxnOffsetCommitRequest,
)
from broker.group.assignors import ASSIGNORS
from broker.group.placement import OFFSETS_TOPIC, partition_for
from broker.group.records import CoordinatorRecord, GroupMetadataKey
from broker.group.shard import GroupConfig, GroupCoordinatorShard
from broker.purgatory import Purgatory
from broker.replica_manager import ReplicaManager
from broker.txn.types import TopicPartition
from broker.txn_produce import TxnVerifier, verification_error
from bugs import Bug
from metadata.image import MetadataImage, TopicIdPartition
from partition_log.txn import ControlType, EndTxnMarker

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

OffsetsTopicSettings = InternalTopicSettings
"""``offsets.topic.*``: the offsets topic as the coordinator creates and
writes it."""

_Context = ShardContext[GroupCoordinatorShard]


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


class GroupCoordinator(CoordinatorRuntime[GroupCoordinatorShard, CoordinatorRecord]):
    """Every group shard this broker runs, and the requests on them."""

    holds = "groups"

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
        txn_verifier: TxnVerifier | None = None,
    ) -> None:
        super().__init__(
            broker_id,
            replicas,
            purgatory,
            topic_name=OFFSETS_TOPIC,
            topic=topic or OffsetsTopicSettings(),
            now_ms=now_ms,
            create_topic=create_offsets_topic,
        )
        self.metrics = metrics
        # Who vouches for a TxnOffsetCommit's transaction (KIP-890); the
        # process sets it once its links exist.
        self.txn_verifier = txn_verifier
        self.config = config or GroupConfig()
        self._rng = rng or random.Random()
        # B19 only: the shards of earlier leaderships, by partition (a
        # correct coordinator drops a shard with its leadership).
        self._remembered: dict[int, GroupCoordinatorShard] = {}

    # -- the runtime's hooks ------------------------------------------------------------

    def _new_shard(self, partition: int) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(self.config, ASSIGNORS, random.Random(self._rng.random()))

    def _partition_for(self, key: str, partitions: int) -> int:
        return partition_for(key, partitions)

    def _encode(self, record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
        return codec.encode(record)

    def _decode(self, key: bytes, value: bytes | None) -> CoordinatorRecord:
        try:
            return codec.decode(key, value)
        except codec.GroupRecordError as error:
            raise StoredRecordError(str(error)) from None

    def _replay(
        self,
        context: _Context,
        record: CoordinatorRecord,
        offset: int,
        producer_id: int,
        producer_epoch: int,
    ) -> None:
        context.shard.replay(record, producer_id, producer_epoch, offset)

    def _replay_marker(
        self, context: _Context, producer_id: int, producer_epoch: int, marker: EndTxnMarker
    ) -> None:
        # The transaction's offsets take effect at its COMMIT, are dropped
        # at its ABORT (OffsetMetadataManager.replayEndTransactionMarker).
        context.shard.replay_end_transaction_marker(
            producer_id, producer_epoch, marker.type is ControlType.COMMIT
        )

    def _append(
        self,
        context: _Context,
        records: Sequence[CoordinatorRecord],
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> int:
        end = super()._append(
            context, records, producer_id=producer_id, producer_epoch=producer_epoch
        )
        # Group epochs bumped by this write (a load replays, bumps nothing).
        bumps = sum(isinstance(r.key, GroupMetadataKey) and r.value is not None for r in records)
        if bumps:
            self.metrics.rebalanced(bumps)
        return end

    def _loaded(self, context: _Context) -> None:
        context.shard.become_loaded(self.now_ms())

    def _new_context(self, partition: int, key: TopicIdPartition, epoch: int) -> bool:
        remembered = self._remembered.pop(partition, None)
        if remembered is None or not bugs.on(Bug.GROUP_STATE_FROM_MEMORY):
            return False
        # B19, Redpanda CORE-16998: the groups this broker held when it
        # last led the partition, not the log below the HW; what other
        # leaders wrote since (and what was truncated from under it) is not
        # in its answers.
        replica = self.replicas.replicas[key]
        context = ShardContext(partition, key, epoch, remembered, ShardState.ACTIVE)
        # Reads wait for the HW to reach the log end found, as a load does.
        context.last_written = replica.log.log_end_offset
        remembered.become_loaded(self.now_ms())
        self._contexts[partition] = context
        log.info(
            "broker %d: coordinates %s-%d again at leader epoch %d with the groups it held",
            self.broker_id,
            OFFSETS_TOPIC,
            partition,
            epoch,
        )
        return True

    def _on_resign(self, context: _Context) -> None:
        if bugs.on(Bug.GROUP_STATE_FROM_MEMORY) and context.state is ShardState.ACTIVE:
            # B19: kept for the next leadership of the partition.
            self._remembered[context.partition] = context.shard

    def _tick(self, context: _Context) -> None:
        self.tick(context)

    # -- finding a group's shard ------------------------------------------------------

    def _context_for(self, group_id: str) -> _Context:
        return self.context_for(group_id, f"group {group_id!r}")

    def ensure_offsets_topic(self) -> None:
        """Ask the controller for the offsets topic, once at a time."""
        self.ensure_topic()

    async def _decided(self, context: _Context, result: Result[T]) -> T:
        return await self._write(context, result.records, result.response)

    # -- the requests -------------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        context = self._context_for(request.group_id)
        result = context.shard.consumer_group_heartbeat(
            request, ImageTopics(self.replicas.image), self.now_ms()
        )
        if result.response.error is not Errors.NONE:
            return result.response
        return await self._decided(context, result)

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
                answer = await self._decided(context, result)
            error = Errors.NONE
            return answer
        except CoordinatorFailure as failure:
            error = failure.code
            raise
        finally:
            self.metrics.commit_answered(time.monotonic() - started, error)

    async def txn_commit_offsets(self, request: TxnOffsetCommitRequest) -> OffsetCommitResponse:
        """``TxnOffsetCommit``: offsets written in the producer's
        transactional batch, pending until its transaction's marker.  With
        a verifier, the transaction coordinator must first vouch that the
        group's offsets partition is in the producer's ongoing transaction
        at this epoch (KIP-890, as a leader does for a produce): otherwise
        a late commit of an ended transaction would open one here that no
        marker ends."""
        context = self._context_for(request.group_id)
        if self.txn_verifier is not None:
            where = TopicPartition(OFFSETS_TOPIC, context.partition)
            found = await self.txn_verifier.verify(
                request.transactional_id, request.producer_id, request.producer_epoch, [where]
            )
            error, message = found.get(
                where, (Errors.UNKNOWN_SERVER_ERROR, "the coordinator's answer left it out")
            )
            if error is not Errors.NONE:
                code = verification_error(error)
                return OffsetCommitResponse(
                    code,
                    f"the transaction coordinator did not verify producer "
                    f"{request.producer_id} epoch {request.producer_epoch} in "
                    f"{OFFSETS_TOPIC}-{context.partition} ({error.name}): {message}",
                )
            context = self._context_for(request.group_id)
        result = context.shard.txn_commit_offsets(request, self.now_ms())
        if result.response.error is not Errors.NONE or not result.records:
            return await self._write(context, (), result.response)
        return await self._write(
            context,
            result.records,
            result.response,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
        )

    def lags(self) -> list[tuple[str, str, int, int]]:
        """``(group, topic, partition, lag)`` of each committed offset of the
        groups coordinated here, whose partition has a replica on this
        broker: its high watermark (the leader's, or the one a follower last
        learned, a little behind) less the committed offset, at least 0 (a
        gauge; ``kq groups --describe`` asks the leaders for the others)."""
        image = self.replicas.image
        out: list[tuple[str, str, int, int]] = []
        for context in self.active_contexts():
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
        return await self._write(context, (), context.shard.fetch_offsets(request))

    async def describe_group(self, group_id: str) -> GroupDescription:
        context = self._context_for(group_id)
        return await self._write(context, (), context.shard.describe_group(group_id))

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
                answers = await self._decided(context, result)
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
        return await self._decided(context, result)

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """The groups of every loaded shard here (as of its speculative
        state: a listing, not an answer about one group)."""
        out: list[GroupListing] = []
        wanted = list(states)
        for context in self.active_contexts():
            out.extend(context.shard.list_groups(wanted))
        return sorted(out, key=lambda g: g.group_id)

    # -- time ---------------------------------------------------------------------------

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

"""The consumer over gRPC (Kafka's ``KafkaConsumer`` with manual
assignment): a thin driver over ``broker.client.consumer.ConsumerCore``,
which keeps the position of each assigned partition and decides what each
answer does (docs/clients.md).

``poll(timeout_ms)``, as ``KafkaConsumer.poll``: positions of partitions
without one are found with ListOffsets (``auto.offset.reset``, or a
``seek_to_beginning``/``seek_to_end``); buffered records are returned at
once; otherwise one long-poll Fetch per leader (``fetch.max.wait.ms``,
``fetch.min.bytes``) is sent for every partition not already awaiting one,
and the call returns as soon as records arrive or the timeout passes. A
fetch still running when ``poll`` returns goes on; its answer is kept for
the next ``poll``.

Leadership errors (``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, ...)
move the partition to the leader the answer names (KIP-951) or refresh the
metadata, and the partition is fetched again from the same position.
``OFFSET_OUT_OF_RANGE`` resets it by ``auto.offset.reset``; with ``none``
``poll`` raises ``OffsetOutOfRangeError`` naming it.

With a ``group_id`` the consumer may ``subscribe`` instead (KIP-848's
consumer group protocol, ``broker.grpc_client.group``): the coordinator
assigns the partitions, the rebalance listener runs inside ``poll``, new
partitions start at their committed offsets, and ``commit``,
``commit_async``, ``committed`` and auto-commit store offsets in the group
(docs/clients.md, "Consumer groups").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Self

import grpc

from broker.client.consumer import (
    ConsumerConfig,
    ConsumerCore,
    ConsumerRecord,
    FetchAnswer,
    FetchRequest,
    IsolationLevel,
    LeaderInfo,
    OffsetResetStrategy,
)
from broker.client.membership import AutoCommitTimer, Membership, MembershipConfig, MemberState
from broker.client.producer_batch import TopicPartition
from broker.client.transactions import ConsumerGroupMetadata
from broker.errors import Errors
from broker.grpc_client.admin import OffsetSpec
from broker.grpc_client.errors import BrokerClientError, NoBrokerError
from broker.grpc_client.group import (
    GroupDriver,
    IllegalStateError,
    OffsetAndEpoch,
    RebalanceListener,
)
from broker.grpc_client.metadata_cache import PERMANENT_REFUSALS, MetadataCache, now_ms
from kqproto import broker_pb2
from quorum.driver.tls import TlsFiles

__all__ = ["Consumer"]

# ListOffsets answers after which the client looks again (a new leader
# whose HW is behind its epoch start, an election, a stale epoch).
_RETRY_LIST_OFFSETS = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.OFFSET_NOT_AVAILABLE,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.REQUEST_TIMED_OUT,
        Errors.KAFKA_STORAGE_ERROR,
    }
)


def _tp(item: TopicPartition | tuple[str, int]) -> TopicPartition:
    topic, partition = item
    if not isinstance(topic, str) or not topic or not isinstance(partition, int):
        raise ValueError(f"not a (topic, partition): {item!r}")
    return TopicPartition(topic, partition)


class Consumer:
    """A consumer of assigned partitions (module docstring)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        config: ConsumerConfig | None = None,
        *,
        tls: TlsFiles | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata: MetadataCache | None = None,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        client_id: str = "kq-consumer",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        max_poll_interval_ms: int = 300_000,
        group_remote_assignor: str | None = None,
        on_commit: Callable[[dict[TopicPartition, OffsetAndEpoch]], object] | None = None,
    ) -> None:
        self.core = ConsumerCore(config)
        self.config = self.core.config
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata = metadata or MetadataCache(
            bootstrap,
            tls=tls,
            credentials=credentials,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._owns_metadata = metadata is None
        self._fetches: set[asyncio.Task[None]] = set()
        self._arrived = asyncio.Event()
        # An error an answer raised, given to the caller by the next poll.
        self._error: BaseException | None = None
        self._closed = False
        # Groups: None without a group_id.
        self.group_id = group_id
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self._auto_commit = AutoCommitTimer(auto_commit_interval_ms, now_ms())
        self._group: GroupDriver | None = None
        self.last_auto_commit_error: BrokerClientError | None = None
        self._manual = False  # assign() was called (Kafka: USER_ASSIGNED)
        if group_id is not None:
            member = Membership(
                MembershipConfig(
                    group_id,
                    client_id=client_id,
                    rebalance_timeout_ms=max_poll_interval_ms,
                    max_poll_interval_ms=max_poll_interval_ms,
                    server_assignor=group_remote_assignor,
                    instance_id=group_instance_id,
                    retry_backoff_ms=retry_backoff_ms,
                )
            )
            self._group = GroupDriver(self.metadata, member, self.core, request_timeout_ms)
            self._group.auto_commit = self.enable_auto_commit
            self._group.require_stable = (
                self.config.isolation_level is IsolationLevel.READ_COMMITTED
            )
            self._group.on_commit = on_commit
        elif on_commit is not None:
            raise ValueError("on_commit needs a group_id: Consumer(..., group_id=...)")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- assignment and positions ----------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume exactly these partitions (kept ones keep their positions)."""
        if self._group is not None and self._group.member.is_subscribed:
            raise IllegalStateError(
                "assign() on a consumer subscribed to topics: call unsubscribe() first "
                "(a consumer either assigns itself partitions or subscribes, not both)"
            )
        chosen = [_tp(p) for p in partitions]
        self._manual = bool(chosen)
        self.core.assign(chosen)

    # -- groups -----------------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | None = None,
        *,
        pattern: str | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Join the group with these topics or this pattern (Python re,
        matched in full by the coordinator); the coordinator assigns the
        partitions, ``poll`` runs ``listener``'s callbacks."""
        if self._group is None:
            raise ValueError("subscribe needs a group_id: Consumer(..., group_id=...)")
        if self._manual:
            raise IllegalStateError(
                "subscribe() on a consumer with assigned partitions: call assign([]) or "
                "unsubscribe() first (a consumer either assigns itself partitions or "
                "subscribes, not both)"
            )
        if self._closed:
            raise BrokerClientError(-1, "the consumer is closed")
        self._group.member.subscribe(
            None if topics is None else list(topics), pattern, now_ms=now_ms()
        )
        if listener is not None:
            self._group.listener = listener
        self._group.wake()

    def subscription(self) -> tuple[str, ...] | str | None:
        """The topic names or the pattern subscribed to, None if none."""
        if self._group is None:
            return None
        member = self._group.member
        return member.topics if member.topics is not None else member.pattern

    async def unsubscribe(self, timeout_ms: int = 30_000) -> None:
        """Leave the group (commit with auto-commit, revoke, epoch -1) or
        drop a manual assignment."""
        if self._group is not None and self._group.member.is_subscribed:
            await self._leave(timeout_ms)
        self._manual = False
        self.core.assign([])

    async def _leave(self, timeout_ms: int) -> None:
        assert self._group is not None
        group = self._group
        group.start()
        group.member.leave()
        deadline = now_ms() + timeout_ms
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0, deadline - now_ms()) / 1000):
                await group.run_steps()
                group.wake()
                while not group.member.left():
                    group.changed.clear()
                    if group.member.left():
                        break
                    await group.changed.wait()
        await group.stop()

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndEpoch] | None = None,
    ) -> None:
        """Commit ``offsets`` (next offset to read, or (offset, leader epoch))
        and wait for the answer; None commits the positions of every
        assigned partition. Raises ``CommitFailedError`` if the coordinator
        refused because this member no longer owns them."""
        await self._commit_group().commit(self._offsets(offsets))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndEpoch] | None = None,
        callback: Callable[[dict[TopicPartition, OffsetAndEpoch], BaseException | None], object]
        | None = None,
    ) -> asyncio.Task[None]:
        """``commit`` without waiting: the task's result is the outcome, and
        ``callback(offsets, error)`` is called with it if given. The offsets
        are taken now."""
        group = self._commit_group()
        chosen = self._offsets(offsets)

        async def run() -> None:
            try:
                await group.commit(chosen)
            except BaseException as error:
                if callback is not None:
                    callback(chosen, error)
                raise
            if callback is not None:
                callback(chosen, None)

        return asyncio.ensure_future(run())

    async def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, OffsetAndEpoch | None]:
        """The group's committed (offset, leader epoch) of each partition,
        None where it has none (OffsetFetch)."""
        chosen = {_tp(p) for p in partitions}
        found = await self._commit_group().committed(chosen)
        return {tp: found.get(tp) for tp in sorted(chosen)}

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What a transactional producer commits this consumer's offsets as
        (Kafka's ``groupMetadata()``, for
        ``Producer.send_offsets_to_transaction``): the group, and this
        member's id and epoch ("" and -1 while it is not a member, as for a
        consumer that assigns itself partitions)."""
        group = self._commit_group()
        member_id, member_epoch = group.member_pair()
        return ConsumerGroupMetadata(
            group.group_id, member_id, member_epoch, group.member.config.instance_id
        )

    def _commit_group(self) -> GroupDriver:
        if self._group is None:
            raise ValueError("committing offsets needs a group_id: Consumer(..., group_id=...)")
        return self._group

    def _offsets(
        self, offsets: Mapping[TopicPartition, int | OffsetAndEpoch] | None
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        if offsets is None:
            return self.core.committable()
        out: dict[TopicPartition, OffsetAndEpoch] = {}
        for item, value in offsets.items():
            tp = _tp(item)
            at = (value, -1) if isinstance(value, int) else value
            if not isinstance(at[0], int) or at[0] < 0:
                raise ValueError(f"cannot commit offset {value!r} for {tp}: an offset >= 0")
            out[tp] = (at[0], at[1])
        return out

    async def _group_poll_start(self) -> None:
        """The group's part of ``poll``: the auto-commit of what earlier
        polls returned, FIRST (ConsumerCoordinator.maybeAutoCommitOffsetsAsync),
        then the rebalance steps due."""
        group = self._group
        assert group is not None
        group.start()
        member = group.member
        member.on_poll(now_ms())
        if self.enable_auto_commit and self._auto_commit.maybe_due(now_ms()):
            try:
                await group.commit(self.core.committable())
            except BrokerClientError as error:
                # KafkaConsumer logs a failed auto-commit; the next one retries.
                self.last_auto_commit_error = error
        await self._group_steps()

    async def _group_steps(self) -> None:
        group = self._group
        assert group is not None
        await group.run_steps()
        await group.maybe_fetch_positions()
        if group.member.state is MemberState.FATAL:
            error = group.member.error
            raise BrokerClientError(
                int(error or Errors.UNKNOWN_SERVER_ERROR),
                f"group {group.group_id}: the coordinator refused this member: "
                f"{error.name if error else ''} {group.member.error_message}",
            )

    def assignment(self) -> frozenset[TopicPartition]:
        return self.core.assignment()

    def committable(self) -> dict[TopicPartition, OffsetAndEpoch]:
        """What ``commit()`` with no offsets commits: the position of each
        assigned partition that has one (after the records polls returned)
        and the leader epoch of the last record consumed (KIP-320)."""
        return self.core.committable()

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """The next record of ``partition`` returned is at ``offset`` (or the
        first after it)."""
        self.core.seek(_tp(partition), offset)

    def seek_to_beginning(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> None:
        """Start from the log start offset (all assigned partitions by default)."""
        chosen = self.assignment() if partitions is None else [_tp(p) for p in partitions]
        self.core.seek_to_beginning(chosen)

    def known_position(self, partition: TopicPartition | tuple[str, int]) -> int | None:
        """The partition's position if the consumer has one now (no lookup:
        None while its committed offset or its reset is still to come)."""
        return self.core.position(_tp(partition))

    def log_start_offset(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The partition's log start offset as the last fetch answer gave it
        (-1 if none came yet): the first offset still readable."""
        return self.core.log_start_offset(_tp(partition))

    def seek_to_end(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> None:
        """Start from the high watermark: only records produced from now on."""
        chosen = self.assignment() if partitions is None else [_tp(p) for p in partitions]
        self.core.seek_to_end(chosen)

    async def position(
        self, partition: TopicPartition | tuple[str, int], timeout_ms: int = 30_000
    ) -> int:
        """The offset of the next record to return, finding it (ListOffsets by
        the reset policy) if the partition has none yet."""
        tp = _tp(partition)
        deadline = now_ms() + timeout_ms
        while True:
            found = self.core.position(tp)
            if found is not None:
                return found
            if self._group is not None:
                # A new partition of the group's starts at its committed offset.
                await self._group.maybe_fetch_positions()
            await self._update_positions()
            found = self.core.position(tp)
            if found is not None:
                return found
            if now_ms() >= deadline:
                raise BrokerClientError(
                    int(Errors.REQUEST_TIMED_OUT),
                    f"no position found for {tp} within {timeout_ms} ms",
                )
            await asyncio.sleep(self.retry_backoff_ms / 1000)

    # -- polling -------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 1_000, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """Records of the assigned partitions, in offset order per partition,
        each once; an empty list if none came within ``timeout_ms``."""
        if self._closed:
            raise BrokerClientError(-1, "the consumer is closed")
        subscribed = self._group is not None and self._group.member.is_subscribed
        if not subscribed and not self.assignment():
            raise ValueError("poll with no partitions assigned: call assign() or subscribe() first")
        deadline = now_ms() + timeout_ms
        if subscribed:
            await self._group_poll_start()
        elif (
            self._group is not None
            and self.enable_auto_commit
            and self.assignment()
            and self._auto_commit.maybe_due(now_ms())
        ):
            with contextlib.suppress(BrokerClientError):
                await self._group.commit(self.core.committable())
        while True:
            self._raise_pending()
            if subscribed:
                await self._group_steps()
                if not self.assignment():
                    # Nothing assigned yet: wait for the coordinator's answer.
                    assert self._group is not None
                    left = deadline - now_ms()
                    if left <= 0:
                        return []
                    self._group.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._group.changed.wait(), left / 1000)
                    continue
            try:
                await self._update_positions()
            except BrokerClientError as error:
                if error.code == Errors.BROKER_NOT_AVAILABLE:
                    # No broker answered (NoBrokerError): keep trying until the timeout.
                    if now_ms() >= deadline:
                        return []
                    await asyncio.sleep(self.retry_backoff_ms / 1000)
                    continue
                raise
            records = self.core.poll(max_records)
            if records:
                return records
            self._send_fetches()
            left = deadline - now_ms()
            if left <= 0:
                return []
            self._arrived.clear()
            if self._group is not None:
                # A rebalance must not wait for the long poll's end.
                self._group.changed.clear()
            if not self._fetches:
                # Nothing to fetch yet (no leader known): wait a little.
                left = min(left, self.retry_backoff_ms)
            waits = [asyncio.ensure_future(self._arrived.wait())]
            if self._group is not None:
                waits.append(asyncio.ensure_future(self._group.changed.wait()))
            _, pending = await asyncio.wait(waits, timeout=left / 1000,
                                            return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            for waiter in pending:
                waiter.cancel()

    def _raise_pending(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    async def close(self, timeout_ms: int = 30_000, *, leave_group: bool = True) -> None:
        """Commit (auto-commit), revoke and leave the group (epoch -1)
        within ``timeout_ms``, then stop. ``leave_group`` False stops
        without committing or leaving (KIP-1092's ``REMAIN_IN_GROUP``): the
        member stays until its session expires, as a crashed one."""
        if self._closed:
            return
        if self._group is not None and leave_group:
            if self._group.member.is_subscribed:
                await self._leave(timeout_ms)
            elif self.enable_auto_commit and self.assignment():
                with contextlib.suppress(BrokerClientError, TimeoutError):
                    async with asyncio.timeout(timeout_ms / 1000):
                        await self._group.commit(self.core.committable())
        if self._group is not None:
            await self._group.stop()
        self._closed = True
        for task in list(self._fetches):
            task.cancel()
        await asyncio.gather(*self._fetches, return_exceptions=True)
        if self._owns_metadata:
            await self.metadata.close()

    # -- positions ------------------------------------------------------------------

    async def _update_positions(self) -> None:
        """ListOffsets for the partitions without a position
        (``Fetcher.resetOffsetsIfNeeded``)."""
        topics = {tp.topic for tp in self.assignment()}
        await self.metadata.maybe_refresh(topics)
        waiting = self._group.awaiting_committed if self._group is not None else set()
        # Partitions waiting for their committed offsets are not reset.
        resets = {
            tp: strategy
            for tp, strategy in self.core.partitions_to_reset().items()
            if tp not in waiting
        }
        if not resets:
            return
        by_node: dict[int, list[tuple[TopicPartition, OffsetResetStrategy, int]]] = {}
        for tp, strategy in resets.items():
            info = self.metadata.leader(tp)
            if info is None:
                self.metadata.request_refresh()
                continue
            by_node.setdefault(info.leader, []).append((tp, strategy, info.leader_epoch))
        await asyncio.gather(*(self._list_offsets(n, parts) for n, parts in by_node.items()))

    def _isolation(self) -> broker_pb2.IsolationLevel:
        """The fetches' and ListOffsets' isolation (``isolation.level``)."""
        if self.core.config.isolation_level is IsolationLevel.READ_COMMITTED:
            return broker_pb2.READ_COMMITTED
        return broker_pb2.READ_UNCOMMITTED

    async def _list_offsets(
        self, node: int, parts: list[tuple[TopicPartition, OffsetResetStrategy, int]]
    ) -> None:
        topics: dict[str, list[broker_pb2.ListOffsetsPartition]] = {}
        for tp, strategy, epoch in parts:
            earliest = strategy is OffsetResetStrategy.EARLIEST
            timestamp = int(OffsetSpec.EARLIEST if earliest else OffsetSpec.LATEST)
            topics.setdefault(tp.topic, []).append(
                broker_pb2.ListOffsetsPartition(
                    partition=tp.partition, current_leader_epoch=epoch, timestamp=timestamp
                )
            )
        request = broker_pb2.ListOffsetsRequest(
            isolation_level=self._isolation(),
            topics=[broker_pb2.ListOffsetsTopic(name=t, partitions=p) for t, p in topics.items()],
        )
        try:
            response = await self.metadata.stub(node).ListOffsets(
                request, timeout=self.request_timeout_ms / 1000
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in PERMANENT_REFUSALS:
                raise BrokerClientError(
                    int(Errors.TOPIC_AUTHORIZATION_FAILED),
                    f"broker {node} refused ListOffsets: {error.details()}",
                ) from None
            self.metadata.request_refresh()
            return
        if response.error != Errors.NONE:
            raise BrokerClientError(response.error, f"ListOffsets: {response.message}")
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition)
                if part.error == Errors.NONE and part.offset >= 0:
                    if tp in self.assignment():
                        self.core.reset_position(tp, part.offset, part.leader_epoch)
                elif part.error in _RETRY_LIST_OFFSETS:
                    self.metadata.follow(
                        tp, part.current_leader if part.HasField("current_leader") else None
                    )
                else:
                    raise BrokerClientError(
                        part.error, f"ListOffsets of {tp}: {part.message or 'no offset'}"
                    )

    # -- fetching -------------------------------------------------------------------

    def _send_fetches(self) -> None:
        leaders: dict[TopicPartition, LeaderInfo] = {}
        for tp in self.assignment():
            info = self.metadata.leader(tp)
            if info is not None:
                leaders[tp] = LeaderInfo(info.leader, info.leader_epoch)
            else:
                self.metadata.request_refresh()
        for node, request in self.core.fetch_requests(leaders).items():
            task = asyncio.ensure_future(self._fetch(node, request))
            self._fetches.add(task)
            task.add_done_callback(self._fetches.discard)

    async def _fetch(self, node: int, request: FetchRequest) -> None:
        topics: dict[str, list[broker_pb2.FetchPartition]] = {}
        for part in request.partitions:
            topics.setdefault(part.topic_partition.topic, []).append(
                broker_pb2.FetchPartition(
                    partition=part.topic_partition.partition,
                    current_leader_epoch=part.current_leader_epoch,
                    fetch_offset=part.fetch_offset,
                    last_fetched_epoch=part.last_fetched_epoch,
                    log_start_offset=-1,
                    partition_max_bytes=part.max_bytes,
                )
            )
        message = broker_pb2.FetchRequest(
            max_wait_ms=request.max_wait_ms,
            min_bytes=request.min_bytes,
            max_bytes=request.max_bytes,
            isolation_level=self._isolation(),
            topics=[broker_pb2.FetchTopic(topic=t, partitions=p) for t, p in topics.items()],
        )
        offsets = {p.topic_partition: p.fetch_offset for p in request.partitions}
        try:
            try:
                response = await self.metadata.stub(node).Fetch(
                    message, timeout=(request.max_wait_ms + self.request_timeout_ms) / 1000
                )
            except (grpc.aio.AioRpcError, NoBrokerError) as error:
                for tp in offsets:
                    self.core.on_fetch_failure(tp)
                if isinstance(error, grpc.aio.AioRpcError) and error.code() in PERMANENT_REFUSALS:
                    self._error = BrokerClientError(
                        int(Errors.TOPIC_AUTHORIZATION_FAILED),
                        f"broker {node} refused Fetch: {error.details()}",
                    )
                else:
                    self.metadata.request_refresh()
                    await asyncio.sleep(self.retry_backoff_ms / 1000)
                return
            except asyncio.CancelledError:
                for tp in offsets:
                    self.core.on_fetch_failure(tp)
                raise
            if response.error != Errors.NONE:
                for tp in offsets:
                    self.core.on_fetch_failure(tp)
                self._error = BrokerClientError(response.error, f"Fetch: {response.message}")
                return
            self._take(response, offsets)
        except Exception as error:  # a bug here reaches the caller's poll
            for tp in offsets:
                self.core.on_fetch_failure(tp)
            self._error = error
        finally:
            self._arrived.set()

    def _take(self, response: broker_pb2.FetchResponse, offsets: dict[TopicPartition, int]) -> None:
        answered: set[TopicPartition] = set()
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition)
                if tp not in offsets:
                    continue
                answered.add(tp)
                try:
                    code = Errors(part.error)
                except ValueError:
                    code = Errors.UNKNOWN_SERVER_ERROR
                hint = part.current_leader if part.HasField("current_leader") else None
                answer = FetchAnswer(
                    fetch_offset=offsets[tp],
                    error=code,
                    high_watermark=part.high_watermark,
                    log_start_offset=part.log_start_offset,
                    records=part.records,
                    diverging_epoch=(
                        (part.diverging_epoch.epoch, part.diverging_epoch.end_offset)
                        if part.HasField("diverging_epoch")
                        else None
                    ),
                    current_leader=hint.leader_id if hint is not None else -1,
                    current_leader_epoch=hint.leader_epoch if hint is not None else -1,
                    aborted_transactions=tuple(
                        (a.producer_id, a.first_offset) for a in part.aborted_transactions
                    ),
                )
                try:
                    effect = self.core.on_fetch_answer(tp, answer)
                except Exception as error:  # the core's refusal, raised by poll
                    self._error = error
                    continue
                if effect.refresh_metadata:
                    if effect.leader_hint is not None:
                        self.metadata.apply_leader_hint(
                            tp,
                            effect.leader_hint.node,
                            effect.leader_hint.leader_epoch,
                            response.node_endpoints,
                        )
                    else:
                        self.metadata.request_refresh()
        for tp in offsets.keys() - answered:
            self.core.on_fetch_failure(tp)

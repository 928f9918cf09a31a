"""The producer over gRPC (Kafka's ``KafkaProducer`` and its ``Sender``
thread, as one asyncio task): a thin driver over the pure core of
``broker/client/`` (docs/clients.md).

``await producer.send(topic, value, key=...)`` queues the record (waiting
for the topic's metadata and for buffer memory up to ``max.block.ms``, as
Kafka's ``send`` blocks) and returns an ``asyncio.Future`` that resolves to
a :class:`RecordMetadata` (partition, offset, timestamp) or raises
:class:`DeliveryFailedError`, whose ``outcome`` says whether the record is
definitely not in the log (``fail``) or may be (``info``).

The sender task runs ``Sender.runOnce``: an idempotent producer first gets
its id with InitProducerId; then ``ready`` names the leaders with sendable
batches, ``drain`` gives one Produce request per leader, each sent
concurrently (at most ``max.in.flight.requests.per.connection`` batches of a
partition await answers, the core's rule), every answer goes back to the
core (``on_answer``; a failed RPC to ``on_network_failure``), and
``expire`` applies ``delivery.timeout.ms``. Leadership errors take the
answer's KIP-951 leader hint, or refresh the metadata.

A non-OK gRPC status is read as the proto says: INVALID_ARGUMENT,
PERMISSION_DENIED and UNAUTHENTICATED refused the request (nothing written);
any other (the broker died, the deadline passed) leaves the outcome unknown,
as Kafka's ``NETWORK_EXCEPTION``.

With a ``transactional_id`` the producer is transactional (Kafka's
``KafkaProducer`` with ``transactional.id``; docs/clients.md,
"Transactions"): ``init_transactions`` once, then per transaction
``begin_transaction``, ``send``s (and ``send_offsets_to_transaction``), and
``commit_transaction`` or ``abort_transaction``. The pure
:class:`~broker.client.transactions.TransactionManager` keeps the state and
reads every answer; this driver sends its requests to the transactional
id's coordinator (:mod:`broker.grpc_client.transactions`): AddPartitionsToTxn
from the sender task before a new partition's first batch is drained, the
rest from the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

import grpc

from broker.client.accumulator import ProduceAnswer, ProduceRequest, RecordAccumulator
from broker.client.errors import (
    FORCE_CLOSED,
    BufferExhaustedError,
    TransactionFatalError,
    TransactionStateError,
)
from broker.client.producer_batch import (
    ProducerBatch,
    ProducerConfig,
    RecordFuture,
    TopicPartition,
)
from broker.client.sequencing import Sequencing
from broker.client.transactions import ConsumerGroupMetadata, Retry, TransactionManager, TxnState
from broker.errors import Errors
from broker.grpc_client.coordinator import GroupCoordinatorClient
from broker.grpc_client.errors import BrokerClientError, DeliveryFailedError, NoBrokerError
from broker.grpc_client.metadata_cache import PERMANENT_REFUSALS, MetadataCache, now_ms
from broker.grpc_client.transactions import TxnCoordinatorClient, timed_out
from kqproto import broker_pb2, groups_pb2, txn_pb2
from partition_log.records import Header
from quorum.driver.tls import TlsFiles

__all__ = ["Producer", "RecordMetadata"]

# The longest the sender sleeps when nothing wakes it (an expiry to apply,
# a metadata refresh to retry).
_IDLE_MS = 50
# Extra time over request.timeout.ms before a Produce RPC is abandoned: the
# broker answers REQUEST_TIMED_OUT itself at timeout_ms.
_RPC_MARGIN_MS = 5_000


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record is (Kafka's ``RecordMetadata``); offset
    -1 with acks=0 (no answer) or for a duplicate whose offsets the broker
    no longer had."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class Producer:
    """An idempotent (by default), batching producer (module docstring)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        config: ProducerConfig | None = None,
        *,
        tls: TlsFiles | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        rng: random.Random | None = None,
        metadata: MetadataCache | None = None,
        kafka_out_of_order: bool = False,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        """``kafka_out_of_order``: read OUT_OF_ORDER_SEQUENCE_NUMBER for the
        next expected batch as Kafka's client does, bumping the epoch and
        resending even a batch that may be in the log
        (:mod:`broker.client.sequencing`); by default kq fails such a batch
        as unknown. ``transactional_id``: a transactional producer (module
        docstring) whose transactions the coordinator aborts if they stay
        open longer than ``transaction_timeout_ms``."""
        self.config = config if config is not None else ProducerConfig()
        if transactional_id is not None and not self.config.enable_idempotence:
            raise ValueError("a transactional_id requires enable_idempotence")
        self.metadata = metadata or MetadataCache(
            bootstrap,
            tls=tls,
            credentials=credentials,
            request_timeout_ms=self.config.request_timeout_ms,
            retry_backoff_ms=self.config.retry_backoff_ms,
        )
        self._owns_metadata = metadata is None
        # Separate gRPC calls keep no order (Kafka's requests on one
        # connection do): with idempotence the core's unordered-requests
        # rules keep the log in order; without it nothing would, so one
        # batch per partition is in flight at a time.
        core_config = (
            self.config
            if self.config.enable_idempotence
            else dataclasses.replace(self.config, max_in_flight_requests_per_connection=1)
        )
        sequencing = Sequencing(
            self.config.enable_idempotence,
            unordered_requests=True,
            kafka_out_of_order=kafka_out_of_order,
            transactional=transactional_id is not None,
        )
        self.transactional_id = transactional_id
        self.transactions: TransactionManager | None = None
        self._coordinator: TxnCoordinatorClient | None = None
        if transactional_id is not None:
            self.transactions = TransactionManager(
                transactional_id,
                sequencing,
                transaction_timeout_ms=transaction_timeout_ms,
                retry_backoff_ms=self.config.retry_backoff_ms,
            )
            self._coordinator = TxnCoordinatorClient(
                self.metadata, self.transactions, self.config.retry_backoff_max_ms
            )
        self.accumulator = RecordAccumulator(
            core_config, rng or random.Random(), sequencing, self.transactions
        )
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._pending: set[asyncio.Future[RecordMetadata]] = set()
        self._fatal: BrokerClientError | None = None
        self._closed = False
        self._init_retry_at_ms = 0
        # The AddPartitionsToTxn task, while one runs.
        self._adding: asyncio.Task[None] | None = None
        self._groups: dict[str, GroupCoordinatorClient] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending ------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the returned future resolves once it is
        acknowledged (or fails). The partition: ``partition`` if given, else
        murmur2 of the key, else the sticky partition."""
        if self._closed:
            raise BrokerClientError(-1, "cannot send after the producer is closed")
        txn = self.transactions
        if txn is not None:
            txn.check_send()
        if self._fatal is not None:
            raise self._fatal
        self._start()
        deadline = now_ms() + self.config.max_block_ms
        partitions = await self.metadata.partition_count(topic, self.config.max_block_ms)
        timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        while True:
            if txn is not None:
                # The transaction may have moved on while send waited.
                txn.check_send()
            try:
                future = self.accumulator.append(
                    topic,
                    key,
                    value,
                    now_ms=now_ms(),
                    partitions=partitions,
                    # Only the sticky partitioner needs them.
                    available=(
                        self.metadata.available(topic) if key is None and partition is None else ()
                    ),
                    partition=partition,
                    headers=tuple(headers or ()),
                    timestamp_ms=timestamp,
                )
                if txn is not None:
                    txn.maybe_add_partition(future.topic_partition)
                break
            except BufferExhaustedError as error:
                # BufferPool.allocate: wait for completions up to max.block.ms.
                left = deadline - now_ms()
                if left <= 0:
                    raise BrokerClientError(-1, str(error), "BufferExhaustedException") from None
                self._progress.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._progress.wait(), left / 1000)
        result: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self._pending.add(result)

        def resolve(record: RecordFuture) -> None:
            self._pending.discard(result)
            if result.done():
                return
            if record.error is not None and txn is not None:
                txn.on_batch_failed(record.error)
                self._wake.set()
            if record.error is not None:
                fatal = self._fatal
                if fatal is not None and record.error.name == FORCE_CLOSED:
                    result.set_exception(fatal)
                else:
                    result.set_exception(DeliveryFailedError(record.error))
            else:
                tp = record.topic_partition
                offset = -1 if record.offset is None else record.offset
                result.set_result(RecordMetadata(tp.topic, tp.partition, offset, timestamp))

        future.add_done_callback(resolve)
        self._wake.set()
        if future.index == 0:
            # A new batch: the one before it is full and sendable. A caller
            # sending in a loop would not otherwise let the sender run (Kafka
            # sends from its own thread) until it stops.
            await asyncio.sleep(0)
        return result

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued at once and wait until every record sent
        before the call is complete (acknowledged or failed)."""
        pending = list(self._pending)
        if not pending:
            return
        self.accumulator.begin_flush()
        self._wake.set()
        await asyncio.wait(pending, timeout=timeout_s)

    async def close(self, timeout_s: float | None = None) -> None:
        """Take no more records, send what is queued and wait for it (up to
        ``timeout_s``; then fail what is left, outcome ``info`` for records
        that may have been written), and close the channels."""
        if self._closed:
            return
        self._closed = True
        self.accumulator.close()
        self._wake.set()
        if self._sender is not None:
            # A sender that died has failed its records already.
            await asyncio.wait([self._sender], timeout=timeout_s)
            if not self._sender.done():
                self.accumulator.abort_incomplete(now_ms())
                self._sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sender
        for task in list(self._requests):
            task.cancel()
        if self._adding is not None:
            self._adding.cancel()
        if self._owns_metadata:
            await self.metadata.close()

    # -- the sender -----------------------------------------------------------------

    def _start(self) -> None:
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._run())
            self._sender.add_done_callback(self._sender_done)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        """A sender that died of a bug fails every record and later send,
        rather than leaving their futures pending for ever."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        self._fail_all(BrokerClientError(-1, f"the producer's sender failed: {error!r}"))

    async def _run(self) -> None:
        acc = self.accumulator
        while not (self._closed and acc.incomplete == 0):
            wait_ms = _IDLE_MS
            self._wake.clear()
            try:
                wait_ms = await self._run_once()
            except BrokerClientError as error:
                # No broker answered a metadata refresh: look again shortly.
                self.metadata.request_refresh()
                wait_ms = self.config.retry_backoff_ms
                if error.code == Errors.TOPIC_AUTHORIZATION_FAILED:
                    self._fail_all(error)
                # delivery.timeout.ms holds even while no broker answers.
                if acc.expire(now_ms()):
                    self._progress.set()
            if wait_ms > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
        await asyncio.gather(*self._requests, return_exceptions=True)

    async def _run_once(self) -> int:
        """One ``Sender.runOnce``; returns how long to sleep (ms) unless woken."""
        acc = self.accumulator
        if self.transactions is not None:
            self._transaction_step()
        if self.metadata.refresh_due():
            await self.metadata.refresh()
        if (
            self.transactions is None
            and acc.sequencing.needs_producer_id
            and acc.incomplete
            and not await self._init_producer_id()
        ):
            acc.expire(now_ms())
            return self.config.retry_backoff_ms
        now = now_ms()
        leaders = self.metadata.leaders()
        ready = acc.ready(now, leaders)
        if ready.unknown_leader_topics:
            self.metadata.request_refresh()
        drained = acc.drain(now, leaders, ready.nodes)
        for node, request in drained.items():
            task = asyncio.ensure_future(self._send_request(node, request))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
        acc.take_failed()
        if acc.expire(now_ms()):
            self._progress.set()
        if drained:
            # More may be sendable at once (the next batches of a partition,
            # up to five awaiting answers): look again without sleeping, as
            # Sender.runOnce loops; ready() names no leader once they wait.
            return 0
        if ready.next_ready_check_ms >= 0:
            return max(0, min(_IDLE_MS, ready.next_ready_check_ms - now_ms()))
        return _IDLE_MS

    def _transaction_step(self) -> None:
        """The sender's transactional part (``maybeSendAndPollTransactionalRequest``):
        after a fatal error every record fails; while the transaction can
        only abort its batches not yet sent are dropped; new partitions are
        added to the transaction before their batches are drained."""
        txn = self.transactions
        assert txn is not None
        acc = self.accumulator
        error = txn.last_error
        if txn.state is TxnState.FATAL_ERROR and isinstance(error, TransactionFatalError):
            if acc.incomplete or self._fatal is None:
                self._fail_all(error)
            return
        if txn.drops_unsent and acc.incomplete:
            why = (
                "the transaction is being aborted"
                if txn.state is TxnState.ABORTING_TRANSACTION
                else f"the transaction can only abort ({error})"
            )
            if acc.abort_undrained(why):
                self._progress.set()
        if (
            txn.has_partitions_to_add
            and txn.may_send_request()
            and (self._adding is None or self._adding.done())
        ):
            self._adding = asyncio.ensure_future(self._add_partitions())

    async def _add_partitions(self) -> None:
        """AddPartitionsToTxn of every partition not yet in the transaction,
        again while new ones come (each request takes all of them, as
        Kafka's one handler per send loop). Retried until the transaction
        can only abort; a failure is the manager's state."""
        txn = self.transactions
        coordinator = self._coordinator
        assert txn is not None and coordinator is not None
        asked: list[frozenset[TopicPartition]] = []

        async def send(address: str, timeout_s: float) -> txn_pb2.AddPartitionsToTxnResponse:
            partitions = txn.partitions_to_add()
            asked.append(partitions)
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(partitions):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            producer = txn.producer
            return await coordinator.txn_stub(address).AddPartitionsToTxn(
                txn_pb2.AddPartitionsToTxnRequest(
                    transactional_id=txn.transactional_id,
                    producer_id=producer.producer_id,
                    producer_epoch=producer.epoch,
                    topics=[txn_pb2.TxnTopic(name=t, partitions=p) for t, p in by_topic.items()],
                ),
                timeout=timeout_s,
            )

        def read(answer: txn_pb2.AddPartitionsToTxnResponse) -> Retry | None:
            partitions = asked[-1]
            results: dict[TopicPartition, int] = {}
            for topic in answer.results:
                for part in topic.partitions:
                    results[TopicPartition(topic.name, part.partition)] = part.error
            for tp in partitions:
                if tp not in results:
                    results[tp] = answer.error or Errors.UNKNOWN_SERVER_ERROR
            return txn.on_add_partitions({tp: results[tp] for tp in partitions}, answer.message)

        try:
            while txn.has_partitions_to_add and txn.may_send_request():
                # No deadline of its own: the batches waiting for it expire
                # by delivery.timeout.ms, which makes the transaction abortable.
                await coordinator.call(
                    "AddPartitionsToTxn",
                    send,
                    read,
                    now_ms() + self.config.delivery_timeout_ms,
                    self.config.request_timeout_ms,
                    keep_going=txn.may_send_request,
                )
                self._wake.set()
        except BrokerClientError:
            pass  # the manager's state says what failed; the calls raise it
        finally:
            self._wake.set()
            self._progress.set()

    # -- transactions ---------------------------------------------------------------

    def _txn(self) -> tuple[TransactionManager, TxnCoordinatorClient]:
        if self.transactions is None or self._coordinator is None:
            raise TransactionStateError(
                "transactional call on a producer without a transactional_id"
            )
        if self._closed:
            raise BrokerClientError(-1, "the producer is closed")
        return self.transactions, self._coordinator

    def _deadline(self, timeout_ms: int | None) -> tuple[int, int]:
        wait = self.config.max_block_ms if timeout_ms is None else timeout_ms
        return now_ms() + wait, wait

    async def init_transactions(self, timeout_ms: int | None = None) -> None:
        """Find the transactional id's coordinator and get the producer's id
        and epoch from it (InitProducerId with the transactional id; the
        producer's own id and epoch once it has one, KIP-360). Fences every
        earlier producer of the id; a transaction of theirs still open is
        aborted first (the coordinator answers CONCURRENT_TRANSACTIONS,
        retried). Waits up to ``timeout_ms`` (``max_block_ms``); after a
        timeout, calling it again goes on."""
        txn, coordinator = self._txn()
        deadline, wait = self._deadline(timeout_ms)
        producer = txn.begin_init()
        request = broker_pb2.InitProducerIdRequest(
            transactional_id=txn.transactional_id,
            transaction_timeout_ms=txn.transaction_timeout_ms,
            producer_id=producer.producer_id,
            producer_epoch=producer.epoch,
        )

        def read(answer: broker_pb2.InitProducerIdResponse) -> Retry | None:
            return txn.on_init_producer_id(
                answer.error, answer.producer_id, answer.producer_epoch, answer.message
            )

        await coordinator.call(
            "InitProducerId",
            lambda address, t: coordinator.broker_stub(address).InitProducerId(request, timeout=t),
            read,
            deadline,
            self.config.request_timeout_ms,
        )

    def begin_transaction(self) -> None:
        """Start a transaction: its sends, until it is committed or aborted."""
        txn, _ = self._txn()
        txn.begin_transaction()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        group_metadata: ConsumerGroupMetadata,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit a consumer group's offsets (the next offset to read of
        each partition) with the transaction: AddOffsetsToTxn to the
        transaction's coordinator, then TxnOffsetCommit to the group's,
        as the member ``group_metadata`` names (``Consumer.group_metadata``).
        They take effect only if the transaction commits."""
        txn, coordinator = self._txn()
        deadline, wait = self._deadline(timeout_ms)
        chosen = {TopicPartition(*tp): offset for tp, offset in offsets.items()}
        group_id = group_metadata.group_id
        txn.begin_send_offsets(group_metadata)
        txn.begin_offset_commit(chosen)
        producer = txn.producer
        request = txn_pb2.AddOffsetsToTxnRequest(
            transactional_id=txn.transactional_id,
            producer_id=producer.producer_id,
            producer_epoch=producer.epoch,
            group_id=group_id,
        )
        await coordinator.call(
            "AddOffsetsToTxn",
            lambda address, t: coordinator.txn_stub(address).AddOffsetsToTxn(request, timeout=t),
            lambda answer: txn.on_add_offsets(answer.error, group_id, answer.message),
            deadline,
            self.config.request_timeout_ms,
        )
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = GroupCoordinatorClient(self.metadata, group_id)
        attempt = 0
        while True:
            if now_ms() >= deadline:
                raise timed_out("send_offsets_to_transaction", txn.transactional_id, wait)
            pending = dict(txn.pending_offsets)
            by_topic: dict[str, list[groups_pb2.OffsetCommitPartition]] = {}
            for tp, offset in sorted(pending.items()):
                by_topic.setdefault(tp.topic, []).append(
                    groups_pb2.OffsetCommitPartition(
                        partition=tp.partition, offset=offset, leader_epoch=-1
                    )
                )
            commit = groups_pb2.TxnOffsetCommitRequest(
                transactional_id=txn.transactional_id,
                group_id=group_id,
                producer_id=producer.producer_id,
                producer_epoch=producer.epoch,
                member_id=group_metadata.member_id,
                member_epoch=group_metadata.member_epoch,
                topics=[
                    groups_pb2.OffsetCommitTopic(name=t, partitions=p) for t, p in by_topic.items()
                ],
            )

            async def commit_once(
                _stub: object,
                timeout_s: float,
                request: groups_pb2.TxnOffsetCommitRequest = commit,
            ) -> groups_pb2.OffsetCommitResponse:
                return await group.txn_offset_commit(request, timeout_s)

            try:
                answer = await group.call(
                    "TxnOffsetCommit", commit_once, max(1, deadline - now_ms())
                )
            except BrokerClientError as error:
                if error.code == Errors.GROUP_AUTHORIZATION_FAILED:
                    txn.on_group_coordinator_error(error.code, group_id, error.message)
                raise
            results: dict[TopicPartition, int] = {}
            if answer.error != Errors.NONE:
                results = dict.fromkeys(pending, answer.error)
            else:
                for topic in answer.topics:
                    for part in topic.partitions:
                        results[TopicPartition(topic.name, part.partition)] = part.error
            retry = txn.on_txn_offset_commit(results, group_id, answer.message)
            if retry is None:
                return
            if retry.find_coordinator:
                group.forget()
            await asyncio.sleep(
                min(retry.backoff_ms * 2 ** min(attempt, 10), self.config.retry_backoff_max_ms)
                / 1000
            )
            attempt += 1

    async def commit_transaction(self, timeout_ms: int | None = None) -> None:
        """Send every record of the transaction and wait for them (a failed
        one fails the commit with :class:`TransactionAbortableError`: abort
        then), then EndTxn(commit); the producer goes on with the bumped
        epoch the coordinator answers. Waits up to ``timeout_ms``
        (``max_block_ms``); after a timeout, calling it again goes on (an
        EndTxn is sent again at the same epoch)."""
        txn, _ = self._txn()
        deadline, wait = self._deadline(timeout_ms)
        txn.begin_commit()
        await self._settle_transaction(deadline, wait, "commit_transaction")
        txn.check_completing()
        await self._end_transaction(deadline)

    async def abort_transaction(self, timeout_ms: int | None = None) -> None:
        """Drop the transaction's records not yet sent (they fail with
        ``TransactionAbortedException``), wait for those awaiting answers,
        then EndTxn(abort); the producer goes on with the bumped epoch. The
        way out of :class:`TransactionAbortableError`."""
        txn, _ = self._txn()
        deadline, wait = self._deadline(timeout_ms)
        txn.begin_abort()
        self._transaction_step()
        self._wake.set()
        await self._settle_transaction(deadline, wait, "abort_transaction")
        txn.check_completing()
        await self._end_transaction(deadline)

    async def _settle_transaction(self, deadline: int, wait: int, what: str) -> None:
        """Every record of the transaction complete (sent at once, as a
        flush) and no AddPartitionsToTxn under way: EndTxn goes last."""
        txn = self.transactions
        assert txn is not None
        if self._pending:
            self.accumulator.begin_flush()
            self._wake.set()
            done, pending = await asyncio.wait(
                list(self._pending), timeout=max(0, deadline - now_ms()) / 1000
            )
            if pending:
                raise timed_out(what, txn.transactional_id, wait)
        adding = self._adding
        if adding is not None and not adding.done():
            await asyncio.wait([adding], timeout=max(0, deadline - now_ms()) / 1000)
            if not adding.done():
                raise timed_out(what, txn.transactional_id, wait)

    async def _end_transaction(self, deadline: int) -> None:
        txn = self.transactions
        coordinator = self._coordinator
        assert txn is not None and coordinator is not None
        if not txn.end_needs_request:
            # Nothing may have joined the transaction: it ends here
            # (TransactionManager.nextRequest), at the same epoch.
            txn.complete()
            return
        producer_id, epoch, commit = txn.end_request()
        request = txn_pb2.EndTxnRequest(
            transactional_id=txn.transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            committed=commit,
        )

        def read(answer: txn_pb2.EndTxnResponse) -> Retry | None:
            return txn.on_end_txn(
                answer.error, answer.producer_id, answer.producer_epoch, answer.message
            )

        try:
            await coordinator.call(
                "EndTxn",
                lambda address, t: coordinator.txn_stub(address).EndTxn(request, timeout=t),
                read,
                deadline,
                self.config.request_timeout_ms,
            )
        finally:
            self._wake.set()

    async def _init_producer_id(self) -> bool:
        """InitProducerId from any broker (KIP-98); True once the producer
        has an id. A refusal that cannot pass (no IDEMPOTENT_WRITE) fails
        every record."""
        if now_ms() < self._init_retry_at_ms:
            return False
        self._init_retry_at_ms = now_ms() + self.config.retry_backoff_ms
        try:
            stub = self.metadata.any_stub()
            answer = await stub.InitProducerId(
                broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1),
                timeout=self.config.request_timeout_ms / 1000,
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in PERMANENT_REFUSALS:
                self._fail_all(
                    BrokerClientError(
                        int(Errors.CLUSTER_AUTHORIZATION_FAILED),
                        f"InitProducerId refused: {error.details()}",
                    )
                )
            self.metadata.request_refresh()
            return False
        except NoBrokerError:
            self.metadata.request_refresh()
            return False
        if answer.error == Errors.NONE:
            self.accumulator.sequencing.set_producer_id(answer.producer_id, answer.producer_epoch)
            return True
        if answer.error in (
            Errors.CLUSTER_AUTHORIZATION_FAILED,
            Errors.INVALID_REQUEST,
            Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ):
            self._fail_all(
                BrokerClientError(answer.error, f"InitProducerId refused: {answer.message}")
            )
        return False

    def _fail_all(self, error: BrokerClientError) -> None:
        """A fatal error (Kafka's ``TransactionManager`` fatal state): every
        record not complete fails, and so does every later send."""
        self._fatal = error
        self.accumulator.abort_incomplete(now_ms())
        self._progress.set()

    async def _send_request(self, node: int, request: ProduceRequest) -> None:
        payloads = request.payloads()
        topics: dict[str, list[broker_pb2.ProducePartitionData]] = {}
        for tp, payload in payloads.items():
            topics.setdefault(tp.topic, []).append(
                broker_pb2.ProducePartitionData(partition=tp.partition, records=payload)
            )
        message = broker_pb2.ProduceRequest(
            transactional_id=self.transactional_id or "",
            acks=int(request.acks),
            timeout_ms=request.timeout_ms,
            topics=[broker_pb2.ProduceTopicData(name=t, partitions=p) for t, p in topics.items()],
        )
        try:
            response = await self.metadata.stub(node).Produce(
                message, timeout=(request.timeout_ms + _RPC_MARGIN_MS) / 1000
            )
        except (grpc.aio.AioRpcError, NoBrokerError) as error:
            if request.acks != 0:
                self._on_rpc_failure(request.batches, error)
            return
        finally:
            self._wake.set()
        if request.acks == 0:
            return  # the core completed the batches when it drained them
        now = now_ms()
        if response.error != Errors.NONE:
            refusal = ProduceAnswer(Errors(response.error), message=response.message)
            for batch in request.batches:
                self.accumulator.on_answer(batch, refusal, now)
            self._progress.set()
            return
        answers: dict[tuple[str, int], broker_pb2.ProducePartitionResponse] = {
            (topic.name, part.partition): part
            for topic in response.topics
            for part in topic.partitions
        }
        for batch in request.batches:
            tp = batch.topic_partition
            part = answers.get((tp.topic, tp.partition))
            if part is None:
                answer = ProduceAnswer(
                    Errors.UNKNOWN_SERVER_ERROR, message=f"no answer for {tp} in the response"
                )
            else:
                try:
                    code = Errors(part.error)
                except ValueError:
                    code = Errors.UNKNOWN_SERVER_ERROR
                hint = part.current_leader if part.HasField("current_leader") else None
                answer = ProduceAnswer(
                    code,
                    part.base_offset,
                    part.log_start_offset,
                    part.message,
                    hint.leader_id if hint is not None else -1,
                    hint.leader_epoch if hint is not None else -1,
                )
            result = self.accumulator.on_answer(batch, answer, now)
            if result.refresh_metadata:
                if result.leader_hint is not None:
                    self.metadata.apply_leader_hint(
                        tp, *result.leader_hint, endpoints=response.node_endpoints
                    )
                else:
                    self.metadata.request_refresh()
        self._progress.set()

    def _on_rpc_failure(
        self, batches: Sequence[ProducerBatch], error: grpc.aio.AioRpcError | NoBrokerError
    ) -> None:
        now = now_ms()
        if isinstance(error, grpc.aio.AioRpcError) and error.code() in PERMANENT_REFUSALS:
            # The request was refused whole (the proto's reading): nothing
            # was written; not retriable.
            code = (
                Errors.INVALID_REQUEST
                if error.code() is grpc.StatusCode.INVALID_ARGUMENT
                else Errors.TOPIC_AUTHORIZATION_FAILED
            )
            refusal = ProduceAnswer(code, message=f"{error.code().name}: {error.details()}")
            for batch in batches:
                self.accumulator.on_answer(batch, refusal, now)
        else:
            for batch in batches:
                self.accumulator.on_network_failure(batch, now)
            self.metadata.request_refresh()
        self._progress.set()

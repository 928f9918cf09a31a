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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import grpc

from broker.client.accumulator import ProduceAnswer, ProduceRequest, RecordAccumulator
from broker.client.errors import FORCE_CLOSED, BufferExhaustedError
from broker.client.producer_batch import ProducerBatch, ProducerConfig, RecordFuture
from broker.client.sequencing import Sequencing
from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError, DeliveryFailedError, NoBrokerError
from broker.grpc_client.metadata_cache import PERMANENT_REFUSALS, MetadataCache, now_ms
from kqproto import broker_pb2
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
    ) -> None:
        """``kafka_out_of_order``: read OUT_OF_ORDER_SEQUENCE_NUMBER for the
        next expected batch as Kafka's client does, bumping the epoch and
        resending even a batch that may be in the log
        (:mod:`broker.client.sequencing`); by default kq fails such a batch
        as unknown."""
        self.config = config if config is not None else ProducerConfig()
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
        self.accumulator = RecordAccumulator(
            core_config,
            rng or random.Random(),
            Sequencing(
                self.config.enable_idempotence,
                unordered_requests=True,
                kafka_out_of_order=kafka_out_of_order,
            ),
        )
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._pending: set[asyncio.Future[RecordMetadata]] = set()
        self._fatal: BrokerClientError | None = None
        self._closed = False
        self._init_retry_at_ms = 0

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
        if self._fatal is not None:
            raise self._fatal
        self._start()
        deadline = now_ms() + self.config.max_block_ms
        partitions = await self.metadata.partition_count(topic, self.config.max_block_ms)
        timestamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        while True:
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
        if self.metadata.refresh_due():
            await self.metadata.refresh()
        if (
            acc.sequencing.needs_producer_id
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

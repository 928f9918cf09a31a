"""The producer's record accumulator (Kafka's ``RecordAccumulator`` with the
decisions of ``Sender``), as a pure state machine the gRPC driver runs.

The driver's loop, as ``Sender.runOnce``::

    acc.append(...)                       # per record: a RecordFuture
    ready = acc.ready(now_ms, leaders)    # which leaders have sendable data
    for request in acc.drain(now_ms, leaders, ready.nodes).values():
        send it; for each batch of it, later:
            acc.on_answer(batch, answer, now_ms)   # or on_network_failure
    acc.expire(now_ms)                    # delivery.timeout.ms

Rules:

- Per partition a queue of batches; a record goes into the last batch if it
  has room for it (``batch.size``), else into a new one. A record larger
  than ``max.request.size`` or ``buffer.memory`` is refused at once;
  ``buffer.memory`` counts the bytes of every batch not complete, and an
  append that would pass it raises :class:`BufferExhaustedError` (the
  driver waits for completions up to ``max.block.ms``).
- A partition's first batch is sendable (``ready``) when it is full (or
  another batch follows it), when ``linger.ms`` passed since it was made
  (``retry.backoff`` since its last attempt for a retry), while a flush is in
  progress, or once the producer closes; and not before its retry backoff
  ends, nor while the partition has ``max.in.flight.requests.per.connection``
  batches awaiting answers. Partitions without a known leader are reported
  for a metadata refresh.
- ``drain`` takes, per ready leader, at most one batch per partition,
  starting from a rotating index so that no partition starves, up to
  ``max.request.size`` bytes; with idempotence a batch gets its sequence
  here and retries go one at a time in sequence order (``sequencing``).
- Answers: :meth:`on_answer` completes, retries (queued again in sequence
  order, exponential backoff with jitter, KIP-580) or fails the batch.
- ``delivery.timeout.ms`` after a batch was made it fails with a
  ``TIMEOUT`` naming the partition and the time, whether queued or awaiting
  an answer (``Sender.getExpiredInflightBatches``); a late answer to it is
  ignored.
- Batches are sealed with ``compression.type`` by ``build_batch``.
- A transactional producer's accumulator (``transactions``) writes its
  batches with the transactional attribute and drains a partition's batch
  only once the partition is in the transaction
  (``TransactionManager.may_drain``, Kafka's ``isSendToPartitionAllowed``);
  an abort fails the batches not awaiting an answer
  (:meth:`RecordAccumulator.abort_undrained`).
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.client.errors import (
    CLIENT_ERROR,
    FORCE_CLOSED,
    MAY_HAVE_WRITTEN,
    NETWORK_EXCEPTION,
    TRANSACTION_ABORTED,
    BufferExhaustedError,
    DeliveryError,
    Outcome,
    ProducerClosedError,
    RecordTooLargeError,
    code_name,
)
from broker.client.partitioner import StickyPartitioner, partition_for_key
from broker.client.producer_batch import (
    Acks,
    ProducerBatch,
    ProducerConfig,
    RecordFuture,
    TopicPartition,
    fields_size,
    placed_size,
)
from broker.client.sequencing import Decision, Sequencing
from broker.client.transactions import TransactionManager
from broker.errors import Errors
from partition_log.batch import HEADER_SIZE, Compression
from partition_log.records import Header, Record

__all__ = [
    "INVALID_METADATA",
    "REFRESH_METADATA",
    "AnswerResult",
    "Flush",
    "ProduceAnswer",
    "ProduceRequest",
    "ReadyCheck",
    "RecordAccumulator",
]

# InvalidMetadataException subclasses: the client refreshes its metadata
# (brokers.md §6.4), or takes the KIP-951 leader hint of the answer.
INVALID_METADATA: frozenset[int] = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.KAFKA_STORAGE_ERROR,
        NETWORK_EXCEPTION,
    }
)
REFRESH_METADATA: frozenset[int] = INVALID_METADATA | {Errors.REQUEST_TIMED_OUT}
"""The answers after which the client refreshes its metadata before the
retry.  A produce the leader could not gather its acks for within the
request's timeout may be at a leader cut off from the others, whose
partition the controllers have since given to another broker.  Kafka's
producer times its own request out at that same ``request.timeout.ms``, so
it usually sees a disconnect, not the answer, and refreshes
(``NetworkClient.handleTimedOutRequests``); kq's client waits a margin past
the broker's timeout to hear its answer, and refreshes on it instead, or it
would retry at the cut-off leader until ``delivery.timeout.ms``."""


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    """A broker's answer for one partition of a Produce request
    (``ProduceResponse.PartitionResponse``)."""

    error: Errors = Errors.NONE
    base_offset: int = -1
    log_start_offset: int = -1
    message: str = ""
    # KIP-951: the partition's current leader and epoch, -1 if not given.
    current_leader: int = -1
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """What to send to one leader: one batch per partition, with its bytes
    (``batch.payload``) built with the batch's producer state."""

    node: int
    acks: Acks
    timeout_ms: int
    compression: Compression
    batches: tuple[ProducerBatch, ...]

    def payloads(self) -> dict[TopicPartition, bytes]:
        """Each partition's batch bytes, built with ``compression.type``."""
        return {b.topic_partition: b.payload(self.compression) for b in self.batches}


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """``RecordAccumulator.ReadyCheckResult``."""

    nodes: frozenset[int]
    # When a lingering batch becomes sendable; -1 when no batch waits on
    # time (nothing queued, or only batches waiting for answers).
    next_ready_check_ms: int
    unknown_leader_topics: frozenset[str]


@dataclass(frozen=True, slots=True)
class AnswerResult:
    decision: Decision
    # Ask for a metadata refresh (or use the answer's leader hint).
    refresh_metadata: bool
    # KIP-951: the partition's leader and leader epoch the answer named.
    leader_hint: tuple[int, int] | None = None


@dataclass(eq=False)
class Flush:
    """A ``flush()`` in progress: done once every record appended before it
    is complete (``awaitFlushCompletion``)."""

    futures: list[RecordFuture] = field(default_factory=list)
    # The futures before this index are done: each is looked at until it
    # is, once after (ready and drain ask on every call during a flush).
    _checked: int = 0

    @property
    def done(self) -> bool:
        futures = self.futures
        while self._checked < len(futures) and futures[self._checked].done:
            self._checked += 1
        return self._checked == len(futures)


def _error(name: str, code: int, message: str, maybe_written: bool) -> DeliveryError:
    return DeliveryError(name, code, message, Outcome.INFO if maybe_written else Outcome.FAIL)


class RecordAccumulator:
    """The producer's queues of batches per partition and the decisions on
    them (module docstring); one per producer."""

    def __init__(
        self,
        config: ProducerConfig,
        rng: random.Random,
        sequencing: Sequencing | None = None,
        transactions: TransactionManager | None = None,
    ) -> None:
        self.config = config
        self._rng = rng
        if transactions is not None:
            sequencing = transactions.sequencing
        self.sequencing = (
            sequencing if sequencing is not None else Sequencing(config.enable_idempotence)
        )
        if self.sequencing.idempotent != config.enable_idempotence:
            raise ValueError("the sequencing's idempotence differs from enable_idempotence")
        self.transactions = transactions
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._sticky: dict[str, StickyPartitioner] = {}
        # Each topic's partition count, as the last append saw it.
        self._partition_counts: dict[str, int] = {}
        # Every batch not complete (queued or awaiting an answer), by id,
        # oldest first.
        self._incomplete: dict[int, ProducerBatch] = {}
        self._awaiting: dict[TopicPartition, int] = {}
        # Per node, the partition its next drain starts at (Kafka's
        # drainIndex, kept as the partition rather than its position, since
        # a drain looks only at the partitions with batches queued).
        self._drain_from: dict[int, TopicPartition] = {}
        self._flushes: list[Flush] = []
        self._failed_by_bump: list[ProducerBatch] = []
        self.buffered_bytes = 0
        self.closed = False

    # -- appending ------------------------------------------------------------

    def choose_partition(
        self, topic: str, key: bytes | None, partitions: int, available: Sequence[int]
    ) -> int:
        """murmur2 for a key; the sticky partition for none."""
        if key is not None:
            return partition_for_key(key, partitions)
        sticky = self._sticky.get(topic)
        if sticky is None:
            sticky = StickyPartitioner(topic, self.config.batch_size, self._rng)
            self._sticky[topic] = sticky
        return sticky.partition(partitions, available)

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        now_ms: int,
        partitions: int,
        available: Sequence[int] = (),
        partition: int | None = None,
        headers: tuple[Header, ...] = (),
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queue one record; returns its future. ``partitions``: the topic's
        partition count; ``available``: those with a leader (for the sticky
        partitioner); ``partition`` overrides the partitioner."""
        if self.closed:
            raise ProducerClosedError("cannot send after the producer is closed")
        self._partition_counts[topic] = partitions
        sticky: StickyPartitioner | None = None
        if partition is None:
            partition = self.choose_partition(topic, key, partitions, available)
            if key is None:
                sticky = self._sticky[topic]
                # A switch held back while the batch was not full is made as
                # soon as it is (RecordAccumulator.partitionChanged).
                if self._all_batches_full(TopicPartition(topic, partition)) and (
                    sticky.record_appended(0, partitions, available)
                ):
                    partition = sticky.partition(partitions, available)
        elif not 0 <= partition < partitions:
            raise ValueError(
                f"partition {partition} of topic {topic!r} is not in [0, {partitions})"
            )
        tp = TopicPartition(topic, partition)
        timestamp = now_ms if timestamp_ms is None else timestamp_ms
        fields = fields_size(key, value, headers)
        alone = placed_size(fields, 0, 0) + HEADER_SIZE
        config = self.config
        # KafkaProducer.ensureValidRecordSize.
        if alone > config.max_request_size or alone > config.buffer_memory:
            name, limit = (
                ("max_request_size", config.max_request_size)
                if alone > config.max_request_size
                else ("buffer_memory", config.buffer_memory)
            )
            raise RecordTooLargeError(
                f"a record for {tp} is {alone} bytes as a batch, more than {name} {limit}"
            )
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        last = queue[-1] if queue and not queue[-1].closed else None
        size = alone
        if last is not None:
            size = placed_size(fields, len(last.records), timestamp - last.records[0].timestamp)
            if not last.has_room_for(size, config.batch_size):
                last.closed = True
                last = None
                size = alone
        if self.buffered_bytes + size > self.config.buffer_memory:
            raise BufferExhaustedError(
                f"buffer_memory {self.config.buffer_memory} bytes: {self.buffered_bytes} in "
                f"batches not yet complete, {size} more needed for {tp}"
            )
        if last is None:
            last = ProducerBatch(
                tp, created_ms=now_ms, size_bytes=0, transactional=self.transactions is not None
            )
            queue.append(last)
            self._incomplete[id(last)] = last
        index = len(last.records)
        future = RecordFuture(tp, index)
        last.records.append(Record(index, timestamp, key, value, headers))
        last.futures.append(future)
        last.size_bytes += size
        self.buffered_bytes += size
        if last.size_bytes >= self.config.batch_size:
            last.closed = True
        if sticky is not None:
            # KIP-794: switch once batch.size bytes went to the partition,
            # held back while its last batch is not full (at most to twice).
            sticky.record_appended(
                size, partitions, available, enable_switch=self._all_batches_full(tp)
            )
        return future

    def _all_batches_full(self, tp: TopicPartition) -> bool:
        # RecordAccumulator.allBatchesFull: only the last may be open.
        queue = self._queues.get(tp)
        return not queue or queue[-1].closed

    # -- flush and close ------------------------------------------------------

    def begin_flush(self) -> Flush:
        """Make every queued batch sendable until the records appended so
        far are complete (``beginFlush``); the driver waits for ``done``."""
        flush = Flush([f for b in self._incomplete.values() for f in b.futures])
        if not flush.done:
            self._flushes.append(flush)
        return flush

    def close(self) -> None:
        """Take no more records; everything queued becomes sendable."""
        self.closed = True

    def abort_incomplete(self, now_ms: int) -> list[ProducerBatch]:
        """Force close: fail every batch not complete (``abortIncompleteBatches``)."""
        self.closed = True
        failed = []
        for batch in list(self._incomplete.values()):
            error = _error(
                FORCE_CLOSED,
                CLIENT_ERROR,
                f"{batch.topic_partition}: the producer was closed forcefully with "
                f"{batch.record_count} record(s) not acknowledged",
                batch.maybe_written or batch.awaiting,
            )
            self._finish_failed(batch, error)
            failed.append(batch)
        return failed

    @property
    def incomplete(self) -> int:
        """Batches not complete (queued or awaiting an answer)."""
        return len(self._incomplete)

    def queued(self, tp: TopicPartition) -> tuple[ProducerBatch, ...]:
        return tuple(self._queues.get(tp, ()))

    def awaiting(self, tp: TopicPartition) -> int:
        return self._awaiting.get(tp, 0)

    # -- ready and drain ------------------------------------------------------

    def _flushing(self) -> bool:
        self._flushes = [f for f in self._flushes if not f.done]
        return bool(self._flushes)

    def ready(self, now_ms: int, leaders: Mapping[TopicPartition, int | None]) -> ReadyCheck:
        """The leaders with a sendable batch (``RecordAccumulator.ready``).
        Pending epoch bumps happen first (their failed batches come back
        through :meth:`take_failed`); a partition whose batch the
        sequencing holds back (no producer id, a bump or an earlier sequence
        awaited) is not ready, so a driver waits rather than spins."""
        self._failed_by_bump.extend(self._bump(now_ms))
        nodes: set[int] = set()
        unknown: set[str] = set()
        next_check = -1
        flushing = self._flushing()
        for tp, queue in self._queues.items():
            if not queue:
                continue
            leader = leaders.get(tp)
            if leader is None:
                unknown.add(tp.topic)
                continue
            if self._awaiting.get(tp, 0) >= self.config.max_in_flight_requests_per_connection:
                continue
            first = queue[0]
            if first.attempts > 0:
                wait_until = first.retry_at_ms
            else:
                wait_until = first.created_ms + self.config.linger_ms
            full = len(queue) > 1 or first.closed
            if first.attempts > 0 and now_ms < first.retry_at_ms:
                sendable = False
            else:
                sendable = full or now_ms >= wait_until or flushing or self.closed
            if sendable:
                if self._may_drain(first):
                    nodes.add(leader)
            elif next_check < 0 or wait_until < next_check:
                next_check = wait_until
        if self._sticky:
            self._update_load_stats(leaders)
        return ReadyCheck(frozenset(nodes), next_check, frozenset(unknown))

    def _update_load_stats(self, leaders: Mapping[TopicPartition, int | None]) -> None:
        """KIP-794 (``RecordAccumulator.partitionReady``): the queue sizes
        of each sticky topic's partitions with a leader weigh its next
        partition, once every partition of the topic has had a batch (a
        partition never queued would never be chosen)."""
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in self._queues:
            if tp.topic in self._sticky:
                by_topic.setdefault(tp.topic, []).append(tp)
        for topic, sticky in self._sticky.items():
            tps = sorted(by_topic.get(topic, ()))
            if not self.config.partitioner_adaptive_partitioning_enable or len(
                tps
            ) < self._partition_counts.get(topic, 0):
                sticky.update_load_stats((), ())
                continue
            led = [tp for tp in tps if leaders.get(tp) is not None]
            sticky.update_load_stats(
                [len(self._queues[tp]) for tp in led], [tp.partition for tp in led]
            )

    def drain(
        self,
        now_ms: int,
        leaders: Mapping[TopicPartition, int | None],
        nodes: Iterable[int],
    ) -> dict[int, ProduceRequest]:
        """The requests to send now, one per ready leader (``drain``). Call
        :meth:`ready` first."""
        self._failed_by_bump.extend(self._bump(now_ms))
        by_node: dict[int, list[TopicPartition]] = {}
        # Only the partitions with batches queued: a producer that wrote to
        # thousands of partitions keeps a queue for each, and walking them
        # all on every drain made a round of sends cost their count.
        for tp in sorted(tp for tp, queue in self._queues.items() if queue):
            leader = leaders.get(tp)
            if leader is not None:
                by_node.setdefault(leader, []).append(tp)
        requests: dict[int, ProduceRequest] = {}
        flushing = self._flushing()
        for node in sorted(set(nodes)):
            parts = by_node.get(node, [])
            if not parts:
                continue
            last = self._drain_from.get(node)
            start = 0 if last is None else bisect.bisect_left(parts, last) % len(parts)
            size = 0
            taken: list[ProducerBatch] = []
            for i in range(len(parts)):
                index = (start + i) % len(parts)
                tp = parts[index]
                # drainBatchesForOneNode: the next drain starts here, so a
                # partition left out for lack of room goes first next time.
                self._drain_from[node] = tp
                queue = self._queues[tp]
                if not queue:
                    continue
                first = queue[0]
                if first.attempts > 0 and now_ms < first.retry_at_ms:
                    continue
                if self._awaiting.get(tp, 0) >= self.config.max_in_flight_requests_per_connection:
                    continue
                if first.attempts == 0 and not (
                    len(queue) > 1
                    or first.closed
                    or now_ms >= first.created_ms + self.config.linger_ms
                    or flushing
                    or self.closed
                ):
                    continue
                if taken and size + first.size_bytes > self.config.max_request_size:
                    break
                if not self._may_drain(first):
                    continue
                queue.popleft()
                first.closed = True
                self.sequencing.assign(first)
                self.sequencing.note_sent(first)
                first.attempts += 1
                first.last_attempt_ms = now_ms
                first.awaiting = True
                self._awaiting[tp] = self._awaiting.get(tp, 0) + 1
                size += first.size_bytes
                taken.append(first)
            if taken:
                requests[node] = ProduceRequest(
                    node,
                    self.config.acks,
                    self.config.request_timeout_ms,
                    self.config.compression_type,
                    tuple(taken),
                )
        if self.config.acks is Acks.NONE:
            # acks=0: no answer comes; the records count as sent, their
            # offsets unknown (Sender: "complete the batch immediately").
            for request in requests.values():
                for batch in request.batches:
                    self._settle(batch)
                    self._finish_completed(batch, -1, Outcome.INFO)
        return requests

    def _may_drain(self, batch: ProducerBatch) -> bool:
        """The sequencing lets it go, and a transactional batch's partition
        is in the transaction."""
        if self.transactions is not None and not self.transactions.may_drain(batch.topic_partition):
            return False
        return self.sequencing.may_drain(batch)

    def abort_undrained(self, why: str) -> list[ProducerBatch]:
        """A transaction is being aborted (or can only be): fail every batch
        not awaiting an answer, with ``TransactionAbortedException`` (Kafka's
        ``abortUndrainedBatches``; kq drops retries too, the abort's marker
        at the bumped epoch fencing any attempt of theirs still on its way,
        where Kafka sends them again first). ``info`` for a batch an attempt
        of which may have been written, else ``fail``."""
        failed = []
        for batch in list(self._incomplete.values()):
            if batch.awaiting:
                continue
            error = _error(
                TRANSACTION_ABORTED,
                CLIENT_ERROR,
                f"{batch.topic_partition}: {batch.record_count} record(s) dropped: {why}",
                batch.maybe_written,
            )
            self._finish_failed(batch, error)
            failed.append(batch)
        return failed

    def take_failed(self) -> list[ProducerBatch]:
        """Batches failed by an epoch bump since the last call."""
        failed, self._failed_by_bump = self._failed_by_bump, []
        return failed

    def _bump(self, now_ms: int) -> list[ProducerBatch]:
        failed = []
        for batch in self.sequencing.maybe_bump():
            queue = self._queues.get(batch.topic_partition)
            if queue is not None and batch in queue:
                queue.remove(batch)
            why = (
                "it may already be in the log"
                if batch.maybe_written
                else "a later batch of the partition may already be in the log"
            )
            error = _error(
                Errors.OUT_OF_ORDER_SEQUENCE_NUMBER.name,
                int(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER),
                f"{batch.topic_partition}: the producer's epoch was bumped and this batch of "
                f"{batch.record_count} record(s) cannot be sent under a new sequence: {why} "
                f"(answers {', '.join(code_name(c) for c in batch.answers) or 'none'})",
                batch.maybe_written,
            )
            self._finish_failed(batch, error)
            failed.append(batch)
        return failed

    # -- answers --------------------------------------------------------------

    def _settle(self, batch: ProducerBatch) -> None:
        if batch.awaiting:
            batch.awaiting = False
        tp = batch.topic_partition
        count = self._awaiting.get(tp, 0)
        if count <= 1:
            self._awaiting.pop(tp, None)
        else:
            self._awaiting[tp] = count - 1

    def on_network_failure(self, batch: ProducerBatch, now_ms: int) -> AnswerResult:
        """The request carrying ``batch`` got no answer (a lost connection,
        a request timeout): as Kafka's ``NETWORK_EXCEPTION``."""
        return self._answer(batch, NETWORK_EXCEPTION, -1, -1, "no answer", now_ms, None)

    def on_answer(self, batch: ProducerBatch, answer: ProduceAnswer, now_ms: int) -> AnswerResult:
        """Handle the broker's answer for ``batch`` (``Sender.completeBatch``)."""
        hint = (
            (answer.current_leader, answer.current_leader_epoch)
            if answer.current_leader >= 0 and answer.current_leader_epoch >= 0
            else None
        )
        return self._answer(
            batch,
            int(answer.error),
            answer.base_offset,
            answer.log_start_offset,
            answer.message,
            now_ms,
            hint,
        )

    def _answer(
        self,
        batch: ProducerBatch,
        code: int,
        base_offset: int,
        log_start_offset: int,
        message: str,
        now_ms: int,
        hint: tuple[int, int] | None,
    ) -> AnswerResult:
        if batch.done or not batch.awaiting:
            # Expired or failed meanwhile: the answer comes too late.
            if code in MAY_HAVE_WRITTEN:
                self.sequencing.mark_maybe_written(batch)
            return AnswerResult(Decision.IGNORED, False)
        self._settle(batch)
        may_retry = (
            now_ms < batch.created_ms + self.config.delivery_timeout_ms
            and batch.attempts <= self.config.retries
        )
        decision = self.sequencing.decide(batch, code, log_start_offset, may_retry)
        refresh = code in REFRESH_METADATA
        if decision is Decision.COMPLETE:
            offset = base_offset if code == Errors.NONE else -1
            self.sequencing.completed(batch, offset)
            self._finish_completed(batch, offset, Outcome.OK)
        elif decision is Decision.RETRY:
            self._reenqueue(batch, now_ms)
        else:
            detail = f": {message}" if message else ""
            error = _error(
                code_name(code),
                code,
                f"{batch.topic_partition}: {batch.record_count} record(s) failed after "
                f"{batch.attempts} attempt(s){detail}",
                batch.maybe_written,
            )
            self._finish_failed(batch, error)
        return AnswerResult(decision, refresh, hint if refresh else None)

    def _reenqueue(self, batch: ProducerBatch, now_ms: int) -> None:
        """``reenqueue`` with ``insertInSequenceOrder``: at the front, behind
        queued retries of lower sequence."""
        # KIP-580 exponential backoff with 20% jitter.
        base = min(
            self.config.retry_backoff_max_ms,
            self.config.retry_backoff_ms * 2 ** min(batch.attempts - 1, 30),
        )
        jitter = 1.0 + self._rng.uniform(-0.2, 0.2) if base > 0 else 1.0
        batch.retry_at_ms = now_ms + int(base * jitter)
        queue = self._queues.setdefault(batch.topic_partition, deque())
        position = 0
        if batch.has_sequence:
            while (
                position < len(queue)
                and queue[position].has_sequence
                and queue[position].base_sequence < batch.base_sequence
            ):
                position += 1
        queue.insert(position, batch)

    def _finish_completed(self, batch: ProducerBatch, offset: int, outcome: Outcome) -> None:
        self._release(batch)
        batch.complete(offset, outcome)

    def _finish_failed(self, batch: ProducerBatch, error: DeliveryError) -> None:
        if batch.awaiting:
            self._settle(batch)
        self.sequencing.failed(batch)
        queue = self._queues.get(batch.topic_partition)
        if queue is not None and batch in queue:
            queue.remove(batch)
        self._release(batch)
        batch.fail(error)

    def _release(self, batch: ProducerBatch) -> None:
        if self._incomplete.pop(id(batch), None) is not None:
            self.buffered_bytes -= batch.size_bytes

    # -- delivery timeout -----------------------------------------------------

    def expire(self, now_ms: int) -> list[ProducerBatch]:
        """Fail the batches made ``delivery.timeout.ms`` ago or more
        (``expiredBatches``, ``getExpiredInflightBatches``): ``info`` if
        an attempt may have been written or one awaits its answer."""
        expired = []
        for batch in list(self._incomplete.values()):
            if now_ms - batch.created_ms < self.config.delivery_timeout_ms:
                continue
            maybe = batch.maybe_written or batch.awaiting
            error = _error(
                "TIMEOUT",
                CLIENT_ERROR,
                f"expiring {batch.record_count} record(s) for {batch.topic_partition}: "
                f"{now_ms - batch.created_ms} ms has passed since batch creation "
                f"(delivery_timeout_ms {self.config.delivery_timeout_ms})",
                maybe,
            )
            if batch.awaiting:
                self.sequencing.mark_maybe_written(batch)
            self._finish_failed(batch, error)
            expired.append(batch)
        return expired

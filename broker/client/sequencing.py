"""The idempotent producer's bookkeeping and its reading of every produce
answer (Kafka's ``TransactionManager`` for idempotence without
transactions, ``TxnPartitionMap``/``TxnPartitionEntry``, and
``Sender.completeBatch``/``canRetry``).

State: the producer id and epoch from InitProducerId, and per partition the
next sequence, the last acknowledged sequence and offset, the batches that
hold a sequence and are not complete (sent, or queued again for a retry)
ordered by sequence, and whether the partition waits for an epoch bump.

Rules (each cites where Kafka has it):

- A fresh batch gets the partition's next sequence when it is drained
  (``RecordAccumulator.drain``). None is given while the producer has no id,
  or while the partition still has batches of an older epoch (a batch at
  sequence 0 of the new epoch must not overtake them)
  (``shouldStopDrainBatchesForPartition``). Nothing of a partition is sent
  while it waits for an epoch bump.
- A batch queued again for a retry keeps its epoch and sequence, and is sent
  only as the partition's first sequence not acknowledged: retries go one at
  a time, in order (``firstInFlightSequence``).
- The answer decides (:meth:`Sequencing.decide`): success and
  ``DUPLICATE_SEQUENCE_NUMBER`` complete the batch; retriable errors retry
  it (within ``retries`` and ``delivery.timeout.ms``);
  ``OUT_OF_ORDER_SEQUENCE_NUMBER`` retries a batch that is not the next
  expected one (it only follows a batch that failed), and for the next
  expected one, as ``UNKNOWN_PRODUCER_ID``, asks for an epoch bump and
  retries under the new epoch (KIP-360); everything else fails the batch.
- A batch that fails after it got a sequence leaves a gap, so its partition
  asks for an epoch bump (``handleFailedBatch``: a new epoch starts again at
  sequence 0, which the broker takes, ``ProducerAppendInfo.checkSequence``).
- The bump (:meth:`Sequencing.maybe_bump`) happens once no batch of the
  partition awaits an answer: the epoch grows by one (a new producer id is
  needed at 32767) and the partition's queued batches lose their sequences
  and take new ones in the same order when drained again
  (``startSequencesAtBeginning``).

Where kq is stricter than Kafka: a batch is never given a new epoch or
sequence if it may already have been written (an earlier attempt ended in a
timeout, a lost connection, ``NOT_LEADER_OR_FOLLOWER``...), since the broker
could not tell the new attempt for a duplicate (the Redpanda #3039
duplicates), nor if a batch of a later sequence may be in the log (a broker
without state for the producer takes any sequence, so the batch would land
after it). Where Kafka would bump and resend it, kq fails it: ``info`` if it
may have been written, else ``fail``. A batch answered
``OUT_OF_ORDER_SEQUENCE_NUMBER`` at or below an acknowledged sequence fails
at once (Kafka retries it until ``delivery.timeout.ms``). Kafka's
"unresolved sequences" of expired batches become the same epoch bump.

With ``kafka_out_of_order`` the client reads ``OUT_OF_ORDER_SEQUENCE_NUMBER``
for the next expected batch as Kafka's does (``TransactionManager.canRetry``:
"For the idempotent producer, retry all OUT_OF_ORDER_SEQUENCE_NUMBER errors"
after ``requestIdempotentEpochBumpForPartition``): a broker answers a retry
of a batch it holds as a duplicate (``findDuplicateBatch``, five batches, as
many as may be in flight), so the refusal says the batch and every later one
are not in its log, and the bump resends the partition's batches from
sequence 0 of the new epoch even if an attempt of theirs may have been
written (``startSequencesAtBeginning``). That is the client real users run;
a broker that refuses a duplicate (Redpanda #3039) then gets the batch twice,
which kq's stricter default would hide by failing the batch as unknown.

A transactional producer (``transactional``) never bumps its epoch itself:
the epoch changes only at the end of each transaction, through the
coordinator's EndTxn answer (KIP-890, :meth:`Sequencing.start_epoch`,
which starts every partition again at sequence 0). A batch that would ask
for a bump fails instead, and its failure makes the transaction abortable
(``broker.client.transactions``): Kafka's transactional producer also lets
such a batch fail (``canRetry``), but rewrites the sequences of the batches
after one that failed definitely; kq's aborts them with the transaction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from broker.client.errors import MAY_HAVE_WRITTEN, RETRIABLE
from broker.client.producer_batch import ProducerBatch, TopicPartition
from broker.errors import Errors

__all__ = ["NO_PRODUCER", "Decision", "ProducerIdAndEpoch", "Sequencing"]

INT16_MAX = 2**15 - 1
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    epoch: int

    @property
    def is_valid(self) -> bool:
        return self.producer_id >= 0 and self.epoch >= 0


NO_PRODUCER = ProducerIdAndEpoch(-1, -1)


class Decision(enum.Enum):
    """What the accumulator does with an answered batch."""

    COMPLETE = "complete"  # resolve the futures with the offsets
    RETRY = "retry"  # queue it again in sequence order, after a backoff
    FAIL = "fail"  # fail the futures
    IGNORED = "ignored"  # a late answer: the batch no longer awaited one


@dataclass(slots=True)
class _PartitionEntry:
    """Kafka's ``TxnPartitionEntry``."""

    producer: ProducerIdAndEpoch
    next_sequence: int = 0
    last_acked_sequence: int = -1
    last_acked_offset: int = -1
    # Batches holding a sequence of this partition, not complete, by sequence.
    in_flight: list[ProducerBatch] = field(default_factory=list)
    bump_required: bool = False
    # The highest last sequence of this epoch that is or may be in the log
    # (acknowledged, or an attempt ended without telling).
    highest_maybe_in_log: int = -1
    # The bump was asked by the broker's OUT_OF_ORDER_SEQUENCE_NUMBER for
    # the next expected batch, read as Kafka's client does
    # (kafka_out_of_order): every batch is resent under the new epoch.
    bump_resends_all: bool = False


class Sequencing:
    """The sequence bookkeeping of one producer. With idempotence off it
    assigns nothing and decides by retriability alone (Kafka's producer
    without a ``TransactionManager``)."""

    def __init__(
        self,
        idempotent: bool,
        *,
        unordered_requests: bool = False,
        kafka_out_of_order: bool = False,
        transactional: bool = False,
    ) -> None:
        if transactional and not idempotent:
            raise ValueError("a transactional producer is idempotent")
        self.idempotent = idempotent
        # The epoch changes only at a transaction's end (module docstring).
        self.transactional = transactional
        # Read OUT_OF_ORDER_SEQUENCE_NUMBER for the next expected batch as
        # Kafka's client does (module docstring).
        self.kafka_out_of_order = kafka_out_of_order
        # The transport may process a producer's requests to one broker in
        # another order than sent (separate gRPC calls), where Kafka's one
        # connection keeps them in order: two more rules keep the log in
        # order (may_drain and the OUT_OF_ORDER_SEQUENCE_NUMBER reading).
        self.unordered_requests = unordered_requests
        self.producer = NO_PRODUCER
        self._partitions: dict[TopicPartition, _PartitionEntry] = {}
        # Whether some partition may have asked for a bump: without one,
        # maybe_bump looks at none (a producer of thousands of partitions
        # asks on every send round).
        self._bump_pending = False
        # How many epoch bumps happened (for tests and metrics).
        self.bumps = 0

    # -- the producer id ------------------------------------------------------

    @property
    def needs_producer_id(self) -> bool:
        """True while an idempotent producer has no id: the driver sends
        InitProducerId and calls :meth:`set_producer_id`."""
        return self.idempotent and not self.producer.is_valid

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """The InitProducerId answer. Partitions keep their old id and epoch
        until their batches of it complete (``maybeUpdateProducerIdAndEpoch``)."""
        new = ProducerIdAndEpoch(producer_id, epoch)
        if not new.is_valid or epoch > INT16_MAX:
            raise ValueError(
                f"InitProducerId gave an invalid producer id {producer_id}, epoch {epoch}"
            )
        self.producer = new

    def start_epoch(self, producer_id: int, epoch: int) -> None:
        """A transactional producer's new id and epoch (InitProducerId, or
        an EndTxn answer): every partition starts again at sequence 0 and
        forgets what it waited for. Only while no batch holds a sequence
        (the transaction's batches are complete)."""
        self.set_producer_id(producer_id, epoch)
        self._partitions.clear()

    def _entry(self, tp: TopicPartition) -> _PartitionEntry:
        entry = self._partitions.get(tp)
        if entry is None:
            entry = _PartitionEntry(self.producer)
            self._partitions[tp] = entry
        return entry

    # -- queries ------------------------------------------------------------

    def next_sequence(self, tp: TopicPartition) -> int:
        return self._entry(tp).next_sequence

    def last_acked_sequence(self, tp: TopicPartition) -> int:
        return self._entry(tp).last_acked_sequence

    def in_flight(self, tp: TopicPartition) -> tuple[ProducerBatch, ...]:
        return tuple(self._entry(tp).in_flight)

    def bump_required(self, tp: TopicPartition) -> bool:
        return self._entry(tp).bump_required

    # -- draining -------------------------------------------------------------

    def may_drain(self, batch: ProducerBatch) -> bool:
        """Whether ``batch`` may be sent now (the negation of
        ``shouldStopDrainBatchesForPartition``)."""
        if not self.idempotent:
            return True
        if not self.producer.is_valid:
            return False
        entry = self._entry(batch.topic_partition)
        if entry.bump_required and not self.transactional:
            # Nothing goes under the old epoch once a new one is due: a
            # retry would only be refused again, and would hold the bump
            # back while it awaits its answer.
            return False
        if not batch.has_sequence:
            # A sequence 0 of the new epoch must not overtake them.
            if entry.in_flight and entry.producer != self.producer:
                return False
            # kq over gRPC: concurrent Produce calls may reach the broker in
            # another order than sent, and a broker without this producer's
            # state takes any sequence (ProducerAppendInfo.checkSequence), so
            # a later batch could land first. Until a batch of this epoch is
            # acknowledged (the broker then refuses anything but the next
            # sequence, and a refused batch that overtook is retried:
            # ``sent_behind``) one batch at a time.
            return not (
                self.unordered_requests
                and entry.last_acked_sequence < 0
                and any(b.awaiting for b in entry.in_flight)
            )
        # A retry goes only as the first unacknowledged sequence.
        return bool(entry.in_flight) and entry.in_flight[0] is batch

    def note_sent(self, batch: ProducerBatch) -> None:
        """Record whether ``batch``, being sent now, goes behind a batch of
        a lower sequence of its partition that awaits an answer."""
        if not self.idempotent or not batch.has_sequence or not self.unordered_requests:
            batch.sent_behind = False
            return
        entry = self._entry(batch.topic_partition)
        batch.sent_behind = any(
            held.awaiting and held is not batch and held.producer_epoch == batch.producer_epoch
            and held.base_sequence < batch.base_sequence
            for held in entry.in_flight
        )  # fmt: skip

    def assign(self, batch: ProducerBatch) -> None:
        """Give a fresh batch being drained the partition's next sequence."""
        if not self.idempotent or batch.has_sequence:
            return
        entry = self._entry(batch.topic_partition)
        if entry.producer != self.producer and not entry.in_flight:
            # maybeUpdateProducerIdAndEpoch: a new id or epoch starts at 0.
            entry.producer = self.producer
            entry.next_sequence = 0
            entry.last_acked_sequence = -1
        batch.set_producer_state(
            entry.producer.producer_id, entry.producer.epoch, entry.next_sequence
        )
        # Sequences wrap after 2^31-1 (DefaultRecordBatch.incrementSequence).
        entry.next_sequence = (entry.next_sequence + batch.record_count) % (INT32_MAX + 1)
        entry.in_flight.append(batch)

    # -- answers --------------------------------------------------------------

    def decide(
        self, batch: ProducerBatch, code: int, log_start_offset: int, may_retry: bool
    ) -> Decision:
        """What to do with ``batch`` answered ``code``; ``may_retry`` is
        false once ``retries`` or ``delivery.timeout.ms`` are spent
        (``Sender.canRetry``). Records whether the attempt may have been
        written, and asks for epoch bumps."""
        batch.awaiting = False
        batch.answers.append(code)
        if code in MAY_HAVE_WRITTEN:
            self.mark_maybe_written(batch)
        if code in (Errors.NONE, Errors.DUPLICATE_SEQUENCE_NUMBER):
            return Decision.COMPLETE
        if not self.idempotent:
            return Decision.RETRY if may_retry and code in RETRIABLE else Decision.FAIL
        entry = self._entry(batch.topic_partition)
        if code == Errors.UNKNOWN_PRODUCER_ID:
            if log_start_offset == -1:
                # TransactionManager.canRetry: no log start offset in the
                # answer, retry until one comes.
                return Decision.RETRY if may_retry else Decision.FAIL
            return self._retry_under_new_epoch(batch, entry, may_retry)
        if code == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER:
            behind = (entry.last_acked_sequence - batch.base_sequence) % (INT32_MAX + 1)
            if entry.last_acked_sequence >= 0 and behind < 2**30:
                # At or below a sequence already acknowledged: the broker
                # wants later ones and never takes this batch in this epoch.
                # Kafka retries it until delivery.timeout.ms; kq fails it at
                # once (and the gap asks for a new epoch).
                return Decision.FAIL
            if batch.base_sequence != entry.last_acked_sequence + 1 or batch.sent_behind:
                # Not the next expected batch: it follows one that failed or
                # is being retried, and is sent again after it. Or it was
                # sent while an earlier batch awaited its answer, and the
                # broker may have taken it first: concurrent gRPC calls are
                # not processed in the order sent, where Kafka's requests on
                # one connection are. Sent again as the first unacknowledged
                # batch, a real gap is refused again and then bumps.
                return Decision.RETRY if may_retry else Decision.FAIL
            # The next expected batch refused: the broker's sequence has a
            # gap (it lost acknowledged batches, or their state).
            if self.kafka_out_of_order and not self.transactional:
                # TransactionManager.canRetry: bump and retry, trusting the
                # broker that the batch is not in its log.
                self._require_bump(entry)
                entry.bump_resends_all = True
                return Decision.RETRY if may_retry else Decision.FAIL
            return self._retry_under_new_epoch(batch, entry, may_retry)
        return Decision.RETRY if may_retry and code in RETRIABLE else Decision.FAIL

    def _retry_under_new_epoch(
        self, batch: ProducerBatch, entry: _PartitionEntry, may_retry: bool
    ) -> Decision:
        # KIP-360: bump the epoch and send again from sequence 0 -- unless
        # that could duplicate or reorder (kq's rule, stricter than Kafka).
        # A transactional producer's epoch changes only at the
        # transaction's end: the batch fails and the transaction aborts.
        if self.transactional:
            return Decision.FAIL
        self._require_bump(entry)
        if not may_retry or not self._safe_to_resequence(batch, entry):
            return Decision.FAIL
        return Decision.RETRY

    @staticmethod
    def _safe_to_resequence(batch: ProducerBatch, entry: _PartitionEntry) -> bool:
        """Whether ``batch`` may be sent under a new epoch and sequence:
        not if an attempt of it may be in the log (the broker could not see
        the new attempt as a duplicate, Redpanda #3039), nor if a batch of a
        later sequence may be (the batch would land after it). A broker
        without state for the producer takes any sequence
        (``ProducerAppendInfo.checkSequence``), so a later batch can be in
        the log before this one."""
        if batch.maybe_written:
            return False
        return not (batch.has_sequence and entry.highest_maybe_in_log > batch.last_sequence)

    def mark_maybe_written(self, batch: ProducerBatch) -> None:
        """An attempt of ``batch`` ended without telling whether it was
        written (an answer in ``MAY_HAVE_WRITTEN``, or it expired while
        awaiting its answer)."""
        batch.maybe_written = True
        if not self.idempotent or not batch.has_sequence:
            return
        entry = self._entry(batch.topic_partition)
        if (batch.producer_id, batch.producer_epoch) == (
            entry.producer.producer_id,
            entry.producer.epoch,
        ):
            entry.highest_maybe_in_log = max(entry.highest_maybe_in_log, batch.last_sequence)

    def completed(self, batch: ProducerBatch, base_offset: int) -> None:
        """``handleCompletedBatch``: the batch is acknowledged."""
        if not self.idempotent or not batch.has_sequence:
            return
        entry = self._entry(batch.topic_partition)
        self._forget(entry, batch)
        if (batch.producer_id, batch.producer_epoch) == (
            entry.producer.producer_id,
            entry.producer.epoch,
        ):
            entry.last_acked_sequence = max(entry.last_acked_sequence, batch.last_sequence)
            entry.highest_maybe_in_log = max(entry.highest_maybe_in_log, batch.last_sequence)
        if base_offset >= 0:
            entry.last_acked_offset = max(
                entry.last_acked_offset, base_offset + batch.record_count - 1
            )

    def failed(self, batch: ProducerBatch) -> None:
        """``handleFailedBatch``: a batch that held a sequence failed, which
        leaves a gap: the partition needs a new epoch."""
        if not self.idempotent or not batch.has_sequence:
            return
        entry = self._entry(batch.topic_partition)
        if self._forget(entry, batch):
            self._require_bump(entry)

    @staticmethod
    def _forget(entry: _PartitionEntry, batch: ProducerBatch) -> bool:
        for i, held in enumerate(entry.in_flight):
            if held is batch:
                del entry.in_flight[i]
                return True
        return False

    # -- epoch bumps ----------------------------------------------------------

    def maybe_bump(self) -> list[ProducerBatch]:
        """Bump the epoch for the partitions that asked, once none of their
        batches awaits an answer (``bumpIdempotentProducerEpoch``). Their
        queued batches lose their sequences and are drained again in the
        same order from sequence 0 of the new epoch. Returns the batches
        that cannot be sent under a new sequence without a duplicate or a
        reordering (:meth:`_safe_to_resequence`; none after a bump that
        ``kafka_out_of_order`` asked for): the caller fails them, ``info`` if
        they may have been written, else ``fail``."""
        if (
            not self.idempotent
            or self.transactional
            or not self.producer.is_valid
            or not self._bump_pending
        ):
            return []
        due = [
            entry
            for entry in self._partitions.values()
            if entry.bump_required and not any(b.awaiting for b in entry.in_flight)
        ]
        if not due:
            # Still pending while a partition that asked awaits answers.
            self._bump_pending = any(e.bump_required for e in self._partitions.values())
            return []
        self.bumps += 1
        if self.producer.epoch >= INT16_MAX:
            # resetIdempotentProducerId: the epoch is spent; a new id is due.
            self.producer = NO_PRODUCER
        else:
            self.producer = ProducerIdAndEpoch(self.producer.producer_id, self.producer.epoch + 1)
        unsafe: list[ProducerBatch] = []
        for entry in due:
            for batch in entry.in_flight:
                if entry.bump_resends_all or self._safe_to_resequence(batch, entry):
                    batch.clear_producer_state()
                else:
                    unsafe.append(batch)
            entry.in_flight.clear()
            entry.producer = self.producer
            entry.next_sequence = 0
            entry.last_acked_sequence = -1
            entry.highest_maybe_in_log = -1
            entry.bump_required = False
            entry.bump_resends_all = False
        self._bump_pending = any(e.bump_required for e in self._partitions.values())
        return unsafe

    def _require_bump(self, entry: _PartitionEntry) -> None:
        entry.bump_required = True
        self._bump_pending = True

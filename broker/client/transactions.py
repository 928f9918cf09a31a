"""The transactional producer's state and its reading of every transaction
answer (Kafka's ``TransactionManager`` for a transactional id, transaction
version 2: every EndTxn bumps the producer epoch, KIP-890), as a pure state
machine the gRPC producer drives (docs/clients.md, "Transactions").

States and their allowed previous states (``TransactionManager.State``)::

    UNINITIALIZED           (none: the start)
    INITIALIZING            UNINITIALIZED
    READY                   INITIALIZING, COMMITTING_TRANSACTION, ABORTING_TRANSACTION
    IN_TRANSACTION          READY
    COMMITTING_TRANSACTION  IN_TRANSACTION
    ABORTING_TRANSACTION    IN_TRANSACTION, ABORTABLE_ERROR
    ABORTABLE_ERROR         IN_TRANSACTION, COMMITTING_TRANSACTION, ABORTABLE_ERROR
    FATAL_ERROR             any

A call that would make another transition raises
:class:`TransactionStateError` and changes nothing. A call made again in
the state it moved to (``init_transactions``, ``commit_transaction`` or
``abort_transaction`` after a timeout) goes on with the same request:
Kafka's cached ``TransactionalRequestResult``; an EndTxn is then sent again
at the SAME epoch, which the coordinator answers with the transaction's
outcome (KIP-890 part 2's retry).

Partitions (``maybeAddPartition``, ``addPartitionsToTransactionHandler``):
a record's partition not yet in the transaction becomes *new*; the next
AddPartitionsToTxn takes every new partition (they become *pending*) and
its answer makes them *added* (``partitionsInTransaction``). A batch of a
partition is drained only once the partition is added (:meth:`may_drain`):
the leader verifies with the coordinator (KIP-890 part 1) and would refuse
it otherwise.

Each answer is read as Kafka's handlers read it: done, retried inside the
call (:class:`Retry`, after finding the coordinator again or not, with the
back-off to wait), abortable (the state becomes ``ABORTABLE_ERROR`` and
:class:`TransactionAbortableError` is raised) or fatal (``FATAL_ERROR`` and
:class:`TransactionFatalError` or :class:`ProducerFencedError`). The tables
are in docs/clients.md.

Pure: no I/O, no clock; the driver sends the requests and hands back each
answer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from broker.client.errors import (
    FORCE_CLOSED,
    TRANSACTION_ABORTED,
    BrokerClientError,
    DeliveryError,
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionFatalError,
    TransactionStateError,
    code_name,
)
from broker.client.producer_batch import TopicPartition
from broker.client.sequencing import ProducerIdAndEpoch, Sequencing
from broker.errors import Errors

__all__ = [
    "ADD_PARTITIONS_RETRY_BACKOFF_MS",
    "ConsumerGroupMetadata",
    "Retry",
    "TransactionManager",
    "TxnState",
    "backoff_ms",
]

# The back-off of the first AddPartitionsToTxn of a transaction answered
# CONCURRENT_TRANSACTIONS: the previous transaction's markers are still
# being written, which takes a moment (Kafka's ADD_PARTITIONS_RETRY_BACKOFF_MS).
ADD_PARTITIONS_RETRY_BACKOFF_MS = 20


class TxnState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


_S = TxnState
# State.isTransitionValid: the states each one may be entered from
# (FATAL_ERROR from any).
VALID_PREVIOUS: Mapping[TxnState, frozenset[TxnState]] = {
    _S.UNINITIALIZED: frozenset(),
    _S.INITIALIZING: frozenset({_S.UNINITIALIZED}),
    _S.READY: frozenset({_S.INITIALIZING, _S.COMMITTING_TRANSACTION, _S.ABORTING_TRANSACTION}),
    _S.IN_TRANSACTION: frozenset({_S.READY}),
    _S.COMMITTING_TRANSACTION: frozenset({_S.IN_TRANSACTION}),
    _S.ABORTING_TRANSACTION: frozenset({_S.IN_TRANSACTION, _S.ABORTABLE_ERROR}),
    _S.ABORTABLE_ERROR: frozenset(
        {_S.IN_TRANSACTION, _S.COMMITTING_TRANSACTION, _S.ABORTABLE_ERROR}
    ),
    _S.FATAL_ERROR: frozenset(TxnState),
}


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """What a transaction's offsets are committed as (Kafka's
    ``ConsumerGroupMetadata``): the group, and the member's id and epoch
    (KIP-848; "" and -1 for a consumer outside membership)."""

    group_id: str
    member_id: str = ""
    member_epoch: int = -1
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A retriable answer: send the request again after ``backoff_ms``
    (grown by :func:`backoff_ms` over the attempts), asking where the
    coordinator is first if ``find_coordinator``."""

    find_coordinator: bool
    backoff_ms: int


def backoff_ms(base_ms: int, attempt: int, max_ms: int) -> int:
    """The wait before retry ``attempt`` (0 for the first): ``base_ms``
    doubled each attempt, at most ``max_ms`` (or ``base_ms`` if larger)."""
    grown: int = base_ms * 2 ** min(attempt, 30)
    return min(max(max_ms, base_ms), grown)


# Answers retried at once where the coordinator is (the coordinator moved:
# find it again) or after a back-off.
_FIND_AGAIN = frozenset({Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE})
_FENCED = frozenset({Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH})
# Fatal wherever they come from (maybeTransitionToErrorState, Kafka 4's
# produce path: an id another producer now holds is INVALID_PRODUCER_ID_MAPPING).
_FATAL = frozenset(
    {
        Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        Errors.CLUSTER_AUTHORIZATION_FAILED,
        Errors.INVALID_PRODUCER_ID_MAPPING,
        Errors.UNSUPPORTED_VERSION,
    }
)
# TxnOffsetCommit's answers that say the member may not commit for the
# group any more (CommitFailedException; KIP-848's member epochs beside
# the classic protocol's generation).
_NOT_MEMBER = frozenset(
    {
        Errors.UNKNOWN_MEMBER_ID,
        Errors.FENCED_MEMBER_EPOCH,
        Errors.STALE_MEMBER_EPOCH,
        Errors.FENCED_INSTANCE_ID,
    }
)


def _errors(code: int) -> Errors:
    try:
        return Errors(code)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


class TransactionManager:
    """One transactional producer's transaction state (module docstring).
    ``sequencing`` is the producer's: the manager sets its id and epoch."""

    def __init__(
        self,
        transactional_id: str,
        sequencing: Sequencing,
        *,
        transaction_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
    ) -> None:
        if not transactional_id:
            raise ValueError("a transactional producer needs a non-empty transactional_id")
        if transaction_timeout_ms <= 0:
            raise ValueError(f"transaction_timeout_ms must be > 0, not {transaction_timeout_ms}")
        if not sequencing.transactional:
            raise ValueError("the sequencing of a transactional producer is transactional")
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.sequencing = sequencing
        self.state = TxnState.UNINITIALIZED
        self.last_error: BrokerClientError | None = None
        # Partitions of the transaction: not yet asked for, asked for, added.
        self.new_partitions: set[TopicPartition] = set()
        self.pending_partitions: set[TopicPartition] = set()
        self.partitions: set[TopicPartition] = set()
        # Something may have joined the transaction at the coordinator (an
        # AddPartitionsToTxn or AddOffsetsToTxn was sent): its end needs an
        # EndTxn. Kafka sets it on the answer; kq once the request is sent,
        # since a lost answer may hide an added partition, whose
        # transaction would otherwise stay open until its timeout aborts
        # it and fences the producer.
        self.transaction_started = False
        # Offsets of the current TxnOffsetCommit not yet stored.
        self.pending_offsets: dict[TopicPartition, int] = {}

    # -- the producer id -------------------------------------------------------

    @property
    def producer(self) -> ProducerIdAndEpoch:
        return self.sequencing.producer

    @property
    def has_producer_id(self) -> bool:
        return self.producer.is_valid

    # -- states ----------------------------------------------------------------

    def _transition(self, target: TxnState, error: BrokerClientError | None = None) -> None:
        if self.state not in VALID_PREVIOUS[target]:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: invalid transition from "
                f"{self.state.value} to {target.value}"
            )
        if target in (_S.ABORTABLE_ERROR, _S.FATAL_ERROR):
            if error is None:
                raise ValueError(f"{target.value} needs the error that caused it")
            self.last_error = error
        else:
            self.last_error = None
        self.state = target

    @property
    def has_error(self) -> bool:
        return self.state in (_S.ABORTABLE_ERROR, _S.FATAL_ERROR)

    @property
    def is_completing(self) -> bool:
        return self.state in (_S.COMMITTING_TRANSACTION, _S.ABORTING_TRANSACTION)

    @property
    def drops_unsent(self) -> bool:
        """The transaction can only abort: its batches not yet sent are
        failed rather than sent (Sender's ``abortUndrainedBatches``)."""
        return self.state in (_S.ABORTABLE_ERROR, _S.ABORTING_TRANSACTION)

    def _fatal(self, error: TransactionFatalError) -> TransactionFatalError:
        self._transition(_S.FATAL_ERROR, error)
        return error

    def _abortable(self, error: TransactionAbortableError) -> TransactionAbortableError:
        """``transitionToAbortableError``: already aborting, the state stays
        (the abort's own call fails with the error); an abortable error
        already there is kept (the first cause is the one to report)."""
        if self.state is _S.ABORTING_TRANSACTION:
            return error
        if self.state is _S.ABORTABLE_ERROR:
            return error
        self._transition(_S.ABORTABLE_ERROR, error)
        return error

    def _raise_if_error(self) -> None:
        """``maybeFailWithError``: the stored error again (a new instance)."""
        error = self.last_error
        if not self.has_error or error is None:
            return
        raise type(error)(error.code, error.message, error.name)

    def _fatal_for(self, code: Errors, what: str, message: str) -> TransactionFatalError:
        detail = f"{what}: {code.name}" + (f": {message}" if message else "")
        if code in _FENCED:
            return ProducerFencedError(
                int(code),
                f"transactional id {self.transactional_id}: another producer with this id took "
                f"over ({detail})",
            )
        return TransactionFatalError(
            int(code), f"transactional id {self.transactional_id}: {detail}"
        )

    # -- the application's calls -------------------------------------------------

    def begin_init(self) -> ProducerIdAndEpoch:
        """``initTransactions``: the (producer id, epoch) to send with
        InitProducerId: the producer's own once it has one (KIP-360, so the
        coordinator bumps its epoch rather than fencing it), else (-1, -1).
        Called again while initializing, it goes on."""
        if self.state is _S.FATAL_ERROR:
            self._raise_if_error()
        if self.state is not _S.INITIALIZING:
            self._transition(_S.INITIALIZING)
        return self.producer

    def begin_transaction(self) -> None:
        """``beginTransaction``: READY to IN_TRANSACTION."""
        self._raise_if_error()
        if self.state is _S.UNINITIALIZED or self.state is _S.INITIALIZING:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: call init_transactions first"
            )
        self._transition(_S.IN_TRANSACTION)

    def check_send(self) -> None:
        """``failIfNotReadyForSend``: a record may be sent only inside a
        transaction with no error."""
        if self.has_error:
            self._raise_if_error()
        if not self.has_producer_id:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: cannot send before "
                "init_transactions completes"
            )
        if self.state is not _S.IN_TRANSACTION:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: cannot send in state "
                f"{self.state.value} (begin_transaction first)"
            )

    def begin_commit(self) -> None:
        """``beginCommit``: IN_TRANSACTION to COMMITTING_TRANSACTION (again
        while committing: the commit goes on). Refused after an abortable
        error: the transaction must abort."""
        self._raise_if_error()
        if self.state is not _S.COMMITTING_TRANSACTION:
            self._transition(_S.COMMITTING_TRANSACTION)

    def begin_abort(self) -> None:
        """``beginAbort``: from IN_TRANSACTION or ABORTABLE_ERROR (again
        while aborting: the abort goes on). New partitions are not added."""
        if self.state is _S.FATAL_ERROR:
            self._raise_if_error()
        if self.state is not _S.ABORTING_TRANSACTION:
            self._transition(_S.ABORTING_TRANSACTION)
        self.new_partitions.clear()

    def begin_send_offsets(self, group: ConsumerGroupMetadata) -> None:
        """``sendOffsetsToTransaction``: only inside a transaction. The
        AddOffsetsToTxn to come may add the group: the transaction has
        started."""
        self._raise_if_error()
        if self.state is not _S.IN_TRANSACTION:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: cannot send offsets of group "
                f"{group.group_id} in state {self.state.value} (begin_transaction first)"
            )
        if not group.group_id:
            raise ValueError("the group metadata names no group")
        self.transaction_started = True

    def check_completing(self) -> None:
        """Raise the error that stopped a commit or abort under way (a send
        that failed while the commit flushed; a fatal answer)."""
        self._raise_if_error()

    # -- partitions --------------------------------------------------------------

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """A record for ``tp`` was appended: it joins the next
        AddPartitionsToTxn unless it is added or asked for already."""
        if tp in self.partitions or tp in self.pending_partitions:
            return
        self.new_partitions.add(tp)

    def assume_added(self, tp: TopicPartition) -> None:
        """Count ``tp`` in the transaction without asking the coordinator:
        the buggy client of KIP-890's motivation, which "may somehow try to
        write to a partition before it adds the partition to the
        transaction".  Never called by the producer itself: the chaos
        workload's misbehaving client (``unadded_sends``) and tests call it
        to show that the partition's leader refuses the batch (KIP-890 part
        1's verification) and what happens when it does not (bug B24)."""
        if self.state is not _S.IN_TRANSACTION:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: a partition joins only an open "
                f"transaction, not one in state {self.state.name}"
            )
        self.new_partitions.discard(tp)
        self.partitions.add(tp)

    def may_drain(self, tp: TopicPartition) -> bool:
        """``isSendToPartitionAllowed``: not after a fatal error, and only
        once the partition is in the transaction."""
        return self.state is not _S.FATAL_ERROR and tp in self.partitions

    @property
    def has_partitions_to_add(self) -> bool:
        return bool(self.new_partitions or self.pending_partitions)

    def partitions_to_add(self) -> frozenset[TopicPartition]:
        """The partitions of the next AddPartitionsToTxn: every new one
        joins those already asked for (``addPartitionsToTransactionHandler``).
        The request may have added them: the transaction has started."""
        self.pending_partitions |= self.new_partitions
        self.new_partitions.clear()
        if self.pending_partitions:
            self.transaction_started = True
        return frozenset(self.pending_partitions)

    def may_send_request(self) -> bool:
        """Whether a queued AddPartitionsToTxn or AddOffsetsToTxn goes out
        (``maybeTerminateRequestWithError``: not once the transaction can
        only abort, nor after a fatal error)."""
        return not self.has_error and self.state is not _S.ABORTING_TRANSACTION

    def on_add_partitions(
        self,
        results: Mapping[TopicPartition, int],
        message: str = "",
    ) -> Retry | None:
        """``AddPartitionsToTxnHandler.handleResponse``: each partition's
        answer. None once they are added; a :class:`Retry`; or raises the
        abortable or fatal error (the state moved to it)."""
        unauthorized: set[str] = set()
        failed: dict[TopicPartition, Errors] = {}
        for tp, raw in sorted(results.items()):
            code = _errors(raw)
            if code is Errors.NONE:
                continue
            if code in _FIND_AGAIN:
                return Retry(True, self.retry_backoff_ms)
            if code is Errors.CONCURRENT_TRANSACTIONS:
                # The previous transaction is still completing: the first
                # AddPartitionsToTxn of a transaction retries soon.
                base = (
                    ADD_PARTITIONS_RETRY_BACKOFF_MS
                    if not self.partitions
                    else self.retry_backoff_ms
                )
                return Retry(False, min(base, self.retry_backoff_ms))
            if code in (Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.UNKNOWN_TOPIC_OR_PARTITION):
                return Retry(False, self.retry_backoff_ms)
            if code in _FENCED or code in _FATAL or code is Errors.INVALID_TXN_STATE:
                raise self._fatal(self._fatal_for(code, "AddPartitionsToTxn", message))
            if code is Errors.TOPIC_AUTHORIZATION_FAILED:
                unauthorized.add(tp.topic)
            failed[tp] = code
        asked = set(results)
        # Kafka: the partitions leave the pending set whatever the result.
        self.pending_partitions -= asked
        if unauthorized:
            raise self._abortable(
                TransactionAbortableError(
                    int(Errors.TOPIC_AUTHORIZATION_FAILED),
                    f"transactional id {self.transactional_id}: not authorized to write to "
                    f"topic(s) {', '.join(sorted(unauthorized))}"
                    + (f": {message}" if message else ""),
                )
            )
        if failed:
            # The cause, not the partitions the coordinator left alone for it.
            causes = [c for c in failed.values() if c is not Errors.OPERATION_NOT_ATTEMPTED]
            first = causes[0] if causes else Errors.OPERATION_NOT_ATTEMPTED
            listed = ", ".join(f"{tp} {code.name}" for tp, code in sorted(failed.items()))
            raise self._abortable(
                TransactionAbortableError(
                    int(first),
                    f"transactional id {self.transactional_id}: could not add partitions to "
                    f"the transaction: {listed}" + (f": {message}" if message else ""),
                )
            )
        self.partitions |= asked
        return None

    # -- offsets -----------------------------------------------------------------

    def on_add_offsets(self, code_raw: int, group_id: str, message: str = "") -> Retry | None:
        """``AddOffsetsToTxnHandler.handleResponse``: None once the group's
        offsets partition is in the transaction (TxnOffsetCommit next)."""
        code = _errors(code_raw)
        if code is Errors.NONE:
            return None
        if code in _FIND_AGAIN:
            return Retry(True, self.retry_backoff_ms)
        if code in (Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.CONCURRENT_TRANSACTIONS):
            return Retry(False, self.retry_backoff_ms)
        if code is Errors.UNKNOWN_PRODUCER_ID:
            raise self._abortable(
                TransactionAbortableError(
                    int(code), f"AddOffsetsToTxn for group {group_id}: {code.name} {message}"
                )
            )
        if code is Errors.GROUP_AUTHORIZATION_FAILED:
            raise self._abortable(
                TransactionAbortableError(
                    int(code), f"not authorized to commit offsets of group {group_id}: {message}"
                )
            )
        raise self._fatal(self._fatal_for(code, f"AddOffsetsToTxn for group {group_id}", message))

    def begin_offset_commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """The offsets the TxnOffsetCommit is to store (``pendingTxnOffsetCommits``)."""
        for tp, offset in offsets.items():
            if offset < 0:
                raise ValueError(f"cannot commit a negative offset {offset} for {tp}")
        self.pending_offsets = dict(offsets)

    def on_group_coordinator_error(self, code_raw: int, group_id: str, message: str) -> None:
        """The group's coordinator could not be found or asked: an
        authorization failure is abortable (``FindCoordinatorHandler``),
        anything else fatal."""
        code = _errors(code_raw)
        if code is Errors.GROUP_AUTHORIZATION_FAILED:
            raise self._abortable(
                TransactionAbortableError(
                    int(code), f"not authorized to find group {group_id}'s coordinator: {message}"
                )
            )
        raise self._fatal(self._fatal_for(code, f"the coordinator of group {group_id}", message))

    def on_txn_offset_commit(
        self, results: Mapping[TopicPartition, int], group_id: str, message: str = ""
    ) -> Retry | None:
        """``TxnOffsetCommitHandler.handleResponse``: each partition's
        answer. Stored ones leave :attr:`pending_offsets`; None once none is
        left, a :class:`Retry` for the rest, or raises."""
        retry: Retry | None = None
        for tp, raw in sorted(results.items()):
            code = _errors(raw)
            if code is Errors.NONE:
                self.pending_offsets.pop(tp, None)
            elif code in _FIND_AGAIN or code is Errors.REQUEST_TIMED_OUT:
                retry = Retry(True, self.retry_backoff_ms)
            elif code in (
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                Errors.COORDINATOR_LOAD_IN_PROGRESS,
                Errors.CONCURRENT_TRANSACTIONS,
            ):
                retry = retry or Retry(False, self.retry_backoff_ms)
            elif code is Errors.GROUP_AUTHORIZATION_FAILED:
                self.pending_offsets.clear()
                raise self._abortable(
                    TransactionAbortableError(
                        int(code), f"not authorized to commit offsets of group {group_id}"
                    )
                )
            elif code in _NOT_MEMBER:
                self.pending_offsets.clear()
                raise self._abortable(
                    TransactionAbortableError(
                        int(code),
                        f"TxnOffsetCommit of {tp} to group {group_id} failed: the consumer group "
                        f"metadata does not match ({code.name}); {message}",
                        "CommitFailedException",
                    )
                )
            else:
                self.pending_offsets.clear()
                raise self._fatal(
                    self._fatal_for(code, f"TxnOffsetCommit of {tp} to group {group_id}", message)
                )
        if not self.pending_offsets:
            return None
        return retry or Retry(False, self.retry_backoff_ms)

    # -- produce answers -----------------------------------------------------------

    def on_batch_failed(self, error: DeliveryError) -> None:
        """A send of the transaction failed definitively
        (``handleFailedBatch``): fatal for a fenced or unauthorized
        producer, else the transaction can only abort. The batches an abort
        drops, and those a forced close fails, change nothing."""
        if error.name in (TRANSACTION_ABORTED, FORCE_CLOSED) or self.state is _S.FATAL_ERROR:
            return
        if self.state not in (
            _S.IN_TRANSACTION,
            _S.COMMITTING_TRANSACTION,
            _S.ABORTING_TRANSACTION,
            _S.ABORTABLE_ERROR,
        ):
            return
        code = _errors(error.code) if error.code >= 0 else None
        if code is Errors.INVALID_PRODUCER_EPOCH:
            self._fatal(
                InvalidProducerEpochError(
                    int(code),
                    f"transactional id {self.transactional_id}: a partition's leader refused "
                    f"producer {self.producer.producer_id} epoch {self.producer.epoch}: the epoch "
                    f"was ended (a newer producer, or the transaction timed out): {error.message}",
                )
            )
        elif code is not None and (code in _FENCED or code in _FATAL):
            self._fatal(self._fatal_for(code, "Produce", error.message))
        else:
            self._abortable(
                TransactionAbortableError(
                    error.code,
                    f"transactional id {self.transactional_id}: a send failed: {error}",
                    error.name if error.code < 0 else code_name(error.code),
                )
            )

    # -- ending --------------------------------------------------------------------

    @property
    def end_needs_request(self) -> bool:
        """Whether ending the transaction asks the coordinator (``nextRequest``:
        a transaction nothing may have joined ends here)."""
        return self.transaction_started

    def complete(self) -> None:
        """``completeTransaction``: back to READY, the partitions forgotten."""
        self._transition(_S.READY)
        self.transaction_started = False
        self.new_partitions.clear()
        self.pending_partitions.clear()
        self.partitions.clear()
        self.pending_offsets.clear()

    def end_request(self) -> tuple[int, int, bool]:
        """The EndTxn to send: (producer id, epoch, commit). A retry sends
        the same epoch (the epoch changes only with the answer)."""
        if not self.is_completing:
            raise TransactionStateError(
                f"transactional id {self.transactional_id}: no commit or abort under way "
                f"(state {self.state.value})"
            )
        producer = self.producer
        return producer.producer_id, producer.epoch, self.state is _S.COMMITTING_TRANSACTION

    def on_end_txn(
        self, code_raw: int, producer_id: int, producer_epoch: int, message: str = ""
    ) -> Retry | None:
        """``EndTxnHandler.handleResponse`` (EndTxn v5): on NONE the
        producer goes on with the answer's id and bumped epoch, every
        partition from sequence 0, and the state is READY."""
        code = _errors(code_raw)
        committing = self.state is _S.COMMITTING_TRANSACTION
        what = "EndTxn(commit)" if committing else "EndTxn(abort)"
        if code is Errors.NONE:
            if producer_id < 0 or producer_epoch < 0:
                raise self._fatal(
                    TransactionFatalError(
                        int(Errors.UNKNOWN_SERVER_ERROR),
                        f"{what} answered without the producer id and epoch to go on with",
                    )
                )
            self.sequencing.start_epoch(producer_id, producer_epoch)
            self.complete()
            return None
        if code in _FIND_AGAIN:
            return Retry(True, self.retry_backoff_ms)
        if code in (Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.CONCURRENT_TRANSACTIONS):
            return Retry(False, self.retry_backoff_ms)
        if code is Errors.UNKNOWN_PRODUCER_ID:
            raise self._abortable(TransactionAbortableError(int(code), f"{what}: {message}"))
        raise self._fatal(self._fatal_for(code, what, message))

    # -- InitProducerId --------------------------------------------------------------

    def on_init_producer_id(
        self, code_raw: int, producer_id: int, producer_epoch: int, message: str = ""
    ) -> Retry | None:
        """``InitProducerIdHandler.handleResponse``: on NONE the producer
        has its id and epoch (sequences from 0) and is READY."""
        code = _errors(code_raw)
        if code is Errors.NONE:
            self.sequencing.start_epoch(producer_id, producer_epoch)
            self._transition(_S.READY)
            return None
        if code in _FIND_AGAIN:
            return Retry(True, self.retry_backoff_ms)
        if code in (Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.CONCURRENT_TRANSACTIONS):
            return Retry(False, self.retry_backoff_ms)
        raise self._fatal(self._fatal_for(code, "InitProducerId", message))

    def on_find_coordinator(self, code_raw: int, message: str = "") -> Retry | None:
        """``FindCoordinatorHandler`` for the transactional id: None once
        found; COORDINATOR_NOT_AVAILABLE (and a coordinator loading) retry;
        anything else is fatal."""
        code = _errors(code_raw)
        if code is Errors.NONE:
            return None
        if code in (Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS):
            return Retry(False, self.retry_backoff_ms)
        raise self._fatal(self._fatal_for(code, "FindCoordinator", message))

    def fail(self, error: TransactionFatalError) -> TransactionFatalError:
        """A fatal failure the driver found (a refused connection)."""
        return self._fatal(error)

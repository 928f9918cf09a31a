"""The transaction coordinator of one transaction log partition: its
decisions (Kafka's ``TransactionCoordinator`` and ``TransactionMetadata``,
with KIP-360's producer recovery and KIP-890 part 2's epoch bump on every
EndTxn), decide-then-replay as the group coordinator's.

Every handler reads the transactions and returns a
:class:`~broker.txn.api.Result`, the records to write and the answer; it
changes nothing.  State changes only by
:meth:`TransactionCoordinatorShard.replay`.  The runtime replays a
decision's records as soon as they are in the leader's log, so that the
next decision sees them (Kafka's pending state: a second request meanwhile
finds the new state, not the old one), and answers once they are committed.

A transaction ends in two steps, as in Kafka: EndTxn writes PREPARE_COMMIT
or PREPARE_ABORT (the decision) and names the markers to write; once the
runtime has written them all it calls :meth:`complete_txn`, which writes
COMPLETE_COMMIT or COMPLETE_ABORT.  After a coordinator change
:meth:`become_loaded` names the transactions whose markers must be written
again (markers are idempotent on the partitions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from broker.errors import Errors
from broker.group.placement import OFFSETS_TOPIC
from broker.group.placement import partition_for as offsets_partition_for
from broker.txn.api import (
    AddPartitionsResponse,
    CompleteTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    PendingMarkers,
    ProducerIdAllocator,
    Result,
    TransactionDescription,
    TransactionListing,
    TxnError,
    TxnMarker,
)
from broker.txn.records import TransactionLogKey, TxnRecord
from broker.txn.state import TransactionMetadata, Transactions
from broker.txn.types import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TRANSACTION_VERSION,
    TopicPartition,
    TransactionState,
    is_epoch_exhausted,
)

__all__ = ["IllegalTransitionError", "TransactionCoordinatorShard", "TxnConfig"]

_S = TransactionState
_ENDED: Final = (_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnConfig:
    """The coordinator's settings (``TransactionStateManagerConfig``,
    Kafka's defaults)."""

    # transaction.max.timeout.ms: the longest timeout a producer may ask.
    max_timeout_ms: int = 900_000
    # transactional.id.expiration.ms: an id idle this long is deleted.
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000


class IllegalTransitionError(RuntimeError):
    """A decision broke a rule of ``TransactionState`` (Kafka's
    IllegalStateException): a bug of the coordinator, never of a request."""


class TransactionCoordinatorShard:
    """The transactional ids of one transaction log partition and the
    decisions on them."""

    def __init__(
        self,
        config: TxnConfig,
        producer_ids: ProducerIdAllocator,
        *,
        bump_epoch_on_end: bool = True,
    ) -> None:
        """``bump_epoch_on_end`` off is transaction version 1 (KIP-98 before
        KIP-890 part 2), for simulations that show what part 2 defends
        against: EndTxn keeps the producer's epoch, so its markers carry it
        and the next transaction runs at it too; an EndTxn at the current
        epoch is a retry in a completed (or completing) state of its
        outcome, and in ONGOING it ends that ongoing transaction, whichever
        transaction the producer meant (KAFKA-17754's delayed EndTxn).
        Fences (InitProducerId over an ongoing transaction, timeouts) bump
        the epoch in both versions."""
        self.config = config
        self.transactions = Transactions()
        self._producer_ids = producer_ids
        self.bump_epoch_on_end = bump_epoch_on_end
        self._version = TRANSACTION_VERSION if bump_epoch_on_end else 1

    # -- replay ---------------------------------------------------------------

    def replay(self, record: TxnRecord) -> None:
        self.transactions.replay(record)

    def become_loaded(self, now_ms: int) -> tuple[PendingMarkers, ...]:
        """The log is replayed: the transactions in PREPARE_* whose markers
        must be (re)written before they complete
        (``TransactionStateManager.loadTransactionsForTxnTopicPartition``
        sends them at once).  ``now_ms`` is unused: a transaction's timeout
        counts from its start, which the log holds."""
        del now_ms
        return tuple(_pending(meta) for meta in self.transactions if meta.state.is_prepare)

    # -- InitProducerId -------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        *,
        now_ms: int,
    ) -> Result[InitProducerIdResponse]:
        """``TransactionCoordinator.handleInitProducerId``: a new producer
        id for a new transactional id, else the next epoch of its id (the
        older producer is fenced); ``producer_id``/``producer_epoch`` are
        KIP-360's expected id and epoch of a producer that recovers."""
        try:
            return self._init_producer_id(
                transactional_id, timeout_ms, producer_id, producer_epoch, now_ms
            )
        except TxnError as error:
            return Result((), InitProducerIdResponse(error.code, error.message))

    def _init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int,
        producer_epoch: int,
        now_ms: int,
    ) -> Result[InitProducerIdResponse]:
        _check_id(transactional_id)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            raise TxnError(
                Errors.INVALID_TRANSACTION_TIMEOUT,
                f"transaction timeout {timeout_ms} ms is not in (0, "
                f"{self.config.max_timeout_ms}] (transaction.max.timeout.ms)",
            )
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            raise TxnError(
                Errors.INVALID_REQUEST,
                f"producer id {producer_id} and epoch {producer_epoch}: both or neither must be -1",
            )
        expected = None if producer_id == NO_PRODUCER_ID else (producer_id, producer_epoch)
        old = self.transactions.get(transactional_id)
        meta = old
        if meta is None:
            # handleInitProducerId: a new id starts EMPTY at epoch -1, to
            # be bumped to 0 below.
            meta = TransactionMetadata(
                transactional_id=transactional_id,
                producer_id=self._producer_ids.next_producer_id(),
                previous_producer_id=NO_PRODUCER_ID,
                next_producer_id=NO_PRODUCER_ID,
                producer_epoch=NO_PRODUCER_EPOCH,
                last_producer_epoch=NO_PRODUCER_EPOCH,
                timeout_ms=timeout_ms,
                state=_S.EMPTY,
                partitions=frozenset(),
                last_update_ms=now_ms,
                start_ms=-1,
                client_transaction_version=self._version,
            )
        if expected is not None and not _is_valid_producer_id(meta, *expected):
            raise TxnError(
                Errors.PRODUCER_FENCED,
                f"producer id {producer_id} epoch {producer_epoch} is not transactional id "
                f"{transactional_id!r}'s (it is at id {meta.producer_id} epoch "
                f"{meta.producer_epoch}): a newer producer took over",
            )
        if meta.state.is_prepare:
            raise _concurrent(meta)
        if meta.state is _S.ONGOING:
            # The ongoing transaction of the previous producer is aborted
            # with its epoch bumped (fencing it); the answer tells this
            # producer to retry, and its retry bumps the epoch again
            # (prepareFenceProducerEpoch, then endTransaction(ABORT)).
            new = self._prepare_end(meta, commit=False, fence=True, now_ms=now_ms)
            return Result(
                (self._transit(old, new),),
                InitProducerIdResponse(
                    Errors.CONCURRENT_TRANSACTIONS,
                    f"transactional id {transactional_id!r} had an ongoing transaction: it is "
                    "being aborted, retry",
                    pending=_pending(new),
                ),
            )
        assert meta.state in _ENDED, meta.state
        base = dataclasses.replace(
            meta,
            next_producer_id=NO_PRODUCER_ID,
            timeout_ms=timeout_ms,
            state=_S.EMPTY,
            partitions=frozenset(),
            last_update_ms=now_ms,
            start_ms=-1,
            client_transaction_version=self._version,
        )
        if is_epoch_exhausted(meta.producer_epoch) and (
            expected is None or expected[1] == meta.producer_epoch
        ):
            # prepareProducerIdRotation: no epoch left, a new producer id.
            new = dataclasses.replace(
                base,
                producer_id=self._producer_ids.next_producer_id(),
                previous_producer_id=meta.producer_id,
                producer_epoch=0,
                last_producer_epoch=(
                    meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
                ),
            )
        elif (
            expected is None
            or meta.producer_epoch == NO_PRODUCER_EPOCH
            or expected[1] == meta.producer_epoch
        ):
            # prepareIncrementProducerEpoch: the next epoch fences the last.
            # Only a producer that named its epoch (KIP-360) keeps it as the
            # last epoch, for its retry; a new producer's bump forgets it, or
            # the fenced producer, recovering with that epoch, would pass as
            # the retry and share the new epoch with the new producer.
            new = dataclasses.replace(
                base,
                producer_epoch=meta.producer_epoch + 1,
                last_producer_epoch=(
                    meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
                ),
            )
        elif expected[1] == meta.last_producer_epoch:
            # A retry of the bump whose answer was lost: the same answer.
            new = base
        else:
            raise TxnError(
                Errors.PRODUCER_FENCED,
                f"producer epoch {producer_epoch} is neither transactional id "
                f"{transactional_id!r}'s epoch {meta.producer_epoch} nor its last "
                f"{meta.last_producer_epoch}: a newer producer took over",
            )
        return Result(
            (self._transit(old, new),),
            InitProducerIdResponse(
                Errors.NONE, producer_id=new.producer_id, producer_epoch=new.producer_epoch
            ),
        )

    # -- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
    ) -> Result[AddPartitionsResponse]:
        """``handleAddPartitionsToTransaction``: the transaction is ONGOING
        with these partitions added; its start time is set by the first."""
        try:
            added = _check_partitions(partitions)
            return self._add(transactional_id, producer_id, producer_epoch, added, now_ms)
        except TxnError as error:
            return Result((), AddPartitionsResponse(error.code, error.message))

    def add_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets_partitions: int,
        now_ms: int,
    ) -> Result[AddPartitionsResponse]:
        """``AddOffsetsToTxn``: the group's partition of the offsets topic
        (of ``offsets_partitions`` partitions) joins the transaction, so
        that its offset commits are committed or aborted with it."""
        try:
            if not group_id:
                raise TxnError(Errors.INVALID_GROUP_ID, "group_id is empty")
            partition = offsets_partition_for(group_id, offsets_partitions)
            added = frozenset({TopicPartition(OFFSETS_TOPIC, partition)})
            return self._add(transactional_id, producer_id, producer_epoch, added, now_ms)
        except TxnError as error:
            return Result((), AddPartitionsResponse(error.code, error.message))

    def _add(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        added: frozenset[TopicPartition],
        now_ms: int,
    ) -> Result[AddPartitionsResponse]:
        meta = self._current(transactional_id, producer_id, producer_epoch)
        if meta.state.is_prepare:
            raise _concurrent(meta)
        if meta.state is _S.ONGOING and added <= meta.partitions:
            return Result((), AddPartitionsResponse(Errors.NONE))
        ongoing = meta.state is _S.ONGOING
        new = dataclasses.replace(
            meta,
            state=_S.ONGOING,
            partitions=(meta.partitions if ongoing else frozenset()) | added,
            start_ms=meta.start_ms if ongoing else now_ms,
            last_update_ms=now_ms,
        )
        return Result((self._transit(meta, new),), AddPartitionsResponse(Errors.NONE))

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, tuple[Errors, str]]:
        """``AddPartitionsToTxn`` with ``verifyOnly`` (KIP-890 part 1), asked
        by a partition's leader before it appends the first transactional
        batch of a producer: each partition is ``NONE`` only if it is in
        the ONGOING transaction of exactly this producer id and epoch.
        Since every end bumps the epoch (part 2), the pair names one
        transaction, so a late batch of an ended one, or of one that never
        added the partition, is refused (``INVALID_TXN_STATE``) instead of
        opening a transaction in the partition that no marker would ever
        end (the hanging transaction, KAFKA-17754's delayed write)."""
        wanted = frozenset(partitions)
        try:
            meta = self._current(transactional_id, producer_id, producer_epoch)
        except TxnError as error:
            return dict.fromkeys(wanted, (error.code, error.message))
        out: dict[TopicPartition, tuple[Errors, str]] = {}
        for tp in wanted:
            if meta.state is _S.ONGOING and tp in meta.partitions:
                out[tp] = (Errors.NONE, "")
            else:
                out[tp] = (
                    Errors.INVALID_TXN_STATE,
                    f"partition {tp.topic}-{tp.partition} is not in an ongoing transaction of "
                    f"transactional id {transactional_id!r} at producer id {producer_id} epoch "
                    f"{producer_epoch} (the id is {meta.state.kafka_name})",
                )
        return out

    # -- EndTxn ---------------------------------------------------------------

    def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> Result[EndTxnResponse]:
        """``handleEndTransaction`` with transaction version 2: PREPARE_COMMIT
        or PREPARE_ABORT at the next epoch, and the markers to write.  A
        retry of an EndTxn already decided (the producer's old epoch, one
        below the coordinator's) is told its outcome."""
        try:
            return self._end_txn(transactional_id, producer_id, producer_epoch, commit, now_ms)
        except TxnError as error:
            return Result((), EndTxnResponse(error.code, error.message))

    def _end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> Result[EndTxnResponse]:
        _check_id(transactional_id)
        meta = self.transactions.get(transactional_id)
        if meta is None:
            raise _unknown(transactional_id)
        if self.bump_epoch_on_end:
            retry = _is_end_retry(meta, producer_id, producer_epoch)
        else:
            retry = _is_tv1_end_retry(meta, producer_id, producer_epoch)
        if not retry:
            _check_producer(meta, producer_id, producer_epoch)
        wanted = "commit" if commit else "abort"
        invalid = TxnError(
            Errors.INVALID_TXN_STATE,
            f"EndTxn({wanted}) of transactional id {transactional_id!r} in state "
            f"{meta.state.kafka_name}",
        )
        state = meta.state
        if state is _S.ONGOING:
            new = self._prepare_end(meta, commit=commit, fence=False, now_ms=now_ms)
        elif state.is_prepare:
            if (state is _S.PREPARE_COMMIT) != commit:
                raise invalid
            raise _concurrent(meta)
        elif state.is_complete and retry:
            if (state is _S.COMPLETE_COMMIT) != commit:
                raise invalid
            return Result(
                (),
                EndTxnResponse(
                    Errors.NONE, producer_id=meta.producer_id, producer_epoch=meta.producer_epoch
                ),
            )
        elif not commit and self.bump_epoch_on_end:
            # KIP-890 part 2: the abort of a transaction the coordinator has
            # no partitions of (EMPTY or ended) still bumps the epoch.
            new = self._prepare_end(meta, commit=False, fence=False, now_ms=now_ms)
        else:
            raise invalid
        return Result(
            (self._transit(meta, new),),
            EndTxnResponse(
                Errors.NONE,
                producer_id=new.producer_id,
                producer_epoch=new.producer_epoch,
                pending=_pending(new),
            ),
        )

    def complete_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, now_ms: int
    ) -> Result[CompleteTxnResponse]:
        """Every marker of :class:`~broker.txn.api.PendingMarkers` is
        written: COMPLETE_COMMIT or COMPLETE_ABORT, partitions cleared, and
        the next producer id taken if the epoch was exhausted
        (``TransactionMetadata.prepareComplete``)."""
        meta = self.transactions.get(transactional_id)
        if meta is None:
            return Result((), CompleteTxnResponse(*_refusal(_unknown(transactional_id))))
        if (
            not meta.state.is_prepare
            or meta.producer_id != producer_id
            or meta.producer_epoch != producer_epoch
        ):
            return Result(
                (),
                CompleteTxnResponse(
                    Errors.INVALID_TXN_STATE,
                    f"transactional id {transactional_id!r} is {meta.state.kafka_name} at "
                    f"producer id {meta.producer_id} epoch {meta.producer_epoch}, not "
                    f"completing id {producer_id} epoch {producer_epoch}",
                ),
            )
        rotate = meta.next_producer_id != NO_PRODUCER_ID
        new = dataclasses.replace(
            meta,
            state=_S.COMPLETE_COMMIT if meta.state is _S.PREPARE_COMMIT else _S.COMPLETE_ABORT,
            producer_id=meta.next_producer_id if rotate else meta.producer_id,
            previous_producer_id=meta.producer_id if rotate else meta.previous_producer_id,
            next_producer_id=NO_PRODUCER_ID,
            producer_epoch=0 if rotate else meta.producer_epoch,
            partitions=frozenset(),
            last_update_ms=now_ms,
        )
        return Result((self._transit(meta, new),), CompleteTxnResponse(Errors.NONE))

    # -- time -----------------------------------------------------------------

    def tick(self, now_ms: int) -> Result[tuple[PendingMarkers, ...]]:
        """``abortTimedOutTransactions``: every transaction ONGOING past its
        timeout is aborted with its epoch bumped, fencing its producer; and
        ``removeExpiredTransactionalIds``: an ended id idle for
        transactional.id.expiration.ms is deleted (a tombstone)."""
        records: list[TxnRecord] = []
        pending: list[PendingMarkers] = []
        for meta in self.transactions:
            if meta.state is _S.ONGOING and meta.start_ms + meta.timeout_ms < now_ms:
                new = self._prepare_end(meta, commit=False, fence=True, now_ms=now_ms)
                records.append(self._transit(meta, new))
                pending.append(_pending(new))
            elif (
                meta.state in _ENDED
                and meta.last_update_ms + self.config.transactional_id_expiration_ms <= now_ms
            ):
                records.append(self._transit(meta, None))
        return Result(tuple(records), tuple(pending))

    # -- reads ----------------------------------------------------------------

    def list_transactions(
        self,
        states: Iterable[TransactionState] = (),
        producer_ids: Iterable[int] = (),
    ) -> list[TransactionListing]:
        """``ListTransactions``: every id, or those in ``states`` and of
        ``producer_ids`` when given."""
        wanted_states = frozenset(states)
        wanted_ids = frozenset(producer_ids)
        return [
            TransactionListing(meta.transactional_id, meta.producer_id, meta.state)
            for meta in self.transactions
            if (not wanted_states or meta.state in wanted_states)
            and (not wanted_ids or meta.producer_id in wanted_ids)
        ]

    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        """``DescribeTransactions`` of one id."""
        meta = self.transactions.get(transactional_id)
        if meta is None:
            return TransactionDescription(
                Errors.TRANSACTIONAL_ID_NOT_FOUND,
                transactional_id,
                f"transactional id {transactional_id!r} is not in this partition",
            )
        return TransactionDescription(
            Errors.NONE,
            transactional_id,
            state=meta.state,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            timeout_ms=meta.timeout_ms,
            start_ms=meta.start_ms,
            partitions=meta.partitions,
        )

    # -- helpers --------------------------------------------------------------

    def _current(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TransactionMetadata:
        _check_id(transactional_id)
        meta = self.transactions.get(transactional_id)
        if meta is None:
            raise _unknown(transactional_id)
        _check_producer(meta, producer_id, producer_epoch)
        return meta

    def _prepare_end(
        self, meta: TransactionMetadata, *, commit: bool, fence: bool, now_ms: int
    ) -> TransactionMetadata:
        """``prepareAbortOrCommit`` with transaction version 2: the epoch is
        bumped, so that the ended epoch's late writes and retries are fenced
        (KIP-890 part 2); an exhausted epoch names the producer id that
        completion moves to.  A fence (a timeout, another producer's
        InitProducerId) forgets the last epoch, so that the fenced
        producer's EndTxn is not taken for a retry."""
        if meta.producer_epoch >= 2**15 - 1:
            raise IllegalTransitionError(
                f"transactional id {meta.transactional_id!r} at epoch {meta.producer_epoch}: "
                "no epoch left to bump"
            )
        if not fence and not self.bump_epoch_on_end:
            # Transaction version 1: the end keeps the epoch.
            return dataclasses.replace(
                meta,
                state=_S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT,
                last_update_ms=now_ms,
                client_transaction_version=self._version,
            )
        exhausted = is_epoch_exhausted(meta.producer_epoch)
        return dataclasses.replace(
            meta,
            state=_S.PREPARE_COMMIT if commit else _S.PREPARE_ABORT,
            producer_epoch=meta.producer_epoch + 1,
            last_producer_epoch=NO_PRODUCER_EPOCH if fence else meta.producer_epoch,
            next_producer_id=self._producer_ids.next_producer_id() if exhausted else NO_PRODUCER_ID,
            last_update_ms=now_ms,
            client_transaction_version=self._version,
        )

    @staticmethod
    def _transit(old: TransactionMetadata | None, new: TransactionMetadata | None) -> TxnRecord:
        """The record of ``old`` -> ``new`` (``None``: deleted, DEAD), checked
        against ``TransactionState``'s valid previous states
        (``TransactionMetadata.prepareTransitionTo``)."""
        if new is None:
            assert old is not None
            if not _S.DEAD.can_follow(old.state):
                raise IllegalTransitionError(
                    f"transactional id {old.transactional_id!r}: {old.state.name} -> DEAD"
                )
            return TxnRecord(TransactionLogKey(old.transactional_id), None)
        previous = _S.EMPTY if old is None else old.state
        if not new.state.can_follow(previous) or new.state in (_S.DEAD, _S.PREPARE_EPOCH_FENCE):
            raise IllegalTransitionError(
                f"transactional id {new.transactional_id!r}: {previous.name} -> {new.state.name}"
            )
        if (
            old is not None
            and old.producer_id == new.producer_id
            and new.producer_epoch < old.producer_epoch
        ):
            raise IllegalTransitionError(
                f"transactional id {new.transactional_id!r}: epoch {old.producer_epoch} -> "
                f"{new.producer_epoch} of producer id {new.producer_id}"
            )
        return new.record()


def _check_id(transactional_id: str) -> None:
    if not transactional_id:
        raise TxnError(Errors.INVALID_REQUEST, "transactional_id is empty")


def _check_partitions(partitions: Iterable[TopicPartition]) -> frozenset[TopicPartition]:
    added = frozenset(partitions)
    if not added:
        raise TxnError(Errors.INVALID_REQUEST, "no partitions to add")
    for tp in sorted(added):
        if not tp.topic or tp.partition < 0:
            raise TxnError(
                Errors.INVALID_REQUEST,
                f"partition {tp.topic!r}-{tp.partition}: a topic name and a partition >= 0 "
                "are needed",
            )
    return added


def _check_producer(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> None:
    """The request's producer is the id's current one: another id is
    INVALID_PRODUCER_ID_MAPPING, an older epoch PRODUCER_FENCED (a newer
    producer took over), a newer one INVALID_PRODUCER_EPOCH (an epoch the
    coordinator never gave out)."""
    if producer_id != meta.producer_id:
        raise TxnError(
            Errors.INVALID_PRODUCER_ID_MAPPING,
            f"producer id {producer_id} is not transactional id {meta.transactional_id!r}'s "
            f"({meta.producer_id})",
        )
    if producer_epoch < meta.producer_epoch:
        raise TxnError(
            Errors.PRODUCER_FENCED,
            f"producer epoch {producer_epoch} of transactional id "
            f"{meta.transactional_id!r} is fenced by epoch {meta.producer_epoch}",
        )
    if producer_epoch > meta.producer_epoch:
        raise TxnError(
            Errors.INVALID_PRODUCER_EPOCH,
            f"producer epoch {producer_epoch} of transactional id "
            f"{meta.transactional_id!r} is ahead of its epoch {meta.producer_epoch}",
        )


def _is_valid_producer_id(meta: TransactionMetadata, producer_id: int, epoch: int) -> bool:
    """``TransactionCoordinator.isValidProducerId`` (KIP-360): a new id,
    the current producer id, or the previous one at an exhausted epoch (a
    retry of the rotation)."""
    return (
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or producer_id == meta.producer_id
        or (producer_id == meta.previous_producer_id and is_epoch_exhausted(epoch))
    )


def _is_end_retry(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """An EndTxn of the epoch this transaction's end bumped from (KIP-890
    part 2's retry): the current producer id one epoch below, or, after a
    rotation, the previous producer id at its exhausted epoch.  A fence
    leaves no last epoch, so a fenced producer never passes."""
    if not (meta.state.is_prepare or meta.state.is_complete):
        return False
    if producer_epoch == NO_PRODUCER_EPOCH or producer_epoch != meta.last_producer_epoch:
        return False
    if producer_id == meta.producer_id:
        return meta.producer_epoch == producer_epoch + 1
    return (
        meta.state.is_complete
        and producer_id == meta.previous_producer_id
        and is_epoch_exhausted(producer_epoch)
        and meta.producer_epoch == 0
    )


def _is_tv1_end_retry(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> bool:
    """Transaction version 1's retry: an EndTxn of the current producer id
    and epoch while the transaction is completing or completed (the end
    kept the epoch, so nothing tells a retry from a late request)."""
    return (
        (meta.state.is_prepare or meta.state.is_complete)
        and producer_id == meta.producer_id
        and producer_epoch == meta.producer_epoch
    )


def _pending(meta: TransactionMetadata) -> PendingMarkers:
    commit = meta.state is _S.PREPARE_COMMIT
    return PendingMarkers(
        meta.transactional_id,
        meta.producer_id,
        meta.producer_epoch,
        commit,
        tuple(
            TxnMarker(
                tp.topic,
                tp.partition,
                meta.producer_id,
                meta.producer_epoch,
                commit,
                meta.client_transaction_version,
            )
            for tp in sorted(meta.partitions)
        ),
    )


def _concurrent(meta: TransactionMetadata) -> TxnError:
    return TxnError(
        Errors.CONCURRENT_TRANSACTIONS,
        f"transactional id {meta.transactional_id!r} is {meta.state.kafka_name}: its markers "
        "are being written, retry",
    )


def _unknown(transactional_id: str) -> TxnError:
    return TxnError(
        Errors.INVALID_PRODUCER_ID_MAPPING,
        f"transactional id {transactional_id!r} has no producer id (InitProducerId first)",
    )


def _refusal(error: TxnError) -> tuple[Errors, str]:
    return error.code, error.message

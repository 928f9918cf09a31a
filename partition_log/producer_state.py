"""The state of idempotent producers in a partition log (Kafka's
``ProducerStateManager``, ``ProducerStateEntry`` and
``ProducerAppendInfo``, KIP-98), and its snapshot format.

Per producer id the log keeps the producer's epoch and the metadata of its
last five batches (first and last sequence, first and last offset,
timestamp). A leader checks every batch that carries a producer id before
appending it (:meth:`ProducerStateManager.check`):

- a batch with the epoch and the exact sequence range of one of the five is
  a duplicate (a retry): it gets the original offsets and nothing is
  appended (``UnifiedLog.analyzeAndValidateProducerState``);
- an epoch older than the producer's is ``INVALID_PRODUCER_EPOCH``;
- a newer epoch must start at sequence 0, else ``OUT_OF_ORDER_SEQUENCE_NUMBER``
  ("invalid sequence number for new epoch");
- in the same epoch the first sequence must follow the last one (0 after
  2^31-1), else ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
- a producer the log has no state for (never seen, expired, or all its
  batches removed by retention) may start at any sequence.

After the append, leader and follower alike record the batch
(:meth:`ProducerStateManager.update`); a follower takes the leader's batches
as they are, so a new leader can recognise a retry of a batch its
predecessor acknowledged.

The manager is mutable (one dict of immutable :class:`ProducerEntry`
values; a log holds many producers, and a copy per append would cost what
the log does not have). It is pure: the snapshot file's bytes come and go
through :func:`encode_snapshot` and :func:`decode_snapshot`, time enters as
``now_ms``.

Transactions (KIP-98, Kafka's ``ProducerAppendInfo.appendDataBatch`` and
``appendEndTxnMarker``): a producer's first transactional batch opens its
transaction in the partition at that batch's offset
(``current_txn_first_offset``); a control batch carrying an
:class:`~partition_log.txn.EndTxnMarker` ends it, and :meth:`update` returns
the :class:`~partition_log.txn.CompletedTxn`.  Before the append a leader
refuses a marker whose producer epoch is older than the producer's
(``INVALID_PRODUCER_EPOCH``) or whose coordinator epoch is older than the last
marker's (``TRANSACTION_COORDINATOR_FENCED``), a transaction version 2 marker
that is not past the epoch of the transaction open here (a late marker of an
earlier transaction, KAFKA-19446: ``INVALID_PRODUCER_EPOCH``), and a non-transactional batch
from a producer whose transaction is open (``INVALID_TXN_STATE``).  The open
transactions, and the completed ones whose marker the high watermark has not
passed yet, give the log's first unstable offset
(:meth:`ProducerStateManager.first_unstable_offset`), below which the last
stable offset lies.  The snapshot keeps each producer's coordinator epoch and
open transaction; the completed ones are not in it (Kafka's neither): a
reloaded log takes every marker below its high watermark as replicated.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from crc32c import crc32c

import bugs
from bugs import Bug
from partition_log.errors import Errors, PartitionLogError
from partition_log.txn import CompletedTxn, EndTxnMarker

__all__ = [
    "INT32_MAX",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NUM_BATCHES_TO_RETAIN",
    "SNAPSHOT_VERSION",
    "Append",
    "BatchMetadata",
    "Duplicate",
    "ProducerBatch",
    "ProducerEntry",
    "ProducerSnapshot",
    "ProducerStateManager",
    "decode_snapshot",
    "encode_snapshot",
    "increment_sequence",
]

# RecordBatch.NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE.
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
INT16_MAX = 2**15 - 1
# ProducerStateEntry.NUM_BATCHES_TO_RETAIN: the Java producer keeps at most
# five requests in flight per connection with idempotence.
NUM_BATCHES_TO_RETAIN = 5


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment``, wrapping to 0 after 2^31-1
    (``DefaultRecordBatch.incrementSequence``)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    # ProducerAppendInfo.inSequence.
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == INT32_MAX)


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """What the producer state reads of a batch header. ``base_offset`` is
    the offset the batch has (a follower's, or a replayed one's) or will
    have (a leader's check)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int
    base_offset: int
    max_timestamp: int
    is_transactional: bool = False
    # The marker of a control batch (None: a batch of data).
    marker: EndTxnMarker | None = None

    def __post_init__(self) -> None:
        if self.last_offset_delta < 0:
            raise ValueError(f"last offset delta {self.last_offset_delta} is negative")
        if self.marker is not None:
            if self.producer_id == NO_PRODUCER_ID or not 0 <= self.producer_epoch <= INT16_MAX:
                raise ValueError(
                    f"a transaction marker of producer {self.producer_id}, epoch "
                    f"{self.producer_epoch}: it needs a producer id and epoch"
                )
        elif self.producer_id != NO_PRODUCER_ID and not (
            0 <= self.producer_epoch <= INT16_MAX and 0 <= self.base_sequence <= INT32_MAX
        ):
            raise ValueError(
                f"producer {self.producer_id}: epoch {self.producer_epoch} or base sequence "
                f"{self.base_sequence} out of range"
            )

    @property
    def last_sequence(self) -> int:
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One of a producer's retained batches (Kafka's ``BatchMetadata``)."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int

    def __post_init__(self) -> None:
        if self.last_offset < self.first_offset or self.first_offset < 0:
            raise ValueError(f"batch offsets {self.first_offset}..{self.last_offset} invalid")
        delta = self.last_offset - self.first_offset
        if increment_sequence(self.first_seq, delta) != self.last_seq:
            raise ValueError(
                f"sequences {self.first_seq}..{self.last_seq} do not span offsets "
                f"{self.first_offset}..{self.last_offset}"
            )


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """A producer's state (Kafka's ``ProducerStateEntry``): its epoch and its
    last batches of that epoch, oldest first, at most five."""

    producer_id: int
    epoch: int
    batches: tuple[BatchMetadata, ...]
    last_timestamp: int
    # Transactions (their own issue): -1 for none, as Kafka's snapshot.
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    def __post_init__(self) -> None:
        if len(self.batches) > NUM_BATCHES_TO_RETAIN:
            raise ValueError(
                f"producer {self.producer_id} retains {len(self.batches)} batches, "
                f"at most {NUM_BATCHES_TO_RETAIN}"
            )
        # Only the offsets must increase: the sequences usually follow each
        # other, but a follower records the leader's batches as they are (a
        # leader that had forgotten the producer accepted any sequence).
        for before, after in zip(self.batches, self.batches[1:], strict=False):
            if after.first_offset <= before.last_offset:
                raise ValueError(
                    f"producer {self.producer_id}: batch {after} does not follow {before}"
                )

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, batch: ProducerBatch) -> BatchMetadata | None:
        """The retained batch with ``batch``'s epoch and exact sequence range
        (``findDuplicateBatch``)."""
        if batch.producer_epoch != self.epoch:
            return None
        for retained in self.batches:
            if retained.first_seq == batch.base_sequence and retained.last_seq == (
                batch.last_sequence
            ):
                return retained
        return None

    def added(self, batch: ProducerBatch) -> ProducerEntry:
        """This entry after ``batch`` (``ProducerStateEntry.addBatch``): a new
        epoch forgets the old epoch's batches; the oldest of six goes.  An
        older epoch's batch (only a leader with B22 on appends one) changes
        neither the epoch nor the window: it belongs to neither."""
        if batch.producer_epoch < self.epoch:
            return replace(self, last_timestamp=batch.max_timestamp)
        kept = self.batches if batch.producer_epoch == self.epoch else ()
        metadata = BatchMetadata(
            batch.base_sequence,
            batch.last_sequence,
            batch.base_offset,
            batch.last_offset,
            batch.max_timestamp,
        )
        return ProducerEntry(
            self.producer_id,
            batch.producer_epoch,
            (*kept, metadata)[-NUM_BATCHES_TO_RETAIN:],
            batch.max_timestamp,
            self.coordinator_epoch,
            self.current_txn_first_offset,
        )


def _ended(entry: ProducerEntry, batch: ProducerBatch, marker: EndTxnMarker) -> ProducerEntry:
    """``entry`` after the marker ``batch`` (``appendEndTxnMarker``): no open
    transaction, the marker's coordinator epoch, and the marker's producer
    epoch (a newer one forgets the older epoch's batches,
    ``maybeUpdateProducerEpoch``)."""
    kept = entry.batches if batch.producer_epoch == entry.epoch else ()
    return ProducerEntry(
        entry.producer_id,
        max(entry.epoch, batch.producer_epoch),
        kept,
        batch.max_timestamp,
        marker.coordinator_epoch,
        -1,
    )


@dataclass(frozen=True, slots=True)
class Append:
    """The batch may be appended."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The batch was appended before: answer with its original offsets and
    append nothing."""

    first_offset: int
    last_offset: int
    timestamp: int


APPEND = Append()


@dataclass
class ProducerStateManager:
    """The producers of one partition log and the offset up to which the log's
    batches have been applied (``map_end_offset``, Kafka's ``lastMapOffset``:
    the offset after the last batch applied)."""

    producers: dict[int, ProducerEntry] = field(default_factory=dict)
    map_end_offset: int = 0
    # The open transactions: first offset -> producer id (Kafka's
    # ongoingTxns), derived from the entries; invariant: exactly the entries
    # whose current_txn_first_offset is set.
    ongoing: dict[int, int] = field(init=False, default_factory=dict)
    # Transactions ended by a marker the high watermark has not passed:
    # first offset -> the transaction (Kafka's unreplicatedTxns).  They hold
    # the last stable offset back until their marker is replicated.
    unreplicated: dict[int, CompletedTxn] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        for producer_id, entry in self.producers.items():
            if entry.current_txn_first_offset >= 0:
                self.ongoing[entry.current_txn_first_offset] = producer_id
        for producer_id, entry in self.producers.items():
            if producer_id != entry.producer_id:
                raise ValueError(f"producer {entry.producer_id} filed under {producer_id}")
            if entry.last_offset >= self.map_end_offset:
                raise ValueError(
                    f"producer {producer_id}'s last offset {entry.last_offset} is not below "
                    f"the end offset {self.map_end_offset}"
                )

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.get(producer_id)

    def check(
        self, batch: ProducerBatch, *, client: bool = True, marker_bumps_epoch: bool = False
    ) -> Append | Duplicate:
        """Whether a leader may append ``batch``: :class:`Append`, a
        :class:`Duplicate` with the original offsets, or a
        :class:`PartitionLogError` (``INVALID_PRODUCER_EPOCH``,
        ``OUT_OF_ORDER_SEQUENCE_NUMBER``) naming the producer, epochs and
        sequences. Changes nothing.  A coordinator's own batch (``client``
        False: a group coordinator's transactional offset commit) is checked
        for its epoch only, never for duplicates or sequences, as Kafka's
        ``ProducerAppendInfo`` checks those of ``CLIENT`` appends alone.
        ``marker_bumps_epoch``: a marker of transaction version 2, whose
        epoch is one past its transaction's batches'."""
        if batch.producer_id == NO_PRODUCER_ID:
            return APPEND
        entry = self.producers.get(batch.producer_id)
        if batch.marker is not None:
            return self._check_marker(batch, batch.marker, entry, marker_bumps_epoch)
        if not client:
            if entry is not None and batch.producer_epoch < entry.epoch:
                raise PartitionLogError(
                    Errors.INVALID_PRODUCER_EPOCH,
                    f"producer {batch.producer_id} at offset {batch.base_offset}: epoch "
                    f"{batch.producer_epoch} is older than its epoch {entry.epoch}",
                )
            return APPEND
        if entry is None:
            # "If there is no current producer epoch (possibly because all
            # producer records have been deleted due to retention or the
            # DeleteRecords API) accept writes with any sequence number."
            return APPEND
        duplicate = entry.find_duplicate(batch)
        if duplicate is not None:
            # The bugs are read only here, for a retry: the common append
            # pays nothing for them.
            if bugs.on(Bug.NO_DEDUP_WINDOW):
                # B11: no idempotence window; the retry is appended again.
                return APPEND
            if bugs.on(Bug.OUT_OF_ORDER_FOR_DUPLICATE):
                # B12 (Redpanda #3039): a retry in the window is refused as
                # out of order instead of answered with its offsets.
                raise PartitionLogError(
                    Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {batch.producer_id} at offset {batch.base_offset}: out of order "
                    f"sequence number {batch.base_sequence} in epoch {batch.producer_epoch} "
                    f"(a retry of the batch at offset {duplicate.first_offset})",
                )
            return Duplicate(duplicate.first_offset, duplicate.last_offset, duplicate.timestamp)
        where = f"producer {batch.producer_id} at offset {batch.base_offset}"
        if batch.producer_epoch < entry.epoch:
            if batch.is_transactional and bugs.on(Bug.FENCED_EPOCH_PRODUCE):
                # B22: a fenced epoch's batch is appended as its producer's.
                return APPEND
            raise PartitionLogError(
                Errors.INVALID_PRODUCER_EPOCH,
                f"{where}: epoch {batch.producer_epoch} is older than its epoch {entry.epoch}",
            )
        if batch.producer_epoch > entry.epoch:
            if entry.current_txn_first_offset >= 0:
                # Every epoch bump of a transactional producer comes after
                # the marker that ends its transaction here (the coordinator
                # completes an end, or a fence, only once every marker is
                # written); a newer epoch's batch while the older epoch's
                # transaction is still open means that marker is missing,
                # and the new batch must not join (and later commit) it.
                raise PartitionLogError(
                    Errors.INVALID_TXN_STATE,
                    f"{where}: epoch {batch.producer_epoch} while the transaction of epoch "
                    f"{entry.epoch} from offset {entry.current_txn_first_offset} has no "
                    "marker yet",
                )
            if batch.base_sequence != 0:
                raise PartitionLogError(
                    Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"{where}: invalid sequence number for new epoch {batch.producer_epoch}: "
                    f"{batch.base_sequence} (a new epoch starts at 0; current epoch "
                    f"{entry.epoch})",
                )
            return APPEND
        if not _in_sequence(entry.last_seq, batch.base_sequence):
            raise PartitionLogError(
                Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"{where}: out of order sequence number {batch.base_sequence} in epoch "
                f"{batch.producer_epoch}, expected {increment_sequence(entry.last_seq, 1)} "
                f"after {entry.last_seq}",
            )
        if not batch.is_transactional and entry.current_txn_first_offset >= 0:
            raise PartitionLogError(
                Errors.INVALID_TXN_STATE,
                f"{where}: a non-transactional batch while its transaction is open (from "
                f"offset {entry.current_txn_first_offset})",
            )
        return APPEND

    def _check_marker(
        self,
        batch: ProducerBatch,
        marker: EndTxnMarker,
        entry: ProducerEntry | None,
        bumps_epoch: bool,
    ) -> Append:
        """A marker may end the producer's transaction unless its producer or
        coordinator epoch is older than the producer's (``checkProducerEpoch``,
        ``checkCoordinatorEpoch``): a zombie coordinator's marker must not end
        a transaction its successor decides.  With transaction version 2
        (``bumps_epoch``) a transaction's batches are at epoch E and its
        marker at E + 1, and the producer's next transaction writes at
        E + 1: a marker at the epoch of the transaction open here is a late
        copy of the previous transaction's (a retry whose first attempt
        landed after all), which would end this one early with the other's
        outcome (KAFKA-19446).  At that epoch with nothing open it is such a
        retry and harmless (KAFKA-19999)."""
        if entry is None:
            return APPEND
        where = (
            f"{marker.type.name} marker of producer {batch.producer_id} at offset "
            f"{batch.base_offset}"
        )
        if batch.producer_epoch < entry.epoch:
            raise PartitionLogError(
                Errors.INVALID_PRODUCER_EPOCH,
                f"{where}: epoch {batch.producer_epoch} is older than its epoch {entry.epoch}",
            )
        if (
            bumps_epoch
            and batch.producer_epoch == entry.epoch
            and entry.current_txn_first_offset >= 0
        ):
            raise PartitionLogError(
                Errors.INVALID_PRODUCER_EPOCH,
                f"{where}: epoch {batch.producer_epoch} is the epoch of the transaction open "
                f"from offset {entry.current_txn_first_offset}, not past it: a late marker of "
                "the producer's previous transaction (transaction version 2)",
            )
        if marker.coordinator_epoch < entry.coordinator_epoch:
            raise PartitionLogError(
                Errors.TRANSACTION_COORDINATOR_FENCED,
                f"{where}: coordinator epoch {marker.coordinator_epoch} is older than the "
                f"last marker's {entry.coordinator_epoch}",
            )
        return APPEND

    def update(self, batch: ProducerBatch) -> CompletedTxn | None:
        """Records an appended batch, leader's or follower's, without checks
        (a follower takes the leader's batches as they are). Batches come in
        log order; a batch without a producer id only moves the end.  A
        transactional batch opens its producer's transaction if none is
        open; a marker ends it and returns it (None for a marker of a
        producer with no transaction open here: it changes no reader's
        view, and Kafka's neither indexes nor counts it)."""
        if batch.base_offset < self.map_end_offset:
            raise ValueError(
                f"batch at offset {batch.base_offset} is below the producer state's end "
                f"{self.map_end_offset}: batches are applied in log order"
            )
        completed = None
        if batch.producer_id != NO_PRODUCER_ID:
            entry = self.producers.get(batch.producer_id)
            if entry is None:
                entry = ProducerEntry(batch.producer_id, NO_PRODUCER_EPOCH, (), NO_SEQUENCE)
            marker = batch.marker
            if marker is not None:
                first = entry.current_txn_first_offset
                if first >= 0:
                    completed = CompletedTxn(
                        batch.producer_id,
                        first,
                        batch.base_offset,
                        marker.aborted,
                        self._stable_offset_without(batch.producer_id, batch.base_offset + 1),
                    )
                    del self.ongoing[first]
                    self.unreplicated[first] = completed
                entry = _ended(entry, batch, marker)
            else:
                entry = entry.added(batch)
                if batch.is_transactional and entry.current_txn_first_offset < 0:
                    entry = replace(entry, current_txn_first_offset=batch.base_offset)
                    self.ongoing[batch.base_offset] = batch.producer_id
            self.producers[batch.producer_id] = entry
        self.map_end_offset = batch.last_offset + 1
        return completed

    def _stable_offset_without(self, producer_id: int, otherwise: int) -> int:
        """The first offset of the lowest open transaction of another
        producer than ``producer_id``, else ``otherwise``
        (``ProducerStateManager.lastStableOffset(completedTxn)``)."""
        others = [first for first, owner in self.ongoing.items() if owner != producer_id]
        return min(others) if others else otherwise

    def first_unstable_offset(self) -> int | None:
        """The first offset of the lowest transaction that is open or whose
        marker the high watermark has not passed (``firstUnstableOffset``),
        None if there is none: the last stable offset is the lower of it and
        the high watermark."""
        firsts = [*self.ongoing, *self.unreplicated]
        return min(firsts) if firsts else None

    def on_high_watermark(self, high_watermark: int) -> None:
        """Forgets the completed transactions whose marker lies below
        ``high_watermark`` (``onHighWatermarkUpdated``): replicated, they no
        longer hold the last stable offset back."""
        for first, txn in list(self.unreplicated.items()):
            if txn.last_offset < high_watermark:
                del self.unreplicated[first]

    def truncate_to(self, offset: int) -> None:
        """Forgets the batches at or after ``offset`` (the log's new end), and
        the producers left with none.

        This forgets and never invents; it is not the state the log had at
        ``offset``: batches that a later epoch or the five-batch window had
        pushed out do not come back. A log rebuilds that state from its
        latest snapshot at or before ``offset`` plus the batches after it
        (:meth:`rebuild`), as Kafka's ``truncateAndReload`` does.
        """
        for producer_id, entry in list(self.producers.items()):
            kept = tuple(batch for batch in entry.batches if batch.last_offset < offset)
            txn_first = (
                entry.current_txn_first_offset if entry.current_txn_first_offset < offset else -1
            )
            if not kept:
                del self.producers[producer_id]
            elif len(kept) != len(entry.batches) or txn_first != entry.current_txn_first_offset:
                self.producers[producer_id] = ProducerEntry(
                    producer_id,
                    entry.epoch,
                    kept,
                    kept[-1].timestamp,
                    entry.coordinator_epoch,
                    txn_first,
                )
        self.map_end_offset = min(self.map_end_offset, offset)
        # A transaction whose marker is cut off is open again, if its first
        # batch is kept (and its producer with it).
        for txn in self.unreplicated.values():
            owner = self.producers.get(txn.producer_id)
            if txn.last_offset >= offset and txn.first_offset < offset and owner is not None:
                self.producers[txn.producer_id] = replace(
                    owner, current_txn_first_offset=txn.first_offset
                )
        self._derive_transactions(lambda txn: txn.last_offset < offset)

    def truncate_from_start(self, offset: int) -> None:
        """Forgets the producers whose last batch lies before ``offset``, the
        log's new start (retention, DeleteRecords): "all producer records
        have been deleted", so such a producer may start again at any
        sequence. A producer with a batch at or after the start keeps its
        whole entry, as in Kafka."""
        for producer_id, entry in list(self.producers.items()):
            if entry.last_offset < offset:
                del self.producers[producer_id]
        self.map_end_offset = max(self.map_end_offset, offset)
        self._derive_transactions(lambda txn: txn.last_offset >= offset)

    def _derive_transactions(self, keep: Callable[[CompletedTxn], bool]) -> None:
        """The open transactions again from the entries, and the completed
        ones that ``keep`` keeps."""
        self.ongoing = {
            entry.current_txn_first_offset: producer_id
            for producer_id, entry in self.producers.items()
            if entry.current_txn_first_offset >= 0
        }
        self.unreplicated = {first: t for first, t in self.unreplicated.items() if keep(t)}

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Removes the producers idle for ``producer.id.expiration.ms`` or
        longer (by their last batch's timestamp, ``isProducerExpired``) and
        without an open transaction; their ids, in order."""
        expired = sorted(
            producer_id
            for producer_id, entry in self.producers.items()
            if entry.current_txn_first_offset < 0 and now_ms - entry.last_timestamp >= expiration_ms
        )
        for producer_id in expired:
            del self.producers[producer_id]
        return expired

    def snapshot(self) -> bytes:
        """The snapshot of this state at its end offset."""
        return encode_snapshot(self.producers.values(), self.map_end_offset)

    @classmethod
    def rebuild(
        cls, snapshot: bytes | None, batches: Iterable[ProducerBatch], log_start_offset: int = 0
    ) -> ProducerStateManager:
        """The state from a snapshot (or none: from the log start) plus the
        log's batches after the snapshot's offset, as recovery and
        truncation rebuild it (``UnifiedLog.rebuildProducerState``). Batches
        below the snapshot's offset are skipped."""
        if snapshot is None:
            state = cls(map_end_offset=log_start_offset)
        else:
            decoded = decode_snapshot(snapshot)
            state = cls(
                {entry.producer_id: entry for entry in decoded.producers},
                decoded.offset,
            )
        for batch in batches:
            if batch.base_offset >= state.map_end_offset:
                state.update(batch)
        return state


# -- the snapshot file (the content of Kafka's <offset>.snapshot) ----------
#
# kq's version 1, big-endian:
#   version  int16   1
#   crc      uint32  CRC-32C of every byte after this field
#   offset   int64   the end offset the snapshot was taken at
#   count    int32   number of producers, then per producer (by id):
#     producer_id int64, epoch int16, last_timestamp int64,
#     coordinator_epoch int32, current_txn_first_offset int64,
#     batch_count int8 (0..5), then per batch, oldest first:
#       first_seq int32, last_seq int32, first_offset int64,
#       last_offset int64, timestamp int64

SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hI")
_BODY_HEADER = struct.Struct(">qi")
_PRODUCER = struct.Struct(">qhqiqb")
_BATCH = struct.Struct(">iiqqq")


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """A decoded snapshot: the offset it was taken at and the producers."""

    offset: int
    producers: tuple[ProducerEntry, ...]


def encode_snapshot(producers: Iterable[ProducerEntry], offset: int) -> bytes:
    """The bytes of a producer-state snapshot at ``offset`` (the producers in
    id order, so equal states give equal bytes)."""
    entries = sorted(producers, key=lambda entry: entry.producer_id)
    parts = [_BODY_HEADER.pack(offset, len(entries))]
    for entry in entries:
        parts.append(
            _PRODUCER.pack(
                entry.producer_id,
                entry.epoch,
                entry.last_timestamp,
                entry.coordinator_epoch,
                entry.current_txn_first_offset,
                len(entry.batches),
            )
        )
        parts.extend(
            _BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp)
            for b in entry.batches
        )
    body = b"".join(parts)
    return _HEADER.pack(SNAPSHOT_VERSION, crc32c(body)) + body


def _corrupt(what: str) -> PartitionLogError:
    return PartitionLogError(Errors.KAFKA_STORAGE_ERROR, f"producer snapshot: {what}")


def decode_snapshot(data: bytes) -> ProducerSnapshot:
    """The snapshot in ``data``; a :class:`PartitionLogError`
    (``KAFKA_STORAGE_ERROR``) naming what is wrong for a short or damaged
    one (the log then rebuilds from an older snapshot or the log start)."""
    if len(data) < _HEADER.size + _BODY_HEADER.size:
        raise _corrupt(
            f"{len(data)} bytes, shorter than its {_HEADER.size + _BODY_HEADER.size}-byte header"
        )
    version, stored_crc = _HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise _corrupt(f"unknown version {version}, expected {SNAPSHOT_VERSION}")
    body = memoryview(data)[_HEADER.size :]
    computed = crc32c(body)
    if computed != stored_crc:
        raise _corrupt(f"CRC 0x{stored_crc:08x} stored, 0x{computed:08x} computed")
    offset, count = _BODY_HEADER.unpack_from(body, 0)
    if offset < 0 or count < 0:
        raise _corrupt(f"offset {offset} or producer count {count} is negative")
    position = _BODY_HEADER.size
    producers: list[ProducerEntry] = []
    previous_id: int | None = None
    for index in range(count):
        if position + _PRODUCER.size > len(body):
            raise _corrupt(f"ends inside producer {index} of {count}")
        producer_id, epoch, last_timestamp, coordinator_epoch, txn_first, batch_count = (
            _PRODUCER.unpack_from(body, position)
        )
        position += _PRODUCER.size
        if previous_id is not None and producer_id <= previous_id:
            raise _corrupt(f"producer {producer_id} does not follow producer {previous_id}")
        if not 0 <= batch_count <= NUM_BATCHES_TO_RETAIN:
            raise _corrupt(f"producer {producer_id} has {batch_count} batches")
        if position + batch_count * _BATCH.size > len(body):
            raise _corrupt(f"ends inside the batches of producer {producer_id}")
        batches = []
        for _ in range(batch_count):
            batches.append(_BATCH.unpack_from(body, position))
            position += _BATCH.size
        try:
            entry = ProducerEntry(
                producer_id,
                epoch,
                tuple(BatchMetadata(*fields) for fields in batches),
                last_timestamp,
                coordinator_epoch,
                txn_first,
            )
        except ValueError as error:
            raise _corrupt(str(error)) from None
        if entry.last_offset >= offset:
            raise _corrupt(
                f"producer {producer_id}'s last offset {entry.last_offset} is not below "
                f"the snapshot's offset {offset}"
            )
        producers.append(entry)
        previous_id = producer_id
    if position != len(body):
        raise _corrupt(f"{len(body) - position} bytes after the last producer")
    return ProducerSnapshot(offset, tuple(producers))

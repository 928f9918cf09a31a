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

Transactions (their own issue) will add the coordinator epoch and the first
offset of the open transaction; the entries and the snapshot already carry
both (``-1`` for none).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from crc32c import crc32c

import bugs
from bugs import Bug
from partition_log.errors import Errors, PartitionLogError

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

    def __post_init__(self) -> None:
        if self.last_offset_delta < 0:
            raise ValueError(f"last offset delta {self.last_offset_delta} is negative")
        if self.producer_id != NO_PRODUCER_ID and not (
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
        epoch forgets the old epoch's batches; the oldest of six goes."""
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

    def __post_init__(self) -> None:
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

    def check(self, batch: ProducerBatch) -> Append | Duplicate:
        """Whether a leader may append ``batch``: :class:`Append`, a
        :class:`Duplicate` with the original offsets, or a
        :class:`PartitionLogError` (``INVALID_PRODUCER_EPOCH``,
        ``OUT_OF_ORDER_SEQUENCE_NUMBER``) naming the producer, epochs and
        sequences. Changes nothing."""
        if batch.producer_id == NO_PRODUCER_ID:
            return APPEND
        entry = self.producers.get(batch.producer_id)
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
            raise PartitionLogError(
                Errors.INVALID_PRODUCER_EPOCH,
                f"{where}: epoch {batch.producer_epoch} is older than its epoch {entry.epoch}",
            )
        if batch.producer_epoch > entry.epoch:
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
        return APPEND

    def update(self, batch: ProducerBatch) -> None:
        """Records an appended batch, leader's or follower's, without checks
        (a follower takes the leader's batches as they are). Batches come in
        log order; a batch without a producer id only moves the end."""
        if batch.base_offset < self.map_end_offset:
            raise ValueError(
                f"batch at offset {batch.base_offset} is below the producer state's end "
                f"{self.map_end_offset}: batches are applied in log order"
            )
        if batch.producer_id != NO_PRODUCER_ID:
            entry = self.producers.get(batch.producer_id)
            if entry is None:
                entry = ProducerEntry(batch.producer_id, NO_PRODUCER_EPOCH, (), NO_SEQUENCE)
            self.producers[batch.producer_id] = entry.added(batch)
        self.map_end_offset = batch.last_offset + 1

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
            if not kept:
                del self.producers[producer_id]
            elif len(kept) != len(entry.batches):
                self.producers[producer_id] = ProducerEntry(
                    producer_id,
                    entry.epoch,
                    kept,
                    kept[-1].timestamp,
                    entry.coordinator_epoch,
                    entry.current_txn_first_offset,
                )
        self.map_end_offset = min(self.map_end_offset, offset)

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

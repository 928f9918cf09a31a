"""The leader-epoch cache of a partition replica (Kafka's
``LeaderEpochFileCache``, KIP-101 and KIP-279), and its checkpoint format.

The cache maps each leader epoch of the log to the offset of its first batch:
``(epoch, start_offset)`` entries whose epochs and start offsets both
strictly increase. It is a cache in the strict sense: it can always be
derived again from the ``(base offset, partition leader epoch)`` of the
batches in the log (:func:`derive`), and recovery does exactly that, so a
stale checkpoint costs nothing but the time to read the batches.

Unlike Kafka's mutable, lock-guarded cache, a :class:`LeaderEpochCache` is
immutable: every change returns a new cache (as the metadata image does), so
the log can build the new cache, write its checkpoint, and only then swap it
in; a failed write leaves the old one in place. Its invariants are checked
when it is made (``__post_init__``).

Pure: no files, no clock. The checkpoint bytes come and go through
:func:`encode_checkpoint` and :func:`decode_checkpoint`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from partition_log.errors import Errors, PartitionLogError

__all__ = [
    "CHECKPOINT_FILE_NAME",
    "CHECKPOINT_VERSION",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEndOffset",
    "EpochEntry",
    "LeaderEpochCache",
    "decode_checkpoint",
    "derive",
    "encode_checkpoint",
]

# OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET.
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

# LeaderEpochCheckpointFile: the file's name in the partition directory and
# the version on its first line.
CHECKPOINT_FILE_NAME = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """The first offset written in ``epoch`` (Kafka's ``EpochEntry``)."""

    epoch: int
    start_offset: int

    def __post_init__(self) -> None:
        # LeaderEpochFileCache.assign: "Received invalid partition leader
        # epoch entry" for a negative epoch or offset.
        if self.epoch < 0 or self.start_offset < 0:
            raise ValueError(
                f"invalid leader epoch entry: epoch {self.epoch} at offset {self.start_offset} "
                "(both must be >= 0)"
            )


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """An answer of OffsetsForLeaderEpoch: the largest epoch at most the one
    asked for, and the offset where it ends (exclusive); both
    ``UNDEFINED_*`` when there is no answer."""

    epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.end_offset == UNDEFINED_EPOCH_OFFSET


_UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


@dataclass(frozen=True, slots=True)
class LeaderEpochCache:
    """``(epoch, start_offset)`` entries, epochs and start offsets strictly
    increasing (the invariant Kafka's ``maybeTruncateNonMonotonicEntries``
    keeps, PR #5678), oldest first."""

    entries: tuple[EpochEntry, ...] = ()

    def __post_init__(self) -> None:
        for before, after in zip(self.entries, self.entries[1:], strict=False):
            if not (before.epoch < after.epoch and before.start_offset < after.start_offset):
                raise ValueError(
                    f"leader epoch entries must increase in epoch and start offset: "
                    f"{before} then {after}"
                )

    # -- reads ------------------------------------------------------------

    @property
    def latest_epoch(self) -> int:
        """The epoch of the last entry, ``UNDEFINED_EPOCH`` when empty."""
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self.entries[0] if self.entries else None

    def _epochs(self) -> list[int]:
        return [entry.epoch for entry in self.entries]

    def end_offset_for_epoch(self, requested: int, log_end_offset: int) -> EpochEndOffset:
        """Kafka's ``endOffsetFor``: the largest epoch at most ``requested``
        and the start offset of the first epoch above it (the log end offset
        when ``requested`` is the latest epoch).

        The five answers of ``LeaderEpochFileCache.endOffsetFor``:
        - ``requested`` undefined: undefined;
        - ``requested`` is the latest epoch: ``(requested, log_end_offset)``;
        - no epoch above ``requested``: undefined (a leader's latest epoch
          is its current one, so a follower cannot be ahead of it);
        - no epoch at or below ``requested``: ``(requested, start of the
          first epoch above)``, "the data has already been removed";
        - else ``(floor epoch, start of the first epoch above)``.
        """
        if requested == UNDEFINED_EPOCH:
            return _UNDEFINED
        if self.entries and self.entries[-1].epoch == requested:
            return EpochEndOffset(requested, log_end_offset)
        epochs = self._epochs()
        higher = bisect.bisect_right(epochs, requested)
        if higher == len(epochs):
            return _UNDEFINED
        higher_start = self.entries[higher].start_offset
        if higher == 0:
            return EpochEndOffset(requested, higher_start)
        return EpochEndOffset(self.entries[higher - 1].epoch, higher_start)

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch the batch at ``offset`` was written in (the last entry
        starting at or before it), ``UNDEFINED_EPOCH`` below the first
        entry (Kafka's ``epochForOffset``)."""
        starts = [entry.start_offset for entry in self.entries]
        index = bisect.bisect_right(starts, offset)
        return self.entries[index - 1].epoch if index else UNDEFINED_EPOCH

    # -- changes (each returns a new cache) -------------------------------

    def assign(self, epoch: int, start_offset: int) -> LeaderEpochCache:
        """The cache with ``epoch`` starting at ``start_offset``.

        Nothing changes unless the epoch differs from the latest or starts
        lower (``isUpdateNeeded``); otherwise every entry whose epoch is at
        least ``epoch`` or whose start is at least ``start_offset`` goes
        first (``maybeTruncateNonMonotonicEntries``), so both keep
        increasing. Called on every appended batch (its leader epoch and
        base offset), and by a new leader with its log end offset (KIP-279).
        """
        entry = EpochEntry(epoch, start_offset)
        latest = self.latest_entry
        if latest is not None and latest.epoch == epoch and start_offset >= latest.start_offset:
            return self
        kept = list(self.entries)
        while kept and (kept[-1].epoch >= epoch or kept[-1].start_offset >= start_offset):
            kept.pop()
        kept.append(entry)
        return LeaderEpochCache(tuple(kept))

    def truncate_from_end(self, end_offset: int) -> LeaderEpochCache:
        """Without the entries that start at or after ``end_offset``, the
        log's new end after a truncation (``truncateFromEnd``).

        The log calls it on every truncation, even one that removes no
        batch: a new leader's entry at its log end offset has no batch yet
        (``UnifiedLog.truncateTo``). ``end_offset`` is the actual new end,
        the base offset of the first batch removed.
        """
        if end_offset < 0:
            return self
        kept = [entry for entry in self.entries if entry.start_offset < end_offset]
        if len(kept) == len(self.entries):
            return self
        return LeaderEpochCache(tuple(kept))

    def truncate_from_start(self, start_offset: int) -> LeaderEpochCache:
        """The cache for a log that now starts at ``start_offset``
        (``truncateFromStart``): the entries starting at or before it go,
        but the last of them stays, moved to ``start_offset``, since its
        epoch still covers the first offsets of the log."""
        starts = [entry.start_offset for entry in self.entries]
        removed = bisect.bisect_right(starts, start_offset)
        if removed == 0:
            return self
        covering = EpochEntry(self.entries[removed - 1].epoch, start_offset)
        return LeaderEpochCache((covering, *self.entries[removed:]))

    @classmethod
    def from_entries(cls, entries: Iterable[EpochEntry]) -> LeaderEpochCache:
        """The cache made by assigning ``entries`` in order (Kafka's
        constructor reading its checkpoint)."""
        cache = cls()
        for entry in entries:
            cache = cache.assign(entry.epoch, entry.start_offset)
        return cache


def derive(
    batches: Iterable[tuple[int, int]], log_start_offset: int | None = None
) -> LeaderEpochCache:
    """The cache derived from the ``(base_offset, partition_leader_epoch)`` of
    a log's batches in order, as recovery rebuilds it (``LogLoader`` via
    ``LogSegment.recover``): each batch is assigned, then the cache is
    truncated to ``log_start_offset`` when the log starts inside its first
    batch (DeleteRecords)."""
    cache = LeaderEpochCache()
    for base_offset, epoch in batches:
        # A batch without a leader epoch (RecordBatch.NO_PARTITION_LEADER_EPOCH,
        # -1) is not assigned (UnifiedLog only assigns magic v2 epochs >= 0).
        if epoch >= 0:
            cache = cache.assign(epoch, base_offset)
    if log_start_offset is not None:
        cache = cache.truncate_from_start(log_start_offset)
    return cache


# -- the leader-epoch-checkpoint file (LeaderEpochCheckpointFile) ---------


def encode_checkpoint(entries: Sequence[EpochEntry]) -> bytes:
    """The content of ``leader-epoch-checkpoint``: the version ``0``, the
    entry count, then ``epoch start_offset`` per line, each line ending in
    a newline (Kafka's ``CheckpointFile``)."""
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    lines.extend(f"{entry.epoch} {entry.start_offset}" for entry in entries)
    return ("\n".join(lines) + "\n").encode("ascii")


def _malformed(line_number: int, what: str) -> PartitionLogError:
    return PartitionLogError(
        Errors.KAFKA_STORAGE_ERROR, f"{CHECKPOINT_FILE_NAME} line {line_number}: {what}"
    )


def _parse_int(text: str, line_number: int, what: str) -> int:
    # int() would take "+1", " 1" or "1_0"; the file holds plain decimals.
    digits = text[1:] if text.startswith("-") else text
    if not digits.isascii() or not digits.isdigit():
        raise _malformed(line_number, f"{what} {text!r} is not a decimal integer")
    return int(text)


def decode_checkpoint(data: bytes) -> tuple[EpochEntry, ...]:
    """The entries of a ``leader-epoch-checkpoint`` file's content.

    A malformed file is a :class:`PartitionLogError` (``KAFKA_STORAGE_ERROR``)
    naming the line: an unknown version, a count that is not the number of
    entry lines, an entry that is not two non-negative integers, or entries
    whose epochs or start offsets do not increase (kq writes only increasing
    entries, so anything else is damage, where Kafka would silently let
    ``assign`` drop entries).
    """
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as error:
        raise PartitionLogError(
            Errors.KAFKA_STORAGE_ERROR,
            f"{CHECKPOINT_FILE_NAME}: byte {error.start} is not ASCII",
        ) from None
    lines = text.split("\n")
    # Each line ends in a newline; Kafka's reader also takes a last line
    # without one.
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise _malformed(1, "the file is empty, expected the version")
    version = _parse_int(lines[0], 1, "version")
    if version != CHECKPOINT_VERSION:
        raise _malformed(1, f"unknown version {version}, expected {CHECKPOINT_VERSION}")
    if len(lines) < 2:
        raise _malformed(2, "missing, expected the entry count")
    count = _parse_int(lines[1], 2, "entry count")
    if count < 0:
        raise _malformed(2, f"entry count {count} is negative")
    body = lines[2:]
    if len(body) != count:
        where = 2 + min(len(body), count) + 1
        raise _malformed(
            where, f"the count on line 2 is {count} entries but the file has {len(body)}"
        )
    entries: list[EpochEntry] = []
    for index, line in enumerate(body):
        line_number = index + 3
        fields = line.split(" ")
        if len(fields) != 2:
            raise _malformed(line_number, f"{line!r} is not 'epoch start_offset'")
        epoch = _parse_int(fields[0], line_number, "epoch")
        start = _parse_int(fields[1], line_number, "start offset")
        if epoch < 0 or start < 0:
            raise _malformed(line_number, f"epoch {epoch} at offset {start} is negative")
        entry = EpochEntry(epoch, start)
        if entries and not (entries[-1].epoch < epoch and entries[-1].start_offset < start):
            previous = entries[-1]
            raise _malformed(
                line_number,
                f"epoch {epoch} at offset {start} does not follow epoch {previous.epoch} "
                f"at offset {previous.start_offset} (epochs and start offsets must increase)",
            )
        entries.append(entry)
    return tuple(entries)

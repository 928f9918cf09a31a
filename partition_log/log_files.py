"""The files of a partition directory besides the live segments: the small
checkpoint files, the suffixes of the multi-step operations (two-phase
delete, the segment swap of compaction), and what opening a log does with
the leftovers of an interrupted one (Kafka's ``LogLoader``).

Names (brokers.md §2.1; ``LogFileUtils``, ``UnifiedLog``):

- ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
  ``cleaner-offset-checkpoint``: one offset each, as ``0\\n<offset>\\n``
  (Kafka keeps one file per log directory listing every partition; kq one per
  partition, so a partition directory is self-contained);
- ``<name>.tmp``: a checkpoint or snapshot being written (write, sync,
  rename over the old file, sync the directory);
- ``<segment file>.deleted`` (and ``<offset>.snapshot.deleted``): the first
  phase of a delete (``LocalLog.deleteSegmentFiles``); removed
  ``file.delete.delay.ms`` later, or when the log is next opened;
- ``<segment file>.cleaned``: a new segment of a swap being written;
- ``<segment file>.swap``: a new segment written whole and synced, waiting to
  replace the old segments of its range (``LocalLog.replaceSegments``).

Pure: the files only through the seam.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from partition_log.epoch_cache import CHECKPOINT_FILE_NAME
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, LogFile, Names
from partition_log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    Segment,
    file_name,
    parse_log_name,
)

__all__ = [
    "CLEANED_SUFFIX",
    "CLEANER_OFFSET_FILE",
    "CLEAN_SHUTDOWN_FILE",
    "DELETED_SUFFIX",
    "LOG_START_OFFSET_FILE",
    "RECOVERY_POINT_FILE",
    "SEGMENT_SUFFIXES",
    "SNAPSHOT_SUFFIX",
    "SWAP_SUFFIX",
    "TMP_SUFFIX",
    "InterruptedOperations",
    "Listing",
    "SuffixedDirectory",
    "classify",
    "decode_offset",
    "encode_offset",
    "finish_interrupted_operations",
    "read_whole",
    "storage",
    "write_atomically",
]

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
CLEANER_OFFSET_FILE = "cleaner-offset-checkpoint"
SNAPSHOT_SUFFIX = ".snapshot"
TMP_SUFFIX = ".tmp"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# Every file of a segment, the log first: a delete, a swap and a truncation
# move or remove them together (Kafka's LogSegment.changeFileSuffixes and
# deleteIfExists cover its four files).
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
_OFFSET_VERSION = 0
_NUMBERED = re.compile(
    r"(\d{20})(\.log|\.index|\.timeindex|\.txnindex|\.snapshot)(\.deleted|\.cleaned|\.swap)?"
)
_FIXED = {
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    LOG_START_OFFSET_FILE,
    CLEANER_OFFSET_FILE,
    CHECKPOINT_FILE_NAME,
}


def storage(message: str) -> PartitionLogError:
    return PartitionLogError(Errors.KAFKA_STORAGE_ERROR, message)


# -- small files -------------------------------------------------------------


def write_atomically(directory: FileDirectory, name: str, data: bytes) -> None:
    """``name`` holds ``data`` or its old bytes after a power loss, never a
    mix (``CheckpointFile.write``: temporary file, sync, rename, sync)."""
    temporary = name + TMP_SUFFIX
    if directory.exists(temporary):
        directory.delete(temporary)
    handle = directory.create(temporary)
    try:
        handle.append(data)
        handle.sync()
    finally:
        handle.close()
    directory.rename(temporary, name)
    directory.sync_directory()


def read_whole(directory: FileDirectory, name: str) -> bytes:
    handle = directory.open(name)
    try:
        return handle.read(0, handle.size)
    finally:
        handle.close()


def encode_offset(offset: int) -> bytes:
    return f"{_OFFSET_VERSION}\n{offset}\n".encode("ascii")


def decode_offset(name: str, text: bytes) -> int:
    """The offset of a one-offset checkpoint; refuses anything else, naming
    the file."""
    lines = text.split(b"\n")
    if (
        len(lines) != 3
        or lines[0] != str(_OFFSET_VERSION).encode()
        or lines[2] != b""
        or not lines[1].isdigit()
    ):
        raise storage(f"file {name} is not an offset checkpoint: {text!r}")
    return int(lines[1])


# -- classification ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listing:
    """A partition directory's files by role."""

    logs: list[str]
    snapshots: list[int]
    temporary: list[str]
    deleted: list[str]
    cleaned: list[str]
    swap: list[str]


def classify(names: Names) -> Listing:
    """The files of a directory by role; refuses a file that is no part of a
    log, naming it (before anything is changed)."""
    logs: list[str] = []
    snapshots: list[int] = []
    temporary: list[str] = []
    deleted: list[str] = []
    cleaned: list[str] = []
    swap: list[str] = []
    for name in names:
        if name in _FIXED:
            continue
        if name.endswith(TMP_SUFFIX):
            stem = name[: -len(TMP_SUFFIX)]
            if stem in _FIXED or (_NUMBERED.fullmatch(stem) and stem.endswith(SNAPSHOT_SUFFIX)):
                # A checkpoint or snapshot write a crash interrupted.
                temporary.append(name)
                continue
        match = _NUMBERED.fullmatch(name)
        operation = match.group(3) if match else None
        if match is None or (
            match.group(2) == SNAPSHOT_SUFFIX
            and operation
            in (
                CLEANED_SUFFIX,
                SWAP_SUFFIX,
            )
        ):
            raise storage(
                f"file {name!r} in the partition directory is not part of a log "
                "(segment, index, snapshot or checkpoint)"
            )
        if operation == DELETED_SUFFIX:
            deleted.append(name)
        elif operation == CLEANED_SUFFIX:
            cleaned.append(name)
        elif operation == SWAP_SUFFIX:
            swap.append(name)
        elif match.group(2) == LOG_SUFFIX:
            parse_log_name(name)
            logs.append(name)
        elif match.group(2) == SNAPSHOT_SUFFIX:
            snapshots.append(int(match.group(1)))
    return Listing(sorted(logs), sorted(snapshots), temporary, deleted, cleaned, swap)


# -- a directory seen through a suffix ---------------------------------------


class SuffixedDirectory:
    """The files of ``directory`` whose names end with ``suffix``, under their
    names without it: a :class:`Segment` made through it writes
    ``<base>.log.cleaned`` and its indexes (or opens a ``.swap`` segment)
    with no change to the segment code."""

    def __init__(self, directory: FileDirectory, suffix: str) -> None:
        self._directory = directory
        self._suffix = suffix

    def create(self, name: str) -> LogFile:
        return self._directory.create(name + self._suffix)

    def open(self, name: str) -> LogFile:
        return self._directory.open(name + self._suffix)

    def exists(self, name: str) -> bool:
        return self._directory.exists(name + self._suffix)

    def list(self) -> Names:
        cut = len(self._suffix)
        return [n[:-cut] for n in self._directory.list() if n.endswith(self._suffix)]

    def rename(self, old: str, new: str) -> None:
        self._directory.rename(old + self._suffix, new + self._suffix)

    def delete(self, name: str) -> None:
        self._directory.delete(name + self._suffix)

    def sync_directory(self) -> None:
        self._directory.sync_directory()


# -- leftovers of interrupted operations --------------------------------------


@dataclass(frozen=True, slots=True)
class InterruptedOperations:
    """What opening did with the leftovers of interrupted operations: the
    ``.deleted`` and ``.cleaned`` files removed, the ``.swap`` files dropped
    (KAFKA-6264) and completed, and the old segment files the completed
    swaps replaced."""

    removed: tuple[str, ...] = ()
    dropped_swaps: tuple[str, ...] = ()
    completed_swaps: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    # The offset a completed swap restarted the whole log at (an
    # interrupted PartitionLog.truncate_fully_and_start_at), else None.
    restarted_at: int | None = None

    @property
    def any(self) -> bool:
        return bool(self.removed or self.dropped_swaps or self.completed_swaps)


def _numbered_base(name: str) -> int:
    return int(name[:20])


def finish_interrupted_operations(
    directory: FileDirectory,
    listing: Listing,
    *,
    now_ms: int,
    max_batch_bytes: int,
    index_interval_bytes: int,
    max_index_bytes: int,
) -> InterruptedOperations:
    """Finish or undo what a crash interrupted, as Kafka's ``LogLoader``
    (``removeTempFilesAndCollectSwapFiles`` and ``load``):

    1. every ``.deleted`` file is removed (a restart completes the delete);
    2. every ``.cleaned`` file is removed; a ``.swap`` file at or above the
       lowest ``.cleaned`` base offset is removed too (KAFKA-6264): the swap
       renames ``.cleaned`` to ``.swap`` from the highest segment down, so a
       ``.cleaned`` file left means that swap never finished its renames and
       its old segments are all still in place;
    3. the remaining ``.swap`` segments were written whole and synced before
       any old segment was touched: the live segment files whose base offset
       lies in ``[lowest swap base, highest swap next offset)`` are the old
       segments they replace and are removed (the range is at least one
       offset wide per swap, so an empty swap segment still replaces the old
       one of its base), then every ``.swap`` file is renamed live;
    4. except one swap that restarts the whole log
       (``PartitionLog.truncate_fully_and_start_at``): a single empty
       ``.swap`` segment whose base is at or above every live segment's base.
       Compaction never swaps the active segment, so its swaps all lie below
       the last live base; this one replaces every live segment file, and
       ``restarted_at`` names its base (the caller rewrites the small files
       for the new log, :func:`partition_log.log_swap.restart_checkpoints`).

    The directory is synced after the changes."""
    removed: list[str] = []
    for name in listing.deleted:
        directory.delete(name)
        removed.append(name)
    min_cleaned: int | None = None
    for name in listing.cleaned:
        base = _numbered_base(name)
        min_cleaned = base if min_cleaned is None else min(min_cleaned, base)
        directory.delete(name)
        removed.append(name)
    dropped: list[str] = []
    valid: list[str] = []
    for name in listing.swap:
        if min_cleaned is not None and _numbered_base(name) >= min_cleaned:
            directory.delete(name)
            dropped.append(name)
        else:
            valid.append(name)
    low: int | None = None
    high: int | None = None
    empty_swaps: list[int] = []
    swap_logs = 0
    swap_view = SuffixedDirectory(directory, SWAP_SUFFIX)
    for name in valid:
        if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            continue
        swap_logs += 1
        segment, _ = Segment.open(
            swap_view,
            name[: -len(SWAP_SUFFIX)],
            now_ms=now_ms,
            max_batch_bytes=max_batch_bytes,
            index_interval_bytes=index_interval_bytes,
            max_index_bytes=max_index_bytes,
        )
        try:
            start, end = segment.base_offset, max(segment.next_offset, segment.base_offset + 1)
            if segment.next_offset == segment.base_offset:
                empty_swaps.append(start)
        finally:
            segment.close()
        low = start if low is None else min(low, start)
        high = end if high is None else max(high, end)
    restarted_at: int | None = None
    if (
        swap_logs == 1
        and len(empty_swaps) == 1
        and all(parse_log_name(name) <= empty_swaps[0] for name in listing.logs)
    ):
        restarted_at = empty_swaps[0]
    replaced: list[str] = []
    if low is not None and high is not None:
        for name in directory.list():
            match = _NUMBERED.fullmatch(name)
            if (
                match is not None
                and match.group(3) is None
                and match.group(2) in SEGMENT_SUFFIXES
                and (restarted_at is not None or low <= _numbered_base(name) < high)
            ):
                directory.delete(name)
                replaced.append(name)
    # Index files beside the swapped logs: Segment.open above may have
    # rewritten them through the view; every .swap file goes live.
    completed: list[str] = []
    for name in directory.list():
        if name.endswith(SWAP_SUFFIX):
            directory.rename(name, name[: -len(SWAP_SUFFIX)])
            completed.append(name)
    result = InterruptedOperations(
        tuple(removed), tuple(dropped), tuple(completed), tuple(replaced), restarted_at
    )
    if result.any:
        directory.sync_directory()
    return result


def segment_file_names(base: int) -> list[str]:
    return [file_name(base, suffix) for suffix in SEGMENT_SUFFIXES]

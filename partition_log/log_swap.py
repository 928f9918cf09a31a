"""The first step of the segment swap (``LocalLog.replaceSegments``): which
segments may be replaced, and the new segments written as ``.cleaned``
files, whole and synced, before anything live is touched. The later steps
(renames, and what opening does with their leftovers) are in
:meth:`partition_log.log.PartitionLog.replace_segments` and
:func:`partition_log.log_files.finish_interrupted_operations`.

The same swap restarts a whole log at a later offset
(:meth:`partition_log.log.PartitionLog.truncate_fully_and_start_at`): one
empty segment replaces them all, and :func:`restart_checkpoints` rewrites
the small files for the new log.

Pure: the files only through the seam."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from partition_log.batch import BatchScanner
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, encode_checkpoint
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory
from partition_log.log_config import LogConfig
from partition_log.log_files import (
    CLEANED_SUFFIX,
    CLEANER_OFFSET_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    SNAPSHOT_SUFFIX,
    SuffixedDirectory,
    classify,
    encode_offset,
    segment_file_names,
    write_atomically,
)
from partition_log.retention import SegmentInfo
from partition_log.segment import Segment, file_name
from partition_log.txn_index import AbortedTxn

__all__ = ["check_replaced", "restart_checkpoints", "write_cleaned"]

# Age plays no part in splitting the new segments: their batches are old.
_NO_AGE_LIMIT = 1 << 62


def check_replaced(old_bases: Sequence[int], bases: Sequence[int]) -> tuple[int, int]:
    """The indexes in ``bases`` (the log's segments, the active one last) of
    the first and last replaced segment; refuses an empty, unknown,
    unordered or non-consecutive list, or the active segment, naming it."""
    if not old_bases:
        raise PartitionLogError(Errors.INVALID_RECORD, "replace segments: no old segment")
    active = bases[-1]
    if active in old_bases:
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"replace segments: {active} is the active segment, which is never replaced",
        )
    positions = {base: index for index, base in enumerate(bases[:-1])}
    for base in old_bases:
        if base not in positions:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"replace segments: no older segment has base offset {base} "
                f"(segments {list(bases)})",
            )
    first = positions[old_bases[0]]
    if [positions[b] for b in old_bases] != list(range(first, first + len(old_bases))):
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"replace segments: {list(old_bases)} are not consecutive segments in order "
            f"(segments {list(bases)})",
        )
    return first, first + len(old_bases) - 1


def write_cleaned(
    directory: FileDirectory,
    batches: Iterable[bytes | bytearray | memoryview],
    low: int,
    high: int,
    config: LogConfig,
    now_ms: int,
    *,
    aborted: Sequence[AbortedTxn] = (),
) -> list[SegmentInfo]:
    """Write ``batches`` into new segments ``<base>.log.cleaned`` (with their
    ``.index.cleaned``, ``.timeindex.cleaned`` and ``.txnindex.cleaned``), up
    to ``segment.bytes`` each, the first named ``low`` and each later one by
    its first batch's base offset; sync and close them, then the directory.
    ``aborted``, the replaced segments' aborted-transaction entries in
    marker order, go to the new segment whose range holds each marker's
    offset. Refuses anything not whole batches with valid CRCs, in order,
    inside ``[low, high)``, removing the ``.cleaned`` files written so far.
    The new segments' summaries."""
    view = SuffixedDirectory(directory, CLEANED_SUFFIX)
    written: list[Segment] = []
    try:
        _write(view, written, batches, low, high, config, now_ms)
        for index, segment in enumerate(written):
            upper = written[index + 1].base_offset if index + 1 < len(written) else high
            entries = [t for t in aborted if segment.base_offset <= t.last_offset < upper]
            if entries:
                segment.rewrite_aborted(entries)
        for segment in written:
            segment.flush()
    except BaseException:
        for segment in written:
            segment.close()
            for name in segment_file_names(segment.base_offset):
                if view.exists(name):
                    view.delete(name)
        directory.sync_directory()
        raise
    infos = [SegmentInfo.of(segment) for segment in written]
    for segment in written:
        segment.close()
    directory.sync_directory()
    return infos


def _write(
    view: SuffixedDirectory,
    written: list[Segment],
    batches: Iterable[bytes | bytearray | memoryview],
    low: int,
    high: int,
    config: LogConfig,
    now_ms: int,
) -> None:
    previous = low - 1
    segment: Segment | None = None
    for item in batches:
        scanner = BatchScanner(item, max_batch_bytes=config.max_batch_bytes)
        for batch in scanner:
            header = batch.header
            where = f"replace segments: batch at offsets {header.base_offset}..{header.last_offset}"
            if header.base_offset <= previous:
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    f"{where} is not after the previous batch (offset {previous})"
                    if previous >= low
                    else f"{where} is below the replaced range [{low}, {high})",
                )
            if header.last_offset >= high:
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    f"{where} reaches past the replaced range [{low}, {high})",
                )
            data = memoryview(item)[batch.position : batch.end]
            if (
                segment is not None
                and segment.size > 0
                and segment.should_roll(
                    config.segment_bytes,
                    len(data),
                    now_ms,
                    _NO_AGE_LIMIT,
                    incoming_last_offset=header.last_offset,
                )
            ):
                segment = None
            if segment is None:
                segment = _create(view, low if not written else header.base_offset, config, now_ms)
                written.append(segment)
            segment.append(data, allow_gaps=True)
            previous = header.last_offset
        if scanner.error is not None:
            raise PartitionLogError(
                Errors.CORRUPT_MESSAGE,
                f"replace segments: not whole valid batches after offset {previous}: "
                f"{scanner.error.args[0]}",
            )
    if not written:
        # Everything was cleaned away: one empty segment keeps the range.
        written.append(_create(view, low, config, now_ms))


def _create(view: SuffixedDirectory, base: int, config: LogConfig, now_ms: int) -> Segment:
    return Segment.create(
        view,
        base,
        now_ms=now_ms,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
    )


def restart_checkpoints(directory: FileDirectory, offset: int) -> None:
    """The small files of a log restarted empty at ``offset``
    (``UnifiedLog.truncateFullyAndStartAt``): the epoch checkpoint emptied
    (``leaderEpochCache.clearAndFlush``), every producer snapshot removed
    (``producerStateManager.truncateFullyAndStartAt``), the log start and
    the recovery point at ``offset``, and the cleaner's checkpoint, if there
    is one, there too (``LogCleanerManager.maybeTruncateCheckpoint`` to the
    new active segment's base). Each is written whole or left as it was, and
    doing it again changes nothing: a restart's swap once committed, opening
    the log calls this again in case a crash came part-way."""
    write_atomically(directory, CHECKPOINT_FILE_NAME, encode_checkpoint(()))
    snapshots = classify([n for n in directory.list() if n.endswith(SNAPSHOT_SUFFIX)]).snapshots
    for snapshot in snapshots:
        directory.delete(file_name(snapshot, SNAPSHOT_SUFFIX))
    if snapshots:
        directory.sync_directory()
    write_atomically(directory, LOG_START_OFFSET_FILE, encode_offset(offset))
    write_atomically(directory, RECOVERY_POINT_FILE, encode_offset(offset))
    if directory.exists(CLEANER_OFFSET_FILE):
        write_atomically(directory, CLEANER_OFFSET_FILE, encode_offset(offset))

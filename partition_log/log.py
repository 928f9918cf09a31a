"""A partition log over its segments (Kafka's ``UnifiedLog`` and ``LocalLog``).

One partition directory on the file seam holds (brokers.md §2.1):

- the segments, ``<base offset, 20 digits>.log`` with their ``.index``,
  ``.timeindex`` and ``.txnindex`` (:mod:`partition_log.segment`);
- ``<offset>.snapshot``: producer-state snapshots taken at each roll and on
  close (``UnifiedLog.roll``'s ``takeSnapshot``);
- ``leader-epoch-checkpoint``: the epoch cache, rewritten whenever it
  changes (``LeaderEpochFileCache``);
- ``recovery-point-offset-checkpoint``: the offset below which every byte
  was synced (Kafka keeps one file per log directory; kq one per partition,
  so a partition directory is self-contained);
- ``.kafka_cleanshutdown``: written on close, removed on open
  (``LogLoader``: with it nothing is rescanned).

Checkpoints and snapshots are written whole to ``<name>.tmp``, synced, and
renamed over the old file (``CheckpointFile.write``), so a power loss leaves
the old file or the new one.

Time enters only as ``now_ms`` arguments and the files only through the seam:
this module is pure (``tests/partition_log/test_purity.py``).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import itertools
import operator
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from crc32c import crc32c

import bugs
from bugs import Bug
from partition_log.batch import (
    CONTROL_FLAG,
    TIMESTAMP_TYPE_FLAG,
    BatchHeader,
    BatchScanner,
    TimestampType,
    control_batch_bytes,
    decode_records,
    recompressed,
    verify,
)
from partition_log.epoch_cache import (
    CHECKPOINT_FILE_NAME,
    LeaderEpochCache,
    decode_checkpoint,
    encode_checkpoint,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.log_files import (
    CLEAN_SHUTDOWN_FILE,
    CLEANED_SUFFIX,
    CLEANER_OFFSET_FILE,
    DELETED_SUFFIX,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    SEGMENT_SUFFIXES,
    SNAPSHOT_SUFFIX,
    SWAP_SUFFIX,
    InterruptedOperations,
    classify,
    decode_offset,
    encode_offset,
    finish_interrupted_operations,
    read_whole,
    segment_file_names,
    storage,
    write_atomically,
)
from partition_log.log_swap import check_replaced, restart_checkpoints, write_cleaned
from partition_log.producer_state import (
    NO_PRODUCER_ID,
    Duplicate,
    ProducerBatch,
    ProducerStateManager,
    decode_snapshot,
)
from partition_log.retention import (
    SegmentInfo,
    size_breached,
    start_breached,
    time_breached,
)
from partition_log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    BatchVisitor,
    RecoveryResult,
    Segment,
    file_name,
    parse_log_name,
    write_aborted_file,
)
from partition_log.txn import CompletedTxn, read_marker
from partition_log.txn_index import AbortedTxn, decode_entries, search, truncated

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "RECOVERY_POINT_FILE",
    "SNAPSHOT_SUFFIX",
    "AppendInfo",
    "AppendOrigin",
    "CleanupPolicy",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "SegmentInfo",
    "LogConfig",
    "LogRecovery",
    "PartitionLog",
]

# ListOffsets' special timestamps (ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
# Older segments kept open for reads; the rest are summaries (memory must not
# grow with the log).
_OPEN_OLD_SEGMENTS = 2
_READ_CHUNK = 1 << 20
INT32_MAX = (1 << 31) - 1
# A batch's base offset, length and partition leader epoch (DefaultRecordBatch).
_BASE_LENGTH_EPOCH = struct.Struct(">qii")
_new_tuple = tuple.__new__


class AppendOrigin(enum.Enum):
    """Who asks a leader to append (Kafka's ``AppendOrigin``): a client's
    produce, or a coordinator's write (which alone may hold control
    batches)."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did (``LogAppendInfo``): the offsets the batch has, the
    log append time (-1: the batch keeps its create times), and whether it
    was a producer's retry answered with its original offsets."""

    first_offset: int
    last_offset: int
    log_append_time: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class LogRecovery:
    """What opening the log did: ``clean`` if the shutdown marker was there
    (nothing rescanned); else the offset recovery started from, the segment
    cut and where and why, and the later segments dropped."""

    clean: bool
    recovered_from: int
    log_end_offset: int
    cut_segment: str | None = None
    cut_position: int | None = None
    truncated_bytes: int = 0
    reason: str | None = None
    dropped_segments: tuple[str, ...] = ()
    # The leftovers of an interrupted delete or swap finished or undone.
    interrupted: InterruptedOperations = InterruptedOperations()
    # The .txnindex files found missing or damaged and rebuilt from the log
    # (those of the rescanned segments are rebuilt whatever they hold).
    rebuilt_txn_indexes: tuple[str, ...] = ()


def _aborted_txn(txn: CompletedTxn) -> AbortedTxn:
    """The index entry of an aborted transaction (``LogSegment.updateTxnIndex``)."""
    return AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)


# DefaultRecordBatch field positions: the CRC covers attributes .. end.
_CRC_AT = 17
_ATTRIBUTES_AT = 21
_MAX_TIMESTAMP_AT = 35
_ATTRIBUTES = struct.Struct(">h")
_INT64 = struct.Struct(">q")
_UINT32 = struct.Struct(">I")


def _stamp_log_append_time(batch: bytearray, now_ms: int) -> None:
    """Give a ``LOG_APPEND_TIME`` batch the append time as its max timestamp
    and recompute the CRC (``DefaultRecordBatch.setMaxTimestamp`` as
    ``LogValidator`` calls it); its records then read that timestamp."""
    attributes = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)[0] | TIMESTAMP_TYPE_FLAG
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_AT, attributes)
    _INT64.pack_into(batch, _MAX_TIMESTAMP_AT, now_ms)
    _UINT32.pack_into(batch, _CRC_AT, crc32c(memoryview(batch)[_ATTRIBUTES_AT:]))


def _producer_batch(header: BatchHeader, data: bytes | None = None) -> ProducerBatch:
    """What the producer state reads of a batch; ``data``, the batch's
    bytes, is needed for a control batch of a producer (its transaction
    marker: :func:`partition_log.txn.read_marker`, which refuses a malformed
    one by name)."""
    marker = None
    if header.attributes & CONTROL_FLAG and header.producer_id != NO_PRODUCER_ID:
        if data is None:
            raise ValueError(f"control batch at offset {header.base_offset}: no bytes to read")
        marker = read_marker(data, header)
    return ProducerBatch(
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.last_offset_delta,
        header.base_offset,
        header.max_timestamp,
        header.is_transactional,
        marker,
    )


class _Replay:
    """The epoch cache and the producer state rebuilt from the batch headers
    that the open's one scan hands over in log order (Kafka's
    ``LogSegment.recover`` takes the ``ProducerStateManager`` and the
    ``LeaderEpochFileCache`` and updates both as it reads each batch).

    The cache starts from the checkpoint truncated where the rescan starts
    and takes the batches whose last offset is at least ``epoch_from``; the
    producer state starts from ``snapshot`` (whose offset is
    ``producer_from``) or, without one, from the first batch whose last
    offset reaches ``producer_from`` (the log start, which DeleteRecords may
    have put inside that batch), exactly as
    :meth:`PartitionLog._rebuild_producer_state` replays them."""

    __slots__ = (
        "cache",
        "epoch_from",
        "producer_from",
        "_from_snapshot",
        "_state",
        "_end",
        "_last_epoch",
        "snapshot_offset",
        "snapshot_checked_to",
        "aborted",
    )

    def __init__(
        self,
        cache: LeaderEpochCache,
        epoch_from: int,
        snapshot: bytes | None,
        producer_from: int,
        snapshot_checked_to: int,
    ) -> None:
        self.cache = cache
        self.epoch_from = epoch_from
        self.producer_from = producer_from
        # The snapshot started from (None: the log start), chosen among
        # those at or below snapshot_checked_to.
        self.snapshot_offset = producer_from if snapshot is not None else None
        self.snapshot_checked_to = snapshot_checked_to
        self._from_snapshot = snapshot is not None
        self._state: ProducerStateManager | None = None
        # The producer state's end offset as the batches move it (applied to
        # the state at the end: a batch without a producer id moves only it).
        self._end: int | None = None
        if snapshot is not None:
            self._state = ProducerStateManager.rebuild(snapshot, ())
            self._end = self._state.map_end_offset
        # The epoch last given to the cache: a batch of the same epoch at a
        # higher offset leaves it unchanged (LeaderEpochCache.assign), so
        # only a change of epoch is handed on.
        self._last_epoch: int | None = None
        # The transactions the replayed markers aborted (few: aborts are
        # rare), for the rescanned segments' .txnindex files.
        self.aborted: list[CompletedTxn] = []

    def visit(self, header: BatchHeader, data: bytes | None) -> None:
        last = header.last_offset
        if last >= self.epoch_from:
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch != self._last_epoch:
                self.cache = self.cache.assign(epoch, header.base_offset)
                self._last_epoch = epoch
        if last >= self.producer_from:
            end = self._end
            if end is None:
                end = min(header.base_offset, self.producer_from)
                self._state = ProducerStateManager(map_end_offset=end)
            if header.base_offset >= end:
                if header.producer_id != NO_PRODUCER_ID:
                    assert self._state is not None
                    done = self._state.update(_producer_batch(header, data))
                    if done is not None and done.aborted:
                        self.aborted.append(done)
                self._end = last + 1

    def producer_state(self, log_start_offset: int) -> ProducerStateManager:
        """The state after the last batch visited."""
        state = self._state
        if state is None:
            return ProducerStateManager(map_end_offset=self.producer_from)
        assert self._end is not None
        state.map_end_offset = self._end
        if self._from_snapshot:
            # As _rebuild_producer_state: a snapshot taken before the start
            # moved may hold producers whose batches are all gone.
            state.truncate_from_start(log_start_offset)
        return state


def _segment_batches(segment: Segment, offset: int) -> Iterator[tuple[BatchHeader, bytes | None]]:
    """The headers of ``segment``'s batches whose last offset is at least
    ``offset``, in order, read a chunk at a time, each with its bytes if it
    is a control batch (as a scan's :data:`~partition_log.segment.BatchVisitor`
    gets them)."""
    position = max(offset, segment.base_offset)
    while position < segment.next_offset:
        chunk = segment.read(position, _READ_CHUNK)
        if not chunk:
            break
        for batch in BatchScanner(chunk, check_crc=False):
            header = batch.header
            if header.last_offset >= offset:
                yield header, control_batch_bytes(chunk, batch.position, header)
            position = header.next_offset


_base_offset = operator.attrgetter("base_offset")


def _read_offset_file(directory: FileDirectory, name: str) -> int | None:
    if not directory.exists(name):
        return None
    return decode_offset(name, read_whole(directory, name))


class PartitionLog:
    """One partition replica's log: segments in base-offset order, the log
    start and end offsets, the high watermark, the recovery point, the
    leader-epoch cache and the producer state. Open it with :meth:`open`."""

    def __init__(
        self,
        directory: FileDirectory,
        config: LogConfig,
        now_ms: int,
    ) -> None:
        self.directory = directory
        self.config = config
        self._now_ms = now_ms
        self._old: list[SegmentInfo] = []
        self._open_old: OrderedDict[int, Segment] = OrderedDict()
        self._active: Segment
        self._log_start_offset = 0
        self._cleaner_offset: int | None = None
        self.high_watermark = 0
        self.recovery_point = 0
        self.epoch_cache = LeaderEpochCache()
        self.producer_state = ProducerStateManager()
        self._last_flush_ms = now_ms
        # Files renamed .deleted, removed when their time comes
        # (file.delete.delay.ms): (due time, names), in due order.
        self._pending_removal: list[tuple[int, tuple[str, ...]]] = []
        self.recovery: LogRecovery
        self._closed = False
        # Whether ``config`` compacts, for the config it was derived from.
        self._compacts = (config, config.compacts)

    # -- state ----------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset a read may ask for: at or above the first
        segment's base (DeleteRecords may put it inside a segment), at most
        the log end (``UnifiedLog.logStartOffset``)."""
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._active.next_offset

    @property
    def last_stable_offset(self) -> int:
        """The offset below which every transaction is decided and its marker
        replicated (``UnifiedLog.lastStableOffset``): the first offset of the
        lowest transaction still open, or ended by a marker the high
        watermark has not passed, if that is below the high watermark (and
        not below the log start, ``maybeIncrementFirstUnstableOffset``);
        else the high watermark.  ``read_committed`` readers read below it.
        Reading it changes nothing: the completed transactions the high
        watermark passed are forgotten where the high watermark moves or the
        state is rebuilt (:meth:`_set_producer_state`)."""
        high_watermark = self.high_watermark
        first = self.producer_state.first_unstable_offset()
        if first is None or first >= high_watermark:
            return high_watermark
        if bugs.on(Bug.LSO_PAST_OPEN_TXN):
            # B23: the open transactions are not waited for.
            return high_watermark
        return max(first, self.log_start_offset)

    @property
    def segment_base_offsets(self) -> list[int]:
        return [s.base_offset for s in self._old] + [self._active.base_offset]

    @property
    def segments(self) -> list[SegmentInfo]:
        """Every segment's summary, the active one last."""
        return [*self._old, SegmentInfo.of(self._active)]

    @property
    def size(self) -> int:
        """The bytes of all segments (``UnifiedLog.size``)."""
        return sum(s.size for s in self._old) + self._active.size

    @property
    def pending_deletions(self) -> list[str]:
        """The ``.deleted`` files waiting for ``file.delete.delay.ms``."""
        return [name for _, names in self._pending_removal for name in names]

    def _live(self) -> None:
        if self._closed:
            raise storage("the partition log is closed")

    # -- small files ----------------------------------------------------------

    def _write_atomically(self, name: str, data: bytes) -> None:
        write_atomically(self.directory, name, data)

    def _read_whole(self, name: str) -> bytes:
        return read_whole(self.directory, name)

    def _write_recovery_point(self, offset: int) -> None:
        self._write_atomically(RECOVERY_POINT_FILE, encode_offset(offset))

    def _set_epoch_cache(self, cache: LeaderEpochCache) -> None:
        """Write the checkpoint, then swap the cache in (so a failed write
        leaves the old one)."""
        if cache != self.epoch_cache:
            self._write_atomically(CHECKPOINT_FILE_NAME, encode_checkpoint(cache.entries))
            self.epoch_cache = cache

    def _set_producer_state(self, state: ProducerStateManager) -> None:
        """Swap in a rebuilt producer state.  Replaying batches (an open, a
        truncation) records every marker it passes as not yet replicated:
        the high watermark says which are (``UnifiedLog`` calls
        ``updateHighWatermark`` after ``loadProducerState`` for this)."""
        state.on_high_watermark(self.high_watermark)
        self.producer_state = state

    def _take_snapshot(self) -> None:
        state = self.producer_state
        self._write_atomically(file_name(state.map_end_offset, SNAPSHOT_SUFFIX), state.snapshot())

    def _snapshot_offsets(self) -> list[int]:
        return classify([n for n in self.directory.list() if n.endswith(SNAPSHOT_SUFFIX)]).snapshots

    # -- opening --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: FileDirectory,
        config: LogConfig,
        *,
        now_ms: int,
        high_watermark: int = 0,
    ) -> PartitionLog:
        """Open (or start) the log in ``directory``.

        A file that is not part of a log refuses the open naming it, before
        anything is changed. Then the leftovers of an interrupted delete or
        segment swap are finished or undone (:func:`finish_interrupted_operations`,
        Kafka's ``LogLoader`` does this first too). With the clean-shutdown
        marker the segments are opened as they are; without it every segment
        from the one holding the recovery point is recovered (``LogLoader``):
        cut at the first bad byte, later segments dropped, the epoch cache and
        the producer state rebuilt. Damage below the recovery point refuses
        the open. The log start offset and cleaner checkpoint are read and
        clamped into the log."""
        listing = classify(directory.list())
        clean = directory.exists(CLEAN_SHUTDOWN_FILE)
        recovery_point = _read_offset_file(directory, RECOVERY_POINT_FILE) or 0
        log_start = _read_offset_file(directory, LOG_START_OFFSET_FILE)
        cleaner_offset = _read_offset_file(directory, CLEANER_OFFSET_FILE)
        interrupted = InterruptedOperations()
        changed = bool(listing.deleted or listing.cleaned or listing.swap)
        if changed:
            interrupted = finish_interrupted_operations(
                directory,
                listing,
                now_ms=now_ms,
                max_batch_bytes=config.max_batch_bytes,
                index_interval_bytes=config.index_interval_bytes,
                max_index_bytes=config.segment_index_bytes,
            )
            restarted_at = interrupted.restarted_at
            if restarted_at is not None:
                # A restart whose swap was committed: its small files
                # finished too, whichever were written before the crash.
                restart_checkpoints(directory, restarted_at)
                recovery_point = log_start = restarted_at
                if cleaner_offset is not None:
                    cleaner_offset = restarted_at
            listing = classify(directory.list())
        logs, temporary = listing.logs, listing.temporary
        log = cls(directory, config, now_ms)
        if logs:
            # A refusal (damage below the recovery point, a damaged segment
            # after a clean shutdown) comes before any other file changes.
            log._load(logs, clean, recovery_point, log_start)
        # Leftovers of interrupted writes and index files without their log
        # (LogLoader removes both; an index left where the next segment
        # goes would stop the roll).
        changed = changed or bool(logs)
        for name in directory.list():
            if name in temporary or (
                name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX))
                and name.rsplit(".", 1)[0] + LOG_SUFFIX not in logs
            ):
                directory.delete(name)
                changed = True
        if clean:
            # Removed once the log is open: a crash from here on is unclean.
            directory.delete(CLEAN_SHUTDOWN_FILE)
            changed = True
        if changed:
            # A new log's empty directory has nothing to sync: the segment
            # created below syncs it (thousands of partitions created in one
            # metadata apply paid one fsync each here for nothing).
            directory.sync_directory()
        if not logs:
            log._active = log._create_segment(0)
            if recovery_point != 0:
                # A missing recovery point reads as 0: a new log writes none
                # (an empty checkpoint needs no fsync; Kafka writes its
                # recovery-point-offset-checkpoint on its schedule, not at
                # creation).
                log._write_recovery_point(0)
            log._log_start_offset = 0
            log.recovery = LogRecovery(True, 0, 0)
        if interrupted.any:
            log.recovery = dataclasses.replace(log.recovery, interrupted=interrupted)
        if cleaner_offset is not None:
            log._cleaner_offset = min(max(cleaner_offset, log.log_start_offset), log.log_end_offset)
        log.high_watermark = min(max(high_watermark, log.log_start_offset), log.log_end_offset)
        log._set_producer_state(log.producer_state)
        return log

    def _open_segment(
        self,
        name: str,
        recover: bool,
        durable_offset: int | None = None,
        visit: BatchVisitor | None = None,
    ) -> tuple[Segment, RecoveryResult | None]:
        return Segment.open(
            self.directory,
            name,
            now_ms=self._now_ms,
            recover=recover,
            max_batch_bytes=self.config.max_batch_bytes,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            durable_offset=durable_offset,
            visit=visit,
        )

    def _create_segment(self, base_offset: int) -> Segment:
        return Segment.create(
            self.directory,
            base_offset,
            now_ms=self._now_ms,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
        )

    def _load(
        self, logs: list[str], clean: bool, recovery_point: int, log_start: int | None
    ) -> None:
        bases = [parse_log_name(name) for name in logs]
        # The segment holding the recovery point, and every later one, is
        # recovered after an unclean shutdown.
        first_recovered = len(logs)
        if not clean:
            first_recovered = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        loaded = self._read_epoch_checkpoint()
        # The log start the open will set if the log ends at or past it
        # (checked below, else the headers are read again as before).
        expected_start = max(log_start or 0, bases[0])
        replay: _Replay | None = None
        if not clean:
            replay = self._plan_replay(
                loaded,
                bases[first_recovered],
                max(bases[first_recovered], recovery_point),
                expected_start,
            )
        summaries: list[SegmentInfo] = []
        segments: list[Segment] = []
        cut: tuple[str, int, int, str | None] | None = None
        dropped: list[str] = []
        expected: int | None = None
        # The .txnindex files to rebuild: segment index -> the offset from
        # which its entries are derived again, and the entries below it kept.
        txn_targets: dict[int, tuple[int, list[AbortedTxn]]] = {}
        rebuilt: list[str] = []
        try:
            for index, name in enumerate(logs):
                if cut is not None:
                    dropped.append(name)
                    continue
                if expected is not None and bases[index] < expected:
                    # Checked before the segment is opened (and maybe cut).
                    raise PartitionLogError(
                        Errors.CORRUPT_MESSAGE,
                        f"segment {name} starts at offset {bases[index]}, inside the "
                        f"previous segment, which ends at {expected}",
                    )
                recover = index >= first_recovered
                if replay is not None and index == first_recovered:
                    # The batches the replay needs below the recovered
                    # segments (none when the epoch checkpoint and a
                    # snapshot at or past the recovery point cover them).
                    start = min(replay.epoch_from, replay.producer_from)
                    for older in segments:
                        if older.next_offset > start:
                            for header, data in _segment_batches(older, start):
                                replay.visit(header, data)
                segment, result = self._open_segment(
                    name,
                    recover,
                    recovery_point if recover else None,
                    replay.visit if recover and replay is not None else None,
                )
                expected = segment.next_offset
                if result is not None and result.truncated_bytes:
                    cut = (name, result.valid_bytes, result.truncated_bytes, result.reason)
                elif recover and index + 1 < len(logs) and bases[index + 1] > expected:
                    # A recovered segment ending short of the next one lost
                    # its tail (only a cleaned segment may end early, and
                    # those lie below the recovery point): the later,
                    # unflushed segments would leave a hole in the offsets,
                    # so they go as after a cut.
                    cut = (
                        name,
                        segment.size,
                        0,
                        f"the segment ends at offset {expected} but the next one starts at "
                        f"{bases[index + 1]}: the offsets between are missing",
                    )
                segments.append(segment)
                following = bases[index + 1] if index + 1 < len(logs) else None
                self._plan_txn_index(
                    segment,
                    len(segments) - 1,
                    following if cut is None else None,
                    replay.producer_from if recover and replay is not None else None,
                    recover,
                    txn_targets,
                    rebuilt,
                )
            # All but the last are summaries.
            for segment in segments[:-1]:
                summaries.append(SegmentInfo.of(segment))
                segment.close()
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        self._old = summaries
        self._active = segments[-1]
        for name in dropped:
            base = parse_log_name(name)
            for suffix in SEGMENT_SUFFIXES:
                if self.directory.exists(file_name(base, suffix)):
                    self.directory.delete(file_name(base, suffix))
        if dropped:
            self.directory.sync_directory()
        end = self.log_end_offset
        # LogLoader: max(checkpoint, first segment base), and never past the
        # end (a recovery may have cut below a start DeleteRecords set).
        self._log_start_offset = min(expected_start, end)
        start_of_recovery = bases[first_recovered] if first_recovered < len(bases) else end
        if not clean:
            # The cut and the rebuilt indexes are made durable before the
            # recovery point moves past them.
            self._active.flush()
        if replay is not None and expected_start > end:
            # The log start came down to the end: replayed from the wrong
            # start, so both are derived again (rare: a recovery cut below
            # a start DeleteRecords had set).
            replay = None
        # The epoch cache: the checkpoint for the part not rescanned, the
        # batches for the rest (LogLoader via LogSegment.recover).
        if replay is not None:
            cache = replay.cache
        else:
            cache = loaded if loaded is not None else LeaderEpochCache()
            rescan_from = start_of_recovery if loaded is not None else self.log_start_offset
            cache = cache.truncate_from_end(rescan_from)
            for header in self._headers_from(rescan_from):
                if header.partition_leader_epoch >= 0:
                    cache = cache.assign(header.partition_leader_epoch, header.base_offset)
        cache = cache.truncate_from_end(end)
        cache = cache.truncate_from_start(self.log_start_offset)
        if cache != loaded:
            self._write_atomically(CHECKPOINT_FILE_NAME, encode_checkpoint(cache.entries))
        self.epoch_cache = cache
        # Snapshots past the end were taken of batches that are gone.
        snapshots = self._snapshot_offsets()
        for offset in snapshots:
            if offset > end:
                self.directory.delete(file_name(offset, SNAPSHOT_SUFFIX))
        self.directory.sync_directory()
        if replay is not None:
            # _rebuild_producer_state starts from the latest readable
            # snapshot at or below the end: the replay's must be at or below
            # it, and no readable one past the recovery point (a recovery
            # point lowered by a truncation that crashed before removing
            # its snapshots) may lie between.
            checked = replay.snapshot_checked_to
            if (replay.snapshot_offset is not None and replay.snapshot_offset > end) or any(
                checked < o <= end and self._readable_snapshot(o) is not None for o in snapshots
            ):
                replay = None
        if replay is not None:
            self.producer_state = replay.producer_state(self.log_start_offset)
        else:
            self.producer_state = self._rebuild_producer_state(end)
        self._rebuild_txn_indexes(txn_targets, replay)
        self.recovery_point = end
        if not clean:
            self._write_recovery_point(end)
        self.recovery = LogRecovery(
            clean,
            start_of_recovery if not clean else end,
            end,
            cut[0] if cut else None,
            cut[1] if cut else None,
            cut[2] if cut else 0,
            cut[3] if cut else None,
            tuple(dropped),
            rebuilt_txn_indexes=tuple(rebuilt),
        )

    # -- the aborted-transaction indexes at open --------------------------------

    @staticmethod
    def _plan_txn_index(
        segment: Segment,
        index: int,
        following: int | None,
        replay_from: int | None,
        recovered: bool,
        targets: dict[int, tuple[int, list[AbortedTxn]]],
        rebuilt: list[str],
    ) -> None:
        """Decide whether the open rebuilds ``segment``'s ``.txnindex``
        (``LogLoader``; the index is never trusted over the log).  A
        rescanned segment's entries are derived again from where the
        producer replay starts (``replay_from``, the snapshot it starts
        from; Kafka's ``LogSegment.recover`` resets the index and re-adds
        the markers it reads): those below it are kept.  Any other segment's
        file is read and checked (whole entries, in order, markers inside
        the segment: at or past its base and below the next segment's base,
        or its end if it is the last); a missing or damaged one is rebuilt
        whole.  Only the entries kept are held, until the rebuild."""
        base = segment.base_offset
        upper = segment.next_offset if following is None else following
        keep_from = base
        if recovered:
            keep_from = max(base, replay_from) if replay_from is not None else base
            if keep_from == base:
                targets[index] = (base, [])
                return
        try:
            entries = list(segment.aborted_transactions())
            beyond = [txn for txn in entries if txn.last_offset >= upper]
            if beyond:
                raise PartitionLogError(
                    Errors.KAFKA_STORAGE_ERROR,
                    f"{segment.txn_index_name}: last offset {beyond[0].last_offset} is past "
                    f"the segment's offsets [{base}, {upper})",
                )
        except PartitionLogError:
            rebuilt.append(segment.txn_index_name)
            targets[index] = (base, [])
            return
        if recovered:
            targets[index] = (keep_from, truncated(entries, keep_from))

    def _rebuild_txn_indexes(
        self, targets: dict[int, tuple[int, list[AbortedTxn]]], replay: _Replay | None
    ) -> None:
        """Write the ``.txnindex`` files :meth:`_plan_txn_index` chose: the
        entries kept, then the transactions aborted by the markers from the
        offset each is derived from, found by the open's replay if it
        started at or below that offset, else by one more replay of the
        producer state from the latest snapshot at or below the lowest
        such offset (:meth:`_aborted_from`).  Each file is synced."""
        if not targets:
            return
        bases = self.segment_base_offsets
        end = self.log_end_offset
        covered_from = replay.producer_from if replay is not None else None
        found: list[CompletedTxn] = []
        if replay is not None:
            found.extend(replay.aborted)
        lowest = min(
            (
                keep_from
                for keep_from, _ in targets.values()
                if covered_from is None or keep_from < covered_from
            ),
            default=None,
        )
        if lowest is not None:
            highest = max(bases[index + 1] if index + 1 < len(bases) else end for index in targets)
            found = self._aborted_from(lowest, highest)
        for index, (keep_from, kept) in sorted(targets.items()):
            upper = bases[index + 1] if index + 1 < len(bases) else end
            entries = truncated(kept, upper) + [
                _aborted_txn(txn) for txn in found if keep_from <= txn.last_offset < upper
            ]
            if index == len(self._old):
                self._active.rewrite_aborted(entries)
                self._active.flush()
            else:
                write_aborted_file(self.directory, bases[index], entries)

    def _aborted_from(self, offset: int, until: int) -> list[CompletedTxn]:
        """The transactions that the markers at or past ``offset`` and below
        ``until`` abort, by a replay of the producer state from the latest
        readable snapshot at or below ``offset`` (else the log start) as
        :meth:`_rebuild_producer_state` replays it."""
        state: ProducerStateManager | None = None
        for snapshot in reversed(self._snapshot_offsets()):
            if snapshot > offset:
                continue
            data = self._readable_snapshot(snapshot)
            if data is None:
                continue
            if snapshot >= self.log_start_offset:
                state = ProducerStateManager.rebuild(data, ())
                state.truncate_from_start(self.log_start_offset)
            break
        start = self.log_start_offset if state is None else state.map_end_offset
        found: list[CompletedTxn] = []
        for header, data in self._batches_from(start):
            if header.base_offset >= until:
                break
            if state is None:
                state = ProducerStateManager(map_end_offset=min(header.base_offset, start))
            if header.base_offset < state.map_end_offset:
                continue
            if header.producer_id == NO_PRODUCER_ID:
                state.map_end_offset = header.next_offset
                continue
            done = state.update(_producer_batch(header, data))
            if done is not None and done.aborted and done.last_offset >= offset:
                found.append(done)
        return found

    def _read_epoch_checkpoint(self) -> LeaderEpochCache | None:
        """The epoch cache's checkpoint, ``None`` if missing or unreadable
        (then derived from the batches)."""
        if not self.directory.exists(CHECKPOINT_FILE_NAME):
            return None
        try:
            return LeaderEpochCache.from_entries(
                decode_checkpoint(self._read_whole(CHECKPOINT_FILE_NAME))
            )
        except (PartitionLogError, ValueError):
            return None

    def _readable_snapshot(self, offset: int) -> bytes | None:
        try:
            data = self._read_whole(file_name(offset, SNAPSHOT_SUFFIX))
            decode_snapshot(data)
        except PartitionLogError:
            return None
        return data

    def _plan_replay(
        self,
        loaded: LeaderEpochCache | None,
        start_of_recovery: int,
        checked_to: int,
        log_start: int,
    ) -> _Replay:
        """What the open's one scan rebuilds, decided before it: the epoch
        cache from the checkpoint truncated at the first recovered segment
        (or from the log start without one), and the producer state from the
        latest readable snapshot at or below ``checked_to`` (the recovery
        point, below which recovery cuts nothing) if it is not below the log
        start, else from the log start: :meth:`_rebuild_producer_state`'s
        choice whenever the log ends at or past that snapshot and no later
        readable one lies at or below the end (checked after the scan)."""
        if loaded is not None:
            cache, epoch_from = loaded.truncate_from_end(start_of_recovery), start_of_recovery
        else:
            cache, epoch_from = LeaderEpochCache(), log_start
        for offset in reversed(self._snapshot_offsets()):
            if offset > checked_to:
                continue
            data = self._readable_snapshot(offset)
            if data is None:
                continue
            if offset < log_start:
                break
            return _Replay(cache, epoch_from, data, offset, checked_to)
        return _Replay(cache, epoch_from, None, log_start, checked_to)

    def _rebuild_producer_state(self, end: int) -> ProducerStateManager:
        """The latest readable snapshot at or below ``end`` plus the batches
        after it (``UnifiedLog.rebuildProducerState``)."""
        for offset in reversed(self._snapshot_offsets()):
            if offset > end:
                continue
            try:
                data = self._read_whole(file_name(offset, SNAPSHOT_SUFFIX))
                decode_snapshot(data)
            except PartitionLogError:
                continue
            if offset < self.log_start_offset:
                break
            state = ProducerStateManager.rebuild(data, self._producer_batches_from(offset))
            # A snapshot taken before the start moved may hold producers whose
            # batches are all gone (ProducerStateManager.isProducerRetained).
            state.truncate_from_start(self.log_start_offset)
            return state
        # From the batch holding the log start (which may lie inside it, after
        # DeleteRecords), as Kafka reads from the start offset.
        start = self.log_start_offset
        batches = self._producer_batches_from(start)
        first = next(batches, None)
        if first is None:
            return ProducerStateManager.rebuild(None, (), start)
        return ProducerStateManager.rebuild(
            None, itertools.chain((first,), batches), min(first.base_offset, start)
        )

    # -- segments -------------------------------------------------------------

    def _segment_at(self, index: int) -> Segment:
        """The segment at ``index`` (the active one last), opening an older one
        on demand and keeping only a few open."""
        if index == len(self._old):
            return self._active
        base = self._old[index].base_offset
        segment = self._open_old.get(base)
        if segment is None:
            segment, _ = self._open_segment(file_name(base, LOG_SUFFIX), False)
            self._open_old[base] = segment
            while len(self._open_old) > _OPEN_OLD_SEGMENTS:
                _, evicted = self._open_old.popitem(last=False)
                evicted.close()
        else:
            self._open_old.move_to_end(base)
        return segment

    def _index_of(self, offset: int) -> int:
        """The segment holding ``offset``: the last whose base is at most it,
        by a binary search over the summaries themselves (a read builds
        nothing that grows with the number of segments)."""
        if offset >= self._active.base_offset:
            return len(self._old)
        return max(0, bisect.bisect_right(self._old, offset, key=_base_offset) - 1)

    def _headers_from(self, offset: int) -> Iterator[BatchHeader]:
        """The headers of the batches whose last offset is at least
        ``offset``, in order, read a chunk at a time."""
        for header, _ in self._batches_from(offset):
            yield header

    def _producer_batches_from(self, offset: int) -> Iterator[ProducerBatch]:
        """What the producer state reads of the batches whose last offset is
        at least ``offset``, in order."""
        for header, data in self._batches_from(offset):
            yield _producer_batch(header, data)

    def _batches_from(self, offset: int) -> Iterator[tuple[BatchHeader, bytes | None]]:
        """:func:`_segment_batches` over every segment from the one holding
        ``offset``."""
        count = len(self._old) + 1
        index = self._index_of(offset)
        while index < count:
            yield from _segment_batches(self._segment_at(index), offset)
            index += 1

    def _roll(self, now_ms: int) -> None:
        """A new active segment at the log end (``UnifiedLog.roll``): the old
        one is synced first, so only the active segment can hold unsynced
        bytes; a producer snapshot is taken at the new base."""
        old = self._active
        end = old.next_offset
        old.flush()
        self._now_ms = now_ms
        new = self._create_segment(end)
        self._old.append(SegmentInfo.of(old))
        old.close()
        self._active = new
        self._take_snapshot()
        self.recovery_point = end
        self._last_flush_ms = now_ms
        self._write_recovery_point(end)

    def _maybe_roll(self, size: int, last_offset: int, now_ms: int) -> None:
        config = self.config
        if self._active.size > 0 and self._active.should_roll(
            config.segment_bytes,
            size,
            now_ms,
            config.segment_ms,
            config.segment_jitter_ms,
            incoming_last_offset=last_offset,
        ):
            self._roll(now_ms)

    # -- appends --------------------------------------------------------------

    def _check_size(self, size: int, where: str) -> None:
        if size > self.config.max_batch_bytes:
            raise PartitionLogError(
                Errors.MESSAGE_TOO_LARGE,
                f"{where}: {size} bytes, more than max_batch_bytes {self.config.max_batch_bytes}",
            )

    def _flush_due(self, new_end: int, now_ms: int) -> bool:
        config = self.config
        if config.flush_messages is not None and new_end - self.recovery_point >= (
            config.flush_messages
        ):
            return True
        return config.flush_ms is not None and now_ms - self._last_flush_ms >= config.flush_ms

    def _after_append(
        self, headers: list[BatchHeader], now_ms: int, batches: list[ProducerBatch]
    ) -> None:
        """The bookkeeping after ``headers``' batches reached the OS;
        ``batches`` is what the producer state reads of each, built already
        for the checks before the append."""
        cache = self.epoch_cache
        for header in headers:
            epoch = header.partition_leader_epoch
            if epoch >= 0:
                # assign's own "nothing to change" test (isUpdateNeeded),
                # without building the entry it would drop: one epoch a batch.
                latest = cache.latest_entry
                if (
                    latest is None
                    or latest.epoch != epoch
                    or header.base_offset < latest.start_offset
                ):
                    cache = cache.assign(epoch, header.base_offset)
        if cache is not self.epoch_cache:
            self._set_epoch_cache(cache)
        state = self.producer_state
        for header, batch in zip(headers, batches, strict=True):
            if header.producer_id == NO_PRODUCER_ID:
                # All that ProducerStateManager.update does for a batch
                # without a producer: its end moves past the batch.
                state.map_end_offset = header.next_offset
            else:
                done = state.update(batch)
                if done is not None and done.aborted:
                    # Every batch of the append went to the active segment.
                    self._active.append_aborted(_aborted_txn(done))
        new_end = headers[-1].next_offset
        if self._flush_due(new_end, now_ms):
            # flush.messages=1 syncs before the end moves (brokers.md §2.4).
            self._active.flush()
            self.recovery_point = new_end
            self._last_flush_ms = now_ms

    def append_as_leader(
        self,
        batch_bytes: bytes,
        leader_epoch: int,
        now_ms: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        marker_bumps_epoch: bool = False,
    ) -> AppendInfo:
        """Append one producer batch as the leader (``UnifiedLog.appendAsLeader``):
        verified (CRC, fields, records), checked against the producer state (a
        retry gets its original offsets and appends nothing), given the next
        offsets and ``leader_epoch``, then written. A refusal changes nothing.
        Only a transaction coordinator writes control batches (``origin``
        ``COORDINATOR``: its markers); a client's is ``INVALID_RECORD``, as in
        Kafka's ``LogValidator``.  ``marker_bumps_epoch``: the batch is a
        transaction version 2 marker (:meth:`ProducerStateManager.check`).

        Speed: this runs once a produced batch, so the checks and bookkeeping
        of :meth:`_after_append` and :meth:`_maybe_roll` are done inline for
        the one batch, with attributes read once into locals."""
        if self._closed:
            self._live()
        config = self.config
        if len(batch_bytes) > config.max_batch_bytes:
            self._check_size(len(batch_bytes), "batch")
        header = verify(batch_bytes)
        marker = None
        if header.attributes & CONTROL_FLAG:
            if origin is not AppendOrigin.COORDINATOR:
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    "clients may not write control batches (a transaction's markers are "
                    "its coordinator's)",
                )
            marker = read_marker(batch_bytes, header)
        target = config.compression
        if (
            target is not None
            and header.compression is not target
            and not header.attributes & CONTROL_FLAG
        ):
            # Its records were verified above; only the codec bits, the
            # length and the CRC change.
            batch_bytes = recompressed(batch_bytes, target)
            self._check_size(len(batch_bytes), f"batch recompressed as {target.name}")
            header = BatchHeader.parse(batch_bytes)
        compacts = self._compacts
        if compacts[0] is not config:
            # Derived once per config (a broker may replace the config).
            compacts = self._compacts = (config, config.compacts)
        if compacts[1] and not header.attributes & CONTROL_FLAG:
            # A compacted log keeps the last record per key: a record without
            # one could never be cleaned (LogValidator.validateKey).
            for record in decode_records(batch_bytes):
                if record.key is None:
                    raise PartitionLogError(
                        Errors.INVALID_RECORD,
                        "Compacted topic cannot accept message without key: the record "
                        f"at offset delta {record.offset - header.base_offset} has none "
                        f"(cleanup_policy {config.cleanup_policy})",
                    )
        active = self._active
        end = active.next_offset
        incoming = None
        if header.producer_id != NO_PRODUCER_ID:
            # Only an idempotent producer's batch has state to check (the
            # check answers APPEND to the others, ProducerStateManager.check).
            try:
                incoming = ProducerBatch(
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.last_offset_delta,
                    end,
                    header.max_timestamp,
                    header.is_transactional,
                    marker,
                )
            except ValueError as error:
                raise PartitionLogError(Errors.INVALID_RECORD, f"batch: {error}") from None
            answer = self.producer_state.check(
                incoming,
                client=origin is AppendOrigin.CLIENT,
                marker_bumps_epoch=marker_bumps_epoch,
            )
            if isinstance(answer, Duplicate):
                return AppendInfo(answer.first_offset, answer.last_offset, -1, duplicate=True)
        cache = self.epoch_cache
        latest = cache.entries[-1] if cache.entries else None
        if leader_epoch < 0 or (latest is not None and leader_epoch < latest.epoch):
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"leader epoch {leader_epoch} is negative or older than the log's latest "
                f"epoch {cache.latest_epoch}",
            )
        if not isinstance(leader_epoch, int) or leader_epoch > INT32_MAX:
            raise PartitionLogError(
                Errors.INVALID_RECORD, f"leader epoch {leader_epoch} does not fit an int32"
            )
        data = bytearray(batch_bytes)
        # The base offset and leader epoch in one pack (the length between
        # them written back as it is); both lie outside the CRC.
        _BASE_LENGTH_EPOCH.pack_into(data, 0, end, header.length, leader_epoch)
        log_append_time = -1
        if config.timestamp_type is TimestampType.LOG_APPEND_TIME:
            _stamp_log_append_time(data, now_ms)
            log_append_time = now_ms
            stamped = BatchHeader.parse(data)
            if incoming is not None:
                # The stamped max timestamp.
                incoming = dataclasses.replace(incoming, max_timestamp=now_ms)
        else:
            # The verified header with the two fields stamped: the same tuple
            # BatchHeader.parse of the stamped bytes gives, built in C.
            stamped = _new_tuple(BatchHeader, (end, header[1], leader_epoch, *header[3:]))
        last_offset = end + header.last_offset_delta
        size = len(data)
        # The roll test's common case first (Segment.should_roll): the
        # segment has room, an entry left in each index and is young.
        used = active.size
        if used > 0 and (
            used > config.segment_bytes - size
            or active.offsets.is_full
            or active.times.is_full
            or last_offset - active.base_offset > INT32_MAX
            or now_ms - active.rolling_since_ms > config.segment_ms - config.segment_jitter_ms
        ):
            self._maybe_roll(size, last_offset, now_ms)
            active = self._active
        # One verified batch: the segment takes its header instead of
        # scanning the bytes again, and the producer state the batch built
        # for its check (the same fields as the stamped header's).
        active.append_batch(data, stamped)
        # _after_append for one batch of epoch leader_epoch starting at end.
        if latest is None or latest.epoch != leader_epoch or end < latest.start_offset:
            self._set_epoch_cache(cache.assign(leader_epoch, end))
        new_end = last_offset + 1
        if incoming is None:
            # All that ProducerStateManager.update does for a batch without
            # a producer: its end moves past the batch.
            self.producer_state.map_end_offset = new_end
        else:
            done = self.producer_state.update(incoming)
            if done is not None and done.aborted:
                active.append_aborted(_aborted_txn(done))
        flush_messages = config.flush_messages
        if (flush_messages is not None and new_end - self.recovery_point >= flush_messages) or (
            config.flush_ms is not None and now_ms - self._last_flush_ms >= config.flush_ms
        ):
            # flush.messages=1 syncs before the end moves (brokers.md §2.4).
            active.flush()
            self.recovery_point = new_end
            self._last_flush_ms = now_ms
        return AppendInfo(end, last_offset, log_append_time)

    def append_as_follower(self, batch_bytes: bytes, now_ms: int = 0) -> AppendInfo:
        """Append the leader's batches as they are (``UnifiedLog.appendAsFollower``):
        each whole, with a valid CRC, the first at or past the log end and
        each past the previous. A refusal names the offsets and changes
        nothing.

        Past, not only at: a compacted leader's log has gaps where the
        cleaner removed whole batches, so the batch after a follower's log
        end may start later (Kafka refuses only a first offset below the log
        end: ``UnexpectedAppendOffsetException``)."""
        self._live()
        scanner = BatchScanner(batch_bytes, max_batch_bytes=self.config.max_batch_bytes)
        scanned = list(scanner)
        headers = [batch.header for batch in scanned]
        if scanner.error is not None or not headers:
            raise PartitionLogError(
                Errors.CORRUPT_MESSAGE,
                "follower append: not whole valid batches: "
                + (str(scanner.error.args[0]) if scanner.error else "no batch"),
            )
        expected = self.log_end_offset
        batches = []
        for at, header in scanned:
            if header.base_offset < expected:
                raise PartitionLogError(
                    Errors.OFFSET_OUT_OF_RANGE,
                    f"follower append: batch at base offset {header.base_offset}, below "
                    + (
                        f"the log end offset {expected}"
                        if header is headers[0]
                        else f"the end {expected} of the previous batch"
                    ),
                )
            expected = header.next_offset
            try:
                batches.append(
                    _producer_batch(header, control_batch_bytes(batch_bytes, at, header))
                )
            except ValueError as error:
                # Checked before the append: the producer state could not
                # record the batch afterwards.
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    f"follower append: batch at base offset {header.base_offset}: {error}",
                ) from None
        self._maybe_roll(len(batch_bytes), headers[-1].last_offset, now_ms)
        self._active.append(batch_bytes, allow_gaps=True)
        self._after_append(headers, now_ms, batches)
        return AppendInfo(headers[0].base_offset, headers[-1].last_offset, -1)

    def maybe_assign_epoch_start_offset(self, leader_epoch: int) -> bool:
        """A new leader records ``(leader_epoch, log end offset)`` in the epoch
        cache before it accepts anything (``Partition.makeLeader`` calling
        ``maybeAssignEpochStartOffset``; KIP-279: after fast failovers a
        follower may hold batches of a later epoch than any in the new
        leader's log, and must find where this epoch starts). Whether the
        cache changed; an epoch older than the latest is refused."""
        self._live()
        if leader_epoch < max(self.epoch_cache.latest_epoch, 0):
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"leader epoch {leader_epoch} is negative or older than the log's latest "
                f"epoch {self.epoch_cache.latest_epoch}",
            )
        cache = self.epoch_cache.assign(leader_epoch, self.log_end_offset)
        if cache == self.epoch_cache:
            return False
        self._set_epoch_cache(cache)
        return True

    def maybe_flush(self, now_ms: int) -> bool:
        """Sync by ``flush.ms`` when no append came (the log flusher's tick)."""
        self._live()
        if self.log_end_offset > self.recovery_point and self._flush_due(
            self.log_end_offset, now_ms
        ):
            self.flush(now_ms)
            return True
        return False

    def flush(self, now_ms: int) -> None:
        """Sync everything appended; the recovery point moves to the end."""
        self._live()
        self._active.flush()
        self.recovery_point = self.log_end_offset
        self._last_flush_ms = now_ms

    def maybe_increment_high_watermark(self, offset: int) -> bool:
        """Raise the high watermark to ``offset`` (never above the log end,
        ``UnifiedLog.maybeIncrementHighWatermark``); whether it moved."""
        if offset > self.log_end_offset:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"high watermark {offset} above the log end offset {self.log_end_offset}",
            )
        if offset <= self.high_watermark:
            return False
        self.high_watermark = offset
        self.producer_state.on_high_watermark(offset)
        return True

    # -- reads ----------------------------------------------------------------

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one holding ``start_offset``: as many as fit
        in ``max_bytes`` but at least one, from one segment (the next one if
        the first has nothing past ``start_offset``), never a batch reaching
        ``max_offset`` (the high watermark for consumers) or the log end."""
        self._live()
        start, end = self.log_start_offset, self.log_end_offset
        if not start <= start_offset <= end:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"offset {start_offset} is outside the log's range [{start}, {end}]",
            )
        limit = end if max_offset is None else min(max_offset, end)
        if start_offset >= limit:
            return b""
        index = self._index_of(start_offset)
        while index <= len(self._old):
            segment = self._segment_at(index)
            if start_offset < segment.next_offset:
                # The segment stops before the first batch reaching the limit.
                data = segment.read(max(start_offset, segment.base_offset), max_bytes, limit)
                if data or segment.next_offset >= limit:
                    return data
            index += 1
        return b""

    def collect_aborted_transactions(
        self, start_offset: int, upper_bound_offset: int
    ) -> list[AbortedTxn]:
        """Every aborted transaction that overlaps ``[start_offset,
        upper_bound_offset)``: its abort marker at or past ``start_offset``
        and its first offset below ``upper_bound_offset``, in marker order
        (``UnifiedLog.collectAbortedTransactions``).  A ``read_committed``
        fetch from ``start_offset`` returns them with its batches (read up
        to the last stable offset; ``upper_bound_offset`` is the offset
        after the last batch it returns), and the consumer drops the records
        of those producers' aborted transactions
        (:func:`partition_log.read_committed.read_committed_batches`).

        The ``.txnindex`` files are searched from the segment holding
        ``start_offset`` onwards, each read when reached, until one says no
        later transaction can overlap (:func:`partition_log.txn_index.search`)."""
        self._live()
        found: list[AbortedTxn] = []
        count = len(self._old) + 1
        index = self._index_of(start_offset)
        while index < count:
            result = search(self._aborted_of(index), start_offset, upper_bound_offset)
            found.extend(result.aborted)
            if result.complete:
                break
            index += 1
        return found

    def _aborted_of(self, index: int) -> Sequence[AbortedTxn]:
        """The aborted-transaction index of the segment at ``index``: the
        entries an open segment holds, else read from its file (an older
        segment's entries are never kept: memory must not grow with the
        log)."""
        if index == len(self._old):
            return self._active.aborted_transactions()
        base = self._old[index].base_offset
        segment = self._open_old.get(base)
        if segment is not None:
            return segment.aborted_transactions()
        name = file_name(base, TXN_INDEX_SUFFIX)
        return decode_entries(self._read_whole(name), name)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets for one partition (``UnifiedLog.fetchOffsetByTimestamp``):
        the offset and timestamp of the first record at or past the log start
        whose timestamp is at least ``timestamp``, or ``None`` if there is
        none; ``EARLIEST_TIMESTAMP`` (-2) gives the log start and
        ``LATEST_TIMESTAMP`` (-1) the log end, each with timestamp -1. The
        segments are skipped by their largest timestamp and the one that may
        hold it searched from its time index."""
        self._live()
        if timestamp == EARLIEST_TIMESTAMP:
            return (self.log_start_offset, -1)
        if timestamp == LATEST_TIMESTAMP:
            return (self.log_end_offset, -1)
        if timestamp < 0:
            raise ValueError(
                f"timestamp {timestamp} is neither a time nor EARLIEST_TIMESTAMP (-2) or "
                "LATEST_TIMESTAMP (-1)"
            )
        start = self.log_start_offset
        # From the segment holding the log start: those below it are skipped
        # without a look at their summaries.
        first = self._index_of(start)
        for index in range(first, len(self._old) + 1):
            info = self._old[index] if index < len(self._old) else SegmentInfo.of(self._active)
            if info.next_offset <= start or info.max_timestamp < timestamp:
                continue
            segment = self._segment_at(index)
            found = segment.find_offset_for_timestamp(timestamp)
            if found is None:
                continue
            # The first record that late, and not below the log start (which
            # DeleteRecords may have put inside this segment).
            position = max(found, start)
            while position < segment.next_offset:
                chunk = segment.read(position, _READ_CHUNK)
                if not chunk:
                    break
                for batch in BatchScanner(chunk, check_crc=False):
                    header = batch.header
                    if header.max_timestamp >= timestamp and header.last_offset >= position:
                        for record in decode_records(chunk[batch.position : batch.end]):
                            if record.offset >= position and record.timestamp >= timestamp:
                                return (record.offset, record.timestamp)
                    position = max(position, header.next_offset)
        return None

    # -- truncation -----------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or past ``offset`` (a follower after
        divergence, ``UnifiedLog.truncateTo``): later segments whole, the one
        holding it cut at its batch boundary, the epoch cache truncated from
        the new end (even when nothing is removed: a new leader's entry may
        have no batch), the producer state rebuilt from a snapshot plus the
        batches kept, the high watermark and recovery point clamped. Returns
        the new log end offset."""
        self._live()
        if offset < self.log_start_offset:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"truncation offset {offset} is below the log start offset {self.log_start_offset}",
            )
        if offset >= self.log_end_offset:
            self._set_epoch_cache(self.epoch_cache.truncate_from_end(self.log_end_offset))
            return self.log_end_offset
        # The recovery point first: a crash part-way recovers from below.
        index = self._index_of(offset)
        bases = self.segment_base_offsets
        self._write_recovery_point(min(self.recovery_point, bases[index]))
        self.recovery_point = min(self.recovery_point, bases[index])
        # The cleaner's checkpoint down to the segment that will be active
        # (LogManager.truncateTo via maybeTruncateCheckpoint): left above the
        # new end, batches appended after the truncation would count as
        # already clean, a later tombstone's key would never be mapped, and
        # the older value would come back once the tombstone expires.
        first_kept = max(bases[index], self.log_start_offset)
        if self._cleaner_offset is not None and self._cleaner_offset > first_kept:
            self.set_cleaner_offset(first_kept)
        for open_segment in self._open_old.values():
            open_segment.close()
        self._open_old.clear()
        if index < len(self._old):
            self._active.close()
            for base in bases[index + 1 :]:
                self._delete_segment_files(base)
            keep = self._old[index]
            self._old = self._old[:index]
            self._active, _ = self._open_segment(file_name(keep.base_offset, LOG_SUFFIX), False)
            self.directory.sync_directory()
        self._active.truncate_to(offset)
        self._active.flush()
        end = self.log_end_offset
        for snapshot in self._snapshot_offsets():
            if snapshot > end:
                self.directory.delete(file_name(snapshot, SNAPSHOT_SUFFIX))
        self.directory.sync_directory()
        if end < self._log_start_offset:
            # The batch holding the start went whole (UnifiedLog.truncateTo
            # lowers the start to the truncation point).
            self._set_log_start_offset(end)
        self._set_epoch_cache(self.epoch_cache.truncate_from_end(end))
        self.high_watermark = min(self.high_watermark, end)
        self._set_producer_state(self._rebuild_producer_state(end))
        # Everything kept is synced: the cut segment just now, older ones at
        # their roll.
        self.recovery_point = end
        return end

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Empty the log and restart it at ``offset``, at or past its end
        (``UnifiedLog.truncateFullyAndStartAt``: a follower whose leader's
        log starts past its whole log, which it can then fetch from there;
        a truncation inside the log is :meth:`truncate_to`'s job and an
        offset below the log end is refused, unless the log holds no bytes: a
        follower restarted at a leader's log start that lies inside a batch
        is served that whole batch and restarts again at its first offset,
        ``Partition.appendRecordsToFollowerOrFutureReplica``). Every segment is replaced by
        one empty segment at ``offset``; the epoch cache is cleared, the
        producer state emptied and its snapshots removed, and the log start,
        recovery point and high watermark are ``offset``, the new log end.

        Crash-safe through the segment swap (``LocalLog.replaceSegments``):
        the empty segment is written as ``.cleaned`` and synced, renamed
        ``.swap`` (the commit: opening the log from here on finishes the
        restart, :func:`finish_interrupted_operations`), the small files
        rewritten (:func:`restart_checkpoints`), the old segments renamed
        ``.deleted`` and the ``.swap`` files live, the directory synced after
        each step. A crash leaves the old log whole or the new empty one,
        never a mix; the ``.deleted`` files go ``file.delete.delay.ms``
        later (their readers, as retention's)."""
        self._live()
        end = self.log_end_offset
        if offset < end and self.size:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"cannot restart the log at offset {offset}: it is below the log end offset "
                f"{end} (a truncation inside the log is truncate_to's job)",
            )
        self._now_ms = max(self._now_ms, now_ms)
        bases = self.segment_base_offsets
        write_cleaned(self.directory, (), offset, offset + 1, self.config, now_ms)
        new_files = segment_file_names(offset)
        for name in new_files:
            self.directory.rename(name + CLEANED_SUFFIX, name + SWAP_SUFFIX)
        self.directory.sync_directory()
        try:
            restart_checkpoints(self.directory, offset)
            for open_segment in self._open_old.values():
                open_segment.close()
            self._open_old.clear()
            self._active.close()
            names: list[str] = []
            for base in bases:
                names.extend(self._rename_deleted(segment_file_names(base)))
            self.directory.sync_directory()
            for name in new_files:
                self.directory.rename(name + SWAP_SUFFIX, name)
            self.directory.sync_directory()
            self._active, _ = self._open_segment(file_name(offset, LOG_SUFFIX), False)
        except BaseException:
            # Committed on disk but not in memory: the log serves nothing
            # more until it is opened again, which finishes the restart.
            self._closed = True
            raise
        self._old = []
        self._log_start_offset = offset
        self.recovery_point = offset
        self.high_watermark = offset
        self.epoch_cache = LeaderEpochCache()
        self.producer_state = ProducerStateManager(map_end_offset=offset)
        if self._cleaner_offset is not None:
            self._cleaner_offset = offset
        self._last_flush_ms = now_ms
        self._schedule_removal(names, now_ms)

    def _delete_segment_files(self, base: int) -> None:
        # Truncation deletes at once, not in two phases: the segments it
        # removes lie past the new end, where the next roll creates a segment
        # of the same base offset straight away, and kq's reads copy bytes
        # out under the call, so no reader is left on the files (the delay of
        # LocalLog.deleteSegmentFiles is for readers of retention's segments).
        # The recovery point was moved below them first, so a crash part-way
        # recovers from there.
        for suffix in SEGMENT_SUFFIXES:
            name = file_name(base, suffix)
            if self.directory.exists(name):
                self.directory.delete(name)

    # -- log start offset and DeleteRecords -----------------------------------

    def _set_log_start_offset(self, offset: int) -> None:
        """Checkpoint the new start first, then move it in memory."""
        self._write_atomically(LOG_START_OFFSET_FILE, encode_offset(offset))
        self._log_start_offset = offset

    def _maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Raise the log start offset (``UnifiedLog.maybeIncrementLogStartOffset``):
        checkpointed, then the epoch cache truncated from the start and the
        producers whose batches all lie below it forgotten."""
        if offset <= self._log_start_offset:
            return False
        self._set_log_start_offset(offset)
        self._set_epoch_cache(self.epoch_cache.truncate_from_start(offset))
        self.producer_state.truncate_from_start(offset)
        return True

    def delete_records(self, offset: int, now_ms: int | None = None) -> int:
        """Raise the log start offset to ``offset`` (DeleteRecords,
        ``UnifiedLog.deleteRecords``): never above the high watermark; reads
        below it are then ``OFFSET_OUT_OF_RANGE`` and the segments wholly
        below it are deleted (in two phases, their files removed
        ``file.delete.delay.ms`` after ``now_ms``, the latest time the log
        was given if none). An offset at or below the start changes nothing.
        Returns the log start offset."""
        self._live()
        if offset < 0:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE, f"delete records offset {offset} is negative"
            )
        if offset > self.high_watermark:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"cannot raise the log start offset to {offset}: it is above the high "
                f"watermark {self.high_watermark}",
            )
        if now_ms is not None:
            self._now_ms = max(self._now_ms, now_ms)
        if self._maybe_increment_log_start_offset(offset):
            self._delete_segments(self._start_breached(), self._now_ms)
        return self.log_start_offset

    # -- retention ------------------------------------------------------------

    def _start_breached(self) -> int:
        return start_breached(
            self.segments, self.high_watermark, self.log_end_offset, self.log_start_offset
        )

    def maybe_delete_segments(self, now_ms: int) -> bool:
        """Retention (``UnifiedLog.deleteOldSegments``): with ``cleanup.policy``
        including delete, the segments past ``retention.ms``, then the oldest
        while the log stays at least ``retention.bytes``; whatever the policy,
        the segments wholly below the log start offset. Never a segment
        holding an offset at or above the high watermark; the active segment
        only when every segment goes, after a roll to an empty one (Kafka's
        rule: a log keeps at least one segment). The log start offset moves
        to the first segment left (checkpointed before any file is renamed).
        Whether any segment was deleted."""
        self._live()
        self._now_ms = max(self._now_ms, now_ms)
        deleted = False
        if self.config.deletes:
            count = time_breached(
                self.segments,
                self.high_watermark,
                self.log_end_offset,
                now_ms,
                self.config.retention_ms,
            )
            deleted |= self._delete_segments(count, now_ms)
            count = size_breached(
                self.segments,
                self.high_watermark,
                self.log_end_offset,
                self.config.retention_bytes,
            )
            deleted |= self._delete_segments(count, now_ms)
        deleted |= self._delete_segments(self._start_breached(), now_ms)
        return deleted

    def _delete_segments(self, count: int, now_ms: int) -> bool:
        """Delete the ``count`` oldest segments (``UnifiedLog.deleteSegments``):
        if that is all of them, roll first; then the new start is
        checkpointed, the files renamed ``.deleted`` with the snapshots below
        the new start, the directory synced, and the segments dropped from
        the log; the files go ``file.delete.delay.ms`` later."""
        if count == 0:
            return False
        if count == len(self._old) + 1:
            self._roll(now_ms)
        bases = [segment.base_offset for segment in self._old[:count]]
        new_first = (
            self._old[count].base_offset if count < len(self._old) else self._active.base_offset
        )
        self._maybe_increment_log_start_offset(new_first)
        # Out of the log first (LocalLog.removeAndDeleteSegments): a failure
        # part-way leaves files that the next open or tick deletes, not a
        # log that reads renamed files.
        self._old = self._old[count:]
        names: list[str] = []
        for base in bases:
            if base in self._open_old:
                self._open_old.pop(base).close()
            names.extend(self._rename_deleted(segment_file_names(base)))
        for snapshot in self._snapshot_offsets():
            if snapshot < self.log_start_offset:
                names.extend(self._rename_deleted([file_name(snapshot, SNAPSHOT_SUFFIX)]))
        self.directory.sync_directory()
        self._schedule_removal(names, now_ms)
        return True

    # -- two-phase deletion ---------------------------------------------------

    def _rename_deleted(self, names: Sequence[str]) -> list[str]:
        """The first phase of a delete (``LogSegment.changeFileSuffixes``):
        each existing file renamed ``<name>.deleted``; the caller syncs the
        directory."""
        renamed: list[str] = []
        for name in names:
            if self.directory.exists(name):
                target = name + DELETED_SUFFIX
                if self.directory.exists(target):
                    self.directory.delete(target)
                self.directory.rename(name, target)
                renamed.append(target)
        return renamed

    def _schedule_removal(self, names: Sequence[str], now_ms: int) -> None:
        if names:
            due = now_ms + self.config.file_delete_delay_ms
            self._pending_removal.append((due, tuple(names)))
            self._pending_removal.sort(key=lambda pending: pending[0])
            if self.config.file_delete_delay_ms == 0:
                self.maybe_remove_deleted(now_ms)

    def maybe_remove_deleted(self, now_ms: int) -> bool:
        """The second phase (the scheduled ``deleteSegmentFiles`` task): the
        ``.deleted`` files whose ``file.delete.delay.ms`` has passed are
        removed. Whether any was; files left at a crash or close are removed
        when the log is next opened."""
        self._live()
        removed = False
        while self._pending_removal and self._pending_removal[0][0] <= now_ms:
            _, names = self._pending_removal.pop(0)
            for name in names:
                if self.directory.exists(name):
                    self.directory.delete(name)
                    removed = True
        if removed:
            self.directory.sync_directory()
        return removed

    # -- the cleaner's checkpoint ---------------------------------------------

    @property
    def cleaner_offset(self) -> int | None:
        """The cleaner's first dirty offset (``cleaner-offset-checkpoint``),
        ``None`` if the log was never cleaned; kept within [log start, log
        end] (``LogCleanerManager`` resets one outside the log)."""
        if self._cleaner_offset is None:
            return None
        return min(max(self._cleaner_offset, self.log_start_offset), self.log_end_offset)

    @cleaner_offset.setter
    def cleaner_offset(self, offset: int) -> None:
        self.set_cleaner_offset(offset)

    def set_cleaner_offset(self, offset: int) -> None:
        """Checkpoint the first dirty offset (written atomically, then kept);
        refused outside [log start, log end]."""
        self._live()
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"cleaner offset {offset} is outside the log's range "
                f"[{self.log_start_offset}, {self.log_end_offset}]",
            )
        self._write_atomically(CLEANER_OFFSET_FILE, encode_offset(offset))
        self._cleaner_offset = offset

    # -- the segment swap -----------------------------------------------------

    def replace_segments(
        self,
        old_bases: Sequence[int],
        batches: Iterable[bytes | bytearray | memoryview],
        now_ms: int,
    ) -> None:
        """Replace consecutive older segments (never the active one) by new
        ones holding exactly ``batches`` (``LocalLog.replaceSegments``, for
        compaction): whole batches with valid CRCs, in offset order, inside
        the replaced range ``[first old base, base of the segment after the
        last old one)``. A new segment takes up to ``segment.bytes``; the
        first is named by the first old base (so the bases keep covering the
        log), each later one by its first batch's base offset.

        Crash-safe in steps, the directory synced after each: the new
        segments are written as ``<base>.log.cleaned`` (with their
        ``.index.cleaned`` and ``.timeindex.cleaned``) and synced; renamed
        ``.swap``, the highest segment first (KAFKA-6264, see
        :func:`finish_interrupted_operations`); the old segments' files
        renamed ``.deleted``; the ``.swap`` files renamed live; the
        ``.deleted`` files removed ``file.delete.delay.ms`` later (Kafka's
        ``asyncDelete``). Bad input is refused naming it, with the live files
        unchanged (the ``.cleaned`` files written so far are removed)."""
        self._live()
        bases = self.segment_base_offsets
        first, last = check_replaced(old_bases, bases)
        # The old segments' aborted transactions go to the new segments that
        # take their markers' offsets: a read_committed fetch of the cleaned
        # range still learns of them (Kafka's cleaner keeps the entries of
        # the segments it rewrites).
        aborted = [txn for index in range(first, last + 1) for txn in self._aborted_of(index)]
        infos = write_cleaned(
            self.directory,
            batches,
            bases[first],
            bases[last + 1],
            self.config,
            now_ms,
            aborted=aborted,
        )
        # .cleaned -> .swap, highest first, each segment's renames durable
        # before the next one's start.
        for info in reversed(infos):
            for name in segment_file_names(info.base_offset):
                self.directory.rename(name + CLEANED_SUFFIX, name + SWAP_SUFFIX)
            self.directory.sync_directory()
        # The old segments out of the way (and out of the log).
        names: list[str] = []
        for base in bases[first : last + 1]:
            if base in self._open_old:
                self._open_old.pop(base).close()
            names.extend(self._rename_deleted(segment_file_names(base)))
        self.directory.sync_directory()
        for info in infos:
            for name in segment_file_names(info.base_offset):
                self.directory.rename(name + SWAP_SUFFIX, name)
        self.directory.sync_directory()
        self._old = self._old[:first] + infos + self._old[last + 1 :]
        self._now_ms = max(self._now_ms, now_ms)
        self._schedule_removal(names, now_ms)

    # -- closing --------------------------------------------------------------

    def close(self) -> None:
        """A clean shutdown: sync, snapshot the producer state at the end,
        checkpoint the recovery point, then write the marker."""
        if self._closed:
            return
        self._active.flush()
        self.recovery_point = self.log_end_offset
        self._take_snapshot()
        self._write_recovery_point(self.log_end_offset)
        for segment in self._open_old.values():
            segment.close()
        self._open_old.clear()
        self._active.close()
        handle = self.directory.create(CLEAN_SHUTDOWN_FILE)
        handle.sync()
        handle.close()
        self.directory.sync_directory()
        self._closed = True

"""A partition log over its segments (Kafka's ``UnifiedLog`` and ``LocalLog``).

One partition directory on the file seam holds (brokers.md §2.1):

- the segments, ``<base offset, 20 digits>.log`` with their ``.index`` and
  ``.timeindex`` (:mod:`partition_log.segment`);
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
import re
import struct
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from crc32c import crc32c

from partition_log.batch import (
    TIMESTAMP_TYPE_FLAG,
    BatchHeader,
    BatchScanner,
    TimestampType,
    decode_records,
    set_base_offset,
    set_leader_epoch,
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
from partition_log.producer_state import (
    Duplicate,
    ProducerBatch,
    ProducerStateManager,
    decode_snapshot,
)
from partition_log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    RecoveryResult,
    Segment,
    file_name,
    parse_log_name,
)

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "RECOVERY_POINT_FILE",
    "SNAPSHOT_SUFFIX",
    "AppendInfo",
    "CleanupPolicy",
    "LogConfig",
    "LogRecovery",
    "PartitionLog",
]

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
SNAPSHOT_SUFFIX = ".snapshot"
TMP_SUFFIX = ".tmp"
_RECOVERY_POINT_VERSION = 0
_NUMBERED = re.compile(r"(\d{20})(\.log|\.index|\.timeindex|\.snapshot)")
_FIXED = {CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_FILE, CHECKPOINT_FILE_NAME}
# Older segments kept open for reads; the rest are summaries (memory must not
# grow with the log).
_OPEN_OLD_SEGMENTS = 2
_READ_CHUNK = 1 << 20


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


def _storage(message: str) -> PartitionLogError:
    return PartitionLogError(Errors.KAFKA_STORAGE_ERROR, message)


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


def _producer_batch(header: BatchHeader) -> ProducerBatch:
    return ProducerBatch(
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.last_offset_delta,
        header.base_offset,
        header.max_timestamp,
        header.is_transactional,
    )


@dataclass(frozen=True, slots=True)
class _Summary:
    """An older segment when not open: its offsets."""

    base_offset: int
    next_offset: int


def _classify(names: list[str]) -> tuple[list[str], list[int], list[str]]:
    """The segment log names, snapshot offsets and leftover temporary files
    of a directory; refuses a file that is no part of a log, naming it."""
    logs: list[str] = []
    snapshots: list[int] = []
    temporary: list[str] = []
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
        if match is None:
            raise _storage(
                f"file {name!r} in the partition directory is not part of a log "
                "(segment, index, snapshot or checkpoint)"
            )
        if match.group(2) == LOG_SUFFIX:
            parse_log_name(name)
            logs.append(name)
        elif match.group(2) == SNAPSHOT_SUFFIX:
            snapshots.append(int(match.group(1)))
    return sorted(logs), sorted(snapshots), temporary


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
        self._old: list[_Summary] = []
        self._open_old: OrderedDict[int, Segment] = OrderedDict()
        self._active: Segment
        self.high_watermark = 0
        self.recovery_point = 0
        self.epoch_cache = LeaderEpochCache()
        self.producer_state = ProducerStateManager()
        self._last_flush_ms = now_ms
        self.recovery: LogRecovery
        self._closed = False

    # -- state ----------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._old[0].base_offset if self._old else self._active.base_offset

    @property
    def log_end_offset(self) -> int:
        return self._active.next_offset

    @property
    def segment_base_offsets(self) -> list[int]:
        return [s.base_offset for s in self._old] + [self._active.base_offset]

    def _live(self) -> None:
        if self._closed:
            raise _storage("the partition log is closed")

    # -- small files ----------------------------------------------------------

    def _write_atomically(self, name: str, data: bytes) -> None:
        temporary = name + TMP_SUFFIX
        if self.directory.exists(temporary):
            self.directory.delete(temporary)
        handle = self.directory.create(temporary)
        try:
            handle.append(data)
            handle.sync()
        finally:
            handle.close()
        self.directory.rename(temporary, name)
        self.directory.sync_directory()

    def _read_whole(self, name: str) -> bytes:
        handle = self.directory.open(name)
        try:
            return handle.read(0, handle.size)
        finally:
            handle.close()

    def _write_recovery_point(self, offset: int) -> None:
        self._write_atomically(
            RECOVERY_POINT_FILE, f"{_RECOVERY_POINT_VERSION}\n{offset}\n".encode("ascii")
        )

    def _set_epoch_cache(self, cache: LeaderEpochCache) -> None:
        """Write the checkpoint, then swap the cache in (so a failed write
        leaves the old one)."""
        if cache != self.epoch_cache:
            self._write_atomically(CHECKPOINT_FILE_NAME, encode_checkpoint(cache.entries))
            self.epoch_cache = cache

    def _take_snapshot(self) -> None:
        state = self.producer_state
        self._write_atomically(file_name(state.map_end_offset, SNAPSHOT_SUFFIX), state.snapshot())

    def _snapshot_offsets(self) -> list[int]:
        return sorted(
            int(name[:20])
            for name in self.directory.list()
            if _NUMBERED.fullmatch(name) and name.endswith(SNAPSHOT_SUFFIX)
        )

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
        anything is changed. With the clean-shutdown marker the segments are
        opened as they are; without it every segment from the one holding
        the recovery point is recovered (``LogLoader``): cut at the first
        bad byte, later segments dropped, the epoch cache and the producer
        state rebuilt. Damage below the recovery point refuses the open."""
        logs, _, temporary = _classify(directory.list())
        clean = directory.exists(CLEAN_SHUTDOWN_FILE)
        recovery_point = 0
        if directory.exists(RECOVERY_POINT_FILE):
            handle = directory.open(RECOVERY_POINT_FILE)
            try:
                text = handle.read(0, handle.size)
            finally:
                handle.close()
            lines = text.split(b"\n")
            if (
                len(lines) != 3
                or lines[0] != str(_RECOVERY_POINT_VERSION).encode()
                or lines[2] != b""
                or not lines[1].isdigit()
            ):
                raise _storage(f"file {RECOVERY_POINT_FILE} is not a recovery point: {text!r}")
            recovery_point = int(lines[1])
        log = cls(directory, config, now_ms)
        if logs:
            # A refusal (damage below the recovery point, a damaged segment
            # after a clean shutdown) comes before any file changes.
            log._load(logs, clean, recovery_point)
        # Leftovers of interrupted writes and index files without their log
        # (LogLoader removes both; an index left where the next segment
        # goes would stop the roll).
        for name in directory.list():
            if name in temporary or (
                name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX))
                and name.rsplit(".", 1)[0] + LOG_SUFFIX not in logs
            ):
                directory.delete(name)
        if clean:
            # Removed once the log is open: a crash from here on is unclean.
            directory.delete(CLEAN_SHUTDOWN_FILE)
        directory.sync_directory()
        if not logs:
            log._active = log._create_segment(0)
            log._write_recovery_point(0)
            log.recovery = LogRecovery(True, 0, 0)
        log.high_watermark = min(max(high_watermark, log.log_start_offset), log.log_end_offset)
        return log

    def _open_segment(
        self, name: str, recover: bool, durable_offset: int | None = None
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
        )

    def _create_segment(self, base_offset: int) -> Segment:
        return Segment.create(
            self.directory,
            base_offset,
            now_ms=self._now_ms,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
        )

    def _load(self, logs: list[str], clean: bool, recovery_point: int) -> None:
        bases = [parse_log_name(name) for name in logs]
        # The segment holding the recovery point, and every later one, is
        # recovered after an unclean shutdown.
        first_recovered = len(logs)
        if not clean:
            first_recovered = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        summaries: list[_Summary] = []
        segments: list[Segment] = []
        cut: tuple[str, int, int, str | None] | None = None
        dropped: list[str] = []
        expected: int | None = None
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
                segment, result = self._open_segment(
                    name, recover, recovery_point if recover else None
                )
                expected = segment.next_offset
                if result is not None and result.truncated_bytes:
                    cut = (name, result.valid_bytes, result.truncated_bytes, result.reason)
                segments.append(segment)
            # All but the last are summaries.
            for segment in segments[:-1]:
                summaries.append(_Summary(segment.base_offset, segment.next_offset))
                segment.close()
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        self._old = summaries
        self._active = segments[-1]
        for name in dropped:
            base = parse_log_name(name)
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                if self.directory.exists(file_name(base, suffix)):
                    self.directory.delete(file_name(base, suffix))
        if dropped:
            self.directory.sync_directory()
        end = self.log_end_offset
        start_of_recovery = bases[first_recovered] if first_recovered < len(bases) else end
        if not clean:
            # The cut and the rebuilt indexes are made durable before the
            # recovery point moves past them.
            self._active.flush()
        # The epoch cache: the checkpoint for the part not rescanned, the
        # batches for the rest (LogLoader via LogSegment.recover).
        loaded: LeaderEpochCache | None = None
        if self.directory.exists(CHECKPOINT_FILE_NAME):
            try:
                loaded = LeaderEpochCache.from_entries(
                    decode_checkpoint(self._read_whole(CHECKPOINT_FILE_NAME))
                )
            except (PartitionLogError, ValueError):
                loaded = None
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
        for offset in self._snapshot_offsets():
            if offset > end:
                self.directory.delete(file_name(offset, SNAPSHOT_SUFFIX))
        self.directory.sync_directory()
        self.producer_state = self._rebuild_producer_state(end)
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
        )

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
            return ProducerStateManager.rebuild(
                data, (_producer_batch(h) for h in self._headers_from(offset))
            )
        return ProducerStateManager.rebuild(
            None,
            (_producer_batch(h) for h in self._headers_from(self.log_start_offset)),
            self.log_start_offset,
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
        """The segment holding ``offset``: the last whose base is at most it."""
        bases = self.segment_base_offsets
        return max(0, bisect.bisect_right(bases, offset) - 1)

    def _headers_from(self, offset: int) -> Iterator[BatchHeader]:
        """The headers of the batches whose last offset is at least
        ``offset``, in order, read a chunk at a time."""
        count = len(self._old) + 1
        index = self._index_of(offset)
        while index < count:
            segment = self._segment_at(index)
            position = max(offset, segment.base_offset)
            while position < segment.next_offset:
                chunk = segment.read(position, _READ_CHUNK)
                if not chunk:
                    break
                for batch in BatchScanner(chunk, check_crc=False):
                    if batch.header.last_offset >= offset:
                        yield batch.header
                    position = batch.header.next_offset
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
        self._old.append(_Summary(old.base_offset, old.next_offset))
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

    def _after_append(self, headers: list[BatchHeader], now_ms: int) -> None:
        cache = self.epoch_cache
        for header in headers:
            if header.partition_leader_epoch >= 0:
                cache = cache.assign(header.partition_leader_epoch, header.base_offset)
        self._set_epoch_cache(cache)
        for header in headers:
            self.producer_state.update(_producer_batch(header))
        new_end = headers[-1].next_offset
        if self._flush_due(new_end, now_ms):
            # flush.messages=1 syncs before the end moves (brokers.md §2.4).
            self._active.flush()
            self.recovery_point = new_end
            self._last_flush_ms = now_ms

    def append_as_leader(self, batch_bytes: bytes, leader_epoch: int, now_ms: int) -> AppendInfo:
        """Append one producer batch as the leader (``UnifiedLog.appendAsLeader``):
        verified (CRC, fields, records), checked against the producer state (a
        retry gets its original offsets and appends nothing), given the next
        offsets and ``leader_epoch``, then written. A refusal changes nothing."""
        self._live()
        self._check_size(len(batch_bytes), "batch")
        header = verify(batch_bytes)
        if self.config.compacts and not header.is_control:
            # A compacted log keeps the last record per key: a record without
            # one could never be cleaned (LogValidator.validateKey).
            for record in decode_records(batch_bytes):
                if record.key is None:
                    raise PartitionLogError(
                        Errors.INVALID_RECORD,
                        "Compacted topic cannot accept message without key: the record "
                        f"at offset delta {record.offset - header.base_offset} has none "
                        f"(cleanup_policy {self.config.cleanup_policy})",
                    )
        end = self.log_end_offset
        try:
            incoming = ProducerBatch(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.last_offset_delta,
                end,
                header.max_timestamp,
                header.is_transactional,
            )
        except ValueError as error:
            raise PartitionLogError(Errors.INVALID_RECORD, f"batch: {error}") from None
        answer = self.producer_state.check(incoming)
        if isinstance(answer, Duplicate):
            return AppendInfo(answer.first_offset, answer.last_offset, -1, duplicate=True)
        if leader_epoch < max(self.epoch_cache.latest_epoch, 0):
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"leader epoch {leader_epoch} is negative or older than the log's latest "
                f"epoch {self.epoch_cache.latest_epoch}",
            )
        data = bytearray(batch_bytes)
        set_base_offset(data, end)
        set_leader_epoch(data, leader_epoch)
        log_append_time = -1
        if self.config.timestamp_type is TimestampType.LOG_APPEND_TIME:
            _stamp_log_append_time(data, now_ms)
            log_append_time = now_ms
        stamped = BatchHeader.parse(data)
        self._maybe_roll(len(data), stamped.last_offset, now_ms)
        self._active.append(data)
        self._after_append([stamped], now_ms)
        return AppendInfo(end, stamped.last_offset, log_append_time)

    def append_as_follower(self, batch_bytes: bytes, now_ms: int = 0) -> AppendInfo:
        """Append the leader's batches as they are (``UnifiedLog.appendAsFollower``):
        each whole, with a valid CRC, the first starting at the log end and
        each following the previous. A refusal names the offsets and changes
        nothing."""
        self._live()
        scanner = BatchScanner(batch_bytes, max_batch_bytes=self.config.max_batch_bytes)
        headers = [batch.header for batch in scanner]
        if scanner.error is not None or not headers:
            raise PartitionLogError(
                Errors.CORRUPT_MESSAGE,
                "follower append: not whole valid batches: "
                + (str(scanner.error.args[0]) if scanner.error else "no batch"),
            )
        expected = self.log_end_offset
        for header in headers:
            if header.base_offset != expected:
                raise PartitionLogError(
                    Errors.OFFSET_OUT_OF_RANGE,
                    f"follower append: batch at base offset {header.base_offset}, expected "
                    f"the log end offset {expected}"
                    + ("" if header is headers[0] else " (following the previous batch)"),
                )
            expected = header.next_offset
            try:
                _producer_batch(header)
            except ValueError as error:
                # Checked before the append: the producer state could not
                # record the batch afterwards.
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    f"follower append: batch at base offset {header.base_offset}: {error}",
                ) from None
        self._maybe_roll(len(batch_bytes), headers[-1].last_offset, now_ms)
        self._active.append(batch_bytes)
        self._after_append(headers, now_ms)
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
        data = b""
        while index <= len(self._old):
            segment = self._segment_at(index)
            if start_offset < segment.next_offset:
                data = segment.read(max(start_offset, segment.base_offset), max_bytes)
                if data:
                    break
            index += 1
        # Cut before the first batch reaching the limit.
        keep = 0
        for batch in BatchScanner(data, check_crc=False):
            if batch.header.last_offset >= limit:
                break
            keep = batch.end
        return data[:keep]

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
        self._set_epoch_cache(self.epoch_cache.truncate_from_end(end))
        self.producer_state = self._rebuild_producer_state(end)
        self.high_watermark = min(self.high_watermark, end)
        # Everything kept is synced: the cut segment just now, older ones at
        # their roll.
        self.recovery_point = end
        return end

    def _delete_segment_files(self, base: int) -> None:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            name = file_name(base, suffix)
            if self.directory.exists(name):
                self.directory.delete(name)

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

"""One segment of a partition log (Kafka's ``LogSegment``): a ``.log`` file
of whole record batches named by its base offset, with its sparse offset
index (``.index``), time index (``.timeindex``) and aborted-transaction
index (``.txnindex``, :mod:`partition_log.txn_index`).

Batches arrive already verified (their CRC checked by whoever took them from
outside) and as opaque bytes; the segment reads only their headers.  Every
append has reached the OS when :meth:`Segment.append` returns (the file seam
writes with ``os.write``); :meth:`Segment.flush` makes it durable.  The
indexes live in memory as entry bytes and are written to their files on
close (synced then); they are never trusted over the log: a missing or
suspect index is rebuilt from the batches, and :meth:`Segment.recover`
rescans the whole log, cuts it at the first bad byte and rebuilds both.

The aborted-transaction index is different (Kafka's ``TransactionIndex``):
its entries come from the producer state, which the segment does not have,
so the log appends them (:meth:`Segment.append_aborted`) and rebuilds them
(:meth:`Segment.rewrite_aborted`).  Each entry reaches the OS when appended
and is synced by :meth:`Segment.flush` with the log: an abort is rare, so
the extra fsync is paid only by a flush that follows one.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import bugs
from bugs import Bug
from partition_log.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    BatchScanner,
    ScanEnd,
    control_batch_bytes,
    decode_records,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, LogFile, ProcessBufferedFile
from partition_log.index import (
    DEFAULT_INDEX_BYTES,
    DEFAULT_INDEX_INTERVAL_BYTES,
    INT32_MAX,
    NO_TIMESTAMP,
    OFFSET_ENTRY_SIZE,
    TIME_ENTRY_SIZE,
    IndexBuilder,
    OffsetIndex,
    TimeIndex,
    sanity_check,
)
from partition_log.txn_index import ENTRY_SIZE, AbortedTxn, decode_entries, encode_entry, truncated

__all__ = [
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "TXN_INDEX_SUFFIX",
    "BatchVisitor",
    "RecoveryResult",
    "Segment",
    "file_name",
    "parse_log_name",
    "write_aborted_file",
]

BatchVisitor = Callable[[BatchHeader, bytes | None], None]
"""Called with each batch a scan keeps: its header, and its bytes if it is
a control batch (whose transaction marker the producer state reads), else
None (the common batch costs no copy)."""

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
# LogFileUtils.filenamePrefixFromOffset: the base offset, 20 digits.
_LOG_NAME = re.compile(r"(\d{20})\.log")
# How much of the log recovery reads at a time (more for a larger batch), so
# recovering a segment holds a bounded buffer, not the segment.
RECOVERY_CHUNK_BYTES = 1 << 20
INT64_MAX = (1 << 63) - 1


def file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000000042.log`` for base offset 42 and suffix ``.log``."""
    if not 0 <= base_offset <= INT64_MAX:
        raise PartitionLogError(
            Errors.OFFSET_OUT_OF_RANGE, f"base offset {base_offset} is not a non-negative int64"
        )
    return f"{base_offset:020d}{suffix}"


def parse_log_name(name: str) -> int:
    """The base offset a segment's ``.log`` file name gives; refuses any
    other name, naming it."""
    match = _LOG_NAME.fullmatch(name)
    if match is None or int(match.group(1)) > INT64_MAX:
        raise PartitionLogError(
            Errors.KAFKA_STORAGE_ERROR,
            f"{name!r} is not a segment file name (20 digits of base offset, then .log)",
        )
    return int(match.group(1))


def _encode_aborted(name: str, base_offset: int, entries: Sequence[AbortedTxn]) -> bytes:
    """The bytes of a ``.txnindex`` holding ``entries``, refused (naming
    the file) unless they are in marker order and at or past the base."""
    data = b"".join(encode_entry(txn) for txn in entries)
    decode_entries(data, name)
    if entries and entries[0].last_offset < base_offset:
        raise PartitionLogError(
            Errors.KAFKA_STORAGE_ERROR,
            f"{name}: last offset {entries[0].last_offset} is below the segment's base "
            f"offset {base_offset}",
        )
    return data


def write_aborted_file(
    directory: FileDirectory, base_offset: int, entries: Sequence[AbortedTxn]
) -> None:
    """Make the ``.txnindex`` file of the closed segment at ``base_offset``
    hold exactly ``entries`` and sync it (a rebuild from the log; rewritten
    only if it differs, created if missing)."""
    name = file_name(base_offset, TXN_INDEX_SUFFIX)
    data = _encode_aborted(name, base_offset, entries)
    if directory.exists(name):
        handle = directory.open(name)
    else:
        handle = directory.create(name)
        directory.sync_directory()
    try:
        if handle.read(0, handle.size) != data:
            handle.truncate(0)
            handle.append(data)
        handle.sync()
    finally:
        handle.close()


_INT32 = struct.Struct(">i")
# A batch's base offset and length, and where its last offset delta lies.
_BASE_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA_AT = 23


def _in_file(message: str, chunk_start: int) -> str:
    """A scanner's message about a chunk read from ``chunk_start``, with the
    position it names made the file's."""
    return re.sub(
        r"at position (\d+)",
        lambda m: f"at position {chunk_start + int(m.group(1))}",
        message,
        count=1,
    )


def _corrupt(message: str) -> PartitionLogError:
    return PartitionLogError(Errors.CORRUPT_MESSAGE, message)


@dataclass(frozen=True, slots=True)
class _Scanned:
    """Where a scan of the log stopped and why, its first batch's position and
    its last whole batch."""

    position: int
    end: ScanEnd
    reason: str | None
    first: int | None
    last: BatchHeader | None


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What :meth:`Segment.recover` found: the log's valid bytes, how many it
    cut after them (0 for a whole log), and why (``None`` if nothing)."""

    valid_bytes: int
    truncated_bytes: int
    next_offset: int
    end: ScanEnd
    reason: str | None


class Segment:
    """A segment open for reads and, when it is the active one, appends."""

    def __init__(
        self,
        directory: FileDirectory,
        base_offset: int,
        log: LogFile,
        *,
        now_ms: int,
        index_interval_bytes: int,
        max_index_bytes: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        # B13: appends wait in a process buffer until a flush, roll or clean
        # close, not handed to the OS when the produce is answered; a kill -9
        # of every replica loses acknowledged records.
        self._log: LogFile = ProcessBufferedFile(log) if bugs.on(Bug.UNFLUSHED_APPEND) else log
        self.created_ms = now_ms
        self.offsets = OffsetIndex(base_offset, max_index_bytes)
        self.times = TimeIndex(base_offset, max_index_bytes)
        self._builder = IndexBuilder(self.offsets, self.times, index_interval_bytes)
        self.next_offset = base_offset
        # The first batch's max timestamp, which the age of the segment is
        # measured from when it has one (LogSegment.rollingBasedTimestamp).
        self._first_timestamp: int | None = None
        # Entries of each index file known to equal the memory ones, and
        # whether a file may hold entries past them (after a truncation or a
        # rebuild), to be cut when the files are written.
        self._offsets_written = 0
        self._times_written = 0
        self._files_cut = False
        self._closed = False
        # Where the last read stopped: the position and header of the batch
        # after its bytes, when the walk to its end read that header. A
        # consumer's next read starts there (at its base offset), found
        # without the index or a walk; dropped when the file is cut.
        self._read_memo: tuple[int, BatchHeader] | None = None
        # The aborted-transaction index: its file, opened on first use; its
        # entries, read on first use and kept while the segment is open
        # (the log keeps the active segment and a few older ones open, so
        # this does not grow with the log); and whether the file holds
        # writes that the next flush must sync.
        self._txn_file: LogFile | None = None
        self._aborted: list[AbortedTxn] | None = None
        self._txn_unsynced = False

    # -- names and opening --------------------------------------------------------

    @property
    def name(self) -> str:
        return file_name(self.base_offset, LOG_SUFFIX)

    @property
    def index_name(self) -> str:
        return file_name(self.base_offset, INDEX_SUFFIX)

    @property
    def time_index_name(self) -> str:
        return file_name(self.base_offset, TIME_INDEX_SUFFIX)

    @property
    def txn_index_name(self) -> str:
        return file_name(self.base_offset, TXN_INDEX_SUFFIX)

    @classmethod
    def create(
        cls,
        directory: FileDirectory,
        base_offset: int,
        *,
        now_ms: int,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        max_index_bytes: int = DEFAULT_INDEX_BYTES,
    ) -> Segment:
        """A new empty segment: its four files created and the directory
        synced, so the segment's name survives a power loss.  The
        aborted-transaction index is created empty with the others (Kafka
        creates it on its first entry), so that a missing one is known to be
        lost and is rebuilt."""
        names = [
            file_name(base_offset, s)
            for s in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
        ]
        for name in names:
            if directory.exists(name):
                raise PartitionLogError(
                    Errors.KAFKA_STORAGE_ERROR, f"segment file {name} already exists"
                )
        log = directory.create(names[0])
        directory.create(names[1]).close()
        directory.create(names[2]).close()
        directory.create(names[3]).close()
        directory.sync_directory()
        return cls(
            directory,
            base_offset,
            log,
            now_ms=now_ms,
            index_interval_bytes=index_interval_bytes,
            max_index_bytes=max_index_bytes,
        )

    @classmethod
    def open(
        cls,
        directory: FileDirectory,
        name: str,
        *,
        now_ms: int,
        recover: bool = False,
        max_batch_bytes: int | None = None,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        max_index_bytes: int = DEFAULT_INDEX_BYTES,
        durable_offset: int | None = None,
        visit: BatchVisitor | None = None,
    ) -> tuple[Segment, RecoveryResult | None]:
        """Open the segment whose ``.log`` file is ``name``.

        With ``recover`` (after an unclean shutdown) the whole log is
        rescanned and cut at the first bad byte (:meth:`recover`, which calls
        ``visit`` with each batch kept), and its result returned.
        Without it the index files are loaded if present and sane (else
        rebuilt from the log in memory) and only the log's tail past the last
        index entry is read; a damaged tail is refused (``CORRUPT_MESSAGE``
        naming the file and position) with nothing on disk changed."""
        base_offset = parse_log_name(name)
        log = directory.open(name)
        segment = cls(
            directory,
            base_offset,
            log,
            now_ms=now_ms,
            index_interval_bytes=index_interval_bytes,
            max_index_bytes=max_index_bytes,
        )
        try:
            if recover:
                return segment, segment.recover(
                    max_batch_bytes, durable_offset=durable_offset, visit=visit
                )
            loaded = segment._load_indexes()
            problem = None
            if loaded:
                problem = segment._resume(max_batch_bytes) or sanity_check(
                    segment.offsets, segment.times, log.size, segment.next_offset
                )
            if not loaded or problem is not None:
                # A missing or suspect index: rebuild it from the log; only if
                # the log itself is damaged is the open refused.
                segment._rebuild(max_batch_bytes)
                problem = segment._resume(max_batch_bytes)
            if problem is not None:
                raise _corrupt(f"segment {name}: {problem}")
            segment._first_timestamp = segment._read_first_timestamp()
        except BaseException:
            log.close()
            raise
        return segment, None

    def _load_indexes(self) -> bool:
        """The index files as they are, or ``False`` if one is missing or not
        well formed (then the caller rebuilds)."""
        for name, index in (
            (self.index_name, self.offsets),
            (self.time_index_name, self.times),
        ):
            if not self.directory.exists(name):
                return False
            handle = self.directory.open(name)
            try:
                data = handle.read(0, handle.size)
            finally:
                handle.close()
            try:
                index.load(data)
            except PartitionLogError:
                return False
        self._offsets_written = len(self.offsets)
        self._times_written = len(self.times)
        return True

    def _rebuild(self, max_batch_bytes: int | None) -> None:
        """Both indexes again from the log's batches (as far as they are
        whole), to be rewritten on the next flush."""
        self._builder.reset()
        self._offsets_written = 0
        self._times_written = 0
        self._files_cut = True
        self._scan(0, max_batch_bytes, self._builder.add)

    def _scan(
        self,
        start: int,
        max_batch_bytes: int | None,
        visit: Callable[[int, BatchHeader], None],
        also: BatchVisitor | None = None,
        check_crc: bool = True,
    ) -> _Scanned:
        """Call ``visit`` with the position and header of each whole valid
        batch from ``start`` (and ``also`` with the header), reading a
        bounded chunk at a time (nothing is kept per batch); then say where
        and why the scan stopped.  A batch that goes back in offsets or whose
        offsets do not fit the segment is damage too (``LogSegment.recover``'s
        offset check).  ``check_crc`` is off only for bug B14."""
        size = self._log.size
        position = start
        expected = self.base_offset
        first: int | None = None
        last: BatchHeader | None = None
        want = RECOVERY_CHUNK_BYTES
        # The largest last offset that fits relative to the base.
        highest = self.base_offset + INT32_MAX
        while True:
            buffer = self._log.read(position, min(want, size - position))
            scanner = BatchScanner(buffer, check_crc=check_crc, max_batch_bytes=max_batch_bytes)
            for at, header in scanner:
                at += position
                base = header.base_offset
                last_offset = base + header.last_offset_delta
                if base < expected or last_offset > highest:
                    if base < expected:
                        problem = f"batch base offset {base} below the expected {expected}"
                    else:
                        problem = (
                            f"batch last offset {last_offset} does not fit "
                            f"relative to the segment's base {self.base_offset}"
                        )
                    return _Scanned(
                        at, ScanEnd.CORRUPT, f"at position {at}: {problem}", first, last
                    )
                expected = last_offset + 1
                if first is None:
                    first = at
                last = header
                visit(at, header)
                if also is not None:
                    also(header, control_batch_bytes(buffer, at - position, header))
            consumed = scanner.position
            if scanner.end is ScanEnd.COMPLETE and position + len(buffer) < size:
                position += consumed
                want = RECOVERY_CHUNK_BYTES
                continue
            if scanner.end is ScanEnd.TRUNCATED and position + len(buffer) < size:
                # The batch crosses the chunk's end: read from its start, and
                # enough for all of it.
                position += consumed
                left = len(buffer) - consumed
                want = RECOVERY_CHUNK_BYTES
                if left >= LOG_OVERHEAD:
                    length = int.from_bytes(buffer[consumed + 8 : consumed + 12], "big")
                    want = max(want, length + LOG_OVERHEAD)
                continue
            reason = None if scanner.error is None else str(scanner.error.args[0])
            if reason is not None:
                # The scanner names positions in its chunk: name the file's.
                reason = _in_file(reason, position)
            assert scanner.end is not None
            return _Scanned(position + consumed, scanner.end, reason, first, last)

    def _resume(self, max_batch_bytes: int | None) -> str | None:
        """Set the next offset, the largest timestamp and the bytes since the
        last index entry from the log's tail past the last offset index
        entry: all the log that must be read when the indexes are trusted.
        Returns why the tail is damaged or the index suspect, or ``None``."""
        start = self.offsets.last.position if len(self.offsets) else 0
        if len(self.offsets) and start >= self._log.size:
            return (
                f"offset index entry at position {start} is past the log's {self._log.size} bytes"
            )
        builder = self._builder
        interval = builder.index_interval_bytes
        last_time = self.times.last
        max_timestamp = last_time.timestamp
        offset_of_max = last_time.offset if len(self.times) else self.base_offset - 1
        since = 0
        missing: list[int] = []

        def visit(position: int, header: BatchHeader) -> None:
            nonlocal since, max_timestamp, offset_of_max
            # The tail must hold no batch at which the append rule would have
            # added an entry: else the index file lost entries (it is written
            # on flush and close only) and is rebuilt rather than used short.
            if since > interval and not missing:
                missing.append(position)
            since += header.size
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
                offset_of_max = header.last_offset

        scanned = self._scan(start, max_batch_bytes, visit)
        if scanned.end is not ScanEnd.COMPLETE:
            return scanned.reason
        if len(self.offsets) and scanned.first != start:
            return f"offset index entry at position {start} is not at a batch"
        if missing:
            return f"offset index has no entry for the batch at position {missing[0]}"
        builder.max_timestamp = max_timestamp
        builder.offset_of_max_timestamp = offset_of_max
        builder.bytes_since_last_entry = since
        if scanned.last is not None:
            self.next_offset = scanned.last.next_offset
        else:
            self.next_offset = self.base_offset
        return None

    def _read_header(self, position: int) -> BatchHeader:
        return BatchHeader.parse(self._log.read(position, HEADER_SIZE))

    def _read_first_timestamp(self) -> int | None:
        if self._log.size == 0:
            return None
        timestamp = self._read_header(0).max_timestamp
        return None if timestamp == NO_TIMESTAMP else timestamp

    # -- state ------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._log.size

    @property
    def max_timestamp(self) -> int:
        """The largest batch max timestamp in the segment (-1 if none)."""
        return self._builder.max_timestamp

    @property
    def first_batch_timestamp(self) -> int | None:
        """The first batch's max timestamp (``None`` if empty or without one)."""
        return self._first_timestamp

    @property
    def rolling_since_ms(self) -> int:
        """What the segment's age is measured from: its first batch's max
        timestamp if it has one, else its creation (``LogSegment``'s
        ``rollingBasedTimestamp``)."""
        first = self._first_timestamp
        return self.created_ms if first is None else first

    @property
    def offset_of_max_timestamp(self) -> int:
        return self._builder.offset_of_max_timestamp

    def _live(self) -> LogFile:
        if self._closed:
            raise PartitionLogError(Errors.KAFKA_STORAGE_ERROR, f"segment {self.name} is closed")
        return self._log

    # -- appends ----------------------------------------------------------------

    def append(self, batches: bytes | bytearray | memoryview, *, allow_gaps: bool = False) -> None:
        """Append whole, verified batches whose offsets follow on from the
        segment's next offset (with ``allow_gaps``, as a compacted segment's
        do, at or past it).  Checked before any byte is written: a refusal
        leaves the file as it was."""
        log = self._live()
        scanner = BatchScanner(batches, check_crc=False)
        headers: list[tuple[int, BatchHeader]] = []
        expected = self.next_offset
        for batch in scanner:
            header = batch.header
            if header.base_offset < expected or (header.base_offset != expected and not allow_gaps):
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    f"segment {self.name}: batch base offset {header.base_offset}, "
                    f"expected the next offset {expected}",
                )
            if header.last_offset - self.base_offset > INT32_MAX:
                raise PartitionLogError(
                    Errors.INVALID_RECORD,
                    f"segment {self.name}: last offset {header.last_offset} does not fit "
                    f"relative to base {self.base_offset} (roll first)",
                )
            expected = header.next_offset
            headers.append((batch.position, header))
        if scanner.error is not None or not headers:
            raise PartitionLogError(
                Errors.CORRUPT_MESSAGE,
                f"segment {self.name}: not whole batches: "
                f"{scanner.error.args[0] if scanner.error else 'no batch'}",
            )
        start = log.size
        if start + len(batches) > INT32_MAX:
            raise PartitionLogError(
                Errors.MESSAGE_TOO_LARGE,
                f"segment {self.name}: {len(batches)} bytes past position {start} exceed "
                "a segment's int32 positions (roll first)",
            )
        if self.offsets.is_full or self.times.is_full:
            raise PartitionLogError(
                Errors.KAFKA_STORAGE_ERROR, f"segment {self.name}: an index is full (roll first)"
            )
        log.append(batches)
        for position, header in headers:
            self._builder.add(start + position, header)
            if self._first_timestamp is None and header.max_timestamp != NO_TIMESTAMP:
                self._first_timestamp = header.max_timestamp
        self.next_offset = expected

    def append_batch(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        """Append one batch the caller verified, ``header`` being its parsed
        header (a leader's append): :meth:`append`'s checks and effects
        without scanning the bytes again for the header already in hand."""
        log = self._live() if self._closed else self._log
        if header.length + LOG_OVERHEAD != len(batch):
            raise PartitionLogError(
                Errors.CORRUPT_MESSAGE,
                f"segment {self.name}: a header of a {header.size}-byte batch with "
                f"{len(batch)} bytes",
            )
        if header.base_offset != self.next_offset:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"segment {self.name}: batch base offset {header.base_offset}, "
                f"expected the next offset {self.next_offset}",
            )
        last_offset = header.base_offset + header.last_offset_delta
        if last_offset - self.base_offset > INT32_MAX:
            raise PartitionLogError(
                Errors.INVALID_RECORD,
                f"segment {self.name}: last offset {last_offset} does not fit "
                f"relative to base {self.base_offset} (roll first)",
            )
        start = log.size
        if start + len(batch) > INT32_MAX:
            raise PartitionLogError(
                Errors.MESSAGE_TOO_LARGE,
                f"segment {self.name}: {len(batch)} bytes past position {start} exceed "
                "a segment's int32 positions (roll first)",
            )
        if self.offsets.is_full or self.times.is_full:
            raise PartitionLogError(
                Errors.KAFKA_STORAGE_ERROR, f"segment {self.name}: an index is full (roll first)"
            )
        log.append(batch)
        self._builder.add(start, header)
        if self._first_timestamp is None and header.max_timestamp != NO_TIMESTAMP:
            self._first_timestamp = header.max_timestamp
        self.next_offset = last_offset + 1

    # -- reads ------------------------------------------------------------------

    def _position_of(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is at least ``offset``
        (``LogSegment.translateOffset``), found from the index's entry: the
        headers from there are walked in chunks read at once (about one
        index interval), not one read per batch, reading only each batch's
        base offset, length and last offset delta on the way."""
        offsets = self.offsets
        i = offsets.floor_index(offset)
        position = offsets.position_at(i) if i >= 0 else 0
        size = self._log.size
        chunk_size = max(2 * self._builder.index_interval_bytes, 8192)
        head, delta = _BASE_AND_LENGTH.unpack_from, _INT32.unpack_from
        if i + 1 < len(offsets):
            # The next entry's batch ends past ``offset``; when it is further
            # than a chunk (batches larger than the index interval: an entry
            # per batch) and starts at or before ``offset``, it is the batch
            # sought, found with one read of its header instead of a walk.
            following = offsets.position_at(i + 1)
            if following - position > chunk_size:
                chunk = self._log.read(following, HEADER_SIZE)
                if len(chunk) == HEADER_SIZE and head(chunk, 0)[0] <= offset:
                    return following, BatchHeader.parse(chunk)
        chunk = b""
        chunk_start = position
        while position < size:
            at = position - chunk_start
            if at + HEADER_SIZE > len(chunk):
                chunk_start, at = position, 0
                chunk = self._log.read(position, min(chunk_size, size - position))
                if len(chunk) < HEADER_SIZE:
                    BatchHeader.parse(chunk)  # refuses naming the short header
            base, length = head(chunk, at)
            if base + delta(chunk, at + _LAST_OFFSET_DELTA_AT)[0] >= offset:
                return position, BatchHeader.parse(chunk, at)
            position += length + LOG_OVERHEAD
        return None

    def _last_boundary(self, position: int, limit: int) -> tuple[int, BatchHeader | None]:
        """The end of the last whole batch from ``position`` (a batch's start)
        that ends at or before ``limit``, walking the lengths in chunks of
        about an index interval; with the header of the batch starting at
        that end when the walk read it whole (else ``None``)."""
        log = self._log
        chunk_size = max(2 * self._builder.index_interval_bytes, 8192)
        chunk = b""
        chunk_start = position
        length_of = _INT32.unpack_from
        while position + LOG_OVERHEAD <= limit:
            at = position - chunk_start
            if at + LOG_OVERHEAD > len(chunk):
                chunk_start, at = position, 0
                # A header's bytes past the limit: the header of the batch
                # the walk stops before is then in hand for the next read.
                chunk = log.read(position, min(chunk_size, limit - position + HEADER_SIZE))
            following = position + LOG_OVERHEAD + length_of(chunk, at + 8)[0]
            if following > limit:
                if at + HEADER_SIZE <= len(chunk):
                    return position, BatchHeader.parse(chunk, at)
                break
            position = following
        return position, None

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one holding ``start_offset``, as many as fit
        in ``max_bytes`` but at least one (Kafka's rule, so a consumer is never
        stuck behind a batch larger than its limit), and with ``max_offset``
        none whose last offset reaches it (empty if the first does); empty at
        the segment's end, ``OFFSET_OUT_OF_RANGE`` outside it.

        The bytes returned are read once and never copied: where the batches
        end is found first, from the offset index entry at or before the
        byte limit and a walk of the few batch lengths after it (the batches
        were whole when appended), then exactly those bytes are read."""
        self._live()
        if max_bytes < 0:
            raise PartitionLogError(Errors.INVALID_RECORD, f"max_bytes {max_bytes} is negative")
        if not self.base_offset <= start_offset <= self.next_offset:
            raise PartitionLogError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"segment {self.name}: offset {start_offset} outside "
                f"[{self.base_offset}, {self.next_offset}]",
            )
        memo = self._read_memo
        if memo is not None and memo[1].base_offset <= start_offset <= memo[1].last_offset:
            start, header = memo
        else:
            found = self._position_of(start_offset)
            if found is None:
                return b""
            start, header = found
        limit = min(self._log.size, start + max(max_bytes, header.size))
        if max_offset is not None and max_offset < self.next_offset:
            if header.last_offset >= max_offset:
                return b""
            stop = self._position_of(max_offset)
            if stop is not None:
                limit = min(limit, stop[0])
        end = start + header.size
        if end < limit:
            # The last batch start the index knows at or before the limit
            # (its entries point at batch starts): the walk to the last
            # whole batch starts there.
            offsets = self.offsets
            j = offsets.floor_position_index(limit)
            if j >= 0:
                end = max(end, offsets.position_at(j))
            end, following = self._last_boundary(end, limit)
            if following is not None:
                self._read_memo = (end, following)
        return self._log.read(start, end - start)

    def find_offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose record's timestamp is at least ``timestamp``
        (``LogSegment.findOffsetByTimestamp``), or ``None`` if no record of
        the segment is that late."""
        self._live()
        if self.max_timestamp < timestamp:
            return None
        from_offset = self.times.lookup(timestamp).offset
        position = self.offsets.lookup(from_offset).position
        size = self._log.size
        while position < size:
            header = self._read_header(position)
            if header.max_timestamp >= timestamp:
                batch = self._log.read(position, header.size)
                for record in decode_records(batch):
                    if record.timestamp >= timestamp:
                        return record.offset
            position += header.size
        return None

    # -- truncation and recovery ------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is at or past ``offset``
        (the cut is at a batch boundary: a batch holding ``offset`` goes whole,
        ``LogSegment.truncateTo``); returns the bytes removed."""
        log = self._live()
        found = self._position_of(offset)
        if found is None:
            return 0
        position, header = found
        removed = log.size - position
        self._read_memo = None
        log.truncate(position)
        self.offsets.truncate_to(header.base_offset)
        # Time entries are added beside offset entries, each with an offset at
        # or below its partner's: keep those of the offset entries kept, so
        # the indexes equal the ones rebuilt from the log that is left (Kafka
        # cuts the time index at the same offset, which can keep an entry
        # whose partner went).
        if len(self.offsets):
            self.times.truncate_to(self.offsets.last.offset + 1)
        else:
            self.times.clear()
        self._offsets_written = min(self._offsets_written, len(self.offsets))
        self._times_written = min(self._times_written, len(self.times))
        self._files_cut = True
        self._truncate_aborted(header.base_offset)
        problem = self._resume(None)
        if problem is not None:  # the bytes kept were read whole before the cut
            raise _corrupt(f"segment {self.name}: {problem}")
        if position == 0:
            self._first_timestamp = None
        return removed

    def recover(
        self,
        max_batch_bytes: int | None = None,
        *,
        durable_offset: int | None = None,
        visit: BatchVisitor | None = None,
    ) -> RecoveryResult:
        """Rescan the whole log (``LogSegment.recover``): keep the batches up to
        the first one that is torn, damaged or out of order, cut the file
        there, and rebuild both indexes.  ``max_batch_bytes`` makes a length
        above it damage rather than a torn tail.  With ``durable_offset``
        (the log's recovery point) damage that would cut below it refuses
        (``CORRUPT_MESSAGE`` naming the file, position and offset) and cuts
        nothing: those bytes were synced, so the damage is not a torn write.

        ``visit`` is called with the header of each batch kept, in order, as
        the scan reaches it (and a control batch's bytes, whose transaction
        marker the producer state reads): the log rebuilds its epoch cache and producer
        state in this one scan, as Kafka's ``LogSegment.recover`` takes the
        ``ProducerStateManager`` and ``LeaderEpochFileCache`` to update. A
        batch past the cut is never visited (the scan stops at it)."""
        log = self._live()
        self._read_memo = None
        self._builder.reset()
        self._offsets_written = 0
        self._times_written = 0
        self._files_cut = True
        # B14: recovery trusts the batches' bytes without their CRCs, so a
        # damaged batch stays in the log and is served.
        check_crc = not bugs.on(Bug.RECOVERY_SKIPS_CRC)
        scanned = self._scan(0, max_batch_bytes, self._builder.add, visit, check_crc)
        valid = scanned.position
        truncated = log.size - valid
        kept_end = self.base_offset if scanned.last is None else scanned.last.next_offset
        if truncated and durable_offset is not None and kept_end < durable_offset:
            raise _corrupt(
                f"segment {self.name}: damage at offset {kept_end} (position {valid}) below "
                f"the recovery point {durable_offset}: {scanned.reason}"
            )
        if truncated:
            log.truncate(valid)
        self.next_offset = self.base_offset if scanned.last is None else scanned.last.next_offset
        self._first_timestamp = self._read_first_timestamp()
        return RecoveryResult(valid, truncated, self.next_offset, scanned.end, scanned.reason)

    # -- rolling ----------------------------------------------------------------

    def should_roll(
        self,
        size_limit: int,
        incoming_bytes: int,
        now_ms: int,
        age_limit_ms: int,
        jitter_ms: int = 0,
        *,
        incoming_last_offset: int | None = None,
    ) -> bool:
        """Whether the next append goes to a new segment
        (``LogSegment.shouldRoll``): it would pass ``segment.bytes``; or the
        segment is non-empty and older than ``segment.ms`` less the jitter
        (age from its first batch's timestamp, else its creation); or an index
        is full; or the incoming last offset would not fit relative to the
        base."""
        size = self._log.size
        if size > size_limit - incoming_bytes:
            return True
        if size > 0 and now_ms - self.rolling_since_ms > age_limit_ms - jitter_ms:
            return True
        if self.offsets.is_full or self.times.is_full:
            return True
        return (
            incoming_last_offset is not None
            and not 0 <= incoming_last_offset - self.base_offset <= INT32_MAX
        )

    # -- flush and close --------------------------------------------------------

    def _write_index(self, name: str, data: bytes, written: int, entry: int) -> None:
        if not self.directory.exists(name):
            handle = self.directory.create(name)
            self.directory.sync_directory()
        else:
            handle = self.directory.open(name)
        try:
            if handle.size != written * entry:
                handle.truncate(min(handle.size, written * entry))
            if handle.size < written * entry:  # shorter than believed: rewrite
                handle.truncate(0)
                written = 0
            handle.append(data[written * entry :])
            handle.sync()
        finally:
            handle.close()

    def _write_indexes(self) -> None:
        """Bring both index files to the entries in memory and sync them,
        if they differ (a segment only read writes nothing)."""
        if (
            self._files_cut
            or self._offsets_written != len(self.offsets)
            or self._times_written != len(self.times)
        ):
            self._write_index(
                self.index_name, self.offsets.encode(), self._offsets_written, OFFSET_ENTRY_SIZE
            )
            self._offsets_written = len(self.offsets)
            self._write_index(
                self.time_index_name, self.times.encode(), self._times_written, TIME_ENTRY_SIZE
            )
            self._times_written = len(self.times)
            self._files_cut = False

    def flush(self) -> None:
        """Make the log durable (fsync), and the aborted-transaction index
        with it if it changed since the last flush.

        The offset and time index files are written and synced on
        :meth:`close` (a roll closes the old segment before the recovery
        point passes it).  They are never trusted over the log: after an
        unclean shutdown every segment from the one holding the recovery
        point, which includes the active one, is recovered with both indexes
        rebuilt from its batches (``LogLoader`` via ``LogSegment.recover``),
        and an older segment's files, synced when it was closed, are checked
        against its log on open and rebuilt if suspect.  Kafka's indexes are
        memory-mapped and flushed with the log; with flush.messages=1 here
        that would be three fsyncs an append instead of one."""
        self._live().sync()
        if self._txn_unsynced:
            assert self._txn_file is not None
            self._txn_file.sync()
            self._txn_unsynced = False

    def close(self) -> None:
        """Write and sync the index files if they changed, and close the log
        (not synced: call :meth:`flush` first for that)."""
        if self._closed:
            return
        self._write_indexes()
        if self._txn_file is not None:
            self._txn_file.close()
            self._txn_file = None
        self._log.close()
        self._closed = True

    # -- the aborted-transaction index --------------------------------------------

    def _txn_handle(self) -> LogFile:
        """The ``.txnindex`` file, created if it is missing (a rebuild)."""
        handle = self._txn_file
        if handle is None:
            name = self.txn_index_name
            if self.directory.exists(name):
                handle = self.directory.open(name)
            else:
                handle = self.directory.create(name)
                self.directory.sync_directory()
            self._txn_file = handle
        return handle

    def _loaded_aborted(self) -> list[AbortedTxn]:
        if self._aborted is None:
            self._live()
            name = self.txn_index_name
            if not self.directory.exists(name):
                raise PartitionLogError(
                    Errors.KAFKA_STORAGE_ERROR, f"{name}: the segment's {self.name} has none"
                )
            handle = self._txn_handle()
            entries = decode_entries(handle.read(0, handle.size), name)
            for number, txn in enumerate(entries):
                # TransactionIndex.sanityCheck: no marker below the base.
                if txn.last_offset < self.base_offset:
                    raise PartitionLogError(
                        Errors.KAFKA_STORAGE_ERROR,
                        f"{name}: entry {number}'s last offset {txn.last_offset} is below "
                        f"the segment's base offset {self.base_offset}",
                    )
            self._aborted = entries
        return self._aborted

    def aborted_transactions(self) -> tuple[AbortedTxn, ...]:
        """The entries of the aborted-transaction index, in marker order; a
        :class:`PartitionLogError` (``KAFKA_STORAGE_ERROR``) naming the file
        and the entry if it is missing or damaged (the log then rebuilds it
        from its batches)."""
        return tuple(self._loaded_aborted())

    def append_aborted(self, txn: AbortedTxn) -> None:
        """Record a transaction whose ``ABORT`` marker was just appended to
        this segment (``LogSegment.updateTxnIndex``): the entry reaches the
        OS now and is synced by the next :meth:`flush`."""
        entries = self._loaded_aborted()
        if not self.base_offset <= txn.last_offset < self.next_offset or (
            entries and txn.last_offset <= entries[-1].last_offset
        ):
            raise PartitionLogError(
                Errors.KAFKA_STORAGE_ERROR,
                f"{self.txn_index_name}: an entry with last offset {txn.last_offset} does not "
                f"follow the segment's entries and offsets [{self.base_offset}, "
                f"{self.next_offset})",
            )
        self._txn_handle().append(encode_entry(txn))
        entries.append(txn)
        self._txn_unsynced = True

    def rewrite_aborted(self, entries: Sequence[AbortedTxn]) -> None:
        """Make the aborted-transaction index exactly ``entries`` (in marker
        order, at or past the base): a rebuild from the log.  Synced by the
        next :meth:`flush`."""
        self._live()
        data = _encode_aborted(self.txn_index_name, self.base_offset, entries)
        handle = self._txn_handle()
        handle.truncate(0)
        handle.append(data)
        self._aborted = list(entries)
        self._txn_unsynced = True

    def _truncate_aborted(self, offset: int) -> None:
        """Drop the entries whose marker is at or past ``offset``
        (``TransactionIndex.truncateTo``).  A missing file has nothing to
        cut (the log's open rebuilds it)."""
        if self._aborted is None and not self.directory.exists(self.txn_index_name):
            return
        entries = self._loaded_aborted()
        kept = truncated(entries, offset)
        if len(kept) != len(entries):
            # The entries are in marker order: those kept are a prefix.
            self._txn_handle().truncate(len(kept) * ENTRY_SIZE)
            self._aborted = kept
            self._txn_unsynced = True

"""Reading a partition directory as an operator does (Kafka's
``DumpLogSegments``, ``kafka-dump-log.sh``): :func:`dump` describes the
batches of one segment or of a whole partition directory, and optionally
their records, index entries, leader-epoch checkpoint and producer
snapshots; :func:`check` verifies them and returns a list of
:class:`Finding`, each naming the file, the position or offset, and what is
wrong.

Both only read, through the file seam (:mod:`partition_log.files`): the
files are unchanged, even where :meth:`PartitionLog.open` would cut, rebuild
or delete.  The parsing is the package's own (``BatchScanner``, ``verify``,
``decode_records``, the index decoders, ``decode_checkpoint``,
``decode_snapshot``), so what the tool reports is what the log would read.
A segment is read a bounded chunk at a time, so checking a large log holds
one chunk and the index entries of one segment, never the whole log.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass

from partition_log.batch import (
    LOG_OVERHEAD,
    BatchHeader,
    BatchScanner,
    ScanEnd,
    decode_records,
    verify,
)
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, EpochEntry, decode_checkpoint, derive
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory
from partition_log.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset
from partition_log.log_files import (
    CLEANER_OFFSET_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    classify,
    decode_offset,
    read_whole,
)
from partition_log.producer_state import ProducerSnapshot, decode_snapshot
from partition_log.records import Record
from partition_log.segment import (
    INDEX_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    file_name,
    parse_log_name,
)
from partition_log.txn_index import decode_entries

__all__ = [
    "BatchInfo",
    "DirectoryDump",
    "Finding",
    "FindingKind",
    "IndexEntries",
    "SegmentBatches",
    "SegmentDump",
    "check",
    "dump",
    "dump_files",
    "dump_segment",
    "index_entries",
    "readable_bytes",
    "segment_names",
]

# How much of a segment is read at a time (more for a larger batch).
CHUNK_BYTES = 1 << 20
INT32_MAX = (1 << 31) - 1


class FindingKind(enum.Enum):
    """What :func:`check` found wrong."""

    CORRUPT_BATCH = "corrupt batch"  # a CRC, length, magic or count that does not hold
    TORN_TAIL = "torn tail"  # the file ends inside a batch
    OFFSETS = "offsets"  # offsets that go back, leave a gap or leave the segment's range
    INDEX = "index"  # an index file or entry that disagrees with the log
    EPOCH_CHECKPOINT = "epoch checkpoint"  # the checkpoint is not the cache the batches give
    CHECKPOINT = "checkpoint"  # an offset checkpoint that does not decode or is past the end
    SNAPSHOT = "producer snapshot"  # a snapshot that does not decode
    UNKNOWN_FILE = "unknown file"  # a file that is no part of a log


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong: the file, where in it (a byte position, an offset, or
    both when known) and what."""

    kind: FindingKind
    file: str
    what: str
    position: int | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = []
        if self.position is not None:
            where.append(f"position {self.position}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        at = f" at {', '.join(where)}" if where else ""
        return f"{self.file}{at}: {self.kind.value}: {self.what}"

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.name.lower(),
            "file": self.file,
            "position": self.position,
            "offset": self.offset,
            "what": self.what,
        }


def readable_bytes(data: bytes | None) -> dict[str, str] | None:
    """A key, value or header value as JSON can carry it: ``{"utf8": text}``
    when the bytes decode as UTF-8 to printable text, else ``{"hex": ...}``;
    ``None`` for null."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": data.hex()}
    if text.isprintable():
        return {"utf8": text}
    return {"hex": data.hex()}


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """One batch of a segment file as stored: its header, where it is, and
    whether its CRC holds; its records when asked (``None`` otherwise, or
    ``records_error`` when they do not decode)."""

    file: str
    position: int
    header: BatchHeader
    crc_error: str | None
    records: tuple[Record, ...] | None = None
    records_error: str | None = None

    @property
    def crc_valid(self) -> bool:
        return self.crc_error is None

    def to_dict(self) -> dict[str, object]:
        h = self.header
        try:
            compression = h.compression.name.lower()
        except PartitionLogError:
            compression = f"unknown ({h.attributes & 0x07})"
        out: dict[str, object] = {
            "position": self.position,
            "base_offset": h.base_offset,
            "last_offset": h.last_offset,
            "count": h.records_count,
            "size": h.size,
            "leader_epoch": h.partition_leader_epoch,
            "producer_id": h.producer_id,
            "producer_epoch": h.producer_epoch,
            "base_sequence": h.base_sequence,
            "last_sequence": h.last_sequence,
            "transactional": h.is_transactional,
            "control": h.is_control,
            "timestamp_type": h.timestamp_type.name.lower(),
            "base_timestamp": h.base_timestamp,
            "max_timestamp": h.max_timestamp,
            "delete_horizon_ms": h.delete_horizon_ms,
            "compression": compression,
            "crc": f"0x{h.crc:08x}",
            "crc_valid": self.crc_valid,
        }
        if self.crc_error is not None:
            out["crc_error"] = self.crc_error
        if self.records is not None:
            out["records"] = [_record_dict(r) for r in self.records]
        if self.records_error is not None:
            out["records_error"] = self.records_error
        return out


def _record_dict(record: Record) -> dict[str, object]:
    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": readable_bytes(record.key),
        "value": readable_bytes(record.value),
        "headers": [{"key": k, "value": readable_bytes(v)} for k, v in record.headers],
    }


@dataclass(frozen=True, slots=True)
class IndexEntries:
    """A segment's index entries as its files hold them (``None`` for a
    missing file; ``*_error`` when one does not decode)."""

    offset_index: tuple[OffsetPosition, ...] | None
    offset_index_error: str | None
    time_index: tuple[TimestampOffset, ...] | None
    time_index_error: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "offset_index": None
            if self.offset_index is None
            else [{"offset": e.offset, "position": e.position} for e in self.offset_index],
            "offset_index_error": self.offset_index_error,
            "time_index": None
            if self.time_index is None
            else [{"timestamp": e.timestamp, "offset": e.offset} for e in self.time_index],
            "time_index_error": self.time_index_error,
        }


@dataclass(frozen=True, slots=True)
class SegmentDump:
    """A segment file: its batches up to the first that is torn or damaged
    (``end`` says which, ``stop_position`` where, ``reason`` what), and its
    index entries when asked."""

    file: str
    base_offset: int
    size: int
    batches: tuple[BatchInfo, ...]
    end: ScanEnd
    stop_position: int
    reason: str | None
    indexes: IndexEntries | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "file": self.file,
            "base_offset": self.base_offset,
            "size": self.size,
            "end": self.end.value,
            "stop_position": self.stop_position,
            "reason": self.reason,
            "batches": [b.to_dict() for b in self.batches],
        }
        if self.indexes is not None:
            out.update(self.indexes.to_dict())
        return out


@dataclass(frozen=True, slots=True)
class DirectoryDump:
    """A partition directory: its segments in offset order, its other files,
    and (when asked) the epoch checkpoint and the producer snapshots."""

    segments: tuple[SegmentDump, ...]
    other_files: tuple[str, ...]
    epoch_checkpoint: tuple[EpochEntry, ...] | None = None
    epoch_checkpoint_error: str | None = None
    snapshots: tuple[tuple[str, ProducerSnapshot | None, str | None], ...] = ()

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "segments": [s.to_dict() for s in self.segments],
            "other_files": list(self.other_files),
        }
        if self.epoch_checkpoint is not None or self.epoch_checkpoint_error is not None:
            out["leader_epoch_checkpoint"] = (
                None
                if self.epoch_checkpoint is None
                else [
                    {"epoch": e.epoch, "start_offset": e.start_offset}
                    for e in self.epoch_checkpoint
                ]
            )
            out["leader_epoch_checkpoint_error"] = self.epoch_checkpoint_error
        if self.snapshots:
            out["producer_snapshots"] = [
                {"file": name, "error": error, "snapshot": _snapshot_dict(snapshot)}
                for name, snapshot, error in self.snapshots
            ]
        return out


def _snapshot_dict(snapshot: ProducerSnapshot | None) -> dict[str, object] | None:
    if snapshot is None:
        return None
    return {
        "offset": snapshot.offset,
        "producers": [
            {
                "producer_id": p.producer_id,
                "epoch": p.epoch,
                "last_timestamp": p.last_timestamp,
                "batches": [
                    {
                        "first_sequence": b.first_seq,
                        "last_sequence": b.last_seq,
                        "first_offset": b.first_offset,
                        "last_offset": b.last_offset,
                        "timestamp": b.timestamp,
                    }
                    for b in p.batches
                ],
            }
            for p in snapshot.producers
        ],
    }


# -- reading ------------------------------------------------------------------------


def _not_a_log(message: str) -> PartitionLogError:
    return PartitionLogError(Errors.KAFKA_STORAGE_ERROR, message)


def _segment_base(name: str) -> int | None:
    try:
        return parse_log_name(name)
    except PartitionLogError:
        return None


class _Walk:
    """The batches of a segment file, a bounded chunk at a time, with their
    bytes; the CRC is left to the caller (``verify``) so a batch with a bad
    CRC is reported and the walk goes on past it, as ``DumpLogSegments``
    does.  Afterwards ``end``, ``position`` and ``reason`` say where and why
    it stopped (the scanner's, with file positions)."""

    def __init__(self, directory: FileDirectory, name: str) -> None:
        self.directory = directory
        self.name = name
        self.size = 0
        self.end = ScanEnd.COMPLETE
        self.position = 0
        self.reason: str | None = None

    def __iter__(self) -> Iterator[tuple[int, memoryview, BatchHeader]]:
        handle = self.directory.open(self.name)
        try:
            size = self.size = handle.size
            position = 0
            want = CHUNK_BYTES
            while True:
                buffer = handle.read(position, min(want, size - position))
                view = memoryview(buffer)
                scanner = BatchScanner(view, check_crc=False)
                for batch in scanner:
                    yield position + batch.position, view[batch.position : batch.end], batch.header
                consumed = scanner.position
                more = position + len(buffer) < size
                if scanner.end is ScanEnd.COMPLETE and more:
                    position += consumed
                    want = CHUNK_BYTES
                    continue
                if scanner.end is ScanEnd.TRUNCATED and more:
                    # The batch crosses the chunk's end: read from its start,
                    # and enough for all of it.
                    position += consumed
                    left = len(buffer) - consumed
                    want = CHUNK_BYTES
                    if left >= LOG_OVERHEAD:
                        length = int.from_bytes(buffer[consumed + 8 : consumed + 12], "big")
                        want = max(want, length + LOG_OVERHEAD)
                    continue
                assert scanner.end is not None
                self.end = scanner.end
                self.position = position + consumed
                if scanner.error is not None:
                    # The scanner names positions in its chunk: name the file's.
                    self.reason = _in_file(str(scanner.error.args[0]), position)
                return
        finally:
            handle.close()


def _in_file(message: str, chunk_start: int) -> str:
    """A scanner's message about a chunk read from ``chunk_start``, with the
    position it names made the file's."""
    return re.sub(
        r"at position (\d+)",
        lambda m: f"at position {chunk_start + int(m.group(1))}",
        message,
        count=1,
    )


def _crc_error(batch: memoryview) -> str | None:
    try:
        verify(batch, records=False)
    except PartitionLogError as error:
        return str(error.args[0])
    return None


def _load_index(
    directory: FileDirectory, name: str, index: OffsetIndex | TimeIndex
) -> tuple[bool, str | None]:
    """Whether the index file exists, and why it does not decode (or None)."""
    if not directory.exists(name):
        return False, None
    try:
        index.load(read_whole(directory, name))
    except PartitionLogError as error:
        return True, str(error.args[0])
    return True, None


class SegmentBatches:
    """The batches of the segment file ``name`` as :class:`BatchInfo`, read a
    chunk at a time (and with ``records`` their records decoded), so a
    caller that prints them as they come holds one chunk, never the
    segment.  Once iterated, ``end``, ``stop_position`` and ``reason`` say
    where and why the walk stopped, and ``size`` the file's size."""

    def __init__(self, directory: FileDirectory, name: str, *, records: bool = False) -> None:
        base = _segment_base(name)
        if base is None or not directory.exists(name):
            raise _not_a_log(
                f"{name!r} is not a segment file (20 digits of base offset, then .log)"
            )
        self.name = name
        self.base_offset = base
        self._records = records
        self._walk = _Walk(directory, name)

    def __iter__(self) -> Iterator[BatchInfo]:
        for position, view, header in self._walk:
            decoded: tuple[Record, ...] | None = None
            records_error = None
            if self._records:
                try:
                    decoded = decode_records(view)
                except PartitionLogError as error:
                    records_error = str(error.args[0])
            yield BatchInfo(self.name, position, header, _crc_error(view), decoded, records_error)

    @property
    def size(self) -> int:
        return self._walk.size

    @property
    def end(self) -> ScanEnd:
        return self._walk.end

    @property
    def stop_position(self) -> int:
        return self._walk.position

    @property
    def reason(self) -> str | None:
        return self._walk.reason


def index_entries(directory: FileDirectory, base_offset: int) -> IndexEntries:
    """The offset and time index entries of the segment at ``base_offset``."""
    offsets, times = OffsetIndex(base_offset, 1 << 62), TimeIndex(base_offset, 1 << 62)
    offset_entries: tuple[OffsetPosition, ...] | None = None
    time_entries: tuple[TimestampOffset, ...] | None = None
    found, offset_error = _load_index(directory, file_name(base_offset, INDEX_SUFFIX), offsets)
    if found and offset_error is None:
        offset_entries = tuple(offsets.entry(i) for i in range(len(offsets)))
    found, time_error = _load_index(directory, file_name(base_offset, TIME_INDEX_SUFFIX), times)
    if found and time_error is None:
        time_entries = tuple(times.entry(i) for i in range(len(times)))
    return IndexEntries(offset_entries, offset_error, time_entries, time_error)


def dump_segment(
    directory: FileDirectory, name: str, *, records: bool = False, indexes: bool = False
) -> SegmentDump:
    """The batches of the segment file ``name`` (and with ``records`` their
    records, with ``indexes`` its index entries), all in memory: see
    :class:`SegmentBatches` to stream them."""
    walk = SegmentBatches(directory, name, records=records)
    batches = tuple(walk)
    return SegmentDump(
        name,
        walk.base_offset,
        walk.size,
        batches,
        walk.end,
        walk.stop_position,
        walk.reason,
        index_entries(directory, walk.base_offset) if indexes else None,
    )


def _classify(names: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """Segment log names, snapshot names, the other files of a log (index
    files, checkpoints, and the ``.deleted``, ``.cleaned``, ``.swap`` and
    ``.tmp`` files of interrupted operations), and unknown files: by the
    log's own rule (``log_files.classify``), one name at a time so that every
    unknown file is named, not only the first."""
    logs, snapshots, others, unknown = [], [], [], []
    for name in names:
        try:
            listing = classify([name])
        except PartitionLogError:
            unknown.append(name)
            continue
        if listing.logs:
            logs.append(name)
        elif listing.snapshots:
            snapshots.append(name)
        else:
            others.append(name)
    return logs, snapshots, others, unknown


def segment_names(directory: FileDirectory) -> list[str]:
    """The segment files of a partition directory in offset order; refuses a
    directory without any (not a log)."""
    return _names_of_log(directory)[0]


def _names_of_log(directory: FileDirectory) -> tuple[list[str], list[str], list[str], list[str]]:
    classified = _classify(directory.list())
    if not classified[0]:
        raise _not_a_log(
            "not a partition directory: it holds no segment file (20 digits of base offset, "
            "then .log)"
        )
    return classified


def dump(
    directory: FileDirectory,
    *,
    records: bool = False,
    indexes: bool = False,
    state: bool = False,
) -> DirectoryDump:
    """Every segment of a partition directory, in offset order (see
    :func:`dump_segment`), its other files, and with ``state`` its
    leader-epoch checkpoint and producer snapshots."""
    segments = tuple(
        dump_segment(directory, name, records=records, indexes=indexes)
        for name in segment_names(directory)
    )
    return dataclasses.replace(dump_files(directory, state=state), segments=segments)


def dump_files(directory: FileDirectory, *, state: bool = False) -> DirectoryDump:
    """A partition directory's files but the segments (``segments`` is
    empty): the other files, and with ``state`` the leader-epoch checkpoint
    and the producer snapshots."""
    _, snapshot_names, others, unknown = _names_of_log(directory)
    epochs: tuple[EpochEntry, ...] | None = None
    epochs_error = None
    snapshots: list[tuple[str, ProducerSnapshot | None, str | None]] = []
    if state:
        if directory.exists(CHECKPOINT_FILE_NAME):
            try:
                epochs = decode_checkpoint(read_whole(directory, CHECKPOINT_FILE_NAME))
            except PartitionLogError as error:
                epochs_error = str(error.args[0])
        for name in snapshot_names:
            try:
                snapshots.append((name, decode_snapshot(read_whole(directory, name)), None))
            except PartitionLogError as error:
                snapshots.append((name, None, str(error.args[0])))
    return DirectoryDump(
        (), tuple(sorted(others + unknown)), epochs, epochs_error, tuple(snapshots)
    )


# -- checking -----------------------------------------------------------------------


class _IndexCheck:
    """Checks a segment's index entries against its batches as they stream
    by (both in position and offset order), so nothing per batch is kept."""

    def __init__(self, directory: FileDirectory, base: int, findings: list[Finding]) -> None:
        self.findings = findings
        self.offsets = OffsetIndex(base, 1 << 62)
        self.times = TimeIndex(base, 1 << 62)
        self.offset_name = file_name(base, INDEX_SUFFIX)
        self.time_name = file_name(base, TIME_INDEX_SUFFIX)
        for name, index in ((self.offset_name, self.offsets), (self.time_name, self.times)):
            _, error = _load_index(directory, name, index)
            if error is not None:
                # Entries that do not increase, or a size not whole entries.
                findings.append(Finding(FindingKind.INDEX, name, error))
                index.clear()
        self.next_offset_entry = 0
        self.next_time_entry = 0
        self.max_timestamp = -1

    def _bad_offset_entry(self, entry: OffsetPosition, what: str) -> None:
        self.findings.append(
            Finding(
                FindingKind.INDEX,
                self.offset_name,
                f"entry {self.next_offset_entry} (offset {entry.offset}, position "
                f"{entry.position}) {what}",
                entry.position,
                entry.offset,
            )
        )
        self.next_offset_entry += 1

    def _bad_time_entry(self, entry: TimestampOffset, what: str) -> None:
        self.findings.append(
            Finding(
                FindingKind.INDEX,
                self.time_name,
                f"entry {self.next_time_entry} (timestamp {entry.timestamp}, offset "
                f"{entry.offset}) {what}",
                None,
                entry.offset,
            )
        )
        self.next_time_entry += 1

    def batch(self, position: int, header: BatchHeader, crc_valid: bool) -> None:
        offsets, times = self.offsets, self.times
        while self.next_offset_entry < len(offsets):
            entry = offsets.entry(self.next_offset_entry)
            if entry.position > position:
                break
            if entry.position < position:
                self._bad_offset_entry(entry, "does not point at the start of a batch")
            elif entry.offset != header.last_offset:
                self._bad_offset_entry(
                    entry,
                    f"points at the batch of offsets {header.base_offset}..{header.last_offset}, "
                    f"whose last offset is {header.last_offset}",
                )
            else:
                self.next_offset_entry += 1
        # A batch whose CRC fails is reported already; its timestamps are not
        # to be believed, so they neither count nor judge an entry.
        if crc_valid:
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        while self.next_time_entry < len(times):
            time_entry = times.entry(self.next_time_entry)
            if time_entry.offset > header.last_offset:
                break
            if not crc_valid and time_entry.offset == header.last_offset:
                self.next_time_entry += 1
            elif time_entry.offset < header.last_offset:
                self._bad_time_entry(time_entry, "is not the last offset of a batch")
            elif time_entry.timestamp != header.max_timestamp or (
                time_entry.timestamp != self.max_timestamp
            ):
                self._bad_time_entry(
                    time_entry,
                    f"disagrees with its batch's max timestamp {header.max_timestamp} "
                    f"(the largest so far {self.max_timestamp})",
                )
            else:
                self.next_time_entry += 1

    def finish(self, valid_end: int, next_offset: int) -> None:
        while self.next_offset_entry < len(self.offsets):
            entry = self.offsets.entry(self.next_offset_entry)
            self._bad_offset_entry(
                entry, f"points past the last whole batch (which ends at position {valid_end})"
            )
        while self.next_time_entry < len(self.times):
            time_entry = self.times.entry(self.next_time_entry)
            self._bad_time_entry(
                time_entry, f"is past the last whole batch (the log ends before {next_offset})"
            )


@dataclass
class _LogState:
    """What the checks across segments carry: the offset the next batch
    should start at, and the (base offset, epoch) of each batch whose epoch
    differs from the previous one (enough to derive the epoch cache)."""

    compacted: bool
    expected: int | None = None
    epochs: list[tuple[int, int]] | None = None
    last_epoch: int | None = None
    first_offset: int | None = None


def _check_segment(
    directory: FileDirectory, name: str, state: _LogState, findings: list[Finding]
) -> None:
    base = _segment_base(name)
    assert base is not None
    if state.expected is not None and base < state.expected:
        findings.append(
            Finding(
                FindingKind.OFFSETS,
                name,
                f"the segment starts at offset {base}, inside the previous one, which ends "
                f"at {state.expected}",
                offset=base,
            )
        )
    elif state.expected is not None and base > state.expected and not state.compacted:
        findings.append(
            Finding(
                FindingKind.OFFSETS,
                name,
                f"the segment starts at offset {base}, leaving a gap after the previous one, "
                f"which ends at {state.expected}",
                offset=base,
            )
        )
    expected = base
    indexes = _IndexCheck(directory, base, findings)
    walk = _Walk(directory, name)
    for position, view, header in walk:
        error = _crc_error(view)
        if error is not None:
            findings.append(
                Finding(FindingKind.CORRUPT_BATCH, name, error, position, header.base_offset)
            )
        problem = None
        if header.base_offset < expected:
            problem = f"batch base offset {header.base_offset} is below the expected {expected}"
        elif header.base_offset > expected and not state.compacted:
            problem = f"batch base offset {header.base_offset} leaves a gap after {expected - 1}"
        elif header.last_offset - base > INT32_MAX:
            problem = (
                f"batch last offset {header.last_offset} does not fit as an int32 relative "
                f"to the segment's base {base}"
            )
        if problem is not None:
            findings.append(
                Finding(FindingKind.OFFSETS, name, problem, position, header.base_offset)
            )
        expected = max(expected, header.next_offset)
        indexes.batch(position, header, error is None)
        if state.first_offset is None:
            state.first_offset = header.base_offset
        epoch = header.partition_leader_epoch
        if epoch != state.last_epoch:
            assert state.epochs is not None
            state.epochs.append((header.base_offset, epoch))
            state.last_epoch = epoch
    if walk.end is ScanEnd.TRUNCATED:
        findings.append(
            Finding(
                FindingKind.TORN_TAIL,
                name,
                f"the file ends inside a batch: {walk.size - walk.position} bytes past the last "
                f"whole batch ({walk.reason})",
                walk.position,
                expected,
            )
        )
    elif walk.end is ScanEnd.CORRUPT:
        findings.append(
            Finding(
                FindingKind.CORRUPT_BATCH,
                name,
                f"{walk.reason}; {walk.size - walk.position} bytes from here are not read",
                walk.position,
                expected,
            )
        )
    indexes.finish(walk.position, expected)
    _check_txn_index(directory, base, expected, state.compacted, findings)
    state.expected = expected


def _check_txn_index(
    directory: FileDirectory, base: int, end: int, compacted: bool, findings: list[Finding]
) -> None:
    """The segment's aborted-transaction index decodes (whole entries, in
    marker order) and each marker lies in the segment: at or past its base
    and, unless the log is compacted (the cleaner may drop a marker whose
    entry it keeps), below its end ``end``.  A missing file is no finding:
    the log rebuilds it on open, as it does a damaged one."""
    name = file_name(base, TXN_INDEX_SUFFIX)
    if not directory.exists(name):
        return
    try:
        entries = decode_entries(read_whole(directory, name), name)
    except PartitionLogError as error:
        findings.append(Finding(FindingKind.INDEX, name, str(error.args[0])))
        return
    for number, txn in enumerate(entries):
        if txn.last_offset < base or (not compacted and txn.last_offset >= end):
            findings.append(
                Finding(
                    FindingKind.INDEX,
                    name,
                    f"entry {number} (producer {txn.producer_id}, offsets {txn.first_offset}.."
                    f"{txn.last_offset}) has its marker outside the segment's offsets "
                    f"[{base}, {end})",
                    offset=txn.last_offset,
                )
            )


def _check_offset_files(
    directory: FileDirectory, log_end: int | None, findings: list[Finding]
) -> int | None:
    """The offset checkpoints decode, and the recovery point and the log start
    offset are not past the log end (every byte below the recovery point was
    synced; the log start never passes the end); returns the log start
    offset, if its file is there and decodes."""
    log_start = None
    for name in (RECOVERY_POINT_FILE, LOG_START_OFFSET_FILE, CLEANER_OFFSET_FILE):
        if not directory.exists(name):
            continue
        try:
            offset = decode_offset(name, read_whole(directory, name))
        except PartitionLogError as error:
            findings.append(Finding(FindingKind.CHECKPOINT, name, str(error.args[0])))
            continue
        if name == LOG_START_OFFSET_FILE:
            log_start = offset
        if name != CLEANER_OFFSET_FILE and log_end is not None and offset > log_end:
            findings.append(
                Finding(
                    FindingKind.CHECKPOINT,
                    name,
                    f"offset {offset} is past the log end {log_end}",
                    offset=offset,
                )
            )
    return log_start


def _check_epochs(
    directory: FileDirectory, state: _LogState, log_start: int | None, findings: list[Finding]
) -> None:
    """The leader-epoch checkpoint equals the cache derived from the batches
    (``LogLoader``'s rebuild), or that plus one entry at the log end: a new
    leader assigns its epoch at its log end before any batch (KIP-279)."""
    assert state.epochs is not None
    # The cache follows the log start when it lies inside the first batches
    # (DeleteRecords, retention: truncate_from_start).
    start = log_start
    if start is None or state.first_offset is None or start < state.first_offset:
        start = None
    derived = derive(state.epochs, start).entries
    end = state.expected
    assert end is not None  # a log has a segment
    if not directory.exists(CHECKPOINT_FILE_NAME):
        if any(e.start_offset < end for e in derived):
            findings.append(
                Finding(
                    FindingKind.EPOCH_CHECKPOINT,
                    CHECKPOINT_FILE_NAME,
                    f"missing, while the batches give the epochs {_entries_text(derived)}",
                )
            )
        return
    try:
        stored = decode_checkpoint(read_whole(directory, CHECKPOINT_FILE_NAME))
    except PartitionLogError as error:
        findings.append(
            Finding(FindingKind.EPOCH_CHECKPOINT, CHECKPOINT_FILE_NAME, str(error.args[0]))
        )
        return
    if _agrees(stored, derived, end, state.compacted):
        return
    first_difference = next(
        (i for i, (a, b) in enumerate(zip(stored, derived, strict=False)) if a != b),
        min(len(stored), len(derived)),
    )
    offset = None
    if first_difference < len(stored):
        offset = stored[first_difference].start_offset
    elif first_difference < len(derived):
        offset = derived[first_difference].start_offset
    findings.append(
        Finding(
            FindingKind.EPOCH_CHECKPOINT,
            CHECKPOINT_FILE_NAME,
            f"holds {_entries_text(stored)} but the batches give {_entries_text(derived)}",
            offset=offset,
        )
    )


def _agrees(
    stored: tuple[EpochEntry, ...], derived: tuple[EpochEntry, ...], end: int, compacted: bool
) -> bool:
    """Whether the checkpoint's entries below the log end are the derived
    ones (in a compacted log: hold them, :func:`_within`), with at most one
    more entry, at the log end: a new leader's epoch before its first batch
    (KIP-279), or the entry the log start moved to the end (DeleteRecords up
    to the end), which a truncation to the end removes."""
    kept = tuple(e for e in stored if e.start_offset < end)
    tail = stored[len(kept) :]
    if len(tail) > 1 or (tail and tail[0].start_offset != end):
        return False
    below = tuple(e for e in derived if e.start_offset < end)
    return kept == below or (compacted and _within(kept, below))


def _within(stored: tuple[EpochEntry, ...], derived: tuple[EpochEntry, ...]) -> bool:
    """Whether each derived entry lies inside the stored span of its epoch:
    compaction may remove an epoch's first batches, or all of them, while the
    cache keeps the offsets the epochs started at (the cleaner does not
    touch it, ``LogCleaner``)."""
    spans = {
        entry.epoch: (entry.start_offset, after.start_offset if after else None)
        for entry, after in zip(stored, (*stored[1:], None), strict=True)
    }
    for entry in derived:
        span = spans.get(entry.epoch)
        if span is None or entry.start_offset < span[0]:
            return False
        if span[1] is not None and entry.start_offset >= span[1]:
            return False
    return True


def _entries_text(entries: tuple[EpochEntry, ...]) -> str:
    if not entries:
        return "no epochs"
    return ", ".join(f"epoch {e.epoch} from {e.start_offset}" for e in entries)


def _check_snapshot(directory: FileDirectory, name: str, findings: list[Finding]) -> None:
    offset = int(name[:20])
    try:
        snapshot = decode_snapshot(read_whole(directory, name))
    except PartitionLogError as error:
        findings.append(Finding(FindingKind.SNAPSHOT, name, str(error.args[0]), offset=offset))
        return
    if snapshot.offset != offset:
        findings.append(
            Finding(
                FindingKind.SNAPSHOT,
                name,
                f"the snapshot says it was taken at offset {snapshot.offset}, its name {offset}",
                offset=offset,
            )
        )


def check(
    directory: FileDirectory, segment: str | None = None, *, compacted: bool | None = None
) -> list[Finding]:
    """What is wrong with a partition directory (or with only its segment
    file ``segment`` and that segment's indexes): batches whose CRC or
    fields do not hold, a torn tail, offsets that go back or (unless the log
    is ``compacted``: by default, when it has a cleaner checkpoint) leave
    gaps within and across segments, index entries that do not point at a
    batch's start with its last offset, a leader-epoch checkpoint that is
    not the cache the batches give, aborted-transaction indexes that do not
    decode or name a marker outside their segment, producer snapshots that
    do not decode, and files that are no part of a log.  An empty list:
    nothing found."""
    findings: list[Finding] = []
    if compacted is None:
        compacted = directory.exists(CLEANER_OFFSET_FILE)
    if segment is not None:
        if _segment_base(segment) is None or not directory.exists(segment):
            raise _not_a_log(
                f"{segment!r} is not a segment file (20 digits of base offset, then .log)"
            )
        state = _LogState(compacted, epochs=[])
        _check_segment(directory, segment, state, findings)
        return findings
    logs, snapshots, _, unknown = _names_of_log(directory)
    for name in unknown:
        findings.append(
            Finding(
                FindingKind.UNKNOWN_FILE,
                name,
                "no part of a log (segment, index, snapshot, checkpoint, or a .deleted, "
                ".cleaned, .swap or .tmp file of an interrupted operation)",
            )
        )
    state = _LogState(compacted, epochs=[])
    for name in logs:
        _check_segment(directory, name, state, findings)
    log_start = _check_offset_files(directory, state.expected, findings)
    _check_epochs(directory, state, log_start, findings)
    for name in snapshots:
        _check_snapshot(directory, name, findings)
    return findings

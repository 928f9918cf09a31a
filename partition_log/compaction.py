"""Log compaction's decisions (Kafka's ``LogCleaner``/``Cleaner``, brokers.md §2.6).

"A message with key K and offset O is obsolete if there exists a message with
key K and offset O' such that O < O'" (``LogCleaner``'s class comment).  The
cleaner maps each key of the dirty part of a log to its last offset
(:class:`OffsetMap`, :func:`build_offset_map`), then recopies the log's
segments batch by batch through :func:`clean_batch`, which keeps:

- every record that is not obsolete, except a tombstone (null value) whose
  batch's delete horizon has passed (KIP-534: the horizon is set, as
  ``now + delete.retention.ms``, the first time a cleaning keeps a tombstone);
- every record past the end of the map (a map that filled up stops early);
- control batches until their delete horizon passes (as tombstones);
- the last batch of each producer id, empty if all its records go ("we always
  retain the last batch from each producerId", so a producer's sequence
  survives cleaning);

and keeps offsets (the base offset and the last offset delta of every batch
that stays), order, the producer id, epoch and base sequence, the partition
leader epoch and the compression (``MemoryRecords.filterTo``).

Which log to clean and how far: :func:`cleanable_range` (``LogCleanerManager.
cleanableOffsets`` and ``LogToClean``) and :func:`choose_log`
(``grabFilthiestCompactedLog``); how to batch the segments into new ones:
:func:`group_segments_by_size` (``Cleaner.groupSegmentsBySize``).

Pure: no I/O, no clock (time is ``now_ms``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import bugs
from bugs import Bug
from partition_log.batch import (
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    BatchHeader,
    Compression,
    TimestampType,
    build_batch,
    decode_records,
    records_section,
)
from partition_log.records import INT32_MAX, decode_varint

__all__ = [
    "DEFAULT_DEDUPE_BUFFER_BYTES",
    "ENTRY_OVERHEAD_BYTES",
    "CleanableRange",
    "OffsetMap",
    "SegmentSummary",
    "build_offset_map",
    "choose_log",
    "clean_batch",
    "cleanable_range",
    "group_segments_by_size",
]

#: Kafka's ``log.cleaner.dedupe.buffer.size`` default (128 MiB).
DEFAULT_DEDUPE_BUFFER_BYTES = 128 * 1024 * 1024
#: What an entry costs besides its key: the 8-byte offset.  Kafka's map stores
#: a 16-byte MD5 of the key and the offset (24 bytes); kq keeps the key itself
#: (no collisions to reason about) and charges its length.
ENTRY_OVERHEAD_BYTES = 8


class OffsetMap:
    """Key bytes to the last offset seen for the key (Kafka's
    ``SkimpyOffsetMap``), within a budget of ``max_bytes`` (the dedupe
    buffer): each entry costs its key's length plus
    :data:`ENTRY_OVERHEAD_BYTES`.  ``latest_offset`` is the last offset of the
    last batch mapped (-1 before any): records past it were not mapped, so
    cleaning keeps them (``Cleaner.shouldRetainRecord``'s
    ``pastLatestOffset``)."""

    __slots__ = ("_offsets", "bytes_used", "latest_offset", "max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_DEDUPE_BUFFER_BYTES) -> None:
        if max_bytes < ENTRY_OVERHEAD_BYTES:
            raise ValueError(
                f"an offset map of {max_bytes} bytes cannot hold one entry "
                f"({ENTRY_OVERHEAD_BYTES} bytes and the key)"
            )
        self.max_bytes = max_bytes
        self._offsets: dict[bytes, int] = {}
        self.bytes_used = 0
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._offsets)

    def get(self, key: bytes) -> int | None:
        return self._offsets.get(key)

    def put(self, key: bytes, offset: int) -> None:
        """Record ``offset`` as ``key``'s latest (offsets only grow per key)."""
        previous = self._offsets.get(key)
        if previous is None:
            self.bytes_used += len(key) + ENTRY_OVERHEAD_BYTES
        elif offset < previous:
            raise ValueError(f"key {key!r}: offset {offset} below the mapped {previous}")
        self._offsets[key] = offset


#: (offset, key, is a tombstone) of one record.
KeyInfo = tuple[int, bytes | None, bool]


def _walk(data: bytes, count: int, base_offset: int) -> list[KeyInfo] | None:
    """Each record's offset, key and whether its value is null, read from a
    records section without building records (a record's length skips its
    value and headers); ``None`` for anything it does not expect."""
    varint = decode_varint
    out: list[KeyInfo] = []
    append = out.append
    pos = 0
    end = len(data)
    for _ in range(count):
        b = data[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        elif data[pos + 1] < 0x80:  # two bytes: lengths up to 8 KiB
            z = (b & 0x7F) | (data[pos + 1] << 7)
            length = (z >> 1) ^ -(z & 1)
            pos += 2
        else:
            length, pos = varint(data, pos, end)
        record_end = pos + length
        if length < 3 or record_end > end:
            return None
        pos += 1  # attributes (unused); then the timestamp delta, skipped
        if data[pos] < 0x80:
            pos += 1
        else:
            _, pos = varint(data, pos, record_end, 10)
        b = data[pos]
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            offset_delta, pos = varint(data, pos, record_end)
        b = data[pos]
        if b < 0x80:
            size = (b >> 1) ^ -(b & 1)
            pos += 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            size = (z >> 1) ^ -(z & 1)
            pos += 2
        else:
            size, pos = varint(data, pos, record_end)
        if size >= 0:
            if pos + size > record_end:
                return None
            key: bytes | None = data[pos : pos + size]
            pos += size
        elif size == -1:
            key = None
        else:
            return None
        b = data[pos]
        if b < 0x80:
            size = (b >> 1) ^ -(b & 1)
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            size = (z >> 1) ^ -(z & 1)
        else:
            size, _ = varint(data, pos, record_end)
        if size < -1:
            return None
        append((base_offset + offset_delta, key, size == -1))
        pos = record_end
    return out if pos == end else None


def _keys_of(batch: bytes | bytearray | memoryview, header: BatchHeader) -> list[KeyInfo]:
    """(offset, key, tombstone) of each record of ``batch``, the speed of the
    cleaner: most records are only looked up, not rewritten."""
    section = records_section(batch)
    try:
        found = _walk(section, header.records_count, header.base_offset)
    except Exception:  # the decoder below names what is wrong
        found = None
    if found is None:
        # A section the walk does not take: the decoder gives its records,
        # or refuses it naming the record and field.
        return [(r.offset, r.key, r.value is None) for r in decode_records(batch)]
    return found


def build_offset_map(
    batches: Iterable[bytes | bytearray | memoryview], start_offset: int, offset_map: OffsetMap
) -> tuple[int, bool]:
    """Map the keys of ``batches`` (in offset order) whose offsets are at
    least ``start_offset`` (``Cleaner.buildOffsetMap``), a whole batch at a
    time.  Stops before a batch whose new keys would pass the map's budget;
    the first batch mapped is always taken whole, so a cleaning always moves
    forward (a batch's keys are bounded by ``message.max.bytes``).  Control
    batches add no key but move ``latest_offset`` past them.

    Returns the offset after the last batch mapped (where the next cleaning's
    dirty part starts) and whether the map filled up before the end."""
    for batch in batches:
        header = BatchHeader.parse(batch)
        if header.last_offset < start_offset:
            continue
        if not header.is_control:
            keyed = [
                (key, offset)
                for offset, key, _ in _keys_of(batch, header)
                if key is not None and offset >= start_offset
            ]
            new_keys = {key for key, _ in keyed if offset_map.get(key) is None}
            cost = sum(len(key) + ENTRY_OVERHEAD_BYTES for key in new_keys)
            mapped_any = offset_map.latest_offset >= 0
            if mapped_any and offset_map.bytes_used + cost > offset_map.max_bytes:
                return offset_map.latest_offset + 1, True
            for key, offset in keyed:
                offset_map.put(key, offset)
        offset_map.latest_offset = max(offset_map.latest_offset, header.last_offset)
    return max(offset_map.latest_offset + 1, start_offset), False


def _retains_deletes(header: BatchHeader, now_ms: int) -> bool:
    """A tombstone (or a control batch) stays until its batch's delete
    horizon passes; a batch without one was never cleaned with it yet."""
    horizon = header.delete_horizon_ms
    return horizon is None or now_ms < horizon


def clean_batch(
    batch: bytes,
    offset_map: OffsetMap,
    *,
    now_ms: int,
    delete_retention_ms: int,
    producer_last_offsets: Mapping[int, int],
) -> bytes | None:
    """``batch`` as a cleaning leaves it: the same bytes when every record
    stays and no delete horizon is to be set, a rewritten batch with the
    records kept, an empty batch (header only) for a producer's last batch
    whose records all go, or ``None`` when nothing of it stays
    (``MemoryRecords.filterTo`` with ``Cleaner.cleanInto``'s filter).

    ``producer_last_offsets`` maps each producer id to the last offset of its
    last batch in the log (the producer state's, as Kafka's
    ``lastRecordsOfActiveProducers``)."""
    header = BatchHeader.parse(batch)
    has_producer = header.producer_id > NO_PRODUCER_ID
    last_of_producer = (
        has_producer and producer_last_offsets.get(header.producer_id) == header.last_offset
    )
    # Kafka removes a transaction marker once its transaction has no records
    # left and its delete horizon passed; kq has no transactions yet, so a
    # control batch is kept as a tombstone is.
    discard = header.is_control and not _retains_deletes(header, now_ms)
    if discard and not last_of_producer:
        return None  # BatchRetention.DELETE
    keys = _keys_of(batch, header)
    if discard:
        keep = [False] * len(keys)
    elif header.is_control:
        keep = [True] * len(keys)
    else:
        keep = [_retains(info, header, offset_map, now_ms) for info in keys]
    if any(keep):
        sets_horizon = header.delete_horizon_ms is None and (
            header.is_control or any(k and info[2] for k, info in zip(keep, keys, strict=True))
        )
        if all(keep) and not sets_horizon:
            return batch  # writeOriginalBatch: every record stays
        if sets_horizon:
            horizon: int | None = now_ms + delete_retention_ms
        else:
            horizon = header.delete_horizon_ms
        kept = [r for r, k in zip(decode_records(batch), keep, strict=True) if k]
        if bugs.on(Bug.COMPACTION_RENUMBERS):
            # B16: the records kept take consecutive offsets from the batch's
            # base instead of their own (Kafka keeps every offset).
            kept = [replace(r, offset=header.base_offset + i) for i, r in enumerate(kept)]
        log_append_time = header.timestamp_type is TimestampType.LOG_APPEND_TIME
        # MemoryRecords.buildRetainedRecordsInto: the original codec, epoch,
        # producer fields and last offset (the last sequence stays).
        return build_batch(
            kept,
            base_offset=header.base_offset,
            partition_leader_epoch=header.partition_leader_epoch,
            compression=header.compression,
            timestamp_type=header.timestamp_type,
            max_timestamp=header.max_timestamp if log_append_time else None,
            last_offset_delta=header.last_offset_delta,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            transactional=header.is_transactional,
            control=header.is_control,
            delete_horizon_ms=horizon,
        )
    if not last_of_producer:
        return None  # BatchRetention.DELETE_EMPTY
    # BatchRetention.RETAIN_EMPTY: DefaultRecordBatch.writeEmptyHeader (no
    # records, no codec, no base timestamp, the original max timestamp).
    return build_batch(
        (),
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        compression=Compression.NONE,
        timestamp_type=header.timestamp_type,
        base_timestamp=NO_TIMESTAMP,
        max_timestamp=header.max_timestamp,
        last_offset_delta=header.last_offset_delta,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.is_transactional,
        control=header.is_control,
    )


def _retains(info: KeyInfo, header: BatchHeader, offset_map: OffsetMap, now_ms: int) -> bool:
    """``Cleaner.shouldRetainRecord`` for a data record."""
    offset, key, tombstone = info
    if offset > offset_map.latest_offset:
        return True  # not mapped: the map filled up before it
    if key is None:
        return False  # a compacted log's record needs a key; Kafka drops it too
    latest = offset_map.get(key)
    if latest is not None and offset < latest:
        return False  # obsolete
    return not tombstone or _retains_deletes(header, now_ms)


# -- which log, which segments ------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What the cleaner's choices need of one segment: its base and next
    offsets, size, largest timestamp and its first batch's max timestamp
    (``LogSegment.largestTimestamp``, ``getFirstBatchTimestamp``; ``None``
    for an empty segment)."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    first_batch_timestamp: int | None


@dataclass(frozen=True, slots=True)
class CleanableRange:
    """One log's cleaning prospects (Kafka's ``LogToClean``): the clean part
    is below ``first_dirty_offset``, the cleanable dirty part runs to
    ``first_uncleanable_offset``."""

    name: str
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int
    min_cleanable_dirty_ratio: float

    @property
    def dirty_ratio(self) -> float:
        """``cleanableRatio``: the cleanable bytes over clean and cleanable."""
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def needs_compaction_now(self) -> bool:
        """Past ``max.compaction.lag.ms`` (KIP-354)."""
        return self.max_compaction_delay_ms > 0

    @property
    def cleanable(self) -> bool:
        """``grabFilthiestCompactedLog``'s filter."""
        return (
            self.needs_compaction_now and self.cleanable_bytes > 0
        ) or self.dirty_ratio > self.min_cleanable_dirty_ratio


def _overlapping(segments: Sequence[SegmentSummary], start: int, end: int) -> list[SegmentSummary]:
    """``UnifiedLog.logSegments(from, to)``: from the segment holding
    ``start`` to the last whose base is below ``end``."""
    out: list[SegmentSummary] = []
    for index, segment in enumerate(segments):
        following = segments[index + 1].base_offset if index + 1 < len(segments) else None
        if segment.base_offset >= end:
            break
        if following is not None and following <= start:
            continue
        out.append(segment)
    return out


def cleanable_range(
    name: str,
    segments: Sequence[SegmentSummary],
    *,
    checkpoint: int | None,
    log_start_offset: int,
    log_end_offset: int,
    last_stable_offset: int,
    now_ms: int,
    min_compaction_lag_ms: int,
    max_compaction_lag_ms: int,
    min_cleanable_dirty_ratio: float,
) -> CleanableRange:
    """Where a log's dirty part starts and where cleaning must stop
    (``LogCleanerManager.cleanableOffsets``, ``maxCompactionDelay``).
    ``segments`` are the log's, the active one last.

    The dirty part starts at the cleaner checkpoint, or the log start when
    there is none or it lies outside the log (a truncation or retention moved
    past it).  Never cleaned: the active segment, anything at or past the
    last stable offset (the high watermark, or the first offset of an open
    transaction below it: a transaction's records and marker are cleaned
    only once it is decided and replicated), and
    every segment from the first whose largest timestamp is within
    ``min.compaction.lag.ms`` of now."""
    if not segments:
        raise ValueError(f"log {name}: no segments (a log has at least its active one)")
    dirty = checkpoint
    if dirty is None or dirty < log_start_offset or dirty > log_end_offset:
        dirty = log_start_offset
    active = segments[-1]
    non_active_dirty = _overlapping(segments[:-1], dirty, active.base_offset)
    bounds = [last_stable_offset, active.base_offset]
    if min_compaction_lag_ms > 0:
        for segment in non_active_dirty:
            if segment.max_timestamp > now_ms - min_compaction_lag_ms:
                bounds.append(segment.base_offset)
                break
    uncleanable = min(bounds)
    clean_bytes = sum(s.size for s in _overlapping(segments, -1, dirty))
    cleanable_bytes = sum(s.size for s in _overlapping(segments, dirty, max(dirty, uncleanable)))
    firsts = [
        s.first_batch_timestamp
        for s in non_active_dirty
        if s.first_batch_timestamp is not None and s.first_batch_timestamp > 0
    ]
    clean_until = now_ms - max_compaction_lag_ms
    earliest = min(firsts) if firsts else None
    delay = clean_until - earliest if earliest is not None and earliest < clean_until else 0
    return CleanableRange(
        name,
        dirty,
        uncleanable,
        clean_bytes,
        cleanable_bytes,
        delay,
        min_cleanable_dirty_ratio,
    )


def choose_log(candidates: Iterable[CleanableRange]) -> CleanableRange | None:
    """The dirtiest cleanable log (``grabFilthiestCompactedLog``): the
    highest dirty ratio among those above their ``min.cleanable.dirty.ratio``
    or past ``max.compaction.lag.ms`` with something to clean; the first
    given wins a tie."""
    best: CleanableRange | None = None
    for candidate in candidates:
        if candidate.cleanable and (best is None or candidate.dirty_ratio > best.dirty_ratio):
            best = candidate
    return best


def group_segments_by_size(
    segments: Sequence[SegmentSummary], max_bytes: int
) -> list[list[SegmentSummary]]:
    """Neighbouring segments merged into groups of at most ``max_bytes``
    (``segment.bytes``) whose offsets stay within an int32 of the group's
    base, so each group is cleaned into one segment whose index entries fit
    (``Cleaner.groupSegmentsBySize``; kq's index files grow from memory, so
    their size is no limit here)."""
    groups: list[list[SegmentSummary]] = []
    index = 0
    while index < len(segments):
        group = [segments[index]]
        size = segments[index].size
        index += 1
        while index < len(segments):
            following = segments[index]
            if size + following.size > max_bytes:
                break
            # An empty first segment needs no check (Kafka: "this will avoid
            # empty log left every 2 rounds").
            if group[0].size and following.next_offset - 1 - group[0].base_offset > INT32_MAX:
                break
            group.append(following)
            size += following.size
            index += 1
        groups.append(group)
    return groups

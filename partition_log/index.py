"""A segment's sparse offset index and time index (Kafka's ``OffsetIndex``
and ``TimeIndex``), kept as fixed-size entries (the time index a
``bytearray`` of the file's big-endian entries, the offset index two native
int32 arrays) so memory is one entry per ``index.interval.bytes`` of log,
never an object per batch.

Offset index entry, 8 bytes: the offset relative to the segment's base
(int32), then the position in the ``.log`` file (int32) of a batch whose last
offset is that offset.  Time index entry, 12 bytes: a timestamp (int64),
then the relative offset (int32) of the batch that raised the segment's
largest timestamp to it; "the biggest timestamp seen before O is T", so
timestamps and offsets only grow.

Indexes are never trusted over the log ("in the event of a crash it is
rebuilt", ``OffsetIndex.java``): :func:`sanity_check` says why an index is
suspect, and :class:`IndexBuilder` rebuilds both from the log's batches with
the same rule the appends use, so a rebuilt index equals the incremental one.
"""

from __future__ import annotations

import abc
import bisect
import operator
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import ClassVar, Self

from partition_log.batch import LOG_OVERHEAD, BatchHeader
from partition_log.errors import Errors, PartitionLogError

__all__ = [
    "DEFAULT_INDEX_BYTES",
    "DEFAULT_INDEX_INTERVAL_BYTES",
    "OFFSET_ENTRY_SIZE",
    "TIME_ENTRY_SIZE",
    "IndexBuilder",
    "OffsetIndex",
    "OffsetPosition",
    "TimeIndex",
    "TimestampOffset",
]

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
DEFAULT_INDEX_INTERVAL_BYTES = 4096  # index.interval.bytes
DEFAULT_INDEX_BYTES = 10 * 1024 * 1024  # segment.index.bytes
NO_TIMESTAMP = -1
INT32_MAX = (1 << 31) - 1

_OFFSET_ENTRY = struct.Struct(">ii")
_BIG_ENDIAN_HOST = sys.byteorder == "big"
# The offset index's arrays hold int32s ("i" is 4 bytes on every platform
# CPython supports, checked here rather than assumed).
assert array("i").itemsize == 4
_TIME_ENTRY = struct.Struct(">qi")


def _suspect(message: str) -> PartitionLogError:
    return PartitionLogError(Errors.CORRUPT_MESSAGE, message)


def _fields_increase(
    entry: struct.Struct, data: bytes, count: int, offset: int, other: int
) -> bool:
    """Whether both fields of the ``count`` entries strictly increase, and the
    relative offset (field ``offset``) of the first is not negative.

    Speed: opening a segment checks every entry of its index files (262,144
    of each for a 1 GiB segment at one entry per 4 KiB), so the work is done
    by C loops: one unpack of all the entries, each field a slice of it,
    compared with its own next values by ``map(operator.lt, ...)``."""
    if count == 0:
        return True
    fields = entry.format.lstrip(">")
    every = struct.unpack(">" + fields * count, data[: count * entry.size])
    relatives = every[offset :: len(fields)]
    others = every[other :: len(fields)]
    return (
        relatives[0] >= 0
        and all(map(operator.lt, relatives, relatives[1:]))
        and all(map(operator.lt, others, others[1:]))
    )


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int
    offset: int


class _EntryIndex(abc.ABC):
    """What both indexes share: fixed-size entries in one bytearray (memory
    grows with the entries, never with objects per batch), a capacity, and a
    binary search over one field of the entries."""

    _ENTRY: ClassVar[struct.Struct]
    _KIND: ClassVar[str]

    def __init__(self, base_offset: int, max_index_bytes: int = DEFAULT_INDEX_BYTES) -> None:
        self.base_offset = base_offset
        self.max_entries = max_index_bytes // self._ENTRY.size
        # The bytes max_entries take: is_full compares sizes, not counts.
        self._max_bytes = self.max_entries * self._ENTRY.size
        self._entries = bytearray()

    @classmethod
    def decode(
        cls, base_offset: int, data: bytes, max_index_bytes: int = DEFAULT_INDEX_BYTES
    ) -> Self:
        """An index from its file's bytes; refused (``CORRUPT_MESSAGE``) if the
        size is not whole entries or more than the index holds, or the entries
        do not increase (call :func:`sanity_check` against the log too)."""
        index = cls(base_offset, max_index_bytes)
        index.load(data)
        return index

    def load(self, data: bytes) -> None:
        """Replace the entries by an index file's bytes, checked as
        :meth:`decode` says; on a refusal the entries are unchanged."""
        size = self._ENTRY.size
        if len(data) % size:
            raise _suspect(
                f"{self._KIND} index of {len(data)} bytes is not whole {size}-byte entries"
            )
        count = len(data) // size
        if count > self.max_entries:
            raise _suspect(f"{self._KIND} index of {count} entries exceeds its {self.max_entries}")
        self._check_entries(data, count)
        self._set_entries(data)

    def _set_entries(self, data: bytes) -> None:
        self._entries = bytearray(data)

    @abc.abstractmethod
    def _check_entries(self, data: bytes, count: int) -> None:
        """Refuse entries out of each index's own order."""

    def __len__(self) -> int:
        return len(self._entries) // self._ENTRY.size

    def encode(self) -> bytes:
        return bytes(self._entries)

    @property
    def is_full(self) -> bool:
        return len(self._entries) >= self._max_bytes

    def clear(self) -> None:
        self._entries.clear()

    def _relative(self, offset: int) -> int:
        """``offset`` relative to the base, for a new entry; refuses a full
        index or an offset that does not fit."""
        if len(self) >= self.max_entries:
            raise _suspect(f"{self._KIND} index full at {len(self)} entries, cannot add {offset}")
        relative = offset - self.base_offset
        if not 0 <= relative <= INT32_MAX:
            raise _suspect(
                f"offset {offset} does not fit as an int32 relative to base {self.base_offset}"
            )
        return relative

    def _floor(self, key: int, field: int) -> int:
        """Index of the last entry whose ``field`` is at most ``key``, or -1
        (the entries increase in every field)."""
        low, high = 0, len(self) - 1
        found = -1
        entries, unpack, size = self._entries, self._ENTRY.unpack_from, self._ENTRY.size
        while low <= high:
            mid = (low + high) // 2
            if unpack(entries, mid * size)[field] <= key:
                found = mid
                low = mid + 1
            else:
                high = mid - 1
        return found

    def _truncate_after(self, i: int) -> None:
        del self._entries[(i + 1) * self._ENTRY.size :]


class OffsetIndex(_EntryIndex):
    """Entries (absolute offset, file position), both strictly increasing.

    Kept as two native int32 arrays (relative offsets, positions) rather
    than the file's big-endian bytes: a read looks an offset up and a byte
    limit up in them, and ``bisect`` searches an array in C (one call, no
    Python step per halving); memory is the same 8 bytes an entry, and the
    file's bytes are built only when it is written."""

    _ENTRY = _OFFSET_ENTRY
    _KIND = "offset"

    def __init__(self, base_offset: int, max_index_bytes: int = DEFAULT_INDEX_BYTES) -> None:
        super().__init__(base_offset, max_index_bytes)
        self._relatives = array("i")
        self._positions = array("i")

    def _check_entries(self, data: bytes, count: int) -> None:
        if _fields_increase(_OFFSET_ENTRY, data, count, 0, 1) and (
            count == 0 or _OFFSET_ENTRY.unpack_from(data, 0)[1] >= 0
        ):
            return
        # Something is out of order: find the first entry that is, to name it.
        base_offset = self.base_offset
        last = (-1, -1)
        for i in range(count):
            relative, position = _OFFSET_ENTRY.unpack_from(data, i * OFFSET_ENTRY_SIZE)
            if relative <= last[0] or position <= last[1] and i > 0 or position < 0:
                raise _suspect(
                    f"offset index entry {i} ({base_offset + relative}, position {position}) "
                    f"does not follow entry {i - 1} "
                    f"({base_offset + last[0]}, position {last[1]})"
                )
            last = (relative, position)

    def _set_entries(self, data: bytes) -> None:
        both = array("i", data)
        if not _BIG_ENDIAN_HOST:
            both.byteswap()
        self._relatives = both[0::2]
        self._positions = both[1::2]

    def __len__(self) -> int:
        return len(self._relatives)

    @property
    def is_full(self) -> bool:
        return len(self._relatives) >= self.max_entries

    def encode(self) -> bytes:
        both = array("i", bytes(OFFSET_ENTRY_SIZE * len(self._relatives)))
        both[0::2] = self._relatives
        both[1::2] = self._positions
        if not _BIG_ENDIAN_HOST:
            both.byteswap()
        return both.tobytes()

    def clear(self) -> None:
        del self._relatives[:]
        del self._positions[:]

    def entry(self, i: int) -> OffsetPosition:
        return OffsetPosition(self.base_offset + self._relatives[i], self._positions[i])

    @property
    def last(self) -> OffsetPosition:
        """The last entry, or (base offset, 0) when empty (``lastEntry``)."""
        return self.entry(-1) if self._relatives else OffsetPosition(self.base_offset, 0)

    def append(self, offset: int, position: int) -> None:
        """Add an entry past the last; refuses a full index, an offset or
        position not past the last, or an offset outside the relative range."""
        relatives, positions = self._relatives, self._positions
        # _relative's checks, without its calls: this runs once per index
        # interval of every append and every rebuild.
        if len(relatives) >= self.max_entries:
            raise _suspect(f"offset index full at {len(relatives)} entries, cannot add {offset}")
        relative = offset - self.base_offset
        if not 0 <= relative <= INT32_MAX:
            raise _suspect(
                f"offset {offset} does not fit as an int32 relative to base {self.base_offset}"
            )
        if relatives and (relative <= relatives[-1] or position <= positions[-1]):
            raise _suspect(
                f"offset index entry ({offset}, position {position}) does not follow "
                f"({self.base_offset + relatives[-1]}, position {positions[-1]})"
            )
        if not -(1 << 31) <= position <= INT32_MAX:
            raise _suspect(f"offset index position {position} does not fit an int32")
        relatives.append(relative)
        positions.append(position)

    def lookup(self, offset: int) -> OffsetPosition:
        """The largest entry whose offset is at most ``offset``, or (base
        offset, 0) if none: where to start scanning the log for ``offset``
        (``OffsetIndex.lookup``)."""
        i = self.floor_index(offset)
        return self.entry(i) if i >= 0 else OffsetPosition(self.base_offset, 0)

    def floor_index(self, offset: int) -> int:
        """The number of the entry :meth:`lookup` returns, or -1 if none."""
        return bisect.bisect_right(self._relatives, offset - self.base_offset) - 1

    def position_at(self, i: int) -> int:
        """Entry ``i``'s file position (a batch start), without building the entry."""
        return self._positions[i]

    def floor_position_index(self, position: int) -> int:
        """The number of the last entry whose file position is at most
        ``position``, or -1 if none."""
        return bisect.bisect_right(self._positions, position) - 1

    def lookup_position(self, position: int) -> OffsetPosition:
        """The largest entry whose file position is at most ``position``, or
        (base offset, 0) if none: the last batch start the index knows
        before a byte limit (a read finds where its batches end from it)."""
        i = self.floor_position_index(position)
        return self.entry(i) if i >= 0 else OffsetPosition(self.base_offset, 0)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry at or past ``offset`` (``truncateTo``)."""
        i = self.floor_index(offset - 1) + 1
        del self._relatives[i:]
        del self._positions[i:]


class TimeIndex(_EntryIndex):
    """Entries (timestamp, absolute offset), both strictly increasing."""

    _ENTRY = _TIME_ENTRY
    _KIND = "time"

    def _check_entries(self, data: bytes, count: int) -> None:
        if _fields_increase(_TIME_ENTRY, data, count, 1, 0):
            return
        # Something is out of order: find the first entry that is, to name it.
        base_offset = self.base_offset
        last: TimestampOffset | None = None
        for i in range(count):
            timestamp, relative = _TIME_ENTRY.unpack_from(data, i * TIME_ENTRY_SIZE)
            entry = TimestampOffset(timestamp, base_offset + relative)
            if entry.offset < base_offset or (
                last is not None
                and (entry.timestamp <= last.timestamp or entry.offset <= last.offset)
            ):
                raise _suspect(
                    f"time index entry {i} (timestamp {entry.timestamp}, offset {entry.offset}) "
                    f"does not follow {last}"
                )
            last = entry

    def entry(self, i: int) -> TimestampOffset:
        timestamp, relative = _TIME_ENTRY.unpack_from(self._entries, i * TIME_ENTRY_SIZE)
        return TimestampOffset(timestamp, self.base_offset + relative)

    @property
    def last(self) -> TimestampOffset:
        """The last entry, or (no timestamp, base offset) when empty."""
        return (
            self.entry(len(self) - 1)
            if len(self)
            else TimestampOffset(NO_TIMESTAMP, self.base_offset)
        )

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Add (timestamp, offset) if the timestamp is past the last entry's
        (``TimeIndex.maybeAppend``: a smaller or equal one adds nothing);
        refuses an offset that goes back or does not fit."""
        # An empty index's last timestamp is -1 (NO_TIMESTAMP), so batches
        # without timestamps add nothing (TimeIndex.maybeAppend).
        entries = self._entries
        if entries:
            # The last entry unpacked in place, as OffsetIndex.append does.
            last_timestamp, last_relative = _TIME_ENTRY.unpack_from(
                entries, len(entries) - TIME_ENTRY_SIZE
            )
        else:
            last_timestamp, last_relative = NO_TIMESTAMP, -1
        if timestamp <= last_timestamp:
            return False
        relative = self._relative(offset)
        if relative <= last_relative:
            raise _suspect(
                f"time index entry (timestamp {timestamp}, offset {offset}) goes back from "
                f"offset {self.base_offset + last_relative}"
            )
        entries += _TIME_ENTRY.pack(timestamp, relative)
        return True

    def lookup(self, timestamp: int) -> TimestampOffset:
        """The largest entry whose timestamp is at most ``timestamp``, or (no
        timestamp, base offset) if none (``TimeIndex.lookup``)."""
        i = self._floor(timestamp, 0)
        return self.entry(i) if i >= 0 else TimestampOffset(NO_TIMESTAMP, self.base_offset)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry at or past ``offset``."""
        self._truncate_after(self._floor(offset - 1 - self.base_offset, 1))


def sanity_check(
    offsets: OffsetIndex, times: TimeIndex, log_size: int, next_offset: int
) -> str | None:
    """Why the indexes cannot be trusted for a log of ``log_size`` bytes
    ending before ``next_offset``, or ``None`` (``OffsetIndex.sanityCheck``,
    ``TimeIndex.sanityCheck``, plus the log's end).  Entries already increase
    (``decode`` and ``append`` refuse otherwise)."""
    if len(offsets):
        last = offsets.last
        if last.position >= log_size:
            return (
                f"offset index entry at position {last.position} is past the log's {log_size} bytes"
            )
        if last.offset >= next_offset:
            return f"offset index entry at offset {last.offset} is past the log's end {next_offset}"
    if len(times) and times.last.offset >= next_offset:
        return f"time index entry at offset {times.last.offset} is past the log's end {next_offset}"
    return None


class IndexBuilder:
    """The rule that adds index entries as batches are appended
    (``LogSegment.append``): an offset entry (the batch's last offset, its
    position) once more than ``index_interval_bytes`` were appended since the
    last entry, a time entry beside it when the largest timestamp grew.
    Appends and rebuilds both go through :meth:`add`."""

    def __init__(self, offsets: OffsetIndex, times: TimeIndex, index_interval_bytes: int) -> None:
        self.offsets = offsets
        self.times = times
        self.index_interval_bytes = index_interval_bytes
        self.bytes_since_last_entry = 0
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = offsets.base_offset - 1

    def add(self, position: int, header: BatchHeader) -> None:
        # Once per batch of every append and rebuild (recovery): the header's
        # fields are read once, without its computed properties.
        last_offset = header.base_offset + header.last_offset_delta
        timestamp = header.max_timestamp
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
            self.offset_of_max_timestamp = last_offset
        if self.bytes_since_last_entry > self.index_interval_bytes:
            self.offsets.append(last_offset, position)
            self.times.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += header.length + LOG_OVERHEAD

    def reset(self) -> None:
        """Forget everything (before a rebuild)."""
        self.offsets.clear()
        self.times.clear()
        self.bytes_since_last_entry = 0
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.offsets.base_offset - 1

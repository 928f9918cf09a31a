"""The aborted-transaction index of a segment (Kafka's ``TransactionIndex``,
the ``.txnindex`` file): one entry per transaction that an ``ABORT`` marker
in the segment ended, so that a ``read_committed`` fetch can tell its reader
which producers' records to drop without reading the markers themselves.

An entry (``AbortedTxn``), 34 bytes, big-endian:

- ``version`` int16 (0);
- ``producer_id`` int64;
- ``first_offset`` int64: the transaction's first batch in the partition;
- ``last_offset`` int64: its abort marker's offset (in this segment);
- ``last_stable_offset`` int64: the partition's last stable offset when the
  marker was appended (the lowest other transaction still open, else the
  offset after the marker).

Entries come in the order of their markers: ``last_offset`` increases.  A
fetch from ``start`` up to ``upper`` (the last stable offset it reads to)
needs every aborted transaction that overlaps ``[start, upper)``: those whose
marker is at or after ``start`` and whose first offset is below ``upper``,
from the segment holding ``start`` onwards; it may stop at the first entry
whose ``last_stable_offset`` reaches ``upper`` (every transaction that
overlaps the range had begun, and so ended, by then:
``TransactionIndex.collectAbortedTxns``).

Pure: bytes in, values out; the segment keeps the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from partition_log.errors import Errors, PartitionLogError

__all__ = [
    "ENTRY_SIZE",
    "AbortedTxn",
    "SearchResult",
    "decode_entries",
    "encode_entry",
    "search",
    "truncated",
]

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size
"""34 bytes, ``AbortedTxn.TOTAL_SIZE``."""
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction of a partition (module docstring)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def __post_init__(self) -> None:
        if self.producer_id < 0 or not 0 <= self.first_offset <= self.last_offset:
            raise ValueError(
                f"aborted transaction of producer {self.producer_id}: offsets "
                f"{self.first_offset}..{self.last_offset}"
            )
        if self.last_stable_offset < 0:
            raise ValueError(f"last stable offset {self.last_stable_offset} is negative")


def encode_entry(txn: AbortedTxn) -> bytes:
    """The 34 bytes of ``txn``'s entry."""
    return _ENTRY.pack(
        _VERSION, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset
    )


def decode_entries(data: bytes, name: str = "txnindex") -> list[AbortedTxn]:
    """The entries of an index file's bytes; a :class:`PartitionLogError`
    (``KAFKA_STORAGE_ERROR``) naming ``name``, the entry and what is wrong
    for a torn, unknown or out-of-order one (the segment then rebuilds its
    index from the log)."""
    if len(data) % ENTRY_SIZE:
        raise PartitionLogError(
            Errors.KAFKA_STORAGE_ERROR,
            f"{name}: {len(data)} bytes, not a whole number of {ENTRY_SIZE}-byte entries",
        )
    out: list[AbortedTxn] = []
    for index, fields in enumerate(_ENTRY.iter_unpack(data)):
        version, producer_id, first, last, stable = fields
        if version != _VERSION:
            raise PartitionLogError(
                Errors.KAFKA_STORAGE_ERROR, f"{name}: entry {index} has version {version}"
            )
        try:
            txn = AbortedTxn(producer_id, first, last, stable)
        except ValueError as error:
            raise PartitionLogError(
                Errors.KAFKA_STORAGE_ERROR, f"{name}: entry {index}: {error}"
            ) from None
        if out and txn.last_offset <= out[-1].last_offset:
            raise PartitionLogError(
                Errors.KAFKA_STORAGE_ERROR,
                f"{name}: entry {index}'s last offset {txn.last_offset} does not follow "
                f"{out[-1].last_offset}",
            )
        out.append(txn)
    return out


def truncated(entries: Sequence[AbortedTxn], offset: int) -> list[AbortedTxn]:
    """The entries whose marker lies below ``offset`` (a truncation of the
    segment to ``offset``: ``TransactionIndex.truncateTo``)."""
    return [txn for txn in entries if txn.last_offset < offset]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What one segment's index gave a fetch: the aborted transactions that
    overlap it, and whether the search may stop here (``complete``)."""

    aborted: tuple[AbortedTxn, ...]
    complete: bool


def search(entries: Iterable[AbortedTxn], start: int, upper: int) -> SearchResult:
    """The aborted transactions of one segment's ``entries`` that overlap
    ``[start, upper)``, and whether no later segment can hold another
    (module docstring)."""
    found: list[AbortedTxn] = []
    for txn in entries:
        if txn.last_offset >= start and txn.first_offset < upper:
            found.append(txn)
        if txn.last_stable_offset >= upper:
            return SearchResult(tuple(found), True)
    return SearchResult(tuple(found), False)

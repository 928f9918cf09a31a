"""What a ``read_committed`` consumer keeps of a fetch (KIP-98; Kafka's
``CompletedFetch.nextFetchedBatch`` in the consumer's ``Fetcher``).

A ``read_committed`` fetch returns the batches below the partition's last
stable offset and the aborted transactions that overlap them
(:meth:`partition_log.log.PartitionLog.collect_aborted_transactions`); the
consumer, not the broker, drops what those transactions wrote.  It walks the
batches in offset order with the aborted transactions in a queue ordered by
first offset:

- before a batch of a producer, every aborted transaction whose first offset
  is at or below the batch's last offset leaves the queue and its producer
  becomes *aborted*;
- that producer's transactional batches are dropped until its ``ABORT``
  marker, which makes it not aborted again (a later transaction of the same
  producer is judged by its own entry);
- control batches (the markers) are never handed on; everything else is.

The function below is that walk over whole v2 batches. Pure: bytes in,
views out.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator
from typing import Protocol

from partition_log.batch import BatchHeader, decode_records, split_batches
from partition_log.producer_state import NO_PRODUCER_ID
from partition_log.txn import ControlType

__all__ = ["AbortedFilter", "FetchedAbortedTxn", "read_committed_batches"]


class FetchedAbortedTxn(Protocol):
    """What a fetch says of an aborted transaction
    (``FetchResponse.AbortedTransaction``): its producer and its first
    offset.  An index entry (:class:`~partition_log.txn_index.AbortedTxn`)
    and the proto message both are one."""

    @property
    def producer_id(self) -> int: ...

    @property
    def first_offset(self) -> int: ...


# The control record key: version int16, type int16 (ControlRecordType).
_CONTROL_KEY = struct.Struct(">hh")


def _is_abort_marker(batch: memoryview, header: BatchHeader) -> bool:
    """Whether ``batch`` is a control batch whose record is an ``ABORT``
    marker (``CompletedFetch.containsAbortMarker``: only the key's type is
    read, so another kind of control record is simply not an abort)."""
    if not header.is_control:
        return False
    records = decode_records(batch)
    if not records:
        return False
    key = records[0].key
    if key is None or len(key) < _CONTROL_KEY.size:
        return False
    kind: int = _CONTROL_KEY.unpack_from(key)[1]
    return kind == ControlType.ABORT


class AbortedFilter:
    """The walk over one fetch's batches, one batch at a time (for a
    consumer that scans the batches itself): :meth:`keeps` says whether a
    batch's records are handed on.  Batches must come in offset order."""

    __slots__ = ("_aborted_producers", "_queue")

    def __init__(self, aborted: Iterable[FetchedAbortedTxn]) -> None:
        # (first offset, producer id): AbortedTransaction's order in
        # Kafka's priority queue, with the producer breaking ties.
        self._queue = [(txn.first_offset, txn.producer_id) for txn in aborted]
        heapq.heapify(self._queue)
        self._aborted_producers: set[int] = set()

    def keeps(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
        """Whether a read_committed consumer hands on ``batch``'s records:
        never a control batch's, never a transactional batch's of a
        producer inside one of its aborted transactions."""
        producer = header.producer_id
        if producer != NO_PRODUCER_ID:
            last = header.last_offset
            queue = self._queue
            while queue and queue[0][0] <= last:
                self._aborted_producers.add(heapq.heappop(queue)[1])
            if header.is_control:
                if _is_abort_marker(memoryview(batch), header):
                    self._aborted_producers.discard(producer)
                return False
            if header.is_transactional and producer in self._aborted_producers:
                return False
        return not header.is_control


def read_committed_batches(
    data: bytes | bytearray | memoryview, aborted: Iterable[FetchedAbortedTxn]
) -> Iterator[memoryview]:
    """The batches of one fetch's ``data`` (whole v2 batches in offset
    order; a :class:`~partition_log.errors.PartitionLogError` naming the
    position if not) that a ``read_committed`` consumer hands on, given the
    fetch's ``aborted`` transactions (module docstring): no control batch,
    and no transactional batch of a producer inside one of its aborted
    transactions.  Each is a view of ``data``."""
    walk = AbortedFilter(aborted)
    for batch in split_batches(data):
        if walk.keeps(batch, BatchHeader.parse(batch)):
            yield batch

"""Transaction markers in a partition log (KIP-98): the control record that
ends a transaction in a partition, and what a log learns when one is
appended.

A transaction coordinator ends a transaction by writing, to every
partition of it, a *control batch* (attribute bits 4 and 5: transactional
and control) of the producer's id and epoch holding one record, Kafka's
``EndTransactionMarker``:

- key: ``version`` int16 (0), ``type`` int16 (0 ``ABORT``, 1 ``COMMIT``;
  Kafka's ``ControlRecordType``);
- value: ``version`` int16 (0), ``coordinator_epoch`` int32 (the epoch of
  the coordinator's partition of the transaction-state topic, so that a
  partition refuses the marker of a coordinator that has been replaced).

Readers never hand control records to applications; ``read_committed``
readers use the markers (through the log's last stable offset and its
aborted transactions) to skip what a transaction aborted.

Pure: bytes in, values out.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from partition_log.batch import BatchHeader, build_batch, decode_records
from partition_log.errors import Errors, PartitionLogError
from partition_log.records import INT32_MAX, INT32_MIN, Record

__all__ = [
    "CURRENT_MARKER_VERSION",
    "CompletedTxn",
    "ControlType",
    "EndTxnMarker",
    "build_marker_batch",
    "decode_marker",
    "encode_marker",
    "read_marker",
]

CURRENT_MARKER_VERSION = 0
"""``EndTransactionMarker.CURRENT_END_TXN_MARKER_VERSION``."""
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class ControlType(enum.IntEnum):
    """The control records of a partition log (Kafka's ``ControlRecordType``
    of a transaction's end)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """A transaction's end in one partition: commit or abort, and the
    coordinator epoch that wrote it."""

    type: ControlType
    coordinator_epoch: int

    def __post_init__(self) -> None:
        if not INT32_MIN <= self.coordinator_epoch <= INT32_MAX:
            raise ValueError(f"coordinator epoch {self.coordinator_epoch} does not fit an int32")

    @property
    def aborted(self) -> bool:
        return self.type is ControlType.ABORT


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended in this partition (Kafka's
    ``CompletedTxn``): the producer, the offset of its first batch here,
    the marker's offset, whether it aborted, and the partition's last
    stable offset when it ended (the first offset of the lowest transaction
    of another producer still open, else the offset after the marker),
    which the aborted-transaction index records beside it."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    last_stable_offset: int

    def __post_init__(self) -> None:
        if not 0 <= self.first_offset <= self.last_offset:
            raise ValueError(
                f"transaction of producer {self.producer_id}: first offset "
                f"{self.first_offset}, last offset {self.last_offset}"
            )


def encode_marker(marker: EndTxnMarker) -> tuple[bytes, bytes]:
    """The key and value of ``marker``'s control record."""
    return (
        _KEY.pack(CURRENT_MARKER_VERSION, marker.type),
        _VALUE.pack(CURRENT_MARKER_VERSION, marker.coordinator_epoch),
    )


def _unpack(layout: struct.Struct, data: bytes | None, what: str) -> tuple[int, int]:
    """The two fields of ``data`` (a null or short one refused by ``what``)."""
    if data is None or len(data) < layout.size:
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"{what} of {0 if data is None else len(data)} bytes, shorter than its {layout.size}",
        )
    first, second = layout.unpack_from(data)
    return first, second


def decode_marker(key: bytes | None, value: bytes | None) -> EndTxnMarker:
    """The marker of a control record; a :class:`PartitionLogError`
    (``INVALID_RECORD``) naming what is wrong.  Like Kafka's reader, a
    version above 0 is read by its known prefix (later versions may add
    fields after it)."""
    version, kind = _unpack(_KEY, key, "control record key")
    if version < 0:
        raise PartitionLogError(Errors.INVALID_RECORD, f"control record key version {version}")
    try:
        control = ControlType(kind)
    except ValueError:
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"control record type {kind} is not a transaction marker (0 abort, 1 commit)",
        ) from None
    value_version, coordinator_epoch = _unpack(_VALUE, value, f"{control.name} marker value")
    if value_version < 0:
        raise PartitionLogError(
            Errors.INVALID_RECORD, f"{control.name} marker value version {value_version}"
        )
    return EndTxnMarker(control, coordinator_epoch)


def build_marker_batch(
    producer_id: int,
    producer_epoch: int,
    marker: EndTxnMarker,
    timestamp: int,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """The control batch that ends producer ``producer_id``'s transaction in
    a partition (``MemoryRecords.withEndTransactionMarker``): transactional,
    control, no sequence, one record."""
    if producer_id < 0 or producer_epoch < 0:
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"a marker needs a producer id and epoch, got {producer_id} and {producer_epoch}",
        )
    key, value = encode_marker(marker)
    return build_batch(
        [Record(base_offset, timestamp, key, value)],
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )


def read_marker(batch: bytes | bytearray | memoryview, header: BatchHeader) -> EndTxnMarker:
    """The marker of the control batch ``batch`` (whose header is
    ``header``): one record, of a transactional batch with a producer id;
    a :class:`PartitionLogError` (``INVALID_RECORD``) naming what is
    wrong otherwise."""
    where = f"control batch at offset {header.base_offset}"
    if not header.is_control:
        raise PartitionLogError(
            Errors.INVALID_RECORD, f"batch at offset {header.base_offset} is not a control batch"
        )
    if not header.is_transactional or header.producer_id < 0:
        raise PartitionLogError(
            Errors.INVALID_RECORD,
            f"{where}: a transaction marker is transactional and has a producer id "
            f"(producer {header.producer_id})",
        )
    records = decode_records(batch)
    if len(records) != 1:
        raise PartitionLogError(
            Errors.INVALID_RECORD, f"{where}: {len(records)} records, a marker has one"
        )
    return decode_marker(records[0].key, records[0].value)

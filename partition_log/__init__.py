"""Segmented, replicated partition logs."""

from partition_log.batch import (
    BatchHeader,
    BatchScanner,
    Compression,
    ScanEnd,
    ScannedBatch,
    TimestampType,
    build_batch,
    decode_records,
    set_base_offset,
    set_leader_epoch,
    split_batches,
    verify,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.records import Header, Record

__all__ = [
    "BatchHeader",
    "BatchScanner",
    "Compression",
    "Errors",
    "Header",
    "PartitionLogError",
    "Record",
    "ScanEnd",
    "ScannedBatch",
    "TimestampType",
    "build_batch",
    "decode_records",
    "set_base_offset",
    "set_leader_epoch",
    "split_batches",
    "verify",
]

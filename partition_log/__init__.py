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
from partition_log.cleaner import CleanerConfig, Cleaning, LogCleaner
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, LogFile, MemoryDirectory
from partition_log.index import OffsetIndex, TimeIndex
from partition_log.log import AppendInfo, AppendOrigin, LogRecovery, PartitionLog
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.read_committed import read_committed_batches
from partition_log.records import Header, Record
from partition_log.retention import SegmentInfo
from partition_log.segment import RecoveryResult, Segment
from partition_log.txn_index import AbortedTxn

# The file seam on real files is partition_log.os_files, imported by name by
# whoever does I/O (the one module of the package that does).

__all__ = [
    "AbortedTxn",
    "AppendInfo",
    "AppendOrigin",
    "BatchHeader",
    "BatchScanner",
    "CleanerConfig",
    "Cleaning",
    "CleanupPolicy",
    "Compression",
    "Errors",
    "FileDirectory",
    "Header",
    "LogCleaner",
    "LogConfig",
    "LogFile",
    "LogRecovery",
    "MemoryDirectory",
    "OffsetIndex",
    "PartitionLog",
    "PartitionLogError",
    "Record",
    "RecoveryResult",
    "ScanEnd",
    "ScannedBatch",
    "Segment",
    "SegmentInfo",
    "TimeIndex",
    "TimestampType",
    "build_batch",
    "decode_records",
    "read_committed_batches",
    "set_base_offset",
    "set_leader_epoch",
    "split_batches",
    "verify",
]

"""The topic configs a partition log reads (Kafka's ``LogConfig``), with
Kafka's defaults and range checks, in kq's units (milliseconds, bytes)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from partition_log.batch import Compression, TimestampType

__all__ = ["LONG_MAX", "CleanupPolicy", "LogConfig"]

#: Java's Long.MAX_VALUE, Kafka's "no limit" for several configs.
LONG_MAX = (1 << 63) - 1


class CleanupPolicy(enum.Flag):
    """``cleanup.policy``: a set of ``delete`` and ``compact`` (Kafka's
    ``ValidList.in("compact", "delete")``); both is ``compact,delete``."""

    DELETE = enum.auto()
    COMPACT = enum.auto()


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The topic configs the log reads (``LogConfig``), in kq's units."""

    segment_bytes: int = 1 << 30  # segment.bytes
    segment_ms: int = 7 * 24 * 3600 * 1000  # segment.ms
    segment_jitter_ms: int = 0  # segment.jitter.ms, already drawn for this log
    index_interval_bytes: int = 4096  # index.interval.bytes
    segment_index_bytes: int = 10 * 1024 * 1024  # segment.index.bytes
    # flush.messages / flush.ms; None is Kafka's default (Long.MAX_VALUE):
    # leave syncing to the recovery after a crash and to the roll.
    flush_messages: int | None = None
    flush_ms: int | None = None
    max_batch_bytes: int = 1048588  # message.max.bytes
    # message.timestamp.type: LOG_APPEND_TIME makes the leader stamp its
    # clock on every batch.
    timestamp_type: TimestampType = TimestampType.CREATE_TIME
    # retention.ms: segments whose largest timestamp is older are deleted;
    # -1 keeps them whatever their age.
    retention_ms: int = 7 * 24 * 3600 * 1000
    # retention.bytes: the oldest segments go while the log stays at least
    # this large without them; -1 is no size limit.
    retention_bytes: int = -1
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE  # cleanup.policy
    # file.delete.delay.ms: a deleted segment's files stay renamed
    # ``.deleted`` this long before they are removed (readers still on them).
    file_delete_delay_ms: int = 60_000
    # delete.retention.ms: how long compaction keeps a tombstone.
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = LONG_MAX  # max.compaction.lag.ms
    # compression.type: None ("producer") stores each batch as its producer
    # compressed it; a codec (NONE for "uncompressed") makes the leader
    # recompress the batches of any other (LogValidator).
    compression: Compression | None = None

    def __post_init__(self) -> None:
        # Kafka's validators (LogConfig.CONFIG's atLeast/between/in).
        checks = {
            "segment_bytes": self.segment_bytes >= 64,
            "segment_ms": self.segment_ms >= 1,
            "segment_jitter_ms": 0 <= self.segment_jitter_ms < self.segment_ms,
            "index_interval_bytes": self.index_interval_bytes >= 0,
            "segment_index_bytes": self.segment_index_bytes >= 12,
            "flush_messages": self.flush_messages is None or self.flush_messages >= 1,
            "flush_ms": self.flush_ms is None or self.flush_ms >= 0,
            "max_batch_bytes": self.max_batch_bytes >= 61,
            "retention_ms": -1 <= self.retention_ms <= LONG_MAX,
            "retention_bytes": -1 <= self.retention_bytes <= LONG_MAX,
            "cleanup_policy": isinstance(self.cleanup_policy, CleanupPolicy)
            and bool(self.cleanup_policy),
            "file_delete_delay_ms": 0 <= self.file_delete_delay_ms <= LONG_MAX,
            "delete_retention_ms": 0 <= self.delete_retention_ms <= LONG_MAX,
            "min_cleanable_dirty_ratio": 0.0 <= self.min_cleanable_dirty_ratio <= 1.0,
            "min_compaction_lag_ms": 0 <= self.min_compaction_lag_ms <= LONG_MAX,
            "max_compaction_lag_ms": 1 <= self.max_compaction_lag_ms <= LONG_MAX,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"log config {name}={getattr(self, name)!r} is out of range")

    @property
    def deletes(self) -> bool:
        """Whether retention deletes old segments (policy includes delete)."""
        return CleanupPolicy.DELETE in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        """Whether the cleaner compacts this log (policy includes compact)."""
        return CleanupPolicy.COMPACT in self.cleanup_policy

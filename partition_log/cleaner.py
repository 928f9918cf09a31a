"""The log cleaner (Kafka's ``LogCleaner``, ``LogCleanerManager`` and
``Cleaner``, brokers.md §2.6) over a set of named partition logs.

:meth:`LogCleaner.maybe_clean` picks the dirtiest cleanable log whose
``cleanup.policy`` includes ``compact`` (:func:`~partition_log.compaction.
choose_log`) and cleans it once:

1. map each key of the dirty part, from the log's cleaner checkpoint (its
   first dirty offset) towards the first uncleanable offset (the active
   segment's base, the high watermark, ``min.compaction.lag.ms``), to its last
   offset, a whole batch at a time within the dedupe budget
   (``Cleaner.buildOffsetMap``);
2. recopy every segment from the log's first up to the one where the map
   stopped through :func:`~partition_log.compaction.clean_batch`, small
   neighbouring segments grouped up to ``segment.bytes``
   (``groupSegmentsBySize``), each group handed to the log's crash-safe
   ``replace_segments`` (``.cleaned`` -> ``.swap`` -> live);
3. advance the log's cleaner checkpoint to where the map stopped, so the next
   cleaning starts there (``updateCheckpoints``).

Kafka runs cleaner threads; kq's cleaner is a step its owner calls (as the
Raft core is ticked), and it is pure: time is ``now_ms``, files only through
the logs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from partition_log.batch import BatchScanner
from partition_log.compaction import (
    DEFAULT_DEDUPE_BUFFER_BYTES,
    ENTRY_OVERHEAD_BYTES,
    CleanableRange,
    OffsetMap,
    SegmentSummary,
    build_offset_map,
    choose_log,
    clean_batch,
    cleanable_range,
    group_segments_by_size,
)
from partition_log.log import PartitionLog

__all__ = ["CleanerConfig", "Cleaning", "LogCleaner"]


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The cleaner's own settings (broker configs in Kafka)."""

    # log.cleaner.dedupe.buffer.size: the offset map's budget.
    dedupe_buffer_bytes: int = DEFAULT_DEDUPE_BUFFER_BYTES
    # log.cleaner.io.buffer.size's role: how much of a segment is read at once.
    read_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.dedupe_buffer_bytes <= ENTRY_OVERHEAD_BYTES:
            raise ValueError(
                f"cleaner dedupe_buffer_bytes={self.dedupe_buffer_bytes} cannot hold one entry "
                f"({ENTRY_OVERHEAD_BYTES} bytes and its key)"
            )
        if self.read_bytes < 1:
            raise ValueError(f"cleaner read_bytes={self.read_bytes} is below 1")


@dataclass(frozen=True, slots=True)
class Cleaning:
    """What one cleaning did (Kafka's ``CleanerStats``, in part)."""

    name: str
    first_dirty_offset: int
    end_offset: int  # the new cleaner checkpoint: where the map stopped
    map_full: bool
    segments_before: int  # segments recopied
    segments_after: int  # segments they became
    bytes_read: int
    bytes_written: int
    batches_read: int
    batches_written: int


def _summaries(log: PartitionLog) -> list[SegmentSummary]:
    return [
        SegmentSummary(
            s.base_offset, s.next_offset, s.size, s.max_timestamp, s.first_batch_timestamp
        )
        for s in log.segments
    ]


class LogCleaner:
    """Cleans the compacted logs among ``logs`` (name to log), one cleaning
    per :meth:`maybe_clean`."""

    def __init__(
        self, logs: Mapping[str, PartitionLog] | None = None, config: CleanerConfig | None = None
    ) -> None:
        self.logs: dict[str, PartitionLog] = dict(logs or {})
        self.config = config or CleanerConfig()
        self.last_cleaning: Cleaning | None = None

    def add_log(self, name: str, log: PartitionLog) -> None:
        if name in self.logs:
            raise ValueError(f"the cleaner already has a log named {name!r}")
        self.logs[name] = log

    def remove_log(self, name: str) -> None:
        if name not in self.logs:
            raise ValueError(f"the cleaner has no log named {name!r}")
        del self.logs[name]

    def prospects(self, name: str, now_ms: int) -> CleanableRange:
        """Log ``name``'s dirty part and whether it is cleanable now."""
        log = self.logs[name]
        config = log.config
        return cleanable_range(
            name,
            _summaries(log),
            checkpoint=log.cleaner_offset,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            last_stable_offset=log.last_stable_offset,
            now_ms=now_ms,
            min_compaction_lag_ms=config.min_compaction_lag_ms,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
        )

    def maybe_clean(self, now_ms: int) -> bool:
        """Clean the dirtiest cleanable compacted log once; ``False`` if no
        log is cleanable (``LogCleaner.CleanerThread.tryCleanFilthiestLog``)."""
        chosen = choose_log(
            self.prospects(name, now_ms) for name, log in self.logs.items() if log.config.compacts
        )
        if chosen is None:
            return False
        return self.clean(chosen, now_ms) is not None

    def _batches(self, log: PartitionLog, start: int, end: int) -> Iterator[bytes]:
        """The log's batches from the one holding ``start`` to the last that
        ends below ``end``, read a chunk at a time."""
        offset = max(start, log.log_start_offset)
        while offset < end:
            data = log.read(offset, self.config.read_bytes, end)
            if not data:
                return
            view = memoryview(data)
            for batch in BatchScanner(view, check_crc=False):
                yield bytes(view[batch.position : batch.end])
                offset = batch.header.next_offset

    def clean(self, prospects: CleanableRange, now_ms: int) -> Cleaning | None:
        """Clean one log over ``prospects`` (from :meth:`prospects`);
        ``None`` when there was nothing below its first uncleanable offset to
        map (``Cleaner.doClean``)."""
        name = prospects.name
        log = self.logs[name]
        start, stop = prospects.first_dirty_offset, prospects.first_uncleanable_offset
        if stop <= start:
            return None
        offset_map = OffsetMap(self.config.dedupe_buffer_bytes)
        end, full = build_offset_map(self._batches(log, start, stop), start, offset_map)
        if offset_map.latest_offset < start:
            return None
        segments = _summaries(log)[:-1]  # never the active one
        # LogCleaner.doClean: every segment from the log's first up to the one
        # holding the map's last offset.
        recopied = [s for s in segments if s.base_offset < end]
        producers = {pid: e.last_offset for pid, e in log.producer_state.producers.items()}
        retention = log.config.delete_retention_ms
        counts = {"read": 0, "written": 0, "batches_read": 0, "batches_written": 0}

        def cleaned(first: int, last: int) -> Iterator[bytes]:
            for batch in self._batches(log, first, last):
                counts["read"] += len(batch)
                counts["batches_read"] += 1
                kept = clean_batch(
                    batch,
                    offset_map,
                    now_ms=now_ms,
                    delete_retention_ms=retention,
                    producer_last_offsets=producers,
                )
                if kept is not None:
                    counts["written"] += len(kept)
                    counts["batches_written"] += 1
                    yield kept

        groups = group_segments_by_size(recopied, log.config.segment_bytes)
        for group in groups:
            # Streamed: the log writes each kept batch into its .cleaned
            # segment as it comes, so a group is never held in memory.
            log.replace_segments(
                [s.base_offset for s in group],
                cleaned(group[0].base_offset, group[-1].next_offset),
                now_ms,
            )
        log.set_cleaner_offset(end)
        self.last_cleaning = Cleaning(
            name,
            start,
            end,
            full,
            len(recopied),
            len(groups),
            counts["read"],
            counts["written"],
            counts["batches_read"],
            counts["batches_written"],
        )
        return self.last_cleaning

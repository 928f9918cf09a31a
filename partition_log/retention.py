"""Which of a log's oldest segments retention may delete (Kafka's
``UnifiedLog.deletableSegments`` and the three ``delete*BreachedSegments``),
decided over the segments' summaries: pure, no files, no clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import bugs
from bugs import Bug
from partition_log.segment import Segment

__all__ = [
    "SegmentInfo",
    "deletable",
    "size_breached",
    "start_breached",
    "time_breached",
]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment as the log keeps it when it is not open: its offsets, its
    size, its largest timestamp (-1 if none; ``LogSegment.largestTimestamp``)
    and its first batch's max timestamp (``None`` if empty or none): what
    retention and the cleaner's choices need, without the segment's index."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    first_batch_timestamp: int | None

    @classmethod
    def of(cls, segment: Segment) -> SegmentInfo:
        return cls(
            segment.base_offset,
            segment.next_offset,
            segment.size,
            segment.max_timestamp,
            segment.first_batch_timestamp,
        )


def deletable(
    segments: Sequence[SegmentInfo],
    high_watermark: int,
    log_end_offset: int,
    predicate: Callable[[SegmentInfo, int | None], bool],
) -> int:
    """How many of the oldest ``segments`` (the active one last) may go
    (``UnifiedLog.deletableSegments``): from the first, while
    ``predicate(segment, next segment's base)`` holds, the segment lies
    wholly below the high watermark (its upper bound is the next base, or
    the log end for the active one), and it is not the active segment when
    that one is empty."""
    count = 0
    # B15: retention ignores the high watermark and deletes records no
    # replica may have yet (read once a call).
    bound = log_end_offset if bugs.on(Bug.RETENTION_ABOVE_HW) else high_watermark
    for index, segment in enumerate(segments):
        following = segments[index + 1].base_offset if index + 1 < len(segments) else None
        upper = following if following is not None else log_end_offset
        last_and_empty = following is None and segment.size == 0
        if last_and_empty or bound < upper or not predicate(segment, following):
            break
        count += 1
    return count


def start_breached(
    segments: Sequence[SegmentInfo], high_watermark: int, log_end_offset: int, log_start: int
) -> int:
    """Segments wholly below the log start: the next one starts at or below
    it (``deleteLogStartOffsetBreachedSegments``)."""
    return deletable(
        segments,
        high_watermark,
        log_end_offset,
        lambda _, following: following is not None and following <= log_start,
    )


def time_breached(
    segments: Sequence[SegmentInfo],
    high_watermark: int,
    log_end_offset: int,
    now_ms: int,
    retention_ms: int,
) -> int:
    """Segments whose largest timestamp is more than ``retention.ms`` before
    ``now_ms`` (``deleteRetentionMsBreachedSegments``; -1 keeps all). A
    segment without any timestamp is kept, and so are the ones after it:
    Kafka falls back on the file's modification time, which the file seam
    does not have."""
    if retention_ms < 0:
        return 0
    return deletable(
        segments,
        high_watermark,
        log_end_offset,
        lambda segment, _: (
            segment.max_timestamp >= 0 and now_ms - segment.max_timestamp > retention_ms
        ),
    )


def size_breached(
    segments: Sequence[SegmentInfo],
    high_watermark: int,
    log_end_offset: int,
    retention_bytes: int,
) -> int:
    """The oldest segments while the log without them stays at least
    ``retention.bytes`` (``deleteRetentionSizeBreachedSegments``; -1 keeps
    all)."""
    excess = sum(segment.size for segment in segments) - retention_bytes
    if retention_bytes < 0 or excess <= 0:
        return 0

    def predicate(segment: SegmentInfo, _: int | None) -> bool:
        nonlocal excess
        if excess - segment.size < 0:
            return False
        excess -= segment.size
        return True

    return deletable(segments, high_watermark, log_end_offset, predicate)

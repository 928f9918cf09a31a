"""How a follower finds where its log diverges from its leader's (KIP-101,
KIP-279), one request and answer at a time, as a replica fetcher calls it.

The fetcher asks the leader for the end of :func:`epoch_to_request` (its own
latest epoch); the leader answers with ``end_offset_for_epoch`` of its cache
(the largest epoch at most that one, and where it ends, in the leader's
log); :func:`truncation_step` turns the answer into the offset to truncate
to and whether to ask again. This is Kafka's
``AbstractFetcherThread.getOffsetTruncationState``:

- the leader knows no end (undefined offset): truncate to the high
  watermark, which is where a follower starts fetching (Kafka uses the
  partition's initial fetch offset, which for a follower is its high
  watermark);
- the follower knows the epoch the leader answered: truncate to the smaller
  of its own end of that epoch and the leader's, and stop;
- the follower does not know it (its cache's floor is a smaller epoch, KIP-279):
  truncate to its own end of that smaller epoch and ask again, now with the
  latest epoch left in its log;
- the follower's cache has no answer (it is empty): truncate to the
  leader's end (pre-KIP-279 behaviour, the only information left), and stop.

A leader's epoch below every epoch of the follower's is the known case:
the follower's cache answers that epoch with the start of its first epoch
("the data has already been removed"), and the smaller of the two ends wins.

Every truncation offset is capped by the follower's log end offset: a
truncation never moves the end forward.

Pure: the caller truncates its log (and its epoch cache and producer state)
between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from partition_log.epoch_cache import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    LeaderEpochCache,
)

__all__ = ["TruncationStep", "epoch_to_request", "truncation_step"]


@dataclass(frozen=True, slots=True)
class TruncationStep:
    """Kafka's ``OffsetTruncationState``: truncate the log to ``offset``; when
    ``completed`` is false, then ask the leader again."""

    offset: int
    completed: bool


def epoch_to_request(cache: LeaderEpochCache) -> int:
    """The epoch a follower asks the leader about: its latest one
    (``UNDEFINED_EPOCH`` for an empty cache, which the leader answers with
    an undefined end, sending the follower to its high watermark)."""
    return cache.latest_epoch


def truncation_step(
    cache: LeaderEpochCache,
    log_end_offset: int,
    high_watermark: int,
    answer: EpochEndOffset,
) -> TruncationStep:
    """The follower's next truncation, given its ``cache`` and log end
    offset and the leader's ``answer`` for :func:`epoch_to_request`."""
    if answer.undefined:
        return TruncationStep(min(high_watermark, log_end_offset), completed=True)
    if answer.epoch == UNDEFINED_EPOCH:
        # A leader that answers an end without an epoch (OffsetsForLeaderEpoch
        # v0): its end is all there is.
        return TruncationStep(min(answer.end_offset, log_end_offset), completed=True)
    mine = cache.end_offset_for_epoch(answer.epoch, log_end_offset)
    if mine.undefined:
        # Our cache has no answer (it is empty): "safe to truncate to
        # leader's offset (the same behavior as post-KIP-101 and pre-KIP-279)".
        return TruncationStep(min(answer.end_offset, log_end_offset), completed=True)
    if mine.epoch != answer.epoch:
        # KIP-279: we never had the leader's epoch; whatever we wrote after our
        # floor epoch may diverge, so cut there and ask about that one.
        return TruncationStep(min(mine.end_offset, log_end_offset), completed=False)
    # Both had the epoch: the log is the same up to where the shorter one ended.
    return TruncationStep(min(mine.end_offset, answer.end_offset, log_end_offset), completed=True)

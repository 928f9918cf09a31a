"""The follower's decisions for one partition (Kafka's
``AbstractFetcherThread`` and ``ReplicaFetcherThread``), as pure functions;
:mod:`broker.replica.partition` applies them to the log.

- A follower never truncates to its HW when it starts following (KIP-101:
  "It truncates its log to the high watermark… Message m2 has been lost
  permanently"): it fetches from its LEO with its latest epoch as the last
  fetched epoch, and truncates only on a ``DivergingEpoch`` answer
  (KAFKA-10554).
- A divergence is resolved by ``getOffsetTruncationState``
  (:func:`partition_log.divergence.truncation_step`), in several rounds
  when the follower does not know the leader's epoch (KIP-279).
- ``OFFSET_OUT_OF_RANGE``: the two cases of ``fetchOffsetAndTruncate``.
- After records: HW = min(leader's HW, own LEO), then the log start rises
  to the leader's, never past our HW
  (``ReplicaFetcherThread.processPartitionData``).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import Errors
from broker.replica.types import DivergingEpoch, FetchRequest, FollowerOutcome, FollowerStep
from partition_log.divergence import TruncationStep, truncation_step
from partition_log.epoch_cache import EpochEndOffset, LeaderEpochCache

__all__ = [
    "OutOfRange",
    "backs_off",
    "divergence_truncation",
    "follower_high_watermark",
    "follower_log_start",
    "is_current_fetch",
    "out_of_range",
]


def is_current_fetch(
    request: FetchRequest, leader_epoch: int, log_end_offset: int, fenced: bool
) -> bool:
    """An answer applies only to the fetch state it was asked from
    (``AbstractFetcherThread.processFetchRequest``: the fetch offset and the
    current leader epoch unchanged since the request was sent)."""
    return (
        not fenced
        and request.current_leader_epoch == leader_epoch
        and request.fetch_offset == log_end_offset
    )


def divergence_truncation(
    cache: LeaderEpochCache,
    log_end_offset: int,
    high_watermark: int,
    diverging: DivergingEpoch,
) -> TruncationStep:
    """``getOffsetTruncationState`` for a ``DivergingEpoch`` answer: where to
    truncate, and whether the leader must be asked again (the follower did
    not know that epoch)."""
    return truncation_step(
        cache,
        log_end_offset,
        high_watermark,
        EpochEndOffset(diverging.epoch, diverging.end_offset),
    )


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """``fetchOffsetAndTruncate``: truncate to ``truncate_to`` (the leader's
    log is shorter: the unclean case, "we don't fix this mismatch as of
    now"), or restart the log at ``start_at`` (the leader's log starts past
    ours), or neither (fetch again from our LEO)."""

    truncate_to: int | None = None
    start_at: int | None = None


def out_of_range(
    log_end_offset: int, leader_log_start_offset: int, leader_log_end_offset: int
) -> OutOfRange:
    if leader_log_end_offset < log_end_offset:
        return OutOfRange(truncate_to=leader_log_end_offset)
    if leader_log_start_offset > log_end_offset:
        return OutOfRange(start_at=leader_log_start_offset)
    return OutOfRange()


def follower_high_watermark(leader_high_watermark: int, log_end_offset: int) -> int:
    """The follower's HW after a fetch: the leader's, never past its own LEO
    (``UnifiedLog.updateHighWatermark`` clamps it)."""
    return min(leader_high_watermark, log_end_offset)


def follower_log_start(leader_log_start_offset: int, high_watermark: int) -> int:
    """Where the follower's log start goes after a fetch answer (its log
    only ever moves it up): the leader's log start, never past the
    follower's HW.

    Kafka's ``ReplicaFetcherThread.processPartitionData`` first updates the
    HW from the answer, then calls ``log.maybeIncrementLogStartOffset(
    leaderLogStartOffset, LeaderOffsetIncremented)``, which refuses a start
    above the HW (``UnifiedLog.maybeIncrementLogStartOffset`` throws
    ``OffsetOutOfRangeException``, and the fetcher marks the partition
    failed). So Kafka's rule is the leader's log start, not
    ``min(leader's, HW)``; the two agree on every answer a leader sends,
    since its log start is at most its HW and at most the fetch offset
    (below it the fetch is ``OFFSET_OUT_OF_RANGE``), so at most our new HW
    ``min(leader's HW, our LEO)``. The min keeps "never past the HW" for an
    answer that breaks that, without stopping the follower."""
    return min(leader_log_start_offset, high_watermark)


def backs_off(error: Errors, outcome: FollowerOutcome | None) -> bool:
    """Whether the fetcher waits ``replica.fetch.backoff.ms`` before its
    next fetch, after an answer with ``error`` that the partition handled
    with ``outcome`` (None: the partition is no longer fetched here).

    Kafka's ``processFetchRequest`` delays the partitions it puts in
    ``partitionsWithError``: an error answer it could not act on, and a
    local failure to take the answer (the append refused,
    ``handlePartitionsWithErrors``). An ``OFFSET_OUT_OF_RANGE`` that
    ``handleOutOfRangeError`` resolved (a truncation or a restart of the
    log) fetches on at once, as does a stale answer."""
    if outcome is None:
        return error is not Errors.NONE
    return outcome.step in (FollowerStep.BACKOFF, FollowerStep.WAIT_FOR_METADATA)

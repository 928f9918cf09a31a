"""Timing and size settings of the consensus core.

Every value is in milliseconds of the caller's clock, since the core never
reads a clock itself.  Kafka's KRaft defaults are election 1000, fetch
timeout 2000, long poll 500 and request timeout 2000 ms; kq's are shorter so
that a failed leader is replaced in a fraction of a second (kq's failover
target: under 300 ms at the median), while pre-vote and check-quorum keep the
short timers from disrupting a healthy leader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["QuorumConfig"]


@dataclass(frozen=True, slots=True)
class QuorumConfig:
    # An unattached voter starts a pre-vote after a random delay in
    # [election_timeout_ms, 2 * election_timeout_ms) (KIP-595).
    election_timeout_ms: int = 300
    # A follower that has not had a successful fetch from its leader for this
    # long considers the leader gone.
    fetch_timeout_ms: int = 1500
    # Cap of the exponential backoff after a lost election.
    election_backoff_max_ms: int = 300
    # Base of the backoffs (lost election, preferred-successor position).
    retry_backoff_ms: int = 20
    # The leader holds a fetch with nothing to return for up to this long.
    fetch_max_wait_ms: int = 300
    # A request with no answer after this long (plus the long-poll wait for
    # fetches) is sent again; it must end before the fetch timeout.
    request_timeout_ms: int = 1000
    # Most bytes of batches in one fetch response; at least one batch is
    # always returned so a large batch cannot stall replication.
    fetch_max_bytes: int = 8 * 1024 * 1024
    # Most bytes of one FetchSnapshot chunk (KIP-630).
    snapshot_chunk_bytes: int = 1024 * 1024
    # Most bytes of committed batches handed out in one Ready (at least one
    # batch): a node catching up on a long log applies it in steps, and its
    # driver stays responsive in between (etcd's MaxCommittedSizePerReady).
    max_apply_bytes: int = 4 * 1024 * 1024
    # Check-quorum: a leader not fetched from by a majority for
    # check_quorum_factor * fetch_timeout_ms resigns (KAFKA-15489).
    check_quorum_factor: float = 1.5

    def __post_init__(self) -> None:
        for name in (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "election_backoff_max_ms",
            "request_timeout_ms",
            "fetch_max_bytes",
            "snapshot_chunk_bytes",
            "max_apply_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.retry_backoff_ms < 0 or self.fetch_max_wait_ms < 0:
            raise ValueError("retry_backoff_ms and fetch_max_wait_ms must not be negative")
        if self.fetch_max_wait_ms >= self.fetch_timeout_ms:
            # A follower whose fetch is parked for longer than its fetch
            # timeout would start elections against a healthy leader.
            raise ValueError(
                f"fetch_max_wait_ms ({self.fetch_max_wait_ms}) must be below "
                f"fetch_timeout_ms ({self.fetch_timeout_ms})"
            )
        if self.fetch_max_wait_ms + self.request_timeout_ms >= self.fetch_timeout_ms:
            # A lost fetch is retried after the long-poll wait plus the request
            # timeout; the retry must come before the follower gives up on a
            # healthy leader.
            raise ValueError(
                f"fetch_max_wait_ms + request_timeout_ms ({self.fetch_max_wait_ms} + "
                f"{self.request_timeout_ms}) must be below fetch_timeout_ms "
                f"({self.fetch_timeout_ms})"
            )
        if not math.isfinite(self.check_quorum_factor) or self.check_quorum_factor < 1.0:
            raise ValueError(
                f"check_quorum_factor must be a finite number of at least 1.0, "
                f"got {self.check_quorum_factor}"
            )

    @property
    def check_quorum_timeout_ms(self) -> int:
        return int(self.check_quorum_factor * self.fetch_timeout_ms)

"""Pure quorum arithmetic: commit offsets and vote tallies.

Kept apart from the state machine (as etcd-io/raft's ``quorum/majority.go``)
so the rules can be tested as tables.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

from quorum.types import NodeId

__all__ = ["VoteResult", "committed_offset", "vote_result"]


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def committed_offset(voters: Iterable[NodeId], acked: Mapping[NodeId, int]) -> int:
    """The largest offset that a majority of ``voters`` has reached.

    Voters missing from ``acked`` count as offset 0.  Sorting descending and
    taking index ``n // 2`` is Kafka's ``LeaderState.maybeUpdateHighWatermark``:
    with n voters, that many-plus-one of them have at least this offset.
    """
    offsets = sorted((acked.get(v, 0) for v in voters), reverse=True)
    if not offsets:
        raise ValueError("no voters")
    return offsets[len(offsets) // 2]


def vote_result(
    voters: Iterable[NodeId], granted: Iterable[NodeId], rejected: Iterable[NodeId]
) -> VoteResult:
    """WON once a majority granted, LOST once a majority can no longer grant."""
    voter_set = set(voters)
    granted_set = set(granted)
    need = len(voter_set) // 2 + 1
    yes = len(voter_set & granted_set)
    no = len(voter_set.intersection(rejected) - granted_set)
    if yes >= need:
        return VoteResult.WON
    if len(voter_set) - no < need:
        return VoteResult.LOST
    return VoteResult.PENDING

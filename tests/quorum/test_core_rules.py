"""Each protocol rule of RaftCore, in isolation.

A test builds one core on in-memory stores (``tests.quorum.core_driver``),
feeds it hand-made messages and looks at what it sends and persists.  The
driver carries out every Ready as the simulator's node does, so "sent" means
"left the node after the Ready's writes were durable".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from quorum.core import InvalidProposalError, NotLeaderError, ProposeResult, RaftCore
from quorum.memory import MemoryStores
from quorum.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum.ready import Ready
from quorum.types import (
    Batch,
    BatchKind,
    LeaderAndEpoch,
    LeaderChange,
    OffsetAndEpoch,
    QuorumState,
    Role,
    SnapshotId,
    VoterSet,
)
from tests.quorum.core_driver import (
    CONFIG,
    Driver,
    batch,
    batches_of,
    fetch_reply,
    make_leader,
    of_type,
    snapshot_reply,
)


def only(messages: Sequence[Message], kind: type, **fields: object) -> Message:
    """The one message of ``kind`` (optionally with these field values)."""
    found = [
        m
        for m in messages
        if isinstance(m, kind) and all(getattr(m, k) == v for k, v in fields.items())
    ]
    assert len(found) == 1, f"want one {kind.__name__} {fields} in {messages}"
    return found[0]


def fetch_in(messages: Sequence[Message]) -> FetchRequest:
    """The one FetchRequest among ``messages``."""
    fetch = only(messages, FetchRequest)
    assert isinstance(fetch, FetchRequest)
    return fetch


def follower(
    node: int = 1,
    leader: int = 2,
    epoch: int = 3,
    *,
    voters: Sequence[int] = (1, 2, 3),
    log: Sequence[Batch] = (),
) -> tuple[Driver, list[Message]]:
    """A voter that heard BeginQuorumEpoch from ``leader``; returns what it sent."""
    d = Driver.new(node, voters, log=log, state=QuorumState(epoch - 1, None, None))
    d.drain()
    return d, d.begin_epoch(leader, epoch)


# =============================================================================
# Vote rule (Raft §3.4/§3.6.1, KIP-595)
# =============================================================================


def test_vote_one_per_epoch() -> None:
    d = Driver.new(1)
    d.drain()
    first = only(d.vote_request(2, 1, 0, 0), VoteResponse)
    assert isinstance(first, VoteResponse)
    assert (first.granted, first.epoch, first.error) == (True, 1, ErrorCode.NONE)
    assert d.core.voted_for == 2
    # Another candidate of the same epoch is refused, whatever its log.
    other = only(d.vote_request(3, 1, 5, 100), VoteResponse)
    assert isinstance(other, VoteResponse)
    assert not other.granted
    assert d.core.voted_for == 2
    # The same candidate again (a re-sent request) is granted again.
    again = only(d.vote_request(2, 1, 0, 0), VoteResponse)
    assert isinstance(again, VoteResponse) and again.granted
    assert d.stores.state.durable() == QuorumState(1, 2, None)


def test_vote_in_a_new_epoch_may_go_to_another_candidate() -> None:
    d = Driver.new(1)
    d.drain()
    d.vote_request(2, 1, 0, 0)
    resp = only(d.vote_request(3, 2, 0, 0), VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted and resp.epoch == 2
    assert d.stores.state.durable() == QuorumState(2, 3, None)


# The voter's log ends at offset 10 in epoch 2 (epoch 1: [0,4), epoch 2: [4,10)).
UP_TO_DATE = [
    (2, 10, True),  # the same
    (2, 11, True),  # longer, same last epoch
    (3, 1, True),  # newer last epoch beats length
    (9, 0, True),
    (2, 9, False),  # shorter, same last epoch
    (1, 100, False),  # older last epoch loses despite length
    (0, 0, False),
]


@pytest.mark.parametrize(("last_epoch", "end_offset", "granted"), UP_TO_DATE)
def test_vote_only_for_an_up_to_date_log(last_epoch: int, end_offset: int, granted: bool) -> None:
    d = Driver.new(1, log=batches_of((1, 4), (2, 6)), state=QuorumState(2, None, None))
    d.drain()
    resp = only(d.vote_request(3, 5, last_epoch, end_offset), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert resp.granted is granted
    assert resp.epoch == 5  # the request's newer epoch was adopted either way
    assert d.core.voted_for == (3 if granted else None)
    assert d.stores.state.durable() == QuorumState(5, 3 if granted else None, None)


@pytest.mark.parametrize("pre_vote", [False, True])
def test_vote_refused_below_own_epoch(pre_vote: bool) -> None:
    d = Driver.new(1, state=QuorumState(7, None, None))
    d.drain()
    resp = only(d.vote_request(2, 6, 9, 100, pre_vote=pre_vote), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert not resp.granted
    assert resp.epoch == 7
    assert resp.error is ErrorCode.FENCED_LEADER_EPOCH
    assert resp.pre_vote is pre_vote
    assert (d.core.epoch, d.core.voted_for) == (7, None)


@pytest.mark.parametrize("pre_vote", [False, True])
def test_vote_refused_for_a_non_voter_candidate(pre_vote: bool) -> None:
    d = Driver.new(1)
    d.drain()
    resp = only(d.vote_request(9, 4, 9, 100, pre_vote=pre_vote), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert not resp.granted
    assert resp.error is ErrorCode.INCONSISTENT_VOTER_SET
    # Nothing about the non-voter's epoch was adopted.
    assert (d.core.epoch, d.core.voted_for) == (0, None)
    assert all(r.quorum_state is None for r in d.readies)


def test_observer_does_not_vote() -> None:
    d = Driver.new(9, voters=(1, 2, 3))
    d.drain()
    resp = only(d.vote_request(2, 1, 0, 0), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert not resp.granted and resp.error is ErrorCode.INCONSISTENT_VOTER_SET
    assert d.core.voted_for is None


@pytest.mark.parametrize("role", ["leader", "follower", "candidate"])
def test_vote_refused_in_same_epoch_by_leader_follower_candidate(role: str) -> None:
    if role == "leader":
        d = make_leader(1)
    elif role == "follower":
        d, _ = follower(1, leader=2, epoch=1)
    else:
        d = Driver.new(1)
        d.drain()
        d.tick(5000)
        d.step(VoteResponse(2, 1, 0, None, True, True))
        assert d.core.role is Role.CANDIDATE
    epoch = d.core.epoch
    resp = only(d.vote_request(3, epoch, 99, 99), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert not resp.granted and resp.epoch == epoch
    assert d.core.voted_for != 3


def test_vote_refused_in_an_epoch_whose_leader_is_known() -> None:
    """A follower that timed out on its leader (now Prospective, same epoch)
    still refuses a real vote in that epoch: the epoch has a leader."""
    d, _ = follower(1, leader=2, epoch=3)
    d.tick(d.now + CONFIG.fetch_timeout_ms)
    assert (d.core.role, d.core.epoch, d.core.leader_id) == (Role.PROSPECTIVE, 3, 2)
    resp = only(d.vote_request(3, 3, 9, 99), VoteResponse)
    assert isinstance(resp, VoteResponse) and not resp.granted
    assert d.core.voted_for is None
    # In the next epoch it may vote.
    resp = only(d.vote_request(3, 4, 9, 99), VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted


def test_vote_grant_is_in_the_ready_that_persists_it_with_must_sync() -> None:
    d = Driver.new(1)
    d.drain()
    d.core.step(VoteRequest(2, 1, 4, 0, 0, False), 0)
    ready = d.core.ready()
    assert ready is not None
    assert ready.quorum_state == QuorumState(4, 2, None)
    assert ready.must_sync
    resp = only(ready.messages, VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted
    # Carried out by the driver: the vote is on disk before the grant leaves.
    d.persist(ready)
    assert d.stores.state.durable() == QuorumState(4, 2, None)
    d.core.advance(ready)


def test_refused_vote_in_a_newer_epoch_still_persists_the_epoch() -> None:
    d = Driver.new(1, log=batches_of((1, 3)), state=QuorumState(1, None, None))
    d.drain()
    d.core.step(VoteRequest(2, 1, 4, 0, 0, False), 0)
    ready = d.core.ready()
    assert ready is not None
    assert ready.quorum_state == QuorumState(4, None, None)
    assert ready.must_sync
    resp = only(ready.messages, VoteResponse)
    assert isinstance(resp, VoteResponse) and not resp.granted


# =============================================================================
# Pre-vote (KIP-996)
# =============================================================================


def test_pre_vote_granted_by_unattached_voter_changes_no_state() -> None:
    d = Driver.new(1, log=batches_of((1, 2)), state=QuorumState(1, None, None))
    d.drain()
    sent = d.vote_request(2, 1, 1, 2, pre_vote=True)
    resp = only(sent, VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert resp.granted and resp.pre_vote
    assert (d.core.epoch, d.core.voted_for, d.core.role) == (1, None, Role.UNATTACHED)
    assert all(r.quorum_state is None for r in d.readies)


@pytest.mark.parametrize(
    ("last_epoch", "end_offset", "granted"), [(1, 2, True), (1, 1, False), (2, 0, True)]
)
def test_pre_vote_needs_an_up_to_date_log(last_epoch: int, end_offset: int, granted: bool) -> None:
    d = Driver.new(1, log=batches_of((1, 2)), state=QuorumState(1, None, None))
    d.drain()
    resp = only(d.vote_request(2, 1, last_epoch, end_offset, pre_vote=True), VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted is granted


def test_pre_vote_in_a_newer_epoch_changes_no_state() -> None:
    d = Driver.new(1, state=QuorumState(1, 3, None))
    d.drain()
    resp = only(d.vote_request(2, 6, 0, 0, pre_vote=True), VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted
    assert resp.epoch == 1
    assert (d.core.epoch, d.core.voted_for) == (1, 3)
    assert all(r.quorum_state is None for r in d.readies)
    assert d.stores.state.durable() == QuorumState(1, 3, None)


def test_pre_vote_refused_by_follower_with_live_leader() -> None:
    d, _ = follower(1, leader=2, epoch=3)
    resp = only(d.vote_request(3, 3, 9, 99, pre_vote=True), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert not resp.granted
    assert resp.leader_id == 2
    assert d.core.role is Role.FOLLOWER and d.core.leader_id == 2


def test_pre_vote_refused_by_leader() -> None:
    d = make_leader(1)
    resp = only(d.vote_request(3, d.core.epoch, 9, 99, pre_vote=True), VoteResponse)
    assert isinstance(resp, VoteResponse)
    assert not resp.granted and resp.leader_id == 1
    assert d.core.role is Role.LEADER


def test_pre_vote_granted_by_follower_whose_leader_resigned() -> None:
    d, _ = follower(1, leader=2, epoch=3)
    d.step(EndQuorumEpochRequest(2, 1, 3, 2, (3, 1)))
    assert d.core.role is Role.FOLLOWER
    resp = only(d.vote_request(3, 3, 0, 0, pre_vote=True), VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted and resp.leader_id is None


def test_prospective_becomes_candidate_only_after_a_majority_of_pre_votes() -> None:
    d = Driver.new(1, voters=(1, 2, 3, 4, 5), state=QuorumState(4, None, None))
    d.drain()
    sent = d.tick(2 * CONFIG.election_timeout_ms)
    assert d.core.role is Role.PROSPECTIVE
    reqs = of_type(sent, VoteRequest)
    assert sorted(r.dst for r in reqs) == [2, 3, 4, 5]
    assert all(r.pre_vote and r.epoch == 4 for r in reqs)
    assert d.core.epoch == 4
    assert all(r.quorum_state is None for r in d.readies[1:])
    # One grant (plus its own) is 2 of 5: not enough; a refusal changes nothing.
    d.step(VoteResponse(2, 1, 4, None, True, True))
    d.step(VoteResponse(3, 1, 4, None, False, True))
    assert (d.core.role, d.core.epoch) == (Role.PROSPECTIVE, 4)
    # A duplicate grant from the same voter does not count twice.
    d.step(VoteResponse(2, 1, 4, None, True, True))
    assert d.core.role is Role.PROSPECTIVE
    # A real-vote response is not a pre-vote grant.
    d.step(VoteResponse(4, 1, 4, None, True, False))
    assert d.core.role is Role.PROSPECTIVE
    n = len(d.readies)
    sent = d.step(VoteResponse(5, 1, 4, None, True, True))
    assert (d.core.role, d.core.epoch, d.core.voted_for) == (Role.CANDIDATE, 5, 1)
    votes = of_type(sent, VoteRequest)
    assert sorted(v.dst for v in votes) == [2, 3, 4, 5]
    assert all(not v.pre_vote and v.epoch == 5 for v in votes)
    ready = d.readies[n]
    assert ready.quorum_state == QuorumState(5, 1, None) and ready.must_sync
    assert d.stores.state.durable() == QuorumState(5, 1, None)


def test_prospective_that_loses_pre_vote_backs_off_without_new_epoch() -> None:
    d = Driver.new(1, state=QuorumState(2, None, None))
    d.drain()
    d.tick(2 * CONFIG.election_timeout_ms)
    d.step(VoteResponse(2, 1, 2, None, False, True))
    d.step(VoteResponse(3, 1, 2, None, False, True))
    assert (d.core.role, d.core.epoch) == (Role.PROSPECTIVE, 2)
    # After the backoff it asks again, still at epoch 2.
    sent = d.tick(d.core.next_deadline_ms())
    reqs = of_type(sent, VoteRequest)
    assert reqs and all(r.pre_vote and r.epoch == 2 for r in reqs)
    assert d.core.epoch == 2


@pytest.mark.parametrize("pre_vote", [True, False])
def test_unanswered_vote_requests_are_resent_after_request_timeout(pre_vote: bool) -> None:
    d = Driver.new(1, voters=(1, 2, 3), config=replace(CONFIG, election_timeout_ms=5000))
    d.drain()
    d.tick(10_000)
    if not pre_vote:
        d.step(VoteResponse(2, 1, 0, None, True, True))
    assert d.core.role is (Role.PROSPECTIVE if pre_vote else Role.CANDIDATE)
    t0 = d.now
    d.step(VoteResponse(2, 1, d.core.epoch, None, False, pre_vote))  # 2 answered: refused
    assert of_type(d.tick(t0 + CONFIG.request_timeout_ms - 1), VoteRequest) == []
    again = of_type(d.tick(t0 + CONFIG.request_timeout_ms), VoteRequest)
    assert [(r.dst, r.pre_vote) for r in again] == [(3, pre_vote)]


def test_single_voter_elects_itself() -> None:
    d = Driver.new(1, voters=(1,))
    d.drain()
    d.tick(2 * CONFIG.election_timeout_ms)
    assert (d.core.role, d.core.epoch) == (Role.LEADER, 1)


def test_candidate_wins_with_majority_of_votes() -> None:
    d = Driver.new(1, voters=(1, 2, 3))
    d.drain()
    d.tick(2 * CONFIG.election_timeout_ms)
    d.step(VoteResponse(2, 1, 0, None, True, True))
    assert d.core.role is Role.CANDIDATE
    # A late pre-vote answer does not count as a vote.
    d.step(VoteResponse(3, 1, 1, None, True, True))
    assert d.core.role is Role.CANDIDATE
    d.step(VoteResponse(3, 1, 1, None, True, False))
    assert d.core.role is Role.LEADER


# =============================================================================
# BeginQuorumEpoch and the epoch-opening LeaderChange
# =============================================================================


def test_begin_quorum_epoch_makes_voter_a_follower_that_fetches() -> None:
    d, sent = follower(1, leader=2, epoch=3, log=batches_of((1, 2), (2, 3)))
    assert (d.core.role, d.core.epoch, d.core.leader_id) == (Role.FOLLOWER, 3, 2)
    ack = only(sent, BeginQuorumEpochResponse)
    assert isinstance(ack, BeginQuorumEpochResponse)
    assert (ack.dst, ack.epoch, ack.leader_id, ack.error) == (2, 3, 2, ErrorCode.NONE)
    fetch = only(sent, FetchRequest)
    assert isinstance(fetch, FetchRequest)
    assert (fetch.dst, fetch.epoch, fetch.fetch_offset, fetch.last_fetched_epoch) == (2, 3, 5, 2)
    assert d.stores.state.durable() == QuorumState(3, None, 2)
    assert any(r.leader_change == LeaderAndEpoch(2, 3) for r in d.readies)


def test_begin_quorum_epoch_from_an_old_epoch_is_fenced() -> None:
    d, _ = follower(1, leader=2, epoch=3)
    resp = only(d.step(BeginQuorumEpochRequest(3, 1, 2, 3)), BeginQuorumEpochResponse)
    assert isinstance(resp, BeginQuorumEpochResponse)
    assert (resp.error, resp.epoch, resp.leader_id) == (ErrorCode.FENCED_LEADER_EPOCH, 3, 2)
    assert d.core.leader_id == 2


def test_leader_opens_its_epoch_with_a_leader_change_batch() -> None:
    d = Driver.new(1, log=batches_of((1, 4)), state=QuorumState(1, None, None))
    d.drain()
    sent = d.elect(granting=[3])
    assert d.core.epoch == 2
    entries = [b for r in d.readies for b in r.entries]
    assert len(entries) == 1
    lc = entries[0]
    assert (lc.kind, lc.base_offset, lc.epoch, len(lc.records)) == (
        BatchKind.LEADER_CHANGE,
        4,
        2,
        1,
    )
    assert LeaderChange.decode(lc.records[0]) == LeaderChange(1, (1, 2, 3), (1, 3))
    assert d.core.epoch_start_offset == 4
    assert d.stores.log.durable_batches()[-1] == lc
    begins = of_type(sent, BeginQuorumEpochRequest)
    assert sorted(b.dst for b in begins) == [2, 3]
    assert all(b.epoch == 2 and b.leader_id == 1 for b in begins)
    assert d.stores.state.durable() == QuorumState(2, 1, 1)


# =============================================================================
# Proposals
# =============================================================================


def test_leader_propose_returns_offsets_and_epoch() -> None:
    d = make_leader(1, log=batches_of((1, 4)), state=QuorumState(1, None, None))
    assert d.core.log.end_offset == 5  # 4 old records + the LeaderChange
    r1 = d.core.propose([b"a", b"b", b"c"], d.now)
    assert r1 == ProposeResult(5, 7, 2)
    r2 = d.core.propose([b"d"], d.now)
    assert r2 == ProposeResult(8, 8, 2)
    d.drain()
    tail = d.stores.log.durable_batches()[-2:]
    assert [(b.base_offset, b.records) for b in tail] == [(5, (b"a", b"b", b"c")), (8, (b"d",))]


def test_follower_propose_raises_not_leader() -> None:
    d, _ = follower(1, leader=2, epoch=3)
    with pytest.raises(NotLeaderError) as info:
        d.core.propose([b"x"], d.now)
    assert (info.value.leader_id, info.value.epoch) == (2, 3)


def test_unattached_propose_raises_not_leader_without_leader() -> None:
    d = Driver.new(1, state=QuorumState(4, 2, None))
    d.drain()
    with pytest.raises(NotLeaderError) as info:
        d.core.propose([b"x"], 0)
    assert (info.value.leader_id, info.value.epoch) == (None, 4)


@pytest.mark.parametrize(
    "records",
    [[], [b"a", "b"], ["a"], [bytearray(b"a")], [b"ok", None], [memoryview(b"a")]],
    ids=["empty", "str-second", "str", "bytearray", "none", "memoryview"],
)
def test_invalid_proposal(records: list[object]) -> None:
    d = make_leader(1)
    end = d.core.log.end_offset
    with pytest.raises(InvalidProposalError):
        d.core.propose(records, d.now)  # type: ignore[arg-type]
    assert d.core.log.end_offset == end
    assert d.core.ready() is None


# =============================================================================
# High watermark
# =============================================================================


def leader_with_history() -> Driver:
    """Leader of epoch 2 over an epoch-1 log of 5 records; LeaderChange at 5."""
    d = make_leader(1, log=batches_of((1, 5)), state=QuorumState(1, None, None))
    assert (d.core.epoch, d.core.epoch_start_offset, d.core.log.end_offset) == (2, 5, 6)
    return d


def test_high_watermark_never_before_the_epoch_start() -> None:
    d = leader_with_history()
    # A majority (1 and 2) holds the old epoch's 5 records, but committing them
    # needs a record of the leader's own epoch (Raft §3.6.2, Figure 8).
    d.fetch(2, 5, 1)
    d.fetch(3, 5, 1)
    assert d.core.high_watermark == 0
    # Once a majority holds the LeaderChange record, everything below commits.
    d.fetch(2, 6, 2)
    assert d.core.high_watermark == 6


def test_high_watermark_is_the_majority_of_voters_fetch_offsets() -> None:
    d = make_leader(1, voters=(1, 2, 3, 4, 5))
    for rec in (b"a", b"b", b"c"):
        d.propose(rec)
    assert d.core.log.end_offset == 4
    d.fetch(2, 4, 1)
    assert d.core.high_watermark == 0  # leader + 2 = 2 of 5
    d.fetch(3, 2, 1)
    assert d.core.high_watermark == 2  # 1:4, 2:4, 3:2 -> three have reached 2
    d.fetch(4, 3, 1)
    assert d.core.high_watermark == 3
    d.fetch(5, 4, 1)
    assert d.core.high_watermark == 4


def test_high_watermark_ignores_observers() -> None:
    d = make_leader(1)
    d.propose(b"a")
    d.fetch(9, 2, 1)
    d.fetch(8, 2, 1)
    assert d.core.high_watermark == 0
    d.fetch(2, 2, 1)
    assert d.core.high_watermark == 2


def test_high_watermark_never_decreases() -> None:
    d = make_leader(1)
    d.propose(b"a")
    d.fetch(2, 2, 1)
    d.fetch(3, 2, 1)
    assert d.core.high_watermark == 2
    # Both followers report lower offsets (a stale or truncated fetch).
    d.fetch(2, 1, 1)
    d.fetch(3, 0, 0)
    assert d.core.high_watermark == 2
    resp = of_type(d.fetch(2, 1, 1), FetchResponse)[0]
    assert resp.high_watermark == 2


def test_leader_counts_only_its_durable_end_offset() -> None:
    d = make_leader(1)
    d.fetch(2, 1, 1)
    d.fetch(3, 1, 1)
    assert d.core.high_watermark == 1
    # Propose but do not carry out the Ready yet: the batch is not durable.
    d.core.propose([b"x"], d.now)
    d.core.step(FetchRequest(2, 1, 1, 2, 1, 0, 1 << 20), d.now)  # 2 claims offset 2
    assert d.core.high_watermark == 1  # leader (1) and 3 (1) are the majority
    ready = d.core.ready()
    assert ready is not None and ready.entries
    assert d.core.high_watermark == 1  # handed out, still not durable
    d.persist(ready)
    d.core.advance(ready)
    assert d.core.high_watermark == 2


def test_single_voter_commits_on_advance() -> None:
    d = Driver.new(1, voters=(1,))
    d.drain()
    d.tick(5000)
    assert d.core.role is Role.LEADER
    assert d.core.high_watermark == 1
    d.core.propose([b"x", b"y"], d.now)
    assert d.core.high_watermark == 1
    ready = d.core.ready()
    assert ready is not None
    d.persist(ready)
    d.core.advance(ready)
    assert d.core.high_watermark == 3
    ready = d.core.ready()
    assert ready is not None
    assert [b.base_offset for b in ready.committed] == [1]
    assert ready.high_watermark == 3


def test_follower_backs_off_after_an_error_answer() -> None:
    d, sent = follower(1, leader=2, epoch=3)
    fetch = fetch_in(sent)
    t0 = d.now
    err = fetch_reply(fetch, error=ErrorCode.UNKNOWN_LEADER_EPOCH)
    assert of_type(d.step(err), FetchRequest) == []
    assert d.core.next_deadline_ms() == t0 + CONFIG.retry_backoff_ms
    assert of_type(d.tick(t0 + CONFIG.retry_backoff_ms - 1), FetchRequest) == []
    again = only(d.tick(t0 + CONFIG.retry_backoff_ms), FetchRequest)
    assert isinstance(again, FetchRequest) and again.fetch_offset == fetch.fetch_offset


@pytest.mark.parametrize(
    "batches",
    [(batch(3, 3, 1),), (batch(0, 1, 1), batch(3, 3, 1))],
    ids=["gap", "gap-after-known"],
)
def test_follower_ignores_batches_that_do_not_continue_its_log(batches: tuple[Batch, ...]) -> None:
    d, sent = follower(1, leader=2, epoch=3, log=batches_of((1, 2)))
    fetch = fetch_in(sent)
    assert fetch.fetch_offset == 2
    sent = d.step(fetch_reply(fetch, batches=batches))
    assert d.core.log.end_offset == 2
    again = only(sent, FetchRequest)
    assert isinstance(again, FetchRequest) and again.fetch_offset == 2


def test_follower_ignores_stale_or_duplicate_fetch_responses() -> None:
    d, sent = follower(1, leader=2, epoch=3)
    resp = fetch_reply(fetch_in(sent), batches=(batch(0, 3, 1),))
    nxt = fetch_in(d.step(resp))
    assert d.core.log.end_offset == 1
    d.step(resp)  # the same answer again: not the fetch in flight
    d.step(fetch_reply(nxt, batches=(batch(1, 3, 5),), src=3))  # not from the leader
    assert d.core.log.end_offset == 1
    d.step(fetch_reply(nxt, batches=(batch(1, 3, 2),)))
    assert d.core.log.end_offset == 3


def test_follower_high_watermark_is_capped_by_its_log_and_monotonic() -> None:
    d, sent = follower(1, leader=2, epoch=3)
    resp = fetch_reply(fetch_in(sent), high_watermark=50, batches=(batch(0, 3, 4),))
    sent = d.step(resp)
    assert d.core.high_watermark == 4  # min(leader's 50, own end 4)
    nxt = fetch_in(sent)
    assert nxt.fetch_offset == 4
    # A leader reporting a lower high watermark does not move ours back.
    d.step(fetch_reply(nxt, high_watermark=1, batches=(batch(4, 3, 1),)))
    assert d.core.high_watermark == 4
    assert d.core.log.end_offset == 5


# =============================================================================
# Fetch: the leader side
# =============================================================================


def divergence_leader() -> Driver:
    """Leader (epoch 4) with log: e1 [0,3), e3 [3,6), LeaderChange e4 [6,7)."""
    return make_leader(1, log=[batch(0, 1, 3), batch(3, 3, 3)], state=QuorumState(3, None, None))


DIVERGENCE = [
    # (follower's fetch offset, last fetched epoch) -> what the leader answers
    (5, 2, OffsetAndEpoch(1, 3)),  # extra entries of an epoch the leader never had
    (3, 2, OffsetAndEpoch(1, 3)),
    (8, 3, OffsetAndEpoch(3, 6)),  # longer epoch-3 tail than the leader's
    (4, 0, OffsetAndEpoch(0, 0)),  # nothing in common
    (9, 5, OffsetAndEpoch(4, 7)),  # epoch the leader does not know (newer)
]


@pytest.mark.parametrize(("offset", "last_epoch", "diverging"), DIVERGENCE)
def test_fetch_divergence(offset: int, last_epoch: int, diverging: OffsetAndEpoch) -> None:
    d = divergence_leader()
    resp = only(d.fetch(2, offset, last_epoch), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.error is ErrorCode.NONE
    assert resp.diverging == diverging
    assert resp.batches == () and resp.snapshot_id is None


@pytest.mark.parametrize(
    ("offset", "last_epoch", "first_base"), [(3, 1, 3), (6, 3, 6), (0, 0, 0), (7, 4, None)]
)
def test_fetch_matching_log_gets_batches(
    offset: int, last_epoch: int, first_base: int | None
) -> None:
    d = divergence_leader()
    resp = only(d.fetch(2, offset, last_epoch), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.diverging is None and resp.snapshot_id is None
    assert (resp.batches[0].base_offset if resp.batches else None) == first_base


# The follower's log; the leader's diverging answer; where the follower
# truncates (Kafka's truncateToEndOffset: never past either side's end of
# that epoch, never splitting a batch).
TRUNCATIONS = [
    # an epoch-2 tail the leader lacks: back to the end of epoch 1
    ([(0, 1, 3), (3, 2, 2)], OffsetAndEpoch(1, 3), 3),
    # a longer epoch-3 tail than the leader's epoch 3
    ([(0, 1, 3), (3, 3, 2), (5, 3, 3)], OffsetAndEpoch(3, 5), 5),
    # the leader's epoch 3 is longer than ours: our own end of epoch 3
    ([(0, 1, 3), (3, 3, 2), (5, 4, 1)], OffsetAndEpoch(3, 9), 5),
    # we never had the leader's epoch 2: our end of the epoch below it
    ([(0, 1, 3), (3, 3, 2)], OffsetAndEpoch(2, 4), 3),
    # the leader's epoch ends inside one of our batches: the batch goes
    ([(0, 1, 3), (3, 3, 4)], OffsetAndEpoch(3, 5), 3),
]


@pytest.mark.parametrize(("stored", "diverging", "new_end"), TRUNCATIONS)
def test_follower_truncation_point(
    stored: list[tuple[int, int, int]], diverging: OffsetAndEpoch, new_end: int
) -> None:
    log = [batch(b, e, n) for b, e, n in stored]
    d, sent = follower(1, leader=2, epoch=6, log=log)
    sent = d.step(fetch_reply(fetch_in(sent), diverging=diverging))
    assert d.core.log.end_offset == new_end
    assert d.stores.log.durable_batches() == [b for b in log if b.end_offset <= new_end]
    again = only(sent, FetchRequest)
    assert isinstance(again, FetchRequest) and again.fetch_offset == new_end


def test_follower_truncates_to_the_divergence_and_refetches() -> None:
    # The follower holds e1 [0,3) and an epoch-2 tail [3,5) the leader lacks.
    d, sent = follower(1, leader=2, epoch=4, log=[batch(0, 1, 3), batch(3, 2, 2)])
    fetch = fetch_in(sent)
    assert (fetch.fetch_offset, fetch.last_fetched_epoch) == (5, 2)
    n = len(d.readies)
    sent = d.step(fetch_reply(fetch, diverging=OffsetAndEpoch(1, 3)))
    assert any(r.truncate_to == 3 and r.must_sync for r in d.readies[n:])
    assert d.core.log.end_offset == 3
    assert [b.end_offset for b in d.stores.log.durable_batches()] == [3]
    again = only(sent, FetchRequest)
    assert isinstance(again, FetchRequest)
    assert (again.fetch_offset, again.last_fetched_epoch) == (3, 1)


def snapshot_leader() -> Driver:
    """Leader (epoch 3) of a log compacted to snapshot (10, 2); LC at 12."""
    snap = SnapshotId(10, 2)
    return make_leader(
        1,
        log=batches_of((2, 2), start=10),
        state=QuorumState(2, None, None),
        snapshot=(snap, b"0123456789abcdefghijklmnopqrstuvwxy"),
    )


@pytest.mark.parametrize(("offset", "last_epoch"), [(0, 0), (5, 1), (9, 2), (10, 1), (10, 0)])
def test_fetch_below_log_start_gets_snapshot_pointer(offset: int, last_epoch: int) -> None:
    d = snapshot_leader()
    assert d.core.log.start_offset == 10
    resp = only(d.fetch(2, offset, last_epoch), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.snapshot_id == SnapshotId(10, 2)
    assert resp.diverging is None and resp.batches == ()
    assert resp.log_start_offset == 10


def test_fetch_at_log_start_with_snapshot_epoch_gets_batches() -> None:
    d = snapshot_leader()
    resp = only(d.fetch(2, 10, 2), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.snapshot_id is None and resp.diverging is None
    assert [b.base_offset for b in resp.batches] == [10, 12]


def test_long_poll_parks_and_answers_on_append() -> None:
    d = make_leader(1)
    d.fetch(3, 1, 1)
    d.fetch(2, 1, 1)
    assert d.core.high_watermark == 1
    sent = d.fetch(2, 1, 1, max_wait_ms=400)
    assert of_type(sent, FetchResponse) == []  # parked: nothing new
    sent = d.propose(b"new")
    resp = only(sent, FetchResponse, dst=2)
    assert isinstance(resp, FetchResponse)
    assert [b.records for b in resp.batches] == [(b"new",)]
    assert resp.fetch_offset == 1


def test_long_poll_answers_empty_at_the_deadline() -> None:
    d = make_leader(1)
    d.fetch(3, 1, 1)
    d.fetch(2, 1, 1)
    t0 = d.now
    assert of_type(d.fetch(2, 1, 1, max_wait_ms=400), FetchResponse) == []
    assert d.core.next_deadline_ms() <= t0 + 400
    assert of_type(d.tick(t0 + 399), FetchResponse) == []
    resp = only(d.tick(t0 + 400), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.batches == () and resp.error is ErrorCode.NONE and resp.high_watermark == 1


def test_long_poll_wait_is_capped_by_fetch_max_wait() -> None:
    d = make_leader(1)
    d.fetch(3, 1, 1)
    d.fetch(2, 1, 1)
    t0 = d.now
    d.fetch(2, 1, 1, max_wait_ms=10 * CONFIG.fetch_max_wait_ms)
    assert of_type(d.tick(t0 + CONFIG.fetch_max_wait_ms - 1), FetchResponse) == []
    assert len(of_type(d.tick(t0 + CONFIG.fetch_max_wait_ms), FetchResponse)) == 1


def test_long_poll_answers_when_high_watermark_moves() -> None:
    d = make_leader(1, voters=(1, 2, 3, 4, 5))
    d.propose(b"a")
    d.fetch(3, 1, 1)
    # 3 waits at the end of the log; with the leader that is 2 of 5.
    assert of_type(d.fetch(3, 2, 1, max_wait_ms=400), FetchResponse) == []
    assert d.core.high_watermark == 0
    sent = d.fetch(2, 2, 1)  # 2 catches up: the high watermark moves to 2
    assert d.core.high_watermark == 2
    resp = only(sent, FetchResponse, dst=3)
    assert isinstance(resp, FetchResponse) and resp.high_watermark == 2


def test_fetch_that_advances_the_high_watermark_is_answered_at_once() -> None:
    d = make_leader(1)
    d.fetch(2, 1, 1)
    d.fetch(3, 1, 1)
    d.propose(b"a")
    resp = only(d.fetch(3, 1, 1, max_wait_ms=500), FetchResponse)
    assert isinstance(resp, FetchResponse) and resp.high_watermark == 1
    # 3 now holds offset 1, which makes a majority: the high watermark moves to
    # 2, which 3 cannot know unless this fetch is answered.
    sent = d.fetch(3, 2, 1, max_wait_ms=500)
    assert d.core.high_watermark == 2
    resp = only(sent, FetchResponse, dst=3)
    assert isinstance(resp, FetchResponse) and resp.high_watermark == 2


def test_fetch_with_older_epoch_is_fenced() -> None:
    d = make_leader(1, state=QuorumState(4, None, None))
    assert d.core.epoch == 5
    resp = only(d.fetch(2, 0, 0, epoch=4), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.error is ErrorCode.FENCED_LEADER_EPOCH
    assert (resp.epoch, resp.leader_id) == (5, 1)
    assert resp.batches == ()


def test_fetch_with_newer_epoch_is_unknown() -> None:
    d = make_leader(1)
    resp = only(d.fetch(2, 0, 0, epoch=7), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.error is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert d.core.role is Role.LEADER


def test_non_leader_answers_not_leader_with_its_leader() -> None:
    d, _ = follower(1, leader=2, epoch=3)
    resp = only(d.fetch(3, 0, 0, epoch=3), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert resp.error is ErrorCode.NOT_LEADER
    assert (resp.epoch, resp.leader_id) == (3, 2)


def test_unattached_answers_not_leader_without_leader() -> None:
    d = Driver.new(1, state=QuorumState(3, None, None))
    d.drain()
    resp = only(d.fetch(9, 0, 0, epoch=3), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert (resp.error, resp.epoch, resp.leader_id) == (ErrorCode.NOT_LEADER, 3, None)


def test_fetch_respects_max_bytes_but_returns_at_least_one_batch() -> None:
    d = make_leader(1)
    for _ in range(3):
        d.propose(b"x" * 100)
    resp = only(d.fetch(2, 1, 1, max_bytes=1), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert [b.base_offset for b in resp.batches] == [1]
    resp = only(d.fetch(2, 1, 1, max_bytes=2 * 116), FetchResponse)
    assert isinstance(resp, FetchResponse)
    assert [b.base_offset for b in resp.batches] == [1, 2]


# =============================================================================
# FetchSnapshot (KIP-630)
# =============================================================================

SNAP = SnapshotId(10, 2)
SNAP_DATA = b"0123456789abcdefghijklmnopqrstuvwxy"  # 35 bytes


def fetch_snapshot(
    d: Driver, position: int, max_bytes: int = 1 << 20, sid: SnapshotId = SNAP
) -> FetchSnapshotResponse:
    resp = only(
        d.step(FetchSnapshotRequest(2, 1, d.core.epoch, sid, position, max_bytes)),
        FetchSnapshotResponse,
    )
    assert isinstance(resp, FetchSnapshotResponse)
    return resp


@pytest.mark.parametrize(
    ("position", "max_bytes", "data"),
    [
        (0, 1 << 20, b"0123456789"),  # capped at snapshot_chunk_bytes (10)
        (0, 4, b"0123"),  # or at the request's max_bytes
        (10, 1 << 20, b"abcdefghij"),
        (30, 1 << 20, b"uvwxy"),
        (34, 1 << 20, b"y"),
        (35, 1 << 20, b""),  # exactly the end
    ],
)
def test_fetch_snapshot_chunks(position: int, max_bytes: int, data: bytes) -> None:
    d = snapshot_leader()
    resp = fetch_snapshot(d, position, max_bytes)
    assert resp.error is ErrorCode.NONE
    assert (resp.position, resp.size, resp.data) == (position, 35, data)
    assert len(resp.data) <= CONFIG.snapshot_chunk_bytes


def test_fetch_snapshot_whole_download_reassembles() -> None:
    d = snapshot_leader()
    got, position = b"", 0
    while position < len(SNAP_DATA):
        resp = fetch_snapshot(d, position)
        got += resp.data
        position += len(resp.data)
    assert got == SNAP_DATA


@pytest.mark.parametrize("position", [36, 100, -1])
def test_fetch_snapshot_position_out_of_range(position: int) -> None:
    d = snapshot_leader()
    resp = fetch_snapshot(d, position)
    assert resp.error is ErrorCode.POSITION_OUT_OF_RANGE
    assert resp.data == b""


@pytest.mark.parametrize("sid", [SnapshotId(10, 1), SnapshotId(11, 2), SnapshotId(5, 1)])
def test_fetch_snapshot_not_found(sid: SnapshotId) -> None:
    d = snapshot_leader()
    resp = fetch_snapshot(d, 0, sid=sid)
    assert resp.error is ErrorCode.SNAPSHOT_NOT_FOUND
    assert resp.data == b""


def test_fetch_snapshot_from_non_leader() -> None:
    d, _ = follower(1, leader=2, epoch=3)
    req = FetchSnapshotRequest(3, 1, 3, SNAP, 0, 100)
    resp = only(d.step(req), FetchSnapshotResponse)
    assert isinstance(resp, FetchSnapshotResponse)
    assert (resp.error, resp.leader_id) == (ErrorCode.NOT_LEADER, 2)


def test_follower_downloads_and_installs_snapshot() -> None:
    d, sent = follower(1, leader=2, epoch=3, log=batches_of((1, 2)))
    sent = d.step(fetch_reply(fetch_in(sent), high_watermark=12, snapshot_id=SNAP))
    req = only(sent, FetchSnapshotRequest)
    assert isinstance(req, FetchSnapshotRequest)
    assert (req.snapshot_id, req.position) == (SNAP, 0)
    position = 0
    while True:
        chunk = SNAP_DATA[position : position + 10]
        sent = d.step(snapshot_reply(req, chunk, len(SNAP_DATA)))
        position += len(chunk)
        if position >= len(SNAP_DATA):
            break
        req = only(sent, FetchSnapshotRequest)
        assert isinstance(req, FetchSnapshotRequest) and req.position == position
        assert d.stores.snapshots.latest() is None  # partial: invisible
    assert d.stores.snapshots.get(SNAP) == SNAP_DATA
    assert any(r.reset_to_snapshot == SNAP and r.load_snapshot == SNAP for r in d.readies)
    assert (d.core.log.start_offset, d.core.log.end_offset) == (10, 10)
    assert d.stores.log.durable_batches() == []
    assert d.core.high_watermark == 10
    fetch = only(sent, FetchRequest)
    assert isinstance(fetch, FetchRequest)
    assert (fetch.fetch_offset, fetch.last_fetched_epoch) == (10, 2)


# =============================================================================
# Check-quorum (KAFKA-15489)
# =============================================================================

CHECK_QUORUM_MS = CONFIG.check_quorum_timeout_ms  # 1.5 * 2000


def test_leader_resigns_without_majority_fetches_not_before() -> None:
    d = make_leader(1)
    t0 = d.now
    d.tick(t0 + CHECK_QUORUM_MS - 1)
    assert d.core.role is Role.LEADER
    sent = d.tick(t0 + CHECK_QUORUM_MS)
    assert d.core.role is Role.RESIGNED
    ends = of_type(sent, EndQuorumEpochRequest)
    assert sorted(e.dst for e in ends) == [2, 3]


def test_leader_resends_begin_quorum_epoch_to_voters_that_do_not_fetch() -> None:
    d = make_leader(1)
    t0 = d.now
    d.fetch_to_end(2, at=t0 + 100)
    half = CONFIG.fetch_timeout_ms // 2
    assert d.core.next_deadline_ms() == t0 + half
    assert of_type(d.tick(t0 + half - 1), BeginQuorumEpochRequest) == []
    again = of_type(d.tick(t0 + half), BeginQuorumEpochRequest)
    assert [(b.dst, b.epoch) for b in again] == [(3, 1)]
    # Acknowledging is not enough: a voter that does not fetch is asked again.
    d.step(BeginQuorumEpochResponse(3, 1, 1, 1))
    again = of_type(d.tick(t0 + 2 * half), BeginQuorumEpochRequest)
    assert [b.dst for b in again] == [3]
    # Once both fetch, nobody is asked.
    d.fetch_to_end(2, at=t0 + 2 * half + 100)
    d.fetch_to_end(3, at=t0 + 2 * half + 100)
    assert of_type(d.tick(t0 + 3 * half), BeginQuorumEpochRequest) == []


def test_leader_stays_while_a_majority_fetches() -> None:
    d = make_leader(1, voters=(1, 2, 3, 4, 5))
    t0 = d.now
    for t in range(t0, t0 + 10 * CHECK_QUORUM_MS, 1000):
        d.fetch_to_end(2, at=t)
        d.fetch_to_end(3, at=t + 500)
        d.tick(t + 999)
        assert d.core.role is Role.LEADER, t


def test_leader_resigns_when_only_a_minority_fetches() -> None:
    d = make_leader(1, voters=(1, 2, 3, 4, 5))
    t0 = d.now
    for t in range(t0, t0 + CHECK_QUORUM_MS, 1000):
        d.fetch_to_end(2, at=t)
        d.fetch_to_end(9, at=t)  # an observer does not count
        d.tick(t + 999)
        assert d.core.role is Role.LEADER
    d.tick(t0 + CHECK_QUORUM_MS)
    assert d.core.role is Role.RESIGNED


def test_check_quorum_counts_from_the_last_majority_fetch() -> None:
    d = make_leader(1)
    t0 = d.now
    d.fetch_to_end(2, at=t0 + 1000)
    d.tick(t0 + 1000 + CHECK_QUORUM_MS - 1)
    assert d.core.role is Role.LEADER
    d.tick(t0 + 1000 + CHECK_QUORUM_MS)
    assert d.core.role is Role.RESIGNED


def test_single_voter_leader_never_resigns_for_check_quorum() -> None:
    d = Driver.new(1, voters=(1,))
    d.drain()
    d.tick(5000)
    d.tick(5000 + 100 * CHECK_QUORUM_MS)
    assert d.core.role is Role.LEADER


# =============================================================================
# Resignation and preferred successors
# =============================================================================


def test_resign_sends_end_quorum_epoch_with_preferred_successor_first() -> None:
    d = make_leader(1, voters=(1, 2, 3, 4))
    d.propose(b"a")
    d.fetch(2, 2, 1)
    d.fetch(3, 1, 1)
    d.fetch(4, 0, 0)
    assert d.core.resign([4], now_ms=d.now)
    sent = d.drain()
    ends = of_type(sent, EndQuorumEpochRequest)
    assert [e.dst for e in ends] == [4, 2, 3]
    assert all(e.preferred_successors == (4, 2, 3) for e in ends)
    assert all(e.epoch == 1 and e.leader_id == 1 for e in ends)
    assert d.core.role is Role.RESIGNED


def test_resign_without_preference_orders_by_log_end() -> None:
    d = make_leader(1, voters=(1, 2, 3, 4))
    d.propose(b"a")
    d.fetch(3, 2, 1)
    d.fetch(4, 1, 1)
    d.core.resign()
    ends = of_type(d.drain(), EndQuorumEpochRequest)
    assert ends[0].preferred_successors == (3, 4, 2)


def test_resign_ignores_self_and_non_voters_in_preference() -> None:
    d = make_leader(1)
    d.core.resign([1, 9, 3])
    ends = of_type(d.drain(), EndQuorumEpochRequest)
    assert ends[0].preferred_successors == (3, 2)


def test_resign_with_duplicate_preference_names_each_voter_once() -> None:
    d = make_leader(1)
    d.core.resign([2, 2])
    ends = of_type(d.drain(), EndQuorumEpochRequest)
    assert [e.dst for e in ends] == [2, 3]
    assert ends[0].preferred_successors == (2, 3)


def test_resign_answers_parked_fetches_not_leader() -> None:
    d = make_leader(1)
    d.fetch(2, 1, 1)
    assert of_type(d.fetch(2, 1, 1, max_wait_ms=400), FetchResponse) == []  # parked
    d.core.resign()
    resp = only(d.drain(), FetchResponse)
    assert isinstance(resp, FetchResponse) and resp.error is ErrorCode.NOT_LEADER


def test_resigned_leader_resends_end_quorum_epoch_until_acknowledged() -> None:
    d = make_leader(1, voters=(1, 2, 3), config=replace(CONFIG, election_timeout_ms=5000))
    t0 = d.now
    d.core.resign()
    assert sorted(e.dst for e in of_type(d.drain(), EndQuorumEpochRequest)) == [2, 3]
    d.step(EndQuorumEpochResponse(2, 1, 1, None))
    assert of_type(d.tick(t0 + CONFIG.request_timeout_ms - 1), EndQuorumEpochRequest) == []
    again = of_type(d.tick(t0 + CONFIG.request_timeout_ms), EndQuorumEpochRequest)
    assert [e.dst for e in again] == [3]
    d.step(EndQuorumEpochResponse(3, 1, 1, None))
    assert of_type(d.tick(t0 + 3 * CONFIG.request_timeout_ms), EndQuorumEpochRequest) == []
    assert d.core.role is Role.RESIGNED


def test_resign_by_non_leader_returns_false() -> None:
    d, _ = follower()
    assert d.core.resign([3]) is False
    assert d.core.role is Role.FOLLOWER
    assert of_type(d.drain(), EndQuorumEpochRequest) == []


def test_first_successor_starts_pre_vote_at_once() -> None:
    d, _ = follower(3, leader=1, epoch=2)
    sent = d.step(EndQuorumEpochRequest(1, 3, 2, 1, (3, 2)))
    assert d.core.role is Role.PROSPECTIVE
    ack = only(sent, EndQuorumEpochResponse)
    assert isinstance(ack, EndQuorumEpochResponse) and ack.error is ErrorCode.NONE
    reqs = of_type(sent, VoteRequest)
    assert sorted(r.dst for r in reqs) == [1, 2]
    assert all(r.pre_vote and r.epoch == 2 for r in reqs)


def test_second_successor_waits_its_backoff() -> None:
    d, _ = follower(2, leader=1, epoch=2)
    t0 = d.now
    d.step(EndQuorumEpochRequest(1, 2, 2, 1, (3, 2)))
    assert d.core.role is Role.FOLLOWER
    backoff = CONFIG.retry_backoff_ms * 2  # position 1
    assert d.core.next_deadline_ms() == t0 + backoff
    d.tick(t0 + backoff - 1)
    assert d.core.role is Role.FOLLOWER
    d.tick(t0 + backoff)
    assert d.core.role is Role.PROSPECTIVE


def test_unattached_first_successor_starts_pre_vote_at_once() -> None:
    d = Driver.new(3, state=QuorumState(1, None, None))
    d.drain()
    d.step(EndQuorumEpochRequest(1, 3, 2, 1, (3, 2)))
    assert (d.core.role, d.core.epoch) == (Role.PROSPECTIVE, 2)


def test_end_quorum_epoch_from_an_old_epoch_is_fenced() -> None:
    d, _ = follower(3, leader=1, epoch=2)
    sent = d.step(EndQuorumEpochRequest(2, 3, 1, 2, (3,)))
    ack = only(sent, EndQuorumEpochResponse)
    assert isinstance(ack, EndQuorumEpochResponse)
    assert (ack.error, ack.epoch) == (ErrorCode.FENCED_LEADER_EPOCH, 2)
    assert d.core.role is Role.FOLLOWER


# =============================================================================
# Restart
# =============================================================================


def test_restart_of_a_leader_comes_back_resigned() -> None:
    d = make_leader(1)
    d.propose(b"a")
    d.restart()
    assert (d.core.role, d.core.epoch, d.core.leader_id) == (Role.RESIGNED, 1, 1)
    # It may not lead epoch 1 again: once its timer runs out it asks for epoch 2.
    d.drain()
    d.tick(d.now + CONFIG.election_timeout_ms - 1)
    assert d.core.role is Role.RESIGNED
    d.tick(d.now + 2 * CONFIG.election_timeout_ms)
    assert d.core.role is Role.PROSPECTIVE
    d.step(VoteResponse(2, 1, 1, None, True, True))
    assert (d.core.role, d.core.epoch) == (Role.CANDIDATE, 2)


def test_restarted_leader_asks_the_voters_to_elect_a_successor() -> None:
    d = Driver.new(1, state=QuorumState(4, 1, 1), log=batches_of((4, 1)))
    ends = of_type(d.drain(), EndQuorumEpochRequest)
    assert [e.dst for e in ends] == [2, 3]
    assert all(e.epoch == 4 and e.leader_id == 1 and e.preferred_successors == (2, 3) for e in ends)


def test_restart_of_a_resigned_leader_refuses_fetches() -> None:
    d = Driver.new(1, state=QuorumState(4, 1, 1), log=batches_of((4, 1)))
    d.drain()
    assert d.core.role is Role.RESIGNED
    resp = only(d.fetch(2, 1, 4, epoch=4), FetchResponse)
    assert isinstance(resp, FetchResponse) and resp.error is ErrorCode.NOT_LEADER


def test_restart_of_a_follower_comes_back_following() -> None:
    d, _ = follower(1, leader=2, epoch=3, log=batches_of((1, 2)))
    d.restart()
    assert (d.core.role, d.core.epoch, d.core.leader_id) == (Role.FOLLOWER, 3, 2)
    fetch = only(d.drain(), FetchRequest)
    assert isinstance(fetch, FetchRequest)
    assert (fetch.dst, fetch.epoch, fetch.fetch_offset, fetch.last_fetched_epoch) == (2, 3, 2, 1)


def test_restart_after_a_vote_keeps_the_vote() -> None:
    d = Driver.new(1)
    d.drain()
    d.vote_request(2, 3, 0, 0)
    d.restart()
    assert (d.core.role, d.core.epoch, d.core.voted_for) == (Role.UNATTACHED, 3, 2)
    d.drain()
    resp = only(d.vote_request(3, 3, 0, 0), VoteResponse)
    assert isinstance(resp, VoteResponse) and not resp.granted


def test_crash_before_the_ready_loses_the_unsent_vote() -> None:
    """The grant leaves only after the fsync, so a crash right after the
    step (before the Ready) loses a vote nobody saw."""
    d = Driver.new(1)
    d.drain()
    d.core.step(VoteRequest(2, 1, 3, 0, 0, False), 0)
    d.restart()
    assert (d.core.epoch, d.core.voted_for) == (0, None)


def test_restart_with_state_epoch_behind_the_log() -> None:
    """Kafka's QuorumState.initialize resets such a node to the log's epoch;
    failing at start-up with StorageCorruptError would do too.  Either way a
    node must never try to lead an epoch older than its own log."""
    from quorum.storage import StorageCorruptError

    try:
        d = Driver.new(1, voters=(1,), log=batches_of((3, 2)), state=QuorumState(0, None, None))
    except StorageCorruptError:
        return
    assert d.core.epoch >= 3
    d.drain()
    d.tick(5000)
    assert d.core.role is Role.LEADER and d.core.epoch > 3


def test_restart_with_a_fresh_store_is_unattached() -> None:
    d = Driver.new(1)
    assert (d.core.role, d.core.epoch, d.core.leader_id) == (Role.UNATTACHED, 0, None)
    ready = d.core.ready()
    assert ready is not None and ready.leader_change == LeaderAndEpoch(None, 0)


def start(log: Sequence[Batch], snapshot: SnapshotId | None) -> tuple[Driver, Ready | None]:
    d = Driver.new(
        1,
        log=log,
        state=QuorumState(5, None, None),
        snapshot=None if snapshot is None else (snapshot, b"snap"),
    )
    ready = d.core.ready()
    if ready is not None:
        d.persist(ready)
        d.core.advance(ready)
    return d, ready


S = SnapshotId(6, 2)

# Each case: the stored log (as (base, epoch, n) batches); what start-up does.
RECONCILE = [
    # The log begins right after the snapshot: kept as it is.
    ("after", [(6, 2, 2), (8, 3, 1)], "keep", [8, 9]),
    # The log holds the snapshot's last batch: keep the suffix, drop the prefix.
    ("contains", [(0, 1, 3), (3, 2, 3), (6, 2, 2), (8, 3, 1)], "compact", [8, 9]),
    ("contains-only-up-to", [(0, 1, 3), (3, 2, 3)], "compact", []),
    # Same end offset, other epoch: the log diverges from the snapshot.
    ("wrong-epoch", [(0, 1, 3), (3, 1, 3), (6, 3, 2)], "reset", []),
    # The snapshot's end falls inside a batch.
    ("mid-batch", [(0, 1, 3), (3, 2, 4), (7, 2, 1)], "reset", []),
    # The log stops short of the snapshot.
    ("short", [(0, 1, 3)], "reset", []),
    # The log begins after the snapshot's end (a gap).
    ("gap", [(8, 3, 2)], "reset", []),
    # The log begins at the snapshot's end but with an older epoch.
    ("older-epoch", [(6, 1, 2)], "reset", []),
]


@pytest.mark.parametrize(
    ("name", "stored", "action", "left"), RECONCILE, ids=[c[0] for c in RECONCILE]
)
def test_restart_reconciles_snapshot_and_log(
    name: str, stored: list[tuple[int, int, int]], action: str, left: list[int]
) -> None:
    log = [batch(b, e, n) for b, e, n in stored]
    d, ready = start(log, S)
    assert ready is not None
    assert ready.load_snapshot == S
    assert (ready.compact_to == S) is (action == "compact")
    assert (ready.reset_to_snapshot == S) is (action == "reset")
    if action == "reset":
        assert ready.must_sync
    assert d.core.log.start_offset == 6
    assert d.core.log.snapshot == S
    assert [b.end_offset for b in d.core.log.batches()] == left
    assert [b.end_offset for b in d.stores.log.read_all()] == left
    assert d.core.high_watermark == 6
    assert d.core.applied_offset == 6
    d.core.log.check_invariants()
    # What start-up repaired is what the next start-up finds: no more repairs.
    d.stores.log.flush()
    d2, ready2 = start(d.stores.log.read_all(), S)
    assert ready2 is not None
    assert ready2.compact_to is None and ready2.reset_to_snapshot is None


def test_restart_without_snapshot_keeps_log() -> None:
    d, ready = start(batches_of((1, 2), (3, 1)), None)
    assert ready is not None
    assert ready.load_snapshot is None and ready.reset_to_snapshot is None
    assert d.core.log.end_offset == 3
    assert d.core.high_watermark == 0


def test_restart_with_corrupt_log_raises() -> None:
    from quorum.storage import StorageCorruptError

    stores = MemoryStores.new()
    stores.log.append([batch(0, 2, 1), batch(1, 1, 1)])  # epoch goes back
    stores.log.flush()
    with pytest.raises(StorageCorruptError):
        RaftCore(
            1,
            VoterSet.of(1, 2, 3),
            log_store=stores.log,
            state_store=stores.state,
            snapshot_store=stores.snapshots,
            rng=random.Random(0),
            now_ms=0,
        )


# =============================================================================
# Deadlines: a driver never spins
# =============================================================================


def _fresh(node: int = 1) -> Driver:
    d = Driver.new(node)
    d.drain()
    return d


def _prospective() -> Driver:
    d = _fresh()
    d.tick(5000)
    return d


def _candidate() -> Driver:
    d = _prospective()
    d.step(VoteResponse(2, 1, 0, None, True, True))
    return d


def _leader_parked() -> Driver:
    d = make_leader(1)
    d.fetch(2, 1, 1)
    assert of_type(d.fetch(2, 1, 1, max_wait_ms=300), FetchResponse) == []  # parked
    return d


def _resigned() -> Driver:
    d = make_leader(1)
    d.core.resign()
    d.drain()
    return d


def _follower_told_to_elect_later() -> Driver:
    d = follower(1, leader=2, epoch=3)[0]
    d.step(EndQuorumEpochRequest(2, 1, 3, 2, (3, 1)))
    return d


def _follower_fetching_snapshot() -> Driver:
    d, sent = follower(1, leader=2, epoch=3)
    d.step(fetch_reply(fetch_in(sent), snapshot_id=SnapshotId(4, 1)))
    return d


def _observer_following() -> Driver:
    d = Driver.new(9)
    d.drain()
    d.begin_epoch(2, 3)
    return d


ROLE_SCENARIOS = {
    "unattached": (lambda: _fresh(1), Role.UNATTACHED),
    "prospective": (_prospective, Role.PROSPECTIVE),
    "candidate": (_candidate, Role.CANDIDATE),
    "leader": (lambda: make_leader(1), Role.LEADER),
    "leader-parked-fetch": (_leader_parked, Role.LEADER),
    "resigned": (_resigned, Role.RESIGNED),
    "follower": (lambda: follower()[0], Role.FOLLOWER),
    "follower-leader-resigned": (_follower_told_to_elect_later, Role.FOLLOWER),
    "follower-snapshot-fetch": (_follower_fetching_snapshot, Role.FOLLOWER),
    "observer": (lambda: _fresh(9), Role.UNATTACHED),
    "observer-following": (_observer_following, Role.FOLLOWER),
}


@pytest.mark.parametrize("name", sorted(ROLE_SCENARIOS))
def test_next_deadline_after_tick_is_in_the_future(name: str) -> None:
    """Ticking at the reported deadline always moves it past that moment,
    through every role the node passes (with nobody answering it)."""
    build, role = ROLE_SCENARIOS[name]
    d = build()
    assert d.core.role is role
    for _ in range(30):
        deadline = d.core.next_deadline_ms()
        at = max(deadline, d.now)
        d.tick(at)
        assert d.core.next_deadline_ms() > at, (name, d.core.role)


def test_next_deadline_matches_the_role_timer() -> None:
    d = Driver.new(1, seed=3)
    d.drain()
    deadline = d.core.next_deadline_ms()
    assert CONFIG.election_timeout_ms <= deadline < 2 * CONFIG.election_timeout_ms
    d.tick(deadline - 1)
    assert d.core.role is Role.UNATTACHED
    d.tick(deadline)
    assert d.core.role is Role.PROSPECTIVE


@pytest.mark.parametrize("seed", range(12))
def test_random_cluster_never_spins(seed: int) -> None:
    """Three voters and an observer exchanging messages with loss and delay:
    after every tick, the node's next deadline is strictly in the future."""
    rng = random.Random(seed)
    nodes = {n: Driver.new(n, voters=(1, 2, 3), seed=seed * 10 + n) for n in (1, 2, 3, 4)}
    in_flight: list[tuple[int, Message]] = []
    now = 0
    roles: set[Role] = set()
    for node in nodes.values():
        in_flight += [(now + 1, m) for m in node.drain()]
    for _ in range(400):
        now += rng.randrange(1, 200)
        due = [(t, m) for t, m in in_flight if t <= now]
        in_flight = [(t, m) for t, m in in_flight if t > now]
        for _t, msg in due:
            if rng.random() < 0.1 or msg.dst not in nodes:
                continue
            for out in nodes[msg.dst].step(msg, at=now):
                in_flight.append((now + rng.randrange(1, 60), out))
        for n, node in nodes.items():
            if node.core.next_deadline_ms() <= now:
                for out in node.tick(now):
                    in_flight.append((now + rng.randrange(1, 60), out))
                assert node.core.next_deadline_ms() > now, (seed, n, node.core.role)
            roles.add(node.core.role)
            if node.core.role is Role.LEADER and rng.random() < 0.2:
                for out in node.propose(b"p"):
                    in_flight.append((now + rng.randrange(1, 60), out))
        if rng.random() < 0.01:
            victim = nodes[rng.choice([1, 2, 3, 4])]
            victim.now = now
            victim.restart(rng)
            in_flight += [(now + 1, m) for m in victim.drain()]
    assert Role.LEADER in roles and Role.FOLLOWER in roles


# =============================================================================
# The Ready contract
# =============================================================================


def test_advance_with_another_ready_raises() -> None:
    d = Driver.new(1)
    ready = d.core.ready()
    assert ready is not None
    with pytest.raises(ValueError, match="advance"):
        d.core.advance(Ready())
    with pytest.raises(ValueError, match="advance"):
        d.core.advance(Ready(**{f: getattr(ready, f) for f in ready.__slots__}))
    d.core.advance(ready)


def test_advance_twice_raises() -> None:
    d = Driver.new(1)
    ready = d.core.ready()
    assert ready is not None
    d.core.advance(ready)
    with pytest.raises(ValueError, match="advance"):
        d.core.advance(ready)


def test_no_second_ready_until_advance() -> None:
    d = Driver.new(1)
    ready = d.core.ready()
    assert ready is not None
    # The core may be stepped in between; the work waits for the next Ready.
    d.core.step(VoteRequest(2, 1, 1, 0, 0, False), 0)
    assert not d.core.has_ready()
    assert d.core.ready() is None
    d.core.advance(ready)
    nxt = d.core.ready()
    assert nxt is not None
    assert nxt.quorum_state == QuorumState(1, 2, None)
    resp = only(nxt.messages, VoteResponse)
    assert isinstance(resp, VoteResponse) and resp.granted


def test_ready_is_none_when_idle() -> None:
    d = Driver.new(1)
    d.drain()
    assert d.core.ready() is None
    assert not d.core.has_ready()


@pytest.mark.parametrize(
    ("sid", "match"),
    [
        (SnapshotId(3, 1), "beyond the applied offset"),  # not applied yet
        (SnapshotId(1, 2), "cannot compact"),  # wrong epoch
    ],
)
def test_snapshot_created_rejects_bad_snapshots(sid: SnapshotId, match: str) -> None:
    d = make_leader(1, voters=(1,))
    d.propose(b"a")
    assert d.core.applied_offset == 2
    with pytest.raises(ValueError, match=match):
        d.core.snapshot_created(sid)
    assert d.core.log.start_offset == 0


def test_snapshot_created_compacts_the_log() -> None:
    d = make_leader(1, voters=(1,))
    d.propose(b"a")
    d.propose(b"b")
    d.core.snapshot_created(SnapshotId(2, 1))
    ready = d.core.ready()
    assert ready is not None and ready.compact_to == SnapshotId(2, 1)
    assert d.core.log.start_offset == 2
    # An older snapshot than the log start is ignored.
    d.core.advance(ready)
    d.core.snapshot_created(SnapshotId(1, 1))
    assert d.core.ready() is None


def test_leader_entries_handed_out_once() -> None:
    d = make_leader(1)
    d.core.propose([b"a"], d.now)
    r1 = d.core.ready()
    assert r1 is not None and [b.base_offset for b in r1.entries] == [1]
    d.core.propose([b"b"], d.now)
    d.core.advance(r1)
    r2 = d.core.ready()
    assert r2 is not None and [b.base_offset for b in r2.entries] == [2]
    assert r2.must_sync
    d.core.advance(r2)

"""No node ever holds an epoch it could not leave.

Epochs are int32 (Kafka's leader epoch); an election moves to the next one,
so a node at 2**31-1 could never elect again and one past it could not even
store its state.  Every path by which a node adopts an epoch is checked
here at the core: the newer epoch of any request or response (Vote,
BeginQuorumEpoch, EndQuorumEpoch, Fetch, FetchSnapshot and their answers),
the batches and snapshot a leader hands it, its own elections and pre-votes,
and the state it loads at start.  A message carrying an epoch outside
0..MAX_EPOCH is refused whole (a request is answered INVALID_REQUEST, a
response dropped) and changes nothing; the same message at MAX_EPOCH is acted
on, which shows that the refusal is the limit's and not something else's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quorum.core import RaftCore
from quorum.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    ErrorCode,
    FetchRequest,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
    epoch_out_of_range,
)
from quorum.storage import StorageCorruptError
from quorum.types import MAX_EPOCH, OffsetAndEpoch, QuorumState, Role, SnapshotId
from tests.quorum.core_driver import CONFIG, Driver, batch, fetch_reply, make_leader, of_type

TOP_INT32 = 2**31 - 1
OUT_OF_RANGE = [TOP_INT32, 2**40, -1]


def _voter() -> Driver:
    d = Driver.new(1)
    d.drain()
    return d


def _follower() -> tuple[Driver, FetchRequest]:
    """Node 1 following node 2 in epoch 3, its fetch in flight."""
    d = Driver.new(1, state=QuorumState(2, None, None))
    d.drain()
    fetches = of_type(d.begin_epoch(2, 3), FetchRequest)
    assert len(fetches) == 1
    return d, fetches[0]


def _downloading() -> tuple[Driver, FetchSnapshotRequest]:
    """A follower told to fetch the leader's snapshot (5, 3), its first chunk
    request in flight."""
    d, fetch = _follower()
    asks = of_type(d.step(fetch_reply(fetch, snapshot_id=SnapshotId(5, 3))), FetchSnapshotRequest)
    assert len(asks) == 1
    return d, asks[0]


# Each case: (name, build(epoch) -> (node, message carrying epoch), whether
# acting on the message moves the node to that epoch, in its state or log).
Build = Callable[[int], tuple[Driver, Message]]


def _vote(e: int) -> tuple[Driver, Message]:
    return _voter(), VoteRequest(2, 1, e, 0, 0, False)


def _pre_vote(e: int) -> tuple[Driver, Message]:
    return _voter(), VoteRequest(2, 1, e, 0, 0, True)


def _vote_last_epoch(e: int) -> tuple[Driver, Message]:
    return _voter(), VoteRequest(2, 1, 1, e, 0, False)


def _begin(e: int) -> tuple[Driver, Message]:
    return _voter(), BeginQuorumEpochRequest(2, 1, e, 2)


def _end(e: int) -> tuple[Driver, Message]:
    return _voter(), EndQuorumEpochRequest(2, 1, e, 2, (1, 3))


def _vote_response(e: int) -> tuple[Driver, Message]:
    return _voter(), VoteResponse(2, 1, e, None, False, False)


def _begin_response(e: int) -> tuple[Driver, Message]:
    return _voter(), BeginQuorumEpochResponse(2, 1, e, 3)


def _end_response(e: int) -> tuple[Driver, Message]:
    return _voter(), EndQuorumEpochResponse(2, 1, e, None)


def _fetch(e: int) -> tuple[Driver, Message]:
    d = make_leader(1)
    return d, FetchRequest(2, 1, e, 0, 0, 0, 1024)


def _fetch_last_epoch(e: int) -> tuple[Driver, Message]:
    d = make_leader(1)
    return d, FetchRequest(2, 1, d.core.epoch, 1, e, 0, 1024)


def _fetch_response(e: int) -> tuple[Driver, Message]:
    d, fetch = _follower()
    return d, fetch_reply(fetch, epoch=e)


def _fetch_response_batch(e: int) -> tuple[Driver, Message]:
    d, fetch = _follower()
    return d, fetch_reply(fetch, batches=(batch(0, e, 2),), high_watermark=2)


def _fetch_response_diverging(e: int) -> tuple[Driver, Message]:
    d, fetch = _follower()
    return d, fetch_reply(fetch, diverging=OffsetAndEpoch(e, 0))


def _fetch_response_snapshot(e: int) -> tuple[Driver, Message]:
    d, fetch = _follower()
    return d, fetch_reply(fetch, snapshot_id=SnapshotId(5, e))


def _fetch_snapshot(e: int) -> tuple[Driver, Message]:
    return make_leader(1), FetchSnapshotRequest(2, 1, e, SnapshotId(1, 1), 0, 10)


def _fetch_snapshot_id(e: int) -> tuple[Driver, Message]:
    d = make_leader(1)
    return d, FetchSnapshotRequest(2, 1, d.core.epoch, SnapshotId(1, e), 0, 10)


def _fetch_snapshot_response(e: int) -> tuple[Driver, Message]:
    d, ask = _downloading()
    return d, FetchSnapshotResponse(
        2, 1, e, 2, ErrorCode.NONE, ask.snapshot_id, 0, 4, b"abcd", ask.request_id
    )


CASES: list[tuple[str, Build, bool]] = [
    ("Vote", _vote, True),
    ("pre-vote", _pre_vote, False),
    ("Vote last_epoch", _vote_last_epoch, False),
    ("BeginQuorumEpoch", _begin, True),
    ("EndQuorumEpoch", _end, True),
    ("VoteResponse", _vote_response, True),
    ("BeginQuorumEpochResponse", _begin_response, True),
    ("EndQuorumEpochResponse", _end_response, True),
    ("Fetch", _fetch, False),
    ("Fetch last_fetched_epoch", _fetch_last_epoch, False),
    ("FetchResponse", _fetch_response, True),
    ("FetchResponse batch", _fetch_response_batch, True),
    ("FetchResponse diverging", _fetch_response_diverging, False),
    ("FetchResponse snapshot", _fetch_response_snapshot, False),
    ("FetchSnapshot", _fetch_snapshot, False),
    ("FetchSnapshot snapshot_id", _fetch_snapshot_id, False),
    ("FetchSnapshotResponse", _fetch_snapshot_response, True),
]
IDS = [name for name, _, _ in CASES]


def _state(d: Driver) -> tuple[object, ...]:
    core = d.core
    return (
        core.role,
        core.epoch,
        core.voted_for,
        core.leader_id,
        core.log.end_offset,
        core.log.last_epoch,
        core.high_watermark,
        d.stores.state.durable(),
        d.stores.snapshots.latest(),
    )


def _highest_epoch(d: Driver) -> int:
    durable = d.stores.state.durable()
    return max(d.core.epoch, d.core.log.last_epoch, durable.epoch if durable else 0)


def _answers(sent: list[Message], msg: Message) -> list[Message]:
    """What ``sent`` holds in answer to the request ``msg``."""
    kind = type(msg).__name__.removesuffix("Request") + "Response"
    return [m for m in sent if m.dst == msg.src and type(m).__name__ == kind]


@pytest.mark.parametrize("bad", OUT_OF_RANGE)
@pytest.mark.parametrize(("name", "build", "adopts"), CASES, ids=IDS)
def test_a_message_with_an_epoch_out_of_range_is_refused_and_changes_nothing(
    name: str, build: Build, adopts: bool, bad: int
) -> None:
    d, msg = build(bad)
    problem = epoch_out_of_range(msg)
    assert problem is not None and str(bad) in problem and str(MAX_EPOCH) in problem, problem
    before = _state(d)
    sent = d.step(msg)
    assert _state(d) == before
    assert _highest_epoch(d) <= MAX_EPOCH
    if type(msg).__name__.endswith("Request"):
        answers = _answers(sent, msg)
        assert len(answers) == 1, sent
        assert getattr(answers[0], "error", None) is ErrorCode.INVALID_REQUEST, answers
    else:
        assert sent == [], sent


@pytest.mark.parametrize(("name", "build", "adopts"), CASES, ids=IDS)
def test_the_same_message_at_the_last_epoch_is_acted_on(
    name: str, build: Build, adopts: bool
) -> None:
    """The control: MAX_EPOCH itself is in range, so the refusal above is the
    limit's doing."""
    d, msg = build(MAX_EPOCH)
    assert epoch_out_of_range(msg) is None
    sent = d.step(msg)
    if adopts:
        assert _highest_epoch(d) == MAX_EPOCH
    if type(msg).__name__.endswith("Request"):
        answers = _answers(sent, msg)
        assert len(answers) == 1, sent
        assert getattr(answers[0], "error", None) is not ErrorCode.INVALID_REQUEST, answers


# -- its own elections -----------------------------------------------------------------


def test_a_voter_at_the_last_epoch_starts_no_election() -> None:
    d = Driver.new(1, state=QuorumState(MAX_EPOCH, None, None))
    d.drain()
    assert d.core.at_last_epoch
    for round_ in range(1, 6):
        sent = d.tick(d.now + 3 * CONFIG.election_timeout_ms)
        assert of_type(sent, VoteRequest) == [], (round_, sent)
        assert d.core.role is Role.PROSPECTIVE
        assert d.core.epoch == MAX_EPOCH
    assert d.stores.state.durable() == QuorumState(MAX_EPOCH, None, None)
    # It still follows a leader of that epoch that announces itself.
    fetches = of_type(d.begin_epoch(2, MAX_EPOCH), FetchRequest)
    assert d.core.role is Role.FOLLOWER and d.core.leader_id == 2
    assert [f.epoch for f in fetches] == [MAX_EPOCH]


def test_granted_pre_votes_at_the_last_epoch_start_no_election() -> None:
    """Pre-vote grants it never asked for (a stray or forged answer) do not
    make it a candidate of an epoch no int32 holds."""
    d = Driver.new(1, state=QuorumState(MAX_EPOCH, None, None))
    d.drain()
    d.tick(d.now + 3 * CONFIG.election_timeout_ms)
    assert d.core.role is Role.PROSPECTIVE
    for voter in (2, 3):
        sent = d.step(VoteResponse(voter, 1, MAX_EPOCH, None, True, True))
        assert of_type(sent, VoteRequest) == []
    assert (d.core.role, d.core.epoch) == (Role.PROSPECTIVE, MAX_EPOCH)
    assert d.stores.state.durable() == QuorumState(MAX_EPOCH, None, None)


def test_a_single_voter_at_the_last_epoch_does_not_elect_itself() -> None:
    d = Driver.new(1, voters=(1,), state=QuorumState(MAX_EPOCH, None, None))
    d.drain()
    d.tick(d.now + 3 * CONFIG.election_timeout_ms)
    assert d.core.role is Role.PROSPECTIVE
    assert d.core.epoch == MAX_EPOCH


def test_a_leader_of_the_last_epoch_keeps_leading_and_committing() -> None:
    d = make_leader(1, state=QuorumState(MAX_EPOCH - 1, None, None))
    assert (d.core.role, d.core.epoch) == (Role.LEADER, MAX_EPOCH)
    d.propose(b"x")
    d.fetch_to_end(2)
    assert d.core.high_watermark == d.core.log.end_offset


def test_the_election_before_the_last_epoch_still_happens() -> None:
    """The control of the two tests above: one epoch lower, the same tick
    starts a pre-vote and, granted, a real vote into MAX_EPOCH."""
    d = Driver.new(1, state=QuorumState(MAX_EPOCH - 1, None, None))
    d.drain()
    assert not d.core.at_last_epoch
    pre = of_type(d.tick(d.now + 3 * CONFIG.election_timeout_ms), VoteRequest)
    assert pre and all(r.pre_vote and r.epoch == MAX_EPOCH - 1 for r in pre)
    real = of_type(d.step(VoteResponse(2, 1, MAX_EPOCH - 1, None, True, True)), VoteRequest)
    assert real and all(not r.pre_vote and r.epoch == MAX_EPOCH for r in real)
    assert d.core.at_last_epoch


def test_a_pre_vote_at_the_last_epoch_is_answered_and_changes_nothing() -> None:
    d = Driver.new(1, state=QuorumState(MAX_EPOCH, None, None))
    d.drain()
    before = _state(d)
    sent = d.vote_request(2, MAX_EPOCH, 0, 0, pre_vote=True)
    answer = of_type(sent, VoteResponse)
    assert len(answer) == 1 and answer[0].granted and answer[0].error is ErrorCode.NONE
    assert _state(d) == before


# -- what it loads -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "kwargs"),
    [
        ("quorum state", {"state": QuorumState(TOP_INT32, None, None)}),
        ("log", {"log": [batch(0, TOP_INT32, 1)]}),
        ("snapshot", {"snapshot": (SnapshotId(4, TOP_INT32), b"data")}),
    ],
)
def test_a_stored_epoch_past_the_last_is_refused_at_start(
    what: str, kwargs: dict[str, object]
) -> None:
    with pytest.raises(StorageCorruptError) as err:
        Driver.new(1, **kwargs)  # type: ignore[arg-type]
    message = str(err.value)
    assert what in message and str(TOP_INT32) in message and str(MAX_EPOCH) in message, message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"state": QuorumState(MAX_EPOCH, None, None)},
        {"log": [batch(0, MAX_EPOCH, 1)]},
        {"snapshot": (SnapshotId(4, MAX_EPOCH), b"data")},
    ],
    ids=["quorum state", "log", "snapshot"],
)
def test_the_last_epoch_itself_loads(kwargs: dict[str, object]) -> None:
    d = Driver.new(1, **kwargs)  # type: ignore[arg-type]
    assert isinstance(d.core, RaftCore)
    assert d.core.epoch == MAX_EPOCH

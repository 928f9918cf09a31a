"""The two sides of a fetch session (broker/fetch_session.py), alone: what
the follower lists and forgets, and what the leader reads and counts as
news."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker.fetch_session import FollowerFetchSession, LeaderFetchSession, SessionEntry
from broker.replica.types import FetchRequest
from kqproto import broker_pb2
from metadata.image import TopicIdPartition

A0, A1, A2 = (TopicIdPartition("id-a", p) for p in range(3))


def state(offset: int, epoch: int = 0) -> FetchRequest:
    return FetchRequest(2, 200, epoch, offset, epoch, 0, 1 << 20)


class Fetched:
    """The follower's partitions and their fetch states; records which
    partitions each computation looked at."""

    def __init__(self, states: Mapping[TopicIdPartition, FetchRequest]) -> None:
        self.states = dict(states)
        self.asked: list[list[TopicIdPartition] | None] = []

    def __call__(
        self, keys: Iterable[TopicIdPartition] | None
    ) -> dict[TopicIdPartition, FetchRequest]:
        wanted = None if keys is None else list(keys)
        self.asked.append(wanted)
        return {k: v for k, v in self.states.items() if wanted is None or k in wanted}


def test_the_follower_lists_everything_first_then_only_what_changed() -> None:
    fetched = Fetched({A0: state(0), A1: state(5)})
    session = FollowerFetchSession()
    first = session.next_fetch(fetched)
    assert first is not None and not first.incremental
    assert first.listed == {A0: state(0), A1: state(5)} and first.forgotten == ()
    # Nothing answered, nothing marked: an empty incremental request, and
    # no partition's state computed.
    idle = session.next_fetch(fetched)
    assert idle is not None and idle.incremental and idle.listed == {} and idle.forgotten == ()
    assert fetched.asked[-1] == []
    # A0 was answered (records appended): only it is computed and listed.
    fetched.states[A0] = state(3)
    session.mark([A0])
    moved = session.next_fetch(fetched)
    assert moved is not None and moved.listed == {A0: state(3)}
    assert fetched.asked[-1] == [A0]
    # A state changed without an answer (a new image: a new leader epoch) is
    # not seen until everything is compared.
    fetched.states[A1] = state(5, epoch=1)
    unseen = session.next_fetch(fetched)
    assert unseen is not None and unseen.listed == {}
    session.mark_all()
    seen = session.next_fetch(fetched)
    assert seen is not None and seen.listed == {A1: state(5, epoch=1)}
    assert session.sent == {A0: state(3), A1: state(5, epoch=1)}


def test_the_follower_forgets_partitions_it_stops_fetching_and_ends_an_empty_session() -> None:
    fetched = Fetched({A0: state(0), A1: state(0)})
    session = FollowerFetchSession()
    assert session.next_fetch(fetched) is not None
    # A1 fenced by its leader (waiting for metadata): answered, then no
    # longer fetched.
    del fetched.states[A1]
    session.mark([A1])
    dropped = session.next_fetch(fetched)
    assert dropped is not None and dropped.listed == {} and dropped.forgotten == (A1,)
    # A new partition joins by the next comparison of all.
    fetched.states[A2] = state(0)
    session.mark_all()
    joined = session.next_fetch(fetched)
    assert joined is not None and joined.listed == {A2: state(0)} and joined.forgotten == ()
    # Nothing left to fetch: no request, and the next is full.
    fetched.states.clear()
    session.mark_all()
    assert session.next_fetch(fetched) is None
    fetched.states[A0] = state(7)
    again = session.next_fetch(fetched)
    assert again is not None and not again.incremental and again.listed == {A0: state(7)}


def test_a_refused_session_starts_again_with_a_full_request() -> None:
    fetched = Fetched({A0: state(0)})
    session = FollowerFetchSession()
    assert session.next_fetch(fetched) is not None
    session.reset()
    again = session.next_fetch(fetched)
    assert again is not None and not again.incremental and again.listed == {A0: state(0)}


def entry(partition: int, offset: int = 0) -> SessionEntry:
    return SessionEntry(
        "a", "id-a", broker_pb2.FetchPartition(partition=partition, fetch_offset=offset)
    )


def test_the_leader_reads_what_was_listed_or_woken_and_everything_each_quarter_lag() -> None:
    wakes: list[None] = []
    session = LeaderFetchSession(on_woken=lambda: wakes.append(None))
    session.start({A0: entry(0), A1: entry(1)})
    assert session.has_reads
    assert session.take_reads(now_ms=0, lag_ms=1000) == [A0, A1]
    assert not session.has_reads and session.take_reads(now_ms=100, lag_ms=1000) == []
    # A wake of a partition outside the session is not its business.
    session.woken(A2)
    assert not wakes and session.take_reads(now_ms=100, lag_ms=1000) == []
    session.woken(A1)
    assert len(wakes) == 1 and session.take_reads(now_ms=100, lag_ms=1000) == [A1]
    # Listed by an incremental request: read; forgotten: gone.
    session.update({A2: entry(2)}, [A0])
    assert session.take_reads(now_ms=200, lag_ms=1000) == [A2]
    assert sorted(session.entries) == [A1, A2]
    # A quarter of the lag time after the last read of all: all again, so
    # that a follower that keeps fetching is seen caught up.
    assert session.take_reads(now_ms=249, lag_ms=1000) == []
    assert session.take_reads(now_ms=250, lag_ms=1000) == [A1, A2]
    # A new image: all.
    session.woken_all()
    assert session.take_reads(now_ms=260, lag_ms=1000) == [A1, A2]
    # Left unread by the byte budget: read at the next round, without a wake.
    session.read_again([A1, A0])
    assert len(wakes) == 2 and session.take_reads(now_ms=270, lag_ms=1000) == [A1]


def test_news_is_what_the_follower_was_not_told() -> None:
    session = LeaderFetchSession()
    session.start({A0: entry(0)})
    assert session.is_news(A0, (5, 5, 0, 5), plain=True)  # never answered
    session.told(A0, (5, 5, 0, 5))
    assert not session.is_news(A0, (5, 5, 0, 5), plain=True)
    assert session.is_news(A0, (6, 6, 0, 6), plain=True)  # the HW moved
    assert session.is_news(A0, (5, 5, 0, 5), plain=False)  # records or an error
    # Listed again with a new fetch state: what it was told stays.
    session.update({A0: entry(0, offset=5)}, [])
    assert not session.is_news(A0, (5, 5, 0, 5), plain=True)


def test_a_partition_answered_with_an_error_is_listed_again() -> None:
    """The leader refuses a partition of a topic its image lacks and does not
    hold it: the follower lists it again though its state did not change,
    and forgets it if it stopped fetching it meanwhile."""
    fetched = Fetched({A0: state(0), A1: state(0)})
    session = FollowerFetchSession()
    assert session.next_fetch(fetched) is not None
    session.mark([A1])
    session.resend([A1])
    again = session.next_fetch(fetched)
    assert again is not None and again.listed == {A1: state(0)} and again.forgotten == ()
    session.mark([A1])
    session.resend([A1])
    del fetched.states[A1]
    gone = session.next_fetch(fetched)
    assert gone is not None and gone.listed == {} and gone.forgotten == (A1,)

"""Fetch sessions between a follower and a leader (KIP-227's incremental
fetches), scoped to one ``ReplicaFetch`` stream: the stream is the session,
so it needs no session id or epoch (the stream orders the requests and
loses none; a broken stream ends the session on both sides, and the next
stream starts a new one with a full request).

Without sessions every fetch round names every partition the follower
shares with the leader, and the leader reads and answers each of them:
with thousands of idle partitions, a round cost both brokers hundreds of
milliseconds of their event loops. With them:

- :class:`FollowerFetchSession` (the follower's side) lists in each request
  only the partitions whose fetch state changed since it last sent them
  (a new fetch offset after an append or a truncation, a new leader epoch,
  a new log start), with those it stopped fetching as forgotten
  (``FetchSessionHandler.Builder``). It recomputes the fetch state only of
  the partitions the last answer named, unless told everything may have
  changed (a new image, its own retention: :meth:`FollowerFetchSession.mark_all`).
  A partition answered with an error is listed again even if its state is
  the same (:meth:`FollowerFetchSession.resend`): the leader may not hold
  it (a topic its image did not have yet is refused, not added), and
  listed only once it would never be fetched.
- :class:`LeaderFetchSession` (the leader's side) keeps each partition's
  last fetch state, reads only the partitions listed and those woken since
  their last read (an append, a high watermark or log start moved, a new
  image), and answers only those with something new for the follower
  (``FetchSession.CachedPartition.maybeUpdateResponseData``).

Kafka reads every partition of a session on every fetch; here an idle
partition is not read, and the ISR comes out the same. A follower whose
log end is the leader's is caught up whatever the time
(``Replica.isCaughtUp``), so an idle partition needs no read to keep it in
the ISR; one it is behind on has records for it, so it is read on every
round (and listed by the follower at its new offset) until it catches up;
one that stops fetching (its stream gone, its process paused) leaves the
ISR after the lag time, as before. And since a change that woke no
session would never reach the follower, the leader reads the whole
session again every quarter of ``replica.lag.time.max.ms``
(:meth:`LeaderFetchSession.take_reads`): a wake missed costs at most that.

Pure: no I/O, no clock (``now_ms`` is passed in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from broker.errors import Errors
from broker.replica.types import FetchAnswer, FetchRequest
from kqproto import broker_pb2
from metadata.image import TopicIdPartition

__all__ = [
    "AnswerSummary",
    "FollowerFetch",
    "FollowerFetchSession",
    "LeaderFetchSession",
    "SessionEntry",
]

# What a follower learns from an answer without records: (high watermark,
# last stable offset, log start offset, log end offset).
AnswerSummary = tuple[int, int, int, int]


@dataclass(slots=True)
class SessionEntry:
    """One partition of a leader's session: how the follower fetches it
    (its topic's name and id, the partition's fields as last listed) and
    what it was last told."""

    topic: str
    topic_id: str
    partition: broker_pb2.FetchPartition
    # None until answered on this stream.
    told: AnswerSummary | None = None


class LeaderFetchSession:
    """The leader's side of one follower's stream."""

    def __init__(self, on_woken: Callable[[], None] | None = None) -> None:
        self.entries: dict[TopicIdPartition, SessionEntry] = {}
        # Partitions changed since their last read (woken by whoever changed
        # them); read at the next attempt.
        self._dirty: set[TopicIdPartition] = set()
        self._all_dirty = False
        self.started = False
        # When the whole session is read again (None: at the next read).
        self._next_full_read_ms: int | None = None
        self._on_woken = on_woken

    # -- the requests ----------------------------------------------------------------

    def start(self, entries: Mapping[TopicIdPartition, SessionEntry]) -> None:
        """A full request: the session is exactly ``entries``, all read at
        once."""
        self.entries = dict(entries)
        self._dirty.clear()
        self._all_dirty = True
        self.started = True

    def update(
        self,
        listed: Mapping[TopicIdPartition, SessionEntry],
        forgotten: Iterable[TopicIdPartition],
    ) -> None:
        """An incremental request: ``forgotten`` leave the session, ``listed``
        join it or replace their fetch state (and are read at once)."""
        for key in forgotten:
            self.entries.pop(key, None)
            self._dirty.discard(key)
        for key, entry in listed.items():
            known = self.entries.get(key)
            if known is not None:
                # A listed partition is answered at once only with news: what
                # it was told stays (KIP-227: the response names a partition
                # whose data or metadata changed).
                entry.told = known.told
            self.entries[key] = entry
            self._dirty.add(key)

    # -- waking ----------------------------------------------------------------------

    def woken(self, key: TopicIdPartition) -> None:
        """``key`` changed on the leader (the purgatory's wake)."""
        if key in self.entries:
            self._dirty.add(key)
            if self._on_woken is not None:
                self._on_woken()

    def woken_all(self) -> None:
        """A new image, or anything that may change every partition."""
        self._all_dirty = True
        if self._on_woken is not None:
            self._on_woken()

    @property
    def has_reads(self) -> bool:
        return self._all_dirty or bool(self._dirty)

    def take_reads(self, now_ms: int, lag_ms: int) -> list[TopicIdPartition]:
        """The partitions to read now, in partition order: those changed
        since their last read, or every one when a new image came or a
        quarter of the lag time passed since the whole session was read."""
        due = self._next_full_read_ms
        if self._all_dirty or due is None or now_ms >= due:
            self._all_dirty = False
            self._dirty.clear()
            self._next_full_read_ms = now_ms + _full_read_interval(lag_ms)
            return sorted(self.entries)
        found = sorted(k for k in self._dirty if k in self.entries)
        self._dirty.clear()
        return found

    def read_again(self, keys: Iterable[TopicIdPartition]) -> None:
        """Partitions left unread (the response's byte budget ran out): read
        at the next round, without waking the current one."""
        self._dirty.update(k for k in keys if k in self.entries)

    # -- the answers -----------------------------------------------------------------

    def is_news(self, key: TopicIdPartition, summary: AnswerSummary, plain: bool) -> bool:
        """Whether an answer for ``key`` goes in an incremental response:
        one that is not ``plain`` (records, an error, a divergence) always;
        a plain one when the follower was told other offsets."""
        if not plain:
            return True
        entry = self.entries.get(key)
        return entry is None or entry.told != summary

    def told(self, key: TopicIdPartition, summary: AnswerSummary) -> None:
        """``key`` was answered with ``summary``."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.told = summary


def _full_read_interval(lag_ms: int) -> int:
    return max(1, lag_ms // 4)


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    """The next request of a follower's session: every partition (not
    ``incremental``: the session starts afresh), or the partitions listed
    and forgotten since the last."""

    incremental: bool
    listed: Mapping[TopicIdPartition, FetchRequest]
    forgotten: tuple[TopicIdPartition, ...]


class FollowerFetchSession:
    """The follower's side of one stream to a leader."""

    def __init__(self) -> None:
        # What the leader holds for each partition: the fetch state last
        # listed. Answers are stepped against it.
        self.sent: dict[TopicIdPartition, FetchRequest] = {}
        self.started = False
        self._all = True
        self._candidates: set[TopicIdPartition] = set()
        # Partitions taken out of sent by resend, which the leader may still
        # hold: forgotten if no longer fetched.
        self._resent: set[TopicIdPartition] = set()

    def mark_all(self) -> None:
        """Every partition's fetch state may have changed (a new image, the
        follower's own retention): the next request compares them all."""
        self._all = True

    def mark(self, keys: Iterable[TopicIdPartition]) -> None:
        """These partitions' fetch states may have changed (their answers
        were stepped)."""
        self._candidates.update(keys)

    def answered(
        self, answers: Mapping[TopicIdPartition, FetchAnswer]
    ) -> dict[TopicIdPartition, tuple[FetchRequest, FetchAnswer]]:
        """The last request's answers, each with the fetch state it answers
        (partitions the session no longer holds are dropped): the answered
        partitions are compared again at the next request, and those
        answered with an error listed again (:meth:`resend`)."""
        found = {k: (self.sent[k], a) for k, a in answers.items() if k in self.sent}
        self.mark(found)
        self.resend(k for k, (_, a) in found.items() if a.error is not Errors.NONE)
        return found

    def resend(self, keys: Iterable[TopicIdPartition]) -> None:
        """These partitions were answered with an error: listed again at the
        next request even if their fetch state is the same, since the
        leader may not hold them (a topic its image did not have yet is
        refused, not added to its session)."""
        for key in keys:
            if self.sent.pop(key, None) is not None:
                self._candidates.add(key)
                self._resent.add(key)

    def reset(self) -> None:
        """The leader refused the session's request: the next is full."""
        self.sent.clear()
        self.started = False
        self._all = True
        self._candidates.clear()
        self._resent.clear()

    def next_fetch(
        self,
        compute: Callable[
            [Iterable[TopicIdPartition] | None], Mapping[TopicIdPartition, FetchRequest]
        ],
    ) -> FollowerFetch | None:
        """The next request, from ``compute`` (the fetch state of the given
        partitions, or of every partition fetched from this leader for
        None; a partition not fetched now is left out). None when the
        session has nothing to fetch: it ends, and the next request is
        full."""
        if not self.started or self._all:
            current = dict(compute(None))
            checked: Iterable[TopicIdPartition] = set(current) | set(self.sent) | self._resent
        else:
            current = dict(compute(sorted(self._candidates)))
            checked = self._candidates | self._resent
        self._all = False
        self._candidates = set()
        if not self.started:
            if not current:
                return None
            self.sent = current
            self.started = True
            return FollowerFetch(False, current, ())
        listed: dict[TopicIdPartition, FetchRequest] = {}
        forgotten: list[TopicIdPartition] = []
        for key in sorted(checked):
            request = current.get(key)
            if request is None:
                if self.sent.pop(key, None) is not None or key in self._resent:
                    forgotten.append(key)
            elif self.sent.get(key) != request:
                self.sent[key] = request
                listed[key] = request
        self._resent.clear()
        if not self.sent:
            self.reset()
            return None
        return FollowerFetch(True, listed, tuple(forgotten))

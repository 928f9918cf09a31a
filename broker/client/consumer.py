"""The consumer's pure core (Kafka's ``SubscriptionState``, ``FetchCollector``
and ``CompletedFetch`` for assigned partitions; groups and commits are their
own issue): the position kept per assigned partition, ``seek``,
``auto.offset.reset``, the fetch requests and what each answer does.

The driver's loop, as ``KafkaConsumer.poll``::

    for tp, strategy in core.partitions_to_reset().items():   # ListOffsets
        core.reset_position(tp, offset, leader_epoch)
    for request in core.fetch_requests(leaders).values():     # Fetch
        for tp, answer in the answers: core.on_fetch_answer(tp, answer)
    records = core.poll(max_records)

Rules:

- A partition is fetched only when assigned, with a position, not paused,
  with no fetch awaiting its answer and nothing of an earlier answer left
  to return: at most one answer per partition is ever being consumed.
- A request carries the position's offset, the partition's current leader
  epoch from the metadata (KIP-320: a broker with another epoch refuses it)
  and the epoch of the last record consumed (``LastFetchedEpoch``, KIP-595,
  so that the leader reports a divergence).
- An answer for an offset other than the partition's position (a seek or a
  reset came in between) is dropped (``Discarding stale fetch response``).
- Brokers return whole batches, so an answer may begin before the position:
  those records are skipped. A partial batch at the end of the answer (the
  byte limit cut it) is dropped; it is fetched again. Control batches are
  skipped. The position moves past every batch read, so offsets left out by
  compaction are no hole the consumer waits on.
- ``OFFSET_OUT_OF_RANGE`` resets the position by ``auto.offset.reset``
  (``earliest``, ``latest``; ``none`` raises, naming the partition and
  offset). A diverging epoch below the position (the log was truncated
  under the consumer, KIP-320) moves the position back to the divergence
  when a reset policy is set, else raises.
- ``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``,
  ``UNKNOWN_LEADER_EPOCH`` and the other metadata errors ask for a metadata
  refresh (the answer's KIP-951 leader hint is passed on); the partition is
  fetched again at the same position.
- ``poll`` returns records in offset order per partition, each once, and
  moves the position past them.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from partition_log.batch import BatchScanner, ScanEnd, decode_records
from partition_log.errors import PartitionLogError
from partition_log.read_committed import AbortedFilter
from partition_log.records import Header

__all__ = [
    "ConsumerConfig",
    "ConsumerCore",
    "ConsumerRecord",
    "FetchAnswer",
    "FetchError",
    "FetchRequest",
    "IsolationLevel",
    "LeaderInfo",
    "LogTruncationError",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "OffsetResetStrategy",
    "PartitionFetch",
]

NO_EPOCH = -1


class OffsetResetStrategy(enum.Enum):
    """``auto.offset.reset``."""

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


class IsolationLevel(enum.Enum):
    """``isolation.level``: ``read_uncommitted`` reads below the high
    watermark; ``read_committed`` below the last stable offset, without
    the records of aborted transactions (KIP-98)."""

    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


class NoOffsetForPartitionError(Exception):
    """A partition has no position and ``auto.offset.reset`` is ``none``."""


class OffsetOutOfRangeError(Exception):
    """The position is out of the log's range and ``auto.offset.reset`` is
    ``none``."""


class LogTruncationError(Exception):
    """The log was truncated below the position (KIP-320) and
    ``auto.offset.reset`` is ``none``."""


class FetchError(Exception):
    """An answer the consumer cannot go on from (a corrupt batch, an error
    that is not retriable), naming the partition."""


# Errors after which the consumer refreshes its metadata and fetches again
# (Kafka's InvalidMetadataException family, and UNKNOWN_LEADER_EPOCH, on
# which the Fetcher also refreshes).
REFRESH_METADATA: frozenset[Errors] = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.UNKNOWN_TOPIC_ID,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.KAFKA_STORAGE_ERROR,
    }
)
# Retried at the same position without a refresh.
RETRY: frozenset[Errors] = frozenset(
    {Errors.UNKNOWN_SERVER_ERROR, Errors.REQUEST_TIMED_OUT, Errors.OFFSET_NOT_AVAILABLE}
)


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """The consumer's configs with Kafka's names and defaults (``ConsumerConfig``)."""

    auto_offset_reset: OffsetResetStrategy = OffsetResetStrategy.LATEST
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    max_poll_records: int = 500
    check_crcs: bool = True
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED

    def __post_init__(self) -> None:
        OffsetResetStrategy(self.auto_offset_reset)
        IsolationLevel(self.isolation_level)
        for name in ("fetch_max_bytes", "max_partition_fetch_bytes", "max_poll_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        for name in ("fetch_min_bytes", "fetch_max_wait_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """A partition's leader and leader epoch from the metadata."""

    node: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """One partition of a fetch request (``FetchRequest.FetchPartition``)."""

    topic_partition: TopicPartition
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    node: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: tuple[PartitionFetch, ...]


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """A broker's answer for one partition (``FetchResponse.PartitionData``)."""

    fetch_offset: int
    error: Errors = Errors.NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    # DivergingEpoch (epoch, end offset), KIP-320/595.
    diverging_epoch: tuple[int, int] | None = None
    # KIP-951: the current leader and epoch, -1 if not given.
    current_leader: int = -1
    current_leader_epoch: int = -1
    # read_committed: the aborted transactions (producer id, first offset)
    # that overlap the records (FetchResponse.AbortedTransactions).
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class AnswerEffect:
    """What an answer asks of the driver."""

    records: int = 0
    refresh_metadata: bool = False
    leader_hint: LeaderInfo | None = None
    reset: OffsetResetStrategy | None = None
    stale: bool = False


@dataclass(slots=True)
class _Position:
    offset: int
    # The leader epoch of the last record consumed (NO_EPOCH: unknown).
    epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class _Aborted:
    producer_id: int
    first_offset: int


class _State:
    __slots__ = ("awaiting", "buffered", "high_watermark", "log_start_offset", "next_offset",
                 "paused", "position", "reset")  # fmt: skip

    def __init__(self) -> None:
        self.position: _Position | None = None
        self.reset: OffsetResetStrategy | None = None
        self.awaiting: int | None = None  # the fetch offset of the request in flight
        self.buffered: deque[ConsumerRecord] = deque()
        # Where the position goes once the buffer is consumed (past the last
        # batch of the answer, records left out by compaction included).
        self.next_offset: _Position | None = None
        self.paused = False
        self.high_watermark = -1
        self.log_start_offset = -1


class ConsumerCore:
    """Positions and fetches of the partitions assigned to one consumer."""

    def __init__(self, config: ConsumerConfig | None = None) -> None:
        self.config = config if config is not None else ConsumerConfig()
        self._states: dict[TopicPartition, _State] = {}
        self._poll_start = 0

    # -- assignment and positions ---------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment (``KafkaConsumer.assign``); partitions kept
        keep their positions, new ones have none until a seek or a reset."""
        wanted = set(partitions)
        for tp in wanted:
            if not isinstance(tp, TopicPartition) or tp.partition < 0:
                raise ValueError(f"cannot assign {tp!r}: a TopicPartition with partition >= 0")
        self._states = {tp: self._states.get(tp) or _State() for tp in sorted(wanted)}

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._states)

    def _state(self, tp: TopicPartition) -> _State:
        state = self._states.get(tp)
        if state is None:
            raise ValueError(f"no current assignment for partition {tp}")
        return state

    def seek(self, tp: TopicPartition, offset: int, leader_epoch: int = NO_EPOCH) -> None:
        """The next record returned for ``tp`` is at ``offset`` or the first
        after it; anything fetched before is dropped."""
        if offset < 0:
            raise ValueError(f"seek offset must not be negative, not {offset} for {tp}")
        state = self._state(tp)
        state.position = _Position(offset, leader_epoch)
        state.reset = None
        self._drop_fetched(state)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._request_reset(self._state(tp), OffsetResetStrategy.EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._request_reset(self._state(tp), OffsetResetStrategy.LATEST)

    def _request_reset(self, state: _State, strategy: OffsetResetStrategy) -> None:
        state.position = None
        state.reset = strategy
        self._drop_fetched(state)

    @staticmethod
    def _drop_fetched(state: _State) -> None:
        state.buffered.clear()
        state.next_offset = None
        state.awaiting = None

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record to return, ``None`` until known."""
        position = self._state(tp).position
        return None if position is None else position.offset

    def positions(self) -> dict[TopicPartition, int]:
        """The position of every assigned partition that has one: the
        offsets after the records ``poll`` returned (what a commit takes)."""
        return {
            tp: state.position.offset
            for tp, state in self._states.items()
            if state.position is not None
        }

    def committable(self) -> dict[TopicPartition, tuple[int, int]]:
        """``positions`` with the leader epoch of the last record consumed
        (KIP-320: committed with the offset; -1 if unknown)."""
        return {
            tp: (state.position.offset, state.position.epoch)
            for tp, state in self._states.items()
            if state.position is not None
        }

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._state(tp).paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._state(tp).paused = False

    def high_watermark(self, tp: TopicPartition) -> int:
        return self._state(tp).high_watermark

    def log_start_offset(self, tp: TopicPartition) -> int:
        """The log start offset of the last fetch answer (-1: none yet)."""
        return self._state(tp).log_start_offset

    # -- resets ---------------------------------------------------------------

    def partitions_to_reset(self) -> dict[TopicPartition, OffsetResetStrategy]:
        """The partitions without a position and how to find one
        (ListOffsets earliest or latest). With ``auto.offset.reset=none`` a
        partition nobody sought raises, naming it."""
        missing = []
        out: dict[TopicPartition, OffsetResetStrategy] = {}
        for tp, state in self._states.items():
            if state.position is not None:
                continue
            strategy = state.reset or self.config.auto_offset_reset
            if strategy is OffsetResetStrategy.NONE:
                missing.append(tp)
            else:
                out[tp] = strategy
        if missing:
            raise NoOffsetForPartitionError(
                "no position and auto_offset_reset is none for "
                + ", ".join(str(tp) for tp in missing)
            )
        return out

    def reset_position(self, tp: TopicPartition, offset: int, leader_epoch: int = NO_EPOCH) -> None:
        """The ListOffsets answer for a partition being reset; ignored if a
        seek gave it a position meanwhile."""
        state = self._state(tp)
        if state.position is None:
            if offset < 0:
                raise ValueError(f"reset offset must not be negative, not {offset} for {tp}")
            state.position = _Position(offset, leader_epoch)
            state.reset = None

    # -- fetching -------------------------------------------------------------

    def fetch_requests(
        self, leaders: Mapping[TopicPartition, LeaderInfo]
    ) -> dict[int, FetchRequest]:
        """The fetches to send now, one request per leader
        (``AbstractFetch.prepareFetchRequests``)."""
        by_node: dict[int, list[PartitionFetch]] = {}
        for tp, state in self._states.items():
            leader = leaders.get(tp)
            if (
                leader is None
                or state.position is None
                or state.paused
                or state.awaiting is not None
                or state.buffered
                or state.next_offset is not None
            ):
                continue
            state.awaiting = state.position.offset
            by_node.setdefault(leader.node, []).append(
                PartitionFetch(
                    tp,
                    state.position.offset,
                    leader.leader_epoch,
                    state.position.epoch,
                    self.config.max_partition_fetch_bytes,
                )
            )
        return {
            node: FetchRequest(
                node,
                self.config.fetch_max_wait_ms,
                self.config.fetch_min_bytes,
                self.config.fetch_max_bytes,
                tuple(parts),
            )
            for node, parts in sorted(by_node.items())
        }

    def on_fetch_failure(self, tp: TopicPartition) -> AnswerEffect:
        """The request for ``tp`` got no answer: fetch again from the same
        position after a metadata refresh."""
        state = self._states.get(tp)
        if state is not None:
            state.awaiting = None
        return AnswerEffect(refresh_metadata=True)

    def on_fetch_answer(self, tp: TopicPartition, answer: FetchAnswer) -> AnswerEffect:
        """Take the answer for ``tp`` (``FetchCollector.handleInitializeErrors``
        and ``CompletedFetch``)."""
        state = self._states.get(tp)
        if (
            state is None
            or state.position is None
            or state.awaiting != answer.fetch_offset
            or state.position.offset != answer.fetch_offset
        ):
            # Unassigned, sought or reset meanwhile: a stale answer.
            if state is not None and state.awaiting == answer.fetch_offset:
                state.awaiting = None
            return AnswerEffect(stale=True)
        state.awaiting = None
        hint = (
            LeaderInfo(answer.current_leader, answer.current_leader_epoch)
            if answer.current_leader >= 0 and answer.current_leader_epoch >= 0
            else None
        )
        error = answer.error
        if error is Errors.NONE:
            state.high_watermark = answer.high_watermark
            state.log_start_offset = answer.log_start_offset
            if answer.diverging_epoch is not None:
                return self._diverged(tp, state, answer.diverging_epoch)
            return AnswerEffect(records=self._take_records(tp, state, answer))
        if error is Errors.OFFSET_OUT_OF_RANGE:
            strategy = self.config.auto_offset_reset
            if strategy is OffsetResetStrategy.NONE:
                raise OffsetOutOfRangeError(
                    f"fetch offset {answer.fetch_offset} is out of range for {tp} "
                    "and auto_offset_reset is none"
                )
            self._request_reset(state, strategy)
            return AnswerEffect(reset=strategy)
        if error in REFRESH_METADATA:
            return AnswerEffect(refresh_metadata=True, leader_hint=hint)
        if error in RETRY:
            return AnswerEffect()
        raise FetchError(f"fetch of {tp} at offset {answer.fetch_offset} failed: {error.name}")

    def _diverged(
        self, tp: TopicPartition, state: _State, diverging: tuple[int, int]
    ) -> AnswerEffect:
        # KIP-320 (SubscriptionState.maybeCompleteValidation): the log was
        # truncated below what this consumer read.
        epoch, end_offset = diverging
        assert state.position is not None
        if end_offset >= state.position.offset:
            return AnswerEffect()
        if self.config.auto_offset_reset is OffsetResetStrategy.NONE:
            raise LogTruncationError(
                f"{tp}: the log diverges at offset {end_offset} (epoch {epoch}), below the "
                f"position {state.position.offset}, and auto_offset_reset is none"
            )
        state.position = _Position(end_offset, epoch)
        return AnswerEffect(reset=self.config.auto_offset_reset)

    def _take_records(self, tp: TopicPartition, state: _State, answer: FetchAnswer) -> int:
        assert state.position is not None
        position = state.position.offset
        scanner = BatchScanner(answer.records, check_crc=self.config.check_crcs)
        taken: list[ConsumerRecord] = []
        next_offset: _Position | None = None
        # read_committed: the broker sent only what is below the last stable
        # offset; the aborted transactions' batches are dropped here, as
        # Kafka's consumer drops them (CompletedFetch).
        committed = self.config.isolation_level is IsolationLevel.READ_COMMITTED
        walk = (
            AbortedFilter(_Aborted(p, o) for p, o in answer.aborted_transactions)
            if committed
            else None
        )
        for scanned in scanner:
            header = scanned.header
            raw: bytes | None = None
            if walk is None:
                kept = not header.is_control
            else:
                # Every batch, those already consumed too: the walk's state
                # (which producers are inside an aborted transaction) needs them.
                raw = answer.records[scanned.position : scanned.end]
                kept = walk.keeps(raw, header)
            if header.next_offset <= position:
                continue
            if kept:
                if raw is None:
                    raw = answer.records[scanned.position : scanned.end]
                try:
                    records = decode_records(raw)
                except PartitionLogError as error:
                    raise FetchError(f"fetch of {tp}: {error}") from None
                for record in records:
                    if record.offset < position:
                        continue
                    taken.append(
                        ConsumerRecord(
                            tp.topic,
                            tp.partition,
                            record.offset,
                            record.timestamp,
                            record.key,
                            record.value,
                            record.headers,
                            header.partition_leader_epoch,
                        )
                    )
            next_offset = _Position(header.next_offset, header.partition_leader_epoch)
        if scanner.end is ScanEnd.CORRUPT:
            raise FetchError(f"fetch of {tp} at offset {answer.fetch_offset}: {scanner.error}")
        # A partial batch at the end (ScanEnd.TRUNCATED) is fetched again.
        state.buffered.extend(taken)
        state.next_offset = next_offset
        if not taken and next_offset is not None:
            # Control batches or records compacted away: step past them.
            state.position = next_offset
            state.next_offset = None
        return len(taken)

    # -- returning records ----------------------------------------------------

    def poll(self, max_records: int | None = None) -> list[ConsumerRecord]:
        """Up to ``max_records`` (``max.poll.records``) buffered records, in
        offset order per partition, each once; moves the positions past
        them. Partitions take turns so none starves."""
        limit = self.config.max_poll_records if max_records is None else max_records
        if limit < 1:
            raise ValueError(f"max_records must be >= 1, not {limit}")
        out: list[ConsumerRecord] = []
        tps = list(self._states)
        if not tps:
            return out
        start = self._poll_start % len(tps)
        for i in range(len(tps)):
            if len(out) >= limit:
                break
            tp = tps[(start + i) % len(tps)]
            state = self._states[tp]
            while state.buffered and len(out) < limit:
                record = state.buffered.popleft()
                out.append(record)
                state.position = _Position(record.offset + 1, record.leader_epoch)
            if not state.buffered and state.next_offset is not None:
                state.position = state.next_offset
                state.next_offset = None
        self._poll_start = start + 1
        return out

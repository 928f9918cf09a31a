"""The consumer core: positions, seek, auto.offset.reset, fetch requests
and answers; random fetch answers never return a record twice or skip one."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client.consumer import (
    ConsumerConfig,
    ConsumerCore,
    FetchAnswer,
    FetchError,
    LeaderInfo,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    OffsetResetStrategy,
)
from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from partition_log.batch import Compression, build_batch
from partition_log.records import Record

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
LEADERS = {TP0: LeaderInfo(1, 5), TP1: LeaderInfo(2, 7)}


class FakeLog:
    """A partition's batches as a leader serves them to consumers: whole
    batches from the one holding the fetch offset, up to the HW."""

    def __init__(self, rng: random.Random, batches: int, epoch: int = 3) -> None:
        self.batches: list[tuple[int, int, bytes]] = []  # (base, next offset, bytes)
        self.offsets: list[int] = []  # the data records' offsets, in order
        offset = 0
        for _ in range(batches):
            count = rng.randint(1, 4)
            control = rng.random() < 0.1
            # Compaction leaves gaps: offsets need not be dense.
            offsets = sorted(rng.sample(range(offset, offset + count + 2), count))
            span = offsets[-1] - offset + 1 + rng.randint(0, 1)
            records = [Record(o, 1000 + o, b"k", b"v%d" % o) for o in offsets]
            raw = build_batch(
                records,
                base_offset=offset,
                partition_leader_epoch=epoch,
                last_offset_delta=span - 1,
                compression=rng.choice(list(Compression)[:2]),
                control=control,
            )
            self.batches.append((offset, offset + span, raw))
            if not control:
                self.offsets += offsets
            offset += span
        self.end = offset

    def fetch(self, offset: int, max_bytes: int, partial: bool) -> FetchAnswer:
        if offset > self.end or offset < 0:
            return FetchAnswer(offset, Errors.OFFSET_OUT_OF_RANGE)
        out = b""
        for index, (_, next_offset, raw) in enumerate(self.batches):
            if next_offset <= offset:
                continue
            if out and len(out) + len(raw) > max_bytes:
                if partial:
                    out += raw[: len(raw) // 2]
                break
            out += raw
            if partial and index == len(self.batches) - 1:
                break
        return FetchAnswer(offset, high_watermark=self.end, log_start_offset=0, records=out)


def core(**overrides: object) -> ConsumerCore:
    settings_: dict[str, object] = {"auto_offset_reset": OffsetResetStrategy.EARLIEST}
    settings_.update(overrides)
    return ConsumerCore(ConsumerConfig(**settings_))  # type: ignore[arg-type]


# -- positions ------------------------------------------------------------------


def test_assign_then_reset_by_policy() -> None:
    c = core()
    c.assign([TP0, TP1])
    assert c.partitions_to_reset() == {
        TP0: OffsetResetStrategy.EARLIEST,
        TP1: OffsetResetStrategy.EARLIEST,
    }
    assert c.fetch_requests(LEADERS) == {}  # no position yet
    c.reset_position(TP0, 10)
    assert c.position(TP0) == 10
    assert set(c.partitions_to_reset()) == {TP1}


def test_reset_none_raises_naming_the_partition() -> None:
    c = core(auto_offset_reset=OffsetResetStrategy.NONE)
    c.assign([TP0])
    with pytest.raises(NoOffsetForPartitionError, match="t-0"):
        c.partitions_to_reset()
    c.seek(TP0, 4)
    assert c.partitions_to_reset() == {}


def test_seek_to_end_and_beginning_override_the_policy() -> None:
    c = core(auto_offset_reset=OffsetResetStrategy.NONE)
    c.assign([TP0, TP1])
    c.seek_to_end([TP0])
    c.seek_to_beginning([TP1])
    # Asked for explicitly, a reset needs no policy.
    assert c.partitions_to_reset() == {
        TP0: OffsetResetStrategy.LATEST,
        TP1: OffsetResetStrategy.EARLIEST,
    }
    c2 = core(auto_offset_reset=OffsetResetStrategy.LATEST)
    c2.assign([TP0, TP1])
    c2.seek(TP0, 3)
    c2.seek_to_beginning([TP0])
    assert c2.partitions_to_reset() == {
        TP0: OffsetResetStrategy.EARLIEST,
        TP1: OffsetResetStrategy.LATEST,
    }


def test_seek_needs_an_assignment_and_a_valid_offset() -> None:
    c = core()
    with pytest.raises(ValueError, match="no current assignment for partition t-0"):
        c.seek(TP0, 1)
    c.assign([TP0])
    with pytest.raises(ValueError, match="must not be negative"):
        c.seek(TP0, -1)


def test_reassign_keeps_positions_of_kept_partitions() -> None:
    c = core()
    c.assign([TP0, TP1])
    c.seek(TP0, 7)
    c.assign([TP0])
    assert c.position(TP0) == 7 and c.assignment() == {TP0}


# -- requests -------------------------------------------------------------------


def test_fetch_request_carries_offset_leader_epoch_and_last_fetched_epoch() -> None:
    c = core()
    c.assign([TP0, TP1])
    c.seek(TP0, 0)
    c.seek(TP1, 9, leader_epoch=6)
    requests = c.fetch_requests(LEADERS)
    assert set(requests) == {1, 2}
    (p0,) = requests[1].partitions
    (p1,) = requests[2].partitions
    assert (p0.fetch_offset, p0.current_leader_epoch, p0.last_fetched_epoch) == (0, 5, -1)
    assert (p1.fetch_offset, p1.current_leader_epoch, p1.last_fetched_epoch) == (9, 7, 6)
    # One fetch per partition at a time.
    assert c.fetch_requests(LEADERS) == {}


def test_last_fetched_epoch_follows_the_records_consumed() -> None:
    log = FakeLog(random.Random(1), 3, epoch=4)
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    c.on_fetch_answer(TP0, log.fetch(0, 10**6, False))
    c.poll()
    (p,) = c.fetch_requests(LEADERS)[1].partitions
    assert p.fetch_offset == log.end and p.last_fetched_epoch == 4


def test_paused_partitions_are_not_fetched() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.pause([TP0])
    assert c.fetch_requests(LEADERS) == {}
    c.resume([TP0])
    assert 1 in c.fetch_requests(LEADERS)


# -- answers --------------------------------------------------------------------


def records_of(values: list[int], base: int, epoch: int = 2) -> bytes:
    return build_batch(
        [Record(o, 0, None, b"v%d" % o) for o in values],
        base_offset=base,
        partition_leader_epoch=epoch,
    )


def test_records_below_the_position_in_a_returned_batch_are_skipped() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 12)
    c.fetch_requests(LEADERS)
    c.on_fetch_answer(TP0, FetchAnswer(12, records=records_of(list(range(10, 15)), 10)))
    assert [r.offset for r in c.poll()] == [12, 13, 14]
    assert c.position(TP0) == 15


def test_poll_returns_at_most_max_records_and_positions_follow() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    c.on_fetch_answer(TP0, FetchAnswer(0, records=records_of(list(range(6)), 0)))
    assert [r.offset for r in c.poll(4)] == [0, 1, 2, 3]
    assert c.position(TP0) == 4
    assert c.fetch_requests(LEADERS) == {}  # the rest is still buffered
    assert [r.offset for r in c.poll(4)] == [4, 5]


def test_a_stale_answer_after_a_seek_is_dropped() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    c.seek(TP0, 3)
    effect = c.on_fetch_answer(TP0, FetchAnswer(0, records=records_of([0, 1, 2, 3], 0)))
    assert effect.stale and c.poll() == []
    assert c.fetch_requests(LEADERS)[1].partitions[0].fetch_offset == 3


def test_offset_out_of_range_resets_by_policy() -> None:
    c = core(auto_offset_reset=OffsetResetStrategy.LATEST)
    c.assign([TP0])
    c.seek(TP0, 50)
    c.fetch_requests(LEADERS)
    effect = c.on_fetch_answer(TP0, FetchAnswer(50, Errors.OFFSET_OUT_OF_RANGE))
    assert effect.reset is OffsetResetStrategy.LATEST
    assert c.position(TP0) is None
    assert c.partitions_to_reset() == {TP0: OffsetResetStrategy.LATEST}


def test_offset_out_of_range_without_a_policy_raises() -> None:
    c = core(auto_offset_reset=OffsetResetStrategy.NONE)
    c.assign([TP0])
    c.seek(TP0, 50)
    c.fetch_requests(LEADERS)
    with pytest.raises(OffsetOutOfRangeError, match="fetch offset 50 is out of range for t-0"):
        c.on_fetch_answer(TP0, FetchAnswer(50, Errors.OFFSET_OUT_OF_RANGE))


@pytest.mark.parametrize(
    "error",
    [
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
    ],
)
def test_leadership_errors_refresh_metadata_and_keep_the_position(error: Errors) -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 4)
    c.fetch_requests(LEADERS)
    effect = c.on_fetch_answer(TP0, FetchAnswer(4, error, current_leader=3, current_leader_epoch=6))
    assert effect.refresh_metadata
    assert effect.leader_hint == LeaderInfo(3, 6)
    assert c.position(TP0) == 4
    assert c.fetch_requests(LEADERS)[1].partitions[0].fetch_offset == 4


def test_a_lost_fetch_is_sent_again() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 4)
    c.fetch_requests(LEADERS)
    assert c.on_fetch_failure(TP0).refresh_metadata
    assert c.fetch_requests(LEADERS)[1].partitions[0].fetch_offset == 4


def test_a_corrupt_batch_raises_naming_the_partition() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    raw = bytearray(records_of([0, 1], 0))
    raw[-1] ^= 0xFF
    with pytest.raises(FetchError, match="t-0.*CRC"):
        c.on_fetch_answer(TP0, FetchAnswer(0, records=bytes(raw)))


def test_a_partial_batch_at_the_end_is_fetched_again() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    whole = records_of([0, 1], 0)
    cut = records_of([2, 3], 2)[:30]
    c.on_fetch_answer(TP0, FetchAnswer(0, records=whole + cut))
    assert [r.offset for r in c.poll()] == [0, 1]
    assert c.fetch_requests(LEADERS)[1].partitions[0].fetch_offset == 2


def test_a_control_batch_is_skipped_and_passed() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    control = build_batch([Record(0, 0, b"\x00\x00\x00\x00", b"")], control=True)
    c.on_fetch_answer(TP0, FetchAnswer(0, records=control))
    assert c.poll() == [] and c.position(TP0) == 1


def test_a_divergence_below_the_position_moves_it_back() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 20, leader_epoch=4)
    c.fetch_requests(LEADERS)
    effect = c.on_fetch_answer(TP0, FetchAnswer(20, diverging_epoch=(3, 15)))
    assert effect.reset is OffsetResetStrategy.EARLIEST
    assert c.position(TP0) == 15
    strict = core(auto_offset_reset=OffsetResetStrategy.NONE)
    strict.assign([TP0])
    strict.seek(TP0, 20, leader_epoch=4)
    strict.fetch_requests(LEADERS)
    with pytest.raises(LogTruncationError, match="diverges at offset 15"):
        strict.on_fetch_answer(TP0, FetchAnswer(20, diverging_epoch=(3, 15)))


def test_other_errors_raise() -> None:
    c = core()
    c.assign([TP0])
    c.seek(TP0, 0)
    c.fetch_requests(LEADERS)
    with pytest.raises(FetchError, match="CLUSTER_AUTHORIZATION_FAILED"):
        c.on_fetch_answer(TP0, FetchAnswer(0, Errors.CLUSTER_AUTHORIZATION_FAILED))


# -- random answers -------------------------------------------------------------------

FATES = ("ok", "partial", "small", "not_leader", "lost", "delay")


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    steps=st.lists(
        st.tuples(st.sampled_from(("fetch", "poll", "late", "seek")), st.sampled_from(FATES)),
        max_size=60,
    ),
)
def test_random_fetch_answers_return_every_record_once_in_order(
    seed: int, steps: list[tuple[str, str]]
) -> None:
    rng = random.Random(seed)
    logs = {TP0: FakeLog(rng, rng.randint(0, 8)), TP1: FakeLog(rng, rng.randint(0, 8))}
    c = core()
    c.assign(logs)
    for tp in c.partitions_to_reset():
        c.reset_position(tp, 0)
    consumed: dict[TopicPartition, list[int]] = {tp: [] for tp in logs}
    # Where the records consumed since the last seek start.
    start = dict.fromkeys(logs, 0)
    delayed: list[tuple[TopicPartition, FetchAnswer]] = []

    def fetch(fate: str) -> None:
        for request in c.fetch_requests(LEADERS).values():
            for p in request.partitions:
                log = logs[p.topic_partition]
                small = fate == "small" or fate == "partial"
                answer = log.fetch(p.fetch_offset, 40 if small else 10**6, fate == "partial")
                if fate == "not_leader":
                    c.on_fetch_answer(p.topic_partition, FetchAnswer(p.fetch_offset, Errors(6)))
                elif fate == "lost":
                    c.on_fetch_failure(p.topic_partition)
                elif fate == "delay":
                    # Delivered later, perhaps after it went stale; a copy
                    # also arrives now (a duplicate answer).
                    delayed.append((p.topic_partition, answer))
                    c.on_fetch_answer(p.topic_partition, answer)
                else:
                    c.on_fetch_answer(p.topic_partition, answer)

    def poll() -> None:
        for record in c.poll(rng.randint(1, 5)):
            consumed[TopicPartition(record.topic, record.partition)].append(record.offset)

    for kind, fate in steps:
        if kind == "fetch":
            fetch(fate)
        elif kind == "poll":
            poll()
        elif kind == "seek":
            # Anywhere, also inside a batch: the answers then begin before it.
            tp = rng.choice([TP0, TP1])
            start[tp] = rng.randint(0, logs[tp].end)
            consumed[tp] = []
            c.seek(tp, start[tp])
        elif delayed:
            tp, answer = delayed.pop(rng.randrange(len(delayed)))
            c.on_fetch_answer(tp, answer)
    for _ in range(1000):
        if all(c.position(tp) == log.end for tp, log in logs.items()):
            break
        fetch("ok")
        poll()
    for tp, log in logs.items():
        assert consumed[tp] == [o for o in log.offsets if o >= start[tp]], tp
        assert c.position(tp) == log.end


def test_poll_lets_partitions_take_turns() -> None:
    c = core()
    c.assign([TP0, TP1])
    c.seek(TP0, 0)
    c.seek(TP1, 0)
    c.fetch_requests(LEADERS)
    c.on_fetch_answer(TP0, FetchAnswer(0, records=records_of(list(range(4)), 0)))
    c.on_fetch_answer(TP1, FetchAnswer(0, records=records_of(list(range(4)), 0)))
    first = {r.partition for r in c.poll(2)}
    second = {r.partition for r in c.poll(2)}
    assert first == {0} and second == {1}

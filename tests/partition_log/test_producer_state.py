"""The producer state of idempotent producers: Kafka's sequence and epoch
rules with known answers, the five-batch duplicate window, truncations,
expiry, the snapshot format, and rebuilding from a snapshot plus the log."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import pytest
from crc32c import crc32c
from hypothesis import find, given, settings
from hypothesis import strategies as st

import bugs
from bugs import Bug
from partition_log import producer_state
from partition_log.errors import Errors, PartitionLogError
from partition_log.producer_state import (
    INT32_MAX,
    NO_PRODUCER_ID,
    Append,
    BatchMetadata,
    Duplicate,
    ProducerBatch,
    ProducerEntry,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    increment_sequence,
)
from partition_log.txn import ControlType, EndTxnMarker

PID = 1000


@dataclass
class Leader:
    """A leader's log as the producer state sees it: it checks each batch,
    appends it at its end when allowed, and records it."""

    state: ProducerStateManager = field(default_factory=ProducerStateManager)
    log_end: int = 0
    log: list[ProducerBatch] = field(default_factory=list)

    def produce(
        self, sequence: int, records: int = 1, epoch: int = 0, pid: int = PID, timestamp: int = 0
    ) -> Append | Duplicate:
        batch = ProducerBatch(pid, epoch, sequence, records - 1, self.log_end, timestamp)
        verdict = self.state.check(batch)
        if isinstance(verdict, Append):
            self.state.update(batch)
            self.log.append(batch)
            self.log_end = batch.last_offset + 1
        return verdict


def refused(leader: Leader, code: Errors, match: str, **batch: int) -> None:
    before = (dict(leader.state.producers), leader.state.map_end_offset)
    with pytest.raises(PartitionLogError, match=match) as caught:
        leader.produce(**batch)
    assert caught.value.code is code
    assert (leader.state.producers, leader.state.map_end_offset) == before


def leader_with_batches(count: int, records: int = 2) -> Leader:
    leader = Leader()
    for index in range(count):
        assert leader.produce(index * records, records) == Append()
    return leader


# -- the rules with known answers --


@pytest.mark.parametrize("back", [1, 2, 3, 4, 5])
def test_a_retry_of_one_of_the_last_five_batches_gets_its_original_offsets(back: int) -> None:
    leader = leader_with_batches(8)
    index = 8 - back
    verdict = leader.produce(index * 2, 2)
    assert verdict == Duplicate(index * 2, index * 2 + 1, 0)
    assert leader.log_end == 16  # nothing appended


def test_a_retry_older_than_the_last_five_batches_is_out_of_order() -> None:
    leader = leader_with_batches(8)
    refused(
        leader,
        Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
        "producer 1000 at offset 16: out of order sequence number 4 in epoch 0, expected 16",
        sequence=4,
        records=2,
    )


def test_a_retry_must_match_the_exact_sequence_range() -> None:
    leader = leader_with_batches(3)
    # Sequences 2..3 were one batch; 2..2 is not it, and does not follow 5.
    refused(leader, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, "out of order", sequence=2, records=1)


def test_a_sequence_gap_is_out_of_order() -> None:
    leader = leader_with_batches(2)
    refused(leader, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 4 after 3", sequence=5)
    assert leader.produce(4) == Append()


def test_a_new_epoch_must_start_at_sequence_zero() -> None:
    leader = leader_with_batches(2)
    refused(
        leader,
        Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
        "invalid sequence number for new epoch 1: 4",
        sequence=4,
        epoch=1,
    )
    assert leader.produce(0, epoch=1) == Append()
    entry = leader.state.entry(PID)
    assert entry is not None and entry.epoch == 1 and len(entry.batches) == 1


def test_an_older_epoch_is_fenced() -> None:
    leader = leader_with_batches(2)
    assert leader.produce(0, epoch=3) == Append()
    # Even a retry of an epoch-0 batch: that epoch is over.
    refused(
        leader,
        Errors.INVALID_PRODUCER_EPOCH,
        "epoch 0 is older than its epoch 3",
        sequence=0,
        records=2,
        epoch=0,
    )


def test_b22_appends_a_fenced_epochs_transactional_batch_as_its_producers() -> None:
    state = ProducerStateManager()
    state.update(ProducerBatch(PID, 3, 0, 0, 0, 0, is_transactional=True))
    fenced = ProducerBatch(PID, 1, 7, 0, 1, 5, is_transactional=True)
    with pytest.raises(PartitionLogError, match="epoch 1 is older than its epoch 3"):
        state.check(fenced)
    with bugs.injected(Bug.FENCED_EPOCH_PRODUCE):
        assert state.check(fenced) == Append()
        # An idempotent producer's batch is still fenced: the bug is the
        # transactional produce path's.
        with pytest.raises(PartitionLogError, match="epoch 1 is older"):
            state.check(ProducerBatch(PID, 1, 7, 0, 1, 5))
    state.update(fenced)
    # It joined the open transaction and changed neither the epoch nor the
    # duplicate window: the producer's own next batch follows its last.
    entry = state.entry(PID)
    assert entry is not None
    assert (entry.epoch, entry.last_seq, entry.current_txn_first_offset) == (3, 0, 0)
    assert state.check(ProducerBatch(PID, 3, 1, 0, 2, 6, is_transactional=True)) == Append()


def test_a_version_2_marker_at_the_open_transactions_epoch_is_a_late_copy() -> None:
    # Transaction 1's batches at epoch 3, its marker at 4; transaction 2's
    # batch at 4 is open when a late copy of the epoch-4 marker comes.
    state = ProducerStateManager()
    state.update(ProducerBatch(PID, 3, 0, 0, 0, 0, is_transactional=True))
    commit = EndTxnMarker(ControlType.COMMIT, 0)
    first = ProducerBatch(PID, 4, -1, 0, 1, 0, is_transactional=True, marker=commit)
    assert state.check(first, client=False, marker_bumps_epoch=True) == Append()
    state.update(first)
    # A retry of it with nothing open: harmless (KAFKA-19999).
    again = ProducerBatch(PID, 4, -1, 0, 2, 0, is_transactional=True, marker=commit)
    assert state.check(again, client=False, marker_bumps_epoch=True) == Append()
    state.update(ProducerBatch(PID, 4, 0, 0, 2, 0, is_transactional=True))
    late = ProducerBatch(PID, 4, -1, 0, 3, 0, is_transactional=True, marker=commit)
    with pytest.raises(PartitionLogError, match="a late marker of the producer's previous") as e:
        state.check(late, client=False, marker_bumps_epoch=True)
    assert e.value.code is Errors.INVALID_PRODUCER_EPOCH
    # Transaction version 1 (and an administrator's abort): a transaction's
    # marker is at its batches' epoch.
    assert state.check(late, client=False) == Append()


def test_sequences_wrap_to_zero_after_the_largest_int32() -> None:
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    leader = Leader()
    assert leader.produce(INT32_MAX - 3, 2) == Append()  # ..INT32_MAX - 2
    assert leader.produce(INT32_MAX - 1, 3) == Append()  # INT32_MAX - 1, INT32_MAX, 0
    assert leader.produce(INT32_MAX - 1, 3) == Duplicate(2, 4, 0)
    refused(leader, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 1 after 0", sequence=2)
    assert leader.produce(1) == Append()


def test_the_largest_int32_is_followed_by_zero_only() -> None:
    leader = Leader()
    assert leader.produce(INT32_MAX) == Append()
    refused(leader, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 0", sequence=1)
    assert leader.produce(0) == Append()


def test_an_unknown_producer_may_start_at_any_sequence() -> None:
    leader = Leader()
    assert leader.produce(77, epoch=4) == Append()
    assert leader.produce(78, epoch=4) == Append()


def test_a_batch_without_a_producer_id_is_not_tracked() -> None:
    leader = Leader()
    assert leader.produce(-1, pid=NO_PRODUCER_ID, epoch=-1) == Append()
    assert leader.state.producers == {} and leader.state.map_end_offset == 1


def test_batches_are_applied_in_log_order() -> None:
    leader = leader_with_batches(2)
    with pytest.raises(ValueError, match="below the producer state's end 4"):
        leader.state.update(ProducerBatch(PID, 0, 4, 0, 3, 0))


def test_a_follower_records_the_leaders_batches_as_they_are() -> None:
    # A leader that had forgotten the producer accepted sequence 40 in the
    # same epoch; the follower that still knew it records it all the same.
    follower = ProducerStateManager()
    follower.update(ProducerBatch(PID, 0, 0, 1, 0, 0))
    follower.update(ProducerBatch(PID, 0, 40, 0, 2, 0))
    entry = follower.entry(PID)
    assert entry is not None and entry.last_seq == 40


# -- truncations and expiry --


def test_truncate_to_forgets_the_batches_past_the_new_end() -> None:
    leader = leader_with_batches(4)
    leader.produce(0, pid=7)  # offset 8
    leader.state.truncate_to(5)
    entry = leader.state.entry(PID)
    assert entry is not None and [b.first_offset for b in entry.batches] == [0, 2]
    assert leader.state.entry(7) is None
    assert leader.state.map_end_offset == 5


def test_truncate_to_forgets_what_only_a_rebuild_brings_back() -> None:
    # Epoch 1 pushed epoch 0's batches out; truncating epoch 1 away leaves
    # nothing in memory, while the rebuild from the log has epoch 0 again.
    leader = leader_with_batches(3)
    snapshot = leader.state.snapshot()
    leader.produce(0, epoch=1)
    truncated = ProducerStateManager(dict(leader.state.producers), leader.state.map_end_offset)
    truncated.truncate_to(6)
    assert truncated.producers == {}
    rebuilt = ProducerStateManager.rebuild(snapshot, leader.log[3:3])
    entry = rebuilt.entry(PID)
    assert entry is not None and entry.epoch == 0 and len(entry.batches) == 3


def test_truncate_from_start_forgets_producers_with_nothing_left() -> None:
    leader = leader_with_batches(3)  # offsets 0..5
    leader.produce(0, pid=7)  # offset 6
    leader.state.truncate_from_start(6)
    assert leader.state.entry(PID) is None
    assert leader.state.entry(7) is not None
    # The forgotten producer may start again at any sequence.
    assert leader.produce(123) == Append()


def test_truncate_from_start_keeps_a_producer_with_a_batch_left_whole() -> None:
    leader = leader_with_batches(3)
    leader.state.truncate_from_start(5)
    entry = leader.state.entry(PID)
    assert entry is not None and len(entry.batches) == 3


def test_expiry_after_producer_id_expiration_ms() -> None:
    leader = Leader()
    leader.produce(0, pid=1, timestamp=1_000)
    leader.produce(0, pid=2, timestamp=5_000)
    assert leader.state.expire(now_ms=10_999, expiration_ms=10_000) == []
    assert leader.state.expire(now_ms=11_000, expiration_ms=10_000) == [1]
    assert list(leader.state.producers) == [2]


def test_a_producer_with_an_open_transaction_does_not_expire() -> None:
    entry = ProducerEntry(5, 0, (BatchMetadata(0, 0, 0, 0, 0),), 0, current_txn_first_offset=0)
    state = ProducerStateManager({5: entry}, 1)
    assert state.expire(now_ms=10**9, expiration_ms=1) == []


# -- the snapshot --


def sample_state() -> ProducerStateManager:
    leader = leader_with_batches(7)
    leader.produce(INT32_MAX, pid=9, epoch=2, timestamp=1234)
    leader.produce(0, pid=9, epoch=2, timestamp=1300)
    return leader.state


def test_snapshot_round_trip() -> None:
    state = sample_state()
    decoded = decode_snapshot(state.snapshot())
    assert decoded.offset == state.map_end_offset == 16
    assert {entry.producer_id: entry for entry in decoded.producers} == state.producers
    assert ProducerStateManager.rebuild(state.snapshot(), []) == state


def test_snapshot_layout() -> None:
    entry = ProducerEntry(3, 1, (BatchMetadata(5, 6, 10, 11, 99),), 99)
    data = encode_snapshot([entry], 12)
    body = struct.pack(">qi", 12, 1) + struct.pack(">qhqiqb", 3, 1, 99, -1, -1, 1)
    body += struct.pack(">iiqqq", 5, 6, 10, 11, 99)
    assert data == struct.pack(">hI", 1, crc32c(body)) + body


def test_every_flipped_bit_of_a_snapshot_is_caught() -> None:
    data = sample_state().snapshot()
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        with pytest.raises(PartitionLogError, match="producer snapshot: ") as caught:
            decode_snapshot(bytes(damaged))
        assert caught.value.code is Errors.KAFKA_STORAGE_ERROR


def test_every_truncated_snapshot_is_caught() -> None:
    data = sample_state().snapshot()
    for length in range(len(data)):
        with pytest.raises(PartitionLogError, match="producer snapshot: "):
            decode_snapshot(data[:length])


def with_crc(body: bytes, version: int = 1) -> bytes:
    return struct.pack(">hI", version, crc32c(body)) + body


PRODUCER = struct.pack(">qhqiqb", 3, 1, 99, -1, -1, 1) + struct.pack(">iiqqq", 5, 6, 10, 11, 99)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x01", "2 bytes, shorter than its 18-byte header"),
        (with_crc(struct.pack(">qi", 0, 0), version=0), "unknown version 0"),
        (struct.pack(">hI", 1, 5) + struct.pack(">qi", 0, 0), "CRC 0x00000005 stored"),
        (with_crc(struct.pack(">qi", -1, 0)), "offset -1 or producer count 0"),
        (with_crc(struct.pack(">qi", 12, 2) + PRODUCER), "ends inside producer 1 of 2"),
        (with_crc(struct.pack(">qi", 12, 1) + PRODUCER[:40]), "ends inside the batches"),
        (with_crc(struct.pack(">qi", 12, 1) + PRODUCER + b"\x00"), "1 bytes after the last"),
        (with_crc(struct.pack(">qi", 11, 1) + PRODUCER), "last offset 11 is not below"),
        (with_crc(struct.pack(">qi", 12, 2) + PRODUCER * 2), "producer 3 does not follow"),
        (
            with_crc(struct.pack(">qi", 12, 1) + struct.pack(">qhqiqb", 3, 1, 99, -1, -1, 6)),
            "producer 3 has 6 batches",
        ),
        (
            with_crc(
                struct.pack(">qi", 12, 1)
                + struct.pack(">qhqiqb", 3, 1, 99, -1, -1, 1)
                + struct.pack(">iiqqq", 5, 9, 10, 11, 99)
            ),
            "sequences 5..9 do not span offsets 10..11",
        ),
    ],
)
def test_a_corrupt_snapshot_names_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(PartitionLogError, match=message) as caught:
        decode_snapshot(data)
    assert caught.value.code is Errors.KAFKA_STORAGE_ERROR


# -- properties --


@st.composite
def producer_sessions(draw: st.DrawFn) -> list[tuple[int, int, int, int]]:
    """What producers send: per step (producer, epoch, base sequence,
    records), in order per producer, with retries of any of its last five
    batches and occasional epoch bumps (which restart at sequence 0)."""
    producers = draw(st.integers(1, 3))
    sent: dict[int, list[tuple[int, int, int]]] = {p: [] for p in range(producers)}
    epochs = dict.fromkeys(range(producers), 0)
    nexts = {p: draw(st.sampled_from([0, INT32_MAX - 3])) for p in range(producers)}
    steps: list[tuple[int, int, int, int]] = []
    for _ in range(draw(st.integers(0, 60))):
        pid = draw(st.integers(0, producers - 1))
        kind = draw(st.sampled_from(["new", "new", "retry", "bump"]))
        if kind == "retry" and sent[pid]:
            epoch, sequence, records = draw(st.sampled_from(sent[pid][-5:]))
        else:
            if kind == "bump":
                epochs[pid] += 1
                nexts[pid] = 0
                sent[pid] = []
            records = draw(st.integers(1, 4))
            epoch, sequence = epochs[pid], nexts[pid]
            sent[pid].append((epoch, sequence, records))
            nexts[pid] = increment_sequence(sequence, records)
        steps.append((pid, epoch, sequence, records))
    return steps


def run_sessions(leader: Leader, steps: list[tuple[int, int, int, int]]) -> None:
    """Sends ``steps``; every retry must get its original offsets."""
    offsets: dict[tuple[int, int, int], tuple[int, int]] = {}
    for step, (pid, epoch, sequence, records) in enumerate(steps):
        start = leader.log_end
        verdict = leader.produce(sequence, records, epoch, pid, timestamp=step)
        key = (pid, epoch, sequence)
        if isinstance(verdict, Duplicate):
            assert (verdict.first_offset, verdict.last_offset) == offsets[key]
        else:
            assert key not in offsets, f"batch {key} appended twice"
            offsets[key] = (start, start + records - 1)


@settings(max_examples=300, deadline=None)
@given(producer_sessions())
def test_in_order_producers_with_retries_never_fail_and_get_original_offsets(
    steps: list[tuple[int, int, int, int]],
) -> None:
    run_sessions(Leader(), steps)


def test_without_the_duplicate_check_the_property_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ProducerEntry, "find_duplicate", lambda self, batch: None)

    def fails(steps: list[tuple[int, int, int, int]]) -> bool:
        try:
            run_sessions(Leader(), steps)
        except (PartitionLogError, AssertionError):
            return True
        return False

    find(producer_sessions(), fails, settings=settings(database=None, deadline=None))


def test_without_the_five_batch_window_the_property_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Retaining only the last batch (Kafka's snapshot keeps one) misses
    # retries of the four before it.
    monkeypatch.setattr(producer_state, "NUM_BATCHES_TO_RETAIN", 1)

    def fails(steps: list[tuple[int, int, int, int]]) -> bool:
        try:
            run_sessions(Leader(), steps)
        except (PartitionLogError, AssertionError):
            return True
        return False

    find(producer_sessions(), fails, settings=settings(database=None, deadline=None))


@settings(max_examples=200, deadline=None)
@given(producer_sessions(), st.data())
def test_rebuild_from_a_snapshot_plus_the_batches_after_it_equals_the_state(
    steps: list[tuple[int, int, int, int]], data: st.DataObject
) -> None:
    leader = Leader()
    snapshots: dict[int, bytes] = {0: leader.state.snapshot()}
    for pid, epoch, sequence, records in steps:
        leader.produce(sequence, records, epoch, pid)
        # A snapshot now and then, as at a segment roll.
        if data.draw(st.booleans()):
            snapshots[leader.state.map_end_offset] = leader.state.snapshot()
    # Recovery: the latest snapshot plus the batches after it.
    latest = max(snapshots)
    assert ProducerStateManager.rebuild(snapshots[latest], leader.log) == leader.state
    # Truncation to a batch boundary: the latest snapshot at or before it plus
    # the batches up to it equals the state built directly from those batches.
    boundaries = [0, *(batch.last_offset + 1 for batch in leader.log)]
    end = data.draw(st.sampled_from(boundaries))
    kept = [batch for batch in leader.log if batch.last_offset < end]
    direct = ProducerStateManager()
    for batch in kept:
        direct.update(batch)
    base = max(offset for offset in snapshots if offset <= end)
    rebuilt = ProducerStateManager.rebuild(snapshots[base], kept)
    assert rebuilt.producers == direct.producers
    # The in-memory truncation forgets, never invents: what it keeps of each
    # producer is the tail of the rebuilt state's batches.
    leader.state.truncate_to(end)
    for producer_id, entry in leader.state.producers.items():
        full = rebuilt.producers[producer_id]
        assert entry.epoch == full.epoch
        assert full.batches[len(full.batches) - len(entry.batches) :] == entry.batches


@given(producer_sessions())
def test_snapshot_round_trip_of_any_state(steps: list[tuple[int, int, int, int]]) -> None:
    leader = Leader()
    run_sessions(leader, steps)
    assert ProducerStateManager.rebuild(leader.state.snapshot(), []) == leader.state

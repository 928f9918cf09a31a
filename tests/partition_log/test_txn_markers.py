"""Transaction markers (``partition_log.txn``) and the producer state's
transactions: the control record's bytes, the control batch, the open and
completed transactions of each producer, the refusals before a marker or a
batch is appended, and the first unstable offset that bounds the last
stable offset (KIP-98; Kafka's ``ProducerAppendInfo`` and
``ProducerStateManager``)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import build_batch, verify
from partition_log.errors import Errors, PartitionLogError
from partition_log.producer_state import ProducerBatch, ProducerStateManager
from partition_log.records import Record
from partition_log.txn import (
    CompletedTxn,
    ControlType,
    EndTxnMarker,
    build_marker_batch,
    decode_marker,
    encode_marker,
    read_marker,
)

COMMIT = EndTxnMarker(ControlType.COMMIT, 3)
ABORT = EndTxnMarker(ControlType.ABORT, 3)

# -- the control record ------------------------------------------------------------------


def test_a_marker_is_kafkas_end_transaction_marker() -> None:
    key, value = encode_marker(COMMIT)
    # key: version 0, type 1 (COMMIT); value: version 0, coordinator epoch 3.
    assert key == b"\x00\x00\x00\x01" and value == b"\x00\x00\x00\x00\x00\x03"
    assert decode_marker(key, value) == COMMIT
    assert decode_marker(*encode_marker(ABORT)).aborted
    # A later version is read by its known prefix.
    assert decode_marker(b"\x00\x01\x00\x00extra", value + b"more") == EndTxnMarker(
        ControlType.ABORT, 3
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (None, b"\x00\x00\x00\x00\x00\x03", "key of 0 bytes"),
        (b"\x00\x00\x00", b"\x00\x00\x00\x00\x00\x03", "key of 3 bytes"),
        (b"\x00\x00\x00\x02", b"\x00\x00\x00\x00\x00\x03", "type 2 is not a transaction marker"),
        (b"\xff\xff\x00\x01", b"\x00\x00\x00\x00\x00\x03", "key version -1"),
        (b"\x00\x00\x00\x01", None, "COMMIT marker value of 0 bytes"),
        (b"\x00\x00\x00\x01", b"\x00\x00\x00", "value of 3 bytes"),
        (b"\x00\x00\x00\x01", b"\xff\xff\x00\x00\x00\x03", "value version -1"),
    ],
)
def test_a_malformed_marker_is_refused_by_name(
    key: bytes | None, value: bytes | None, message: str
) -> None:
    with pytest.raises(PartitionLogError, match=message) as refused:
        decode_marker(key, value)
    assert refused.value.code is Errors.INVALID_RECORD


def test_the_marker_batch_is_a_transactional_control_batch_of_one_record() -> None:
    data = build_marker_batch(7, 2, ABORT, 1_000, base_offset=40, partition_leader_epoch=5)
    header = verify(data)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, -1)
    assert (header.base_offset, header.records_count, header.max_timestamp) == (40, 1, 1_000)
    assert read_marker(data, header) == ABORT


def test_what_is_not_a_marker_batch_is_refused_by_name() -> None:
    with pytest.raises(PartitionLogError, match="needs a producer id and epoch"):
        build_marker_batch(-1, 0, COMMIT, 0)
    data = build_batch([Record(0, 0, b"k", b"v")])
    with pytest.raises(PartitionLogError, match="is not a control batch"):
        read_marker(data, verify(data))
    key, value = encode_marker(COMMIT)
    plain = build_batch([Record(0, 0, key, value)], producer_id=7, producer_epoch=0, control=True)
    with pytest.raises(PartitionLogError, match="is transactional and has a producer id"):
        read_marker(plain, verify(plain))
    two = build_batch(
        [Record(0, 0, key, value), Record(1, 0, key, value)],
        producer_id=7,
        producer_epoch=0,
        transactional=True,
        control=True,
    )
    with pytest.raises(PartitionLogError, match="2 records, a marker has one"):
        read_marker(two, verify(two))


def test_a_marker_needs_its_producer() -> None:
    with pytest.raises(ValueError, match="needs a producer id and epoch"):
        ProducerBatch(-1, -1, -1, 0, 0, 0, True, COMMIT)
    with pytest.raises(ValueError, match="coordinator epoch"):
        EndTxnMarker(ControlType.COMMIT, 2**31)


# -- the producer state --------------------------------------------------------------------


class Log:
    """A partition's producer state fed batches at increasing offsets, as a
    leader appends them (checked, then recorded)."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.end = 0
        self.sequences: dict[int, int] = {}

    def data(self, pid: int, epoch: int = 0, *, txn: bool = True, records: int = 1) -> int:
        sequence = self.sequences.get(pid, 0)
        batch = ProducerBatch(pid, epoch, sequence, records - 1, self.end, 0, txn)
        self.state.check(batch)
        assert self.state.update(batch) is None
        self.sequences[pid] = sequence + records
        self.end += records
        return batch.base_offset

    def marker(
        self, pid: int, marker: EndTxnMarker, epoch: int = 0, *, check: bool = True
    ) -> CompletedTxn | None:
        batch = ProducerBatch(pid, epoch, -1, 0, self.end, 10, True, marker)
        if check:
            self.state.check(batch)
        self.end += 1
        return self.state.update(batch)


def test_a_transaction_is_open_from_its_first_batch_until_its_marker_is_replicated() -> None:
    log = Log()
    log.data(9, txn=False)  # another producer's plain batch: no transaction
    assert log.state.first_unstable_offset() is None
    first = log.data(7, records=3)
    log.data(7)
    assert log.state.first_unstable_offset() == first == 1
    assert log.state.producers[7].current_txn_first_offset == 1
    done = log.marker(7, COMMIT)
    assert done == CompletedTxn(7, 1, 5, False, 6)
    # Ended, but its marker is not below the high watermark yet.
    assert log.state.first_unstable_offset() == 1
    log.state.on_high_watermark(5)
    assert log.state.first_unstable_offset() == 1
    log.state.on_high_watermark(6)
    assert log.state.first_unstable_offset() is None
    assert log.state.producers[7].current_txn_first_offset == -1
    assert log.state.producers[7].coordinator_epoch == 3


def test_an_aborted_transaction_records_the_stable_offset_of_the_others() -> None:
    log = Log()
    a = log.data(1)
    b = log.data(2)
    log.data(1)
    done = log.marker(1, ABORT)
    # Producer 2's transaction, open from offset 1, holds the stable offset.
    assert done == CompletedTxn(1, a, 3, True, b)
    assert log.state.first_unstable_offset() == a
    log.state.on_high_watermark(4)
    assert log.state.first_unstable_offset() == b
    assert log.marker(2, COMMIT) == CompletedTxn(2, b, 4, False, 5)


def test_a_marker_with_no_transaction_open_completes_nothing() -> None:
    log = Log()
    log.data(7, txn=False)
    assert log.marker(7, EndTxnMarker(ControlType.ABORT, 5), epoch=1) is None
    entry = log.state.producers[7]
    # KIP-890: the marker's bumped epoch is the producer's now, its older
    # batches forgotten; the coordinator epoch is the marker's.
    assert (entry.epoch, entry.batches, entry.coordinator_epoch) == (1, (), 5)
    assert log.state.first_unstable_offset() is None


@pytest.mark.parametrize(
    ("epoch", "coordinator_epoch", "code"),
    [
        (0, 3, Errors.INVALID_PRODUCER_EPOCH),  # a zombie producer's epoch
        (1, 2, Errors.TRANSACTION_COORDINATOR_FENCED),  # a replaced coordinator
    ],
)
def test_an_old_epochs_marker_is_refused_and_changes_nothing(
    epoch: int, coordinator_epoch: int, code: Errors
) -> None:
    log = Log()
    log.data(7, epoch=1)
    log.marker(7, EndTxnMarker(ControlType.COMMIT, 3), epoch=1)
    log.sequences[7] = 0
    log.data(7, epoch=1)
    before = dict(log.state.producers), dict(log.state.ongoing)
    stale = ProducerBatch(
        7, epoch, -1, 0, log.end, 0, True, EndTxnMarker(ControlType.ABORT, coordinator_epoch)
    )
    with pytest.raises(PartitionLogError, match="older than") as refused:
        log.state.check(stale)
    assert refused.value.code is code
    assert (dict(log.state.producers), dict(log.state.ongoing)) == before
    # The same epochs pass.
    log.state.check(ProducerBatch(7, 1, -1, 0, log.end, 0, True, COMMIT))


def test_a_plain_batch_inside_an_open_transaction_is_refused() -> None:
    log = Log()
    log.data(7)
    with pytest.raises(
        PartitionLogError, match="non-transactional batch while its transaction"
    ) as refused:
        log.state.check(ProducerBatch(7, 0, 1, 0, log.end, 0, False))
    assert refused.value.code is Errors.INVALID_TXN_STATE
    log.marker(7, COMMIT)
    log.state.check(ProducerBatch(7, 0, 1, 0, log.end, 0, False))


def test_the_snapshot_keeps_the_open_transactions() -> None:
    log = Log()
    log.data(1)
    log.data(2)
    log.marker(1, COMMIT)
    log.data(3)
    reloaded = ProducerStateManager.rebuild(log.state.snapshot(), ())
    assert reloaded.ongoing == {1: 2, 3: 3} == log.state.ongoing
    assert reloaded.producers[1].coordinator_epoch == 3
    # A reloaded log takes the markers below its end as replicated.
    assert reloaded.first_unstable_offset() == 1 and reloaded.unreplicated == {}


def test_truncation_reopens_a_transaction_whose_marker_it_cuts() -> None:
    log = Log()
    first = log.data(1, records=2)
    log.marker(1, ABORT)  # at offset 2
    log.data(2)  # at 3
    log.state.truncate_to(3)
    assert log.state.ongoing == {} and log.state.first_unstable_offset() == 0
    log.state.truncate_to(2)
    assert log.state.ongoing == {first: 1} and log.state.unreplicated == {}
    assert log.state.first_unstable_offset() == first
    log.state.truncate_to(0)
    assert log.state.ongoing == {} and log.state.first_unstable_offset() is None


def test_the_log_start_passing_a_transaction_forgets_it() -> None:
    log = Log()
    log.data(1)
    log.data(2)
    log.marker(2, COMMIT)
    log.state.truncate_from_start(4)
    assert log.state.ongoing == {} and log.state.unreplicated == {}
    assert log.state.first_unstable_offset() is None


# -- against a model -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 60))
def test_the_first_unstable_offset_is_the_lowest_open_or_unreplicated_transaction(
    seed: int, steps: int
) -> None:
    rng = random.Random(seed)
    log = Log()
    open_at: dict[int, int] = {}  # producer -> first offset of its open txn
    ended: list[tuple[int, int]] = []  # (first offset, marker offset) not yet replicated
    hw = 0
    for _ in range(steps):
        pid = rng.randint(1, 3)
        what = rng.random()
        if what < 0.5:
            at = log.data(pid)
            open_at.setdefault(pid, at)
        elif what < 0.8:
            marker = COMMIT if rng.random() < 0.5 else ABORT
            done = log.marker(pid, marker)
            if pid in open_at:
                first = open_at.pop(pid)
                assert done is not None and (done.first_offset, done.aborted) == (
                    first,
                    marker.aborted,
                )
                others = [f for p, f in open_at.items() if p != pid]
                assert done.last_stable_offset == (min(others) if others else done.last_offset + 1)
                ended.append((first, done.last_offset))
            else:
                assert done is None
        else:
            hw = rng.randint(hw, log.end)
            log.state.on_high_watermark(hw)
            ended = [(f, m) for f, m in ended if m >= hw]
        firsts = [*open_at.values(), *(f for f, _ in ended)]
        assert log.state.first_unstable_offset() == (min(firsts) if firsts else None), seed
        # What a reload from the snapshot knows: the open ones.
        reloaded = ProducerStateManager.rebuild(log.state.snapshot(), ())
        assert set(reloaded.ongoing) == set(open_at.values()), seed

"""The idempotence bugs of the catalogue fire in the leader's append: B11
(no deduplication window: a retried batch is appended twice) and B12
(Redpanda #3039: a retry in the window is refused as out of order, so the
client resends it under a new epoch and it is appended twice). With the
bugs off, the same retry is answered with its original offsets."""

from __future__ import annotations

import pytest

import bugs
from bugs import Bug
from partition_log.batch import BatchHeader, decode_records, split_batches
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from tests.partition_log.log_util import batch

PRODUCER = 7


def _values(log: PartitionLog) -> list[tuple[int, bytes | None]]:
    data = log.read(0, 1 << 20)
    return [
        (record.offset, record.value)
        for view in split_batches(data)
        for record in decode_records(bytes(view))
    ]


def _pipelined_with_a_retry(log: PartitionLog) -> None:
    """Three batches of one producer in flight (sequences 0, 2, 4), then the
    first is retried (its answer was lost), as the pipelined client does."""
    for sequence, value in ((0, b"a"), (2, b"b"), (4, b"c")):
        log.append_as_leader(
            batch(2, producer=PRODUCER, producer_epoch=0, sequence=sequence, value=value),
            0,
            now_ms=0,
        )


def _retry(log: PartitionLog) -> int:
    info = log.append_as_leader(
        batch(2, producer=PRODUCER, producer_epoch=0, sequence=0, value=b"a"), 0, now_ms=0
    )
    return info.first_offset


def test_a_retry_in_the_window_gets_its_offsets_and_appends_nothing() -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    _pipelined_with_a_retry(log)
    assert _retry(log) == 0
    assert log.log_end_offset == 6
    assert [v for _, v in _values(log)].count(b"a") == 2  # the batch's two records, once


def test_b11_no_dedup_window_appends_the_retry_twice() -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    _pipelined_with_a_retry(log)
    with bugs.injected(Bug.NO_DEDUP_WINDOW):
        assert _retry(log) == 6
    assert log.log_end_offset == 8
    # The same values at two offsets each: Jepsen's duplicate.
    assert _values(log)[-2:] == [(6, b"a"), (7, b"a")]
    assert [v for _, v in _values(log)].count(b"a") == 4


def test_b12_out_of_order_for_a_duplicate_then_the_resend_duplicates() -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    _pipelined_with_a_retry(log)
    with bugs.injected(Bug.OUT_OF_ORDER_FOR_DUPLICATE):
        with pytest.raises(PartitionLogError) as refused:
            _retry(log)
        assert refused.value.code is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert "a retry of the batch at offset 0" in str(refused.value)
        assert log.log_end_offset == 6  # the refusal wrote nothing
        # The client takes the refusal of its next expected batch as a lost
        # producer state (KIP-360): it bumps the epoch and resends at 0.
        info = log.append_as_leader(
            batch(2, producer=PRODUCER, producer_epoch=1, sequence=0, value=b"a"), 0, now_ms=0
        )
    assert info.first_offset == 6
    assert [v for _, v in _values(log)].count(b"a") == 4


def test_the_bugs_are_read_only_for_a_retry() -> None:
    # A batch that is no retry is checked as before with either bug on: in
    # order it is appended, out of order it is refused.
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    with bugs.injected(Bug.NO_DEDUP_WINDOW, Bug.OUT_OF_ORDER_FOR_DUPLICATE):
        _pipelined_with_a_retry(log)
        with pytest.raises(PartitionLogError) as refused:
            log.append_as_leader(
                batch(1, producer=PRODUCER, producer_epoch=0, sequence=9), 0, now_ms=0
            )
    assert refused.value.code is Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert [BatchHeader.parse(v).base_sequence for v in split_batches(log.read(0, 1 << 20))] == [
        0,
        2,
        4,
    ]

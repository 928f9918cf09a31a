"""The leader append's fast path: ``Segment.append_batch`` (one verified
batch whose header the caller has) refuses what ``Segment.append`` refuses,
changing nothing, and the leader's producer state is the one the stamped
batch gives, under CREATE_TIME and LOG_APPEND_TIME."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partition_log.segment as segment_module
from partition_log.batch import (
    BatchHeader,
    Compression,
    TimestampType,
    build_batch,
    decode_records,
    split_batches,
    verify,
)
from partition_log.errors import Errors, PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.records import Record
from partition_log.segment import Segment
from tests.partition_log.log_util import batch as producer_batch


def batch(base: int, count: int = 1, size: int = 10, stamp: int = 1000) -> bytes:
    records = [Record(base + i, stamp + i, b"k", b"v" * size) for i in range(count)]
    return build_batch(records, base_offset=base)


def contents(segment: Segment) -> bytes:
    return segment.read(segment.base_offset, 1 << 20) if segment.size else b""


def test_append_batch_appends_as_append_does() -> None:
    one = Segment.create(MemoryDirectory(), 0, now_ms=0, index_interval_bytes=100)
    other = Segment.create(MemoryDirectory(), 0, now_ms=0, index_interval_bytes=100)
    offset = 0
    for count in (3, 1, 4, 2, 5):
        data = batch(offset, count, size=40)
        one.append(data)
        other.append_batch(bytearray(data), verify(data))
        offset += count
    assert other.next_offset == one.next_offset == offset
    assert contents(other) == contents(one)
    assert other.first_batch_timestamp == one.first_batch_timestamp == 1002
    assert other.max_timestamp == one.max_timestamp
    assert len(other.offsets) == len(one.offsets) > 0
    assert [other.offsets.entry(i) for i in range(len(other.offsets))] == [
        one.offsets.entry(i) for i in range(len(one.offsets))
    ]
    assert other.read(7, 1) == one.read(7, 1)


@pytest.mark.parametrize(
    ("make", "why", "code"),
    [
        (lambda: (batch(5), verify(batch(5))), "base offset 5, expected the next offset 2", None),
        (lambda: (batch(1), verify(batch(1))), "base offset 1, expected the next offset 2", None),
        (
            lambda: (batch(2, 2), verify(batch(2))),
            r"a header of a \d+-byte batch with \d+ bytes",
            Errors.CORRUPT_MESSAGE,
        ),
    ],
)
def test_append_batch_refusals_change_nothing(make: object, why: str, code: Errors | None) -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    segment.append(batch(0, 2))
    before = contents(segment)
    data, header = make()  # type: ignore[operator]
    with pytest.raises(PartitionLogError, match=why) as e:
        segment.append_batch(data, header)
    assert segment.name in str(e.value)
    if code is not None:
        assert e.value.code is code
    assert contents(segment) == before and segment.next_offset == 2


def test_append_batch_refuses_an_offset_past_the_relative_range() -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    segment.append(build_batch([Record(0, 0, None, b"")], last_offset_delta=2**31 - 2))
    big = build_batch([Record(2**31 - 1, 0, None, b"")], base_offset=2**31 - 1, last_offset_delta=1)
    with pytest.raises(PartitionLogError, match="does not fit relative to base 0"):
        segment.append_batch(big, verify(big))
    assert segment.next_offset == 2**31 - 1


def test_append_batch_refuses_past_int32_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    segment = Segment.create(MemoryDirectory(), 0, now_ms=0)
    first = batch(0, size=100)
    monkeypatch.setattr(segment_module, "INT32_MAX", len(first) + 50)
    segment.append_batch(first, verify(first))
    second = batch(1, size=100)
    with pytest.raises(PartitionLogError, match="exceed a segment's int32 positions") as e:
        segment.append_batch(second, verify(second))
    assert e.value.code is Errors.MESSAGE_TOO_LARGE
    assert segment.size == len(first) and segment.next_offset == 1


def test_append_batch_refuses_when_an_index_is_full() -> None:
    segment = Segment.create(
        MemoryDirectory(), 0, now_ms=0, index_interval_bytes=1, max_index_bytes=16
    )
    for offset in range(2):
        data = batch(offset)
        segment.append_batch(data, verify(data))
    assert segment.times.is_full
    data = batch(2)
    with pytest.raises(PartitionLogError, match="an index is full") as e:
        segment.append_batch(data, verify(data))
    assert e.value.code is Errors.KAFKA_STORAGE_ERROR
    assert segment.next_offset == 2


@pytest.mark.parametrize("timestamp_type", list(TimestampType))
def test_the_leader_records_the_stamped_batch_in_the_producer_state(
    timestamp_type: TimestampType,
) -> None:
    """The producer state keeps the batch as stamped: its offsets and, under
    LOG_APPEND_TIME, the append time as its timestamp; a retry is a duplicate
    with the original offsets and appends nothing."""
    log = PartitionLog.open(MemoryDirectory(), LogConfig(timestamp_type=timestamp_type), now_ms=0)
    log.append_as_leader(producer_batch(2), 1, now_ms=5000)
    # A batch without a producer id only moves the producer state's end.
    assert log.producer_state.map_end_offset == 2 and not log.producer_state.producers
    idempotent = producer_batch(3, timestamp=7, producer=9, producer_epoch=0, sequence=0)
    info = log.append_as_leader(idempotent, 1, now_ms=8000)
    assert (info.first_offset, info.last_offset) == (2, 4)
    kept = log.producer_state.producers[9].batches[-1]
    expected_timestamp = 8000 if timestamp_type is TimestampType.LOG_APPEND_TIME else 7
    assert (kept.first_offset, kept.last_offset, kept.timestamp) == (2, 4, expected_timestamp)
    assert log.producer_state.map_end_offset == 5
    retry = log.append_as_leader(idempotent, 1, now_ms=9000)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (2, 4)
    assert log.log_end_offset == 5
    stored = BatchHeader.parse(log.read(2, 1 << 20))
    assert (stored.base_offset, stored.partition_leader_epoch) == (2, 1)
    assert stored.max_timestamp == expected_timestamp


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(0, 300), st.integers(0, 400)),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([None, 10**9]),
)
def test_a_leader_append_rolls_exactly_when_the_segment_says_so(
    appends: list[tuple[int, int, int]], stamp: int | None
) -> None:
    """The leader's inline roll test agrees with Segment.should_roll on every
    append: by size, by age (from the first batch's timestamp) and by a full
    index, the offset index's (constant timestamps) or the time index's."""
    config = LogConfig(
        segment_bytes=1500,
        segment_ms=1000,
        segment_jitter_ms=100,
        index_interval_bytes=1,
        segment_index_bytes=48,
    )
    log = PartitionLog.open(MemoryDirectory(), config, now_ms=0)
    now = 0
    for count, value_bytes, step in appends:
        now += step
        # Values mostly small: an index fills before the segment's bytes do.
        value = b"v" * (value_bytes if value_bytes > 250 else value_bytes // 10)
        data = producer_batch(count, value=value, timestamp=now if stamp is None else stamp)
        active = log._active
        expected = active.size > 0 and active.should_roll(
            config.segment_bytes,
            len(data),
            now,
            config.segment_ms,
            config.segment_jitter_ms,
            incoming_last_offset=log.log_end_offset + count - 1,
        )
        before = log.segment_base_offsets
        end = log.log_end_offset
        log.append_as_leader(data, 0, now_ms=now)
        assert log.segment_base_offsets == (before + [end] if expected else before)


@pytest.mark.parametrize("epoch", [2**31, 1.0])
def test_a_leader_epoch_outside_the_int32_field_is_refused(epoch: float) -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    log.append_as_leader(producer_batch(2), 1, now_ms=0)
    with pytest.raises(PartitionLogError, match="does not fit an int32") as e:
        log.append_as_leader(producer_batch(2), epoch, now_ms=0)  # type: ignore[arg-type]
    assert e.value.code is Errors.INVALID_RECORD
    assert log.log_end_offset == 2 and log.epoch_cache.latest_epoch == 1


def test_a_config_replaced_on_the_log_decides_the_key_check() -> None:
    # A broker replaces a log's config when the topic's changes: the leader's
    # check for records without a key follows the config in place.
    log = PartitionLog.open(MemoryDirectory(), LogConfig(), now_ms=0)
    keyless = build_batch([Record(0, 1000, None, b"v")])
    log.append_as_leader(keyless, 0, now_ms=0)
    log.config = LogConfig(cleanup_policy=CleanupPolicy.COMPACT)
    with pytest.raises(PartitionLogError, match="without key") as e:
        log.append_as_leader(keyless, 0, now_ms=0)
    assert e.value.code is Errors.INVALID_RECORD and log.log_end_offset == 1
    log.config = LogConfig()
    log.append_as_leader(keyless, 0, now_ms=0)
    assert log.log_end_offset == 2


def test_compression_type_recompresses_other_codecs_and_keeps_the_batch_fields() -> None:
    log = PartitionLog.open(MemoryDirectory(), LogConfig(compression=Compression.ZSTD), now_ms=0)
    plain = producer_batch(3, value=b"x" * 200, producer=7, producer_epoch=2, sequence=0)
    gz = build_batch(
        [Record(i, 1000 + i, b"k", b"y" * 200) for i in range(2)],
        compression=Compression.GZIP,
        producer_id=7,
        producer_epoch=2,
        base_sequence=3,
    )
    already = build_batch([Record(0, 5, None, b"z")], compression=Compression.ZSTD)
    for data in (plain, gz, already):
        log.append_as_leader(data, 4, 0)
    stored = split_batches(log.read(0, 1 << 20))
    headers = [verify(bytes(b)) for b in stored]
    assert [h.compression for h in headers] == [Compression.ZSTD] * 3
    # Offsets, timestamps and the producer's fields as the producer sent them.
    assert [(h.base_offset, h.last_offset) for h in headers] == [(0, 2), (3, 4), (5, 5)]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in headers[:2]] == [
        (7, 2, 0),
        (7, 2, 3),
    ]
    assert headers[1].max_timestamp == 1001
    assert [r.value for r in decode_records(bytes(stored[1]))] == [b"y" * 200] * 2
    # A batch already in the codec is stored as sent (but its offset and epoch).
    assert bytes(stored[2])[16:] == already[16:]
    # The producer's retry of the recompressed batch is still its duplicate.
    retry = log.append_as_leader(gz, 4, 0)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (3, 4)


def test_compression_type_uncompressed_and_a_recompressed_batch_too_large() -> None:
    config = LogConfig(compression=Compression.NONE, max_batch_bytes=400)
    log = PartitionLog.open(MemoryDirectory(), config, now_ms=0)
    small = build_batch([Record(0, 0, None, b"a" * 50)], compression=Compression.LZ4)
    log.append_as_leader(small, 0, 0)
    assert verify(log.read(0, 1 << 20)).compression is Compression.NONE
    big = build_batch([Record(0, 0, None, b"b" * 1000)], compression=Compression.LZ4)
    assert len(big) < 400
    with pytest.raises(PartitionLogError, match="recompressed as NONE") as caught:
        log.append_as_leader(big, 0, 0)
    assert caught.value.code is Errors.MESSAGE_TOO_LARGE
    assert log.log_end_offset == 1

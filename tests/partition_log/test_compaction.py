"""Compaction's pure part: the offset map, the batch filter, the dirty ratio,
the choice of log and the grouping of segments.

The property test cleans random keyed batches (tombstones, several producers,
compression, control batches) in two rounds at two times and checks after
each: every key's last value stays, every tombstone stays until the delete
horizon its first cleaning set, nothing obsolete stays, offsets and order are
unchanged, each producer's last batch stays, every batch is valid.  The same
check is shown to fail when a rule is broken on purpose."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import (
    NO_PRODUCER_ID,
    BatchHeader,
    Compression,
    TimestampType,
    build_batch,
    decode_records,
    verify,
)
from partition_log.compaction import (
    ENTRY_OVERHEAD_BYTES,
    CleanableRange,
    OffsetMap,
    SegmentSummary,
    _keys_of,
    _walk,
    build_offset_map,
    choose_log,
    clean_batch,
    cleanable_range,
    group_segments_by_size,
)
from partition_log.errors import PartitionLogError
from partition_log.records import Record

RETENTION = 1_000


@dataclass(frozen=True)
class BatchSpec:
    records: tuple[tuple[bytes | None, bytes | None], ...]
    producer_id: int
    compression: Compression
    control: bool = False
    log_append_time: bool = False


def make_batches(specs: Sequence[BatchSpec], start: int = 0) -> list[bytes]:
    """The specs as consecutive batches from ``start``; producers' sequences
    follow on, timestamps grow with offsets."""
    batches: list[bytes] = []
    offset = start
    sequences: dict[int, int] = {}
    for number, spec in enumerate(specs):
        records = [
            Record(offset + i, 10_000 + offset + i, key, value)
            for i, (key, value) in enumerate(spec.records)
        ]
        pid = spec.producer_id
        sequence = sequences.get(pid, 0) if pid != NO_PRODUCER_ID else -1
        if pid != NO_PRODUCER_ID:
            sequences[pid] = sequence + len(records)
        batches.append(
            build_batch(
                records,
                base_offset=offset,
                partition_leader_epoch=number // 3,
                compression=spec.compression,
                timestamp_type=(
                    TimestampType.LOG_APPEND_TIME
                    if spec.log_append_time
                    else TimestampType.CREATE_TIME
                ),
                max_timestamp=20_000 + offset if spec.log_append_time else None,
                producer_id=pid,
                producer_epoch=0 if pid != NO_PRODUCER_ID else -1,
                base_sequence=sequence,
                control=spec.control,
            )
        )
        offset += len(records)
    return batches


def last_offsets(batches: Sequence[bytes]) -> dict[int, int]:
    """Each producer's last batch's last offset (the producer state's)."""
    out: dict[int, int] = {}
    for batch in batches:
        header = BatchHeader.parse(batch)
        if header.producer_id != NO_PRODUCER_ID:
            out[header.producer_id] = header.last_offset
    return out


def clean(
    batches: Sequence[bytes],
    now_ms: int,
    *,
    offset_map: OffsetMap | None = None,
    producers: Mapping[int, int] | None = None,
) -> list[bytes]:
    offset_map = OffsetMap() if offset_map is None else offset_map
    build_offset_map(batches, 0, offset_map)
    producers = last_offsets(batches) if producers is None else producers
    out = []
    for batch in batches:
        cleaned = clean_batch(
            batch,
            offset_map,
            now_ms=now_ms,
            delete_retention_ms=RETENTION,
            producer_last_offsets=producers,
        )
        if cleaned is not None:
            out.append(cleaned)
    return out


def violations(
    original: Sequence[bytes],
    before: Sequence[bytes],
    after: Sequence[bytes],
    now_ms: int,
    first_cleaned: Mapping[int, int],
) -> list[str]:
    """What is wrong with ``after``, the cleaning at ``now_ms`` of
    ``before`` (itself ``original`` cleaned 0 or more times); a tombstone's
    first cleaning time is in ``first_cleaned`` by offset."""
    found: list[str] = []
    records_by_offset = {r.offset: r for b in original for r in decode_records(b)}
    last_by_key: dict[bytes, Record] = {}
    for batch in original:
        header = BatchHeader.parse(batch)
        if not header.is_control:
            for record in decode_records(batch):
                assert record.key is not None
                last_by_key[record.key] = record
    originals = {BatchHeader.parse(b).base_offset: BatchHeader.parse(b) for b in original}
    kept: dict[int, Record] = {}
    previous_end = -1
    for batch in after:
        try:
            header = verify(batch)
        except Exception as error:  # reported as a violation
            found.append(f"invalid batch: {error}")
            continue
        source = originals.get(header.base_offset)
        if source is None:
            found.append(f"batch at {header.base_offset} starts at no original batch's offset")
            continue
        if header.base_offset < previous_end:
            found.append(f"batch at {header.base_offset} out of order")
        previous_end = header.next_offset
        for name in (
            "last_offset_delta",
            "producer_id",
            "producer_epoch",
            "base_sequence",
            "partition_leader_epoch",
        ):
            if getattr(header, name) != getattr(source, name):
                found.append(f"batch at {header.base_offset}: {name} changed")
        if header.records_count and header.compression != source.compression:
            found.append(f"batch at {header.base_offset}: compression changed")
        for record in decode_records(batch):
            original_record = records_by_offset.get(record.offset)
            if original_record is None or (record.key, record.value) != (
                original_record.key,
                original_record.value,
            ):
                found.append(f"record at {record.offset} is not the original")
            kept[record.offset] = record
            if record.value is None and not header.is_control and header.delete_horizon_ms is None:
                found.append(f"tombstone at {record.offset} kept without a delete horizon")
    for key, last in last_by_key.items():
        if last.value is not None:
            if last.offset not in kept:
                found.append(f"key {key!r}: last value at {last.offset} lost")
        else:
            cleaned_at = first_cleaned.get(last.offset, now_ms)
            if now_ms < cleaned_at + RETENTION and last.offset not in kept:
                found.append(f"key {key!r}: tombstone at {last.offset} lost before its horizon")
            if now_ms >= cleaned_at + RETENTION and last.offset in kept:
                found.append(f"key {key!r}: tombstone at {last.offset} kept past its horizon")
    for offset, record in kept.items():
        assert record.key is not None
        if record.key in last_by_key and last_by_key[record.key].offset != offset:
            source_header = next(
                BatchHeader.parse(b)
                for b in original
                if BatchHeader.parse(b).base_offset <= offset <= BatchHeader.parse(b).last_offset
            )
            if not source_header.is_control:
                found.append(f"key {record.key!r}: obsolete record at {offset} kept")
    bases = {BatchHeader.parse(b).base_offset for b in after}
    for pid, last_offset in last_offsets(before).items():
        base = next(
            BatchHeader.parse(b).base_offset
            for b in before
            if BatchHeader.parse(b).last_offset == last_offset
        )
        if base not in bases:
            found.append(f"producer {pid}: its last batch at {base} dropped")
    return found


KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
VALUES = st.none() | st.binary(min_size=1, max_size=6)
SPEC = st.builds(
    BatchSpec,
    st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=5).map(tuple),
    st.sampled_from([NO_PRODUCER_ID, 7, 8]),
    st.sampled_from([Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD]),
    st.booleans().map(lambda b: False),
    st.booleans(),
)
CONTROL = st.builds(
    BatchSpec,
    st.just(((b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00"),)),
    st.sampled_from([7, 8]),
    st.just(Compression.NONE),
    st.just(True),
)


def first_cleaned_of(batches: Sequence[bytes], now_ms: int, known: dict[int, int]) -> None:
    """Note ``now_ms`` as the first cleaning of every tombstone not yet seen."""
    for batch in batches:
        for record in decode_records(batch):
            if record.value is None:
                known.setdefault(record.offset, now_ms)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.one_of(SPEC, SPEC, SPEC, CONTROL), min_size=1, max_size=12),
    st.integers(0, 2 * RETENTION),
)
def test_cleaning_twice_keeps_what_kafka_keeps(specs: list[BatchSpec], later: int) -> None:
    original = make_batches(specs)
    first_cleaned: dict[int, int] = {}
    now = 5_000
    once = clean(original, now)
    first_cleaned_of(original, now, first_cleaned)
    assert violations(original, original, once, now, first_cleaned) == []
    twice = clean(once, now + later)
    assert violations(original, once, twice, now + later, first_cleaned) == []
    # Cleaning is idempotent at the same time: nothing more goes.
    assert clean(twice, now + later) == twice


def test_the_check_fails_when_the_first_value_is_kept() -> None:
    class FirstOffsetMap(OffsetMap):
        """Broken on purpose: keeps a key's first offset, not its last."""

        def put(self, key: bytes, offset: int) -> None:
            if self.get(key) is None:
                super().put(key, offset)

    specs = [
        BatchSpec(((b"k", b"1"),), NO_PRODUCER_ID, Compression.NONE),
        BatchSpec(((b"k", b"2"),), NO_PRODUCER_ID, Compression.NONE),
    ]
    original = make_batches(specs)
    broken = clean(original, 0, offset_map=FirstOffsetMap())
    # Nothing looks obsolete to it, so the first value stays beside the last.
    assert [r.value for b in broken for r in decode_records(b)] == [b"1", b"2"]
    assert any("obsolete" in v for v in violations(original, original, broken, 0, {}))
    assert violations(original, original, clean(original, 0), 0, {}) == []


def test_the_check_fails_when_a_producers_last_batch_goes() -> None:
    specs = [
        BatchSpec(((b"k", b"1"),), 7, Compression.NONE),
        BatchSpec(((b"k", b"2"),), NO_PRODUCER_ID, Compression.NONE),
    ]
    original = make_batches(specs)
    # Broken on purpose: the cleaning is not told producer 7's last batch.
    broken = clean(original, 0, producers={})
    found = violations(original, original, broken, 0, {})
    assert any("producer 7" in v for v in found)
    right = clean(original, 0)
    assert violations(original, original, right, 0, {}) == []
    header = verify(right[0])
    assert (header.records_count, header.base_sequence, header.producer_id) == (0, 0, 7)


def test_the_check_fails_when_a_tombstone_is_dropped_early() -> None:
    specs = [BatchSpec(((b"k", None),), NO_PRODUCER_ID, Compression.NONE)]
    original = make_batches(specs)
    # Broken on purpose: a retention of 0 drops the tombstone at once.
    offset_map = OffsetMap()
    build_offset_map(original, 0, offset_map)
    header = BatchHeader.parse(original[0])
    horizon_batch = build_batch(
        decode_records(original[0]), base_offset=header.base_offset, delete_horizon_ms=0
    )
    dropped = clean_batch(
        horizon_batch,
        offset_map,
        now_ms=0,
        delete_retention_ms=RETENTION,
        producer_last_offsets={},
    )
    assert dropped is None
    assert any("lost before" in v for v in violations(original, original, [], 0, {}))


# -- examples -----------------------------------------------------------------


def test_a_tombstone_gets_its_horizon_then_goes_after_it() -> None:
    original = make_batches(
        [
            BatchSpec(((b"k", b"v"), (b"j", b"w")), NO_PRODUCER_ID, Compression.ZSTD),
            BatchSpec(((b"k", None),), NO_PRODUCER_ID, Compression.NONE),
        ]
    )
    first = clean(original, 100)
    assert len(first) == 2
    assert [r.value for r in decode_records(first[0])] == [b"w"]
    assert verify(first[0]).compression is Compression.ZSTD
    assert verify(first[0]).last_offset_delta == 1  # the last offset stays
    assert verify(first[1]).delete_horizon_ms == 100 + RETENTION
    # Before the horizon the tombstone stays, unchanged.
    assert clean(first, 100 + RETENTION - 1) == first
    # At the horizon it goes (Cleaner: currentTime < deleteHorizonMs retains).
    assert clean(first, 100 + RETENTION) == first[:1]


def test_a_batch_whose_records_all_stay_is_copied_byte_for_byte() -> None:
    original = make_batches([BatchSpec(((b"a", b"1"), (b"b", b"2")), 7, Compression.LZ4)])
    assert clean(original, 0) == original


def test_under_log_append_time_the_max_timestamp_stays() -> None:
    original = make_batches(
        [
            BatchSpec(((b"a", b"1"), (b"b", b"2")), NO_PRODUCER_ID, Compression.NONE, False, True),
            BatchSpec(((b"a", b"3"),), NO_PRODUCER_ID, Compression.NONE),
        ]
    )
    cleaned = clean(original, 0)
    header = verify(cleaned[0])
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == BatchHeader.parse(original[0]).max_timestamp
    assert [r.key for r in decode_records(cleaned[0])] == [b"b"]


def test_under_create_time_the_max_timestamp_is_the_kept_records() -> None:
    original = make_batches(
        [
            BatchSpec(((b"a", b"1"), (b"b", b"2")), NO_PRODUCER_ID, Compression.NONE),
            BatchSpec(((b"b", b"3"),), NO_PRODUCER_ID, Compression.NONE),
        ]
    )
    header = verify(clean(original, 0)[0])
    assert (header.base_timestamp, header.max_timestamp) == (10_000, 10_000)


def test_an_empty_producer_batch_goes_once_the_producer_moves_on() -> None:
    original = make_batches(
        [
            BatchSpec(((b"k", b"1"),), 7, Compression.GZIP),
            BatchSpec(((b"k", b"2"),), NO_PRODUCER_ID, Compression.NONE),
        ]
    )
    cleaned = clean(original, 0)
    empty = verify(cleaned[0])
    assert (empty.records_count, empty.compression, empty.base_timestamp) == (
        0,
        Compression.NONE,
        -1,
    )
    assert empty.max_timestamp == BatchHeader.parse(original[0]).max_timestamp
    # Producer 7 appends again: its old empty batch is no longer its last.
    more = make_batches([BatchSpec(((b"j", b"3"),), 7, Compression.NONE)], start=2)
    again = clean([*cleaned, *more], 0)
    assert [BatchHeader.parse(b).base_offset for b in again] == [1, 2]


def test_a_control_batch_stays_until_its_horizon() -> None:
    original = make_batches(
        [
            BatchSpec(
                ((b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00"),), 7, Compression.NONE, True
            ),
            BatchSpec(((b"k", b"1"),), 8, Compression.NONE),
        ]
    )
    first = clean(original, 0, producers={})
    assert verify(first[0]).delete_horizon_ms == RETENTION
    assert len(decode_records(first[0])) == 1
    assert clean(first, RETENTION, producers={}) == first[1:]
    # Its producer's last batch: kept as an empty header.
    kept = clean(first, RETENTION)
    assert verify(kept[0]).records_count == 0 and verify(kept[0]).is_control


def test_records_past_the_map_stay() -> None:
    original = make_batches(
        [
            BatchSpec(((b"aa", b"1"),), NO_PRODUCER_ID, Compression.NONE),
            BatchSpec(((b"bb", b"2"),), NO_PRODUCER_ID, Compression.NONE),
            BatchSpec(((b"aa", b"3"), (b"bb", b"4")), NO_PRODUCER_ID, Compression.NONE),
            BatchSpec(((b"cc", b"5"),), NO_PRODUCER_ID, Compression.NONE),
        ]
    )
    # Room for two keys: the batches of known keys fit, a new key does not.
    offset_map = OffsetMap(2 * (2 + ENTRY_OVERHEAD_BYTES))
    end, full = build_offset_map(original, 0, offset_map)
    assert (end, full, offset_map.latest_offset, len(offset_map)) == (4, True, 3, 2)
    tight = OffsetMap(2 + ENTRY_OVERHEAD_BYTES)
    end, full = build_offset_map(original, 0, tight)
    assert (end, full) == (1, True)
    out = [
        clean_batch(b, tight, now_ms=0, delete_retention_ms=RETENTION, producer_last_offsets={})
        for b in original
    ]
    assert out == original  # nothing mapped is obsolete yet: all stay


def test_the_map_takes_the_first_batch_whole_and_starts_at_its_offset() -> None:
    original = make_batches(
        [BatchSpec(((b"a", b"1"), (b"b", b"2"), (b"c", b"3")), NO_PRODUCER_ID, Compression.NONE)]
    )
    offset_map = OffsetMap(ENTRY_OVERHEAD_BYTES + 1)
    assert build_offset_map(original, 0, offset_map) == (3, False)
    assert len(offset_map) == 3  # over budget by one batch at most
    later = OffsetMap()
    assert build_offset_map(original, 2, later) == (3, False)
    assert (later.get(b"a"), later.get(b"c")) == (None, 2)
    assert build_offset_map([], 5, OffsetMap()) == (5, False)


def test_offset_map_refuses_going_back_and_a_budget_below_one_entry() -> None:
    offset_map = OffsetMap()
    offset_map.put(b"k", 5)
    with pytest.raises(ValueError, match="below the mapped 5"):
        offset_map.put(b"k", 4)
    with pytest.raises(ValueError, match="cannot hold one entry"):
        OffsetMap(ENTRY_OVERHEAD_BYTES - 1)


def test_a_record_without_a_key_is_dropped() -> None:
    batch = build_batch([Record(0, 1, None, b"x"), Record(1, 1, b"k", b"y")])
    offset_map = OffsetMap()
    build_offset_map([batch], 0, offset_map)
    cleaned = clean_batch(
        batch, offset_map, now_ms=0, delete_retention_ms=RETENTION, producer_last_offsets={}
    )
    assert cleaned is not None
    assert [r.offset for r in decode_records(cleaned)] == [1]


# -- choosing ------------------------------------------------------------------


def seg(base: int, end: int, size: int, max_ts: int = 0, first: int | None = 1) -> SegmentSummary:
    return SegmentSummary(base, end, size, max_ts, first)


LOG = [seg(0, 10, 100), seg(10, 20, 100), seg(20, 30, 100), seg(30, 35, 50)]


def prospects(**overrides: object) -> CleanableRange:
    kwargs: dict[str, object] = {
        "checkpoint": None,
        "log_start_offset": 0,
        "log_end_offset": 35,
        "last_stable_offset": 35,
        "now_ms": 1_000,
        "min_compaction_lag_ms": 0,
        "max_compaction_lag_ms": 1 << 62,
        "min_cleanable_dirty_ratio": 0.5,
    }
    kwargs.update(overrides)
    segments = kwargs.pop("segments", LOG)
    return cleanable_range("log", segments, **kwargs)  # type: ignore[arg-type]


def test_the_active_segment_and_the_last_stable_offset_bound_the_cleanable_part() -> None:
    fresh = prospects()
    assert (fresh.first_dirty_offset, fresh.first_uncleanable_offset) == (0, 30)
    assert (fresh.clean_bytes, fresh.cleanable_bytes, fresh.dirty_ratio) == (0, 300, 1.0)
    below = prospects(last_stable_offset=15)
    assert below.first_uncleanable_offset == 15
    assert below.cleanable_bytes == 200  # the segments overlapping [0, 15)


def test_the_checkpoint_splits_clean_from_dirty_and_is_reset_outside_the_log() -> None:
    half = prospects(checkpoint=20)
    assert (half.clean_bytes, half.cleanable_bytes) == (200, 100)
    assert half.dirty_ratio == pytest.approx(1 / 3)
    assert not half.cleanable
    assert prospects(checkpoint=40).first_dirty_offset == 0
    assert prospects(checkpoint=5, log_start_offset=10).first_dirty_offset == 10


def test_min_compaction_lag_keeps_young_segments() -> None:
    segments = [seg(0, 10, 100, 100), seg(10, 20, 100, 950), seg(20, 30, 100, 100), LOG[-1]]
    young = prospects(segments=segments, min_compaction_lag_ms=100)
    assert young.first_uncleanable_offset == 10
    assert prospects(segments=segments, min_compaction_lag_ms=10).first_uncleanable_offset == 30


def test_max_compaction_lag_forces_a_cleaning_below_the_ratio() -> None:
    lazy = prospects(checkpoint=20)
    assert not lazy.cleanable and lazy.max_compaction_delay_ms == 0
    overdue = prospects(checkpoint=20, max_compaction_lag_ms=500)
    assert overdue.max_compaction_delay_ms == 1_000 - 500 - 1
    assert overdue.needs_compaction_now and overdue.cleanable
    # Nothing cleanable: overdue or not, no cleaning.
    nothing = prospects(checkpoint=30, max_compaction_lag_ms=500)
    assert not nothing.cleanable


def test_choose_log_takes_the_dirtiest_above_its_ratio() -> None:
    a = CleanableRange("a", 0, 10, 100, 100, 0, 0.5)  # 0.5: not above
    b = CleanableRange("b", 0, 10, 100, 300, 0, 0.5)  # 0.75
    c = CleanableRange("c", 0, 10, 10, 990, 0, 0.995)  # 0.99, below its own ratio
    d = CleanableRange("d", 0, 10, 900, 100, 5, 0.5)  # 0.1 but overdue
    assert choose_log([a, b, c, d]) == b
    assert choose_log([a, c, d]) == d
    assert choose_log([a, c]) is None


def test_group_segments_by_size_merges_small_neighbours() -> None:
    segments = [seg(0, 10, 40), seg(10, 20, 40), seg(20, 30, 40), seg(30, 40, 100)]
    groups = group_segments_by_size(segments, 100)
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10], [20], [30]]
    wide = [seg(0, 10, 1), seg(10, 1 << 32, 1)]
    assert [len(g) for g in group_segments_by_size(wide, 100)] == [1, 1]
    empty_first = [seg(0, 0, 0), seg(0, 1 << 32, 1)]
    assert [len(g) for g in group_segments_by_size(empty_first, 100)] == [2]


# -- the key walk the cleaner reads batches with --------------------------------

WALK_BYTES = st.none() | st.binary(max_size=20) | st.binary(min_size=60, max_size=9000)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            WALK_BYTES,
            WALK_BYTES,
            st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=4)), max_size=2),
            st.integers(1, 300),
            st.integers(-(2**40), 2**40),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([Compression.NONE, Compression.LZ4, Compression.ZSTD]),
)
def test_the_key_walk_reads_what_the_decoder_reads(
    fields: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int, int]],
    compression: Compression,
) -> None:
    offset = 1_000
    records = []
    for key, value, headers, gap, timestamp in fields:
        offset += gap
        records.append(Record(offset, timestamp, key, value, tuple(headers)))
    batch = build_batch(records, base_offset=1_000, compression=compression)
    expected = [(r.offset, r.key, r.value is None) for r in decode_records(batch)]
    assert _keys_of(batch, BatchHeader.parse(batch)) == expected


def test_a_damaged_section_is_refused_by_the_decoder_naming_the_record() -> None:
    good = build_batch([Record(0, 1, b"k", b"v"), Record(1, 1, b"j", b"w")])
    damaged = bytearray(good)
    damaged[-5] = 0x20  # the second record's key length (16) runs past its end
    assert _walk(bytes(damaged[61:]), 2, 0) is None
    with pytest.raises(PartitionLogError, match="record 1 of 2 is malformed"):
        _keys_of(bytes(damaged), BatchHeader.parse(damaged))

"""Random histories of a compacted partition log on the in-memory twin:
keyed appends with tombstones from idempotent producers and plain clients,
new leader epochs, rolls, cleanings (with a dedupe budget small enough to
need several), time passing, clean reopenings and power losses
(``MemoryDirectory.crash`` with torn unsynced writes), checked after every
step against the model of every batch appended (``flush.messages=1``: each
was synced before its append returned).

After every step: reading from the start, every key's last value is the
model's, a key whose last record is a tombstone is absent or has that
tombstone, which stays until ``delete.retention.ms`` after the cleaning that
first kept it; every batch is valid and starts at one of the model's
batches with its offsets, epoch and producer fields, holding a subset of its
records; offsets only increase; the log end is the model's; the epoch cache
equals the one derived from the batches appended; each producer's last
batch, and so its sequence, is still there."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import BatchHeader, build_batch, decode_records, split_batches, verify
from partition_log.cleaner import CleanerConfig, LogCleaner
from partition_log.compaction import ENTRY_OVERHEAD_BYTES
from partition_log.epoch_cache import derive
from partition_log.files import MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.records import Record

RETENTION = 300
KEYS = (b"a", b"b", b"c", b"d", b"e")
CONFIG = LogConfig(
    segment_bytes=200,
    index_interval_bytes=90,
    flush_messages=1,
    cleanup_policy=CleanupPolicy.COMPACT,
    delete_retention_ms=RETENTION,
    min_cleanable_dirty_ratio=0.3,
    file_delete_delay_ms=50,
)

BATCH = st.tuples(
    st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=3),
    st.sampled_from([-1, -1, 7, 8]),
    st.integers(0, 6),  # a new leader epoch when 0
)
APPEND = st.tuples(st.just("append"), st.lists(BATCH, min_size=1, max_size=6))
OPERATION = st.one_of(
    APPEND,
    APPEND,
    APPEND,
    st.tuples(st.just("clean")),
    st.tuples(st.just("clean")),
    st.tuples(st.just("time"), st.integers(1, 2 * RETENTION)),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("crash"), st.integers(0, 2**32)),
)


class Model:
    def __init__(self) -> None:
        self.batches: list[bytes] = []  # as appended, with offsets and epochs
        # Tombstone offset -> when a cleaning first kept it (its delete
        # horizon less delete.retention.ms), as observed in the log.
        self.first_kept: dict[int, int] = {}

    @property
    def end(self) -> int:
        return BatchHeader.parse(self.batches[-1]).next_offset if self.batches else 0


def read_all(log: PartitionLog) -> list[bytes]:
    found: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        views = split_batches(log.read(offset, 1 + 97 * len(found) % 700))
        assert views, f"no batch at {offset} below the end {log.log_end_offset}"
        found.extend(bytes(v) for v in views)
        offset = BatchHeader.parse(views[-1]).next_offset
    return found


def check(log: PartitionLog, model: Model, now: int) -> None:
    assert log.log_end_offset == model.end
    assert log.log_start_offset == 0
    originals = {BatchHeader.parse(b).base_offset: b for b in model.batches}
    original_records = {r.offset: r for b in model.batches for r in decode_records(b)}
    stored = read_all(log)
    previous_end = 0
    last: dict[bytes, Record] = {}
    horizons: dict[int, int] = {}
    for batch in stored:
        header = verify(batch)
        assert header.base_offset >= previous_end, "offsets out of order"
        previous_end = header.next_offset
        source = BatchHeader.parse(originals[header.base_offset])
        for name in (
            "last_offset_delta",
            "partition_leader_epoch",
            "producer_id",
            "producer_epoch",
            "base_sequence",
        ):
            assert getattr(header, name) == getattr(source, name), name
        for record in decode_records(batch):
            original = original_records[record.offset]
            assert (record.key, record.value) == (original.key, original.value)
            assert record.key is not None
            last[record.key] = record
            if record.value is None and header.delete_horizon_ms is not None:
                horizons[record.offset] = header.delete_horizon_ms
    model_last: dict[bytes, Record] = {}
    for batch in model.batches:
        for record in decode_records(batch):
            assert record.key is not None
            model_last[record.key] = record
    for key, record in model_last.items():
        if record.value is not None:
            assert key in last and last[key].offset == record.offset, f"{key!r}: last value lost"
            continue
        if key in last:
            assert last[key].offset == record.offset, f"{key!r}: an older value came back"
        else:
            kept_at = model.first_kept.get(record.offset)
            assert kept_at is not None, f"{key!r}: tombstone gone without ever being kept"
            assert now >= kept_at + RETENTION, f"{key!r}: tombstone gone before its horizon"
    for offset, horizon in horizons.items():
        model.first_kept.setdefault(offset, horizon - RETENTION)
    # Below the cleaner checkpoint the log is clean: one record per key.
    checkpoint = log.cleaner_offset or 0
    clean_keys = [r.key for b in stored for r in decode_records(b) if r.offset < checkpoint]
    assert len(clean_keys) == len(set(clean_keys)), "an obsolete record below the checkpoint"
    # The epoch cache is the appended batches', which compaction never changes.
    headers = [BatchHeader.parse(b) for b in model.batches]
    assert log.epoch_cache == derive((h.base_offset, h.partition_leader_epoch) for h in headers)
    # Every producer's last batch stays, so its sequence carries on.
    for pid in (7, 8):
        mine = [h for h in headers if h.producer_id == pid]
        entry = log.producer_state.entry(pid)
        if not mine:
            assert entry is None
            continue
        assert entry is not None
        assert (entry.last_seq, entry.last_offset) == (mine[-1].last_sequence, mine[-1].last_offset)
        assert any(BatchHeader.parse(b).base_offset == mine[-1].base_offset for b in stored)


def append(
    log: PartitionLog,
    model: Model,
    pairs: list[tuple[bytes, bool]],
    producer: int,
    epoch: int,
    now: int,
) -> None:
    records = [
        Record(i, now, key, None if tombstone else b"%s@%d" % (key, now))
        for i, (key, tombstone) in enumerate(pairs)
    ]
    sequence = -1
    if producer >= 0:
        entry = log.producer_state.entry(producer)
        sequence = 0 if entry is None else entry.last_seq + 1
    data = build_batch(
        records,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=sequence,
    )
    info = log.append_as_leader(data, epoch, now_ms=now)
    assert info.first_offset == model.end and not info.duplicate
    model.batches.append(split_batches(log.read(info.first_offset, 1))[0].tobytes())
    log.maybe_increment_high_watermark(log.log_end_offset)


def run(operations: list[tuple[object, ...]], budget_keys: int) -> None:
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    cleaner = LogCleaner(
        {"p": log}, CleanerConfig(dedupe_buffer_bytes=budget_keys * (1 + ENTRY_OVERHEAD_BYTES))
    )
    model = Model()
    now = 0
    epoch = 0
    for operation in operations:
        now += 1
        kind = operation[0]
        if kind == "append":
            assert isinstance(operation[1], list)
            for pairs, producer, epoch_draw in operation[1]:
                epoch += int(epoch_draw == 0)
                append(log, model, pairs, producer, epoch, now)
        elif kind == "clean":
            while cleaner.maybe_clean(now):
                check(log, model, now)
        elif kind == "time":
            now += int(str(operation[1]))
            log.maybe_remove_deleted(now)
        elif kind == "reopen":
            log.close()
            log = PartitionLog.open(directory, CONFIG, now_ms=now, high_watermark=model.end)
            assert log.recovery.clean
            cleaner.remove_log("p")
            cleaner.add_log("p", log)
        elif kind == "crash":
            directory.crash(random.Random(str(operation[1])))
            log = PartitionLog.open(directory, CONFIG, now_ms=now, high_watermark=model.end)
            assert not log.recovery.clean
            cleaner.remove_log("p")
            cleaner.add_log("p", log)
        check(log, model, now)
    log.close()
    check(PartitionLog.open(directory, CONFIG, now_ms=now), model, now)


@settings(max_examples=250, deadline=None)
@given(st.lists(OPERATION, min_size=4, max_size=40))
def test_random_compacted_histories(operations: list[tuple[object, ...]]) -> None:
    run(operations, budget_keys=len(KEYS))


@settings(max_examples=100, deadline=None)
@given(st.lists(OPERATION, min_size=4, max_size=40))
def test_random_compacted_histories_with_a_two_key_map(
    operations: list[tuple[object, ...]],
) -> None:
    run(operations, budget_keys=2)

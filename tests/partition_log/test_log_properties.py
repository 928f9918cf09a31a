"""Random histories over a partition log on the in-memory twin: leader and
follower appends, truncations, rolls, flushes, clean reopenings and power
losses (``MemoryDirectory.crash`` with torn writes), checked after every step
against a model of the batches appended.

After each power loss nothing synced is lost (with ``flush_messages=1``,
everything whose append returned), nothing unsynced is half-visible (the log
is a prefix of the model's batches, byte for byte), offsets never change and
stay ordered; always the epoch cache equals the one derived from the batches,
the producer state the one rebuilt from them, and reads return exactly what
was appended."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import BatchHeader, build_batch, split_batches
from partition_log.epoch_cache import derive
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog, _producer_batch
from partition_log.producer_state import ProducerStateManager
from partition_log.records import Record

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("leader"), st.integers(1, 4), st.booleans(), st.booleans(), st.integers(0, 50)
        ),
        st.tuples(st.just("follower"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("retry")),
        st.tuples(st.just("high_watermark"), st.floats(0, 1)),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("crash"), st.integers(0, 2**32)),
    ),
    max_size=40,
)


class Model:
    """The batches the log must hold, as stored, and how many are synced."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.durable = 0  # batches that a power loss cannot take
        # The last producer batch sent and its offsets, for a retry.
        self.last_sent: tuple[bytes, int, int] | None = None

    @property
    def end(self) -> int:
        return BatchHeader.parse(self.batches[-1]).next_offset if self.batches else 0

    def count_below(self, offset: int) -> int:
        return sum(1 for b in self.batches if BatchHeader.parse(b).next_offset <= offset)


def read_all(log: PartitionLog) -> list[bytes]:
    found: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 + len(found) % 300)
        views = split_batches(data)
        assert views, f"no batch at {offset} below the end {log.log_end_offset}"
        found.extend(bytes(v) for v in views)
        offset = BatchHeader.parse(views[-1]).next_offset
    return found


def check(log: PartitionLog, model: Model) -> None:
    assert log.log_end_offset == model.end
    assert read_all(log) == model.batches
    headers = [BatchHeader.parse(b) for b in model.batches]
    for before, after in zip(headers, headers[1:], strict=False):
        assert after.base_offset == before.next_offset
    assert log.epoch_cache == derive((h.base_offset, h.partition_leader_epoch) for h in headers)
    rebuilt = ProducerStateManager.rebuild(None, (_producer_batch(h) for h in headers))
    assert log.producer_state.producers == rebuilt.producers
    assert log.high_watermark <= log.log_end_offset


def run(operations: list[tuple[object, ...]], flush_every: bool) -> None:
    config = LogConfig(
        segment_bytes=350, index_interval_bytes=90, flush_messages=1 if flush_every else None
    )
    directory = MemoryDirectory()
    log = PartitionLog.open(directory, config, now_ms=0)
    model = Model()
    now = 0
    for operation in operations:
        now += 10
        kind = operation[0]
        if kind == "leader":
            _, count, new_epoch, with_producer, size = operation
            epoch = max(log.epoch_cache.latest_epoch, 0) + int(bool(new_epoch))
            producer_id, producer_epoch, sequence = -1, -1, -1
            if with_producer:
                entry = log.producer_state.entry(1)
                producer_id, producer_epoch = 1, 0
                sequence = 0 if entry is None else entry.last_seq + 1
            value = b"v" * int(str(size))
            records = [Record(i, now, b"k", value) for i in range(int(str(count)))]
            data = build_batch(
                records,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=sequence,
            )
            info = log.append_as_leader(data, epoch, now_ms=now)
            assert info.first_offset == model.end and not info.duplicate
            if with_producer:
                model.last_sent = (data, info.first_offset, info.last_offset)
            model.batches.append(bytes(log.read(info.first_offset, 1)))
        elif kind == "follower":
            _, count, new_epoch = operation
            epoch = max(log.epoch_cache.latest_epoch, 0) + int(bool(new_epoch))
            base = model.end
            records = [Record(base + i, now, None, b"f") for i in range(int(str(count)))]
            data = build_batch(records, base_offset=base, partition_leader_epoch=epoch)
            log.append_as_follower(data, now_ms=now)
            model.batches.append(data)
        elif kind == "truncate":
            target = int(float(str(operation[1])) * model.end)
            end = log.truncate_to(target)
            model.batches = model.batches[: model.count_below(target)]
            assert end == model.end
            model.durable = min(model.durable, len(model.batches))
        elif kind == "flush":
            log.flush(now)
        elif kind == "retry" and model.last_sent is not None:
            # A producer's retry of its last batch: while the log still holds
            # it, the original offsets and nothing appended.
            data, first, last = model.last_sent
            entry = log.producer_state.entry(1)
            if entry is not None and entry.batches[-1].first_offset == first:
                info = log.append_as_leader(data, log.epoch_cache.latest_epoch, now_ms=now)
                assert (info.first_offset, info.last_offset, info.duplicate) == (first, last, True)
        elif kind == "high_watermark":
            target = int(float(str(operation[1])) * model.end)
            log.maybe_increment_high_watermark(target)
            visible = log.read(log.log_start_offset, 1 << 20, max_offset=log.high_watermark)
            for view in split_batches(visible):
                assert BatchHeader.parse(view).last_offset < log.high_watermark
        elif kind == "reopen":
            log.close()
            log = PartitionLog.open(directory, config, now_ms=now)
            assert log.recovery.clean
            model.durable = len(model.batches)
        elif kind == "crash":
            durable = model.count_below(log.recovery_point)
            if flush_every:
                assert durable == len(model.batches)
            directory.crash(random.Random(str(operation[1])))
            log = PartitionLog.open(directory, config, now_ms=now)
            assert not log.recovery.clean
            kept = read_all(log)
            # A prefix, byte for byte: nothing half-visible, offsets unchanged.
            assert kept == model.batches[: len(kept)]
            assert len(kept) >= max(durable, model.durable)
            model.batches = kept
            model.durable = len(kept)
        if kind in ("flush",) or flush_every:
            model.durable = max(model.durable, model.count_below(log.recovery_point))
        check(log, model)
    log.close()
    reopened = PartitionLog.open(directory, config, now_ms=now)
    check(reopened, model)


@settings(max_examples=150, deadline=None)
@given(OPERATIONS)
def test_random_histories_without_flush(operations: list[tuple[object, ...]]) -> None:
    run(operations, flush_every=False)


@settings(max_examples=150, deadline=None)
@given(OPERATIONS)
def test_random_histories_with_flush_messages_one(operations: list[tuple[object, ...]]) -> None:
    run(operations, flush_every=True)

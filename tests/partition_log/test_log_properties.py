"""Random histories over a partition log on the in-memory twin: leader and
follower appends, truncations, rolls, flushes, clean reopenings and power
losses (``MemoryDirectory.crash`` with torn writes), checked after every step
against a model of the batches appended; with retention (by time and size)
and DeleteRecords moving the log start offset, the model keeps the batches
from the one holding it.

After each power loss nothing synced is lost (with ``flush_messages=1``,
everything whose append returned), nothing unsynced is half-visible (the log
is a prefix of the model's batches, byte for byte), offsets never change and
stay ordered; always the epoch cache equals the one derived from the batches,
the producer state the one rebuilt from them, and reads return exactly what
was appended."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_log.batch import (
    BatchHeader,
    build_batch,
    set_base_offset,
    set_leader_epoch,
    split_batches,
)
from partition_log.epoch_cache import derive
from partition_log.files import MemoryDirectory, MemoryFile
from partition_log.log import LogConfig, PartitionLog, _producer_batch
from partition_log.producer_state import ProducerStateManager
from partition_log.records import Record

OPERATION = st.one_of(
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
    st.tuples(st.just("delete_records"), st.floats(0, 1)),
    st.tuples(st.just("retention"), st.sampled_from(["time", "size"]), st.integers(0, 3000)),
)
OPERATIONS = st.lists(OPERATION, max_size=40)


class Model:
    """The batches the log must hold, as stored, and how many are synced."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        # The log start offset: batches wholly below it are gone.
        self.start = 0
        self.durable = 0  # batches that a power loss cannot take
        # The last producer batch sent and its offsets, for a retry.
        self.last_sent: tuple[bytes, int, int] | None = None

    @property
    def end(self) -> int:
        return BatchHeader.parse(self.batches[-1]).next_offset if self.batches else self.start

    def move_start(self, start: int) -> None:
        """The batches from the one holding ``start`` (DeleteRecords may put
        it inside a batch)."""
        kept = [b for b in self.batches if BatchHeader.parse(b).next_offset > start]
        self.durable = max(0, self.durable - (len(self.batches) - len(kept)))
        self.batches = kept
        self.start = start

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
    assert log.log_start_offset == model.start
    assert read_all(log) == model.batches
    headers = [BatchHeader.parse(b) for b in model.batches]
    for before, after in zip(headers, headers[1:], strict=False):
        assert after.base_offset == before.next_offset
    # The cache follows the start (truncateFromStart), and may keep an entry
    # at the end with no batch when every batch is gone.
    derived = derive((h.base_offset, h.partition_leader_epoch) for h in headers)
    assert log.epoch_cache.truncate_from_end(log.log_end_offset) == derived.truncate_from_start(
        log.log_start_offset
    )
    rebuilt = ProducerStateManager.rebuild(None, (_producer_batch(h) for h in headers))
    if log.log_start_offset == 0:
        assert log.producer_state.producers == rebuilt.producers
    else:
        # A producer keeps its whole entry while one of its batches is at or
        # past the start, so only its last batch is known from the log.
        assert {p: (e.epoch, e.batches[-1]) for p, e in log.producer_state.producers.items()} == {
            p: (e.epoch, e.batches[-1]) for p, e in rebuilt.producers.items()
        }
    assert log.log_start_offset <= log.high_watermark <= log.log_end_offset
    first = log.segments[0]
    assert first.base_offset <= log.log_start_offset
    assert len(log.segments) == 1 or log.segments[1].base_offset > log.log_start_offset


def run(operations: list[tuple[object, ...]], flush_every: bool) -> None:
    config = LogConfig(
        segment_bytes=350,
        index_interval_bytes=90,
        flush_messages=1 if flush_every else None,
        file_delete_delay_ms=25,
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
            target = model.start + int(float(str(operation[1])) * (model.end - model.start))
            end = log.truncate_to(target)
            model.batches = model.batches[: model.count_below(target)]
            model.start = min(model.start, model.end if model.batches else end)
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
        elif kind == "delete_records":
            hw = log.high_watermark
            target = model.start + int(float(str(operation[1])) * (hw - model.start))
            assert log.delete_records(target, now_ms=now) == max(target, model.start)
            model.move_start(max(target, model.start))
        elif kind == "retention":
            mode, limit = operation[1], int(str(operation[2]))
            if mode == "time":
                log.config = dataclasses.replace(config, retention_ms=limit // 10)
            else:
                log.config = dataclasses.replace(config, retention_bytes=limit)
            hw = log.high_watermark
            log.maybe_delete_segments(now)
            log.config = config
            # Never past the high watermark; the start is a segment's base.
            assert log.log_start_offset <= hw
            model.move_start(log.log_start_offset)
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
            # The start was checkpointed before it moved: only a lost tail
            # below it can pull it back (to the end).
            assert log.log_start_offset == min(model.start, log.log_end_offset)
            model.start = log.log_start_offset
            kept = read_all(log)
            # A prefix, byte for byte: nothing half-visible, offsets unchanged.
            assert kept == model.batches[: len(kept)]
            assert len(kept) >= max(durable, model.durable)
            model.batches = kept
            model.durable = len(kept)
        if kind in ("flush",) or flush_every:
            model.durable = max(model.durable, model.count_below(log.recovery_point))
        log.maybe_remove_deleted(now)
        assert all(not name.endswith(".deleted") for name in directory.list()) or (
            log.pending_deletions
        )
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


# -- a power loss at every step of an append, a roll and a truncation ----------


class PowerLoss(Exception):
    """The power went at this call to the files."""


class _Budget:
    def __init__(self, calls: int) -> None:
        self.calls = calls

    def tick(self) -> None:
        self.calls -= 1
        if self.calls < 0:
            raise PowerLoss


class _FaultyFile:
    def __init__(self, inner: MemoryFile, budget: _Budget) -> None:
        self._inner = inner
        self._budget = budget

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def size(self) -> int:
        return self._inner.size

    def append(self, data: bytes | bytearray | memoryview) -> None:
        self._budget.tick()
        self._inner.append(data)

    def read(self, position: int, size: int) -> bytes:
        return self._inner.read(position, size)

    def truncate(self, size: int) -> None:
        self._budget.tick()
        self._inner.truncate(size)

    def sync(self) -> None:
        self._budget.tick()
        self._inner.sync()

    def close(self) -> None:
        self._inner.close()


class _FaultyDirectory:
    """The twin, but the power goes at the n-th change to its files."""

    def __init__(self, inner: MemoryDirectory, budget: _Budget) -> None:
        self._inner = inner
        self._budget = budget

    def create(self, name: str) -> _FaultyFile:
        self._budget.tick()
        return _FaultyFile(self._inner.create(name), self._budget)

    def open(self, name: str) -> _FaultyFile:
        return _FaultyFile(self._inner.open(name), self._budget)

    def exists(self, name: str) -> bool:
        return self._inner.exists(name)

    def list(self) -> list[str]:
        return self._inner.list()

    def rename(self, old: str, new: str) -> None:
        self._budget.tick()
        self._inner.rename(old, new)

    def delete(self, name: str) -> None:
        self._budget.tick()
        self._inner.delete(name)

    def sync_directory(self) -> None:
        self._budget.tick()
        self._inner.sync_directory()


def _history() -> list[tuple[str, int, int]]:
    """Appends (epoch, time) over several rolls, a truncation inside a batch,
    and appends in a new epoch."""
    steps = [("append", n // 3, n) for n in range(8)]
    steps.append(("truncate", 7, 0))
    steps.extend(("append", 4, n) for n in range(8, 12))
    return steps


def _run_until_power_loss(
    directory: MemoryDirectory, calls: int
) -> tuple[list[bytes], list[bytes]]:
    """Run the history until the power goes; the batches the log held
    before the step that failed, and the batches it holds if that step
    completed."""
    config = LogConfig(segment_bytes=300, index_interval_bytes=90, flush_messages=1)
    faulty = _FaultyDirectory(directory, _Budget(calls))
    before: list[bytes] = []
    after: list[bytes] = []
    try:
        log = PartitionLog.open(faulty, config, now_ms=0)
        for kind, value, n in _history():
            if kind == "append":
                epoch = value
                records = [Record(i, n, b"k", b"x" * 20) for i in range(2)]
                entry = log.producer_state.entry(1)
                sequence = 0 if entry is None else entry.last_seq + 1
                data = build_batch(records, producer_id=1, producer_epoch=0, base_sequence=sequence)
                # The bytes the log will store: its end offset and the epoch.
                stored = bytearray(data)
                set_base_offset(stored, log.log_end_offset)
                set_leader_epoch(stored, epoch)
                after = [*before, bytes(stored)]
                info = log.append_as_leader(data, epoch, now_ms=n)
                assert log.read(info.first_offset, 1) == after[-1]
            else:
                target = value
                after = [b for b in before if BatchHeader.parse(b).next_offset <= target]
                log.truncate_to(target)
            before = after
    except PowerLoss:
        return before, after
    return before, before


def test_a_power_loss_at_every_step_keeps_a_consistent_log() -> None:
    count = 0
    while True:
        directory = MemoryDirectory()
        before, after = _run_until_power_loss(directory, count)
        directory.crash(random.Random(count))  # with a torn write of any unsynced tail
        log = PartitionLog.open(directory, LogConfig(segment_bytes=300), now_ms=0)
        kept = read_all(log)
        if len(after) > len(before):  # an append that did not return
            assert kept in (before, after), count
        elif len(after) < len(before):  # a truncation part-way: a prefix at least as long
            assert kept == before[: len(kept)] and len(kept) >= len(after), count
        else:
            assert kept == before, count
        model = Model()
        model.batches = kept
        check(log, model)
        if before is after:  # the history ran to its end
            break
        count += 1
    assert count > 50

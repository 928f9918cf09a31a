"""RocksStorage: the Ready contract, durability, and recovery from damage."""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from quorum.config import QuorumConfig
from quorum.core import RaftCore
from quorum.driver.codec import encode_batch
from quorum.driver.rocks import STATE_KEY, RocksStorage, StorageOpenError, log_key
from quorum.memory import MemorySnapshotStore, MemoryStores
from quorum.ready import Ready, SnapshotChunk
from quorum.storage import NodeStorage, StorageCorruptError
from quorum.types import Batch, QuorumState, Role, SnapshotId, VoterSet

ROOT = Path(__file__).resolve().parents[2]


def batch(base: int, epoch: int, n: int = 1) -> Batch:
    return Batch(base, epoch, tuple(f"r{base + i}".encode() for i in range(n)))


def contiguous(*spec: tuple[int, int], start: int = 0) -> tuple[Batch, ...]:
    """Batches from ``start``, each ``(epoch, records)``."""
    out = []
    for epoch, n in spec:
        out.append(batch(start, epoch, n))
        start += n
    return tuple(out)


def _bytes(value: object) -> bytes:
    assert isinstance(value, bytes)
    return value


def raw_db(path: Path) -> Rdict:
    """The storage's RocksDB opened directly, as a crash-time corruptor would."""
    return Rdict(str(path / "rocksdb"), Options(raw_mode=True))


def test_static_typing_matches_the_port(tmp_path: Path) -> None:
    storage: NodeStorage = RocksStorage(tmp_path)
    assert storage.log.read_all() == []
    assert storage.state.read() is None
    assert storage.snapshots.latest() is None


def test_persist_round_trip_and_reopen(tmp_path: Path) -> None:
    entries = contiguous((1, 2), (1, 1), (2, 3))
    with RocksStorage(tmp_path) as storage:
        storage.persist(
            Ready(entries=entries, quorum_state=QuorumState(2, 1, None), must_sync=True)
        )
        assert storage.log.read_all() == list(entries)
        assert storage.state.read() == QuorumState(2, 1, None)
        assert storage.log.end_offset() == 6
    with RocksStorage(tmp_path) as storage:
        assert storage.log.read_all() == list(entries)
        assert storage.state.read() == QuorumState(2, 1, None)


def test_keys_and_values_layout(tmp_path: Path) -> None:
    with RocksStorage(tmp_path) as storage:
        storage.persist(Ready(entries=contiguous((1, 2), (1, 1)), must_sync=True))
    db = raw_db(tmp_path)
    try:
        keys = list(db.keys())
        assert keys == [b"log:" + (0).to_bytes(8, "big"), b"log:" + (2).to_bytes(8, "big")]
        assert db[log_key(2)] == encode_batch(batch(2, 1))
    finally:
        db.close()


def test_the_ready_contract_order(tmp_path: Path) -> None:
    """Reset, truncate, append, compact and state in one Ready end as
    MemoryStores.persist ends."""
    sid, newer = SnapshotId(3, 1), SnapshotId(5, 2)
    first = Ready(entries=contiguous((1, 3), (1, 3)), quorum_state=QuorumState(1), must_sync=True)
    second = Ready(
        snapshot_chunks=(
            SnapshotChunk(sid, 0, b"abc", False),
            SnapshotChunk(sid, 3, b"def", True),
            SnapshotChunk(newer, 0, b"newer", True),
        ),
        reset_to_snapshot=sid,
        truncate_to=2,
        entries=contiguous((2, 2), (2, 1), start=3),
        compact_to=newer,
        quorum_state=QuorumState(2, None, 3),
        must_sync=True,
    )
    mem = MemoryStores.new()
    with RocksStorage(tmp_path) as rocks:
        for ready in (first, second):
            mem.persist(ready)
            rocks.persist(ready)
        assert rocks.log.read_all() == mem.log.read_all() == [batch(5, 2)]
        assert rocks.state.read() == mem.state.read() == QuorumState(2, None, 3)
        assert rocks.snapshots.latest() == mem.snapshots.latest() == newer
        assert rocks.snapshots.size(sid) is mem.snapshots.size(sid) is None
        assert rocks.snapshots.read(newer, 0, 100) == b"newer"


# -- the property: RocksStorage behaves as MemoryStores ----------------------


class _Model:
    """What the stores hold, to draw Readies made of valid log operations."""

    def __init__(self) -> None:
        self.log: list[Batch] = []
        self.snapshots: set[SnapshotId] = set()
        self.download: tuple[SnapshotId, int] | None = None
        self.epoch = 1

    def end(self) -> int:
        return self.log[-1].end_offset if self.log else 0


@st.composite
def readies(draw: st.DrawFn, model: _Model) -> Ready:
    chunks: list[SnapshotChunk] = []
    if draw(st.integers(0, 4)) == 0:
        if model.download is None or draw(st.booleans()):
            sid = SnapshotId(draw(st.integers(0, model.end() + 8)), draw(st.integers(0, 5)))
            position = 0
        else:
            sid, position = model.download
        for _ in range(draw(st.integers(1, 3))):
            data = draw(st.binary(min_size=1, max_size=8))
            done = draw(st.booleans())
            chunks.append(SnapshotChunk(sid, position, data, done))
            position += len(data)
            if done:
                model.snapshots.add(sid)
                break
        model.download = None if chunks[-1].done else (sid, position)
    reset = None
    if model.snapshots and draw(st.integers(0, 5)) == 0:
        reset = draw(st.sampled_from(sorted(model.snapshots)))
        model.log = []
    truncate = None
    if draw(st.integers(0, 4)) == 0:
        truncate = draw(st.integers(0, model.end() + 2))
        model.log = [b for b in model.log if b.end_offset <= truncate]
    entries: list[Batch] = []
    if draw(st.booleans()):
        base = model.end() if model.log else (reset.end_offset if reset else model.end())
        model.epoch += draw(st.integers(0, 1))
        for _ in range(draw(st.integers(1, 3))):
            entries.append(batch(base, model.epoch, draw(st.integers(1, 3))))
            base = entries[-1].end_offset
        model.log.extend(entries)
    compact = None
    if model.snapshots and draw(st.integers(0, 4)) == 0:
        compact = draw(st.sampled_from(sorted(model.snapshots)))
        model.log = [b for b in model.log if b.end_offset > compact.end_offset]
        model.snapshots = {s for s in model.snapshots if s >= compact}
        if model.download is not None and model.download[0] <= compact:
            model.download = None
    state = None
    if draw(st.booleans()):
        state = QuorumState(
            model.epoch,
            draw(st.none() | st.integers(0, 4)),
            draw(st.none() | st.integers(0, 4)),
        )
    return Ready(
        snapshot_chunks=tuple(chunks),
        reset_to_snapshot=reset,
        truncate_to=truncate,
        entries=tuple(entries),
        compact_to=compact,
        quorum_state=state,
        must_sync=draw(st.booleans()),
    )


def _assert_same(rocks: RocksStorage, mem: MemoryStores) -> None:
    assert rocks.log.read_all() == mem.log.read_all()
    assert rocks.state.read() == mem.state.read()
    assert rocks.snapshots.latest() == mem.snapshots.latest()
    for sid in list(mem.snapshots._complete):
        assert rocks.snapshots.size(sid) == mem.snapshots.size(sid)
        assert rocks.snapshots.read(sid, 0, 1 << 20) == mem.snapshots.get(sid)


# Each example opens RocksDB twice: a fifth of the profile's examples.
@settings(max_examples=max(1, settings().max_examples // 5))
@given(st.data())
def test_rocks_storage_matches_memory_stores(data: st.DataObject) -> None:
    model = _Model()
    mem = MemoryStores.new()
    with tempfile.TemporaryDirectory() as directory:
        rocks = RocksStorage(directory)
        try:
            for _ in range(data.draw(st.integers(1, 10))):
                ready = data.draw(readies(model))
                for name in ("snapshot_chunks", "reset_to_snapshot", "compact_to", "entries"):
                    if getattr(ready, name):
                        event(name)
                if ready.truncate_to is not None:
                    event("truncate_to")
                mem.persist(ready)
                rocks.persist(ready)
                _assert_same(rocks, mem)
                assert rocks.log.end_offset() == model.end()
        finally:
            rocks.close()
        # A clean close keeps every write, synced or not (only the page
        # cache of a crashed machine loses unsynced writes).
        mem.log.flush()
        mem.state.flush()
        mem.snapshots.crash()  # a reopen forgets partial downloads
        with RocksStorage(directory) as reopened:
            _assert_same(reopened, mem)


def test_log_store_operations_one_by_one(tmp_path: Path) -> None:
    mem = MemoryStores.new()
    with RocksStorage(tmp_path) as rocks:
        for store in (mem.log, rocks.log):
            store.append(contiguous((1, 2), (1, 2), (2, 2)))
            store.truncate_to(5)
            store.append([batch(4, 3)])
            store.delete_before(3)
            store.flush()
        assert rocks.log.read_all() == mem.log.read_all() == [batch(2, 1, 2), batch(4, 3)]
        rocks.log.clear()
        assert rocks.log.read_all() == []
        rocks.state.write(QuorumState(3, 3, None))
        rocks.state.flush()
        assert rocks.state.read() == QuorumState(3, 3, None)
        with pytest.raises(ValueError, match="does not continue the log"):
            rocks.log.append([batch(0, 1), batch(5, 1)])
        assert rocks.log.read_all() == []  # nothing of a refused append is written


# -- durability --------------------------------------------------------------


def test_synced_writes_survive_a_killed_process(tmp_path: Path) -> None:
    """A process that dies without closing RocksDB (os._exit) loses nothing
    it persisted; a clean reopen then finds everything."""
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from quorum.driver.rocks import RocksStorage
        from quorum.ready import Ready
        from quorum.types import Batch, QuorumState
        s = RocksStorage(sys.argv[1])
        for i in range(50):
            s.persist(Ready(entries=(Batch(i, 1, (b"x%d" % i,)),),
                            quorum_state=QuorumState(1, 1, None), must_sync=True))
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    with RocksStorage(tmp_path) as storage:
        assert [b.base_offset for b in storage.log.read_all()] == list(range(50))
        assert storage.state.read() == QuorumState(1, 1, None)


def test_usable_from_an_executor_thread(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with RocksStorage(tmp_path) as storage:
            for i in range(20):
                ready = Ready(entries=(batch(i, 1),), must_sync=True)
                await loop.run_in_executor(None, storage.persist, ready)
            assert len(await loop.run_in_executor(None, storage.log.read_all)) == 20

    asyncio.run(main())


def test_second_open_and_use_after_close_are_refused(tmp_path: Path) -> None:
    storage = RocksStorage(tmp_path)
    with pytest.raises(StorageOpenError, match="in use"):
        RocksStorage(tmp_path)
    storage.close()
    storage.close()  # idempotent
    with pytest.raises(StorageOpenError, match="closed"):
        storage.persist(Ready(entries=(batch(0, 1),)))


# -- recovery from damage ----------------------------------------------------


def _store_log(path: Path, *spec: tuple[int, int]) -> tuple[Batch, ...]:
    entries = contiguous(*spec)
    with RocksStorage(path) as storage:
        storage.persist(Ready(entries=entries, quorum_state=QuorumState(2), must_sync=True))
    return entries


def _damage(path: Path, base_offset: int, how: str) -> None:
    db = raw_db(path)
    try:
        value = bytearray(_bytes(db[log_key(base_offset)]))
        if how == "truncate":
            value = value[: len(value) // 2]
        elif how == "flip":
            value[-1] ^= 0x40
        elif how == "empty":
            value = bytearray()
        db[log_key(base_offset)] = bytes(value)
    finally:
        db.close()


@pytest.mark.parametrize("how", ["truncate", "flip", "empty"])
def test_a_torn_last_batch_is_dropped_and_logged(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    entries = _store_log(tmp_path, (1, 2), (1, 2), (2, 3))
    _damage(tmp_path, 4, how)
    with caplog.at_level(logging.WARNING, logger="kq.storage"):
        storage = RocksStorage(tmp_path)
    with storage:
        assert storage.log.read_all() == list(entries[:2])
        assert storage.state.read() == QuorumState(2)
        # The node goes on from the shorter log.
        storage.persist(Ready(entries=(batch(4, 2),), must_sync=True))
    [record] = [r for r in caplog.records if r.name == "kq.storage"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "dropped a damaged log tail" in message
    assert "base offsets 4" in message
    assert "now ends at offset 4" in message
    assert "log key" in message  # the reason names the key
    with RocksStorage(tmp_path) as storage:  # the drop itself was durable
        assert storage.log.read_all() == [*entries[:2], batch(4, 2)]


def test_several_damaged_batches_at_the_tail_are_all_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = _store_log(tmp_path, (1, 1), (1, 1), (1, 1), (1, 1))
    _damage(tmp_path, 2, "flip")
    _damage(tmp_path, 3, "truncate")
    with caplog.at_level(logging.WARNING, logger="kq.storage"), RocksStorage(tmp_path) as s:
        assert s.log.read_all() == list(entries[:2])
    assert "2 batch(es) at base offsets 2, 3" in caplog.text


def test_a_non_contiguous_last_batch_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = _store_log(tmp_path, (1, 2), (1, 2))
    db = raw_db(tmp_path)
    db[log_key(9)] = encode_batch(batch(9, 1))
    db.close()
    with caplog.at_level(logging.WARNING, logger="kq.storage"), RocksStorage(tmp_path) as s:
        assert s.log.read_all() == list(entries)
    assert "not contiguous" in caplog.text
    assert "base offsets 9" in caplog.text


def test_a_batch_under_the_wrong_key_at_the_tail_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = _store_log(tmp_path, (1, 2), (1, 2))
    db = raw_db(tmp_path)
    db[log_key(4)] = encode_batch(batch(5, 1))
    db.close()
    with caplog.at_level(logging.WARNING, logger="kq.storage"), RocksStorage(tmp_path) as s:
        assert s.log.read_all() == list(entries)
    assert "starts at offset 5, not 4" in caplog.text


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damage_in_the_middle_refuses_to_start(tmp_path: Path, how: str) -> None:
    _store_log(tmp_path, (1, 2), (1, 2), (2, 3))
    _damage(tmp_path, 2, how)
    with pytest.raises(StorageCorruptError) as info:
        RocksStorage(tmp_path)
    message = str(info.value)
    assert "corrupt in the middle" in message
    assert "base offset 2" in message
    assert "intact batch follows it at offsets 4..6" in message
    # Nothing was dropped: the damaged log is left for a human to look at.
    db = raw_db(tmp_path)
    try:
        assert len(list(db.keys())) == 4  # three batches and the quorum state
    finally:
        db.close()


def test_a_gap_before_intact_batches_refuses_to_start(tmp_path: Path) -> None:
    """A missing batch followed by several intact ones is no torn tail."""
    _store_log(tmp_path, (1, 2), (1, 2), (2, 3), (2, 1))
    db = raw_db(tmp_path)
    del db[log_key(2)]
    db.close()
    with pytest.raises(StorageCorruptError, match="not contiguous.*intact batch follows"):
        RocksStorage(tmp_path)


@pytest.mark.parametrize("how", ["flip", "truncate", "garbage"])
def test_a_corrupt_quorum_state_refuses_to_start(tmp_path: Path, how: str) -> None:
    _store_log(tmp_path, (1, 2))
    db = raw_db(tmp_path)
    value = bytearray(_bytes(db[STATE_KEY]))
    if how == "flip":
        value[7] ^= 1
    elif how == "truncate":
        value = value[:6]
    else:
        value = bytearray(b"\x00not a state")
    db[STATE_KEY] = bytes(value)
    db.close()
    with pytest.raises(
        StorageCorruptError, match="quorum state at key b'quorum-state' in .*rocksdb"
    ):
        RocksStorage(tmp_path)


def test_damage_after_open_is_reported_by_read_all(tmp_path: Path) -> None:
    """read_all checks every CRC again; it never serves a damaged batch."""
    _store_log(tmp_path, (1, 2), (1, 2))
    with RocksStorage(tmp_path) as storage:
        value = bytearray(encode_batch(batch(0, 1, 2)))
        value[-1] ^= 1
        storage._db[log_key(0)] = bytes(value)  # bit rot under a running node
        with pytest.raises(StorageCorruptError, match="fails its CRC-32C check"):
            storage.log.read_all()


# -- a real core on reopened storage -----------------------------------------


def _drain(core: RaftCore, storage: RocksStorage) -> None:
    while core.has_ready():
        ready = core.ready()
        assert ready is not None
        storage.persist(ready)
        core.advance(ready)


def _core(storage: RocksStorage, now: int) -> RaftCore:
    return RaftCore(
        1,
        VoterSet.of(1),
        log_store=storage.log,
        state_store=storage.state,
        snapshot_store=storage.snapshots,
        rng=random.Random(7),
        now_ms=now,
        config=QuorumConfig(),
    )


def _lead(core: RaftCore, storage: RocksStorage, now: int) -> int:
    for _ in range(100):
        if core.role is Role.LEADER:
            return now
        now = max(now + 1, core.next_deadline_ms())
        core.tick(now)
        _drain(core, storage)
    raise AssertionError("a single voter did not become leader")


def test_a_raft_core_starts_on_reopened_storage(tmp_path: Path) -> None:
    with RocksStorage(tmp_path) as storage:
        core = _core(storage, 0)
        now = _lead(core, storage, 0)
        first_epoch = core.epoch
        for i in range(5):
            core.propose([b"cmd%d" % i], now)
            _drain(core, storage)
        end = core.log.end_offset
        assert core.high_watermark == end
    with RocksStorage(tmp_path) as storage:
        core = _core(storage, now)
        assert core.log.end_offset == end
        assert core.epoch == first_epoch
        records = [r for b in storage.log.read_all() for r in b.records]
        assert [b"cmd%d" % i for i in range(5)] == records[-5:]
        now = _lead(core, storage, now)
        assert core.epoch > first_epoch
        core.propose([b"after restart"], now)
        _drain(core, storage)
        assert core.high_watermark == core.log.end_offset > end


def test_snapshot_store_can_be_replaced(tmp_path: Path) -> None:
    snapshots = MemorySnapshotStore()
    with RocksStorage(tmp_path, snapshots=snapshots) as storage:
        assert storage.snapshots is snapshots
        sid = SnapshotId(1, 1)
        storage.persist(Ready(snapshot_chunks=(SnapshotChunk(sid, 0, b"s", True),)))
        assert snapshots.get(sid) == b"s"
    assert not (tmp_path / "snapshots").exists()

"""FileSnapshotStore: atomic checksummed snapshot files."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from quorum.driver.snapshot_files import HEADER_SIZE, FileSnapshotStore
from quorum.memory import MemorySnapshotStore
from quorum.storage import SnapshotStore, StorageCorruptError
from quorum.types import SnapshotId

A = SnapshotId(10, 1)
B = SnapshotId(20, 2)
C = SnapshotId(30, 2)


def test_create_read_size_and_reopen(tmp_path: Path) -> None:
    store: SnapshotStore = FileSnapshotStore(tmp_path)
    assert store.latest() is None
    assert store.size(A) is None
    store.create(A, b"hello world")
    assert store.latest() == A
    assert store.size(A) == 11
    assert store.read(A, 0, 5) == b"hello"
    assert store.read(A, 6, 100) == b"world"
    assert store.read(A, 11, 5) == b""
    assert store.read(A, 50, 5) == b""
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000010-0000000001.checkpoint"]
    assert os.path.getsize(tmp_path / os.listdir(tmp_path)[0]) == HEADER_SIZE + 11
    reopened = FileSnapshotStore(tmp_path)
    assert reopened.latest() == A
    assert reopened.read(A, 0, 100) == b"hello world"
    with pytest.raises(KeyError):
        reopened.read(B, 0, 1)


def test_chunks_behave_as_the_memory_twin(tmp_path: Path) -> None:
    mem = MemorySnapshotStore()
    files = FileSnapshotStore(tmp_path)
    for store in (mem, files):
        store.write_chunk(B, 0, b"abc")
        store.write_chunk(B, 3, b"de")
        with pytest.raises(ValueError, match="chunk at position 9, expected 5"):
            store.write_chunk(B, 9, b"x")
        store.write_chunk(B, 0, b"XY")  # a download starting over
        store.write_chunk(B, 2, b"Z")
        assert store.latest() is None  # invisible until finished
        store.finish(B)
        with pytest.raises(ValueError, match="no chunks written to finish"):
            store.finish(C)
        with pytest.raises(ValueError, match="expected 0"):
            store.write_chunk(C, 4, b"x")
    assert files.latest() == mem.latest() == B
    assert files.read(B, 0, 100) == mem.read(B, 0, 100) == b"XYZ"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_delete_before_keeps_newer_snapshots_and_downloads(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.create(A, b"a")
    store.create(B, b"b")
    store.write_chunk(SnapshotId(15, 1), 0, b"older download")
    store.write_chunk(C, 0, b"newer download")
    store.delete_before(B)
    assert store.size(A) is None
    assert store.latest() == B
    assert store.partial_ids() == [C]
    store.write_chunk(C, 14, b"!")
    store.finish(C)
    assert store.read(C, 0, 100) == b"newer download!"
    assert len(os.listdir(tmp_path)) == 2


def test_partial_and_temporary_files_are_ignored_after_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileSnapshotStore(tmp_path)
    store.create(A, b"complete")
    store.write_chunk(B, 0, b"half of it")  # crash before finish
    (tmp_path / "00000000000000000030-0000000002.checkpoint.tmp").write_bytes(b"torn")
    with caplog.at_level(logging.INFO, logger="kq.storage"):
        reopened = FileSnapshotStore(tmp_path)
    assert reopened.latest() == A
    assert reopened.size(B) is None
    assert "removed 2 unfinished snapshot file(s)" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000010-0000000001.checkpoint"]
    # The download starts again from position 0, as with the memory twin.
    with pytest.raises(ValueError, match="expected 0"):
        reopened.write_chunk(B, 10, b"rest")
    reopened.write_chunk(B, 0, b"all of it")
    reopened.finish(B)
    assert FileSnapshotStore(tmp_path).read(B, 0, 100) == b"all of it"


def _file(directory: Path, sid: SnapshotId) -> Path:
    return directory / f"{sid.end_offset:020d}-{sid.epoch:010d}.checkpoint"


@pytest.mark.parametrize(
    ("offset", "message"),
    [
        (HEADER_SIZE + 3, "fails its payload CRC-32C check"),  # payload byte
        (0, "corrupt header"),  # magic
        (HEADER_SIZE - 1, "corrupt header"),  # the header's own CRC
        (10, "corrupt header"),  # the id inside the header
    ],
)
def test_a_damaged_latest_snapshot_refuses_to_open(
    tmp_path: Path, offset: int, message: str
) -> None:
    store = FileSnapshotStore(tmp_path)
    store.create(A, b"older, intact")
    store.create(B, b"the latest snapshot")
    path = _file(tmp_path, B)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(StorageCorruptError, match=message) as info:
        FileSnapshotStore(tmp_path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("cut", [HEADER_SIZE + 5, HEADER_SIZE, 7])
def test_a_truncated_latest_snapshot_refuses_to_open(tmp_path: Path, cut: int) -> None:
    store = FileSnapshotStore(tmp_path)
    store.create(B, b"the latest snapshot")
    path = _file(tmp_path, B)
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(StorageCorruptError, match="truncated"):
        FileSnapshotStore(tmp_path)


def test_a_snapshot_under_another_name_is_refused(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.create(A, b"a")
    os.rename(_file(tmp_path, A), _file(tmp_path, B))
    with pytest.raises(StorageCorruptError, match="not the one its name says"):
        FileSnapshotStore(tmp_path)


def test_an_older_damaged_snapshot_is_never_served(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.create(A, b"older snapshot")
    store.create(B, b"latest")
    path = _file(tmp_path, A)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    reopened = FileSnapshotStore(tmp_path)  # only the latest is checked at open
    assert reopened.latest() == B
    with pytest.raises(StorageCorruptError, match="payload CRC-32C"):
        reopened.read(A, 0, 3)
    with pytest.raises(StorageCorruptError, match="payload CRC-32C"):
        reopened.size(A)


def test_large_snapshot_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    store = FileSnapshotStore(tmp_path)
    step = 700_000
    for pos in range(0, len(data), step):
        store.write_chunk(C, pos, data[pos : pos + step])
    store.finish(C)
    reopened = FileSnapshotStore(tmp_path)
    assert reopened.size(C) == len(data)
    assert b"".join(reopened.read(C, p, step) for p in range(0, len(data), step)) == data


def test_a_snapshot_deleted_between_size_and_read_is_still_read_whole(tmp_path: Path) -> None:
    """The core asks size() then read() while the driver's worker thread may
    compact: the bytes it reads are those of the snapshot it sized."""
    store = FileSnapshotStore(tmp_path)
    store.create(A, b"older snapshot")
    store.create(B, b"newer")
    assert store.size(A) == 14
    store.delete_before(B)  # on another thread, between the core's two calls
    assert not _file(tmp_path, A).exists()
    assert store.size(A) is None
    assert store.read(A, 6, 100) == b"snapshot"
    store.delete_before(B)  # the next deletion closes what the last one kept
    assert store.read(A, 0, 1) == b""  # the fetching follower starts over
    with pytest.raises(KeyError):
        store.read(C, 0, 1)  # never known
    store.close()
    assert store.read(B, 0, 100) == b"newer"  # reopens its descriptor
    store.close()


def test_concurrent_readers_and_a_writer(tmp_path: Path) -> None:
    import threading

    store = FileSnapshotStore(tmp_path)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                sid = store.latest()
                if sid is None:
                    continue
                size = store.size(sid)
                if size is None:
                    continue  # deleted since latest(): the core says not found
                data = store.read(sid, 0, size)
                # Whole, or nothing if deleted twice over since sized.
                assert data in (str(sid.end_offset).encode() * 100, b"")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for end in range(1, 60):
        sid = SnapshotId(end, 1)
        store.create(sid, str(end).encode() * 100)
        store.delete_before(sid)
    stop.set()
    for t in threads:
        t.join()
    store.close()
    assert errors == []

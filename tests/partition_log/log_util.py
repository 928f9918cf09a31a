"""Helpers of the partition log's retention and swap tests: batches, the
files of a directory, the batches a log reads back, and a directory that
fails at its N-th change so a test can crash at every step."""

from __future__ import annotations

from partition_log.batch import BatchHeader, build_batch, split_batches
from partition_log.files import FileDirectory, LogFile, MemoryDirectory
from partition_log.log import PartitionLog
from partition_log.records import Record


def batch(
    count: int = 1,
    *,
    timestamp: int = 1000,
    key: bytes = b"k",
    value: bytes = b"v",
    producer: int = -1,
    producer_epoch: int = -1,
    sequence: int = -1,
    base: int = 0,
    epoch: int = -1,
) -> bytes:
    records = [Record(base + i, timestamp, key + b"%d" % i, value) for i in range(count)]
    return build_batch(
        records,
        base_offset=base,
        partition_leader_epoch=epoch,
        producer_id=producer,
        producer_epoch=producer_epoch,
        base_sequence=sequence,
    )


def files(directory: MemoryDirectory) -> dict[str, bytes]:
    """Every file's bytes as the process sees them."""
    out = {}
    for name in directory.list():
        handle = directory.open(name)
        out[name] = handle.read(0, handle.size)
        handle.close()
    return out


def read_batches(log: PartitionLog, start: int | None = None) -> list[bytes]:
    """The log's batches from ``start`` (its log start) to its end, each as
    its bytes."""
    out: list[bytes] = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        if not data:
            break
        views = split_batches(data)
        out.extend(bytes(view) for view in views)
        offset = BatchHeader.parse(views[-1]).next_offset
    return out


def offsets_of(batches: list[bytes]) -> list[tuple[int, int]]:
    return [
        (header.base_offset, header.last_offset)
        for header in (BatchHeader.parse(data) for data in batches)
    ]


class Crash(Exception):
    """The power went at this call."""


class _CountingFile:
    def __init__(self, directory: CrashingDirectory, inner: LogFile) -> None:
        self._directory = directory
        self._inner = inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def size(self) -> int:
        return self._inner.size

    def append(self, data: bytes | bytearray | memoryview) -> None:
        self._directory.step()
        self._inner.append(data)

    def read(self, position: int, size: int) -> bytes:
        return self._inner.read(position, size)

    def truncate(self, size: int) -> None:
        self._directory.step()
        self._inner.truncate(size)

    def sync(self) -> None:
        self._directory.step()
        self._inner.sync()

    def close(self) -> None:
        self._inner.close()


class CrashingDirectory:
    """A directory (the twin, or real files: then a stop is a kill -9, all
    written has reached the OS) whose changes (create, rename, delete,
    directory sync, and each file's append, truncate and sync) are counted;
    with ``budget`` set, the change after that many raises :class:`Crash`
    before it happens."""

    def __init__(self, inner: FileDirectory) -> None:
        self.inner = inner
        self.budget: int | None = None
        self.calls = 0

    def step(self) -> None:
        if self.budget is not None and self.calls >= self.budget:
            raise Crash(f"crash at change {self.calls}")
        self.calls += 1

    def arm(self, budget: int) -> None:
        self.calls = 0
        self.budget = budget

    def create(self, name: str) -> LogFile:
        self.step()
        return _CountingFile(self, self.inner.create(name))

    def open(self, name: str) -> LogFile:
        return _CountingFile(self, self.inner.open(name))

    def exists(self, name: str) -> bool:
        return self.inner.exists(name)

    def list(self) -> list[str]:
        return self.inner.list()

    def rename(self, old: str, new: str) -> None:
        self.step()
        self.inner.rename(old, new)

    def delete(self, name: str) -> None:
        self.step()
        self.inner.delete(name)

    def sync_directory(self) -> None:
        self.step()
        self.inner.sync_directory()

"""The file seam of the partition log: what a segment needs of a directory of
files, and its in-memory twin that can lose what was not synced.

A segment appends to its ``.log`` file, reads it back by position, cuts it
on truncation and recovery, and syncs it by policy (brokers.md §2.4: every
append reaches the operating system before the log end moves; fsync only
when the flush policy says so).  The real implementation on ``os`` is
:mod:`partition_log.os_files`, the only module of the package that does I/O
(``tests/partition_log/test_purity.py`` exempts it by name).

Durability rule, shared by both implementations (what a power loss can lose):

- a file's bytes are durable up to its last :meth:`LogFile.sync`; appends and
  truncations after it may be lost, and an append may be lost in part (a torn
  write keeps a prefix of the unsynced tail, never bytes that were not
  written);
- the directory's names (a create, a rename, a delete) are durable only after
  :meth:`FileDirectory.sync_directory` (fsync of the directory, as ext4 and
  XFS need for a new or renamed entry to survive).  A file whose bytes were
  synced but whose directory was not is lost with its name if it was created
  since the last directory sync, and a rename or delete not followed by one
  is undone.

A kill -9 of the process loses nothing: every call has reached the kernel
when it returns (``os.write``, no Python buffer).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Protocol

from partition_log.errors import Errors, PartitionLogError

# ``list`` is also a method of the directories below.
Names = list[str]

__all__ = [
    "FileDirectory",
    "LogFile",
    "MemoryDirectory",
    "MemoryFile",
    "ProcessBufferedFile",
    "storage_error",
]


def storage_error(message: str) -> PartitionLogError:
    """A failure of the files under the log (Kafka's ``KAFKA_STORAGE_ERROR``)."""
    return PartitionLogError(Errors.KAFKA_STORAGE_ERROR, message)


def check_name(name: str) -> None:
    """Names are plain file names inside the directory, never paths."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise storage_error(f"file name {name!r} is not a plain file name")


class LogFile(Protocol):
    """One open file of a segment, appended to at its end."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int:
        """Bytes in the file, including any not yet synced."""
        ...

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at the end; it has reached the OS when this returns."""
        ...

    def read(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``position`` (fewer at the end; pread)."""
        ...

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (no larger than it is)."""
        ...

    def sync(self) -> None:
        """Make the file's bytes durable (fsync)."""
        ...

    def close(self) -> None: ...


class FileDirectory(Protocol):
    """The directory of one partition's files."""

    def create(self, name: str) -> LogFile:
        """A new empty file; refused if ``name`` exists."""
        ...

    def open(self, name: str) -> LogFile:
        """An existing file, for reading and appending."""
        ...

    def exists(self, name: str) -> bool: ...

    def list(self) -> Names:
        """The names of the files, sorted."""
        ...

    def rename(self, old: str, new: str) -> None:
        """Give ``old`` the name ``new`` (replacing any file of that name)."""
        ...

    def delete(self, name: str) -> None: ...

    def sync_directory(self) -> None:
        """Make the names durable (fsync of the directory): call it after
        create, rename and delete."""
        ...


class ProcessBufferedFile:
    """A :class:`LogFile` whose appends wait in a process buffer instead of
    reaching the OS: bug B13 only (``Segment`` takes it under
    ``bugs.Bug.UNFLUSHED_APPEND``). It breaks this module's rule that a
    kill -9 loses nothing: the buffer reaches the file on :meth:`sync` (a
    flush or a roll) and :meth:`close` (a clean shutdown), so a run without
    kills keeps everything. Reads and the size see the buffer, as the
    process does."""

    __slots__ = ("_buffer", "_file")

    def __init__(self, file: LogFile) -> None:
        self._file = file
        self._buffer = bytearray()

    @property
    def name(self) -> str:
        return self._file.name

    @property
    def size(self) -> int:
        return self._file.size + len(self._buffer)

    def _write_out(self) -> None:
        if self._buffer:
            self._file.append(self._buffer)
            self._buffer = bytearray()

    def append(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def read(self, position: int, size: int) -> bytes:
        written = self._file.size
        if position + size <= written or not self._buffer:
            return self._file.read(position, size)
        if position < 0 or size < 0:
            raise storage_error(f"file {self.name}: read at {position} of {size} bytes")
        head = self._file.read(position, written - position) if position < written else b""
        start = max(0, position - written)
        return head + bytes(self._buffer[start : start + size - len(head)])

    def truncate(self, size: int) -> None:
        written = self._file.size
        if not 0 <= size <= written + len(self._buffer):
            raise storage_error(f"file {self.name}: cannot truncate {self.size} bytes to {size}")
        if size >= written:
            del self._buffer[size - written :]
        else:
            self._buffer.clear()
            self._file.truncate(size)

    def sync(self) -> None:
        self._write_out()
        self._file.sync()

    def close(self) -> None:
        self._write_out()
        self._file.close()


# -- the in-memory twin --------------------------------------------------------


class _Inode:
    """A file's bytes as the process sees them and as the disk holds them."""

    __slots__ = ("data", "synced")

    def __init__(self) -> None:
        self.data = bytearray()
        self.synced = bytearray()

    def crash(self, rng: random.Random | None) -> None:
        synced = self.synced
        keep = len(synced)
        # A torn write: with an rng, a prefix of an unsynced appended tail may
        # have reached the disk; a truncation or rewrite since the sync is
        # undone entirely.
        if rng is not None and len(self.data) > keep and self.data[:keep] == synced:
            keep += rng.randint(0, len(self.data) - keep)
            self.data = bytearray(self.data[:keep])
        else:
            self.data = bytearray(synced)
        self.synced = bytearray(self.data)


class MemoryFile:
    """A handle on a twin's file; stale (refused) after the twin crashes."""

    def __init__(self, directory: MemoryDirectory, name: str, inode: _Inode) -> None:
        self._directory = directory
        self._name = name
        self._inode = inode
        self._generation = directory.generation
        self._closed = False

    def _live(self) -> _Inode:
        if self._closed:
            raise storage_error(f"file {self._name} is closed")
        if self._generation != self._directory.generation:
            raise storage_error(f"file {self._name} was open before a crash")
        return self._inode

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return len(self._live().data)

    def append(self, data: bytes | bytearray | memoryview) -> None:
        self._live().data += data

    def read(self, position: int, size: int) -> bytes:
        if position < 0 or size < 0:
            raise storage_error(f"file {self._name}: read at {position} of {size} bytes")
        return bytes(self._live().data[position : position + size])

    def truncate(self, size: int) -> None:
        inode = self._live()
        if not 0 <= size <= len(inode.data):
            raise storage_error(
                f"file {self._name}: cannot truncate {len(inode.data)} bytes to {size}"
            )
        del inode.data[size:]

    def sync(self) -> None:
        inode = self._live()
        inode.synced = bytearray(inode.data)

    def close(self) -> None:
        self._closed = True


class MemoryDirectory:
    """A :class:`FileDirectory` in memory whose :meth:`crash` keeps only what
    the durability rule of this module says a power loss keeps."""

    def __init__(self) -> None:
        self._names: dict[str, _Inode] = {}
        self._synced_names: dict[str, _Inode] = {}
        self.generation = 0

    def _get(self, name: str) -> _Inode:
        check_name(name)
        inode = self._names.get(name)
        if inode is None:
            raise storage_error(f"file {name} does not exist")
        return inode

    def create(self, name: str) -> MemoryFile:
        check_name(name)
        if name in self._names:
            raise storage_error(f"file {name} already exists")
        inode = _Inode()
        self._names[name] = inode
        return MemoryFile(self, name, inode)

    def open(self, name: str) -> MemoryFile:
        return MemoryFile(self, name, self._get(name))

    def exists(self, name: str) -> bool:
        check_name(name)
        return name in self._names

    def list(self) -> Names:
        return sorted(self._names)

    def rename(self, old: str, new: str) -> None:
        check_name(new)
        inode = self._get(old)
        del self._names[old]
        self._names[new] = inode

    def delete(self, name: str) -> None:
        self._get(name)
        del self._names[name]

    def sync_directory(self) -> None:
        self._synced_names = dict(self._names)

    # -- for tests --------------------------------------------------------------

    def durable_names(self) -> Names:
        return sorted(self._synced_names)

    def durable_bytes(self, name: str) -> bytes:
        """What the file would hold after a crash without torn writes."""
        return bytes(self._synced_names[name].synced)

    def crash(self, rng: random.Random | None = None) -> None:
        """A power loss: names back to the last directory sync, every file's
        bytes back to its last sync (with ``rng``, plus a torn prefix of an
        unsynced appended tail); every open handle is stale."""
        self._names = dict(self._synced_names)
        inodes: Iterable[_Inode] = {id(i): i for i in self._names.values()}.values()
        for inode in inodes:
            inode.crash(rng)
        self.generation += 1

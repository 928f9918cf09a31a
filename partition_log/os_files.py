"""The file seam on real files (:mod:`partition_log.files` states the
contract): the one module of the package that does I/O.

Every append is one ``os.write`` on a descriptor opened ``O_APPEND``, so the
bytes are in the kernel when the call returns (a kill -9 loses nothing,
brokers.md §2.4); reads are ``os.pread``, which leaves no shared file
position to race on; ``sync`` is ``os.fsync`` and ``sync_directory`` fsyncs
the directory so that a create, rename or delete survives a power loss.

:class:`PowerLossOsDirectory` is the power-loss test mode of the same seam
(off unless a broker process is started with it, ``server.storage_mode``):
its files keep every append and truncation made since their last ``sync``
in the process's memory, where reads see them, and hand them to the OS
only at the ``sync`` that covers them, so a kill -9 of the process drops
exactly the bytes a power loss may drop (``files.py``'s durability rule).
Names (create, rename, delete) still reach the OS at once: the log syncs
the directory after each, so a power loss keeps them too.
"""

from __future__ import annotations

import os

from partition_log.files import Names, check_name, storage_error

__all__ = [
    "OsDirectory",
    "OsFile",
    "PowerLossOsDirectory",
    "PowerLossOsFile",
    "fsync_directory",
]


def fsync_directory(path: str) -> None:
    """Make a directory's names durable (a create, rename or delete in it):
    ext4 and XFS need the directory itself synced."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OsFile:
    def __init__(self, path: str, name: str, fd: int) -> None:
        self._path = path
        self._name = name
        self._fd: int | None = fd
        self._size = os.fstat(fd).st_size

    def _live(self) -> int:
        if self._fd is None:
            raise storage_error(f"file {self._path} is closed")
        return self._fd

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    def append(self, data: bytes | bytearray | memoryview) -> None:
        fd = self._live()
        view = memoryview(data)
        try:
            # os.write may write less than asked (a signal, a full disk):
            # loop until all is written or it fails.
            while view:
                written = os.write(fd, view)
                self._size += written
                view = view[written:]
        except OSError as error:
            raise storage_error(f"writing {self._path}: {error}") from error

    def read(self, position: int, size: int) -> bytes:
        if position < 0 or size < 0:
            raise storage_error(f"file {self._path}: read at {position} of {size} bytes")
        fd = self._live()
        # Never ask pread for more than the file holds: it allocates the
        # size asked for before reading.
        size = min(size, max(0, self._size - position))
        try:
            parts = []
            while size > 0:
                chunk = os.pread(fd, size, position)
                if not chunk:
                    break
                parts.append(chunk)
                position += len(chunk)
                size -= len(chunk)
            return b"".join(parts)
        except OSError as error:
            raise storage_error(f"reading {self._path}: {error}") from error

    def truncate(self, size: int) -> None:
        fd = self._live()
        if not 0 <= size <= self._size:
            raise storage_error(f"file {self._path}: cannot truncate {self._size} bytes to {size}")
        try:
            os.ftruncate(fd, size)
        except OSError as error:
            raise storage_error(f"truncating {self._path}: {error}") from error
        self._size = size

    def sync(self) -> None:
        try:
            os.fsync(self._live())
        except OSError as error:
            raise storage_error(f"syncing {self._path}: {error}") from error

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class PowerLossOsFile(OsFile):
    """An :class:`OsFile` whose unsynced appends and truncations stay in
    this process until :meth:`sync` (the power-loss test mode).

    The file as the process sees it is the OS file's first ``_base`` bytes
    followed by ``_tail``; the OS file may be longer than ``_base`` while a
    truncation waits for the sync (``_os_size``).  A kill -9 loses the tail
    and the pending cut; :meth:`sync` writes them, then fsyncs.  Closing the
    file hands them to the OS without a sync, as closing a file leaves its
    bytes in the page cache (the log syncs the files it keeps before it
    closes them)."""

    def __init__(self, path: str, name: str, fd: int) -> None:
        super().__init__(path, name, fd)
        self._os_size = self._size
        self._base = self._size
        self._tail = bytearray()

    def append(self, data: bytes | bytearray | memoryview) -> None:
        self._live()
        self._tail += data
        self._size += len(data)

    def read(self, position: int, size: int) -> bytes:
        if position < 0 or size < 0:
            raise storage_error(f"file {self._path}: read at {position} of {size} bytes")
        size = min(size, max(0, self._size - position))
        end = position + size
        head = b""
        if position < self._base:
            head = super().read(position, min(end, self._base) - position)
        if end <= self._base:
            return head
        return head + bytes(self._tail[max(0, position - self._base) : end - self._base])

    def truncate(self, size: int) -> None:
        self._live()
        if not 0 <= size <= self._size:
            raise storage_error(f"file {self._path}: cannot truncate {self._size} bytes to {size}")
        if size >= self._base:
            del self._tail[size - self._base :]
        else:
            self._base = size
            self._tail.clear()
        self._size = size

    def _write_back(self) -> None:
        """Hand the held cut and bytes to the OS (no fsync)."""
        fd = self._live()
        try:
            if self._os_size != self._base:
                os.ftruncate(fd, self._base)
                self._os_size = self._base
            while self._tail:
                # O_APPEND: at the OS file's end, which is _base now.
                written = os.write(fd, self._tail)
                del self._tail[:written]
                self._os_size += written
                self._base = self._os_size
        except OSError as error:
            raise storage_error(f"writing {self._path}: {error}") from error

    def sync(self) -> None:
        self._write_back()
        super().sync()

    def close(self) -> None:
        if self._fd is not None:
            try:
                self._write_back()
            finally:
                super().close()


class OsDirectory:
    """A :class:`~partition_log.files.FileDirectory` on an existing directory."""

    # The class of the files it opens (PowerLossOsDirectory's hold unsynced bytes).
    _file_class: type[OsFile] = OsFile

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise storage_error(f"{self.path} is not a directory")

    def _path_of(self, name: str) -> str:
        check_name(name)
        return os.path.join(self.path, name)

    def _open(self, name: str, flags: int) -> OsFile:
        path = self._path_of(name)
        try:
            fd = os.open(path, flags | os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o644)
        except FileExistsError:
            raise storage_error(f"file {path} already exists") from None
        except FileNotFoundError:
            raise storage_error(f"file {path} does not exist") from None
        except OSError as error:
            raise storage_error(f"opening {path}: {error}") from error
        return self._file_class(path, name, fd)

    def create(self, name: str) -> OsFile:
        return self._open(name, os.O_CREAT | os.O_EXCL)

    def open(self, name: str) -> OsFile:
        return self._open(name, 0)

    def exists(self, name: str) -> bool:
        return os.path.isfile(self._path_of(name))

    def list(self) -> Names:
        return sorted(
            entry.name for entry in os.scandir(self.path) if entry.is_file(follow_symlinks=False)
        )

    def rename(self, old: str, new: str) -> None:
        source = self._path_of(old)
        try:
            os.replace(source, self._path_of(new))
        except FileNotFoundError:
            raise storage_error(f"file {source} does not exist") from None
        except OSError as error:
            raise storage_error(f"renaming {source} to {new}: {error}") from error

    def delete(self, name: str) -> None:
        path = self._path_of(name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise storage_error(f"file {path} does not exist") from None
        except OSError as error:
            raise storage_error(f"deleting {path}: {error}") from error

    def sync_directory(self) -> None:
        fsync_directory(self.path)


class PowerLossOsDirectory(OsDirectory):
    """An :class:`OsDirectory` of :class:`PowerLossOsFile` s: the power-loss
    test mode, in which a kill -9 of the process drops every byte not
    synced (``server.storage_mode`` turns it on for a broker)."""

    _file_class = PowerLossOsFile

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

:class:`TornTailOsDirectory` adds torn writes to that mode: a power loss
on a real disk may leave part of the unsynced tail behind, sector by
sector, with sectors that never reached the disk reading as zeros (a file
whose size was extended before its blocks were written, as ext4 and XFS
can leave it; Jepsen's lazyfs tears writes the same way).  Each segment
file (``.log``) of such a directory mirrors its unsynced tail, as the OS
would hold it in its page cache, into a hidden file beside it
(``.<name>.unsynced``: the base it starts at, then the bytes), written
without a sync and removed at the sync that covers the tail.  The process
is killed without a chance to act, so the tearing comes at its next start:
:func:`tear_unsynced_tails`, before the log directory is opened, writes a
random prefix of each tail left behind, with one to three of its sectors
zeroed (:func:`torn_bytes`), where the kill left the file.  A correct
recovery finds the first damaged batch by its CRC or its header and cuts
the file there; that is what the tear tests.
"""

from __future__ import annotations

import contextlib
import os
import random
import struct
from dataclasses import dataclass
from typing import Final

from partition_log.files import Names, check_name, storage_error
from partition_log.segment import LOG_SUFFIX

__all__ = [
    "SECTOR_BYTES",
    "UNSYNCED_SUFFIX",
    "OsDirectory",
    "OsFile",
    "PowerLossOsDirectory",
    "PowerLossOsFile",
    "TornTail",
    "TornTailOsDirectory",
    "TornTailOsFile",
    "fsync_directory",
    "mirror_name",
    "tear_unsynced_tails",
    "torn_bytes",
]

SECTOR_BYTES: Final = 512
"""The unit a disk writes atomically: a torn write keeps or loses whole
sectors (file positions ``k * SECTOR_BYTES`` on)."""

UNSYNCED_SUFFIX: Final = ".unsynced"
"""A torn-tail mirror is named ``.<segment file name>.unsynced``."""

_MIRROR_MAGIC: Final = b"KQTT"
_MIRROR_HEADER: Final = struct.Struct(">4sQ")  # magic, the base the tail starts at


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


def mirror_name(name: str) -> str:
    """The hidden file beside segment file ``name`` that mirrors its
    unsynced tail in the torn-tail mode."""
    return f".{name}{UNSYNCED_SUFFIX}"


def _is_mirror(name: str) -> bool:
    return name.startswith(".") and name.endswith(UNSYNCED_SUFFIX)


class TornTailOsFile(PowerLossOsFile):
    """A :class:`PowerLossOsFile` that, for a segment file, also writes its
    unsynced tail to its mirror (``.<name>.unsynced``: the base, then the
    bytes) as it changes, without a sync: the page cache's copy of what a
    power loss may half keep.  The tail's sync (or the file's close, which
    hands the tail to the OS) removes the mirror."""

    def __init__(self, path: str, name: str, fd: int) -> None:
        super().__init__(path, name, fd)
        self._mirror_path: str | None = (
            os.path.join(os.path.dirname(path), mirror_name(name))
            if name.endswith(LOG_SUFFIX)
            else None
        )
        self._mirror: int | None = None
        if self._mirror_path is not None:
            # A mirror of an earlier life of this name was torn at the
            # process's start, or is stale (the mode was off then).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._mirror_path)

    def _mirror_write(self, data: bytes | bytearray | memoryview) -> None:
        if self._mirror_path is None:
            return
        try:
            if self._mirror is None:
                self._mirror = os.open(
                    self._mirror_path,
                    os.O_WRONLY
                    | os.O_CREAT
                    | os.O_TRUNC
                    | os.O_APPEND
                    | getattr(os, "O_CLOEXEC", 0),
                    0o644,
                )
                _write_all(self._mirror, _MIRROR_HEADER.pack(_MIRROR_MAGIC, self._base))
            _write_all(self._mirror, data)
        except OSError as error:
            raise storage_error(f"writing the unsynced mirror of {self._path}: {error}") from error

    def _drop_mirror(self) -> None:
        fd, self._mirror = self._mirror, None
        if fd is None or self._mirror_path is None:
            return
        try:
            # Only the mirror this file wrote: after a rename of the file
            # (which drops the mirror) its name may hold another file's.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self._mirror_path).st_ino == os.fstat(fd).st_ino:
                    os.unlink(self._mirror_path)
        finally:
            os.close(fd)

    def append(self, data: bytes | bytearray | memoryview) -> None:
        super().append(data)
        self._mirror_write(data)

    def truncate(self, size: int) -> None:
        super().truncate(size)
        if not self._tail:
            self._drop_mirror()
        elif self._mirror is not None:
            try:
                os.ftruncate(self._mirror, _MIRROR_HEADER.size + len(self._tail))
            except OSError as error:
                raise storage_error(
                    f"truncating the unsynced mirror of {self._path}: {error}"
                ) from error

    def sync(self) -> None:
        super().sync()
        self._drop_mirror()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._drop_mirror()


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class TornTailOsDirectory(PowerLossOsDirectory):
    """A :class:`PowerLossOsDirectory` of :class:`TornTailOsFile` s (the
    torn-tail mode): the mirrors are not part of the log, so :meth:`list`
    leaves them out; deleting or renaming a file removes its mirror (a
    renamed segment is no longer written, and its unsynced tail is then
    only lost at a kill, never torn)."""

    _file_class = TornTailOsFile

    def list(self) -> Names:
        return [n for n in super().list() if not _is_mirror(n)]

    def _forget_mirror(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.path, mirror_name(name)))

    def rename(self, old: str, new: str) -> None:
        super().rename(old, new)
        self._forget_mirror(old)

    def delete(self, name: str) -> None:
        super().delete(name)
        self._forget_mirror(name)


@dataclass(frozen=True, slots=True)
class TornTail:
    """One segment file torn at a start: ``path``, the ``base`` its unsynced
    tail started at (the file's size after the kill), the ``unsynced``
    bytes the killed process held, the ``kept`` prefix written back and
    the file ranges ``[start, end)`` of it ``zeroed`` (sectors that never
    reached the disk)."""

    path: str
    base: int
    unsynced: int
    kept: int
    zeroed: tuple[tuple[int, int], ...]

    def describe(self) -> str:
        ranges = ", ".join(f"{a}-{b}" for a, b in self.zeroed) or "none"
        return (
            f"torn tail of {self.path}: kept {self.kept} of {self.unsynced} unsynced bytes "
            f"from position {self.base}, zeroed {ranges}"
        )


def torn_bytes(
    base: int, tail: bytes, rng: random.Random
) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """What a power loss leaves of an unsynced ``tail`` written at file
    position ``base``: a prefix of random length (how far the file's size
    had reached the disk) in which one to three of the sectors it touches
    (:data:`SECTOR_BYTES`, aligned on the file) never reached the disk and
    read as zeros; and the zeroed ranges.  The synced bytes below ``base``
    are never touched."""
    kept = rng.randint(0, len(tail))
    if kept == 0:
        return b"", ()
    data = bytearray(tail[:kept])
    sectors = range(base // SECTOR_BYTES, (base + kept - 1) // SECTOR_BYTES + 1)
    lost = sorted(rng.sample(sectors, min(len(sectors), rng.randint(1, 3))))
    zeroed = []
    for sector in lost:
        start = max(sector * SECTOR_BYTES, base)
        end = min((sector + 1) * SECTOR_BYTES, base + kept)
        data[start - base : end - base] = bytes(end - start)
        zeroed.append((start, end))
    return bytes(data), tuple(zeroed)


def tear_unsynced_tails(log_dir: str | os.PathLike[str], rng: random.Random) -> list[TornTail]:
    """Tear every unsynced tail that a killed process left mirrored in the
    partition directories of ``log_dir`` (the torn-tail mode, at a start,
    before the logs are opened): each segment file whose size is still the
    base its mirror recorded gets :func:`torn_bytes` of the tail appended
    (and synced: they are what the disk holds now); a mirror whose file is
    gone or has another size (a truncation that was not synced) is only
    removed.  Returns what was torn."""
    torn: list[TornTail] = []
    root = os.fspath(log_dir)
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir(follow_symlinks=False):
            continue
        for name in sorted(os.listdir(entry.path)):
            if not _is_mirror(name):
                continue
            mirror = os.path.join(entry.path, name)
            target = os.path.join(entry.path, name[1 : -len(UNSYNCED_SUFFIX)])
            try:
                with open(mirror, "rb") as f:
                    raw = f.read()
                if len(raw) > _MIRROR_HEADER.size and os.path.isfile(target):
                    magic, base = _MIRROR_HEADER.unpack_from(raw)
                    if magic == _MIRROR_MAGIC and os.path.getsize(target) == base:
                        tail = raw[_MIRROR_HEADER.size :]
                        data, zeroed = torn_bytes(base, tail, rng)
                        fd = os.open(target, os.O_WRONLY | os.O_APPEND)
                        try:
                            _write_all(fd, data)
                            os.fsync(fd)
                        finally:
                            os.close(fd)
                        rel = os.path.relpath(target, root)
                        torn.append(TornTail(rel, base, len(tail), len(data), zeroed))
                os.unlink(mirror)
            except OSError as error:
                raise storage_error(f"tearing the unsynced tail of {target}: {error}") from error
    return torn

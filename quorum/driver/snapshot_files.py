"""Snapshots as checksummed files, written atomically (KIP-630 on disk).

One directory holds one file per complete snapshot, named
``<end_offset:020d>-<epoch:010d>.checkpoint`` so that names sort as ids do.
Each file is a fixed header followed by the opaque payload (big-endian)::

    magic        4 bytes  b"KQSN"
    version      u16      0
    end_offset   u64      snapshot id, must match the file name
    epoch        u32      snapshot id, must match the file name
    length       u64      payload length in bytes
    payload_crc  u32      CRC-32C of the payload
    header_crc   u32      CRC-32C of the 30 header bytes before it
    payload      length bytes

A snapshot becomes visible only by an atomic rename:

* downloaded in chunks: ``write_chunk`` appends to ``<name>.partial`` (a
  header-sized gap, then the payload), keeping the running CRC in memory;
  ``finish`` writes the header into the gap, fsyncs the file, renames it to
  ``<name>`` and fsyncs the directory;
* made whole: ``create`` writes ``<name>.tmp``, fsyncs, renames, fsyncs the
  directory.

On open, leftover ``.partial`` and ``.tmp`` files (a crash before the rename)
are removed: as with the in-memory twin, a download interrupted by a crash
starts again from position 0.  The latest complete snapshot is verified at
open (header and payload CRC); if it is corrupt the store refuses to open
with :class:`~quorum.storage.StorageCorruptError` naming the file.  It does
not fall back to an older snapshot: the log was most likely compacted up to
the latest one, so an older snapshot would leave a hole between its end and
the log's start, and a node that silently forgot committed entries could
break the quorum's guarantees.  Any other snapshot is verified in full the
first time it is read or sized, before a byte of it is served.

Threads: every method takes one lock, since the node driver persists (and so
finishes and deletes snapshots) on a worker thread while its core may serve
FetchSnapshot on the event loop.  The core asks ``size`` and then ``read``; a
snapshot deleted between the two is still read whole through the descriptor
opened when it was checked (its file is unlinked at once; the descriptor is
closed at the next ``delete_before`` or :meth:`close`), so a reader never
sees a half-deleted snapshot.  If it was deleted twice over since (two
compactions between the core's two calls), ``read`` returns no bytes, which
the fetching follower takes as "start over" (``KeyError`` is kept for ids
this store never had).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from quorum.storage import StorageCorruptError
from quorum.types import SnapshotId

__all__ = ["HEADER_SIZE", "MAGIC", "FileSnapshotStore", "fsync_dir", "snapshot_file_name"]

log = logging.getLogger("kq.storage")

MAGIC = b"KQSN"
VERSION = 0
_HEADER_BODY = struct.Struct(">4sHQIQI")  # magic, version, end_offset, epoch, length, crc
_HEADER_CRC = struct.Struct(">I")
HEADER_SIZE = _HEADER_BODY.size + _HEADER_CRC.size
_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_PARTIAL_SUFFIX = ".partial"
_TMP_SUFFIX = ".tmp"
_READ_CHUNK = 1 << 20
_DELETED_MEMORY = 1024


def snapshot_file_name(snapshot_id: SnapshotId) -> str:
    if not 0 <= snapshot_id.end_offset < 2**64 or not 0 <= snapshot_id.epoch < 2**32:
        raise ValueError(f"snapshot id {snapshot_id} out of range")
    return f"{snapshot_id.end_offset:020d}-{snapshot_id.epoch:010d}.checkpoint"


def _parse_name(name: str) -> SnapshotId | None:
    m = _NAME.match(name)
    return SnapshotId(int(m.group(1)), int(m.group(2))) if m else None


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _header(snapshot_id: SnapshotId, length: int, payload_crc: int) -> bytes:
    body = _HEADER_BODY.pack(
        MAGIC, VERSION, snapshot_id.end_offset, snapshot_id.epoch, length, payload_crc
    )
    return body + _HEADER_CRC.pack(crc32c(body))


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


@dataclass(slots=True)
class _Partial:
    path: Path
    position: int
    crc: int


class FileSnapshotStore:
    """The :class:`~quorum.storage.SnapshotStore` port on a directory.

    Thread-safe (one lock); see the module docstring.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        # Read descriptors of checked complete snapshots, and of snapshots
        # deleted since the last delete_before (with their payload length).
        self._fds: dict[SnapshotId, int] = {}
        self._retired: dict[SnapshotId, tuple[int, int]] = {}
        # Ids deleted since open (the latest _DELETED_MEMORY of them).
        self._deleted: dict[SnapshotId, None] = {}
        self._partials: dict[SnapshotId, _Partial] = {}
        # Complete snapshots: id -> payload length (header checked).
        self._complete: dict[SnapshotId, int] = {}
        # Snapshots whose payload CRC was checked since open.
        self._verified: set[SnapshotId] = set()
        removed: list[str] = []
        for entry in sorted(os.listdir(self.directory)):
            if entry.endswith((_PARTIAL_SUFFIX, _TMP_SUFFIX)):
                (self.directory / entry).unlink()
                removed.append(entry)
                continue
            sid = _parse_name(entry)
            if sid is not None:
                self._complete[sid] = -1  # header not read yet
        if removed:
            fsync_dir(self.directory)
            log.info(
                "removed %d unfinished snapshot file(s) left by a crash in %s: %s",
                len(removed),
                self.directory,
                ", ".join(removed),
            )
        latest = self.latest()
        if latest is not None:
            self._verify(latest)

    def close(self) -> None:
        """Close the read descriptors (the store may be used again: they reopen)."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            for fd, _ in self._retired.values():
                os.close(fd)
            self._fds.clear()
            self._retired.clear()

    # -- reading -----------------------------------------------------------

    def path_of(self, snapshot_id: SnapshotId) -> Path:
        return self.directory / snapshot_file_name(snapshot_id)

    def latest(self) -> SnapshotId | None:
        with self._lock:
            return max(self._complete) if self._complete else None

    def _read_header(self, snapshot_id: SnapshotId, fd: int, path: Path) -> tuple[int, int]:
        """Check the header of an open snapshot file; return (length, payload crc)."""
        raw = os.pread(fd, HEADER_SIZE, 0)
        if len(raw) < HEADER_SIZE:
            raise StorageCorruptError(
                f"snapshot file {path} is truncated: {len(raw)} bytes, shorter than its "
                f"{HEADER_SIZE}-byte header"
            )
        (header_crc,) = _HEADER_CRC.unpack_from(raw, _HEADER_BODY.size)
        actual = crc32c(raw[: _HEADER_BODY.size])
        if actual != header_crc:
            raise StorageCorruptError(
                f"snapshot file {path} has a corrupt header: stored CRC-32C "
                f"{header_crc:#010x}, computed {actual:#010x}"
            )
        magic, version, end_offset, epoch, length, payload_crc = _HEADER_BODY.unpack_from(raw)
        if magic != MAGIC:
            raise StorageCorruptError(f"snapshot file {path} has bad magic {magic!r}")
        if version != VERSION:
            raise StorageCorruptError(
                f"snapshot file {path} has unknown format version {version} (expected {VERSION})"
            )
        if SnapshotId(end_offset, epoch) != snapshot_id:
            raise StorageCorruptError(
                f"snapshot file {path} holds snapshot (end offset {end_offset}, epoch "
                f"{epoch}), not the one its name says"
            )
        size = os.fstat(fd).st_size
        if size != HEADER_SIZE + length:
            raise StorageCorruptError(
                f"snapshot file {path} is {size} bytes but its header says "
                f"{HEADER_SIZE} + {length}: the file is truncated or has trailing bytes"
            )
        return length, payload_crc

    def _verify(self, snapshot_id: SnapshotId) -> int:
        """Check the whole file of a complete snapshot once, keeping a read
        descriptor open; return its payload length."""
        length = self._complete[snapshot_id]
        if snapshot_id in self._verified and snapshot_id in self._fds:
            return length
        path = self.path_of(snapshot_id)
        fd = os.open(path, os.O_RDONLY)
        try:
            length, stored = self._read_header(snapshot_id, fd, path)
            if snapshot_id not in self._verified:
                crc = 0
                pos = HEADER_SIZE
                end = HEADER_SIZE + length
                while pos < end:
                    chunk = os.pread(fd, min(_READ_CHUNK, end - pos), pos)
                    if not chunk:
                        raise StorageCorruptError(f"snapshot file {path} shrank while being read")
                    crc = crc32c(chunk, crc)
                    pos += len(chunk)
                if crc != stored:
                    raise StorageCorruptError(
                        f"snapshot file {path} fails its payload CRC-32C check: stored "
                        f"{stored:#010x}, computed {crc:#010x} over {length} bytes; refusing "
                        "to use it (restore the file, or remove the node's data and let it "
                        "fetch a snapshot from the leader)"
                    )
        except BaseException:
            os.close(fd)
            raise
        self._forget_fd(snapshot_id)
        self._fds[snapshot_id] = fd
        self._complete[snapshot_id] = length
        self._verified.add(snapshot_id)
        return length

    def _forget_fd(self, snapshot_id: SnapshotId) -> None:
        fd = self._fds.pop(snapshot_id, None)
        if fd is not None:
            os.close(fd)

    def size(self, snapshot_id: SnapshotId) -> int | None:
        with self._lock:
            if snapshot_id not in self._complete:
                return None
            return self._verify(snapshot_id)

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        if position < 0 or max_bytes < 0:
            raise ValueError(f"bad snapshot read: position {position}, max_bytes {max_bytes}")
        with self._lock:
            if snapshot_id in self._complete:
                length = self._verify(snapshot_id)
                fd = self._fds[snapshot_id]
            elif snapshot_id in self._retired:
                fd, length = self._retired[snapshot_id]  # deleted since sized
            elif snapshot_id in self._deleted:
                return b""  # deleted twice over since sized: the fetcher starts over
            else:
                raise KeyError(snapshot_id)
            count = max(0, min(max_bytes, length - position))
            if count == 0:
                return b""
            data = os.pread(fd, count, HEADER_SIZE + position)
        if len(data) != count:
            raise StorageCorruptError(
                f"snapshot file {self.path_of(snapshot_id)} shrank: read {len(data)} of "
                f"{count} bytes at payload position {position}"
            )
        return data

    # -- writing -----------------------------------------------------------

    def write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None:
        with self._lock:
            self._write_chunk(snapshot_id, position, data)

    def _write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None:
        path = self.directory / (snapshot_file_name(snapshot_id) + _PARTIAL_SUFFIX)
        partial = self._partials.get(snapshot_id)
        if position == 0:
            # A download starting (over): a fresh file with room for the header.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, bytes(HEADER_SIZE))
            finally:
                os.close(fd)
            partial = self._partials[snapshot_id] = _Partial(path, 0, 0)
        expected = 0 if partial is None else partial.position
        if partial is None or position != expected:
            raise ValueError(
                f"snapshot {snapshot_id} chunk at position {position}, expected {expected}"
            )
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        partial.position += len(data)
        partial.crc = crc32c(data, partial.crc)

    def finish(self, snapshot_id: SnapshotId) -> None:
        with self._lock:
            self._finish(snapshot_id)

    def _finish(self, snapshot_id: SnapshotId) -> None:
        partial = self._partials.get(snapshot_id)
        if partial is None:
            raise ValueError(f"snapshot {snapshot_id} has no chunks written to finish")
        fd = os.open(partial.path, os.O_WRONLY)
        try:
            os.pwrite(fd, _header(snapshot_id, partial.position, partial.crc), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        del self._partials[snapshot_id]
        self._install(partial.path, snapshot_id, partial.position)

    def create(self, snapshot_id: SnapshotId, data: bytes) -> None:
        with self._lock:
            self._create(snapshot_id, data)

    def _create(self, snapshot_id: SnapshotId, data: bytes) -> None:
        tmp = self.directory / (snapshot_file_name(snapshot_id) + _TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, _header(snapshot_id, len(data), crc32c(data)))
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._install(tmp, snapshot_id, len(data))

    def _install(self, source: Path, snapshot_id: SnapshotId, length: int) -> None:
        """Rename a synced file into place and make the rename durable."""
        os.replace(source, self.path_of(snapshot_id))
        fsync_dir(self.directory)
        self._forget_fd(snapshot_id)  # a descriptor of a replaced file
        self._complete[snapshot_id] = length
        # Just written from bytes whose CRC we computed.
        self._verified.add(snapshot_id)

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        with self._lock:
            for old_fd, _ in self._retired.values():
                os.close(old_fd)
            self._retired.clear()
            removed = False
            for sid in [s for s in self._complete if s < snapshot_id]:
                fd = self._fds.pop(sid, None)
                if fd is not None:
                    self._retired[sid] = (fd, self._complete[sid])
                self.path_of(sid).unlink(missing_ok=True)
                self._deleted[sid] = None
                if len(self._deleted) > _DELETED_MEMORY:
                    del self._deleted[next(iter(self._deleted))]
                del self._complete[sid]
                self._verified.discard(sid)
                removed = True
            # A download of a newer snapshot may be under way: keep it.
            for sid in [s for s in self._partials if s <= snapshot_id]:
                self._partials.pop(sid).path.unlink(missing_ok=True)
                removed = True
            if removed:
                fsync_dir(self.directory)

    def partial_ids(self) -> list[SnapshotId]:
        """Snapshots being downloaded (for tests and status)."""
        with self._lock:
            return sorted(self._partials)

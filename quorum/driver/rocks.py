"""The log and the quorum state of a node in RocksDB, snapshots in files.

:class:`RocksStorage` is the :class:`~quorum.storage.NodeStorage` of a real
node.  Its directory holds::

    rocksdb/      one RocksDB database (rocksdict ``Rdict``, raw bytes mode)
    snapshots/    a FileSnapshotStore (see quorum.driver.snapshot_files)

Keys and values of the database:

* ``b"log:" + base_offset`` (8 bytes, unsigned big-endian, so keys sort as
  offsets do) -> one record batch, encoded by
  :func:`quorum.driver.codec.encode_batch` (version, CRC-32C, fields);
* ``b"quorum-state"`` -> :func:`quorum.driver.codec.encode_quorum_state`.

``persist(ready)`` is step 1 of the Ready contract: snapshot chunks first (a
finished snapshot is renamed into place and synced), then ONE RocksDB write
batch holding the log changes (clear, truncate, append, prefix delete) and the
quorum state, written with ``sync`` when ``ready.must_sync``, so the log and
the vote move together or not at all.  Older snapshots are deleted after that
write (the snapshot that replaces them is already durable).

Recovery on open.  RocksDB itself replays its write-ahead log with
``tolerate_corrupted_tail_records``: a write torn by a crash at the end of the
WAL is dropped, corruption anywhere else refuses to open.  Then every log
batch is decoded and its CRC checked, and the batches must be contiguous
(each starts where the previous ends, and sits under the key of its own base
offset).  At the first batch that fails:

* if no intact batch follows it, it and everything after it is a damaged
  *tail*: deleted (synced), and a warning on the ``kq.storage`` logger says
  which base offsets were dropped and why.  The node starts with the shorter
  log, as Kafka does when it truncates a corrupt segment tail;
* if an intact batch follows, the damage is in the *middle*: opening raises
  :class:`~quorum.storage.StorageCorruptError` naming the offsets, since no
  shorter log could be kept without silently losing data.

A corrupt quorum state also refuses to open, naming the key and database.

The power-loss test mode, :class:`PowerLossRocksStorage` (off unless a
process is started with it, ``server.storage_mode``): a write made without
``sync`` goes to RocksDB's memtable only (``disable_wal``), where reads see
it and a kill -9 drops it, as a power loss drops an unsynced WAL tail; the
next synced write or :meth:`RocksStorage.flush` first flushes the memtable
(which makes those writes durable, in order), so nothing synced is lost and
nothing unsynced survives a kill.

Threading: every method takes one lock, so the asyncio driver may call
``persist`` from a worker thread (``run_in_executor``); rocksdict releases the
GIL while RocksDB writes and syncs.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocksdict import (
    DBRecoveryMode,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from quorum.driver.codec import (
    decode_batch,
    decode_quorum_state,
    encode_batch,
    encode_quorum_state,
)
from quorum.driver.snapshot_files import FileSnapshotStore
from quorum.ready import Ready
from quorum.storage import SnapshotStore, StorageCorruptError
from quorum.types import Batch, QuorumState

__all__ = [
    "LOG_PREFIX",
    "STATE_KEY",
    "PowerLossRocksStorage",
    "RocksLogStore",
    "RocksQuorumStateStore",
    "RocksStorage",
    "StorageOpenError",
    "log_key",
]

log = logging.getLogger("kq.storage")

LOG_PREFIX = b"log:"
# The first key after every log key (b":" + 1 == b";").
_LOG_END = b"log;"
STATE_KEY = b"quorum-state"
ROCKSDB_DIR = "rocksdb"
SNAPSHOT_DIR = "snapshots"


class StorageOpenError(Exception):
    """The database could not be opened (in use, unreadable), for a reason
    other than corrupt data."""


def log_key(base_offset: int) -> bytes:
    return LOG_PREFIX + base_offset.to_bytes(8, "big")


def _describe_key(key: bytes) -> str:
    if key.startswith(LOG_PREFIX) and len(key) == len(LOG_PREFIX) + 8:
        return f"log key {key!r} (base offset {int.from_bytes(key[len(LOG_PREFIX) :], 'big')})"
    return f"key {key!r}"


class _LogIndex:
    """Base and end offsets of the stored batches, in order, to turn truncate
    and prefix-delete into key ranges without reading values."""

    def __init__(self, bases: list[int], ends: list[int]) -> None:
        self.bases = bases
        self.ends = ends

    @property
    def end_offset(self) -> int | None:
        return self.ends[-1] if self.ends else None

    def stage(self) -> _Staged:
        return _Staged(self)


class _Staged:
    """Log changes added to one RocksDB write batch, applied to the index by
    :meth:`commit` once the write succeeded.  The stored batches kept are
    ``index[lo:hi]`` followed by the new ones; nothing is copied until then."""

    def __init__(self, index: _LogIndex) -> None:
        self.index = index
        self.lo = 0
        self.hi = len(index.bases)
        self.new_bases: list[int] = []
        self.new_ends: list[int] = []

    def end_offset(self) -> int | None:
        if self.new_ends:
            return self.new_ends[-1]
        return self.index.ends[self.hi - 1] if self.hi > self.lo else None

    def clear(self, wb: WriteBatch) -> None:
        wb.delete_range(LOG_PREFIX, _LOG_END)
        self.lo = self.hi
        self.new_bases.clear()
        self.new_ends.clear()

    def truncate_to(self, wb: WriteBatch, end_offset: int) -> None:
        """Remove every batch whose end is past ``end_offset``."""
        ends = self.index.ends
        i = bisect.bisect_right(ends, end_offset, self.lo, self.hi)
        if i < self.hi:
            wb.delete_range(log_key(self.index.bases[i]), _LOG_END)
            self.hi = i
            self.new_bases.clear()
            self.new_ends.clear()
            return
        j = bisect.bisect_right(self.new_ends, end_offset)
        if j < len(self.new_ends):
            wb.delete_range(log_key(self.new_bases[j]), _LOG_END)
            del self.new_bases[j:]
            del self.new_ends[j:]

    def delete_before(self, wb: WriteBatch, start_offset: int) -> None:
        """Remove every batch that ends at or before ``start_offset``."""
        i = bisect.bisect_right(self.index.ends, start_offset, self.lo, self.hi)
        if i < self.hi:
            if i > self.lo:
                wb.delete_range(LOG_PREFIX, log_key(self.index.bases[i]))
                self.lo = i
            return
        j = bisect.bisect_right(self.new_ends, start_offset)
        if j == 0 and self.hi == self.lo:
            return  # nothing at or before start_offset
        if j < len(self.new_ends):
            wb.delete_range(LOG_PREFIX, log_key(self.new_bases[j]))
        else:
            wb.delete_range(LOG_PREFIX, _LOG_END)
        self.lo = self.hi
        del self.new_bases[:j]
        del self.new_ends[:j]

    def append(self, wb: WriteBatch, batches: Sequence[Batch]) -> None:
        for batch in batches:
            end = self.end_offset()
            if end is not None and batch.base_offset != end:
                raise ValueError(
                    f"batch at offset {batch.base_offset} does not continue the log ending at {end}"
                )
            wb.put(log_key(batch.base_offset), encode_batch(batch))
            self.new_bases.append(batch.base_offset)
            self.new_ends.append(batch.end_offset)

    def commit(self) -> None:
        for old, new in ((self.index.bases, self.new_bases), (self.index.ends, self.new_ends)):
            del old[self.hi :]
            del old[: self.lo]
            old.extend(new)


class RocksStorage:
    """A node's durable stores: log and quorum state in RocksDB, snapshots in
    files.  See the module docstring for the layout and recovery rules.

    ``snapshots`` replaces the default FileSnapshotStore in
    ``<path>/snapshots`` (tests).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, snapshots: SnapshotStore | None = None
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.db_path = self.path / ROCKSDB_DIR
        self._lock = threading.Lock()
        self._sync = WriteOptions()
        self._sync.sync = True
        self._nosync = WriteOptions()
        self._nosync.sync = False
        self._db = _open_db(self.db_path)
        try:
            self._index = self._recover_log()
            self._state = self._read_state()
            self._snapshots: SnapshotStore = (
                snapshots if snapshots is not None else FileSnapshotStore(self.path / SNAPSHOT_DIR)
            )
        except BaseException:
            self._db.close()
            raise
        self._log_store = RocksLogStore(self)
        self._state_store = RocksQuorumStateStore(self)
        self._closed = False

    # -- NodeStorage --------------------------------------------------------

    @property
    def log(self) -> RocksLogStore:
        return self._log_store

    @property
    def state(self) -> RocksQuorumStateStore:
        return self._state_store

    @property
    def snapshots(self) -> SnapshotStore:
        return self._snapshots

    def persist(self, ready: Ready) -> None:
        """Step 1 of the Ready contract (see :mod:`quorum.ready`), in its order."""
        with self._lock:
            self._check_open()
            for chunk in ready.snapshot_chunks:
                self._snapshots.write_chunk(chunk.snapshot_id, chunk.position, chunk.data)
                if chunk.done:
                    self._snapshots.finish(chunk.snapshot_id)
            staged = self._index.stage()
            wb = WriteBatch(raw_mode=True)
            if ready.reset_to_snapshot is not None:
                staged.clear(wb)
            if ready.truncate_to is not None:
                staged.truncate_to(wb, ready.truncate_to)
            if ready.entries:
                staged.append(wb, ready.entries)
            if ready.compact_to is not None:
                staged.delete_before(wb, ready.compact_to.end_offset)
            state = self._state
            if ready.quorum_state is not None:
                state = ready.quorum_state
                wb.put(STATE_KEY, encode_quorum_state(state))
            self._write(wb, sync=ready.must_sync)
            staged.commit()
            self._state = state
            if ready.compact_to is not None:
                # After the log write: the snapshot replacing these is durable.
                self._snapshots.delete_before(ready.compact_to)

    def flush(self) -> None:
        """Make every write so far durable (sync RocksDB's write-ahead log)."""
        with self._lock:
            self._check_open()
            self._db.flush_wal(True)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
                if isinstance(self._snapshots, FileSnapshotStore):
                    self._snapshots.close()

    def __enter__(self) -> RocksStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageOpenError(f"storage at {self.path} is closed")

    def _write(self, wb: WriteBatch, *, sync: bool) -> None:
        if wb.len() > 0:
            self._db.write(wb, self._sync if sync else self._nosync)
        elif sync:
            # Nothing new, but earlier unsynced writes must become durable.
            self._db.flush_wal(True)

    def _iter_log(self) -> Iterator[tuple[bytes, bytes]]:
        try:
            for key, value in self._db.items(from_key=LOG_PREFIX):
                if not isinstance(key, bytes) or not key.startswith(LOG_PREFIX):
                    break
                if not isinstance(value, bytes):
                    raise StorageCorruptError(
                        f"{_describe_key(key)} in {self.db_path} holds a "
                        f"{type(value).__name__}, not bytes"
                    )
                yield key, value
        except StorageCorruptError:
            raise
        except Exception as exc:  # RocksDB reports a bad block as a plain Exception
            raise StorageCorruptError(f"cannot read the log in {self.db_path}: {exc}") from exc

    def _decode_entry(self, key: bytes, value: bytes, expected_base: int | None) -> Batch:
        """Decode one stored batch, checking its CRC, key and continuity."""
        where = f"{_describe_key(key)} in {self.db_path}"
        if len(key) != len(LOG_PREFIX) + 8:
            raise StorageCorruptError(f"malformed log key {key!r} in {self.db_path}")
        batch = decode_batch(value, where)
        key_base = int.from_bytes(key[len(LOG_PREFIX) :], "big")
        if batch.base_offset != key_base:
            raise StorageCorruptError(
                f"record batch at {where} starts at offset {batch.base_offset}, not {key_base}"
            )
        if expected_base is not None and batch.base_offset != expected_base:
            raise StorageCorruptError(
                f"record batch at {where} is not contiguous: the log before it ends at "
                f"offset {expected_base}"
            )
        return batch

    def _recover_log(self) -> _LogIndex:
        """Scan the log; drop a damaged tail, refuse damage in the middle."""
        bases: list[int] = []
        ends: list[int] = []
        bad_key: bytes | None = None
        bad_reason = ""
        dropped: list[tuple[bytes, str]] = []
        for key, value in self._iter_log():
            if bad_key is None:
                try:
                    batch = self._decode_entry(key, value, ends[-1] if ends else None)
                except StorageCorruptError as exc:
                    bad_key, bad_reason = key, str(exc)
                    dropped.append((key, bad_reason))
                    continue
                bases.append(batch.base_offset)
                ends.append(batch.end_offset)
                continue
            # After a damaged batch: only more damage may follow.
            try:
                intact = decode_batch(value, _describe_key(key))
            except StorageCorruptError as exc:
                dropped.append((key, str(exc)))
                continue
            raise StorageCorruptError(
                f"the log in {self.db_path} is corrupt in the middle: {bad_reason}; "
                f"yet an intact batch follows it at offsets {intact.base_offset}.."
                f"{intact.last_offset} (epoch {intact.epoch}). Refusing to start rather than "
                "drop committed data: restore the data directory, or remove it and let the "
                "node catch up from the leader"
            )
        if dropped:
            wb = WriteBatch(raw_mode=True)
            wb.delete_range(dropped[0][0], _LOG_END)
            self._db.write(wb, self._sync)
            end = ends[-1] if ends else None
            log.warning(
                "dropped a damaged log tail in %s: %d batch(es) at base offsets %s; the "
                "log now ends at offset %s. Reasons: %s",
                self.db_path,
                len(dropped),
                ", ".join(
                    str(int.from_bytes(k[len(LOG_PREFIX) :], "big"))
                    if len(k) == len(LOG_PREFIX) + 8
                    else repr(k)
                    for k, _ in dropped
                ),
                "(empty log)" if end is None else end,
                "; ".join(reason for _, reason in dropped),
            )
        return _LogIndex(bases, ends)

    def _read_state(self) -> QuorumState | None:
        try:
            value = self._db.get(STATE_KEY)
        except Exception as exc:
            raise StorageCorruptError(
                f"cannot read the quorum state (key {STATE_KEY!r}) in {self.db_path}: {exc}"
            ) from exc
        if value is None:
            return None
        if not isinstance(value, bytes):
            raise StorageCorruptError(
                f"quorum state (key {STATE_KEY!r}) in {self.db_path} is not bytes"
            )
        return decode_quorum_state(
            value, f"key {STATE_KEY!r} in {self.db_path}; refusing to start with an unknown vote"
        )

    def _read_all(self) -> list[Batch]:
        batches: list[Batch] = []
        for key, value in self._iter_log():
            batch = self._decode_entry(key, value, batches[-1].end_offset if batches else None)
            batches.append(batch)
        return batches


class PowerLossRocksStorage(RocksStorage):
    """A :class:`RocksStorage` in which a kill -9 of the process drops
    every write not synced (the power-loss test mode; module docstring).

    RocksDB writes an unsynced write's WAL record to the OS at once, where
    a kill keeps it; here it skips the WAL instead and stays in the
    memtable until the next sync flushes the memtable (an SST file, synced
    by RocksDB).  The quorum core syncs every log append and vote
    (``Ready.must_sync``), so in a correct build only a compaction
    (``compact_to``) is ever held."""

    def __init__(
        self, path: str | os.PathLike[str], *, snapshots: SnapshotStore | None = None
    ) -> None:
        self._memtable_only = WriteOptions()
        self._memtable_only.sync = False
        # A property at run time; rocksdict's stub declares it a method.
        self._memtable_only.disable_wal = True  # type: ignore[method-assign,assignment]
        # Whether the memtable holds writes that skipped the WAL.
        self._held = False
        super().__init__(path, snapshots=snapshots)

    def _write(self, wb: WriteBatch, *, sync: bool) -> None:
        if not sync:
            if wb.len() > 0:
                self._db.write(wb, self._memtable_only)
                self._held = True
            return
        self._make_held_durable()
        super()._write(wb, sync=True)

    def _make_held_durable(self) -> None:
        if self._held:
            # A memtable flush writes the held writes (and every one before
            # them) into a synced SST file before the synced write that
            # follows them, so a crash keeps them in order.
            self._db.flush(True)
            self._held = False

    def flush(self) -> None:
        with self._lock:
            self._check_open()
            self._make_held_durable()
            self._db.flush_wal(True)

    def close(self) -> None:
        # A clean stop keeps what a process that exits leaves to the OS.
        with self._lock:
            if not self._closed:
                self._make_held_durable()
        super().close()


class RocksLogStore:
    """The :class:`~quorum.storage.LogStore` view of a :class:`RocksStorage`.

    Each mutating call is its own unsynced RocksDB write; :meth:`flush` syncs.
    """

    def __init__(self, storage: RocksStorage) -> None:
        self._s = storage

    def read_all(self) -> list[Batch]:
        """Every batch in offset order, each CRC-checked (raises
        StorageCorruptError on damage found after open)."""
        with self._s._lock:
            self._s._check_open()
            return self._s._read_all()

    def _apply(self, op: str, arg: object) -> None:
        with self._s._lock:
            self._s._check_open()
            staged = self._s._index.stage()
            wb = WriteBatch(raw_mode=True)
            if op == "append":
                assert isinstance(arg, Sequence)
                staged.append(wb, arg)
            elif op == "truncate":
                assert isinstance(arg, int)
                staged.truncate_to(wb, arg)
            elif op == "delete_before":
                assert isinstance(arg, int)
                staged.delete_before(wb, arg)
            else:
                staged.clear(wb)
            self._s._write(wb, sync=False)
            staged.commit()

    def append(self, batches: Sequence[Batch]) -> None:
        self._apply("append", batches)

    def truncate_to(self, end_offset: int) -> None:
        self._apply("truncate", end_offset)

    def delete_before(self, start_offset: int) -> None:
        self._apply("delete_before", start_offset)

    def clear(self) -> None:
        self._apply("clear", None)

    def flush(self) -> None:
        self._s.flush()

    def end_offset(self) -> int:
        """End offset of the stored log (0 if empty)."""
        with self._s._lock:
            end = self._s._index.end_offset
            return 0 if end is None else end


class RocksQuorumStateStore:
    """The :class:`~quorum.storage.QuorumStateStore` view of a :class:`RocksStorage`."""

    def __init__(self, storage: RocksStorage) -> None:
        self._s = storage

    def read(self) -> QuorumState | None:
        with self._s._lock:
            return self._s._state

    def write(self, state: QuorumState) -> None:
        with self._s._lock:
            self._s._check_open()
            wb = WriteBatch(raw_mode=True)
            wb.put(STATE_KEY, encode_quorum_state(state))
            self._s._write(wb, sync=False)
            self._s._state = state

    def flush(self) -> None:
        self._s.flush()


def _open_db(path: Path) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    # Check every block checksum RocksDB keeps, and refuse to open on WAL
    # damage anywhere but a torn last record.
    options.set_paranoid_checks(True)
    options.set_wal_recovery_mode(DBRecoveryMode.tolerate_corrupted_tail_records())
    try:
        return Rdict(str(path), options)
    except Exception as exc:
        text = str(exc)
        if "Corruption" in text:
            raise StorageCorruptError(
                f"RocksDB in {path} is corrupt and cannot be opened: {text}"
            ) from exc
        if "lock" in text.lower():
            raise StorageOpenError(
                f"RocksDB in {path} is in use (another kq process, or already open in "
                f"this one): {text}"
            ) from exc
        raise StorageOpenError(f"cannot open RocksDB in {path}: {text}") from exc

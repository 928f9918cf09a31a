"""The narrow storage ports of the core, as ``typing.Protocol``s.

From the core's point of view the stores are read at start-up (and the
snapshot store when serving FetchSnapshot); every write is made by the driver
while it carries out a ``Ready`` (see :mod:`quorum.ready`).  Each port has an
in-memory twin in :mod:`quorum.memory` that can lose unflushed writes on a
simulated crash.

Ownership: lists returned by ``read_all``/``batches`` belong to the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from quorum.ready import Ready
from quorum.types import Batch, QuorumState, SnapshotId

__all__ = [
    "LogStore",
    "NodeStorage",
    "QuorumStateStore",
    "SnapshotStore",
    "StorageCorruptError",
]


class StorageCorruptError(Exception):
    """Stored data failed a check (bad checksum, impossible shape)."""


class LogStore(Protocol):
    """The durable log of record batches.

    Writes are visible to reads at once but durable only after :meth:`flush`;
    a crash may lose any suffix of the unflushed writes.
    """

    def read_all(self) -> list[Batch]:
        """Every retained batch in offset order."""
        ...

    def append(self, batches: Sequence[Batch]) -> None:
        """Append batches that continue the log."""
        ...

    def truncate_to(self, end_offset: int) -> None:
        """Remove every batch that reaches past ``end_offset``."""
        ...

    def delete_before(self, start_offset: int) -> None:
        """Remove every batch that ends at or before ``start_offset``."""
        ...

    def clear(self) -> None:
        """Remove every batch (a follower replaced its log by a snapshot)."""
        ...

    def flush(self) -> None:
        """Make every write so far durable (fsync)."""
        ...


class QuorumStateStore(Protocol):
    """The durable election state (Kafka's ``quorum-state`` file)."""

    def read(self) -> QuorumState | None: ...

    def write(self, state: QuorumState) -> None: ...

    def flush(self) -> None: ...


class SnapshotStore(Protocol):
    """Snapshots named by :class:`SnapshotId`, each an opaque byte string.

    A snapshot is either complete or absent: chunks written with
    :meth:`write_chunk` become visible only after :meth:`finish`, which is
    atomic and durable (KIP-630: a partial snapshot is never loaded).
    """

    def latest(self) -> SnapshotId | None: ...

    def size(self, snapshot_id: SnapshotId) -> int | None:
        """Size in bytes, or None if there is no such complete snapshot."""
        ...

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes: ...

    def write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None: ...

    def finish(self, snapshot_id: SnapshotId) -> None: ...

    def create(self, snapshot_id: SnapshotId, data: bytes) -> None:
        """Write a whole snapshot at once, atomically and durably."""
        ...

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        """Remove complete snapshots older than ``snapshot_id`` and partial
        ones not newer than it."""
        ...


class NodeStorage(Protocol):
    """The three stores of one node, and step 1 of the Ready contract.

    ``persist`` writes everything a Ready asks to persist in the contract's
    order; the log and quorum-state changes go in one atomic write (a single
    RocksDB write batch on disk), made durable before it returns when
    ``ready.must_sync`` is set.  Snapshot chunks are written first, each
    finished snapshot atomically.
    """

    @property
    def log(self) -> LogStore: ...

    @property
    def state(self) -> QuorumStateStore: ...

    @property
    def snapshots(self) -> SnapshotStore: ...

    def persist(self, ready: Ready) -> None: ...

"""In-memory twins of the storage ports, for tests and the simulator.

Each twin keeps what has been flushed apart from what has only been written,
so :meth:`crash` can lose unflushed writes the way a killed process loses its
page cache.  ``lose`` chooses how much: all unflushed writes (the default, the
worst case) or, with an injected ``random.Random``, a random prefix of them
survives, as with a torn write.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quorum.ready import Ready
from quorum.types import Batch, QuorumState, SnapshotId

__all__ = ["MemoryLogStore", "MemoryQuorumStateStore", "MemorySnapshotStore", "MemoryStores"]


class MemoryLogStore:
    """A log whose writes are journaled until :meth:`flush`."""

    def __init__(self) -> None:
        self._durable: list[Batch] = []
        # Operations written since the last flush, in order.
        self._journal: list[Callable[[list[Batch]], None]] = []
        self._durable_bases: list[int] | None = None
        self.flushes = 0

    def _view(self) -> list[Batch]:
        view = list(self._durable)
        for op in self._journal:
            op(view)
        return view

    def read_all(self) -> list[Batch]:
        return self._view()

    def durable_batches(self) -> list[Batch]:
        """What would survive a crash now."""
        return list(self._durable)

    def durable_end_offset(self) -> int:
        return self._durable[-1].end_offset if self._durable else 0

    def durable_epoch_of_end(self, end_offset: int) -> int | None:
        """Epoch of the durable batch holding ``end_offset - 1``, if any."""
        if self._durable_bases is None:
            self._durable_bases = [b.base_offset for b in self._durable]
        i = bisect.bisect_right(self._durable_bases, end_offset - 1) - 1
        if i < 0 or self._durable[i].end_offset < end_offset:
            return None
        return self._durable[i].epoch

    def append(self, batches: Sequence[Batch]) -> None:
        copy = list(batches)
        self._journal.append(lambda view: view.extend(copy))

    def truncate_to(self, end_offset: int) -> None:
        def op(view: list[Batch]) -> None:
            view[:] = [b for b in view if b.end_offset <= end_offset]

        self._journal.append(op)

    def delete_before(self, start_offset: int) -> None:
        def op(view: list[Batch]) -> None:
            view[:] = [b for b in view if b.end_offset > start_offset]

        self._journal.append(op)

    def clear(self) -> None:
        self._journal.append(lambda view: view.clear())

    def flush(self) -> None:
        if self._journal:
            self._durable = self._view()
            self._journal.clear()
            self._durable_bases = None
        self.flushes += 1

    def crash(self, rng: random.Random | None = None) -> None:
        """Lose unflushed writes: all of them, or a random suffix of them."""
        keep = rng.randint(0, len(self._journal)) if rng and self._journal else 0
        for op in self._journal[:keep]:
            op(self._durable)
        self._journal.clear()
        self._durable_bases = None


class MemoryQuorumStateStore:
    def __init__(self) -> None:
        self._durable: QuorumState | None = None
        self._written: QuorumState | None = None
        self._dirty = False
        self.flushes = 0

    def read(self) -> QuorumState | None:
        return self._written if self._dirty else self._durable

    def durable(self) -> QuorumState | None:
        return self._durable

    def write(self, state: QuorumState) -> None:
        self._written = state
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self._durable = self._written
            self._dirty = False
        self.flushes += 1

    def crash(self, rng: random.Random | None = None) -> None:
        if self._dirty and rng is not None and rng.random() < 0.5:
            self._durable = self._written
        self._dirty = False
        self._written = None


class MemorySnapshotStore:
    """Complete snapshots are durable at once (``finish``/``create`` stand for
    write + fsync + rename); partial ones vanish on a crash."""

    def __init__(self) -> None:
        self._complete: dict[SnapshotId, bytes] = {}
        self._partial: dict[SnapshotId, bytearray] = {}

    def latest(self) -> SnapshotId | None:
        return max(self._complete) if self._complete else None

    def size(self, snapshot_id: SnapshotId) -> int | None:
        data = self._complete.get(snapshot_id)
        return None if data is None else len(data)

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        return self._complete[snapshot_id][position : position + max_bytes]

    def write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None:
        if position == 0:
            self._partial[snapshot_id] = bytearray()  # a download starting over
        buf = self._partial.setdefault(snapshot_id, bytearray())
        if position != len(buf):
            raise ValueError(
                f"snapshot {snapshot_id} chunk at position {position}, expected {len(buf)}"
            )
        buf.extend(data)

    def finish(self, snapshot_id: SnapshotId) -> None:
        if snapshot_id not in self._partial:
            raise ValueError(f"snapshot {snapshot_id} has no chunks written to finish")
        self._complete[snapshot_id] = bytes(self._partial.pop(snapshot_id))

    def create(self, snapshot_id: SnapshotId, data: bytes) -> None:
        self._complete[snapshot_id] = bytes(data)

    def get(self, snapshot_id: SnapshotId) -> bytes:
        return self._complete[snapshot_id]

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        for sid in [s for s in self._complete if s < snapshot_id]:
            del self._complete[sid]
        # A download of a newer snapshot may be under way: keep it.
        for sid in [s for s in self._partial if s <= snapshot_id]:
            del self._partial[sid]

    def crash(self, rng: random.Random | None = None) -> None:
        self._partial.clear()


@dataclass(slots=True)
class MemoryStores:
    """The three stores of one node, crashed together."""

    log: MemoryLogStore
    state: MemoryQuorumStateStore
    snapshots: MemorySnapshotStore

    @classmethod
    def new(cls) -> MemoryStores:
        return cls(MemoryLogStore(), MemoryQuorumStateStore(), MemorySnapshotStore())

    def crash(self, rng: random.Random | None = None) -> None:
        self.log.crash(rng)
        self.state.crash(rng)
        self.snapshots.crash(rng)

    def persist(self, ready: Ready) -> None:
        """Step 1 of the Ready contract (see :mod:`quorum.ready`), in its order."""
        for chunk in ready.snapshot_chunks:
            self.snapshots.write_chunk(chunk.snapshot_id, chunk.position, chunk.data)
            if chunk.done:
                self.snapshots.finish(chunk.snapshot_id)
        if ready.reset_to_snapshot is not None:
            self.log.clear()
        if ready.truncate_to is not None:
            self.log.truncate_to(ready.truncate_to)
        if ready.entries:
            self.log.append(ready.entries)
        if ready.compact_to is not None:
            self.log.delete_before(ready.compact_to.end_offset)
            self.snapshots.delete_before(ready.compact_to)
        if ready.quorum_state is not None:
            self.state.write(ready.quorum_state)
        if ready.must_sync:
            self.log.flush()
            self.state.flush()

"""The core's view of the replicated log: a snapshot plus contiguous batches.

The core keeps the whole retained log in memory (the metadata log is bounded
by snapshots and prefix truncation, KIP-630); the driver persists the same
changes through :class:`quorum.storage.LogStore` as the ``Ready`` contract
tells it to.  This module only tracks offsets and epochs; it decides nothing.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from quorum.types import Batch, OffsetAndEpoch, SnapshotId

__all__ = ["LogError", "RaftLog"]


class LogError(Exception):
    """A change that would break the log's shape (a gap, an overlap)."""


class RaftLog:
    """Batches ``[start_offset, end_offset)`` on top of an optional snapshot.

    Invariants (checked by :meth:`check_invariants`):
    - batches are contiguous: each begins at the previous one's end offset;
    - the first batch begins at ``start_offset``, which equals the snapshot's
      end offset when there is a snapshot, and 0 otherwise;
    - epochs never decrease along the log, and the first batch's epoch is at
      least the snapshot's epoch.
    """

    __slots__ = ("_bases", "_batches", "_epoch_starts", "_snapshot", "_start")

    def __init__(self, snapshot: SnapshotId | None = None, batches: Iterable[Batch] = ()) -> None:
        self._snapshot = snapshot
        self._start = snapshot.end_offset if snapshot else 0
        self._batches: list[Batch] = []
        self._bases: list[int] = []
        # (epoch, first offset of that epoch), one per epoch present in the
        # batches: Kafka's leader-epoch cache, used for divergence detection.
        self._epoch_starts: list[tuple[int, int]] = []
        self.append(list(batches))

    # -- reading ---------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._batches[-1].end_offset if self._batches else self._start

    @property
    def snapshot(self) -> SnapshotId | None:
        return self._snapshot

    @property
    def last_epoch(self) -> int:
        if self._batches:
            return self._batches[-1].epoch
        return self._snapshot.epoch if self._snapshot else 0

    def last_offset_and_epoch(self) -> OffsetAndEpoch:
        return OffsetAndEpoch(self.last_epoch, self.end_offset)

    def batches(self) -> Sequence[Batch]:
        return self._batches

    def __len__(self) -> int:
        return len(self._batches)

    def _index_of(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (which must be retained)."""
        return bisect.bisect_right(self._bases, offset) - 1

    def epoch_of_end(self, end_offset: int) -> int | None:
        """Epoch of the batch holding offset ``end_offset - 1``: the epoch a
        log ending at ``end_offset`` would report.  None if not retained."""
        if end_offset == self._start:
            return self._snapshot.epoch if self._snapshot else 0
        if end_offset < self._start or end_offset > self.end_offset:
            return None
        return self._batches[self._index_of(end_offset - 1)].epoch

    def batch_ending_at(self, end_offset: int) -> bool:
        """Whether ``end_offset`` is a batch boundary of the retained log."""
        if end_offset == self._start:
            return True
        i = self._index_of(end_offset - 1)
        return 0 <= i < len(self._batches) and self._batches[i].end_offset == end_offset

    def read(self, from_offset: int, max_bytes: int) -> tuple[Batch, ...]:
        """Batches from the one holding ``from_offset``, at least one, up to
        ``max_bytes``."""
        if from_offset < self._start or from_offset >= self.end_offset:
            return ()
        i = self._index_of(from_offset)
        out: list[Batch] = []
        size = 0
        for batch in self._batches[i:]:
            size += batch.size_bytes
            if out and size > max_bytes:
                break
            out.append(batch)
        return tuple(out)

    def between(self, from_offset: int, to_end_offset: int) -> tuple[Batch, ...]:
        """Batches with ``from_offset <= base`` and ``end <= to_end_offset``."""
        if from_offset >= to_end_offset or from_offset >= self.end_offset:
            return ()
        i = max(0, bisect.bisect_left(self._bases, from_offset))
        j = bisect.bisect_right(self._bases, to_end_offset - 1)
        return tuple(b for b in self._batches[i:j] if b.end_offset <= to_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch ``e <= epoch`` in this log and the end offset of
        ``e`` (where the next epoch begins, or the log end).

        The snapshot's epoch counts as present, ending at the log start.  If
        no such epoch exists the answer is epoch 0 at the log start.
        """
        i = bisect.bisect_right(self._epoch_starts, (epoch, float("inf"))) - 1
        if i < 0:
            if self._snapshot is not None and self._snapshot.epoch <= epoch:
                return OffsetAndEpoch(self._snapshot.epoch, self._start)
            return OffsetAndEpoch(0, self._start)
        found_epoch = self._epoch_starts[i][0]
        if i + 1 < len(self._epoch_starts):
            return OffsetAndEpoch(found_epoch, self._epoch_starts[i + 1][1])
        return OffsetAndEpoch(found_epoch, self.end_offset)

    # -- changing --------------------------------------------------------

    def append(self, batches: Sequence[Batch]) -> None:
        """Append ``batches`` in order: all of them, or (on LogError) none."""
        end, last_epoch = self.end_offset, self.last_epoch
        for batch in batches:
            if not batch.records:
                raise LogError(f"empty batch at offset {batch.base_offset}")
            if batch.base_offset != end:
                raise LogError(
                    f"batch at offset {batch.base_offset} does not follow the log end offset {end}"
                )
            if batch.epoch < last_epoch:
                raise LogError(
                    f"batch at offset {batch.base_offset} has epoch {batch.epoch}, below "
                    f"the log's last epoch {last_epoch}"
                )
            end, last_epoch = batch.end_offset, batch.epoch
        for batch in batches:
            if not self._epoch_starts or self._epoch_starts[-1][0] != batch.epoch:
                self._epoch_starts.append((batch.epoch, batch.base_offset))
            self._batches.append(batch)
            self._bases.append(batch.base_offset)

    def truncate_to(self, end_offset: int) -> int:
        """Drop every batch that reaches past ``end_offset``; returns the new
        end offset (at most ``end_offset``: a batch is never split)."""
        if end_offset >= self.end_offset:
            return self.end_offset
        if end_offset < self._start:
            raise LogError(f"cannot truncate to {end_offset}, below the log start {self._start}")
        if end_offset == self._start:
            i = 0
        else:
            k = self._index_of(end_offset - 1)
            # A batch straddling end_offset goes too: batches are never split.
            i = k + 1 if self._batches[k].end_offset == end_offset else k
        del self._batches[i:]
        del self._bases[i:]
        self._rebuild_epochs()
        return self.end_offset

    def compact_to(self, snapshot: SnapshotId) -> None:
        """Forget the prefix covered by ``snapshot`` (KIP-630 log start advance)."""
        if snapshot.end_offset < self._start:
            raise LogError(f"snapshot {snapshot} is older than the log start {self._start}")
        if snapshot.end_offset > self.end_offset:
            raise LogError(f"snapshot {snapshot} reaches past the log end {self.end_offset}")
        if not self.batch_ending_at(snapshot.end_offset):
            raise LogError(f"snapshot {snapshot} does not end at a batch boundary")
        if self.epoch_of_end(snapshot.end_offset) != snapshot.epoch:
            raise LogError(
                f"snapshot {snapshot} disagrees with the log's epoch "
                f"{self.epoch_of_end(snapshot.end_offset)} at that offset"
            )
        i = bisect.bisect_left(self._bases, snapshot.end_offset)
        del self._batches[:i]
        del self._bases[:i]
        self._snapshot = snapshot
        self._start = snapshot.end_offset
        self._rebuild_epochs()

    def reset_to(self, snapshot: SnapshotId) -> None:
        """Replace the whole log by ``snapshot`` (a follower installing one)."""
        self._batches.clear()
        self._bases.clear()
        self._epoch_starts.clear()
        self._snapshot = snapshot
        self._start = snapshot.end_offset

    def _rebuild_epochs(self) -> None:
        self._epoch_starts = []
        for batch in self._batches:
            if not self._epoch_starts or self._epoch_starts[-1][0] != batch.epoch:
                self._epoch_starts.append((batch.epoch, batch.base_offset))

    def check_invariants(self) -> None:
        expect = self._start
        last_epoch = self._snapshot.epoch if self._snapshot else 0
        for batch in self._batches:
            assert batch.base_offset == expect, f"gap or overlap at {batch.base_offset}"
            assert batch.epoch >= last_epoch, f"epoch goes back at {batch.base_offset}"
            expect = batch.end_offset
            last_epoch = batch.epoch
        assert self._bases == [b.base_offset for b in self._batches]

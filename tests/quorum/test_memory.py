"""The in-memory store twins: what survives a simulated crash."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from quorum.memory import (
    MemoryLogStore,
    MemoryQuorumStateStore,
    MemorySnapshotStore,
    MemoryStores,
)
from quorum.types import Batch, QuorumState, SnapshotId
from tests.quorum.core_driver import batch, batches_of

LogOp = Callable[[MemoryLogStore], None]


def ends(batches: list[Batch]) -> list[int]:
    return [b.end_offset for b in batches]


def flushed_log(*spec: tuple[int, int]) -> MemoryLogStore:
    store = MemoryLogStore()
    store.append(batches_of(*spec))
    store.flush()
    return store


# -- log store ------------------------------------------------------------------

# Each case: an unflushed operation on a flushed log of [0,2) [2,5) [5,6),
# and the batch end offsets visible before the crash.
UNFLUSHED: list[tuple[str, LogOp, list[int]]] = [
    ("append", lambda s: s.append([batch(6, 2, 2)]), [2, 5, 6, 8]),
    ("truncate", lambda s: s.truncate_to(5), [2, 5]),
    ("truncate-mid-batch", lambda s: s.truncate_to(4), [2]),
    ("delete_before", lambda s: s.delete_before(5), [6]),
    ("delete_before-mid-batch", lambda s: s.delete_before(3), [5, 6]),
    ("clear", lambda s: s.clear(), []),
]


@pytest.mark.parametrize(("name", "op", "visible"), UNFLUSHED, ids=[c[0] for c in UNFLUSHED])
def test_log_unflushed_write_visible_then_lost_on_crash(
    name: str, op: LogOp, visible: list[int]
) -> None:
    store = flushed_log((1, 2), (1, 3), (2, 1))
    op(store)
    assert ends(store.read_all()) == visible
    assert ends(store.durable_batches()) == [2, 5, 6]
    store.crash()
    assert ends(store.read_all()) == [2, 5, 6]


@pytest.mark.parametrize(("name", "op", "visible"), UNFLUSHED, ids=[c[0] for c in UNFLUSHED])
def test_log_flushed_write_survives_crash(name: str, op: LogOp, visible: list[int]) -> None:
    store = flushed_log((1, 2), (1, 3), (2, 1))
    op(store)
    store.flush()
    assert ends(store.durable_batches()) == visible
    store.crash(random.Random(1))
    assert ends(store.read_all()) == visible


def test_log_crash_loses_only_what_came_after_the_last_flush() -> None:
    store = MemoryLogStore()
    store.append([batch(0, 1, 2)])
    store.flush()
    store.append([batch(2, 1, 2)])
    store.flush()
    store.truncate_to(2)
    store.append([batch(2, 2, 5)])
    assert ends(store.read_all()) == [2, 7]
    store.crash()
    assert ends(store.read_all()) == [2, 4]
    assert [b.epoch for b in store.read_all()] == [1, 1]


def test_log_flush_counts_and_read_all_returns_a_copy() -> None:
    store = flushed_log((1, 2))
    assert store.flushes == 1
    store.flush()
    assert store.flushes == 2
    view = store.read_all()
    view.clear()
    assert ends(store.read_all()) == [2]
    durable = store.durable_batches()
    durable.clear()
    assert ends(store.durable_batches()) == [2]


def test_log_crash_with_rng_keeps_a_prefix_of_the_journal() -> None:
    """A torn write: some prefix of the unflushed operations survives, in
    order, and over many seeds every prefix length occurs."""
    ops: list[LogOp] = [  # every prefix leaves a different log
        lambda s: s.append([batch(2, 1, 1)]),
        lambda s: s.append([batch(3, 2, 1)]),
        lambda s: s.delete_before(2),
        lambda s: s.truncate_to(3),
        lambda s: s.append([batch(3, 3, 2)]),
    ]
    # The expected log after applying the first k operations, for each k.
    prefixes = []
    for k in range(len(ops) + 1):
        ref = flushed_log((1, 2))
        for op in ops[:k]:
            op(ref)
        ref.flush()
        prefixes.append(ref.read_all())
    seen: set[int] = set()
    for seed in range(200):
        store = flushed_log((1, 2))
        for op in ops:
            op(store)
        store.crash(random.Random(seed))
        got = store.read_all()
        assert got in prefixes, f"seed {seed}: {got} is not a prefix of the journal"
        assert got == store.durable_batches()
        seen.add(prefixes.index(got))
        # The journal is gone: a second crash changes nothing.
        store.crash(random.Random(seed + 1))
        assert store.read_all() == got
    assert seen == set(range(len(ops) + 1))


def test_log_crash_without_rng_loses_every_unflushed_write() -> None:
    for _ in range(3):
        store = flushed_log((1, 2))
        store.append([batch(2, 1, 1)])
        store.crash(None)
        assert ends(store.read_all()) == [2]


@pytest.mark.parametrize(
    ("end", "want"),
    [(0, None), (1, 1), (2, 1), (3, 2), (5, 2), (6, 4), (7, None), (99, None)],
)
def test_log_durable_epoch_of_end(end: int, want: int | None) -> None:
    store = flushed_log((1, 2), (2, 3), (4, 1))
    store.append([batch(6, 5, 2)])  # not durable: not counted
    assert store.durable_epoch_of_end(end) == want
    store.flush()
    assert store.durable_epoch_of_end(end) == (5 if end == 7 else want)


def test_log_durable_epoch_of_end_follows_flushes_and_crashes() -> None:
    store = flushed_log((1, 2))
    assert store.durable_epoch_of_end(2) == 1
    store.truncate_to(0)
    store.append([batch(0, 3, 2)])
    assert store.durable_epoch_of_end(2) == 1
    store.flush()
    assert store.durable_epoch_of_end(2) == 3
    store.append([batch(2, 4, 1)])
    store.crash()
    assert store.durable_epoch_of_end(3) is None
    assert store.durable_epoch_of_end(2) == 3


# -- quorum state store -----------------------------------------------------------


def test_state_unflushed_write_lost_on_crash() -> None:
    store = MemoryQuorumStateStore()
    assert store.read() is None
    store.write(QuorumState(1, 2, None))
    assert store.read() == QuorumState(1, 2, None)
    assert store.durable() is None
    store.crash()
    assert store.read() is None


def test_state_flushed_write_survives_and_later_one_is_lost() -> None:
    store = MemoryQuorumStateStore()
    store.write(QuorumState(1, 2, None))
    store.flush()
    store.write(QuorumState(2, None, 3))
    assert store.read() == QuorumState(2, None, 3)
    assert store.durable() == QuorumState(1, 2, None)
    store.crash()
    assert store.read() == QuorumState(1, 2, None)
    assert store.flushes == 1


def test_state_crash_with_rng_keeps_old_or_new_never_other() -> None:
    outcomes = set()
    for seed in range(100):
        store = MemoryQuorumStateStore()
        store.write(QuorumState(1, 2, None))
        store.flush()
        store.write(QuorumState(2, None, 3))
        store.crash(random.Random(seed))
        outcomes.add(store.read())
        assert store.read() == store.durable()
    assert outcomes == {QuorumState(1, 2, None), QuorumState(2, None, 3)}


def test_state_crash_after_flush_keeps_state() -> None:
    store = MemoryQuorumStateStore()
    store.write(QuorumState(4, None, 1))
    store.flush()
    store.crash(random.Random(0))
    assert store.read() == QuorumState(4, None, 1)


# -- snapshot store ---------------------------------------------------------------

S1 = SnapshotId(10, 1)
S2 = SnapshotId(20, 2)
S3 = SnapshotId(30, 2)


def test_snapshot_partial_invisible_until_finish() -> None:
    store = MemorySnapshotStore()
    store.write_chunk(S1, 0, b"abc")
    store.write_chunk(S1, 3, b"de")
    assert store.latest() is None
    assert store.size(S1) is None
    with pytest.raises(KeyError):
        store.read(S1, 0, 10)
    store.finish(S1)
    assert store.latest() == S1
    assert store.size(S1) == 5
    assert store.read(S1, 1, 3) == b"bcd"
    assert store.read(S1, 4, 100) == b"e"
    assert store.get(S1) == b"abcde"


def test_snapshot_partial_vanishes_on_crash_complete_ones_stay() -> None:
    store = MemorySnapshotStore()
    store.create(S1, b"one")
    store.write_chunk(S2, 0, b"two")
    store.crash()
    assert store.latest() == S1
    # The partial is gone: continuing it at position 3 is refused.
    with pytest.raises(ValueError, match="expected 0"):
        store.write_chunk(S2, 3, b"more")
    assert store.get(S1) == b"one"


@pytest.mark.parametrize("existing", [None, b"one"])
def test_snapshot_finish_without_chunks_is_refused(existing: bytes | None) -> None:
    store = MemorySnapshotStore()
    if existing is not None:
        store.create(S1, existing)
    with pytest.raises((KeyError, ValueError)):
        store.finish(S1)
    assert store.size(S1) == (None if existing is None else len(existing))


@pytest.mark.parametrize(("position", "expected"), [(2, 3), (4, 3), (1, 3), (7, 3)])
def test_snapshot_write_chunk_position_checks(position: int, expected: int) -> None:
    store = MemorySnapshotStore()
    store.write_chunk(S1, 0, b"abc")
    with pytest.raises(ValueError, match=f"position {position}, expected {expected}"):
        store.write_chunk(S1, position, b"x")
    # The refused chunk changed nothing.
    store.write_chunk(S1, 3, b"d")
    store.finish(S1)
    assert store.get(S1) == b"abcd"


def test_snapshot_write_chunk_first_chunk_must_be_at_zero() -> None:
    store = MemorySnapshotStore()
    with pytest.raises(ValueError, match="expected 0"):
        store.write_chunk(S1, 5, b"x")


def test_snapshot_restart_at_position_zero_starts_over() -> None:
    store = MemorySnapshotStore()
    store.write_chunk(S1, 0, b"stale")
    store.write_chunk(S1, 5, b"-data")
    store.write_chunk(S1, 0, b"new")
    store.finish(S1)
    assert store.get(S1) == b"new"


def test_snapshot_create_is_visible_at_once() -> None:
    store = MemorySnapshotStore()
    store.create(S2, b"x" * 7)
    store.create(S1, b"y")
    assert store.latest() == S2
    assert store.size(S2) == 7


@pytest.mark.parametrize(
    ("before", "left"),
    [(S1, {S1, S2, S3}), (S2, {S2, S3}), (S3, {S3}), (SnapshotId(25, 9), {S3})],
)
def test_snapshot_delete_before(before: SnapshotId, left: set[SnapshotId]) -> None:
    store = MemorySnapshotStore()
    for sid in (S1, S2, S3):
        store.create(sid, b"d")
    store.write_chunk(SnapshotId(40, 3), 0, b"partial")
    store.write_chunk(SnapshotId(5, 1), 0, b"old")
    store.delete_before(before)
    assert {sid for sid in (S1, S2, S3) if store.size(sid) is not None} == left
    # A partial snapshot not newer than `before` goes too ...
    with pytest.raises(ValueError, match="expected 0"):
        store.write_chunk(SnapshotId(5, 1), 3, b"more")
    # ... but the download of a newer one goes on (compacting while a
    # snapshot is being fetched must not break the fetch).
    store.write_chunk(SnapshotId(40, 3), 7, b"more")
    store.finish(SnapshotId(40, 3))
    assert store.get(SnapshotId(40, 3)) == b"partialmore"


def test_snapshot_latest_orders_by_end_offset_then_epoch() -> None:
    store = MemorySnapshotStore()
    store.create(SnapshotId(20, 1), b"a")
    store.create(SnapshotId(10, 5), b"b")
    store.create(SnapshotId(20, 3), b"c")
    assert store.latest() == SnapshotId(20, 3)


# -- the three together -------------------------------------------------------------


def test_stores_crash_together() -> None:
    stores = MemoryStores.new()
    stores.log.append([batch(0, 1, 2)])
    stores.state.write(QuorumState(1, 1, None))
    stores.log.flush()
    stores.state.flush()
    stores.log.append([batch(2, 1, 1)])
    stores.state.write(QuorumState(2, None, None))
    stores.snapshots.create(S1, b"done")
    stores.snapshots.write_chunk(S2, 0, b"half")
    stores.crash()
    assert ends(stores.log.read_all()) == [2]
    assert stores.state.read() == QuorumState(1, 1, None)
    assert stores.snapshots.latest() == S1
    with pytest.raises(ValueError):
        stores.snapshots.write_chunk(S2, 4, b"rest")


@pytest.mark.parametrize("must_sync", [True, False])
def test_persist_is_durable_only_when_synced(must_sync: bool) -> None:
    from quorum.ready import Ready
    from quorum.storage import NodeStorage

    stores: NodeStorage = MemoryStores.new()
    ready = Ready(
        entries=tuple(batches_of((1, 2), (1, 1))),
        quorum_state=QuorumState(1, 2, None),
        must_sync=must_sync,
    )
    stores.persist(ready)
    assert [b.base_offset for b in stores.log.read_all()] == [0, 2]
    assert isinstance(stores, MemoryStores)
    stores.crash()
    survived = [b.base_offset for b in stores.log.read_all()]
    assert survived == ([0, 2] if must_sync else [])
    assert stores.state.read() == (QuorumState(1, 2, None) if must_sync else None)

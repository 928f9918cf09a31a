"""Tests for quorum.log.RaftLog: shape errors, reads, epochs, compaction."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.log import LogError, RaftLog
from quorum.types import Batch, OffsetAndEpoch, SnapshotId
from tests.quorum.core_driver import batch, batches_of


def log_of(*spec: tuple[int, int], snapshot: SnapshotId | None = None) -> RaftLog:
    """A log of contiguous batches ``(epoch, records)`` from the snapshot end."""
    base = snapshot.end_offset if snapshot else 0
    out = []
    for epoch, n in spec:
        out.append(batch(base, epoch, n))
        base += n
    return RaftLog(snapshot, out)


def ends(log: RaftLog) -> list[int]:
    return [b.end_offset for b in log.batches()]


# -- append ---------------------------------------------------------------------


def test_empty_log() -> None:
    log = RaftLog()
    assert (log.start_offset, log.end_offset, log.last_epoch, len(log)) == (0, 0, 0, 0)
    assert log.last_offset_and_epoch() == OffsetAndEpoch(0, 0)
    assert log.snapshot is None


def test_append_contiguous_batches() -> None:
    log = RaftLog()
    log.append([batch(0, 1, 2), batch(2, 1, 3)])
    log.append([batch(5, 2, 1)])
    assert ends(log) == [2, 5, 6]
    assert log.end_offset == 6
    assert log.last_offset_and_epoch() == OffsetAndEpoch(2, 6)
    log.check_invariants()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (batch(3, 1), "does not follow the log end offset 4"),  # overlap
        (batch(5, 1), "does not follow the log end offset 4"),  # gap
        (batch(0, 1), "does not follow"),
        (batch(4, 1), "below the log's last epoch 2"),  # epoch goes back
        (Batch(4, 2, ()), "empty batch at offset 4"),
    ],
)
def test_append_errors(bad: Batch, match: str) -> None:
    log = log_of((1, 2), (2, 2))
    with pytest.raises(LogError, match=match):
        log.append([bad])
    assert ends(log) == [2, 4]  # unchanged
    log.check_invariants()


@pytest.mark.parametrize(
    "bad",
    [batch(6, 2), batch(5, 1), Batch(5, 2, ())],
    ids=["gap", "epoch-back", "empty"],
)
def test_failed_append_of_several_batches_changes_nothing(bad: Batch) -> None:
    log = log_of((1, 2), (2, 2))
    with pytest.raises(LogError):
        log.append([batch(4, 2), bad])
    assert ends(log) == [2, 4]


def test_append_same_and_higher_epoch() -> None:
    log = log_of((2, 1))
    log.append([batch(1, 2)])  # same epoch
    log.append([batch(2, 7)])  # jump ahead
    assert log.last_epoch == 7


def test_append_below_snapshot_epoch_raises() -> None:
    log = RaftLog(SnapshotId(10, 3))
    with pytest.raises(LogError, match="below the log's last epoch 3"):
        log.append([batch(10, 2)])
    with pytest.raises(LogError, match="does not follow the log end offset 10"):
        log.append([batch(9, 3)])
    log.append([batch(10, 3)])
    assert log.end_offset == 11


def test_constructor_validates_batches() -> None:
    with pytest.raises(LogError):
        RaftLog(None, [batch(0, 1), batch(2, 1)])
    with pytest.raises(LogError):
        RaftLog(SnapshotId(5, 1), [batch(0, 1)])


# -- truncate_to ------------------------------------------------------------------

# log: [0,2) e1, [2,5) e1, [5,6) e2, [6,10) e3
TRUNCATE = [
    (10, 10, [2, 5, 6, 10]),  # at the end: no-op
    (99, 10, [2, 5, 6, 10]),  # past the end: no-op
    (6, 6, [2, 5, 6]),  # batch boundary
    (5, 5, [2, 5]),
    (0, 0, []),
    (8, 6, [2, 5, 6]),  # mid-batch: drops the whole batch holding 8
    (9, 6, [2, 5, 6]),
    (3, 2, [2]),
    (1, 0, []),
]


@pytest.mark.parametrize(("to", "new_end", "left"), TRUNCATE)
def test_truncate_to(to: int, new_end: int, left: list[int]) -> None:
    log = log_of((1, 2), (1, 3), (2, 1), (3, 4))
    assert log.truncate_to(to) == new_end
    assert log.end_offset == new_end
    assert ends(log) == left
    log.check_invariants()


def test_truncate_rebuilds_epochs() -> None:
    log = log_of((1, 2), (2, 2), (3, 2))
    log.truncate_to(3)  # drops [2,4) e2 and [4,6) e3
    assert log.last_epoch == 1
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(1, 2)
    log.append([batch(2, 4)])
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(1, 2)
    assert log.end_offset_for_epoch(4) == OffsetAndEpoch(4, 3)


def test_truncate_below_start_raises() -> None:
    log = log_of((2, 3), snapshot=SnapshotId(10, 1))
    with pytest.raises(LogError, match="below the log start 10"):
        log.truncate_to(9)
    assert log.truncate_to(10) == 10  # exactly the start is fine
    assert len(log) == 0
    assert log.last_epoch == 1  # back to the snapshot's epoch
    with pytest.raises(LogError, match="below the log start 10"):
        log.truncate_to(3)


# -- read -------------------------------------------------------------------------


def sized(base: int, epoch: int, payload_len: int) -> Batch:
    """A one-record batch of size ``payload_len + 16`` bytes."""
    return Batch(base, epoch, (b"x" * payload_len,))


# Batches of 20, 30, 40 and 50 bytes at offsets 0..3.
READS = [
    (0, 10**6, [0, 1, 2, 3]),
    (0, 0, [0]),  # always at least one batch, even over the limit
    (0, 19, [0]),
    (0, 20, [0]),
    (0, 49, [0]),
    (0, 50, [0, 1]),
    (0, 90, [0, 1, 2]),
    (0, 139, [0, 1, 2]),
    (0, 140, [0, 1, 2, 3]),
    (1, 30, [1]),
    (1, 70, [1, 2]),
    (3, 1, [3]),
    (4, 10**6, []),  # at the end
    (9, 10**6, []),  # past the end
]


@pytest.mark.parametrize(("start", "max_bytes", "bases"), READS)
def test_read_max_bytes(start: int, max_bytes: int, bases: list[int]) -> None:
    log = RaftLog(None, [sized(0, 1, 4), sized(1, 1, 14), sized(2, 2, 24), sized(3, 2, 34)])
    assert [b.size_bytes for b in log.batches()] == [20, 30, 40, 50]
    assert [b.base_offset for b in log.read(start, max_bytes)] == bases


def test_read_from_mid_batch_returns_the_batch_holding_the_offset() -> None:
    log = log_of((1, 3), (1, 3))
    assert [b.base_offset for b in log.read(4, 10**6)] == [3]
    assert [b.base_offset for b in log.read(2, 10**6)] == [0, 3]


def test_read_below_start_is_empty() -> None:
    log = log_of((1, 2), snapshot=SnapshotId(5, 1))
    assert log.read(4, 10**6) == ()
    assert [b.base_offset for b in log.read(5, 10**6)] == [5]


# -- between ----------------------------------------------------------------------

# log: [0,2) [2,5) [5,6) [6,10)
BETWEEN = [
    (0, 10, [0, 2, 5, 6]),
    (0, 99, [0, 2, 5, 6]),
    (0, 6, [0, 2, 5]),
    (0, 7, [0, 2, 5]),  # a batch must end at or before the bound
    (2, 6, [2, 5]),
    (1, 6, [2, 5]),  # a batch must begin at or after the start
    (5, 6, [5]),
    (6, 6, []),
    (7, 6, []),
    (10, 20, []),
    (0, 1, []),
    (0, 0, []),
]


@pytest.mark.parametrize(("lo", "hi", "bases"), BETWEEN)
def test_between(lo: int, hi: int, bases: list[int]) -> None:
    log = log_of((1, 2), (1, 3), (2, 1), (3, 4))
    assert [b.base_offset for b in log.between(lo, hi)] == bases


def test_between_with_snapshot() -> None:
    log = log_of((2, 2), (2, 2), snapshot=SnapshotId(10, 1))
    assert [b.base_offset for b in log.between(0, 14)] == [10, 12]
    assert [b.base_offset for b in log.between(11, 14)] == [12]


# -- end_offset_for_epoch --------------------------------------------------------

# log: e1 [0,3), e3 [3,5), e3 [5,6), e6 [6,10) -- epochs 2, 4, 5 are gaps
EPOCHS = [
    (0, OffsetAndEpoch(0, 0)),  # before the first epoch: epoch 0 at the log start
    (1, OffsetAndEpoch(1, 3)),
    (2, OffsetAndEpoch(1, 3)),  # gap: the largest epoch below
    (3, OffsetAndEpoch(3, 6)),
    (4, OffsetAndEpoch(3, 6)),
    (5, OffsetAndEpoch(3, 6)),
    (6, OffsetAndEpoch(6, 10)),  # the last epoch ends at the log end
    (7, OffsetAndEpoch(6, 10)),
    (100, OffsetAndEpoch(6, 10)),
]


@pytest.mark.parametrize(("epoch", "want"), EPOCHS)
def test_end_offset_for_epoch(epoch: int, want: OffsetAndEpoch) -> None:
    log = log_of((1, 3), (3, 2), (3, 1), (6, 4))
    assert log.end_offset_for_epoch(epoch) == want


def test_end_offset_for_epoch_starting_above_first_epoch() -> None:
    log = log_of((2, 3))
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(0, 0)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(2, 3)


# snapshot (20, 2); log: e2 [20,22), e4 [22,25)
SNAPSHOT_EPOCHS = [
    (1, OffsetAndEpoch(0, 20)),  # below the snapshot's epoch: epoch 0 at the start
    (2, OffsetAndEpoch(2, 22)),
    (3, OffsetAndEpoch(2, 22)),
    (4, OffsetAndEpoch(4, 25)),
    (9, OffsetAndEpoch(4, 25)),
]


@pytest.mark.parametrize(("epoch", "want"), SNAPSHOT_EPOCHS)
def test_end_offset_for_epoch_with_snapshot(epoch: int, want: OffsetAndEpoch) -> None:
    log = log_of((2, 2), (4, 3), snapshot=SnapshotId(20, 2))
    assert log.end_offset_for_epoch(epoch) == want


# snapshot (20, 2); log: e5 [20,23) -- the snapshot's epoch is the floor
SNAPSHOT_FLOOR = [
    (1, OffsetAndEpoch(0, 20)),
    (2, OffsetAndEpoch(2, 20)),
    (3, OffsetAndEpoch(2, 20)),
    (4, OffsetAndEpoch(2, 20)),
    (5, OffsetAndEpoch(5, 23)),
    (6, OffsetAndEpoch(5, 23)),
]


@pytest.mark.parametrize(("epoch", "want"), SNAPSHOT_FLOOR)
def test_end_offset_for_epoch_snapshot_floor(epoch: int, want: OffsetAndEpoch) -> None:
    log = log_of((5, 3), snapshot=SnapshotId(20, 2))
    assert log.end_offset_for_epoch(epoch) == want


def test_end_offset_for_epoch_snapshot_only() -> None:
    log = RaftLog(SnapshotId(7, 3))
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(3, 7)
    assert log.end_offset_for_epoch(8) == OffsetAndEpoch(3, 7)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(0, 7)


# -- epoch_of_end / batch_ending_at ---------------------------------------------

# snapshot (4, 1); log: e1 [4,6), e3 [6,9)
EPOCH_OF_END = [
    (3, None),  # below the start
    (4, 1),  # the start: the snapshot's epoch
    (5, 1),  # inside a batch: that batch's epoch
    (6, 1),
    (7, 3),
    (9, 3),
    (10, None),  # past the end
]


@pytest.mark.parametrize(("end", "want"), EPOCH_OF_END)
def test_epoch_of_end(end: int, want: int | None) -> None:
    log = log_of((1, 2), (3, 3), snapshot=SnapshotId(4, 1))
    assert log.epoch_of_end(end) == want


def test_epoch_of_end_without_snapshot() -> None:
    log = log_of((2, 2))
    assert log.epoch_of_end(0) == 0
    assert log.epoch_of_end(2) == 2


@pytest.mark.parametrize(
    ("end", "want"),
    [(3, False), (4, True), (5, False), (6, True), (8, False), (9, True), (12, False)],
)
def test_batch_ending_at(end: int, want: bool) -> None:
    log = log_of((1, 2), (3, 3), snapshot=SnapshotId(4, 1))
    assert log.batch_ending_at(end) is want


# -- compact_to / reset_to ------------------------------------------------------

# log: e1 [0,2), e2 [2,5), e2 [5,6)
COMPACT_ERRORS = [
    (SnapshotId(7, 2), "reaches past the log end 6"),
    (SnapshotId(3, 2), "does not end at a batch boundary"),
    (SnapshotId(5, 1), "disagrees with the log's epoch 2"),
    (SnapshotId(2, 2), "disagrees with the log's epoch 1"),
]


@pytest.mark.parametrize(("snap", "match"), COMPACT_ERRORS)
def test_compact_to_errors(snap: SnapshotId, match: str) -> None:
    log = log_of((1, 2), (2, 3), (2, 1))
    with pytest.raises(LogError, match=match):
        log.compact_to(snap)
    assert (log.start_offset, ends(log), log.snapshot) == (0, [2, 5, 6], None)


def test_compact_to_older_than_start_raises() -> None:
    log = log_of((2, 2), snapshot=SnapshotId(10, 1))
    with pytest.raises(LogError, match="older than the log start 10"):
        log.compact_to(SnapshotId(8, 1))


@pytest.mark.parametrize(
    ("snap", "left"),
    [
        (SnapshotId(2, 1), [5, 6]),
        (SnapshotId(5, 2), [6]),
        (SnapshotId(6, 2), []),
        (SnapshotId(0, 0), [2, 5, 6]),
    ],
)
def test_compact_to(snap: SnapshotId, left: list[int]) -> None:
    log = log_of((1, 2), (2, 3), (2, 1))
    log.compact_to(snap)
    assert log.snapshot == snap
    assert log.start_offset == snap.end_offset
    assert log.end_offset == 6
    assert ends(log) == left
    assert log.last_epoch == 2
    assert log.read(snap.end_offset - 1, 10**6) == ()  # the covered prefix is gone
    log.check_invariants()


def test_compact_to_rebuilds_epochs() -> None:
    log = log_of((1, 2), (2, 3), (4, 1))
    log.compact_to(SnapshotId(5, 2))
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(0, 5)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(2, 5)
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(2, 5)
    assert log.end_offset_for_epoch(4) == OffsetAndEpoch(4, 6)
    assert log.epoch_of_end(5) == 2
    with pytest.raises(LogError):
        log.truncate_to(4)


def test_compact_to_again_at_the_same_snapshot_is_a_no_op() -> None:
    log = log_of((1, 2), (2, 3))
    log.compact_to(SnapshotId(2, 1))
    log.compact_to(SnapshotId(2, 1))
    assert (log.start_offset, ends(log)) == (2, [5])
    with pytest.raises(LogError, match="disagrees"):
        log.compact_to(SnapshotId(2, 2))


def test_reset_to() -> None:
    log = log_of((1, 2), (2, 3))
    log.reset_to(SnapshotId(40, 7))
    assert (log.start_offset, log.end_offset, len(log)) == (40, 40, 0)
    assert log.snapshot == SnapshotId(40, 7)
    assert log.last_offset_and_epoch() == OffsetAndEpoch(7, 40)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(0, 40)
    assert log.end_offset_for_epoch(7) == OffsetAndEpoch(7, 40)
    with pytest.raises(LogError):
        log.append([batch(5, 8)])
    log.append([batch(40, 7)])
    assert log.end_offset == 41
    log.check_invariants()


def test_reset_to_an_older_snapshot_replaces_everything() -> None:
    log = log_of((3, 2), snapshot=SnapshotId(50, 3))
    log.reset_to(SnapshotId(20, 2))
    assert (log.start_offset, log.end_offset, log.last_epoch) == (20, 20, 2)


def test_check_invariants_detects_a_broken_log() -> None:
    """check_invariants is what the property test relies on: it must fail."""
    log = log_of((1, 2), (2, 2))
    log.batches()[1:2] = []  # type: ignore[index]  # reach inside on purpose
    with pytest.raises(AssertionError):
        log.check_invariants()


# -- random operation sequences against a simple model ----------------------------


@dataclass
class Model:
    """The obvious, slow log: a snapshot and a list of batches."""

    snapshot: SnapshotId | None
    batches: list[Batch]

    @property
    def start(self) -> int:
        return self.snapshot.end_offset if self.snapshot else 0

    @property
    def end(self) -> int:
        return self.batches[-1].end_offset if self.batches else self.start

    @property
    def last_epoch(self) -> int:
        if self.batches:
            return self.batches[-1].epoch
        return self.snapshot.epoch if self.snapshot else 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        present = [b for b in self.batches if b.epoch <= epoch]
        if present:
            e = max(b.epoch for b in present)
            return OffsetAndEpoch(e, max(b.end_offset for b in self.batches if b.epoch == e))
        if self.snapshot is not None and self.snapshot.epoch <= epoch:
            return OffsetAndEpoch(self.snapshot.epoch, self.start)
        return OffsetAndEpoch(0, self.start)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 3), st.integers(1, 4)),  # epoch step, n
        st.tuples(st.just("truncate"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("compact"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("reset"), st.integers(0, 60), st.integers(0, 2)),
        st.tuples(st.just("bad_append"), st.integers(-2, 2), st.integers(0, 1)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_random_operations_keep_invariants(seq: list[tuple[str, int, int]]) -> None:
    log = RaftLog()
    model = Model(None, [])
    for op, a, b in seq:
        if op == "append":
            new = batch(model.end, model.last_epoch + a, b)
            log.append([new])
            model.batches.append(new)
        elif op == "truncate":
            if a < model.start:
                with pytest.raises(LogError):
                    log.truncate_to(a)
            else:
                model.batches = [x for x in model.batches if x.end_offset <= a]
                assert log.truncate_to(a) == model.end
        elif op == "compact":
            bounds = {model.start} | {x.end_offset for x in model.batches}
            if a not in bounds:
                with pytest.raises(LogError):
                    log.compact_to(SnapshotId(a, 0))
                continue
            epoch = next(
                (x.epoch for x in model.batches if x.end_offset == a),
                model.snapshot.epoch if model.snapshot else 0,
            )
            with pytest.raises(LogError):
                log.compact_to(SnapshotId(a, epoch + 1))  # wrong epoch
            log.compact_to(SnapshotId(a, epoch))
            model.snapshot = SnapshotId(a, epoch)
            model.batches = [x for x in model.batches if x.base_offset >= a]
        elif op == "reset":
            snap = SnapshotId(a, model.last_epoch + b)
            log.reset_to(snap)
            model.snapshot, model.batches = snap, []
        else:  # an append that must be refused and change nothing
            gap = a if a != 0 else 1
            wrong = (
                batch(model.end + gap, model.last_epoch, 1)
                if b == 0 or model.last_epoch == 0
                else batch(model.end, model.last_epoch - 1, 1)
            )
            if wrong.base_offset >= 0:
                with pytest.raises(LogError):
                    log.append([wrong])
        log.check_invariants()
        assert list(log.batches()) == model.batches
        assert (log.start_offset, log.end_offset, log.last_epoch) == (
            model.start,
            model.end,
            model.last_epoch,
        )
        assert log.snapshot == model.snapshot
        for epoch in range(model.last_epoch + 2):
            assert log.end_offset_for_epoch(epoch) == model.end_offset_for_epoch(epoch), epoch
        for x in model.batches:
            assert log.epoch_of_end(x.end_offset) == x.epoch
            assert log.batch_ending_at(x.end_offset)
            assert log.read(x.base_offset, 0) == (x,)


def test_batches_of_helper() -> None:
    assert [(b.base_offset, b.epoch, len(b.records)) for b in batches_of((1, 2), (3, 1))] == [
        (0, 1, 2),
        (2, 3, 1),
    ]

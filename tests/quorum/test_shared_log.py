"""Several state machines on one log (quorum/shared_log.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgpack
import pytest

from quorum.shared_log import SharedLog, chain_digest
from quorum.types import Batch, BatchKind, LeaderAndEpoch, SnapshotId


class Tagged:
    """A part that owns the records starting with its tag and remembers them."""

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.seen: list[tuple[int, bytes]] = []
        self.applied = 0
        self.leader = LeaderAndEpoch(None, 0)

    @property
    def applied_offset(self) -> int:
        return self.applied

    def owns(self, record: bytes) -> bool:
        return record.startswith(self.tag)

    def handle_commit(self, batch: Batch) -> Sequence[object]:
        self.applied = batch.end_offset
        out: list[object] = []
        for i, record in enumerate(batch.records):
            if batch.kind is BatchKind.DATA and self.owns(record):
                self.seen.append((batch.base_offset + i, record))
                out.append(f"{self.tag.decode()}@{batch.base_offset + i}")
            else:
                out.append(None)
        return out

    def handle_load_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        self.seen = [(o, bytes(r)) for o, r in msgpack.unpackb(data)]
        self.applied = snapshot_id.end_offset

    def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.leader = leader

    def snapshot(self) -> bytes:
        return self.capture_snapshot()()

    def capture_snapshot(self) -> Callable[[], bytes]:
        seen = list(self.seen)
        return lambda: bytes(msgpack.packb(seen))


def shared() -> tuple[SharedLog, Tagged, Tagged]:
    a, b = Tagged(b"a"), Tagged(b"b")
    return SharedLog([("a", a), ("b", b)]), a, b


def test_each_record_is_answered_by_its_owner_and_others_are_skipped() -> None:
    log, a, b = shared()
    results = log.handle_commit(Batch(0, 1, (b"a1", b"b1", b"zz", b"a2")))
    assert list(results) == ["a@0", "b@1", None, "a@3"]
    assert a.seen == [(0, b"a1"), (3, b"a2")] and b.seen == [(1, b"b1")]
    # Every part sees every batch, leader changes too.
    assert log.handle_commit(Batch(4, 2, (b"a-change",), BatchKind.LEADER_CHANGE)) == [None]
    assert a.applied_offset == b.applied_offset == log.applied_offset == 5
    assert a.seen == [(0, b"a1"), (3, b"a2")]


def test_the_digest_chains_every_batch() -> None:
    log, _, _ = shared()
    batches = [Batch(0, 1, (b"a1",)), Batch(1, 1, (b"b1", b"a2"))]
    chain = bytes(32)
    for batch in batches:
        log.handle_commit(batch)
        chain = chain_digest(chain, batch)
    assert log.digest() == chain
    other, _, _ = shared()
    other.handle_commit(batches[0])
    other.handle_commit(Batch(1, 1, (b"b1", b"a3")))
    assert other.digest() != log.digest()


def test_out_of_order_batches_and_twice_named_parts_are_refused() -> None:
    log, _, _ = shared()
    with pytest.raises(ValueError, match="applied after offset 0"):
        log.handle_commit(Batch(3, 1, (b"a",)))
    with pytest.raises(ValueError, match="distinct names"):
        SharedLog([("a", Tagged(b"a")), ("a", Tagged(b"b"))])


def test_a_snapshot_holds_every_part_under_its_name() -> None:
    log, a, b = shared()
    log.handle_commit(Batch(0, 1, (b"a1", b"b1")))
    capture = log.capture_snapshot()
    log.handle_commit(Batch(2, 1, (b"a2",)))  # after the capture: not in it
    restarted, ra, rb = shared()
    restarted.handle_load_snapshot(SnapshotId(2, 1), capture())
    assert (ra.seen, rb.seen) == ([(0, b"a1")], [(1, b"b1")])
    assert restarted.applied_offset == 2
    restarted.handle_commit(Batch(2, 1, (b"a2",)))
    assert restarted.digest() == log.digest()


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"shared_log": 9, "end_offset": 2, "chain": bytes(32), "parts": {}}, "version 9"),
        ({"shared_log": 1, "end_offset": 3, "chain": bytes(32), "parts": {}}, "at offset 3"),
        (
            {"shared_log": 1, "end_offset": 2, "chain": bytes(32), "parts": {"a": b"\x90"}},
            "no state for ['b']",
        ),
        ({"shared_log": 1, "end_offset": 2, "chain": b"x", "parts": {"a": b"", "b": b""}}, "32"),
        ([1, 2], "not a map"),
    ],
)
def test_a_malformed_snapshot_is_refused_whole(doc: object, fragment: str) -> None:
    log, a, b = shared()
    with pytest.raises(ValueError) as info:
        log.handle_load_snapshot(SnapshotId(2, 1), bytes(msgpack.packb(doc)))
    assert "malformed snapshot" in str(info.value) and fragment in str(info.value)
    assert log.applied_offset == 0 and a.seen == [] and b.seen == []


def test_leader_changes_reach_every_part() -> None:
    log, a, b = shared()
    log.handle_leader_change(LeaderAndEpoch(2, 5))
    assert a.leader == b.leader == LeaderAndEpoch(2, 5)

"""The replicated key-value state machine (kvstore/state_machine.py)."""

from __future__ import annotations

import msgpack
import pytest

from kvstore.state_machine import (
    MAX_VALUE_BYTES,
    CasResult,
    KvStateMachine,
    Versioned,
    encode_cas,
    encode_delete,
    encode_put,
    encode_put_many,
)
from quorum.types import Batch, BatchKind, LeaderAndEpoch, LeaderChange, SnapshotId


def apply(sm: KvStateMachine, epoch: int, *records: bytes) -> list[object]:
    batch = Batch(sm.applied_offset, epoch, tuple(records))
    return list(sm.handle_commit(batch))


def test_put_cas_delete_and_versions() -> None:
    sm = KvStateMachine()
    assert apply(sm, 1, encode_put("a", b"1"), encode_put("b", b"2")) == [
        CasResult(True),
        CasResult(True),
    ]
    assert sm.get("a") == Versioned(b"1", 0, 1)
    assert sm.get("b") == Versioned(b"2", 1, 1)
    # A refused compare-and-set reports what it found and changes nothing.
    assert apply(sm, 2, encode_cas("a", b"x", b"3")) == [CasResult(False, b"1")]
    assert apply(sm, 2, encode_cas("z", b"x", b"3")) == [CasResult(False, None)]
    assert sm.get("a") == Versioned(b"1", 0, 1)
    assert apply(sm, 2, encode_cas("a", b"1", b"3"), encode_cas("n", None, b"new")) == [
        CasResult(True),
        CasResult(True),
    ]
    assert sm.get("a") == Versioned(b"3", 4, 2)
    assert sm.get("n") == Versioned(b"new", 5, 2)
    apply(sm, 2, encode_delete("a"), encode_delete("never"))
    assert sm.get("a") is None
    assert sm.applied_offset == 8


def test_put_many_is_one_record_applied_in_order() -> None:
    sm = KvStateMachine()
    record = encode_put_many([("a", b"1"), ("b", b"2"), ("a", b"3")])
    assert apply(sm, 4, record) == [CasResult(True)]
    assert sm.get("a") == Versioned(b"3", 0, 4)
    assert sm.get("b") == Versioned(b"2", 0, 4)
    assert sm.applied_offset == 1


def test_control_batches_change_nothing_but_the_offset() -> None:
    sm = KvStateMachine()
    change = LeaderChange(1, (1, 2, 3), (1, 2)).encode()
    sm.handle_commit(Batch(0, 1, (change,), BatchKind.LEADER_CHANGE))
    assert len(sm) == 0 and sm.applied_offset == 1


def test_batches_must_arrive_in_order() -> None:
    sm = KvStateMachine()
    with pytest.raises(ValueError, match="applied after offset 0"):
        sm.handle_commit(Batch(5, 1, (encode_put("a", b"1"),)))


def test_snapshot_round_trip() -> None:
    sm = KvStateMachine()
    apply(sm, 1, encode_put("a", b"1"), encode_put_many([("b", b"2"), ("c", b"3")]))
    sid = SnapshotId(sm.applied_offset, 1)
    other = KvStateMachine()
    other.handle_load_snapshot(sid, sm.snapshot())
    assert other.export_items() == sm.export_items()
    assert other.applied_offset == sm.applied_offset


def test_a_snapshot_of_format_0_still_loads() -> None:
    # Format 0 also held the log digest (the node's shared log keeps it now).
    rows = [["a", b"1", 0, 1], ["b", b"2", 1, 1]]
    data = msgpack.packb({"version": 0, "end_offset": 2, "chain": bytes(32), "items": rows})
    sm = KvStateMachine()
    sm.handle_load_snapshot(SnapshotId(2, 1), data)
    assert sm.export_items() == rows and sm.applied_offset == 2


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",
        msgpack.packb({"version": 1}),
        msgpack.packb({"version": 0, "end_offset": 9}),
        msgpack.packb({"version": 7, "end_offset": 3, "items": []}),
        msgpack.packb({"version": 1, "end_offset": 3, "items": [["k", b"v", 1]]}),
    ],
)
def test_malformed_snapshot_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="malformed key-value snapshot"):
        KvStateMachine().handle_load_snapshot(SnapshotId(3, 1), data)


@pytest.mark.parametrize(
    "record",
    [msgpack.packb(["nope", "a"]), msgpack.packb(["put", "a"]), msgpack.packb(["cas", "a", 1])],
)
def test_malformed_records_fail_loudly(record: bytes) -> None:
    with pytest.raises(ValueError):
        apply(KvStateMachine(), 1, record)


@pytest.mark.parametrize(
    "record", [msgpack.packb({"put": 1}), msgpack.packb([3, 0, "topic"]), b"", b"\xc1"]
)
def test_records_of_other_state_machines_are_skipped(record: bytes) -> None:
    # Not a key-value record (an array led by a string): another plug-in's
    # on a shared log (a metadata record is an array led by its type).
    sm = KvStateMachine()
    assert not sm.owns(record)
    assert list(sm.handle_commit(Batch(0, 1, (record, encode_put("k", b"v"))))) == [
        None,
        CasResult(True),
    ]
    assert len(sm) == 1 and sm.applied_offset == 2


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: encode_put("", b"x"), "non-empty"),
        (lambda: encode_put("k" * 2000, b"x"), "longer than"),
        (lambda: encode_put("k", b"x" * (MAX_VALUE_BYTES + 1)), "longer than"),
        (lambda: encode_put("k", "text"), "must be bytes"),  # type: ignore[arg-type]
        (lambda: encode_put_many([]), "at least one"),
        (lambda: encode_put_many([("ok", b"1"), ("", b"2")]), "non-empty"),
        (lambda: encode_cas("k", "x", b"1"), "must be bytes"),  # type: ignore[arg-type]
        (lambda: encode_delete(""), "non-empty"),
    ],
)
def test_encoders_validate(make: object, match: str) -> None:
    assert callable(make)
    with pytest.raises(ValueError, match=match):
        make()


def test_leader_change_is_remembered() -> None:
    sm = KvStateMachine()
    sm.handle_leader_change(LeaderAndEpoch(2, 5))
    assert sm.leader == LeaderAndEpoch(2, 5)

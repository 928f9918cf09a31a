"""The controller's state machine on the quorum's log
(metadata/state_machine.py), alone and sharing a controller's log with the
key-value store (quorum/shared_log.py): metadata and key-value records in
one log, leader changes, snapshots, and snapshots written before the store
became a plug-in of its own."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.state_machine import (
    CasResult,
    KvStateMachine,
    encode_cas,
    encode_delete,
    encode_put,
    encode_put_many,
)
from metadata.configs import ResourceType
from metadata.delta import MetadataDelta, ReplayError
from metadata.image import MetadataImage
from metadata.records import (
    NoOpRecord,
    PartitionChangeRecord,
    TopicRecord,
    UnknownRecordError,
    encode_record,
    is_metadata_record,
)
from metadata.state_machine import ControllerStateMachine
from quorum.shared_log import SharedLog
from quorum.types import Batch, BatchKind, SnapshotId
from tests.metadata.controller_model import Harness, encode_batch, replay_batches


def cluster_log(seed: int = 0) -> list[Batch]:
    """A log of metadata writes with key-value writes, a leader change and
    mixed batches between them."""
    h = Harness(seed=seed)
    h.add_brokers(1, 2, 3)
    h.create_topic("orders", 3, 2, configs={"retention.ms": "1000"})
    h.create_topic("events", 2, 3)
    h.run(lambda c: c.allocate_producer_ids(1, h.image.brokers[1].epoch))
    h.fence(3)
    h.run(lambda c: c.delete_topics(["events"]))
    h.set_config(ResourceType.CLUSTER, "", "unclean.leader.election.enable", "true")
    h.heartbeat(3)
    # Interleave key-value batches, a leader change and a mixed batch,
    # shifting offsets after them.
    out: list[Batch] = []
    offset = 0

    def add(epoch: int, records: tuple[bytes, ...], kind: BatchKind = BatchKind.DATA) -> None:
        nonlocal offset
        out.append(Batch(offset, epoch, records, kind))
        offset += len(records)

    for i, batch in enumerate(h.batches):
        if i == 2:
            add(1, (encode_put("a", b"1"), encode_put_many([("b", b"2"), ("c", b"3")])))
        if i == 4:
            add(2, (b"leader-change",), BatchKind.LEADER_CHANGE)
        if i == 6:
            add(2, (encode_delete("b"), encode_record(NoOpRecord()), encode_cas("a", b"1", b"9")))
        add(1 if i < 4 else 2, batch.records)
    return out


class NodeLog:
    """A controller's log: the metadata and the key-value store sharing it."""

    def __init__(self) -> None:
        self.metadata = ControllerStateMachine()
        self.kv = KvStateMachine()
        self.log = SharedLog([("metadata", self.metadata), ("kv", self.kv)])

    def replay(self, batches: list[Batch]) -> NodeLog:
        for batch in batches:
            self.log.handle_commit(batch)
        return self


# -- committing batches ---------------------------------------------------------------


def test_mixed_key_value_and_metadata_records_in_one_batch() -> None:
    node = NodeLog()
    sm = node.metadata
    h = Harness()
    h.add_brokers(1)
    topic = h.create_topic("t")
    records = [b for batch in h.batches for b in batch.records]
    mixed = (
        encode_put("k", b"v"),
        *records,
        encode_cas("k", b"v", b"w"),
        encode_cas("k", b"nope", b"x"),
    )
    results = node.log.handle_commit(Batch(0, 1, mixed))
    n = len(records)
    assert list(results[1 : 1 + n]) == [None] * n
    assert results[0] == CasResult(True)
    assert results[-2] == CasResult(True)
    assert results[-1] == CasResult(False, b"w")
    assert sm.image.topic_by_name("t") == topic
    kv = node.kv.get("k")
    assert kv is not None and kv.value == b"w" and kv.offset == n + 1
    assert node.kv.applied_offset == node.log.applied_offset == len(mixed)
    assert sm.applied_offset == len(mixed)
    # The image is at the batch's end, whatever kind its last record is.
    assert (sm.image.offset, sm.image.epoch) == (len(mixed), 1)
    assert sm.image.with_provenance(0, 0) == h.image.with_provenance(0, 0)


def test_a_key_value_batch_moves_the_image_provenance_only() -> None:
    sm = replay_batches(Harness().batches)
    before = sm.image
    sm.handle_commit(Batch(sm.applied_offset, 4, (encode_put("k", b"v"),)))
    assert sm.image.offset == before.offset + 1 and sm.image.epoch == 4
    assert sm.image.topics is before.topics and sm.image.brokers is before.brokers


def test_leader_change_batches() -> None:
    sm = ControllerStateMachine()
    assert sm.last_leader_change_epoch == 0
    results = sm.handle_commit(Batch(0, 3, (b"leader", b"change"), BatchKind.LEADER_CHANGE))
    assert list(results) == [None, None]
    assert sm.last_leader_change_epoch == 3
    assert (sm.applied_offset, sm.image.offset, sm.image.epoch) == (2, 2, 3)
    # Its records are no metadata records.
    assert not sm.image.brokers
    sm.handle_commit(Batch(2, 3, (encode_record(NoOpRecord()),)))
    assert sm.last_leader_change_epoch == 3
    sm.handle_commit(Batch(3, 5, (b"x",), BatchKind.LEADER_CHANGE))
    assert sm.last_leader_change_epoch == 5


def test_batches_must_come_in_order() -> None:
    sm = ControllerStateMachine()
    sm.handle_commit(Batch(0, 1, (encode_record(NoOpRecord()),)))
    with pytest.raises(ValueError, match="batch at offset 5 applied after offset 1"):
        sm.handle_commit(Batch(5, 1, (encode_record(NoOpRecord()),)))
    with pytest.raises(ValueError, match="batch at offset 0 applied after offset 1"):
        sm.handle_commit(Batch(0, 1, (encode_record(NoOpRecord()),)))


def test_a_bad_record_stops_the_state_machine() -> None:
    sm = ControllerStateMachine()
    with pytest.raises(ReplayError):
        sm.handle_commit(Batch(0, 1, (encode_record(PartitionChangeRecord("nope", 0)),)))
    sm = ControllerStateMachine()
    with pytest.raises(UnknownRecordError):
        sm.handle_commit(Batch(0, 1, (bytes(msgpack.packb([99, 0])),)))


def test_listeners() -> None:
    sm = ControllerStateMachine()
    commits: list[tuple[MetadataDelta, MetadataImage]] = []
    batches: list[Batch] = []
    loads: list[MetadataImage] = []
    sm.add_listener(lambda d, i: commits.append((d, i)))
    sm.add_batch_listener(batches.append)
    sm.add_load_listener(loads.append)
    log = cluster_log()
    for batch in log:
        sm.handle_commit(batch)
    assert batches == log
    # Only batches with metadata records reach the commit listeners, with
    # the image they made.
    with_metadata = [
        b for b in log if b.kind is BatchKind.DATA and any(map(is_metadata_record, b.records))
    ]
    assert len(commits) == len(with_metadata)
    assert commits[-1][1] is sm.image
    assert all(delta.records > 0 for delta, _ in commits)
    fresh = ControllerStateMachine()
    fresh.add_load_listener(loads.append)
    fresh.handle_load_snapshot(SnapshotId(sm.applied_offset, sm.image.epoch), sm.snapshot())
    assert loads == [fresh.image]


def test_the_node_digest_follows_the_log() -> None:
    log = cluster_log()
    a, b = NodeLog().replay(log), NodeLog().replay(log)
    assert a.log.digest() == b.log.digest() != bytes(32)
    other = log[:-1] + [Batch(log[-1].base_offset, log[-1].epoch + 1, log[-1].records)]
    assert NodeLog().replay(other).log.digest() != a.log.digest()


# -- snapshots -----------------------------------------------------------------------------


def snapshot_of(sm: ControllerStateMachine) -> tuple[SnapshotId, bytes]:
    return SnapshotId(sm.applied_offset, sm.image.epoch), sm.capture_snapshot()()


def test_snapshot_loads_as_the_same_state() -> None:
    sm = replay_batches(cluster_log())
    snapshot_id, data = snapshot_of(sm)
    fresh = ControllerStateMachine()
    fresh.handle_load_snapshot(snapshot_id, data)
    assert fresh.image == sm.image
    assert fresh.applied_offset == sm.applied_offset
    # A snapshot replaces whatever was there.
    again = replay_batches(cluster_log(seed=1)[:3])
    again.handle_load_snapshot(snapshot_id, data)
    assert again.image == sm.image


def test_a_capture_is_the_state_when_captured() -> None:
    log = cluster_log()
    sm = replay_batches(log[:5])
    capture = sm.capture_snapshot()
    snapshot_id = SnapshotId(sm.applied_offset, sm.image.epoch)
    image = sm.image
    for batch in log[5:]:
        sm.handle_commit(batch)
    fresh = ControllerStateMachine()
    fresh.handle_load_snapshot(snapshot_id, capture())
    assert fresh.image == image


def test_snapshot_of_an_empty_state_machine() -> None:
    sm = ControllerStateMachine()
    fresh = ControllerStateMachine()
    fresh.handle_load_snapshot(SnapshotId(0, 0), sm.snapshot())
    assert fresh.image == sm.image and fresh.applied_offset == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.data())
def test_snapshot_and_the_rest_equal_the_whole_log(seed: int, data: st.DataObject) -> None:
    log = cluster_log(seed)
    split = data.draw(st.integers(0, len(log)))
    whole = NodeLog().replay(log)
    node = NodeLog().replay(log[:split])
    snapshot_id = SnapshotId(node.log.applied_offset, node.metadata.image.epoch)
    snapshot = node.log.capture_snapshot()()
    restarted = NodeLog()
    restarted.log.handle_load_snapshot(snapshot_id, snapshot)
    restarted.replay(log[split:])
    assert restarted.metadata.image == whole.metadata.image
    assert restarted.kv.export_items() == whole.kv.export_items()
    assert restarted.log.digest() == whole.log.digest()
    assert restarted.metadata.last_leader_change_epoch <= whole.metadata.last_leader_change_epoch


def legacy_snapshot(node: NodeLog) -> tuple[SnapshotId, bytes]:
    """What a controller wrote before the key-value store was a plug-in of
    its own: one map of version 1 with the image's records and the rows."""
    snapshot_id = SnapshotId(node.log.applied_offset, node.metadata.image.epoch)
    doc = {
        "version": 1,
        "end_offset": node.log.applied_offset,
        "epoch": node.metadata.image.epoch,
        "chain": node.log.digest(),
        "metadata": [encode_record(r) for r in node.metadata.image.to_records()],
        "kv": node.kv.export_items(),
    }
    return snapshot_id, pack(doc)


def test_a_snapshot_from_before_the_store_was_a_plug_in_still_loads() -> None:
    log = cluster_log()
    whole = NodeLog().replay(log)
    node = NodeLog().replay(log[:8])
    assert node.kv.export_items()  # the split leaves key-value rows to carry
    snapshot_id, data = legacy_snapshot(node)
    restarted = NodeLog()
    restarted.log.handle_load_snapshot(snapshot_id, data)
    assert restarted.metadata.image == node.metadata.image
    assert restarted.kv.export_items() == node.kv.export_items()
    assert restarted.log.digest() == node.log.digest()
    restarted.replay(log[8:])
    assert restarted.kv.export_items() == whole.kv.export_items()
    assert restarted.log.digest() == whole.log.digest()


# -- malformed snapshots -----------------------------------------------------------------------


def good_snapshot() -> tuple[SnapshotId, dict[str, Any]]:
    sm = replay_batches(cluster_log())
    snapshot_id, data = snapshot_of(sm)
    return snapshot_id, msgpack.unpackb(data)


def pack(obj: object) -> bytes:
    return bytes(msgpack.packb(obj))


def _set(key: str, value: object) -> Any:
    def change(obj: dict[str, Any]) -> object:
        obj[key] = value
        return obj

    return change


def _drop(key: str) -> Any:
    def change(obj: dict[str, Any]) -> object:
        del obj[key]
        return obj

    return change


def _metadata(records: list[bytes]) -> Any:
    return _set("metadata", records)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda obj: [1, 2], "not a map"),
        (_set("version", 3), "snapshot format version 3; this build reads 1, 2"),
        (_drop("version"), "snapshot format version None"),
        (_set("end_offset", 3), "it holds the state at offset 3"),
        (_drop("end_offset"), "end_offset"),
        (_drop("metadata"), "metadata"),
        (_metadata([b"\xc1"]), "does not decode"),
        (_metadata([pack([99, 0])]), "unknown metadata record type 99"),
        (
            _metadata([encode_record(TopicRecord("t", "A")), encode_record(TopicRecord("t", "B"))]),
            "topic t already exists",
        ),
        (_metadata([encode_record(PartitionChangeRecord("A", 0))]), "unknown topic A"),
    ],
)
def test_malformed_snapshot(change: Any, fragment: str) -> None:
    snapshot_id, obj = good_snapshot()
    data = pack(change(obj))
    sm = ControllerStateMachine()
    with pytest.raises(ValueError) as info:
        sm.handle_load_snapshot(snapshot_id, data)
    message = str(info.value)
    assert "malformed controller snapshot" in message
    assert fragment in message
    # Nothing was loaded.
    assert sm.applied_offset == 0 and not sm.image.brokers


@pytest.mark.parametrize("data", [b"", b"\xc1", b"not msgpack at all \xff\xff"])
def test_a_snapshot_that_is_not_msgpack(data: bytes) -> None:
    with pytest.raises(ValueError, match="malformed controller snapshot"):
        ControllerStateMachine().handle_load_snapshot(SnapshotId(0, 0), data)


@pytest.mark.parametrize("rows", [[["k", b"v", 1]], [5], [["k", b"v", "x", 1]]])
def test_malformed_key_value_rows_of_an_old_snapshot(rows: list[Any]) -> None:
    snapshot_id, data = legacy_snapshot(NodeLog().replay(cluster_log()[:8]))
    obj = msgpack.unpackb(data)
    obj["kv"] = rows
    node = NodeLog()
    with pytest.raises(ValueError, match="malformed key-value snapshot"):
        node.log.handle_load_snapshot(snapshot_id, pack(obj))
    assert node.kv.applied_offset == 0 and len(node.kv) == 0


def test_snapshot_id_mismatch() -> None:
    snapshot_id, obj = good_snapshot()
    wrong = SnapshotId(snapshot_id.end_offset + 1, snapshot_id.epoch)
    with pytest.raises(ValueError) as info:
        ControllerStateMachine().handle_load_snapshot(wrong, pack(obj))
    assert str(wrong) in str(info.value)
    assert f"at offset {snapshot_id.end_offset}" in str(info.value)


def test_harness_batches_encode_records() -> None:
    # The helper every test here uses: one batch per decision.
    h = Harness()
    assert h.batches == [encode_batch(0, 1, list(h.image.to_records()))]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=8))
def test_no_bytes_are_both_a_metadata_and_a_key_value_record(prefix: bytes) -> None:
    # The shared log asks no part twice per record: the plug-ins' ``owns``
    # must be disjoint (they decide from the first two bytes).
    node = NodeLog()
    assert not (node.metadata.owns(prefix) and node.kv.owns(prefix))


def test_every_record_written_has_exactly_one_owner() -> None:
    node = NodeLog()
    for batch in cluster_log():
        if batch.kind is BatchKind.DATA:
            for record in batch.records:
                assert node.metadata.owns(record) != node.kv.owns(record), record

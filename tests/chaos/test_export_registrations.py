"""The controllers' broker registrations as node exports
(``chaos.node_exports.broker_registrations``): every registration, fencing,
unfencing and controlled shutdown committed in a controller's stored log,
with its offset, and the registrations of a snapshot the log starts after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.node_exports import (
    BROKER_REGISTRATIONS_FILE,
    PARTITION_CHANGES_FILE,
    broker_registrations,
    export_partition_changes,
)
from history.runs import RunDir
from metadata.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    encode_record,
)
from metadata.state_machine import ControllerStateMachine
from quorum.driver.storage_format import format_storage, open_node_storage
from quorum.ready import Ready
from quorum.shared_log import SharedLog
from quorum.types import Batch, QuorumState, SnapshotId

CLUSTER = "registrations-test"


def _register(broker: int, epoch: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker, epoch, f"inc-{broker}-{epoch}", (), None)


def _history() -> list[Batch]:
    """Brokers 4 and 5 register (4 at epoch 0, 5 at epoch 1) and are
    unfenced; a topic; 4 is fenced, then registers again at epoch 7 and is
    unfenced; 5 enters controlled shutdown and is unregistered."""
    records: list[list[Any]] = [
        [_register(4, 0), _register(5, 1)],
        [UnfenceBrokerRecord(4, 0), UnfenceBrokerRecord(5, 1)],
        [TopicRecord("queue", "t1"), PartitionRecord("t1", 0, (4, 5), (4, 5), leader=4)],
        [FenceBrokerRecord(4, 0), PartitionChangeRecord("t1", 0, leader=5, isr=(5,))],
        [_register(4, 7)],
        [UnfenceBrokerRecord(4, 0)],  # a stale epoch: replay refuses it, no line
        [UnfenceBrokerRecord(4, 7)],
        [BrokerRegistrationChangeRecord(5, 1, in_controlled_shutdown=True)],
        [UnregisterBrokerRecord(5, 1)],
    ]
    out, offset = [], 0
    for group in records:
        out.append(Batch(offset, 1, tuple(encode_record(r) for r in group)))
        offset += len(group)
    return out


def _store(path: Path, batches: list[Batch]) -> None:
    format_storage(path, CLUSTER, 1, [1])
    with open_node_storage(path, CLUSTER, 1) as storage:
        storage.persist(Ready(entries=tuple(batches), quorum_state=QuorumState(1), must_sync=True))


def _brief(lines: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [
        (
            x["offset"],
            x["broker"],
            x["event"],
            x["broker_epoch"],
            x["fenced"],
            x["in_controlled_shutdown"],
        )
        for x in lines
    ]


def test_every_registration_change_with_its_offset(tmp_path: Path) -> None:
    _store(tmp_path / "d", _history())
    lines = broker_registrations(1, tmp_path / "d", CLUSTER, 1000)
    assert all(x["node"] == 1 and x["epoch"] == 1 for x in lines)
    assert _brief(lines) == [
        (0, 4, "register", 0, True, False),
        (1, 5, "register", 1, True, False),
        (2, 4, "unfence", 0, False, False),
        (3, 5, "unfence", 1, False, False),
        (6, 4, "fence", 0, True, False),
        (8, 4, "register", 7, True, False),
        (10, 4, "unfence", 7, False, False),
        (11, 5, "change", 1, False, True),
        (12, 5, "unregister", None, None, None),
    ]
    # Below the high watermark only (what is committed).
    assert _brief(broker_registrations(1, tmp_path / "d", CLUSTER, 8))[-1][:3] == (6, 4, "fence")


def test_export_writes_both_files_beside_each_other(tmp_path: Path) -> None:
    _store(tmp_path / "d", _history())
    run = RunDir(tmp_path / "run")
    export_partition_changes(run, 1, tmp_path / "d", CLUSTER, 1000)
    folder = run.node_dir(1)
    regs = [json.loads(x) for x in (folder / BROKER_REGISTRATIONS_FILE).read_text().splitlines()]
    changes = [json.loads(x) for x in (folder / PARTITION_CHANGES_FILE).read_text().splitlines()]
    assert len(regs) == 9 and regs[0]["event"] == "register"
    assert [(c["offset"], c["isr"]) for c in changes] == [(5, [4, 5]), (7, [5])]


def test_a_log_after_a_snapshot_starts_from_the_snapshots_registrations(tmp_path: Path) -> None:
    history = _history()
    machine = ControllerStateMachine()
    shared = SharedLog([("metadata", machine)])
    for batch in history[:5]:  # up to and including 4's second registration
        shared.handle_commit(batch)
    snapshot = SnapshotId(history[5].base_offset, 1)
    data = shared.snapshot()
    format_storage(tmp_path / "d", CLUSTER, 1, [1])
    with open_node_storage(tmp_path / "d", CLUSTER, 1) as storage:
        storage.snapshots.create(snapshot, data)
        storage.persist(
            Ready(
                reset_to_snapshot=snapshot,
                entries=tuple(history[5:]),
                quorum_state=QuorumState(1),
                must_sync=True,
            )
        )
    lines = broker_registrations(1, tmp_path / "d", CLUSTER, 1000)
    assert _brief(lines) == [
        (8, 4, "snapshot", 7, True, False),
        (8, 5, "snapshot", 1, False, False),
        (10, 4, "unfence", 7, False, False),
        (11, 5, "change", 1, False, True),
        (12, 5, "unregister", None, None, None),
    ]


def test_a_log_after_a_snapshot_it_cannot_read_exports_nothing(tmp_path: Path) -> None:
    history = _history()
    format_storage(tmp_path / "d", CLUSTER, 1, [1])
    with open_node_storage(tmp_path / "d", CLUSTER, 1) as storage:
        snapshot = SnapshotId(history[5].base_offset, 1)
        storage.snapshots.create(snapshot, b"not a snapshot")
        storage.persist(
            Ready(
                reset_to_snapshot=snapshot,
                entries=tuple(history[5:]),
                quorum_state=QuorumState(1),
                must_sync=True,
            )
        )
    assert broker_registrations(1, tmp_path / "d", CLUSTER, 1000) == []

"""The format of the newer node exports as ``kq chaos check`` reads them
(``history.export_formats``, ``history.votes.read_votes``): what the
exporters write passes, and each rule fires on a line that breaks it,
naming the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import chaos.node_exports as exporter
from chaos.node_exports import broker_registrations, partition_exports
from history.export_formats import (
    BROKER_REGISTRATIONS_FILE,
    DAMAGED_HASH,
    PARTITION_STATE_FILE,
    PARTITIONS_FILE,
    read_partition_records,
    read_partition_states,
    read_registrations,
)
from history.ops import HistoryFormatError
from history.votes import VOTES_FILE
from tests.chaos.test_export_registrations import CLUSTER
from tests.chaos.test_export_registrations import _history as registration_history
from tests.chaos.test_export_registrations import _store as store_registrations
from tests.chaos.test_exports_damaged import _replica

SHA = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"

REGISTRATION: dict[str, Any] = {
    "node": 1,
    "offset": 12,
    "epoch": 2,
    "broker": 4,
    "event": "register",
    "broker_epoch": 12,
    "fenced": True,
    "in_controlled_shutdown": False,
}
RECORD: dict[str, Any] = {
    "node": 5,
    "topic": "queue",
    "partition": 0,
    "offset": 0,
    "epoch": 0,
    "producer_id": 1000,
    "sequence": 0,
    "control": False,
    "hash": SHA,
}
STATE: dict[str, Any] = {
    "node": 5,
    "topic": "queue",
    "partition": 0,
    "high_watermark": 3,
    "log_end_offset": 3,
    "stopped_at": None,
}


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_the_file_names_and_the_damaged_marker_are_the_exporters() -> None:
    assert exporter.DAMAGED_HASH == DAMAGED_HASH
    assert exporter.PARTITIONS_FILE == PARTITIONS_FILE
    assert exporter.PARTITION_STATE_FILE == PARTITION_STATE_FILE
    assert exporter.BROKER_REGISTRATIONS_FILE == BROKER_REGISTRATIONS_FILE
    assert exporter.VOTES_FILE == VOTES_FILE


def test_the_exported_registrations_pass(tmp_path: Path) -> None:
    store_registrations(tmp_path / "d", registration_history())
    lines = broker_registrations(1, tmp_path / "d", CLUSTER, 1000)
    assert {x["event"] for x in lines} >= {"register", "fence", "unfence", "change", "unregister"}
    assert read_registrations(_write(tmp_path / BROKER_REGISTRATIONS_FILE, lines)) == lines


def test_an_exported_damaged_batch_passes(tmp_path: Path) -> None:
    _replica(tmp_path / "4", [b"v0", b"v1", b"v2"], flip_last=True)
    records, states = partition_exports(4, [tmp_path / "4"])
    assert records[-1]["hash"] == DAMAGED_HASH
    assert read_partition_records(_write(tmp_path / PARTITIONS_FILE, records)) == records
    assert read_partition_states(_write(tmp_path / PARTITION_STATE_FILE, states)) == states


def test_a_stopped_reader_and_an_unreadable_checkpoint_pass(tmp_path: Path) -> None:
    torn = STATE | {"high_watermark": -1, "stopped_at": "00000000000000000000.log: torn batch"}
    assert read_partition_states(_write(tmp_path / "s", [torn])) == [torn]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"event": "fenced"}, "event must be one of register, fence, unfence"),
        ({"offset": -1}, "offset must be an integer >= 0, got -1"),
        ({"broker": "4"}, "broker must be an integer >= 0, got '4'"),
        ({"broker_epoch": None}, "broker_epoch must be an integer >= 0, got None"),
        ({"fenced": 1}, "fenced must be true or false, got 1"),
        ({"in_controlled_shutdown": None}, "in_controlled_shutdown must be true or false"),
        ({"event": "unregister"}, "broker_epoch must be null after unregister, got 12"),
        ({"extra": 1}, "unknown field(s) ['extra']"),
    ],
)
def test_a_malformed_registration_names_its_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path / BROKER_REGISTRATIONS_FILE, [REGISTRATION, REGISTRATION | change])
    with pytest.raises(HistoryFormatError) as err:
        read_registrations(path)
    assert err.value.line == 2 and err.value.path == str(path)
    assert message in err.value.reason


def test_an_unregister_line_has_no_registration(tmp_path: Path) -> None:
    gone = REGISTRATION | {
        "event": "unregister",
        "broker_epoch": None,
        "fenced": None,
        "in_controlled_shutdown": None,
    }
    assert read_registrations(_write(tmp_path / "r", [REGISTRATION, gone]))[1] == gone


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hash": "damaged"}, "hash must be 64 lowercase hex digits (SHA-256) or 'damaged: CRC"),
        ({"hash": SHA.upper()}, "hash must be 64 lowercase hex digits"),
        ({"hash": "damaged: crc mismatch"}, "hash must be"),
        ({"offset": -3}, "offset must be an integer >= 0, got -3"),
        ({"topic": ""}, "topic must be a non-empty string"),
        ({"epoch": 1.5}, "epoch must be an integer, got 1.5"),
        ({"producer_id": -2}, "producer_id must be an integer >= -1, got -2"),
        ({"producer_id": -1, "sequence": 4}, "sequence must be -1 without a producer, got 4"),
        ({"control": "false"}, "control must be true or false"),
    ],
)
def test_a_malformed_partition_record_names_its_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    damaged = RECORD | {"offset": 1, "hash": DAMAGED_HASH}
    path = _write(tmp_path / PARTITIONS_FILE, [RECORD, damaged, damaged | change])
    with pytest.raises(HistoryFormatError) as err:
        read_partition_records(path)
    assert err.value.line == 3
    assert message in err.value.reason


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"high_watermark": -2}, "high_watermark must be an integer >= -1"),
        ({"log_end_offset": None}, "log_end_offset must be an integer >= 0"),
        ({"stopped_at": 7}, "stopped_at must be a string or null, got 7"),
    ],
)
def test_a_malformed_partition_state_names_its_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(HistoryFormatError) as err:
        read_partition_states(_write(tmp_path / PARTITION_STATE_FILE, [STATE | change]))
    assert err.value.line == 1
    assert message in err.value.reason


@pytest.mark.parametrize(
    "text",
    ["[1]\n", "not json\n"],
)
def test_a_line_that_is_not_an_object_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / PARTITIONS_FILE
    path.write_text(json.dumps(RECORD) + "\n" + text)
    with pytest.raises(HistoryFormatError, match=r":2: (not JSON|expected a JSON object)"):
        read_partition_records(path)

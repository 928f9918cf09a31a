"""The format of the newer node exports as ``kq chaos check`` reads them
(``history.export_formats``, ``history.votes.read_votes``): what the
exporters write passes (and the lines of runs exported before a field was
added), and each rule fires on a line that breaks it, naming the file, the
line and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import chaos.node_exports as exporter
from chaos.node_exports import (
    broker_registrations,
    partition_changes,
    partition_exports,
    partition_timeline,
)
from history.export_formats import (
    BROKER_REGISTRATIONS_FILE,
    DAMAGED_HASH,
    PARTITION_CHANGES_FILE,
    PARTITION_STATE_FILE,
    PARTITION_TIMELINE_FILE,
    PARTITIONS_FILE,
    read_partition_changes,
    read_partition_records,
    read_partition_states,
    read_partition_timeline,
    read_registrations,
)
from history.ops import HistoryFormatError
from history.votes import VOTES_FILE
from tests.chaos.test_export_registrations import CLUSTER
from tests.chaos.test_export_registrations import _history as registration_history
from tests.chaos.test_export_registrations import _store as store_registrations
from tests.chaos.test_exports_damaged import _replica
from tests.chaos.test_exports_partitions import LOG as BROKER_LOG
from tests.chaos.test_exports_partitions import RESTART_LOG
from tests.history.export_lines import (
    CHANGE,
    RECORD,
    REGISTRATION,
    REMOVED_LINE,
    RESTART_LINE,
    SHA,
    STATE,
    STATE_LINE,
    TRUNCATE_LINE,
)


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _refused(read: Callable[[Path], object], path: Path, line: int, message: str) -> None:
    """``read`` refuses ``path`` at ``line``, naming the file and saying
    ``message``."""
    with pytest.raises(HistoryFormatError) as err:
        read(path)
    assert err.value.line == line and err.value.path == str(path)
    assert message in err.value.reason


def test_the_file_names_and_the_damaged_marker_are_the_exporters() -> None:
    assert exporter.DAMAGED_HASH == DAMAGED_HASH
    assert exporter.PARTITIONS_FILE == PARTITIONS_FILE
    assert exporter.PARTITION_STATE_FILE == PARTITION_STATE_FILE
    assert exporter.BROKER_REGISTRATIONS_FILE == BROKER_REGISTRATIONS_FILE
    assert exporter.PARTITION_TIMELINE_FILE == PARTITION_TIMELINE_FILE
    assert exporter.PARTITION_CHANGES_FILE == PARTITION_CHANGES_FILE
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
    _refused(read_registrations, path, 2, message)


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
    _refused(read_partition_records, path, 3, message)


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
    path = _write(tmp_path / PARTITION_STATE_FILE, [STATE | change])
    _refused(read_partition_states, path, 1, message)


@pytest.mark.parametrize(
    "text",
    ["[1]\n", "not json\n"],
)
def test_a_line_that_is_not_an_object_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / PARTITIONS_FILE
    path.write_text(json.dumps(RECORD) + "\n" + text)
    with pytest.raises(HistoryFormatError, match=r":2: (not JSON|expected a JSON object)"):
        read_partition_records(path)


def test_the_exported_timeline_passes(tmp_path: Path) -> None:
    lines = partition_timeline(4, BROKER_LOG, 0)
    assert {x["event"] for x in lines} == {"state", "truncate", "removed"}
    assert len({x["life"] for x in lines}) == 2
    assert read_partition_timeline(_write(tmp_path / PARTITION_TIMELINE_FILE, lines)) == lines


def test_an_exported_restart_passes(tmp_path: Path) -> None:
    lines = partition_timeline(4, RESTART_LOG, 0)
    assert [x["event"] for x in lines] == ["state", "restart", "state", "state"]
    assert read_partition_timeline(_write(tmp_path / PARTITION_TIMELINE_FILE, lines)) == lines


def test_the_exported_partition_changes_pass(tmp_path: Path) -> None:
    store_registrations(tmp_path / "d", registration_history())
    lines = partition_changes(1, tmp_path / "d", CLUSTER, 1000)
    assert len(lines) == 2
    assert read_partition_changes(_write(tmp_path / PARTITION_CHANGES_FILE, lines)) == lines


def test_an_unclean_election_and_an_empty_isr_pass(tmp_path: Path) -> None:
    unclean = CHANGE | {
        "offset": 97,
        "leader": 6,
        "leader_epoch": 1,
        "partition_epoch": 1,
        "isr": [6],
        "leader_recovery_state": "recovering",
        "unclean": True,
    }
    leaderless = unclean | {"offset": 98, "leader": -1, "isr": [], "unclean": False}
    lines = [CHANGE, unclean, leaderless]
    assert read_partition_changes(_write(tmp_path / "c", lines)) == lines


def test_the_lines_of_older_exports_pass(tmp_path: Path) -> None:
    # Runs exported before the log start offset, or KIP-704's recovery
    # state, have lines without them: all of a file's later fields absent.
    state = {k: v for k, v in STATE_LINE.items() if k != "log_start_offset"}
    assert read_partition_timeline(_write(tmp_path / "t", [state])) == [state]
    change = {k: v for k, v in CHANGE.items() if k not in ("leader_recovery_state", "unclean")}
    assert read_partition_changes(_write(tmp_path / "c", [change])) == [change]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"event": "stale"},
            "event must be one of state, truncate, restart, removed, got 'stale'",
        ),
        ({"seq": 0}, "seq must be an integer >= 1 (a line number), got 0"),
        ({"life": -1}, "life must be an integer >= 0, got -1"),
        ({"time": 1.5}, "time must be an integer >= 0, got 1.5"),
        ({"topic": None}, "topic must be a non-empty string, got None"),
        ({"role": "observer"}, "role must be one of leader, follower, none, got 'observer'"),
        ({"leader": -2}, "leader must be an integer >= -1 (-1: none), got -2"),
        ({"leader_epoch": None}, "leader_epoch must be an integer >= -1 (-1: none known yet)"),
        ({"high_watermark": -1}, "high_watermark must be an integer >= 0, got -1"),
        ({"log_end_offset": "19"}, "log_end_offset must be an integer >= 0, got '19'"),
        ({"log_start_offset": -1}, "log_start_offset must be an integer >= 0 or null, got -1"),
        ({"isr": "4,5"}, "isr must be a list of broker ids (integers >= 0), got '4,5'"),
        ({"isr": [4, True]}, "isr must be a list of broker ids"),
        ({"truncated_to": 17}, "truncated_to must be null on a state line, got 17"),
        ({"seq": 211}, "seq must rise, got 211 after 212"),
        ({"life": 0, "node": 4, "seq": 213}, None),
        ({"extra": 1}, "unknown field(s) ['extra']"),
        ({"unclean": False}, "unknown field(s) ['unclean']"),
    ],
)
def test_a_malformed_timeline_state_names_its_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str | None
) -> None:
    path = _write(tmp_path / PARTITION_TIMELINE_FILE, [STATE_LINE, STATE_LINE | change])
    if message is None:  # the control: a well-formed second line
        assert len(read_partition_timeline(path)) == 2
        return
    _refused(read_partition_timeline, path, 2, message)


@pytest.mark.parametrize(
    ("line", "change", "message"),
    [
        (TRUNCATE_LINE, {"truncated_from": None}, "truncated_from must be an integer >= 0"),
        (TRUNCATE_LINE, {"truncated_to": -1}, "truncated_to must be an integer >= 0, got -1"),
        (TRUNCATE_LINE, {"high_watermark": 17}, "high_watermark must be null on a truncate line"),
        (TRUNCATE_LINE, {"leader_epoch": "2"}, "leader_epoch must be an integer >= -1"),
        (RESTART_LINE, {}, None),
        (RESTART_LINE, {"truncated_to": 17}, "truncated_to must be null on a restart line"),
        (RESTART_LINE, {"high_watermark": 40}, "high_watermark must be null on a restart line"),
        (RESTART_LINE, {"truncated_from": None}, "truncated_from must be an integer >= 0"),
        (RESTART_LINE, {"log_start_offset": None}, "log_start_offset must be an integer >= 0"),
        (
            RESTART_LINE,
            {"log_end_offset": 41},
            "log_end_offset must equal log_start_offset on a restart line",
        ),
        (
            RESTART_LINE,
            {"log_start_offset": 17, "log_end_offset": 17},
            "log_start_offset must be at least truncated_from on a restart line",
        ),
        (RESTART_LINE, {"leader_epoch": None}, "leader_epoch must be an integer >= -1"),
        (REMOVED_LINE, {"leader_epoch": 2}, "leader_epoch must be null on a removed line, got 2"),
        (REMOVED_LINE, {"isr": [4]}, "isr must be null on a removed line, got [4]"),
        (REMOVED_LINE, {"life": 0, "seq": 216}, None),
        (REMOVED_LINE, {"life": 0}, None),
    ],
)
def test_a_malformed_truncation_or_removal_names_its_line_and_field(
    tmp_path: Path, line: dict[str, Any], change: dict[str, Any], message: str | None
) -> None:
    later = line | {"life": 1} | change
    path = _write(tmp_path / PARTITION_TIMELINE_FILE, [STATE_LINE, later])
    if message is None:
        assert read_partition_timeline(path)[1] == later
        return
    _refused(read_partition_timeline, path, 2, message)


def test_a_timeline_whose_life_falls_is_refused(tmp_path: Path) -> None:
    second_life = STATE_LINE | {"seq": 300, "life": 1}
    path = _write(tmp_path / PARTITION_TIMELINE_FILE, [second_life, STATE_LINE | {"seq": 301}])
    _refused(read_partition_timeline, path, 2, "life must not fall, got 0 after 1")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"offset": 41}, "offset must rise, got 41 after 41"),
        ({"offset": -1}, "offset must be an integer >= 0, got -1"),
        ({"epoch": None}, "epoch must be an integer >= 0, got None"),
        ({"topic": ""}, "topic must be a non-empty string"),
        ({"partition": "0"}, "partition must be an integer >= 0, got '0'"),
        ({"leader": None}, "leader must be an integer >= -1 (-1: none), got None"),
        ({"leader_epoch": -1}, "leader_epoch must be an integer >= 0, got -1"),
        ({"partition_epoch": 2.0}, "partition_epoch must be an integer >= 0, got 2.0"),
        ({"isr": [5, -1]}, "isr must be a list of broker ids (integers >= 0), got [5, -1]"),
        ({"elr": None}, "elr must be a list of broker ids (integers >= 0), got None"),
        ({"leader_recovery_state": "RECOVERED"}, "leader_recovery_state must be one of recovered"),
        ({"unclean": 0}, "unclean must be true or false, got 0"),
        ({"unclean": True}, "an unclean line must be recovering, got leader_recovery_state"),
        ({"extra": 1}, "unknown field(s) ['extra']"),
    ],
)
def test_a_malformed_partition_change_names_its_line_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    later = CHANGE | {"offset": 97, "partition_epoch": 1} | change
    path = _write(tmp_path / PARTITION_CHANGES_FILE, [CHANGE, later])
    _refused(read_partition_changes, path, 2, message)


@pytest.mark.parametrize(
    ("read", "line", "drop"),
    [
        (read_partition_timeline, STATE_LINE, ("log_start_offset", "isr")),
        (read_partition_changes, CHANGE, ("unclean",)),
    ],
)
def test_a_line_lacking_some_but_not_all_of_the_later_fields_is_refused(
    tmp_path: Path, read: Any, line: dict[str, Any], drop: tuple[str, ...]
) -> None:
    partial = {k: v for k, v in line.items() if k not in drop}
    _refused(read, _write(tmp_path / "f", [partial]), 1, f"missing field(s) {sorted(drop)}")

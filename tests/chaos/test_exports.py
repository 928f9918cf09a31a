"""Node exports: committed logs and role/epoch/leader changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from history.export_files import (
    read_changes,
    read_log,
    write_changes,
    write_log,
)
from history.exports import (
    Change,
    LogEntry,
    check_changes,
    check_log,
    record_hash,
)
from history.files import HistoryFormatError

H = record_hash(b"r")


def test_record_hash_is_sha256_hex() -> None:
    assert record_hash(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert len(H) == 64


def test_log_and_changes_round_trip(tmp_path: Path) -> None:
    log = [LogEntry(2, 0, 1, "control", H), LogEntry(2, 1, 1, "data", record_hash(b"x"))]
    changes = [Change(2, 0, 0, None, "unattached"), Change(2, 5, 1, 1, "follower")]
    write_log(tmp_path / "log.jsonl", log)
    write_changes(tmp_path / "changes.jsonl", changes)
    assert read_log(tmp_path / "log.jsonl") == log
    assert read_changes(tmp_path / "changes.jsonl") == changes
    line = (tmp_path / "log.jsonl").read_text().splitlines()[0]
    assert line == f'{{"node":2,"offset":0,"epoch":1,"kind":"control","hash":"{H}"}}'
    assert check_log(log, 2) == [] and check_changes(changes, 2) == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("nope", "not JSON"),
        ('{"node":1,"offset":0,"epoch":1,"kind":"data"}', "missing field(s) hash"),
        (f'{{"node":1,"offset":0,"epoch":1,"kind":"data","hash":"{H}","x":1}}', "unknown"),
        (f'{{"node":1,"offset":-1,"epoch":1,"kind":"data","hash":"{H}"}}', "offset must be"),
        (f'{{"node":1,"offset":0,"epoch":1,"kind":"meta","hash":"{H}"}}', "kind must be"),
        ('{"node":1,"offset":0,"epoch":1,"kind":"data","hash":"ABC"}', "hash must be"),
        ("", "empty line"),
    ],
)
def test_malformed_log_lines_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    good = f'{{"node":1,"offset":0,"epoch":1,"kind":"data","hash":"{H}"}}'
    path = tmp_path / "log.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(HistoryFormatError) as info:
        read_log(path)
    assert info.value.line == 2
    assert str(info.value).startswith(f"{path}:2: ") and message in str(info.value)


def test_malformed_change_lines_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "changes.jsonl"
    path.write_text(
        '{"node":1,"time":0,"epoch":0,"leader":null,"role":"follower"}\n'
        '{"node":1,"time":0,"epoch":0,"leader":null,"role":"boss"}\n'
    )
    with pytest.raises(HistoryFormatError, match=r":2: role must be"):
        read_changes(path)


@pytest.mark.parametrize(
    ("entries", "kind"),
    [
        ([LogEntry(1, 0, 1, "data", "x")], "invalid-entry"),
        ([LogEntry(2, 0, 1, "data", H)], "wrong-node"),
        ([LogEntry(1, 3, 1, "data", H), LogEntry(1, 2, 1, "data", H)], "offset-order"),
        # The same offset twice: the node committed two records there.
        ([LogEntry(1, 3, 1, "data", H), LogEntry(1, 3, 2, "data", H)], "offset-order"),
        ([LogEntry(1, 3, 2, "data", H), LogEntry(1, 4, 1, "data", H)], "epoch-order"),
    ],
)
def test_check_log_can_fail(entries: list[LogEntry], kind: str) -> None:
    assert {p.kind for p in check_log(entries, 1)} == {kind}


def test_a_log_may_skip_what_a_snapshot_covered() -> None:
    entries = [LogEntry(1, 0, 1, "control", H), LogEntry(1, 40, 3, "data", H)]
    assert check_log(entries, 1) == []


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ([Change(1, 0, 0, None, "leaderish")], "invalid-entry"),
        ([Change(1, 0, 0, -3, "follower")], "invalid-entry"),
        ([Change(3, 0, 0, None, "follower")], "wrong-node"),
        ([Change(1, 9, 1, None, "follower"), Change(1, 8, 1, 2, "follower")], "time"),
        ([Change(1, 1, 2, None, "follower"), Change(1, 2, 1, 2, "follower")], "epoch-order"),
    ],
)
def test_check_changes_can_fail(changes: list[Change], kind: str) -> None:
    assert {p.kind for p in check_changes(changes, 1)} == {kind}

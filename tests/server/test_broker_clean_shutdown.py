"""The broker epoch a clean shutdown leaves in the log directories and the
next run registers with (server/broker.py; Kafka's CleanShutdownFileHandler,
KIP-966): read once, removed at start, -1 unless every directory agrees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.broker import (
    CLEAN_SHUTDOWN_FILE,
    take_clean_shutdown_epoch,
    write_clean_shutdown_epoch,
)


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    found = [tmp_path / "a", tmp_path / "b"]
    for d in found:
        d.mkdir()
    return found


def test_written_then_taken_once(dirs: list[Path]) -> None:
    write_clean_shutdown_epoch(dirs, 42)
    assert json.loads((dirs[0] / CLEAN_SHUTDOWN_FILE).read_text()) == {
        "version": 0,
        "brokerEpoch": 42,
    }
    assert take_clean_shutdown_epoch(dirs) == 42
    # Removed: a crash of the run that took it leaves no clean shutdown.
    assert not any((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    assert take_clean_shutdown_epoch(dirs) == -1


def test_a_directory_without_it_means_unclean(dirs: list[Path]) -> None:
    write_clean_shutdown_epoch(dirs[:1], 42)
    assert take_clean_shutdown_epoch(dirs) == -1
    assert not (dirs[0] / CLEAN_SHUTDOWN_FILE).exists()


def test_directories_that_disagree_mean_unclean(dirs: list[Path]) -> None:
    write_clean_shutdown_epoch(dirs[:1], 42)
    write_clean_shutdown_epoch(dirs[1:], 43)
    assert take_clean_shutdown_epoch(dirs) == -1


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"version": 1, "brokerEpoch": 42}',
        '{"version": 0, "brokerEpoch": -3}',
        '{"version": 0, "brokerEpoch": true}',
        '{"version": 0}',
    ],
)
def test_a_damaged_file_means_unclean(tmp_path: Path, text: str) -> None:
    (tmp_path / CLEAN_SHUTDOWN_FILE).write_text(text)
    assert take_clean_shutdown_epoch([tmp_path]) == -1
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_no_directories_mean_unclean() -> None:
    assert take_clean_shutdown_epoch([]) == -1

"""The power-loss test mode's switch (server/storage_mode.py) and what a
broker process opens with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.os_log_dirs import OsLogDirectory
from partition_log.os_files import OsDirectory, PowerLossOsDirectory, TornTailOsDirectory
from quorum.driver.rocks import PowerLossRocksStorage, RocksStorage
from quorum.driver.storage_format import format_storage
from server.broker import BrokerProcess, BrokerSettings
from server.config import IGNORED_ENV
from server.storage_mode import (
    LOSE_UNSYNCED_VARIABLE,
    StorageModeError,
    lose_unsynced_from_environment,
    torn_tails_from_environment,
)


def test_off_unless_the_variable_is_1() -> None:
    assert lose_unsynced_from_environment({}) is False
    assert lose_unsynced_from_environment({LOSE_UNSYNCED_VARIABLE: ""}) is False
    assert lose_unsynced_from_environment({LOSE_UNSYNCED_VARIABLE: "0"}) is False
    assert lose_unsynced_from_environment({LOSE_UNSYNCED_VARIABLE: "1"}) is True


def test_torn_is_the_mode_with_torn_writes() -> None:
    torn = {LOSE_UNSYNCED_VARIABLE: "torn"}
    assert lose_unsynced_from_environment(torn) is True
    assert torn_tails_from_environment(torn) is True
    for value in ("", "0", "1"):
        assert torn_tails_from_environment({LOSE_UNSYNCED_VARIABLE: value}) is False
    assert torn_tails_from_environment({}) is False
    with pytest.raises(StorageModeError, match="must be 1 .*, torn .* or 0"):
        torn_tails_from_environment({LOSE_UNSYNCED_VARIABLE: "tron"})


@pytest.mark.parametrize("value", ["yes", "2", "true", "on"])
def test_anything_else_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(StorageModeError, match=f"{LOSE_UNSYNCED_VARIABLE} must be 1"):
        lose_unsynced_from_environment({LOSE_UNSYNCED_VARIABLE: value})


def test_the_variable_is_not_a_setting() -> None:
    """The configuration's loader skips it instead of refusing an unknown key."""
    assert LOSE_UNSYNCED_VARIABLE in IGNORED_ENV


def test_a_log_directory_opens_partition_directories_of_its_class(tmp_path: Path) -> None:
    assert type(OsLogDirectory(tmp_path).create("a-0")) is OsDirectory
    lossy = OsLogDirectory(tmp_path, PowerLossOsDirectory)
    assert type(lossy.create("b-0")) is PowerLossOsDirectory
    assert type(lossy.open("a-0")) is PowerLossOsDirectory
    torn = OsLogDirectory(tmp_path, TornTailOsDirectory)
    assert type(torn.open("b-0")) is TornTailOsDirectory


@pytest.mark.parametrize("lose_unsynced", [False, True])
def test_a_broker_opens_its_stores_in_the_mode(tmp_path: Path, lose_unsynced: bool) -> None:
    metadata_dir = tmp_path / "metadata"
    logs = tmp_path / "logs"
    format_storage(metadata_dir, "kq-storage-mode", 4, [1])
    logs.mkdir()
    settings = BrokerSettings(
        4, "kq-storage-mode", {1: "127.0.0.1:1"}, metadata_dir, [logs], "127.0.0.1:0"
    )

    async def make() -> tuple[type[object], type[object]]:
        process = BrokerProcess(settings, lose_unsynced=lose_unsynced)
        try:
            (log_dir,) = process.replicas.logs.log_dirs
            assert isinstance(log_dir, OsLogDirectory)
            return type(process.node.storage), type(log_dir.create("t-0"))
        finally:
            assert isinstance(process.node.storage, RocksStorage)
            process.node.storage.close()

    storage, partition_dir = asyncio.run(make())
    if lose_unsynced:
        assert (storage, partition_dir) == (PowerLossRocksStorage, PowerLossOsDirectory)
    else:
        assert (storage, partition_dir) == (RocksStorage, OsDirectory)

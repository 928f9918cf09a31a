"""The file seam (partition_log/files.py): one contract run against the real
files on os and the in-memory twin, then the twin's power-loss rule."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from partition_log.errors import Errors, PartitionLogError
from partition_log.files import FileDirectory, MemoryDirectory
from partition_log.os_files import OsDirectory, PowerLossOsDirectory

Make = Callable[[], FileDirectory]


@pytest.fixture(params=["os", "power-loss", "memory"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    if request.param == "os":
        return lambda: OsDirectory(tmp_path)
    if request.param == "power-loss":
        return lambda: PowerLossOsDirectory(tmp_path)
    directory = MemoryDirectory()
    return lambda: directory


def test_append_read_size(make: Make) -> None:
    d = make()
    f = d.create("a.log")
    assert f.size == 0 and f.name == "a.log"
    f.append(b"hello ")
    f.append(memoryview(b"world"))
    f.append(bytearray(b"!"))
    assert f.size == 12
    assert f.read(0, 100) == b"hello world!"
    assert f.read(6, 5) == b"world"
    assert f.read(12, 5) == b""
    f.sync()
    f.close()
    g = d.open("a.log")
    assert g.size == 12 and g.read(0, 12) == b"hello world!"
    g.close()


def test_truncate_then_append(make: Make) -> None:
    d = make()
    f = d.create("a")
    f.append(b"0123456789")
    f.truncate(4)
    assert f.size == 4
    f.append(b"xy")
    assert f.read(0, 10) == b"0123xy"
    with pytest.raises(PartitionLogError, match="cannot truncate 6 bytes to 7") as e:
        f.truncate(7)
    assert e.value.code is Errors.KAFKA_STORAGE_ERROR
    assert f.read(0, 10) == b"0123xy"
    f.close()


def test_names(make: Make) -> None:
    d = make()
    for name in ("b", "a", "c"):
        d.create(name).close()
    d.sync_directory()
    assert d.list() == ["a", "b", "c"]
    d.rename("a", "z")
    assert d.list() == ["b", "c", "z"] and d.exists("z") and not d.exists("a")
    d.delete("b")
    assert d.list() == ["c", "z"]
    # A rename onto an existing name replaces it (rename(2)).
    f = d.open("c")
    f.append(b"c's bytes")
    f.close()
    d.rename("c", "z")
    assert d.list() == ["z"]
    g = d.open("z")
    assert g.read(0, 100) == b"c's bytes"
    g.close()


@pytest.mark.parametrize("call", ["create", "open", "delete", "rename"])
def test_refusals_name_the_file(make: Make, call: str) -> None:
    d = make()
    d.create("there").close()
    with pytest.raises(PartitionLogError) as e:
        if call == "create":
            d.create("there")
        elif call == "open":
            d.open("missing")
        elif call == "delete":
            d.delete("missing")
        else:
            d.rename("missing", "other")
    assert e.value.code is Errors.KAFKA_STORAGE_ERROR
    assert ("there" if call == "create" else "missing") in str(e.value)
    assert d.list() == ["there"]


@pytest.mark.parametrize("name", ["", "..", "a/b", "../x"])
def test_names_are_plain_file_names(make: Make, name: str) -> None:
    with pytest.raises(PartitionLogError, match="not a plain file name"):
        make().create(name)


def test_closed_file_is_refused(make: Make) -> None:
    f = make().create("a")
    f.close()
    with pytest.raises(PartitionLogError, match="closed"):
        f.append(b"x")


def test_os_append_reaches_the_os_at_once(tmp_path: Path) -> None:
    # No Python buffer: another reader of the path sees the bytes as soon as
    # append returns, without sync or close (what a kill -9 keeps).
    f = OsDirectory(tmp_path).create("a.log")
    f.append(b"x" * 10_000)
    assert (tmp_path / "a.log").read_bytes() == b"x" * 10_000
    f.close()


def test_os_directory_must_exist(tmp_path: Path) -> None:
    with pytest.raises(PartitionLogError, match="is not a directory"):
        OsDirectory(tmp_path / "nope")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(PartitionLogError, match="file is not a directory"):
        OsDirectory(tmp_path / "file")


def test_os_list_skips_directories(tmp_path: Path) -> None:
    os.mkdir(tmp_path / "sub")
    d = OsDirectory(tmp_path)
    d.create("a").close()
    assert d.list() == ["a"]


# -- the twin's power loss --------------------------------------------------------


def test_crash_keeps_synced_bytes_drops_the_unsynced_tail() -> None:
    d = MemoryDirectory()
    f = d.create("a")
    d.sync_directory()
    f.append(b"synced")
    f.sync()
    f.append(b" unsynced")
    d.crash()
    g = d.open("a")
    assert g.read(0, 100) == b"synced"


def test_crash_undoes_an_unsynced_truncation() -> None:
    d = MemoryDirectory()
    f = d.create("a")
    d.sync_directory()
    f.append(b"0123456789")
    f.sync()
    f.truncate(3)
    d.crash()
    assert d.open("a").read(0, 100) == b"0123456789"


def test_a_synced_file_whose_directory_was_not_synced_is_lost() -> None:
    # The rule: a new name is durable only after sync_directory; fsync of the
    # file alone does not make its directory entry survive.
    d = MemoryDirectory()
    f = d.create("new")
    f.append(b"bytes")
    f.sync()
    d.crash()
    assert d.list() == []
    d.create("new").close()
    d.sync_directory()
    d.crash()
    assert d.list() == ["new"]


def test_unsynced_rename_and_delete_are_undone() -> None:
    d = MemoryDirectory()
    f = d.create("a")
    f.append(b"A")
    f.sync()
    d.create("b").close()
    d.sync_directory()
    d.rename("a", "a.deleted")
    d.delete("b")
    assert d.list() == ["a.deleted"]
    d.crash()
    assert d.list() == ["a", "b"]
    assert d.open("a").read(0, 10) == b"A"
    # Once the directory is synced, they stay.
    d.rename("a", "a.deleted")
    d.delete("b")
    d.sync_directory()
    d.crash()
    assert d.list() == ["a.deleted"]
    assert d.durable_names() == ["a.deleted"]


def test_handles_from_before_a_crash_are_stale() -> None:
    d = MemoryDirectory()
    f = d.create("a")
    d.sync_directory()
    d.crash()
    with pytest.raises(PartitionLogError, match="open before a crash"):
        f.append(b"x")


def test_torn_crash_keeps_a_prefix_of_the_unsynced_tail() -> None:
    rng = random.Random(7)
    kept = set()
    for _ in range(50):
        d = MemoryDirectory()
        f = d.create("a")
        d.sync_directory()
        f.append(b"S" * 4)
        f.sync()
        f.append(b"0123456789")
        d.crash(rng)
        data = d.open("a").read(0, 100)
        assert data == (b"SSSS" + b"0123456789")[: len(data)]
        assert len(data) >= 4
        kept.add(len(data))
    # Every length from nothing to everything of the tail occurs.
    assert len(kept) > 5


def test_durable_bytes_is_what_a_crash_keeps() -> None:
    d = MemoryDirectory()
    f = d.create("a")
    d.sync_directory()
    f.append(b"abc")
    f.sync()
    f.append(b"def")
    assert d.durable_bytes("a") == b"abc"
    d.crash()
    assert d.open("a").read(0, 10) == b"abc"

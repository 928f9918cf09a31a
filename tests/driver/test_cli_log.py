"""``kq log dump`` and ``kq log check`` through the real command line on a log
written by PartitionLog on real files: the dump shows what was appended,
check exits 1 naming each kind of damage, and neither changes a file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kq.cli import main
from partition_log.epoch_cache import CHECKPOINT_FILE_NAME, EpochEntry, encode_checkpoint
from partition_log.segment import file_name
from tests.partition_log.test_inspect import file_digests, write_log


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["log", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    write_log(tmp_path / "p-0")
    return tmp_path / "p-0"


def test_dump_shows_the_batches_and_records_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p-0"
    written = write_log(path)
    before = file_digests(path)
    status, out, _ = run(capsys, "dump", str(path), "--records", "--json")
    assert status == 0
    data = json.loads(out)
    batches = [b for s in data["segments"] for b in s["batches"]]
    assert [b["base_offset"] for b in batches] == [offset for offset, _, _ in written]
    for batch, (offset, stored, records) in zip(batches, written, strict=True):
        assert batch["size"] == len(stored) and batch["crc_valid"] is True
        assert batch["count"] == len(records) and batch["producer_id"] == 9
        assert [r["key"]["utf8"] for r in batch["records"]] == [
            r.key.decode() for r in records if r.key is not None
        ]
        assert [r["offset"] for r in batch["records"]] == list(range(offset, offset + 3))
    status, out, _ = run(capsys, "dump", str(path), "--records", "--indexes", "--state")
    assert status == 0
    assert "Dumping 00000000000000000000.log" in out
    assert "base_offset: 0 last_offset: 2 count: 3" in out and "crc_valid: true" in out
    assert '| offset: 1 timestamp: 1000 key: "key-1" value: 0xff0030' in out
    assert "offset index:" in out and "leader-epoch-checkpoint: epoch: 1 start_offset: 0" in out
    segment = path / file_name(0, ".log")
    status, out, _ = run(capsys, "dump", str(segment), "--json")
    assert status == 0 and json.loads(out)["file"] == segment.name
    status, out, _ = run(capsys, "check", str(path))
    assert (status, out.strip()) == (0, f"{path}: no findings")
    status, out, _ = run(capsys, "check", str(path), "--json")
    assert status == 0 and json.loads(out) == {"path": str(path), "ok": True, "findings": []}
    assert file_digests(path) == before


def _damage_bit_flip(path: Path) -> str:
    segment = path / file_name(0, ".log")
    data = bytearray(segment.read_bytes())
    data[80] ^= 0x10
    segment.write_bytes(bytes(data))
    return f"{segment.name} at position 0, offset 0: corrupt batch"


def _damage_torn_tail(path: Path) -> str:
    last = sorted(path.glob("*.log"))[-1]
    with last.open("r+b") as f:
        f.truncate(last.stat().st_size - 7)
    return f"{last.name} at position"


def _damage_index(path: Path) -> str:
    index = path / file_name(0, ".index")
    data = bytearray(index.read_bytes())
    relative, position = struct.unpack_from(">ii", data, 0)
    struct.pack_into(">ii", data, 0, relative, position - 3)
    index.write_bytes(bytes(data))
    return f"{index.name} at position {position - 3}, offset {relative}: index"


def _damage_epochs(path: Path) -> str:
    (path / CHECKPOINT_FILE_NAME).write_bytes(encode_checkpoint((EpochEntry(1, 0),)))
    return "leader-epoch-checkpoint at offset 24: epoch checkpoint"


def _damage_garbage(path: Path) -> str:
    (path / "core.1234").write_bytes(b"\x00" * 10)
    return "core.1234: unknown file"


@pytest.mark.parametrize(
    "damage",
    [_damage_bit_flip, _damage_torn_tail, _damage_index, _damage_epochs, _damage_garbage],
)
def test_check_names_each_kind_of_damage_and_changes_nothing(
    log_dir: Path, capsys: pytest.CaptureFixture[str], damage: object
) -> None:
    assert callable(damage)
    expected = damage(log_dir)
    before = file_digests(log_dir)
    status, out, _ = run(capsys, "check", str(log_dir))
    assert status == 1
    assert expected in out, out
    assert "finding" in out.splitlines()[-1]
    status, out, _ = run(capsys, "check", str(log_dir), "--json")
    report = json.loads(out)
    assert status == 1 and report["ok"] is False and report["findings"]
    assert run(capsys, "dump", str(log_dir), "--records", "--indexes", "--state")[0] == 0
    assert run(capsys, "dump", str(log_dir), "--json")[0] == 0
    assert file_digests(log_dir) == before


def test_dump_names_where_a_segment_stops(
    log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _damage_torn_tail(log_dir)
    last = sorted(log_dir.glob("*.log"))[-1]
    status, out, _ = run(capsys, "dump", str(last))
    assert status == 0 and "(truncated): at position" in out and "a partial batch" in out


def test_paths_that_are_not_a_log_are_refused(
    tmp_path: Path, log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        missing: "no such file or directory",
        empty: "not a partition directory",
        log_dir / CHECKPOINT_FILE_NAME: "is not a segment file",
    }
    for path, message in cases.items():
        for verb in ("dump", "check"):
            status, out, err = run(capsys, verb, str(path))
            assert status == 1 and out == ""
            assert err.startswith(f"kq log {verb}: {path}") and message in err, err

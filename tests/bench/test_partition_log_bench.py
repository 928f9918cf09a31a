"""The partition-log benchmark (bench/partition_log.py) at its small preset,
so that it keeps running as the log changes.  Nothing here checks a speed:
only that every figure is there beside its floor, and that the benchmark
leaves no file behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import partition_log as bench


def test_the_small_preset_measures_every_figure_against_its_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--preset", "small", "--dir", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    figures = [row["figure"] for row in rows]
    for size in bench.RECORD_SIZES:
        assert f"append {size}-byte records, no fsync" in figures
        assert f"append {size}-byte records, flush_messages=1" in figures
        # Each append figure has its bound (a Python call doing the CRC and the write).
        assert sum(f.startswith(f"append {size}-byte") and "bound" in f for f in figures) == 2
        assert any(f.startswith(f"read sequential, {size}-byte") for f in figures)
        assert any(f.startswith(f"read random, {size}-byte") for f in figures)
        assert any(
            f.startswith("recovery of") and f.endswith(f"{size}-byte records") for f in figures
        )
    assert any(f.startswith("resident memory, 3 logs open") for f in figures)
    assert any(f.startswith("compaction of") for f in figures)
    assert len(rows) == 2 * 2 * 2 + 2 * 2 + 2 + 1 + 1
    for row in rows:
        assert set(row) >= {"figure", "unit", "kq", "floor", "floor_is", "ratio"}
        assert row["kq"] > 0 and row["floor"] > 0 and row["ratio"] > 0, row
    # Every temporary directory and file is gone.
    assert list(tmp_path.iterdir()) == []


def test_the_memory_child_reports_its_resident_set(tmp_path: Path) -> None:
    empty = bench.run_child([], 1 << 20)
    assert empty["logs"] == 0 and empty["rss_kib"] > 0


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--dir", str(tmp_path / "missing")])
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "0", "--dir", str(tmp_path)])
    assert "--repeat 0 must be at least 1" in capsys.readouterr().err

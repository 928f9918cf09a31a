"""The partition log's format and bookkeeping modules are pure: no clock, no
I/O, no threads, no global random (the rule of tests/quorum/test_purity.py).

Every module of ``partition_log/`` is checked for now; the module that owns
the segment files, when it comes, is the one to exempt here by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "partition_log"


def pure_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_pure_modules_found() -> None:
    names = {str(p.relative_to(PACKAGE)) for p in pure_modules()}
    assert {"__init__.py", "batch.py", "records.py", "errors.py"} <= names


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize("line", ["import os\n", "from time import monotonic\n", "import io\n"])
def test_the_check_fires_on_the_batch_module(line: str) -> None:
    # The same check over batch.py with one I/O import added finds it.
    source = (PACKAGE / "batch.py").read_text() + line
    assert impurities(source, "partition_log/batch.py") != []

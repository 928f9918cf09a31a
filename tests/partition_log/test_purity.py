"""The partition log's format and bookkeeping modules are pure: no clock, no
I/O, no threads, no global random (the rule of tests/quorum/test_purity.py).

Every module of ``partition_log/`` is checked but ``os_files.py``, the real
implementation of the file seam (``partition_log/files.py``), exempted here
by name; the seam's protocol and its in-memory twin stay pure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "partition_log"


# The one module of the package that may do I/O: the file seam on ``os``.
EXEMPT = {"os_files.py"}


def pure_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE)) not in EXEMPT)


def test_pure_modules_found() -> None:
    names = {str(p.relative_to(PACKAGE)) for p in pure_modules()}
    assert {"__init__.py", "batch.py", "records.py", "errors.py"} <= names
    assert {"files.py", "index.py", "segment.py"} <= names


def test_only_the_os_file_module_is_exempt() -> None:
    # The exemption names one module, which exists and does I/O; every other
    # module of the package is checked.
    assert {"os_files.py"} == EXEMPT
    exempt = PACKAGE / "os_files.py"
    assert impurities(exempt.read_text(), "partition_log/os_files.py") != []
    every = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert every - {str(p.relative_to(PACKAGE)) for p in pure_modules()} == EXEMPT


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize("line", ["import os\n", "from time import monotonic\n", "import io\n"])
def test_the_check_fires_on_the_batch_module(line: str) -> None:
    # The same check over batch.py with one I/O import added finds it.
    source = (PACKAGE / "batch.py").read_text() + line
    assert impurities(source, "partition_log/batch.py") != []

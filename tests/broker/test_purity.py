"""The replica state machine is pure: no clock, no I/O, no threads, no global
random (the rule of tests/quorum/test_purity.py). Every module of
``broker/replica/``, ``broker/errors.py``, ``broker/record_bytes.py`` (the
coordinator records' byte primitives) and ``broker/coordinator_result.py``
(their decisions) is checked; time enters as
``now_ms`` arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "broker" / "replica"


def pure_modules() -> list[Path]:
    return [
        *sorted(PACKAGE.rglob("*.py")),
        ROOT / "broker" / "errors.py",
        ROOT / "broker" / "record_bytes.py",
        ROOT / "broker" / "coordinator_result.py",
        ROOT / "broker" / "fetch_session.py",
    ]


def test_pure_modules_found() -> None:
    names = {p.name for p in pure_modules()}
    assert {"__init__.py", "leader.py", "follower.py", "partition.py", "seam.py"} <= names
    assert {"types.py", "errors.py", "record_bytes.py", "coordinator_result.py"} <= names


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize(
    "line", ["import time\n", "from threading import Lock\n", "import socket\n", "import asyncio\n"]
)
def test_the_check_fires_on_the_partition_module(line: str) -> None:
    source = (PACKAGE / "partition.py").read_text() + line
    assert impurities(source, "broker/replica/partition.py") != []

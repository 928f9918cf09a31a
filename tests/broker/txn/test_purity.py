"""The transaction coordinator's core is pure: no clock, no I/O, no
threads, no global random (the rule of tests/quorum/test_purity.py). Every
module of ``broker/txn/`` is checked; time enters as ``now_ms``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "broker" / "txn"


def pure_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_pure_modules_found() -> None:
    names = {p.name for p in pure_modules()}
    assert {
        "__init__.py",
        "types.py",
        "records.py",
        "codec.py",
        "state.py",
        "placement.py",
        "coordinator.py",
    } <= names


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize(
    "line",
    [
        "import time\n",
        "from threading import Lock\n",
        "import socket\n",
        "import asyncio\n",
        "import grpc\n",
        "import os\n",
        "import random\nx = random.random()\n",
    ],
)
def test_the_check_fires_on_the_coordinator(line: str) -> None:
    source = (PACKAGE / "coordinator.py").read_text() + line
    assert impurities(source, "broker/txn/coordinator.py") != []

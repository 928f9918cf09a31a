"""The consensus core is pure: no clock, no I/O, no threads, no global random.

Every module under ``quorum/`` is checked except the I/O driver package
``quorum/driver/`` (asyncio, gRPC, RocksDB, files, the command line).  Time
enters as ``now_ms`` and randomness as an injected ``random.Random``; a module
may import ``random`` only to name that type.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_layers import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "quorum"

FORBIDDEN = {
    "asyncio", "concurrent", "datetime", "grpc", "http", "io", "multiprocessing", "os",
    "pathlib", "rocksdict", "selectors", "shutil", "signal", "socket", "subprocess",
    "tempfile", "threading", "time", "urllib",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "input", "exec", "eval", "__import__"}
DRIVER_PACKAGE = PACKAGE / "driver"


def impurities(source: str, filename: str = "<source>") -> list[str]:
    """Why ``source`` is not pure, one line per offence (empty if pure)."""
    problems: list[str] = []
    tree = ast.parse(source, filename)
    random_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in FORBIDDEN:
                    problems.append(f"{filename}:{node.lineno} imports {alias.name}")
                if alias.name == "random":
                    random_aliases.add(alias.asname or "random")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in FORBIDDEN:
                problems.append(f"{filename}:{node.lineno} imports from {node.module}")
            if node.module == "random":
                for alias in node.names:
                    if alias.name != "Random":
                        problems.append(
                            f"{filename}:{node.lineno} imports random.{alias.name} "
                            "(global randomness)"
                        )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            problems.append(f"{filename}:{node.lineno} calls {node.func.id}()")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in random_aliases
            and node.attr != "Random"
        ):
            problems.append(f"{filename}:{node.lineno} uses random.{node.attr} (global randomness)")
    return problems


def core_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if DRIVER_PACKAGE not in p.parents)


def test_core_modules_found() -> None:
    names = {str(p.relative_to(PACKAGE)) for p in core_modules()}
    assert {"core.py", "log.py", "ready.py", "messages.py", "memory.py", "sim/node.py"} <= names
    assert not any(n.startswith("driver") for n in names)


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize(
    ("source", "offence"),
    [
        ("import time\n", "imports time"),
        ("import os.path\n", "imports os.path"),
        ("from asyncio import sleep\n", "imports from asyncio"),
        ("import grpc.aio as g\n", "imports grpc.aio"),
        ("from threading import Lock\n", "imports from threading"),
        ("import random\nx = random.random()\n", "uses random.random"),
        ("import random as r\nr.shuffle([])\n", "uses random.shuffle"),
        ("from random import choice\n", "imports random.choice"),
        ("data = open('f').read()\n", "calls open()"),
    ],
)
def test_checker_catches_impurity(source: str, offence: str) -> None:
    found = impurities(source)
    assert any(offence in p for p in found), found


def test_checker_allows_injected_random() -> None:
    assert impurities("import random\ndef f(rng: random.Random) -> None: ...\n") == []


# -- what the core imports from the rest of kq must be pure too ---------------

FIRST_PARTY = PACKAGES


def _first_party_imports(path: Path) -> set[str]:
    """Modules of kq's own packages that ``path`` imports (at any depth of
    the file: a function-level import counts too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found |= {n for n in names if n.split(".")[0] in FIRST_PARTY}
    return found


def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def imported_outside_core(paths: list[Path]) -> dict[str, Path]:
    """Every module outside the core that core modules import, directly or
    through each other (by module name)."""
    seen: dict[str, Path] = {}
    todo = list(paths)
    visited: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in visited:
            continue
        visited.add(path)
        for module in _first_party_imports(path):
            target = _module_path(module)
            if target is None:
                continue
            if target.is_relative_to(PACKAGE) and DRIVER_PACKAGE not in target.parents:
                todo.append(target)  # core: checked by test_module_is_pure
            elif module not in seen:
                seen[module] = target
                todo.append(target)
    return seen


def test_what_the_core_imports_from_elsewhere_is_pure() -> None:
    outside = imported_outside_core(core_modules())
    assert "history.ops" in outside  # the simulator records histories with it
    for module, path in sorted(outside.items()):
        assert not path.is_relative_to(DRIVER_PACKAGE), f"the core imports {module}"
        assert impurities(path.read_text(), str(path.relative_to(ROOT))) == [], module

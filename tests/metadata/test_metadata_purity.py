"""The controller's decisions are pure, like the consensus core.

Records, image, delta, the state machine and every decision module import
no clock, I/O, threads or global randomness (the rule and its checker are
tests/quorum/test_purity.py's): time enters as ``now_ms`` and randomness as
an injected ``random.Random``, so a test or a simulation replays them
exactly.  The run-time glue (active, server, service, client, CLI) is I/O.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.quorum.test_purity import impurities

PACKAGE = Path(__file__).resolve().parents[2] / "metadata"
PURE = [
    "records.py",
    "image.py",
    "delta.py",
    "state_machine.py",
    "errors.py",
    "configs.py",
    "placement.py",
    "partition_change.py",
    "heartbeats.py",
    "controller.py",
    "requests.py",
    "control_state.py",
    "cluster_control.py",
    "replication_control.py",
    "config_control.py",
    "feature_control.py",
    "acls.py",
    "authorizer.py",
    "acl_control.py",
]


@pytest.mark.parametrize("name", PURE)
def test_decision_module_is_pure(name: str) -> None:
    path = PACKAGE / name
    assert impurities(path.read_text(), str(path)) == []


def test_the_checker_catches_an_impure_module() -> None:
    assert impurities("import time\nx = time.monotonic()\n", "m.py") == ["m.py:1 imports time"]

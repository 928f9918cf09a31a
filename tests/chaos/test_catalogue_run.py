"""The short catalogue CI runs: two bugs that surely fire on a real local
cluster, each under its recipe and verified with the Spark job of ``kq
chaos run --verify``, then one clean run of each recipe, which must raise
nothing.

- Q1, in the quorum: the leader commits without a majority; the recipe
  cuts the leader off from the other controllers for 3 to 9 s while the
  register workload's clients still reach it, so it acknowledges writes
  the new leader never gets (linearizable, lost-writes).
- B1, in the brokers: a replica that becomes a follower truncates to its
  HW instead of to the leader's end of its epoch (KIP-101); the recipe
  moves partitions' leadership every fraction of a second (preferred
  elections) under the queue workload, so a new leader has dropped
  acknowledged records its followers then drop too (inconsistent-offsets,
  lost-write, no-loss).

Bounded in time; whatever a run leaves running under its scratch folder
is stopped by its pid, and then the test fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bugs import Bug
from chaos.catalogue import render_table, run_catalogue
from spark_verify.job import VerifyOptions, verify
from tests.chaos.cluster_scenarios import need_iptables, processes_under, scratch_tempdir

pytestmark = [pytest.mark.slow, pytest.mark.spark]

SHORT: tuple[Bug, ...] = (Bug.COMMIT_WITHOUT_MAJORITY, Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER)


def _stop_leftovers(scratch: Path) -> list[str]:
    """SIGKILL every process still running under ``scratch``, by its pid;
    return what was left."""
    left = processes_under(scratch)
    for line in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    return left


def test_the_short_catalogue_catches_its_bugs_and_the_clean_run_raises_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession
) -> None:
    need_iptables()
    scratch = scratch_tempdir(tmp_path, monkeypatch)

    def verifier(path: Path) -> Mapping[str, Any]:
        return verify(spark, [path], VerifyOptions(report=False)).verdict

    lines: list[str] = []
    try:
        result = asyncio.run(
            asyncio.wait_for(
                run_catalogue(
                    SHORT,
                    verifier,
                    runs=2,
                    clean_runs=len(SHORT),
                    runs_dir=str(tmp_path / "runs"),
                    seed=16,
                    progress=lines.append,
                ),
                2_700,
            )
        )
    finally:
        left = _stop_leftovers(scratch)
    table = render_table(result)
    print(table)
    print(json.dumps(result.to_json()))
    assert left == [], left
    by_bug = {b.bug: b for b in result.bugs}
    q1 = by_bug[Bug.COMMIT_WITHOUT_MAJORITY]
    expected = {"linearizable", "lost-writes", "log-agreement"}
    assert q1.caught and expected & set(q1.fired), "\n".join([table, *lines])
    b1 = by_bug[Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER]
    expected = {"inconsistent-offsets", "lost-write", "unseen", "no-loss", "truncated-committed"}
    assert b1.caught and expected & set(b1.fired), "\n".join([table, *lines])
    # One clean run of each recipe: the register one, then the queue one.
    assert [c.recipe.workload for c in result.clean] == ["register", "queue"]
    for clean in result.clean:
        assert clean.bug is None and clean.status == "clean", "\n".join([table, *lines])
    assert result.ok and result.findings == () and result.false_alarms == ()
    # Each run was made with its bug, and says so; the clean ones with none.
    for bug, outcome in [(b.bug, run) for b in (q1, b1) for run in b.runs]:
        assert bug is not None and outcome.path is not None
        assert json.loads((outcome.path / "config.json").read_text())["bugs"] == [bug.id]
    for clean in result.clean:
        clean_path = clean.runs[0].path
        assert clean_path is not None
        assert json.loads((clean_path / "summary.json").read_text())["bugs"] == []
    assert list(scratch.iterdir()) == []

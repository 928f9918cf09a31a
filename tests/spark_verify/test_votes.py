"""vote-durability as a Spark job (``spark_verify.votes``) finds exactly the
anomalies of the reference (``history.votes``) on the same synthetic
exports, with the same sentences; ``kq verify`` judges a run by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bench.verify_histories import Sizes, write_register_run
from history.votes import check_vote_durability, read_run_votes
from spark_verify.job import VerifyOptions, verify
from spark_verify.load import find_runs
from spark_verify.votes import check_vote_runs
from tests.history.vote_exports import (
    EPOCH_LOST,
    FORGOT_THEN_TWICE,
    KEPT,
    NEW_EPOCH,
    STORED_WITHOUT_VOTE,
    write_votes,
)

pytestmark = pytest.mark.spark

CASES: dict[str, list[dict[str, Any]]] = {
    "kept": KEPT + NEW_EPOCH,
    "twice": KEPT + FORGOT_THEN_TWICE,
    "lost": EPOCH_LOST + NEW_EPOCH,
    "stored": STORED_WITHOUT_VOTE,
    "all": KEPT + NEW_EPOCH + FORGOT_THEN_TWICE + EPOCH_LOST + STORED_WITHOUT_VOTE,
}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small linearizable register run with three nodes' logs."""
    return write_register_run(
        tmp_path_factory.mktemp("base"), Sizes(ops=200, keys=4, per_key=2, seed=3)
    )


def _runs(root: Path, base: Path) -> dict[str, Path]:
    import shutil

    out = {}
    for name, lines in CASES.items():
        run = root / name
        shutil.copytree(base, run, ignore=shutil.ignore_patterns("verify"))
        write_votes(run, lines)
        out[name] = run
    return out


def test_spark_finds_what_the_reference_finds(
    spark: SparkSession, base_run: Path, tmp_path: Path
) -> None:
    folders = _runs(tmp_path, base_run)
    runs = find_runs([tmp_path])
    result = check_vote_runs(spark, runs)
    assert result.valid is False
    got: dict[str, list[tuple[Any, ...]]] = {name: [] for name in folders}
    for a in result.anomalies:
        assert a.run is not None
        got[a.run].append((a.kind, a.node, tuple(w["seq"] for w in a.witness), a.message))
    fired = {}
    for name, run in folders.items():
        want = [
            (a.kind, a.node, tuple(w["seq"] for w in a.witness), a.message)
            for a in check_vote_durability(read_run_votes(run))
        ]
        assert got[name] == want, name
        fired[name] = sorted({w[0] for w in want})
    assert fired == {
        "kept": [],
        "twice": ["double-vote", "vote-forgotten"],
        "lost": ["epoch-forgotten"],
        "stored": ["vote-forgotten"],
        "all": ["double-vote", "epoch-forgotten", "vote-forgotten"],
    }
    assert result.count == sum(len(v) for v in got.values())
    assert result.detail["kinds"] == {"vote-forgotten": 6, "double-vote": 2, "epoch-forgotten": 2}


def test_the_job_judges_a_run_by_it(spark: SparkSession, base_run: Path, tmp_path: Path) -> None:
    folders = _runs(tmp_path / "runs", base_run)
    done = verify(
        spark,
        [folders["kept"], folders["stored"]],
        VerifyOptions(out=tmp_path / "out", report=False),
    )
    check = done.verdict["checks"]["vote-durability"]
    assert check["valid"] is False and check["count"] == 1
    assert check["anomalies"][0]["run"] == "stored"
    verdicts = {r["name"]: (r["verdict"], r["failed"]) for r in done.verdict["runs"]}
    assert verdicts == {"kept": ("valid", []), "stored": ("invalid", ["vote-durability"])}


def test_runs_without_vote_exports_are_not_applicable(spark: SparkSession, base_run: Path) -> None:
    result = check_vote_runs(spark, find_runs([base_run]))
    assert result.valid is True and result.detail["applicable"] is False

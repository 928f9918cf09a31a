"""``kq verify`` of several runs at once: Jepsen's history.edn beside kq's JSON
Lines, one verdict per run, the summary table, and the exit statuses
(0 valid, 1 invalid, 5 cannot verify)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from kq.cli import main
from spark_verify.job import VerifyOptions, verify
from spark_verify.run import EXIT_CANNOT_VERIFY, EXIT_INVALID, EXIT_VALID
from tests.spark_verify.test_jepsen import INDEPENDENT_INVALID, INDEPENDENT_VALID

pytestmark = pytest.mark.spark

# Reading and pairing the history, well-formedness, the per-key checks; was
# 39 before the export checks and the key listing were skipped when idle.
JOBS_WITHOUT_EXPORTS = 12


def json_equivalent() -> str:
    """INDEPENDENT_VALID in kq's format, written by hand: integer values,
    keys "1" and "2", the nemesis's ops left out, the refused cas without
    an error, the crashed write's keyword error as its name."""
    ops: list[dict[str, Any]] = [
        {"time": 1000, "type": "invoke", "process": 0, "f": "write", "key": "1", "value": 3},
        {"time": 1100, "type": "invoke", "process": 1, "f": "read", "key": "2", "value": None},
        {"time": 2000, "type": "ok", "process": 0, "f": "write", "key": "1", "value": 3},
        {"time": 2100, "type": "ok", "process": 1, "f": "read", "key": "2", "value": None},
        {"time": 3000, "type": "invoke", "process": 0, "f": "cas", "key": "1", "value": [3, 4]},
        {"time": 3100, "type": "invoke", "process": 1, "f": "cas", "key": "1", "value": [5, 6]},
        {"time": 4000, "type": "ok", "process": 0, "f": "cas", "key": "1", "value": [3, 4]},
        {"time": 4100, "type": "fail", "process": 1, "f": "cas", "key": "1", "value": [5, 6]},
        {"time": 5000, "type": "invoke", "process": 1, "f": "write", "key": "2", "value": 7},
        {"time": 9000, "type": "info", "process": 1, "f": "write", "key": "2", "value": 7,
         "error": "timeout"},
        {"time": 9100, "type": "invoke", "process": 0, "f": "read", "key": "1", "value": None},
        {"time": 9200, "type": "ok", "process": 0, "f": "read", "key": "1", "value": 4},
        {"time": 9300, "type": "invoke", "process": 0, "f": "read", "key": "2", "value": None},
        {"time": 9400, "type": "ok", "process": 0, "f": "read", "key": "2", "value": 7},
    ]  # fmt: skip
    return "".join(
        json.dumps({"index": i, **op}, separators=(",", ":")) + "\n" for i, op in enumerate(ops)
    )


@pytest.fixture
def histories(tmp_path: Path) -> Path:
    for name, text in (("edn-good", INDEPENDENT_VALID), ("edn-bad", INDEPENDENT_INVALID)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "history.edn").write_text(text)
    (tmp_path / "json-good.jsonl").write_text(json_equivalent())
    (tmp_path / "broken.edn").write_text(
        INDEPENDENT_VALID.replace(":process 1, :time 1100", ":process 1 :time")
    )
    # kq's format, well typed, but the run ended with an op in flight.
    open_invoke = json_equivalent().splitlines()[:-1]
    (tmp_path / "open.jsonl").write_text("\n".join(open_invoke) + "\n")
    # A typo'd field name on lines 1 and 3 (the write's invoke and completion).
    typo = json_equivalent().replace(
        '"process":0,"f":"write","key":"1","value":3}',
        '"proces":0,"f":"write","key":"1","value":3}',
        2,
    )
    (tmp_path / "typo.jsonl").write_text(typo)
    return tmp_path


def verify_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(["verify", *args, "--json", "--no-report"])
    return code, json.loads(capsys.readouterr().out)


def test_edn_and_its_json_equivalent_get_the_same_verdict(
    spark: SparkSession, histories: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, verdict = verify_json(
        [
            str(histories / "edn-good"),
            str(histories / "json-good.jsonl"),
            "--model",
            "cas-register",
            "--out",
            str(histories / "out1"),
        ],
        capsys,
    )
    assert code == EXIT_VALID, verdict["runs"]
    runs = {r["name"]: r for r in verdict["runs"]}
    assert set(runs) == {"edn-good", "json-good"}
    for r in runs.values():
        assert (r["verdict"], r["model"], r["ops"], r["keys"]) == ("valid", "register", 7, 2)
    assert verdict["verdict"] == "valid"
    # No node exports: their checks are not applicable (and cost no job).
    assert verdict["checks"]["lost-writes"]["detail"]["applicable"] is False


def test_one_verdict_per_run_and_the_exit_statuses(
    spark: SparkSession, histories: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, verdict = verify_json(
        [str(histories / "edn-good"), str(histories / "edn-bad"), "--out", str(histories / "o2")],
        capsys,
    )
    assert code == EXIT_INVALID
    runs = {r["name"]: r for r in verdict["runs"]}
    assert runs["edn-good"]["verdict"] == "valid"
    assert runs["edn-bad"]["verdict"] == "invalid"
    assert "linearizable" in runs["edn-bad"]["failed"]
    (anomaly,) = verdict["checks"]["linearizable"]["anomalies"]
    assert (anomaly["run"], anomaly["key"]) == ("edn-bad", "1")
    assert [(w["f"], w.get("result")) for w in anomaly["witness"]] == [
        ("write", 3),
        ("cas", [3, 4]),
        ("read", 3),
    ]

    # A history that cannot be read, and one that is not well formed: each
    # "cannot verify" (never "not linearizable"), and the others still verified.
    code = main(
        [
            "verify",
            str(histories / "edn-good"),
            str(histories / "edn-bad"),
            str(histories / "broken.edn"),
            str(histories / "open.jsonl"),
            str(histories / "typo.jsonl"),
            "--model",
            "register",
            "--no-report",
            "--out",
            str(histories / "o3"),
        ]
    )
    text = capsys.readouterr().out
    assert code == EXIT_CANNOT_VERIFY, text
    table = text[text.index("runs:") :]
    header = table.splitlines()[1].split()
    assert header == ["run", "model", "operations", "keys", "verdict", "time"]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:7]}
    assert rows["edn-good"][1:5] == ["register", "7", "2", "valid"]
    assert rows["edn-bad"][4] == "INVALID"
    assert rows["broken"][4:6] == ["CANNOT", "VERIFY"]
    assert rows["open"][4:6] == ["CANNOT", "VERIFY"]
    assert "broken.edn: line 2: not EDN" in text
    assert rows["typo"][4:6] == ["CANNOT", "VERIFY"]
    # Each names the file, the line and what is wrong there.
    assert "open.jsonl: line 13: process 0's read was never completed" in text
    assert "typo.jsonl: line 1: unknown field(s) proces" in text
    assert "verdict: CANNOT VERIFY" in text
    # The unreadable and the open runs (the column is as wide as the longest check name).
    assert re.search(r"^  well-formed +INVALID", text, re.MULTILINE), text

    # Only unreadable histories: cannot verify, no verdict on anything.
    code, verdict = verify_json(
        [str(histories / "broken.edn"), "--out", str(histories / "o4")], capsys
    )
    assert code == EXIT_CANNOT_VERIFY
    assert [r["verdict"] for r in verdict["runs"]] == ["cannot-verify"]
    assert "line 2" in verdict["runs"][0]["reason"]


def test_a_run_without_exports_or_versions_costs_few_jobs(
    spark: SparkSession, histories: Path
) -> None:
    # No node exports (their checks run no job), no offsets (no job for
    # shared versions), a valid history and no report (no job to list keys).
    sc = spark.sparkContext
    group = "test-few-jobs"
    sc.setJobGroup(group, "kq verify's jobs")
    try:
        done = verify(
            spark, [histories / "edn-good"], VerifyOptions(out=histories / "o5", report=False)
        )
    finally:
        sc.setJobGroup("", "")
    assert done.verdict["verdict"] == "valid"
    jobs = len(sc.statusTracker().getJobIdsForGroup(group))
    assert jobs <= JOBS_WITHOUT_EXPORTS, jobs

"""The whole verification job and ``kq verify``, on run folders: valid ones,
ones with one planted anomaly of each kind, malformed ones, histories from
other tools, the simulator's runs, and under ``spark-submit``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bench.verify_histories import Sizes, write_register_run
from kq.cli import main
from spark_verify.job import CHECK_ORDER, VerifyOptions, verify

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A linearizable register run: 3,000 ops over 40 keys, 3 processes per
    key, some info writes, three nodes' logs."""
    return write_register_run(
        tmp_path_factory.mktemp("runs"), Sizes(ops=3_000, keys=40, per_key=3, seed=5)
    )


def copy_run(run: Path, dest: Path, name: str) -> Path:
    out = dest / name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("verify"))
    return out


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def rewrite(path: Path, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    text = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in change(lines(path)))
    path.write_text(text)


def checks(verdict: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = verdict["checks"]
    return out


def test_a_linearizable_run_is_valid_with_every_check_and_a_report(
    spark: SparkSession, clean_run: Path, tmp_path: Path
) -> None:
    done = verify(spark, [clean_run], VerifyOptions(out=tmp_path / "out"))
    v = dict(done.verdict)
    assert v["valid"] is True, json.dumps(v["checks"], indent=1)[:3000]
    assert list(checks(v)) == list(CHECK_ORDER)
    assert checks(v)["linearizable"]["detail"]["keys"] == 40
    assert checks(v)["final-metadata"]["detail"]["applicable"] is False
    assert v["runs"][0]["ops"] == 3_000 and v["runs"][0]["model"] == "register"
    assert json.loads(done.verdict_path.read_text())["valid"] is True
    assert done.report_path is not None
    page = done.report_path.read_text()
    assert "linearizable" in page and "<svg" in page


def _first(ops: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    return next(o for o in ops if all(o.get(k) == v for k, v in match.items()))


def test_planted_anomalies_are_found_with_witnesses(
    spark: SparkSession, clean_run: Path, tmp_path: Path
) -> None:
    # 1. A read returns a value no one wrote: not linearizable.
    bad_read = copy_run(clean_run, tmp_path, "bad-read")
    read = _first(lines(bad_read / "history.jsonl"), type="ok", f="read")

    def corrupt(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for o in ops:
            if o["index"] == read["index"]:
                o["value"] = "v-never-written"
                o.pop("offset", None)
                o.pop("epoch", None)
        return ops

    rewrite(bad_read / "history.jsonl", corrupt)
    # 2. An acknowledged write's record was replaced, on every node, by
    # another epoch's: the write was lost (and that epoch's record, followed
    # by epoch 1 again, breaks the log's epoch order).
    lost = copy_run(clean_run, tmp_path, "lost")
    write = _first(lines(lost / "history.jsonl"), type="ok", f="write")

    def overwrite(ls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for x in ls:
            if x["offset"] == write["offset"]:
                x.update(epoch=2, hash="0" * 64)
        return ls

    for node in (1, 2, 3):
        rewrite(lost / "nodes" / str(node) / "log.jsonl", overwrite)
    done = verify(spark, [bad_read, lost], VerifyOptions(out=tmp_path / "out", report=False))
    v = dict(done.verdict)
    assert v["valid"] is False
    lin = checks(v)["linearizable"]
    assert lin["valid"] is False and lin["count"] == 1
    (anomaly,) = lin["anomalies"]
    assert anomaly["run"] == "bad-read" and anomaly["key"] == read["key"]
    assert read["index"] in {w["complete_index"] for w in anomaly["witness"]}
    assert checks(v)["aborted-reads"]["count"] >= 1  # a phantom read
    lost_check = checks(v)["lost-writes"]
    assert lost_check["valid"] is False and lost_check["count"] == 1
    assert lost_check["anomalies"][0]["run"] == "lost"
    assert lost_check["anomalies"][0]["witness"][0]["complete_index"] == write["index"]
    hw = checks(v)["high-watermark"]
    assert hw["count"] == 3 and {a["run"] for a in hw["anomalies"]} == {"lost"}
    # The nodes agree with each other, and one run's damage stays its own.
    assert checks(v)["log-agreement"]["valid"] is True
    assert checks(v)["single-leader"]["valid"] is True


def test_a_malformed_history_is_reported_with_its_lines(
    spark: SparkSession, clean_run: Path, tmp_path: Path
) -> None:
    run = copy_run(clean_run, tmp_path, "malformed")
    ops = lines(run / "history.jsonl")
    victim = _first(ops, type="ok", f="write")
    # Drop the invoke of one completed write: its completion is unmatched.
    invoke = max(
        (
            o
            for o in ops
            if o["type"] == "invoke"
            and o["process"] == victim["process"]
            and o["index"] < victim["index"]
        ),
        key=lambda o: o["index"],
    )
    kept = [o for o in ops if o["index"] != invoke["index"]]
    for i, o in enumerate(kept):
        o["index"] = i
    rewrite(run / "history.jsonl", lambda _: kept)
    done = verify(spark, [run], VerifyOptions(out=tmp_path / "out", report=False))
    wf = checks(dict(done.verdict))["well-formed"]
    assert wf["valid"] is False
    kinds = {a["kind"] for a in wf["anomalies"]}
    assert "unmatched-completion" in kinds, kinds
    quoted = [
        a["witness"][0]["line"] for a in wf["anomalies"] if a["kind"] == "unmatched-completion"
    ]
    assert any(f'"process":{victim["process"]}' in (q or "") for q in quoted)
    assert done.verdict["valid"] is False

    # An op the model does not have: reported, its key undecided, no crash.
    odd = copy_run(clean_run, tmp_path, "odd-f")
    target = _first(lines(odd / "history.jsonl"), type="ok", f="write")

    def rename(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for o in ops:
            if (
                o["process"] == target["process"]
                and o["f"] == "write"
                and o["value"] == target["value"]
            ):
                o["f"] = "increment"
        return ops

    rewrite(odd / "history.jsonl", rename)
    done = verify(spark, [odd], VerifyOptions(out=tmp_path / "out2", report=False))
    v = dict(done.verdict)
    wf = checks(v)["well-formed"]
    assert wf["valid"] is False and wf["detail"]["problems"] == {"model": 1}
    assert "increment" in wf["anomalies"][0]["message"]
    assert wf["anomalies"][0]["key"] == target["key"]
    lin = checks(v)["linearizable"]
    assert lin["valid"] == "unknown" and lin["detail"]["unknown"] == 1


def test_kq_verify_exit_codes_and_json(
    clean_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["verify", str(clean_run), "--master", "local[2]", "--json", "--out", str(out)])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["valid"] is True
    assert (out / "verdict.json").is_file() and (out / "report.html").is_file()

    # A history from another tool: no run folder, so the model must be given.
    bare = tmp_path / "jepsen-register.jsonl"
    shutil.copy(clean_run / "history.jsonl", bare)
    assert main(["verify", str(bare), "--out", str(tmp_path / "o2")]) == 2
    assert "--model" in capsys.readouterr().err
    code = main(
        ["verify", str(bare), "--model", "register", "--no-report", "--out", str(tmp_path / "o3")]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "linearizable" in text and "verdict: valid" in text
    # No exports: the log checks have nothing to say, and say so.
    verdict = json.loads((tmp_path / "o3" / "verdict.json").read_text())
    assert checks(verdict)["lost-writes"]["valid"] is True

    # Nothing to verify.
    assert main(["verify", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err

    # A key whose search is long (ten concurrent writes and reads, then a
    # read of no value): with too small a budget it is unknown (exit 3),
    # with the default one, not linearizable (exit 1).
    hard = tmp_path / "hard.jsonl"
    hard.write_text("".join(json.dumps(x) + "\n" for x in _hard_history()))
    code = main(
        [
            "verify",
            str(hard),
            "--model",
            "register",
            "--key-budget",
            "1e-9",
            "--no-report",
            "--out",
            str(tmp_path / "o4"),
        ]
    )
    capsys.readouterr()
    verdict = json.loads((tmp_path / "o4" / "verdict.json").read_text())
    assert checks(verdict)["linearizable"]["valid"] == "unknown"
    assert checks(verdict)["linearizable"]["detail"]["unknown_keys"][0]["key"] == "k"
    assert code == 3
    code = main(
        ["verify", str(hard), "--model", "register", "--no-report", "--out", str(tmp_path / "o5")]
    )
    assert code == 1 and "verdict: INVALID" in capsys.readouterr().out


def _hard_history() -> list[dict[str, Any]]:
    events: list[tuple[int, dict[str, Any]]] = []
    for p in range(10):
        w = {"process": p, "f": "write", "key": "k", "value": f"v{p}"}
        events.append((p, {**w, "type": "invoke"}))
        events.append((1000 + p, {**w, "type": "ok"}))
        r = {"process": 10 + p, "f": "read", "key": "k"}
        events.append((10 + p, {**r, "type": "invoke", "value": None}))
        events.append((1000 + p, {**r, "type": "ok", "value": f"v{p * 3 % 10}"}))
    last = {"process": 99, "f": "read", "key": "k", "value": None}
    events += [(5000, {**last, "type": "invoke"}), (5001, {**last, "type": "ok"})]
    order = ("time", "type", "process", "f", "key", "value", "offset", "epoch")
    return [
        {"index": i, **{k: ({"time": t} | e)[k] for k in order if k in ({"time": t} | e)}}
        for i, (t, e) in enumerate(sorted(events, key=lambda te: te[0]))
    ]


def test_the_simulators_runs_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "sim"
    args = ["--schedules", "2", "--history-dir", str(runs), "--duration-ms", "3000"]
    assert main(["sim", *args]) == 0
    capsys.readouterr()
    code = main(["verify", str(runs), "--json", "--out", str(tmp_path / "out")])
    verdict = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(verdict["checks"], indent=1)[:3000]
    assert {r["model"] for r in verdict["runs"]} == {"log"} and len(verdict["runs"]) == 2
    lost = checks(verdict)["lost-writes"]
    assert lost["valid"] is True and lost["detail"]["checked"] > 0
    assert checks(verdict)["linearizable"]["detail"]["applicable"] is False


def test_spark_submit_runs_the_same_job(clean_run: Path, tmp_path: Path) -> None:
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        pytest.fail(f"{submit} is missing: PySpark installs it")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            str(submit),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            str(ROOT / "spark_verify" / "submit.py"),
            str(clean_run),
            "--json",
            "--no-report",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = json.loads(proc.stdout)
    assert verdict["valid"] is True and verdict["master"] == "local[1]"

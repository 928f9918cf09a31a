"""The topics workload: its final check against the history, the
``topics`` model's value shapes, and a short local run from the command
line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.workloads.topics import check_final_metadata
from history.files import read_history
from history.ops import NEMESIS, Op, check_well_formed
from history.runs import RunDir, check_run
from kq.cli import main
from tests.chaos.cluster_scenarios import need_iptables, scratch_tempdir


def history(*ops: tuple[str, str, str]) -> list[Op]:
    """Invoke and completion of each (f, key, completion type)."""
    out: list[Op] = []
    for p, (f, key, type) in enumerate(ops):
        i = len(out)
        error = None if type == "ok" else "timeout"
        out.append(Op(i, i, "invoke", p, f, key=key))
        out.append(Op(i + 1, i + 1, type, p, f, key=key, error=error))  # type: ignore[arg-type]
    return out


def kinds(ops: list[Op], topics: list[str], brokers: list[int]) -> list[tuple[str, str]]:
    return [(p.kind, p.target) for p in check_final_metadata(ops, topics, brokers)]


def test_agreeing_metadata_has_no_problem() -> None:
    ops = history(
        ("create-topic", "t1", "ok"),
        ("create-topic", "t2", "ok"),
        ("delete-topic", "t2", "ok"),
        ("create-topic", "t3", "info"),
        ("create-topic", "t4", "fail"),
        ("register-broker", "1", "ok"),
        ("register-broker", "2", "info"),
        ("heartbeat", "1", "ok"),
    )
    assert kinds(ops, ["t1"], [1]) == []
    assert kinds(ops, ["t1", "t3"], [1, 2]) == []  # info may have happened


def test_a_lost_topic_unless_a_delete_may_have_happened() -> None:
    ops = history(("create-topic", "t1", "ok"), ("delete-topic", "t1", "fail"))
    assert kinds(ops, [], []) == [("lost-topic", "t1")]
    ops = history(("create-topic", "t1", "ok"), ("delete-topic", "t1", "info"))
    assert kinds(ops, [], []) == []


def test_phantom_and_resurrected_topics() -> None:
    ops = history(
        ("create-topic", "t1", "fail"),
        ("create-topic", "t2", "ok"),
        ("delete-topic", "t2", "ok"),
    )
    assert kinds(ops, ["t1", "t2", "zz"], []) == [
        ("phantom-topic", "t1"),
        ("resurrected-topic", "t2"),
        ("phantom-topic", "zz"),
    ]


def test_lost_and_phantom_brokers() -> None:
    ops = history(("register-broker", "1", "ok"), ("register-broker", "2", "fail"))
    assert kinds(ops, [], [2, 3]) == [
        ("lost-broker", "1"),
        ("phantom-broker", "2"),
        ("phantom-broker", "3"),
    ]


# -- the topics model ------------------------------------------------------------


def pair(f: str, key: str, value: Any) -> list[Op]:
    return [
        Op(0, 0, "invoke", 0, f, key=key, value=value),
        Op(1, 1, "ok", 0, f, key=key, value=value),
    ]


@pytest.mark.parametrize(
    ("f", "key", "value"),
    [
        ("create-topic", "t0-1", {"partitions": 2, "replication_factor": 1}),
        ("delete-topic", "t0-1", None),
        ("register-broker", "1", {"incarnation": "9bFlIkpYt5HfavHYMD5hzQ"}),
        ("heartbeat", "1", {"fence": True}),
    ],
)
def test_the_topics_model_takes_its_ops_without_versions(f: str, key: str, value: Any) -> None:
    assert check_well_formed(pair(f, key, value), model="topics") == []


@pytest.mark.parametrize(
    ("f", "key", "value", "kind"),
    [
        ("create-topic", "t0-1", {"partitions": 0, "replication_factor": 1}, "model-value"),
        ("create-topic", "t0-1", {"partitions": 1}, "model-value"),
        ("delete-topic", "t0-1", "x", "model-value"),
        ("register-broker", "b1", {"incarnation": "x"}, "model-value"),
        ("heartbeat", "1", {"fence": 1}, "model-value"),
        ("write", "k", "v", "model-f"),
    ],
)
def test_the_topics_model_refuses_other_shapes(f: str, key: str, value: Any, kind: str) -> None:
    assert {p.kind for p in check_well_formed(pair(f, key, value), model="topics")} == {kind}


# -- a real run --------------------------------------------------------------------


@pytest.mark.slow
def test_a_short_local_topics_run_from_the_command_line_is_well_formed_and_checks_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    need_iptables()
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    args = ["--workload", "topics", "--time-limit", "8", "--nemesis", "kill,partition"]
    args += ["--rate", "20", "--concurrency", "4", "--seed", "5", "--runs-dir", str(runs)]
    code = main(["chaos", "run", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"], out
    path = Path(out["path"])
    assert check_run(path) == []
    ops = read_history(RunDir(path).history)
    assert check_well_formed(ops, model="topics", require_nemesis=True) == []
    assert json.loads(RunDir(path).config.read_text())["model"] == "topics"

    done = {(op.f, op.type) for op in ops if op.process != NEMESIS}
    assert {("register-broker", "ok"), ("create-topic", "ok")} <= done
    assert any(op.f == "kill" for op in ops if op.process == NEMESIS)
    final = out["final_check"]
    assert final["ok"] and final["problems"] == [] and final["brokers"] == [1, 2, 3]
    assert list(scratch.iterdir()) == []

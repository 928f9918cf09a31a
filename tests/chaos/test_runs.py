"""Run folders: layout, writing a run, and checking folders."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from history.export_formats import DAMAGED_HASH
from history.exports import Change, LogEntry, record_hash
from history.files import NEMESIS, HistoryRecorder, Op
from history.runs import FORMAT_VERSION, RunDir, check_run, create_run_dir, run_name, write_run
from kq.cli import main as kq_main
from tests.history.export_lines import CHANGE, RECORD, REGISTRATION, STATE, STATE_LINE

WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def _ops() -> list[Op]:
    ops: list[Op] = []
    clock = iter(range(0, 10_000, 100))
    rec = HistoryRecorder(lambda: next(clock), ops.append)
    rec.invoke(0, "write", key="k", value="v0-1")
    rec.ok(0, node=1, offset=1, epoch=1)
    rec.invoke(NEMESIS, "kill", value={"nodes": [1]})
    rec.ok(NEMESIS)
    rec.invoke(0, "read", key="k")
    rec.fail(0, "timeout")
    rec.invoke(NEMESIS, "start", value={"nodes": [1]})
    rec.ok(NEMESIS)
    return ops


def _write(root: Path, ops: list[Op] | None = None, **config: object) -> RunDir:
    h = record_hash(b"x")
    return write_run(
        root,
        "demo",
        config={"backend": "test", "model": "register", "nodes": [1, 2], "faults": ["kill"]}
        | config,
        ops=_ops() if ops is None else ops,
        node_logs={1: [LogEntry(1, 0, 1, "control", h), LogEntry(1, 1, 1, "data", h)]},
        node_changes={
            1: [Change(1, 0, 1, 1, "leader")],
            2: [Change(2, 0, 1, 1, "follower")],
        },
        logs={"harness.log": "started\n"},
        summary={"verdict": "fine"},
        when=WHEN,
    )


def test_run_names_sort_by_start_time() -> None:
    assert run_name("demo", WHEN) == "20260304T050607Z-demo"
    with pytest.raises(ValueError, match="run name"):
        run_name("a b", WHEN)
    with pytest.raises(ValueError, match="run name"):
        run_name("../x", WHEN)


def test_create_run_dir_never_reuses_a_folder(tmp_path: Path) -> None:
    first = create_run_dir(tmp_path / "runs", "demo", when=WHEN)
    second = create_run_dir(tmp_path / "runs", "demo", when=WHEN)
    assert first.path.name == "20260304T050607Z-demo"
    assert second.path.name == "20260304T050607Z-demo-2"


def test_write_run_lays_out_the_folder(tmp_path: Path) -> None:
    run = _write(tmp_path)
    files = sorted(str(p.relative_to(run.path)) for p in run.path.rglob("*") if p.is_file())
    assert files == [
        "config.json",
        "history.jsonl",
        "logs/harness.log",
        "nodes/1/changes.jsonl",
        "nodes/1/log.jsonl",
        "nodes/2/changes.jsonl",
        "nodes/2/log.jsonl",
        "summary.json",
    ]
    config = json.loads(run.config.read_text())
    assert config["format"] == FORMAT_VERSION and config["name"] == "demo"
    summary = json.loads(run.summary.read_text())
    assert summary["ops"] == {"invoke": 2, "ok": 1, "fail": 1, "info": 0}
    assert summary["processes"] == 1 and summary["nemesis"] == 2
    assert summary["well_formed"] is True and summary["problems"] == []
    assert summary["verdict"] == "fine"
    assert check_run(run.path) == []
    assert run.node_log(2).read_text() == ""


def test_summary_reports_problems(tmp_path: Path) -> None:
    run = _write(tmp_path, ops=_ops()[:-1])  # the start never completes
    summary = json.loads(run.summary.read_text())
    assert summary["well_formed"] is False
    assert any("open-invoke" in p for p in summary["problems"])
    assert any("nemesis-unended" in p for p in summary["problems"])


def test_check_run_reads_the_model_and_faults_from_the_config(tmp_path: Path) -> None:
    clients_only = [op for op in _ops() if op.process != NEMESIS]
    reindexed = [dataclasses.replace(op, index=i) for i, op in enumerate(clients_only)]
    run = _write(tmp_path / "a", ops=reindexed)
    assert [p.kind for p in check_run(run.path)] == ["nemesis-missing"]
    run = _write(tmp_path / "b", ops=reindexed, faults=[])
    assert check_run(run.path) == []
    run = _write(tmp_path / "c", model="log")
    assert {p.kind for p in check_run(run.path)} == {"model-value", "model-f"}
    with pytest.raises(ValueError, match="unknown model"):
        _write(tmp_path / "d", model="jepsen-queue")
    assert not (tmp_path / "d").exists()
    config = json.loads(run.config.read_text())
    run.config.unlink()
    run.config.write_text(json.dumps(config | {"model": "jepsen-queue"}))
    assert [p.kind for p in check_run(run.path)] == ["run-config"]


def test_check_run_reports_broken_files(tmp_path: Path) -> None:
    run = _write(tmp_path)
    run.node_changes(2).unlink()
    with run.node_log(1).open("a") as fh:
        fh.write('{"node":1}\n')
    lines = run.history.read_text().splitlines()
    run.history.write_text("\n".join(lines[:3] + ["{oops"] + lines[4:]) + "\n")
    problems = check_run(run.path)
    kinds = sorted(p.kind for p in problems)
    assert kinds == ["export-format", "export-missing", "history-format"]
    text = "\n".join(str(p) for p in problems)
    assert "history.jsonl:4:" in text
    assert "nodes/2/changes.jsonl" in text
    assert "log.jsonl:3:" in text


def test_check_run_without_a_config(tmp_path: Path) -> None:
    assert [p.kind for p in check_run(tmp_path)] == ["run-config"]
    (tmp_path / "config.json").write_text('{"format": 1, "nodes": "all"}')
    kinds = [p.kind for p in check_run(tmp_path)]
    assert kinds == ["run-config", "run-history"]


def check_main(paths: list[str]) -> int:
    return kq_main(["chaos", "check", *paths])


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "runs")
    assert check_main([str(tmp_path / "runs")]) == 0
    assert f"{good.path}: well formed" in capsys.readouterr().out
    bad = _write(tmp_path / "runs", ops=_ops()[:-1])
    assert check_main([str(good.path), str(bad.path)]) == 1
    out = capsys.readouterr().out
    assert f"{bad.path}: 2 problem(s)" in out and "open-invoke" in out
    assert check_main([str(tmp_path / "nothing")]) == 2


def _export(run: RunDir, node: int, name: str, lines: list[dict[str, object]]) -> None:
    run.node_dir(node).mkdir(parents=True, exist_ok=True)
    (run.node_dir(node) / name).write_text("".join(json.dumps(x) + "\n" for x in lines))


def _with_newer_exports(root: Path) -> RunDir:
    """A run with one broker (5) whose controller 1 exported its votes, the
    brokers' registrations and the partition's changes, and whose broker
    exported a partition ending in a damaged batch and its timeline."""
    run = _write(root, brokers=[5])
    vote = {"node": 1, "time": 0, "life": 1, "event": "start", "epoch": 0}
    _export(
        run,
        1,
        "votes.jsonl",
        [
            vote | {"voted_for": None, "leader": None},
            vote | {"time": 5, "event": "candidate", "epoch": 1, "voted_for": 1, "leader": None},
        ],
    )
    # The broker is 5 and its partition's one replica: each line as the
    # export's own format tests have it, but for the broker's number.
    _export(run, 1, "broker_registrations.jsonl", [REGISTRATION | {"broker": 5}])
    damaged = RECORD | {"offset": 1, "sequence": 1, "hash": DAMAGED_HASH}
    _export(run, 5, "partitions.jsonl", [RECORD, damaged])
    state = STATE | {"high_watermark": 2, "log_end_offset": 2}
    _export(run, 5, "partition_state.jsonl", [state])
    _export(run, 1, "partition_changes.jsonl", [CHANGE | {"isr": [5]}])
    sample = STATE_LINE | {"node": 5, "role": "leader", "leader": 5, "isr": [5]}
    _export(run, 5, "partition_timeline.jsonl", [sample, sample | {"seq": 300, "life": 1}])
    return run


def test_check_run_reads_the_newer_exports(tmp_path: Path) -> None:
    run = _with_newer_exports(tmp_path)
    assert check_run(run.path) == []


@pytest.mark.parametrize(
    ("node", "name", "line", "change", "message"),
    [
        (1, "votes.jsonl", 2, {"life": -1}, "nodes/1/votes.jsonl:2: life must be an integer >= 0"),
        (
            1,
            "broker_registrations.jsonl",
            1,
            {"fenced": "yes"},
            "nodes/1/broker_registrations.jsonl:1: fenced must be true or false, got 'yes'",
        ),
        (
            5,
            "partitions.jsonl",
            2,
            {"hash": "damaged"},
            "nodes/5/partitions.jsonl:2: hash must be 64 lowercase hex digits (SHA-256) or "
            "'damaged: CRC mismatch'",
        ),
        (
            5,
            "partition_state.jsonl",
            1,
            {"stopped_at": 3},
            "nodes/5/partition_state.jsonl:1: stopped_at must be a string or null, got 3",
        ),
        (
            1,
            "partition_changes.jsonl",
            1,
            {"unclean": True},
            "nodes/1/partition_changes.jsonl:1: an unclean line must be recovering",
        ),
        (
            5,
            "partition_timeline.jsonl",
            2,
            {"seq": 1},
            "nodes/5/partition_timeline.jsonl:2: seq must rise, got 1 after 212",
        ),
        (
            5,
            "partition_timeline.jsonl",
            1,
            {"role": "observer"},
            "nodes/5/partition_timeline.jsonl:1: role must be one of leader, follower, none",
        ),
        (5, "partitions.jsonl", 1, {"node": 4}, "nodes/5/partitions.jsonl:1: node is 4 in the"),
        (
            5,
            "partition_timeline.jsonl",
            2,
            {"node": 4},
            "nodes/5/partition_timeline.jsonl:2: node is 4 in the folder of node 5",
        ),
        (
            1,
            "partition_changes.jsonl",
            1,
            {"node": 2},
            "nodes/1/partition_changes.jsonl:1: node is 2 in the folder of node 1",
        ),
        (1, "votes.jsonl", 1, {"node": 2}, "nodes/1/votes.jsonl:1: node is 2 in the folder of"),
    ],
)
def test_check_run_names_the_file_line_and_field_of_a_malformed_newer_export(
    tmp_path: Path, node: int, name: str, line: int, change: dict[str, object], message: str
) -> None:
    run = _with_newer_exports(tmp_path)
    path = run.node_dir(node) / name
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[line - 1] |= change
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    problems = check_run(run.path)
    assert [p.kind for p in problems] == ["export-format"]
    assert message in problems[0].message


def test_check_run_refuses_a_config_whose_brokers_are_not_ids(tmp_path: Path) -> None:
    run = _write(tmp_path, brokers="5")
    problems = check_run(run.path)
    assert [p.kind for p in problems] == ["run-config"]
    assert "brokers must be a list of broker ids, got '5'" in problems[0].message

"""``kq chaos run`` and ``kq chaos list``: flags, output and exit statuses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from history.files import NEMESIS, HistoryRecorder, Op, check_well_formed, read_history
from history.runs import check_run, write_run
from kq.cli import main
from server.local_cluster import run_kq


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nemesis", "kill,flood"], "unknown nemesis flood"),
        (["--nemesis", ","], "name some faults, or none"),
        (["--workload", "bank"], "invalid choice: 'bank'"),
        (["--backend", "cloud"], "invalid choice: 'cloud'"),
        (["--rate", "0"], "--rate: must be a positive number"),
        (["--time-limit", "-5"], "--time-limit: must be a positive number"),
        (["--time-limit", "soon"], "'soon' is not a number"),
        (["--concurrency", "0"], "--concurrency: must be at least 1"),
        (["--nodes", "-1"], "--nodes: must be at least 1"),
        (["--keys", "two"], "'two' is not a whole number"),
        (["--seed", "-3"], "--seed: must not be negative"),
        (["--unadded-sends", "1"], "--unadded-sends: must be in [0, 1), got 1.0"),
        (["--unadded-sends", "some"], "needs a number, got 'some'"),
        (["--zombie-pause-ms", "-1"], "--zombie-pause-ms: must not be negative"),
    ],
)
def test_bad_flags_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["chaos", "run", "--runs-dir", str(tmp_path), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nemesis", "majorities-ring"], "majorities-ring needs at least 5 nodes, got 3"),
        (["--nemesis", "partition", "--nodes", "1"], "partition needs at least 2 nodes"),
        (["--nemesis", "none", "--name", "a b"], "a run name is letters"),
        (["--nemesis", "rotate-certs", "--insecure"], "rotate-certs needs TLS"),
        (
            ["--workload", "queue", "--unadded-sends", "0.1"],
            "unadded_sends needs transactional",
        ),
        (
            ["--workload", "queue", "--transactional", "--zombie-pause-ms", "100"],
            "zombie_pause_ms needs zombie",
        ),
    ],
)
def test_faults_the_cluster_cannot_take_and_bad_names_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["chaos", "run", "--runs-dir", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_chaos_alone_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chaos"]) == 2
    assert "usage: kq chaos" in capsys.readouterr().err


def _ops(nemesis: bool) -> list[Op]:
    ops: list[Op] = []
    clock = iter(range(0, 10_000, 100))
    rec = HistoryRecorder(lambda: next(clock), ops.append)
    rec.invoke(0, "write", key="k0", value="v0-1")
    rec.ok(0, node=1, offset=1, epoch=1)
    if nemesis:
        rec.invoke(NEMESIS, "kill", value={"nodes": [1]})
        rec.ok(NEMESIS)
    rec.invoke(0, "read", key="k0")
    return ops  # the read never completes unless closed below


def test_list_shows_each_run_and_whether_it_is_well_formed(tmp_path: Path) -> None:
    ops = _ops(nemesis=False)
    done = [*ops, Op(3, 400, "ok", 0, "read", "k0", "v0-1", None, 1, 1, 1)]
    config = {"backend": "local", "model": "register", "workload": "register", "nodes": []}
    write_run(
        tmp_path,
        "good",
        config={**config, "faults": []},
        ops=done,
        node_logs={},
        node_changes={},
        when=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    bad = write_run(
        tmp_path,
        "bad",
        config={**config, "faults": ["kill"]},
        ops=_ops(nemesis=True),
        node_logs={},
        node_changes={},
        when=datetime(2026, 1, 2, 3, 5, 0, tzinfo=UTC),
    )
    assert check_run(bad.path)
    (tmp_path / "not-a-run").mkdir()

    listed = run_kq("chaos", "list", "--runs-dir", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "TIME",
        "NAME",
        "BACKEND",
        "WORKLOAD",
        "FAULTS",
        "OPS",
        "WELL-FORMED",
        "FOLDER",
    ]
    assert lines[1].split() == [
        "2026-01-02",
        "03:04:05Z",
        "good",
        "local",
        "register",
        "none",
        "2",
        "yes",
        "20260102T030405Z-good",
    ]
    assert lines[2].split()[2:8] == ["bad", "local", "register", "kill", "2", "no"]
    assert len(lines) == 3

    as_json = run_kq("chaos", "list", "--runs-dir", str(tmp_path), "--json")
    rows = json.loads(as_json.stdout)
    assert [(r["name"], r["well_formed"], r["faults"]) for r in rows] == [
        ("good", True, []),
        ("bad", False, ["kill"]),
    ]

    empty = run_kq("chaos", "list", "--runs-dir", str(tmp_path / "none"))
    assert (empty.returncode, empty.stdout.strip()) == (0, f"no runs in {tmp_path / 'none'}")


@pytest.mark.slow
def test_run_then_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    runs = tmp_path / "runs"
    common = ["--time-limit", "4", "--rate", "30", "--concurrency", "3", "--keys", "2"]
    common += ["--seed", "11", "--runs-dir", str(runs)]

    # A plaintext run says so; the default (below) is TLS.
    human = run_kq(
        "chaos", "run", *common, "--nemesis", "kill", "--name", "people", "--insecure",
        timeout_s=90,
    )  # fmt: skip
    assert human.returncode == 0, human.stdout + human.stderr
    assert "WARNING: --insecure" in human.stderr and "PLAINTEXT" in human.stdout
    out = human.stdout.splitlines()
    assert any("ok " in line and "faults:" in line for line in out), human.stdout
    assert any("nemesis kill" in line for line in out), human.stdout
    assert "well formed: yes" in human.stdout
    assert out[-1].startswith("run folder: ")
    folder = Path(out[-1].removeprefix("run folder: "))
    assert folder.parent == runs and folder.name.endswith("-people")
    assert check_run(folder) == []
    config = json.loads((folder / "config.json").read_text())
    assert config["security_protocol"] == "PLAINTEXT" and "--insecure" in config["replay"]

    # The machine-readable run, verified with Spark right after (--verify).
    machine = run_kq(
        "chaos", "run", *common, "--nemesis", "none", "--json", "--verify", timeout_s=300
    )
    assert machine.returncode == 0, machine.stdout + machine.stderr
    result = json.loads(machine.stdout)
    assert result["ok"] and result["well_formed"] and result["nemesis"] == 0
    assert result["security_protocol"] == "SSL"
    assert result["verdict"]["valid"] is True, result["verdict"]
    assert Path(result["path"], "verify", "verdict.json").is_file()
    assert Path(result["path"], "verify", "report.html").is_file()
    assert Path(result["path"]).name.endswith("-register-local")
    assert check_run(result["path"]) == []

    listed = run_kq("chaos", "list", "--runs-dir", str(runs), "--json")
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["faults"], r["well_formed"]) for r in rows] == [
        ("people", ["kill"], True),
        ("register-local", [], True),
    ]
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_stops_the_run_cleans_up_and_keeps_a_well_formed_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT (Ctrl-C) in the middle of a run: the nodes are stopped, the
    network healed, the run folder written with every op in flight completed
    as info, and the exit status is 130."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runs = tmp_path / "runs"
    args = ["chaos", "run", "--time-limit", "60", "--rate", "30", "--concurrency", "3"]
    args += ["--nemesis", "kill,pause", "--seed", "3", "--runs-dir", str(runs)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kq.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # wait until ops are flowing
            lines.append(line)
            if " ok " in line and "faults:" in line and not line.strip().endswith("ok 0"):
                break
        else:
            pytest.fail("the run ended before it started: " + "".join(lines))
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    # Nothing left running under the run's scratch folder, nothing left in it.
    leftovers = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(scratch) in cmdline:
                leftovers.append(cmdline)
    assert leftovers == []
    assert list(scratch.iterdir()) == []
    [folder] = list(runs.iterdir())
    ops = read_history(folder / "history.jsonl")
    # Well formed: every op in flight at the interrupt was completed.
    assert ops and check_well_formed(ops, model="register") == []
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["completed"] is False
    # Stopped before the nemesis acted, a run with faults lacks nemesis ops
    # and says so; nothing else may be wrong.
    kinds = {p.split(":")[0] for p in summary["problems"]}
    assert kinds <= {"nemesis-missing"}, summary["problems"]
    assert summary["error"].startswith("interrupted"), summary["error"]

"""Where kq verify writes its verdict and report: the run folder's verify/,
or runs/verify-<time>/, never a stray folder in the current directory."""

from __future__ import annotations

from pathlib import Path

from spark_verify.job import VerifyOptions, out_dir
from spark_verify.load import RunInput


def _run(path: Path) -> RunInput:
    history = path / "history.jsonl" if path.suffix == "" else path
    return RunInput(path.stem, path, history, "jsonl", None, "register", {})


def test_one_run_folder_writes_into_it(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20261125T000000Z-register-local"
    run.mkdir(parents=True)
    assert out_dir([_run(run)], VerifyOptions()) == run / "verify"


def test_several_runs_or_a_bare_history_write_under_runs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    bare = tmp_path / "jepsen-history.jsonl"
    bare.write_text("")
    for runs in ([_run(a), _run(b)], [_run(bare)]):
        out = out_dir(runs, VerifyOptions())
        assert out.parent == Path("runs") and out.name.startswith("verify-"), out


def test_out_wins(tmp_path: Path) -> None:
    assert out_dir([_run(tmp_path)], VerifyOptions(out=tmp_path / "here")) == tmp_path / "here"

"""Interaction scenarios: every tests/quorum/testdata/*.txt script that
drives the harness (tests/quorum/harness.py lists its commands;
tests/datadriven.py describes the file format; ``KQ_REWRITE=1`` rewrites the
expected outputs in place, to be read before they are committed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datadriven import TestData, rewrite_requested, run_file
from tests.quorum.harness import InteractionEnv

TESTDATA = Path(__file__).resolve().parent / "testdata"
# Files in testdata/ that other tests read.
NOT_SCENARIOS = {"majority.txt"}
# Scenarios whose expected output is what the protocol should do but the
# core does not do yet.  Strict: once the core is fixed the test passes,
# which fails the run until the entry is removed here.
KNOWN_BUGS: dict[str, str] = {
    # "<file stem>": "<the bug, in a line>",
}


def _params() -> list[object]:
    params: list[object] = []
    for path in sorted(TESTDATA.glob("*.txt")):
        if path.name in NOT_SCENARIOS:
            continue
        marks = []
        if path.stem in KNOWN_BUGS:
            marks.append(pytest.mark.xfail(reason=KNOWN_BUGS[path.stem], strict=True))
        params.append(pytest.param(path, id=path.stem, marks=marks))
    return params


@pytest.mark.parametrize("path", _params())
def test_scenario(path: Path) -> None:
    if path.stem in KNOWN_BUGS and rewrite_requested():
        pytest.skip("a known-bug scenario keeps its hand-written expectation")
    env = InteractionEnv()
    run_file(path, env.handle)


def test_known_bugs_exist() -> None:
    for name in KNOWN_BUGS:
        assert (TESTDATA / f"{name}.txt").exists(), name


def test_snapshot_every_takes_snapshots(tmp_path: Path) -> None:
    # The add-nodes option no scenario above uses: every node snapshots (and
    # compacts) once it has applied that many offsets past its log start.
    script = tmp_path / "s.txt"
    script.write_text(
        "add-nodes voters=(1) snapshot-every=2\n----\n\n"
        "campaign 1\n----\n\npropose 1 a\n----\n\nlog 1\n----\n"
    )
    out: list[str] = []
    env = InteractionEnv()

    def handler(td: TestData) -> str:
        text = env.handle(td)
        out.append(text)
        return td.expected if td.cmd != "log" else text

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("KQ_REWRITE", raising=False)
        with pytest.raises(AssertionError, match="output of 'log' differs"):
            run_file(script, handler)
    assert "n1 takes snapshot 2/1" in out[2]
    assert "n1 compacts its log to 2 (snapshot 2/1)" in out[2]
    assert out[3] == "snapshot 2/1\n"

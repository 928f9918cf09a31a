"""The data-driven runner (tests/datadriven.py): parsing, comparing, rewriting."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.datadriven import CmdArg, TestData, parse, parse_command, run_file

SCRIPT = """\
# a comment
echo a b
----
a b

# input lines go before the separator
cat
one
two
----
one
two

empty
----

para x=1
----
----
x=1

x=1
----
----
next k=(1, 2,3) (4) (5,6)
----
k=1,2,3 groups=4|5,6
"""


def _handler(td: TestData) -> str:
    if td.cmd == "echo":
        return " ".join(a.key for a in td.pos()) + "\n"
    if td.cmd == "cat":
        return td.input + "\n"
    if td.cmd == "empty":
        return ""
    if td.cmd == "para":
        return f"x={td.int_arg('x')}\n\nx={td.int_arg('x')}\n"
    if td.cmd == "next":
        groups = "|".join(",".join(a.vals) for a in td.pos())
        return f"k={','.join(td.get('k') or ())} groups={groups}\n"
    raise ValueError(td.cmd)


def test_parse_command_forms() -> None:
    cmd, args = parse_command("deliver from=1 drop key=(1, 2) (3) (4,5)")
    assert cmd == "deliver"
    assert args == [
        CmdArg("from", ("1",), kv=True),
        CmdArg("drop"),
        CmdArg("key", ("1", "2"), kv=True),
        CmdArg("", ("3",)),
        CmdArg("", ("4", "5")),
    ]


def test_parse_blocks() -> None:
    _, blocks = parse("t.txt", SCRIPT)
    assert [(b.cmd, b.line) for b in blocks] == [
        ("echo", 2),
        ("cat", 7),
        ("empty", 14),
        ("para", 17),
        ("next", 25),
    ]
    assert blocks[1].input == "one\ntwo"
    assert blocks[2].expected == ""
    assert blocks[3].expected == "x=1\n\nx=1\n"
    assert blocks[4].int_list("k") == [1, 2, 3]


def test_run_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KQ_REWRITE", raising=False)
    path = tmp_path / "t.txt"
    path.write_text(SCRIPT)
    run_file(path, _handler)


def test_mismatch_names_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KQ_REWRITE", raising=False)
    path = tmp_path / "t.txt"
    path.write_text(SCRIPT.replace("one\ntwo\n\n", "one\nthree\n\n"))
    with pytest.raises(AssertionError) as info:
        run_file(path, _handler)
    text = str(info.value)
    assert f"{path}:7: output of 'cat' differs" in text
    assert "-three" in text and "+two" in text


def test_handler_error_names_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KQ_REWRITE", raising=False)
    path = tmp_path / "t.txt"
    path.write_text("boom\n----\n")
    with pytest.raises(AssertionError, match=r"t\.txt:1: boom: raised ValueError: boom"):
        run_file(path, _handler)


def test_malformed_files_are_rejected() -> None:
    with pytest.raises(ValueError, match="missing ----"):
        parse("t.txt", "echo a")
    with pytest.raises(ValueError, match="unterminated"):
        parse("t.txt", "para x=1\n----\n----\nx=1\n")


def test_rewrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Wrong, missing and wrongly shaped outputs are all replaced; comments,
    # inputs and blank lines between blocks are kept.
    stale = (
        SCRIPT.replace("----\na b\n", "----\nstale\nlines\n")
        .replace("empty\n----\n", "empty\n----\nnot empty\n")
        .replace("----\n----\nx=1\n\nx=1\n----\n----\n", "----\nx=1\n\n")
        .replace("----\nk=1,2,3 groups=4|5,6\n", "----\n")
    )
    assert stale != SCRIPT
    path = tmp_path / "t.txt"
    path.write_text(stale)
    monkeypatch.setenv("KQ_REWRITE", "1")
    run_file(path, _handler)
    # (The blank line that ended the stale single-form output stays.)
    assert path.read_text() == SCRIPT.replace("----\n----\nnext", "----\n----\n\nnext")
    monkeypatch.delenv("KQ_REWRITE")
    run_file(path, _handler)

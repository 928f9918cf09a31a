"""A small data-driven test runner, in the spirit of cockroachdb/datadriven.

A test file is a sequence of blocks::

    # a comment (any line starting with '#', outside a block's output)
    command arg1 key=value key=(1,2,3) (4,5)
    optional input lines
    ----
    expected output
    <blank line>

A command line is split into arguments: a bare word, ``key=value``,
``key=(v1,v2)`` or a bare group ``(v1,v2)``.  The expected output runs from
the ``----`` line to the first blank line.  Output that itself contains blank
lines is written between a doubled separator and ends with a doubled one::

    command
    ----
    ----
    first paragraph

    second paragraph
    ----
    ----

:func:`run_file` hands each block to a callback and compares what it returns
with the expected output.  On the first mismatch it raises ``AssertionError``
with a unified diff naming the file and the line of the command.

Set the environment variable ``KQ_REWRITE=1`` to rewrite the expected outputs
in place with what the commands print instead of comparing (then read the
diff with ``git diff`` before committing it: a rewrite accepts whatever the
code does, bugs included).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CmdArg", "TestData", "parse", "parse_command", "rewrite_requested", "run_file"]

SEP = "----"
_TOKEN = re.compile(r"([^\s=()]+)=\(([^)]*)\)|([^\s=()]+)=(\S+)|\(([^)]*)\)|(\S+)")


@dataclass(frozen=True, slots=True)
class CmdArg:
    """``key`` alone (vals empty), ``key=v`` or ``key=(v1,v2)``; a bare
    group ``(v1,v2)`` has an empty key."""

    key: str
    vals: tuple[str, ...] = ()
    kv: bool = False  # written with '='


@dataclass(slots=True)
class TestData:
    __test__ = False  # not a pytest test class

    path: str
    line: int  # 1-based line of the command
    cmd: str
    args: list[CmdArg]
    input: str
    expected: str
    # Line indices [start, end) of the expected-output section, separator
    # included, for rewriting.
    span: tuple[int, int] = (0, 0)

    def pos(self) -> list[CmdArg]:
        """Arguments without ``=``: bare words and bare groups."""
        return [a for a in self.args if not a.kv]

    def has(self, key: str) -> bool:
        return any(a.key == key for a in self.args)

    def get(self, key: str) -> tuple[str, ...] | None:
        for a in self.args:
            if a.key == key and a.kv:
                return a.vals
        return None

    def int_arg(self, key: str, default: int | None = None) -> int:
        vals = self.get(key)
        if vals is None:
            if default is None:
                raise ValueError(f"{self.cmd}: missing argument {key}=")
            return default
        return int(vals[0])

    def int_list(self, key: str) -> list[int]:
        return [int(v) for v in self.get(key) or () if v.strip()]


def _split_vals(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def parse_command(line: str) -> tuple[str, list[CmdArg]]:
    tokens = list(_TOKEN.finditer(line))
    if not tokens:
        raise ValueError("empty command")
    cmd = tokens[0].group(0)
    args: list[CmdArg] = []
    for m in tokens[1:]:
        if m.group(1) is not None:
            args.append(CmdArg(m.group(1), _split_vals(m.group(2)), kv=True))
        elif m.group(3) is not None:
            args.append(CmdArg(m.group(3), (m.group(4),), kv=True))
        elif m.group(5) is not None:
            args.append(CmdArg("", _split_vals(m.group(5))))
        else:
            args.append(CmdArg(m.group(6)))
    return cmd, args


def parse(path: str, text: str) -> tuple[list[str], list[TestData]]:
    lines = text.split("\n")
    blocks: list[TestData] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        start = i
        cmd, args = parse_command(line)
        i += 1
        inputs: list[str] = []
        while i < len(lines) and lines[i] != SEP:
            if not lines[i].strip():
                raise ValueError(f"{path}:{start + 1}: {cmd}: no {SEP} line before a blank line")
            inputs.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: {cmd}: missing {SEP}")
        span_start = i
        i += 1
        out: list[str] = []
        if i < len(lines) and lines[i] == SEP:  # the doubled form
            i += 1
            while i + 1 < len(lines) and not (lines[i] == SEP and lines[i + 1] == SEP):
                out.append(lines[i])
                i += 1
            if i + 1 >= len(lines):
                raise ValueError(f"{path}:{start + 1}: {cmd}: unterminated {SEP}/{SEP} output")
            i += 2
        else:
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
        expected = "".join(o + "\n" for o in out)
        blocks.append(
            TestData(path, start + 1, cmd, args, "\n".join(inputs), expected, (span_start, i))
        )
    return lines, blocks


def _format_output(out: str) -> list[str]:
    body = out.rstrip("\n").split("\n") if out.strip("\n") else []
    if any(not b.strip() for b in body):
        return [SEP, SEP, *body, SEP, SEP]
    return [SEP, *body]


def rewrite_requested() -> bool:
    return os.environ.get("KQ_REWRITE", "") not in ("", "0")


def run_file(path: Path | str, handler: Callable[[TestData], str]) -> None:
    """Run every block of ``path`` through ``handler`` and compare (or, with
    ``KQ_REWRITE=1``, rewrite) the expected outputs."""
    path = str(path)
    with open(path, encoding="utf-8") as f:
        lines, blocks = parse(path, f.read())
    rewrite = rewrite_requested()
    replacements: list[tuple[tuple[int, int], list[str]]] = []
    for td in blocks:
        try:
            actual = handler(td)
        except Exception as exc:
            raise AssertionError(
                f"{td.path}:{td.line}: {td.cmd}: raised {type(exc).__name__}: {exc}"
            ) from exc
        actual = "".join(line.rstrip() + "\n" for line in actual.rstrip("\n").split("\n"))
        if actual == "\n":
            actual = ""
        if rewrite:
            replacements.append((td.span, _format_output(actual)))
        elif actual != td.expected:
            diff = difflib.unified_diff(
                td.expected.splitlines(),
                actual.splitlines(),
                fromfile=f"{td.path}:{td.line} expected",
                tofile="actual",
                lineterm="",
            )
            raise AssertionError(
                f"{td.path}:{td.line}: output of {td.cmd!r} differs\n" + "\n".join(diff)
            )
    if rewrite:
        for (start, end), new in reversed(replacements):
            single = new[-1] != SEP or len(new) == 1
            if single and end < len(lines) and lines[end].strip():
                new.append("")  # the single form ends at a blank line
            lines[start:end] = new
        text = "\n".join(lines)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

"""docs/history-format.md: its examples pass the checks, and it names every
field, problem kind and rule that the code has."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from history.exports import Change, LogEntry, check_changes, check_log
from history.files import FIELDS, NEMESIS_ENDS, PROBLEM_KINDS, Op, check_well_formed

DOC = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()

EXAMPLES = re.findall(r"<!-- example: ([a-z ]+) -->\n```jsonl\n(.*?)```", DOC, flags=re.DOTALL)


def _examples(kind: str) -> list[tuple[str, list[dict]]]:
    return [
        (label, [json.loads(line) for line in body.splitlines()])
        for label, body in EXAMPLES
        if label.split()[0] == kind
    ]


def test_the_examples_are_found() -> None:
    assert sorted(label for label, _ in EXAMPLES) == [
        "changes",
        "history kv",
        "history log",
        "history queue",
        "history register",
        "history topics",
        "log",
        "partitions",
    ]


@pytest.mark.parametrize(("label", "lines"), _examples("history"), ids=lambda x: str(x)[:20])
def test_history_examples_are_well_formed(label: str, lines: list[dict]) -> None:
    model = label.split()[1]
    ops = [Op.from_json(line) for line in lines]
    assert check_well_formed(ops, model=model) == []
    assert [op.to_json() for op in ops] == lines  # written as a writer writes them


def test_the_register_example_shows_the_nemesis_and_retirement() -> None:
    [(_, lines)] = [e for e in _examples("history") if e[0] == "history register"]
    ops = [Op.from_json(line) for line in lines]
    assert check_well_formed(ops, model="register", require_nemesis=True) == []
    assert {op.error for op in ops} >= {"timeout", "precondition", "run-ended"}


def test_export_examples_pass() -> None:
    [(_, log)] = _examples("log")
    assert check_log([LogEntry(**line) for line in log], 3) == []
    [(_, changes)] = _examples("changes")
    assert check_changes([Change(**line) for line in changes], 3) == []


def test_every_field_and_problem_kind_is_documented() -> None:
    for name in FIELDS:
        assert f"| `{name}` |" in DOC, name
    documented = set(re.findall(r"^\| `([a-z-]+)` \| [(a-z]", DOC, flags=re.MULTILINE))
    assert set(PROBLEM_KINDS) <= documented
    for start, end in NEMESIS_ENDS.items():
        assert re.search(rf"^\| `{start}` \|.*\| `{end}`", DOC, flags=re.MULTILINE), start

"""The consumer-group ops of the ``queue`` model (docs/history-format.md):
``subscribe``, ``commit`` and a poll's ``assigned`` and ``revoked`` are
well-formed as the builders write them, and each shape rule fires on a
broken op."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from history.ops import GROUP_FIELDS, Op, check_well_formed
from history.queue import QUEUE_FS, commit_value, group_field_problems, subscribe_value

DOC = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()


def _doc_group_example() -> list[dict[str, Any]]:
    [body] = re.findall(
        r"<!-- groups example: history queue -->\n```jsonl\n(.*?)```", DOC, re.DOTALL
    )
    return [json.loads(line) for line in body.splitlines()]


def _kinds(lines: list[dict[str, Any]], model: str = "queue") -> list[str]:
    return [p.kind for p in check_well_formed([Op.from_json(x) for x in lines], model=model)]


def _pair(f: str, invoke: Any, done: Any = None, type: str = "ok", **extra: Any) -> list[dict]:
    completion: dict[str, Any] = {
        "index": 1,
        "time": 2,
        "type": type,
        "process": 0,
        "f": f,
        "value": invoke if done is None else done,
        **extra,
    }
    if type != "ok":
        completion["error"] = "timeout"
    return [
        {"index": 0, "time": 1, "type": "invoke", "process": 0, "f": f, "value": invoke},
        completion,
    ]


def test_the_doc_example_is_well_formed_and_what_the_builders_write() -> None:
    lines = _doc_group_example()
    assert _kinds(lines) == []
    assert {"subscribe", "commit"} <= QUEUE_FS
    assert lines[0]["value"] == subscribe_value([1, 0])
    commits = [x for x in lines if x["f"] == "commit"]
    assert commits and commits[0]["value"] == commit_value({1: 2, 0: 1})
    assert {x["type"] for x in commits} >= {"ok", "fail", "info"}
    # Every op round-trips through its line, the group fields included.
    for x in lines:
        op = Op.from_json(x)
        assert json.loads(op.to_line()) == x
    assert any("assigned" in x for x in lines) and any("revoked" in x for x in lines)


def test_subscribe_shapes() -> None:
    assert _kinds(_pair("subscribe", {"keys": [0, 2]})) == []
    assert _kinds(_pair("subscribe", {"keys": [0]}, {"keys": [1]})) == ["model-value"]
    assert _kinds(_pair("subscribe", {"keys": [-1]})) == ["model-value", "model-value"]
    assert _kinds(_pair("subscribe", {"keys": [0], "seek_to_beginning": True}))[0] == "model-value"


@pytest.mark.parametrize("type", ["ok", "fail", "info"])
def test_commit_shapes(type: str) -> None:
    assert _kinds(_pair("commit", commit_value({0: 3, 1: 0}), type=type)) == []
    changed = _pair("commit", commit_value({0: 3}), commit_value({0: 4}), type=type)
    assert _kinds(changed) == ["model-value"]


@pytest.mark.parametrize(
    "value",
    [
        [["commit", {}]],
        [["commit", {"0": -1}]],
        [["commit", {"0": "3"}]],
        [["commit", {"a": 3}]],
        [["commit", {"01": 3}]],
        [["commit", {"0": 3}], ["commit", {"1": 3}]],
        {"0": 3},
    ],
)
def test_each_commit_rule_fires(value: Any) -> None:
    assert "model-value" in _kinds(_pair("commit", value))


def _poll(**extra: Any) -> list[dict]:
    return _pair("poll", [["poll"]], [["poll", {"0": [[3, 9]]}]], **extra)


def test_group_fields_of_a_poll() -> None:
    assert _kinds(_poll(assigned={"0": [3, 1], "2": [0, 1]}, revoked=[1])) == []
    assert _kinds(_poll(assigned={}, revoked=[])) == []
    for bad in (
        {"assigned": {"0": [3]}},
        {"assigned": {"0": [3, -1]}},
        {"assigned": {"x": [3, 1]}},
        {"assigned": [[0, 3, 1]]},
        {"revoked": ["0"]},
        {"revoked": 1},
    ):
        assert _kinds(_poll(**bad)) == ["model-value"], bad


def test_group_fields_belong_to_an_ok_poll_of_a_queue() -> None:
    # On another queue op.
    assert _kinds(_pair("commit", commit_value({0: 3}), assigned={"0": [3, 1]})) == ["model-value"]
    # On a poll that did not complete ok: the op itself is malformed.
    with pytest.raises(ValueError, match="only an ok completion carries assigned or revoked"):
        Op.from_json(_pair("poll", [["poll"]], type="fail", revoked=[0])[1])
    # In another model.
    write = _pair("write", 1, assigned={"0": [3, 1]})
    for x in write:
        x["key"] = "k"
    problems = check_well_formed([Op.from_json(x) for x in write], model="register")
    assert [p.kind for p in problems if "assigned" in p.message] == ["model-value"]
    write[1]["assigned"] = None
    problems = check_well_formed([Op.from_json(x) for x in write], model="register")
    assert not [p for p in problems if "assigned" in p.message]
    # The fields are the format's, and no others are.
    assert GROUP_FIELDS == ("assigned", "revoked")
    with pytest.raises(ValueError, match="unknown field"):
        Op.from_json({**_poll()[1], "assignd": {}})


def test_group_field_problems_name_the_field() -> None:
    assert group_field_problems("poll", None, None) == []
    assert group_field_problems("send", {"0": [0, 1]}, None) == [
        "only an ok poll carries assigned or revoked, not a send"
    ]
    [msg] = group_field_problems("poll", {"0": [1]}, None)
    assert "[start offset, time ns]" in msg and "key 0" in msg

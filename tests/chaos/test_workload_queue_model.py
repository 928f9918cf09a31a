"""The ``queue`` model of docs/history-format.md: the op shapes the workload
writes pass the checks, and each shape rule fires on a broken op."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from history.ops import Op, check_well_formed
from history.queue import (
    KeyMap,
    assign_value,
    poll_invoke_value,
    poll_ok_value,
    send_completion_value,
    send_invoke_value,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "history-format.md").read_text()


def _doc_queue_example() -> list[dict]:
    [body] = re.findall(r"<!-- example: history queue -->\n```jsonl\n(.*?)```", DOC, re.DOTALL)
    return [json.loads(line) for line in body.splitlines()]


def _ops(lines: list[dict]) -> list[Op]:
    return [Op.from_json(line) for line in lines]


def _kinds(lines: list[dict]) -> list[str]:
    return [p.kind for p in check_well_formed(_ops(lines), model="queue")]


def test_the_doc_example_is_what_the_builders_write() -> None:
    lines = _doc_queue_example()
    assert check_well_formed(_ops(lines), model="queue") == []
    assert lines[0]["value"] == assign_value([1, 0], True)
    assert lines[2]["value"] == send_invoke_value([(0, 1), (1, 2)])
    assert lines[3]["value"] == send_completion_value([(0, 1), (1, 2)], [0, 0])
    assert lines[4]["value"] == poll_invoke_value()
    assert lines[5]["value"] == poll_ok_value({1: [(0, 2)], 0: [(0, 1)]})
    assert lines[7]["value"] == send_completion_value([(1, 3)], [None])
    assert {line["error"] for line in lines if "error" in line} == {
        "not-enough-replicas",
        "request-timed-out",
        "crash",
    }


def _base() -> list[dict]:
    return [
        {
            "index": 0,
            "time": 1,
            "type": "invoke",
            "process": 0,
            "f": "send",
            "value": [["send", 0, 1]],
        },
        {
            "index": 1,
            "time": 2,
            "type": "ok",
            "process": 0,
            "f": "send",
            "value": [["send", 0, [0, 1]]],
        },
    ]


def test_a_clean_send_passes() -> None:
    assert _kinds(_base()) == []


@pytest.mark.parametrize(
    ("edit", "kind"),
    [
        (lambda ls: ls[1].update(value=[["send", 0, [0, 2]]]), "model-value"),
        (lambda ls: ls[1].update(value=[["send", 1, [0, 1]]]), "model-value"),
        (lambda ls: ls[0].update(value=[["send", -1, 1]]), "model-value"),
        (lambda ls: ls[0].update(value=[["send", 0, "a"]]), "model-value"),
        (lambda ls: ls[0].update(value=[]), "model-value"),
        (lambda ls: ls[1].update(value=[["send", 0, [-3, 1]]]), "model-value"),
        (lambda ls: ls[1].update(type="fail", error="not-enough-replicas"), "model-version"),
        (lambda ls: ls[1].update(offset=0, epoch=1), "model-version"),
        (lambda ls: (ls[0].update(key="0"), ls[1].update(key="0")), "model-value"),
        (lambda ls: (ls[0].update(f="bogus"), ls[1].update(f="bogus")), "model-f"),
    ],
)
def test_each_send_rule_fires(edit, kind: str) -> None:
    lines = _base()
    edit(lines)
    assert kind in _kinds(lines)


def test_a_value_sent_twice_is_a_duplicate() -> None:
    lines = _base() + [
        {
            "index": 2,
            "time": 3,
            "type": "invoke",
            "process": 0,
            "f": "send",
            "value": [["send", 1, 1]],
        },
        {
            "index": 3,
            "time": 4,
            "type": "fail",
            "process": 0,
            "f": "send",
            "value": [["send", 1, [None, 1]]],
            "error": "not-enough-replicas",
        },
    ]
    assert _kinds(lines) == ["duplicate-value"]


def _poll(value: object, type_: str = "ok") -> list[dict]:
    return [
        {"index": 0, "time": 1, "type": "invoke", "process": 0, "f": "poll", "value": [["poll"]]},
        {"index": 1, "time": 2, "type": type_, "process": 0, "f": "poll", "value": value}
        | ({"error": "timeout"} if type_ != "ok" else {}),
    ]


def test_poll_shapes() -> None:
    assert _kinds(_poll([["poll", {}]])) == []
    assert _kinds(_poll([["poll", {"2": [[0, 5], [3, 6]]}]])) == []
    assert _kinds(_poll([["poll"]], "fail")) == []
    assert _kinds(_poll([["poll", {"2": [[3, 5], [3, 6]]}]])) == ["model-value"]
    assert _kinds(_poll([["poll", {"x": []}]])) == ["model-value"]
    assert _kinds(_poll([["poll", {"01": []}]])) == ["model-value"]
    assert _kinds(_poll([["poll", {"1": [[0, "v"]]}]])) == ["model-value"]
    assert _kinds(_poll([["poll", {}]], "fail")) == ["model-value"]


def test_assign_and_crash_shapes() -> None:
    good = {"keys": [0, 1], "seek_to_beginning": False}
    lines = [
        {"index": 0, "time": 1, "type": "invoke", "process": 0, "f": "assign", "value": good},
        {"index": 1, "time": 2, "type": "ok", "process": 0, "f": "assign", "value": good},
        {"index": 2, "time": 3, "type": "invoke", "process": 0, "f": "crash", "value": None},
        {
            "index": 3,
            "time": 4,
            "type": "info",
            "process": 0,
            "f": "crash",
            "value": None,
            "error": "crash",
        },
    ]
    assert _kinds(lines) == []
    lines[1]["value"] = {"keys": [0], "seek_to_beginning": False}
    assert _kinds(lines) == ["model-value"]
    lines[1]["value"] = good
    lines[3].update(type="ok")
    del lines[3]["error"]
    assert _kinds(lines) == ["model-value"]
    lines[0]["value"] = lines[1]["value"] = {"keys": [0]}
    assert "model-value" in _kinds(lines)


def test_key_map() -> None:
    km = KeyMap((("a", 2), ("b", 3)))
    assert km.keys == [0, 1, 2, 3, 4]
    assert [km.topic_partition(k) for k in km.keys] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]
    assert all(km.key(*km.topic_partition(k)) == k for k in km.keys)
    assert KeyMap.from_json(km.to_json()) == km
    with pytest.raises(ValueError, match="key 5 names no partition"):
        km.topic_partition(5)
    with pytest.raises(ValueError, match="repeat"):
        KeyMap((("a", 1), ("a", 2)))
    with pytest.raises(ValueError, match="partitions >= 1"):
        KeyMap((("a", 0),))


def test_an_info_or_fail_send_may_repeat_its_invoke() -> None:
    lines = _base()
    lines[1].update(type="info", error="run-ended", value=[["send", 0, 1]])
    assert _kinds(lines) == []
    lines[1].update(type="ok", value=[["send", 0, 1]])
    del lines[1]["error"]
    assert _kinds(lines) == ["model-value"]


def test_the_partitions_export_example_links_to_the_queue_example() -> None:
    from history.exports import record_hash

    [body] = re.findall(r"<!-- example: partitions -->\n```jsonl\n(.*?)```", DOC, re.DOTALL)
    lines = [json.loads(line) for line in body.splitlines()]
    final_poll = _doc_queue_example()[-1]["value"][0][1]
    for line in lines:
        assert set(line) == {
            "node", "topic", "partition", "offset", "epoch", "producer_id", "sequence",
            "control", "hash",
        }  # fmt: skip
        [value] = [v for o, v in final_poll[str(line["partition"])] if o == line["offset"]]
        assert line["hash"] == record_hash(str(value).encode())

"""Histories: ops, the recorder and writer, and reading files back."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from history.files import (
    FIELDS,
    NEMESIS,
    HistoryError,
    HistoryFormatError,
    HistoryRecorder,
    HistoryWriter,
    Op,
    check_well_formed,
    next_process,
    read_history,
    write_history,
)


class FakeClock:
    def __init__(self, start: int = 1_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def _record(rec: HistoryRecorder, clock: FakeClock) -> None:
    rec.invoke(0, "write", key="k", value="v0-1")
    clock.advance(10)
    rec.invoke(1, "read", key="k")
    clock.advance(5)
    rec.ok(0, node=2, offset=7, epoch=2)
    rec.ok(1, value="v0-1", node=2, offset=7, epoch=2)
    rec.invoke(NEMESIS, "kill", value={"nodes": [2]})
    rec.ok(NEMESIS)
    rec.invoke(0, "cas", key="k", value=["v0-1", "v0-2"])
    clock.advance(100)
    rec.info(0, "timeout", node=2)
    rec.invoke(next_process(0, 2), "read", key="k")
    rec.fail(2, "timeout")
    rec.invoke(NEMESIS, "start", value={"nodes": [2]})
    rec.ok(NEMESIS)


def test_writer_round_trip(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, clock=clock) as writer:
        _record(writer, clock)
        written = writer.count
    ops = read_history(path)
    assert len(ops) == written == 12
    assert [op.index for op in ops] == list(range(12))
    assert ops[0].time == 0  # time 0 is when the writer was made
    assert ops[1].time == 10 and ops[-1].time == 115
    assert ops[2] == Op(2, 15, "ok", 0, "write", "k", "v0-1", None, 2, 7, 2)
    assert ops[3].value == "v0-1" and ops[3].f == "read" and ops[3].key == "k"
    assert ops[7].type == "info" and ops[7].error == "timeout"
    assert check_well_formed(ops, model="register", require_nemesis=True) == []


def test_lines_have_fixed_field_order_and_omit_nulls(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, clock=clock) as writer:
        writer.invoke(3, "read", key="k")
        writer.ok(3, value=None)
    lines = path.read_text().splitlines()
    assert (
        lines[0]
        == '{"index":0,"time":0,"type":"invoke","process":3,"f":"read","key":"k","value":null}'
    )
    assert list(json.loads(lines[1])) == ["index", "time", "type", "process", "f", "key", "value"]
    full = Op(5, 9, "ok", 1, "write", "k", "v", None, 1, 2, 3).to_json()
    assert list(full) == [f for f in FIELDS if f != "error"]


def test_writer_flushes_every_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    writer = HistoryWriter(path, clock=FakeClock())
    writer.invoke(0, "write", key="k", value="a")
    assert len(read_history(path)) == 1
    writer.ok(0, offset=1, epoch=1)
    assert len(read_history(path)) == 2
    writer.close()


def test_close_completes_ops_in_flight_as_info(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    writer = HistoryWriter(path, clock=FakeClock())
    writer.invoke(4, "write", key="k", value="a")
    writer.invoke(1, "read", key="k")
    writer.invoke(NEMESIS, "partition", value={"groups": [[1], [2, 3]]})
    writer.close()
    writer.close()  # idempotent
    ops = read_history(path)
    assert [(op.process, op.type, op.error) for op in ops[3:]] == [
        (4, "info", "run-ended"),
        (1, "info", "run-ended"),
        (NEMESIS, "info", "run-ended"),
    ]
    # The history is complete; the partition may have started and never ended.
    kinds = {p.kind for p in check_well_formed(ops)}
    assert kinds == {"nemesis-unended"}


def test_writer_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text("")
    with pytest.raises(FileExistsError):
        HistoryWriter(path)


def test_recorder_refuses_broken_process_rules() -> None:
    ops: list[Op] = []
    rec = HistoryRecorder(FakeClock(), ops.append)
    rec.invoke(0, "write", key="k", value="a")
    with pytest.raises(HistoryError, match="in flight"):
        rec.invoke(0, "read", key="k")
    rec.info(0, "timeout")
    assert rec.retired(0)
    with pytest.raises(HistoryError, match="retired"):
        rec.invoke(0, "read", key="k")
    with pytest.raises(HistoryError, match="nothing in flight|no op in flight"):
        rec.ok(1)
    with pytest.raises(HistoryError, match="completion"):
        rec.complete(1, "invoke")
    with pytest.raises(HistoryError, match="needs an error"):
        rec.invoke(2, "read", key="k")
        rec.complete(2, "fail")
    # The nemesis is not retired by an info.
    rec.invoke(NEMESIS, "kill", value={"nodes": [1]})
    rec.info(NEMESIS, "timeout")
    rec.invoke(NEMESIS, "start", value={"nodes": [1]})
    rec.ok(NEMESIS)
    with pytest.raises(HistoryError, match="value.nodes"):
        rec.invoke(NEMESIS, "kill", value={})
    assert [op.index for op in ops] == list(range(len(ops)))


def test_recorder_refuses_a_clock_that_goes_back() -> None:
    clock = FakeClock(100)
    rec = HistoryRecorder(clock, lambda op: None)
    rec.invoke(0, "read", key="k")
    clock.now = 50
    with pytest.raises(HistoryError, match="clock went back"):
        rec.fail(0, "timeout")


def test_recorder_is_safe_across_threads() -> None:
    ops: list[Op] = []
    clock = FakeClock()
    lock = threading.Lock()

    def tick() -> int:
        with lock:
            clock.advance(1)
            return clock.now

    rec = HistoryRecorder(tick, ops.append)

    def worker(process: int) -> None:
        for i in range(200):
            rec.invoke(process, "write", key="k", value=f"v{process}-{i}")
            rec.ok(process, offset=i, epoch=1)

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ops) == 1600
    assert check_well_formed(ops, model="register") == []


def test_write_history_and_read_back(tmp_path: Path) -> None:
    ops: list[Op] = []
    clock = FakeClock()
    _record(HistoryRecorder(clock, ops.append), clock)
    write_history(tmp_path / "h.jsonl", ops)
    assert read_history(tmp_path / "h.jsonl") == ops


def test_op_from_json_round_trips_every_field() -> None:
    op = Op(3, 77, "fail", 2, "cas", "k", ["a", None], "precondition", 1, 5, 6)
    assert Op.from_json(json.loads(op.to_line())) == op


GOOD = '{"index":0,"time":0,"type":"invoke","process":0,"f":"read","key":"k","value":null}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"index":1,"time":0,"type":"ok","process":0}', "missing field(s) f"),
        (GOOD[:-1] + ',"proces":1}', "unknown field(s) proces"),
        (GOOD.replace('"index":0', '"index":"0"'), "index must be"),
        (GOOD.replace('"time":0', '"time":-5'), "time must be"),
        (GOOD.replace('"invoke"', '"done"'), "type must be"),
        (GOOD.replace('"process":0', '"process":"worker"'), "process must be"),
        (GOOD.replace('"process":0', '"process":true'), "process must be"),
        (GOOD.replace('"f":"read"', '"f":""'), "f must be"),
        (GOOD.replace('"key":"k"', '"key":5'), "key must be"),
        (GOOD[:-1] + ',"error":"timeout"}', "carries no error"),
        (GOOD[:-1] + ',"offset":3,"epoch":1}', "carries no offset"),
        (GOOD.replace('"invoke"', '"fail"'), "needs an error"),
        (GOOD[:-1] + ',"node":-1}', "node must be"),
        (
            '{"index":1,"time":0,"type":"invoke","process":"nemesis","f":"heal","value":[]}',
            "object",
        ),
    ],
)
def test_malformed_lines_are_refused_naming_the_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(HistoryFormatError) as info:
        read_history(path)
    assert info.value.line == 2
    assert str(info.value).startswith(f"{path}:2: ")
    assert message in str(info.value)


def test_blank_and_truncated_lines_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(GOOD + "\n\n")
    with pytest.raises(HistoryFormatError, match=r":2: empty line"):
        read_history(path)
    path.write_text(GOOD + "\n" + GOOD[:30])
    with pytest.raises(HistoryFormatError, match=r":2: truncated last line"):
        read_history(path)
    # A complete last line without its newline is still read.
    path.write_text(GOOD)
    assert len(read_history(path)) == 1

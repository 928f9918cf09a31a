"""Jepsen's history.edn: reading it, its bad input, and the verdicts on real-shaped histories.

The histories are written for these tests in the shape Jepsen's store writes
them (one op map per line, keywords, ``nil``, the nemesis's ``:info`` pairs,
``jepsen.independent`` tuples).  Pairing is done here by each process's
next event (the rule :mod:`spark_verify.pairing` applies in Spark), so that
the verdicts and counterexamples of the per-key search are checked without
a Spark session; ``test_job`` runs the same histories through ``kq verify``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_verify.jepsen import EDN_KEY, EdnHistoryError, read_edn_history
from spark_verify.load import HistoryReadError, RunInputError, Unreadable, find_runs
from spark_verify.ops import CheckOp
from spark_verify.wgl import check_key

# A cas-register under jepsen.independent: keys 1 and 2, integer values, a
# nemesis partition, a refused cas without :error, a crashed (info) write.
INDEPENDENT_VALID = """\
{:type :invoke, :f :write, :value [1 3], :process 0, :time 1000, :index 0}
{:type :invoke, :f :read, :value [2 nil], :process 1, :time 1100, :index 1}
{:type :ok, :f :write, :value [1 3], :process 0, :time 2000, :index 2}
{:type :ok, :f :read, :value [2 nil], :process 1, :time 2100, :index 3}
{:type :info, :f :start, :value nil, :process :nemesis, :time 2500, :index 4}
{:type :info, :f :start, :value {"n1" #{"n2"}}, :process :nemesis, :time 2600, :index 5}
{:type :invoke, :f :cas, :value [1 [3 4]], :process 0, :time 3000, :index 6}
{:type :invoke, :f :cas, :value [1 [5 6]], :process 1, :time 3100, :index 7}
{:type :ok, :f :cas, :value [1 [3 4]], :process 0, :time 4000, :index 8}
{:type :fail, :f :cas, :value [1 [5 6]], :process 1, :time 4100, :index 9}
{:type :invoke, :f :write, :value [2 7], :process 1, :time 5000, :index 10}
{:type :info, :f :write, :value [2 7], :process 1, :time 9000, :index 11, :error :timeout}
{:type :invoke, :f :read, :value [1 nil], :process 0, :time 9100, :index 12}
{:type :ok, :f :read, :value [1 4], :process 0, :time 9200, :index 13}
{:type :invoke, :f :read, :value [2 nil], :process 0, :time 9300, :index 14}
{:type :ok, :f :read, :value [2 7], :process 0, :time 9400, :index 15}
"""

# The same, but key 1's last read returns 3 after the cas to 4 completed.
INDEPENDENT_INVALID = INDEPENDENT_VALID.replace(
    ":value [1 4], :process 0, :time 9200", ":value [1 3], :process 0, :time 9200"
)

# A plain cas-register (no independent keys), values as Jepsen's
# cas-register workload writes them (integers 0-4), with a read whose
# :value is left out on its invoke.
REGISTER = """\
{:type :invoke, :f :write, :value 0, :process 0, :time 10}
{:type :ok, :f :write, :value 0, :process 0, :time 20}
{:type :invoke, :f :read, :process 1, :time 30}
{:type :invoke, :f :cas, :value [0 2], :process 2, :time 31}
{:type :ok, :f :cas, :value [0 2], :process 2, :time 40}
{:type :ok, :f :read, :value %s, :process 1, :time 50}
{:type :invoke, :f :read, :value nil, :process 2, :time 60}
{:type :ok, :f :read, :value 2, :process 2, :time 70}
"""


def write(tmp_path: Path, text: str, name: str = "history.edn") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def paired(lines: tuple[str, ...], run: str = "r") -> dict[str, list[CheckOp]]:
    """Client ops by key, each invoke completed by its process's next event."""
    open_ops: dict[Any, dict[str, Any]] = {}
    by_key: dict[str, list[CheckOp]] = {}
    for text in lines:
        op = json.loads(text)
        if op["type"] == "invoke":
            open_ops[op["process"]] = op
            continue
        inv = open_ops.pop(op["process"])
        by_key.setdefault(op["key"], []).append(
            CheckOp(
                run=run,
                key=op["key"],
                process=str(op["process"]),
                f=op["f"],
                type=op["type"],
                index=inv["index"],
                complete_index=op["index"],
                call=inv["time"],
                ret=None if op["type"] == "info" else op["time"],
                arg=inv["value"],
                result=op["value"],
                error=op.get("error"),
            )
        )
    assert not open_ops
    return by_key


def test_an_independent_history_becomes_kq_lines(tmp_path: Path) -> None:
    edn = read_edn_history(write(tmp_path, INDEPENDENT_VALID))
    ops = [json.loads(line) for line in edn.lines]
    # The nemesis's two :info ops are left out, and the rest renumbered.
    assert len(ops) == 14 and [o["index"] for o in ops] == list(range(14))
    assert edn.file_lines[:4] == (1, 2, 3, 4) and edn.file_lines[4] == 7
    assert edn.model == "register"
    assert ops[0] == {
        "index": 0,
        "time": 1000,
        "type": "invoke",
        "process": 0,
        "f": "write",
        "key": "1",
        "value": 3,
    }
    assert ops[1]["key"] == "2" and ops[1]["value"] is None
    assert ops[4]["value"] == [3, 4]
    # A fail without :error stays without one; a keyword error is its name.
    assert ops[7]["type"] == "fail" and "error" not in ops[7]
    assert ops[9]["error"] == "timeout"


def test_a_plain_register_is_one_key_and_a_missing_invoke_value_is_null(
    tmp_path: Path,
) -> None:
    edn = read_edn_history(write(tmp_path, REGISTER % "0"))
    ops = [json.loads(line) for line in edn.lines]
    assert {o["key"] for o in ops} == {EDN_KEY}
    assert ops[2] == {
        "index": 2,
        "time": 30,
        "type": "invoke",
        "process": 1,
        "f": "read",
        "key": EDN_KEY,
        "value": None,
    }


def test_older_stores_one_vector_of_ops(tmp_path: Path) -> None:
    text = "[" + REGISTER.replace("%s", "0").replace("\n", "\n ") + "]\n"
    edn = read_edn_history(write(tmp_path, text))
    assert len(edn.lines) == 8
    bad = text.replace(":process 2, :time 60", ":process -2, :time 60")
    with pytest.raises(EdnHistoryError, match=r"history\.edn: op 6: field :process"):
        read_edn_history(write(tmp_path, bad))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{:type :invoke, :f :read", r"line 2: not EDN"),
        ("[1 2]", r"line 2: not an op map"),
        ("{:f :read, :process 0, :time 5}", r"line 2: missing field\(s\) :type"),
        ("{:type :done, :f :read, :process 0, :time 5}", r"line 2: field :type must be"),
        ('{:type :ok, :f :read, :process "p", :time 5}', r"line 2: field :process must be"),
        ("{:type :ok, :f 3, :process 0, :time 5}", r"line 2: field :f must be"),
        ("{:type :ok, :f :read, :process 0, :time -5}", r"line 2: field :time must be"),
        ("{:type :ok, :f :read, :process 0, :time 5, :index 1.5}", r"line 2: field :index"),
        ("{:type :ok, :f :read, :process 0, :time 5, :value #{1}}", r"line 2: field :value"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path: Path, line: str, expected: str) -> None:
    first = "{:type :invoke, :f :read, :value nil, :process 0, :time 1}"
    path = write(tmp_path, first + "\n" + line + "\n")
    with pytest.raises(EdnHistoryError, match=r"history\.edn: " + expected):
        read_edn_history(path)


def test_independent_keys_that_share_a_name_are_refused(tmp_path: Path) -> None:
    text = (
        "{:type :invoke, :f :write, :value [1 1], :process 0, :time 1}\n"
        "{:type :ok, :f :write, :value [1 1], :process 0, :time 2}\n"
        '{:type :invoke, :f :write, :value ["1" 2], :process 0, :time 3}\n'
        '{:type :ok, :f :write, :value ["1" 2], :process 0, :time 4}\n'
    )
    with pytest.raises(EdnHistoryError, match=r"line 3: field :value: keys 1 and \"1\""):
        read_edn_history(write(tmp_path, text))


def test_find_runs_reads_store_folders_files_and_jepsen_model_names(tmp_path: Path) -> None:
    store = tmp_path / "store" / "cas-test"
    (store / "20260101T000000").mkdir(parents=True)
    write(store / "20260101T000000", INDEPENDENT_VALID)
    (store / "latest").symlink_to(store / "20260101T000000")
    (run,) = find_runs([store])
    assert run.name == "20260101T000000" and run.fmt == "edn" and run.model == "register"
    bare = write(tmp_path, REGISTER % "0", "cas.edn")
    (one,) = find_runs([bare], model="cas-register")
    assert one.model == "register" and one.edn is not None and len(one.edn.lines) == 8
    with pytest.raises(RunInputError, match="unknown model 'mutex'"):
        find_runs([bare], model="mutex")
    broken = write(tmp_path, "{:type :ok\n", "broken.edn")
    with pytest.raises(HistoryReadError, match=r"broken\.edn: line 1: not EDN"):
        find_runs([broken])
    unreadable: list[Unreadable] = []
    runs = find_runs([bare, broken], unreadable=unreadable)
    assert [r.name for r in runs] == ["cas"]
    assert [u.name for u in unreadable] == ["broken"] and "line 1" in unreadable[0].message


def test_verdicts_and_counterexample_of_an_independent_cas_register(tmp_path: Path) -> None:
    good = paired(read_edn_history(write(tmp_path, INDEPENDENT_VALID)).lines)
    assert {k: check_key(ops, "register").valid for k, ops in good.items()} == {
        "1": True,
        "2": True,
    }
    bad = paired(read_edn_history(write(tmp_path, INDEPENDENT_INVALID)).lines)
    result = check_key(bad["1"], "register")
    assert result.valid is False
    # The counterexample: the write of 3, the cas from 3 to 4, and the
    # later read of 3 (the refused cas and the other key's ops are not in it).
    assert [(op.f, op.arg, op.result) for op in result.witness] == [
        ("write", 3, 3),
        ("cas", [3, 4], [3, 4]),
        ("read", None, 3),
    ]
    assert "read of 3" in (result.message or "")
    assert check_key(bad["2"], "register").valid is True


@pytest.mark.parametrize(("seen", "valid"), [("0", True), ("2", True), ("4", False)])
def test_verdicts_of_a_plain_cas_register(tmp_path: Path, seen: str, valid: bool) -> None:
    ops = paired(read_edn_history(write(tmp_path, REGISTER % seen)).lines)[EDN_KEY]
    result = check_key(ops, "register")
    assert result.valid is valid
    if not valid:
        assert [op.result for op in result.witness if op.f == "read"] == [4]


KV = """\
{:type :invoke, :f :put, :value [:x 1], :process 0, :time 10}
{:type :ok, :f :put, :value [:x 1], :process 0, :time 20}
{:type :invoke, :f :delete, :value [:x nil], :process 1, :time 30}
{:type :ok, :f :delete, :value [:x nil], :process 1, :time 40}
{:type :invoke, :f :get, :value [:x nil], :process 0, :time 50}
{:type :ok, :f :get, :value [:x %s], :process 0, :time 60}
"""


@pytest.mark.parametrize(("seen", "valid"), [("nil", True), ("1", False)])
def test_verdicts_of_a_kv_history_with_keyword_keys(tmp_path: Path, seen: str, valid: bool) -> None:
    edn = read_edn_history(write(tmp_path, KV % seen))
    assert edn.model == "kv"
    ops = paired(edn.lines)["x"]
    result = check_key(ops, "kv")
    assert result.valid is valid
    if not valid:
        assert [op.f for op in result.witness] == ["put", "delete", "get"]

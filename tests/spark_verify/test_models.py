"""The register and kv models, and paired ops (CheckOp)."""

from __future__ import annotations

from typing import Any

import pytest

from spark_verify.models import ILLEGAL, KV, MODELS, REGISTER, model_of
from spark_verify.ops import KEYS_COLUMNS, PAIRED_COLUMNS, CheckOp
from tests.spark_verify.histories import History


def test_model_of_names_the_known_models() -> None:
    assert model_of("kv") is KV
    assert set(MODELS) == {"register", "kv"}
    with pytest.raises(ValueError, match=r"'topics'.*known: kv, register"):
        model_of("topics")


def test_register_steps() -> None:
    h = History()
    read = REGISTER.step_of(h.read(0, "a", 0, 1))
    assert read is not None and read[1] is True
    assert read[0]("a") == "a" and read[0]("b") is ILLEGAL and read[0](None) is ILLEGAL
    write = REGISTER.step_of(h.write(0, "b", 2, 3))
    assert write is not None and write[0]("a") == "b" and write[0](None) == "b"
    cas = REGISTER.step_of(h.cas(0, "b", "c", 4, 5))
    assert cas is not None and cas[0]("b") == "c" and cas[0]("a") is ILLEGAL
    from_empty = REGISTER.step_of(h.cas(0, None, "d", 6, 7))
    assert from_empty is not None and from_empty[0](None) == "d" and from_empty[0]("c") is ILLEGAL


def test_outcomes_decide_what_enters_the_search() -> None:
    h = History()
    # A cas refused with precondition is required and legal iff the state is not expected.
    refused = REGISTER.step_of(h.cas(0, "x", "y", 0, 1, type="fail", error="precondition"))
    assert refused is not None and refused[1] is True
    assert refused[0]("z") == "z" and refused[0](None) is None and refused[0]("x") is ILLEGAL
    # Any other fail has no effect; fail and info reads have none either.
    assert REGISTER.step_of(h.cas(0, "x", "w", 2, 3, type="fail", error="not-leader")) is None
    assert REGISTER.step_of(h.write(1, "v", 4, 5, type="fail")) is None
    assert REGISTER.step_of(h.read(2, None, 6, 7, type="fail", error="timeout")) is None
    assert REGISTER.step_of(h.read(3, None, 8, None, type="info")) is None
    # An info write may take effect: optional.
    info = REGISTER.step_of(h.write(4, "u", 9, None, type="info"))
    assert info is not None and info[1] is False and info[0]("q") == "u"


def test_kv_adds_delete_get_put_append() -> None:
    h = History()
    get = KV.step_of(h.read(0, "a", 0, 1, f="get"))
    assert get is not None and get[0]("a") == "a" and get[0]("b") is ILLEGAL
    put = KV.step_of(h.write(0, "p", 2, 3, f="put"))
    assert put is not None and put[0](None) == "p"
    delete = KV.step_of(h.delete(0, 4, 5))
    assert delete is not None and delete[0]("p") is None
    append = KV.step_of(h.append(0, "x;", 6, 7))
    assert append is not None
    assert append[0](None) == "x;" and append[0]("p") == "px;"


@pytest.mark.parametrize(
    ("model", "f", "arg", "result", "type", "error", "expected"),
    [
        ("register", "delete", None, None, "ok", None, "register has no f 'delete'"),
        ("register", "get", None, "a", "ok", None, "register has no f 'get'"),
        ("kv", "incr", 1, 1, "ok", None, "kv has no f 'incr'"),
        ("register", "write", [3], [3], "ok", None, "a write's value is a JSON scalar, got [3]"),
        ("register", "write", {"a": 1}, {"a": 1}, "ok", None, "a write's value is a JSON scalar"),
        ("register", "cas", ["a"], ["a"], "ok", None, "a cas's value is [expected"),
        ("register", "cas", ["a", [1]], ["a", [1]], "ok", None, "a cas's value is"),
        ("kv", "append", 3, 3, "ok", None, "an append's value is a string, got 3"),
        ("kv", "delete", "a", "a", "ok", None, "a delete's value is null"),
        ("kv", "append", "", "", "ok", None, "non-empty string"),
        ("register", "read", "a", None, "ok", None, "invoke value is null"),
        ("register", "read", None, [5], "ok", None, "a read returns a value (a JSON scalar)"),
        ("register", "read", None, "a", "fail", "timeout", "a read's fail value is null"),
        ("register", "write", "a", "b", "ok", None, "repeats its invoke's value 'a', got 'b'"),
        ("register", "write", "a", "a", "fail", "precondition", "belongs to a failed cas"),
    ],
)
def test_problems_name_what_is_wrong(
    model: str, f: str, arg: object, result: object, type: str, error: str | None, expected: str
) -> None:
    op = History().add(f, 0, 0, 1, arg, result, type=type, error=error)
    problems = model_of(model).problems(op)
    assert any(expected in p for p in problems), problems
    with pytest.raises(ValueError, match=r"^op 0 "):
        model_of(model).step_of(op)


def test_well_formed_ops_have_no_problems() -> None:
    h = History()
    ops = [
        h.read(0, None, 0, 1),
        h.write(0, "a", 2, 3),
        h.cas(0, "a", "b", 4, 5),
        h.cas(1, None, "c", 4, 9, type="fail", error="precondition"),
        h.write(2, "d", 6, None, type="info"),
    ]
    assert [REGISTER.problems(op) for op in ops] == [[]] * len(ops)
    kv = [h.delete(0, 10, 11), h.append(0, "e", 12, 13), h.read(0, "e", 14, 15, f="get")]
    assert [KV.problems(op) for op in kv] == [[]] * len(kv)
    assert REGISTER.problems(History(key=None).read(0, None, 0, 1)) == [  # type: ignore[arg-type]
        "a register op needs a key"
    ]


def _row(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "run": "r1",
        "key": "k1",
        "process": "7",
        "f": "cas",
        "type": "ok",
        "index": 4,
        "complete_index": 9,
        "call": 100,
        "ret": 200,
        "value": '["a","b"]',
        "result": '["a","b"]',
        "error": None,
        "node": 2,
        "offset": 8,
        "epoch": 2,
    }
    row.update(over)
    return row


def test_check_op_from_a_paired_row_and_back_to_json() -> None:
    op = CheckOp.from_row(_row())
    assert op.arg == ["a", "b"] and op.result == ["a", "b"] and op.process == "7"
    assert op.to_json() == {
        "index": 4,
        "complete_index": 9,
        "process": 7,
        "f": "cas",
        "key": "k1",
        "type": "ok",
        "value": ["a", "b"],
        "result": ["a", "b"],
        "time": 100,
        "complete_time": 200,
        "node": 2,
        "offset": 8,
        "epoch": 2,
    }
    info = CheckOp.from_row(
        _row(f="write", type="info", ret=None, value=None, result=None, error="timeout")
    )
    assert info.ret is None
    out = info.to_json()
    assert out["value"] is None and "result" not in out and "complete_time" not in out
    assert out["error"] == "timeout"


def test_check_op_refuses_bad_rows() -> None:
    with pytest.raises(ValueError, match=r"op 4: field 'value' is not JSON"):
        CheckOp.from_row(_row(value="[oops"))
    with pytest.raises(ValueError, match=r"op 4: field 'result' is not JSON"):
        CheckOp.from_row(_row(result="v1"))
    with pytest.raises(ValueError, match=r"op 4: field 'call' is missing"):
        CheckOp.from_row(_row(call=None))
    with pytest.raises(ValueError, match=r"op 4: an ok op needs its completion time"):
        CheckOp.from_row(_row(ret=None))
    with pytest.raises(ValueError, match=r"op 4: type must be one of ok, fail, info"):
        CheckOp.from_row(_row(type="invoke"))
    with pytest.raises(ValueError, match=r"op 4: completes at 50, before its invoke at 100"):
        CheckOp.from_row(_row(ret=50))


def test_schema_columns() -> None:
    assert PAIRED_COLUMNS == (
        "run", "key", "process", "f", "type", "index", "complete_index", "call", "ret",
        "value", "result", "error", "node", "offset", "epoch",
    )  # fmt: skip
    assert KEYS_COLUMNS == (
        "run", "key", "ops", "valid", "elapsed_ms", "states", "kind", "message", "witness",
        "memory_bytes",
    )  # fmt: skip


def test_any_json_scalar_is_a_value_compared_by_value_and_type() -> None:
    # Jepsen's register histories write integers; Clojure's = tells 1 from
    # "1", from 1.0 and from true, and so must the models.
    h = History()
    ops = [
        h.write(0, 3, 0, 1),
        h.read(1, 3, 2, 3),
        h.cas(0, 3, True, 4, 5),
        h.read(1, True, 6, 7),
        h.cas(0, True, 1.5, 8, 9),
        h.write(2, None, 10, 11),
    ]
    assert [REGISTER.problems(op) for op in ops] == [[]] * len(ops)
    read_int = REGISTER.step_of(ops[1])
    assert read_int is not None
    step = read_int[0]
    assert step(3) == 3
    for other in ("3", 3.0, True):
        assert step(CheckOp(**{**_fields(ops[1]), "result": other}).result) is ILLEGAL
    read_true = REGISTER.step_of(ops[3])
    assert read_true is not None and read_true[0](1) is ILLEGAL
    assert read_true[0](CheckOp(**{**_fields(ops[3]), "result": True}).result) is not ILLEGAL


def test_booleans_and_decimals_keep_their_json_form_in_witnesses() -> None:
    h = History()
    op = h.cas(0, 1, 1.0, 0, 1)
    assert op.to_json()["value"] == [1, 1.0]
    assert isinstance(op.to_json()["value"][1], float)
    assert h.write(0, True, 2, 3).to_json()["value"] is True


def _fields(op: CheckOp) -> dict[str, Any]:
    return {name: getattr(op, name) for name in CheckOp.__slots__}

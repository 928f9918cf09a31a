"""check_well_formed: each rule, shown to hold and shown to fail."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from history.files import (
    NEMESIS,
    PROBLEM_KINDS,
    HistoryRecorder,
    Op,
    check_well_formed,
    next_process,
    read_history,
    write_history,
)


def h(*specs: dict[str, Any]) -> list[Op]:
    """Ops from partial field dicts: ``index`` is the position and ``time``
    ten times it unless given."""
    out = []
    for i, spec in enumerate(specs):
        fields: dict[str, Any] = {"index": i, "time": 10 * i, **spec}
        out.append(Op(**fields))
    return out


def inv(process: Any, f: str, value: Any = None, key: str | None = "k", **kw: Any) -> dict:
    return {"type": "invoke", "process": process, "f": f, "key": key, "value": value, **kw}


def done(type: str, process: Any, f: str, value: Any = None, key: str | None = "k", **kw: Any):
    if type in ("fail", "info"):
        kw.setdefault("error", "timeout")
    return {"type": type, "process": process, "f": f, "key": key, "value": value, **kw}


def nem(f: str, value: dict, type: str = "ok") -> tuple[dict, dict]:
    extra = {"error": "timeout"} if type in ("fail", "info") else {}
    return (
        {"type": "invoke", "process": NEMESIS, "f": f, "value": value},
        {"type": type, "process": NEMESIS, "f": f, "value": value, **extra},
    )


V: dict[str, Any] = {"offset": 1, "epoch": 1}

# kind -> (ops, check_well_formed keyword arguments); each example breaks
# exactly one rule, so the test also shows that the other checks stay quiet.
FAILING: dict[str, list[tuple[list[Op], dict[str, Any]]]] = {
    "invalid-op": [
        (h({**done("ok", 0, "read"), "type": "done"}), {}),
        (h(inv(0, "read"), done("ok", 0, "read", error="timeout")), {}),
        (h(inv(0, "read"), {**done("fail", 0, "read"), "error": None}), {}),
        (h(inv(-1, "read"), done("fail", -1, "read")), {}),
        (h(inv(0, "read", offset=1, epoch=1), done("fail", 0, "read")), {}),
        (h(*nem("kill", {})), {}),
        (h({**inv(NEMESIS, "heal", {}), "key": "k"}, {**done("ok", NEMESIS, "heal", {})}), {}),
    ],
    "index": [
        (
            [
                dataclasses.replace(op, index=op.index + 1)
                for op in h(inv(0, "read"), done("fail", 0, "read"))
            ],
            {},
        ),
        (h(inv(0, "read"), inv(1, "read"), done("fail", 0, "read"))[::2], {}),
    ],
    "time": [
        (h({**inv(0, "read"), "time": 50}, {**done("fail", 0, "read"), "time": 40}), {}),
    ],
    "concurrent-invoke": [
        (h(inv(0, "write", "a"), inv(0, "write", "b"), done("ok", 0, "write", "b", **V)), {}),
        (h(*nem("kill", {"nodes": [1]})[:1], *nem("start", {"nodes": [1]})), {}),
    ],
    "unmatched-completion": [
        (h(done("ok", 0, "read", "a", **V)), {}),
        (h(inv(0, "read"), done("fail", 0, "read"), done("fail", 0, "read")), {}),
    ],
    "completion-mismatch": [
        (h(inv(0, "read"), done("fail", 0, "write")), {}),
        (h(inv(0, "read"), done("fail", 0, "read", key="other")), {}),
    ],
    "open-invoke": [
        (h(inv(0, "read")), {}),
        (h(inv(0, "write", "a"), inv(1, "read"), done("fail", 1, "read")), {}),
    ],
    "invoke-after-info": [
        (
            h(
                inv(0, "write", "a"),
                done("info", 0, "write", "a"),
                inv(0, "read"),
                done("fail", 0, "read"),
            ),
            {},
        ),
    ],
    "nemesis-unended": [
        (h(*nem("kill", {"nodes": [2]})), {}),
        (h(*nem("kill", {"nodes": [2]}), *nem("start", {"nodes": [3]})), {}),
        (h(*nem("kill", {"nodes": [2, 3]}), *nem("start", {"nodes": [3]})), {}),
        (h(*nem("pause", {"nodes": [1]}), *nem("start", {"nodes": [1]})), {}),
        (h(*nem("partition", {"groups": [[1], [2, 3]]})), {}),
        (h(*nem("packet", {"drop": 0.5})), {}),
        # A kill that may have happened must be ended too ...
        (h(*nem("kill", {"nodes": [2]}, "info")), {}),
        # ... and an end that may not have happened ends nothing.
        (h(*nem("partition", {"groups": [[1], [2]]}), *nem("heal", {}, "info")), {}),
        # An end before the start does not count.
        (h(*nem("heal", {}), *nem("partition", {"groups": [[1], [2]]})), {}),
    ],
    "nemesis-missing": [
        (h(inv(0, "read"), done("fail", 0, "read")), {"require_nemesis": True}),
    ],
    "model-f": [
        (h(inv(0, "delete"), done("ok", 0, "delete", **V)), {"model": "register"}),
        (h(inv(0, "read"), done("fail", 0, "read")), {"model": "log"}),
    ],
    "model-value": [
        (h(inv(0, "write", 5), done("ok", 0, "write", 5, **V)), {"model": "register"}),
        (h(inv(0, "cas", "a"), done("ok", 0, "cas", "a", **V)), {"model": "kv"}),
        (h(inv(0, "append", ""), done("ok", 0, "append", "", **V)), {"model": "kv"}),
        (h(inv(0, "cas", ["a", None]), done("fail", 0, "cas", ["a", None])), {"model": "kv"}),
        (h(inv(0, "read", "a"), done("fail", 0, "read", "a")), {"model": "register"}),
        (h(inv(0, "read"), done("ok", 0, "read", ["a"], **V)), {"model": "register"}),
        (h(inv(0, "delete", "a"), done("ok", 0, "delete", "a", **V)), {"model": "kv"}),
        (h(inv(0, "write", "a"), done("ok", 0, "write", "b", **V)), {"model": "register"}),
        (h(inv(0, "write", []), done("fail", 0, "write", [])), {"model": "log"}),
        (
            h(inv(0, "write", "a", key=None), done("fail", 0, "write", "a", key=None)),
            {"model": "kv"},
        ),
    ],
    "duplicate-value": [
        (
            h(
                inv(0, "write", "a"),
                done("ok", 0, "write", "a", **V),
                inv(0, "cas", ["a", "a"]),
                done("fail", 0, "cas", ["a", "a"], error="precondition"),
            ),
            {"model": "register"},
        ),
        (
            h(inv(0, "write", ["r1", "r1"]), done("info", 0, "write", ["r1", "r1"])),
            {"model": "log"},
        ),
    ],
    "model-version": [
        (h(inv(0, "write", "a"), done("ok", 0, "write", "a")), {"model": "register"}),
        (h(inv(0, "get"), done("ok", 0, "get", None, **V)), {"model": "kv"}),
        (h(inv(0, "read"), done("ok", 0, "read", None, **V)), {"model": "kv"}),
        (h(inv(0, "write", "a"), done("ok", 0, "write", "a", offset=3)), {"model": "kv"}),
        (h(inv(0, "delete"), done("ok", 0, "delete")), {"model": "kv"}),
    ],
    "model-error": [
        (
            h(inv(0, "write", "a"), done("fail", 0, "write", "a", error="precondition")),
            {"model": "register"},
        ),
    ],
}


def test_every_problem_kind_has_failing_examples() -> None:
    assert set(FAILING) == set(PROBLEM_KINDS)


CASES = [
    pytest.param(kind, ops, kwargs, id=f"{kind}-{i}")
    for kind, examples in FAILING.items()
    for i, (ops, kwargs) in enumerate(examples)
]


@pytest.mark.parametrize(("kind", "ops", "kwargs"), CASES)
def test_each_rule_can_fail(kind: str, ops: list[Op], kwargs: dict[str, Any]) -> None:
    problems = check_well_formed(ops, **kwargs)
    assert {p.kind for p in problems} == {kind}, problems
    assert all(p.message for p in problems)


@pytest.mark.parametrize(
    ("ops", "kwargs"),
    [
        # Faults that end, per node and for the whole network.
        (
            h(
                *nem("kill", {"nodes": [2, 3]}),
                *nem("partition", {"groups": [[1], [2]]}),
                *nem("packet", {"drop": 0.1}),
                *nem("start", {"nodes": [2]}),
                *nem("heal", {}),
                *nem("start", {"nodes": [3]}),
                *nem("pause", {"nodes": [1]}),
                *nem("resume", {"nodes": [1]}),
            ),
            {"require_nemesis": True},
        ),
        # A fault that was not made needs no end; ends with nothing to end are fine.
        (
            h(
                *nem("kill", {"nodes": [2]}, "fail"),
                *nem("heal", {}),
                *nem("start", {"nodes": [1]}),
            ),
            {},
        ),
        # Instant faults.
        (h(*nem("resign", {"nodes": [1], "successors": []})), {}),
        # The same value on two keys, a cas from absent, a delete, an info read.
        (
            h(
                inv(0, "write", "a"),
                done("ok", 0, "write", "a", **V),
                inv(0, "write", "a", key="j"),
                done("fail", 0, "write", "a", key="j", error="not-leader"),
                inv(1, "cas", [None, "b"], key="j"),
                done("fail", 1, "cas", [None, "b"], key="j", error="precondition", **V),
                inv(1, "delete", key="j"),
                done("ok", 1, "delete", key="j", **V),
                inv(1, "read"),
                done("info", 1, "read"),
            ),
            {"model": "kv"},
        ),
        # A read of a store that reports no versions (the metadata configs).
        (h(inv(0, "read"), done("ok", 0, "read", "a")), {"model": "register"}),
        # Porcupine's kv names: get, put, append.
        (
            h(
                inv(0, "put", "x"),
                done("ok", 0, "put", "x", **V),
                inv(0, "append", "y"),
                done("ok", 0, "append", "y", **V),
                inv(1, "get"),
                done("ok", 1, "get", "xy", **V),
            ),
            {"model": "kv"},
        ),
        # An empty history.
        ([], {"model": "register"}),
    ],
)
def test_valid_histories_pass(ops: list[Op], kwargs: dict[str, Any]) -> None:
    assert check_well_formed(ops, **kwargs) == []


def test_an_unknown_model_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        check_well_formed([], model="jepsen-queue")


# -- generated histories ---------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn, model: str) -> list[Op]:
    """A valid history of ``model`` as a harness would record it: workers
    that each run one op at a time (a new process after an info), unique
    written values, a nemesis that ends what it starts."""
    concurrency = draw(st.integers(1, 4))
    keys = ["a", "b", "c"][: draw(st.integers(1, 3))]
    fs = ["read", "write", "cas"] + (["delete"] if model == "kv" else [])
    clock = [0]
    ops: list[Op] = []
    rec = HistoryRecorder(lambda: clock[0], ops.append, start_ns=0)
    workers = list(range(concurrency))
    written: dict[str, list[str]] = {k: [] for k in keys}
    serial = [0]

    def fresh(process: int) -> str:
        serial[0] += 1
        return f"v{process}-{serial[0]}"

    def version() -> dict[str, Any]:
        return {"offset": draw(st.integers(0, 99)), "epoch": draw(st.integers(0, 9))}

    def step_nemesis() -> None:
        if NEMESIS in rec.in_flight():
            outcome = draw(st.sampled_from(["ok", "ok", "fail", "info"]))
            if outcome == "ok":
                rec.ok(NEMESIS)
            elif outcome == "fail":
                rec.fail(NEMESIS, "no-effect")
            else:
                rec.info(NEMESIS, "timeout")
            return
        node = draw(st.integers(1, 3))
        action = draw(st.sampled_from(["kill", "start", "partition", "heal", "resign"]))
        value: dict[str, Any] = {"nodes": [node]}
        if action == "partition":
            value = {"groups": [[node], [n for n in (1, 2, 3) if n != node]]}
        elif action == "heal":
            value = {}
        rec.invoke(NEMESIS, action, value=value)

    def step_client(w: int) -> None:
        p = workers[w]
        inflight = rec.in_flight().get(p)
        if inflight is None:
            f = draw(st.sampled_from(fs))
            key = draw(st.sampled_from(keys))
            value: Any = None
            if f == "write":
                value = fresh(p)
            elif f == "cas":
                expected = draw(st.sampled_from([None, *written[key]]))
                value = [expected, fresh(p)]
            rec.invoke(p, f, key=key, value=value)
            if f in ("write", "cas"):
                written[key].append(value if f == "write" else value[1])
            return
        outcome = draw(st.sampled_from(["ok", "fail", "info"]))
        if outcome == "ok":
            if inflight.f == "read":
                got = draw(st.sampled_from([None, *written[inflight.key or ""]]))
                rec.ok(p, value=got, **(version() if got is not None else {}))
            else:
                rec.ok(p, **version())
        elif outcome == "fail":
            error = "precondition" if inflight.f == "cas" else "timeout"
            rec.fail(p, error)
        else:
            rec.info(p, "timeout")
            workers[w] = next_process(p, concurrency)

    for _ in range(draw(st.integers(0, 40))):
        clock[0] += draw(st.integers(0, 1_000))
        who = draw(st.integers(0, concurrency))
        if who == concurrency:
            step_nemesis()
        else:
            step_client(who)
    # The end of a run: finish the nemesis' action, end every fault, close the rest.
    if NEMESIS in rec.in_flight():
        rec.ok(NEMESIS)
    rec.invoke(NEMESIS, "heal", value={})
    rec.ok(NEMESIS)
    rec.invoke(NEMESIS, "start", value={"nodes": [1, 2, 3]})
    rec.ok(NEMESIS)
    rec.close_open()
    return ops


@given(st.sampled_from(["register", "kv"]).flatmap(lambda m: st.tuples(st.just(m), histories(m))))
def test_generated_histories_are_well_formed_and_round_trip(case: tuple[str, list[Op]]) -> None:
    model, ops = case
    assert check_well_formed(ops, model=model, require_nemesis=True) == []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        write_history(path, ops)
        assert read_history(path) == ops


@given(histories("kv"), st.data())
def test_dropping_any_op_breaks_the_history(ops: list[Op], data: st.DataObject) -> None:
    """Every line is an invoke or a completion, so losing any one leaves an
    invoke without its completion or a completion without its invoke."""
    drop = data.draw(st.integers(0, len(ops) - 1))
    rest = [
        dataclasses.replace(op, index=i)
        for i, op in enumerate(op for j, op in enumerate(ops) if j != drop)
    ]
    kinds = {p.kind for p in check_well_formed(rest, model="kv")}
    assert kinds & {"open-invoke", "unmatched-completion", "concurrent-invoke"}, kinds

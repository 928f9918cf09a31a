"""The compiled loop of the linearizability search (spark_verify/_wgl.pyx)
against the reference loop (spark_verify/wgl.py): the same histories, valid
and broken, give the same verdict, the same number of states explored, the
same message (so the same blocking op) and the same witness.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_verify import wgl
from spark_verify.ops import CheckOp
from spark_verify.wgl import check_key
from tests.spark_verify.histories import History, PlanStep, sequential_history

pytestmark = pytest.mark.skipif(
    not wgl.COMPILED,
    reason="spark_verify._wgl is not built (no Cython or C compiler at install) "
    "or KQ_PURE_PYTHON is set",
)

# f 0..5: every kind but append (keys with appends run the reference loop).
plans = st.lists(
    st.builds(
        PlanStep,
        f=st.integers(0, 5),
        pick=st.integers(0, 3),
        outcome=st.integers(0, 11),
        worker=st.integers(0, 7),
        before=st.integers(0, 15),
        after=st.integers(0, 15),
    ),
    min_size=3,
    max_size=60,
)
models = st.sampled_from(["register", "kv"])
BUDGET_S = 120.0


def _int_values(ops: list[CheckOp]) -> list[CheckOp]:
    """The same history with integers for values (Jepsen's register histories)."""

    def num(v: Any) -> Any:
        if isinstance(v, str) and v.startswith("v"):
            return int(v[1:])
        if isinstance(v, list):
            return [num(x) for x in v]
        return v

    return [dataclasses.replace(op, arg=num(op.arg), result=num(op.result)) for op in ops]


def _same(ops: list[CheckOp], model: str) -> wgl.KeyResult:
    compiled = check_key(ops, model, budget_s=BUDGET_S)
    reference = check_key(ops, model, budget_s=BUDGET_S, compiled=False)
    assert compiled.valid == reference.valid, (compiled.message, reference.message)
    assert compiled.states == reference.states
    assert compiled.message == reference.message
    assert compiled.witness == reference.witness
    assert compiled.minimal == reference.minimal
    assert compiled.valid != "unknown"
    return compiled


@settings(max_examples=200, deadline=None)
@given(models, plans, st.integers(1, 8), st.booleans())
def test_valid_histories_agree(model: str, plan: list[PlanStep], workers: int, ints: bool) -> None:
    ops = sequential_history(model, plan, workers)
    if ints:
        ops = _int_values(ops)
    assert _same(ops, model).valid is True


@settings(max_examples=300, deadline=None)
@given(models, plans, st.integers(1, 8), st.integers(0, 10_000), st.integers(0, 2))
def test_broken_histories_agree(
    model: str, plan: list[PlanStep], workers: int, which: int, how: int
) -> None:
    ops = sequential_history(model, plan, workers)
    if not ops:
        return
    i = which % len(ops)
    op = ops[i]
    written = [o.arg for o in ops if o.f in ("write", "put")] + [None]
    if how == 0 and op.f in ("read", "get") and op.type == "ok":
        # A stale or future read: another value that was written.
        ops[i] = dataclasses.replace(op, result=written[which % len(written)])
    elif how == 1 and op.ret is not None:
        # Returned earlier than it did: real time now orders it before others.
        ops[i] = dataclasses.replace(op, ret=op.call)
    elif how == 2 and op.f in ("write", "put") and op.type == "ok":
        # A write that no read can have seen is now required to have happened.
        ops[i] = dataclasses.replace(op, arg="lost", result="lost")
    _same(ops, model)


def test_a_history_the_search_must_backtrack_through() -> None:
    # Three concurrent writes and reads that only one order explains.
    h = History()
    h.write(0, 1, 0, 100)
    h.write(1, 2, 0, 100)
    h.write(2, 3, 0, 100)
    h.read(3, 2, 10, 20)
    h.read(4, 1, 30, 40)
    h.read(5, 3, 110, 120)
    assert _same(h.ops, "register").valid is True
    h.read(6, 2, 130, 140)
    result = _same(h.ops, "register")
    assert result.valid is False and result.memory_bytes > 0


def test_the_memory_bound_gives_unknown_and_how_far_the_search_got() -> None:
    h = History()
    for p in range(14):  # all concurrent: every order of them is a configuration
        h.write(p, p, 0, 1000)
    h.read(20, 0, 2000, 2001)
    h.read(21, 1, 3000, 3001)  # no write after the read of 0: no linearization
    bounded = check_key(h.ops, "register", max_bytes=64 * 1024)
    assert bounded.valid == "unknown" and bounded.witness == ()
    assert bounded.message is not None
    assert bounded.message.startswith(
        "undecided: the search stopped as its cache of seen configurations reached its 64 KiB "
        "bound, after "
    )
    assert "ops linearized at once" in bounded.message
    assert 0 < bounded.memory_bytes <= 64 * 1024
    # The same key with room enough is decided, its cache's size reported.
    decided = check_key(h.ops, "register")
    assert decided.valid is False and decided.memory_bytes > 64 * 1024
    assert decided.to_row("r", "k")["memory_bytes"] == decided.memory_bytes


def test_kq_pure_python_forces_the_reference_loop() -> None:
    code = "import spark_verify.wgl as w; print(w.COMPILED)"
    env = {k: v for k, v in os.environ.items() if k != "KQ_PURE_PYTHON"}
    for value, expected in (("1", "False"), ("0", "True"), (None, "True")):
        run_env = dict(env) if value is None else {**env, "KQ_PURE_PYTHON": value}
        done = subprocess.run(
            [sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == expected, (value, done.stderr)

"""Properties of the linearizability checker on histories of real sequential executions.

Each generated history comes from running the model one op at a time, every
op's interval containing the instant it ran (some ops ``info``, taking effect
or not, some refused or failed): it is linearizable by construction.  One read
changed to a value nobody wrote makes it non-linearizable.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_verify.ops import CheckOp
from spark_verify.wgl import check_key, find_aborted_reads
from tests.spark_verify.histories import PlanStep, sequential_history

plans = st.lists(
    st.builds(
        PlanStep,
        f=st.integers(0, 6),
        pick=st.integers(0, 3),
        outcome=st.integers(0, 11),
        worker=st.integers(0, 5),
        before=st.integers(0, 12),
        after=st.integers(0, 12),
    ),
    min_size=3,
    max_size=40,
)
models = st.sampled_from(["register", "kv"])
concurrency = st.integers(1, 6)

# Generous: these histories are small, and an "unknown" would fail the test.
BUDGET_S = 60.0


@settings(max_examples=200, deadline=None)
@given(models, plans, concurrency)
def test_sequential_executions_are_linearizable(
    model: str, plan: list[PlanStep], workers: int
) -> None:
    ops = sequential_history(model, plan, workers)
    result = check_key(ops, model, budget_s=BUDGET_S)
    assert result.valid is True, result.message
    assert find_aborted_reads(ops) == []


@settings(max_examples=200, deadline=None)
@given(models, plans, concurrency, st.integers(0, 1000))
def test_a_read_of_a_value_never_written_is_caught(
    model: str, plan: list[PlanStep], workers: int, which: int
) -> None:
    ops = sequential_history(model, plan, workers)
    reads = [i for i, op in enumerate(ops) if op.f in ("read", "get") and op.type == "ok"]
    if not reads:
        return
    i = reads[which % len(reads)]
    corrupted: CheckOp = dataclasses.replace(ops[i], result="never-written")
    ops[i] = corrupted
    result = check_key(ops, model, budget_s=BUDGET_S)
    assert result.valid is False and result.kind == "nonlinearizable"
    assert corrupted in result.witness and result.minimal
    # The witness alone is a violation too.
    assert check_key(list(result.witness), model, budget_s=BUDGET_S).valid is False
    if not any(op.f == "append" for op in ops):
        assert result.witness == (corrupted,)
        assert [a.kind for a in find_aborted_reads(ops)] == ["phantom-read"]

"""Paired histories for the per-key checkers' tests: a builder and a generator.

:class:`History` writes hand-made histories tersely.  :func:`sequential_history`
makes a history from a real sequential execution of a model: each op's
interval contains the instant it took effect, so the history is linearizable
by construction (the property tests check that the checker agrees).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_verify.ops import CheckOp

__all__ = ["History", "PlanStep", "random_plan", "sequential_history"]

_SAME = object()


@dataclass
class History:
    """Ops of one key, built one call at a time; indexes count up by two (invoke, completion)."""

    key: str = "k"
    run: str = "r"
    ops: list[CheckOp] = field(default_factory=list)

    def add(
        self,
        f: str,
        process: int | str,
        call: int,
        ret: int | None,
        arg: Any = None,
        result: Any = _SAME,
        *,
        type: str = "ok",
        error: str | None = None,
        offset: int | None = None,
        epoch: int | None = None,
        node: int | None = None,
    ) -> CheckOp:
        if result is _SAME:
            result = None if f in ("read", "get") else arg
        if type == "info":
            ret = None
            error = error or "timeout"
        elif type == "fail":
            error = error or "unavailable"
        index = 2 * len(self.ops)
        op = CheckOp(
            run=self.run,
            key=self.key,
            process=str(process),
            f=f,
            type=type,
            index=index,
            complete_index=index + 1,
            call=call,
            ret=ret,
            arg=arg,
            result=result,
            error=error,
            node=node,
            offset=offset,
            epoch=epoch,
        )
        self.ops.append(op)
        return op

    def read(self, p: int, value: Any, call: int, ret: int | None, **kw: Any) -> CheckOp:
        return self.add(kw.pop("f", "read"), p, call, ret, None, value, **kw)

    def write(self, p: int, value: Any, call: int, ret: int | None, **kw: Any) -> CheckOp:
        return self.add(kw.pop("f", "write"), p, call, ret, value, **kw)

    def cas(
        self, p: int, expected: Any, new: Any, call: int, ret: int | None, **kw: Any
    ) -> CheckOp:
        return self.add("cas", p, call, ret, [expected, new], **kw)

    def delete(self, p: int, call: int, ret: int | None, **kw: Any) -> CheckOp:
        return self.add("delete", p, call, ret, None, **kw)

    def append(self, p: int, suffix: str, call: int, ret: int | None, **kw: Any) -> CheckOp:
        return self.add("append", p, call, ret, suffix, **kw)


@dataclass(frozen=True)
class PlanStep:
    """One op of a generated history, before it is run against the model.

    ``f`` is an index into the model's op kinds; ``pick`` chooses a cas's
    expected value; ``outcome`` 0-5: 0 info that took effect, 1 info that did
    not, 2 fail without effect, else ok; ``before``/``after`` how far (in
    steps of 10 ns) the interval reaches around the instant the op took effect.
    """

    f: int
    pick: int
    outcome: int
    worker: int
    before: int
    after: int


_KINDS = {
    "register": ("read", "write", "cas"),
    "kv": ("read", "get", "write", "put", "cas", "delete", "append"),
}


def random_plan(rng: random.Random, n: int, concurrency: int) -> list[PlanStep]:
    """A plan of ``n`` ops over ``concurrency`` workers (intervals reach up to ~2 ops each side)."""
    return [
        PlanStep(
            f=rng.randrange(7),
            pick=rng.randrange(4),
            outcome=rng.randrange(24),
            worker=rng.randrange(concurrency),
            before=rng.randrange(3 * concurrency),
            after=rng.randrange(3 * concurrency),
        )
        for _ in range(n)
    ]


def sequential_history(
    model: str, plan: Sequence[PlanStep], concurrency: int, key: str = "k"
) -> list[CheckOp]:
    """Run ``plan`` against ``model`` in order and record each op around the instant it ran.

    Op *i* takes effect (or is refused, or fails) at time ``10 * (i + 1)``.
    Its interval reaches back and forth from there by the plan's amounts,
    clipped so that each worker's process has one op in flight at a time.  A
    worker whose op ends ``info`` continues as process ``old + concurrency``.
    """
    kinds = _KINDS[model]
    state: str | None = None
    written: list[str | None] = [None]
    free_at = [0] * concurrency  # when each worker's last op returned
    process = list(range(concurrency))
    h = History(key=key)
    for i, step in enumerate(plan):
        t = 10 * (i + 1)
        w = step.worker % concurrency
        if free_at[w] >= t:  # busy then: another worker, or the first free one
            free = [x for x in range(concurrency) if free_at[x] < t]
            if not free:
                continue
            w = free[0]
        call = max(free_at[w] + 1, t - 10 * step.before)
        ret = t + 10 * step.after
        f = kinds[step.f % len(kinds)]
        kind = {"get": "read", "put": "write"}.get(f, f)
        value = f"v{i}"
        if kind == "read":
            if step.outcome == 2:
                h.read(process[w], None, call, ret, f=f, type="fail", error="timeout")
            else:
                h.read(process[w], state, call, ret, f=f)
            free_at[w] = ret
            continue
        took_effect = step.outcome != 1 and step.outcome != 2
        outcome = "info" if step.outcome <= 1 else "fail" if step.outcome == 2 else "ok"
        if kind == "cas":
            expected = state if step.pick < 2 else written[step.pick * i % len(written)]
            if expected != state and took_effect:  # refused: a definite outcome
                h.cas(process[w], expected, value, call, ret, type="fail", error="precondition")
                free_at[w] = ret
                continue
            if took_effect:
                state = value
            h.cas(process[w], expected, value, call, ret, type=outcome)
        elif kind == "write":
            if took_effect:
                state = value
            h.write(process[w], value, call, ret, f=f, type=outcome)
        elif kind == "delete":
            if took_effect:
                state = None
            h.delete(process[w], call, ret, type=outcome)
        else:
            value = f"a{i};"
            if took_effect:
                state = (state or "") + value
            h.append(process[w], value, call, ret, type=outcome)
        written.append(value)
        free_at[w] = ret
        if outcome == "info":
            process[w] += concurrency
    return h.ops

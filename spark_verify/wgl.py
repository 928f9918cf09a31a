"""Per-key linearizability: the Wing & Gong search, with Lowe's memoization.

:func:`check_key` decides whether one key's operations have a linearization:
a total order that respects real time (an op that returned before another was
invoked comes first) and is a legal sequential execution of the model
(:mod:`spark_verify.models`).  Linearizability is compositional (Herlihy &
Wing's locality), so each key is checked on its own, in its own Spark task.

The search is Wing & Gong's (1993), as Porcupine (anishathalye/porcupine,
checker.go) and Knossos' ``wgl`` analysis implement it: walk the events in
time order, linearize any pending op whose step is legal, and backtrack when
the return of an op that has not been linearized is reached.  Lowe's
improvement ("Testing for linearizability", 2017) memoizes every
configuration seen, the set of linearized ops (an ``int`` bitset) with the
model's state: a configuration seen before cannot lead anywhere new.

Time: events are sorted by time with calls before returns at the same instant.
An op that returns at the very nanosecond another op is invoked is therefore
*concurrent* with it, never ordered before it: the clock cannot tell them
apart, and treating them as ordered could report a violation that did not
happen (the same choice as Porcupine's ``byTime``).

Outcomes (Jepsen's): ``ok`` ops and ``cas`` refused with ``precondition`` are
*required*: linearized exactly once within ``[call, ret]``.  ``info`` ops are
*optional*: their return is at +infinity and the search succeeds as soon as
every required op is linearized, so an ``info`` op may also never happen.

Budget: the search checks the clock every few hundred steps and answers
``"unknown"`` when the budget is spent; it never guesses, and says how far it
got (the states explored, the deepest partial linearization).

Compiled loop: the search's loop also exists in compiled form
(``spark_verify/_wgl.pyx``, built at install when Cython and a C compiler are
there), over interned states, bitsets and its own hash table, with the cache
bounded in bytes (``max_bytes``: past it the key is ``"unknown"`` too, and
says so).  It explores the same configurations in the same order as the loop
here, which stays the reference: it runs when the extension is missing, for
keys with appends (their states are strings that grow), and everywhere when
``KQ_PURE_PYTHON=1`` is set.

Witness: for a violation the failing set of ops is shrunk (delta debugging)
with moves that only ever *weaken* the history, so that whatever is left still
proves the violation: a read or a refused cas (no effect) is removed; a write,
cas, delete or append is demoted to an ``info`` op (optional, open-ended), and
dropped if no op left observes its value (:func:`_prune`: that changes no
verdict).  As
every move weakens, a move that fails once fails for good, and one pass of
single moves that all fail makes the witness 1-minimal: no single op can be
removed or demoted while the rest stays non-linearizable.  The witness lists
the remaining ops as the history has them.
"""

from __future__ import annotations

import json
import math
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spark_verify.models import ILLEGAL, Model, State, Step, kind_of, model_of
from spark_verify.ops import CheckOp, is_scalar
from spark_verify.verdict import UNKNOWN, Anomaly, Validity, validity_from_json

__all__ = [
    "ABORTED_READS",
    "COMPILED",
    "DEFAULT_KEY_MEMORY",
    "LINEARIZABLE",
    "NONLINEARIZABLE",
    "KeyResult",
    "check_key",
    "find_aborted_reads",
    "keys_row_to_anomaly",
    "validity_of_keys_row",
    "validity_text",
]

LINEARIZABLE: Final = "linearizable"
"""The check name of per-key linearizability anomalies."""

NONLINEARIZABLE: Final = "nonlinearizable"
"""The anomaly kind of a key whose ops have no linearization."""

ABORTED_READS: Final = "aborted-reads"
"""The check name of :func:`find_aborted_reads`."""

# Steps of the search between two looks at the clock: frequent enough to stop
# within a millisecond or so of the deadline, rare enough to cost nothing.
_CLOCK_EVERY: Final = 256

_INF: Final = math.inf

DEFAULT_KEY_MEMORY: Final = 1 << 30
"""The default bound of one key's cache of seen configurations, in bytes."""

try:
    import spark_verify._wgl as _wgl
except ImportError:  # built without Cython or a compiler: the reference runs
    _compiled: Any = None
else:
    _compiled = None if _wgl.pure_python_requested else _wgl

COMPILED: Final = _compiled is not None
"""Whether the compiled loop is in use (see the module's docstring)."""

# The compiled loop's step codes (spark_verify/_wgl.pyx).
_READ, _WRITE, _CAS, _REFUSED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class KeyResult:
    """The linearizability verdict of one key.

    ``states`` is the number of configurations the decision's search explored
    (shrinking a witness explores more, not counted); ``ops`` the number of
    ops given; ``memory_bytes`` the size its cache of configurations reached
    (the compiled loop's, counted exactly; 0 for the reference loop).
    ``minimal`` says whether ``witness`` is 1-minimal (see the module's
    docstring); ``False`` if shrinking ran out of the budget.
    """

    valid: Validity
    kind: str | None
    message: str | None
    witness: tuple[CheckOp, ...]
    elapsed_ms: float
    states: int
    ops: int
    minimal: bool = False
    memory_bytes: int = 0

    def to_row(self, run: str, key: str) -> dict[str, Any]:
        """The KEYS row of this result (``witness`` as JSON text of the ops' objects)."""
        return {
            "run": run,
            "key": key,
            "ops": self.ops,
            "valid": validity_text(self.valid),
            "elapsed_ms": float(self.elapsed_ms),
            "states": self.states,
            "kind": self.kind,
            "message": self.message,
            "witness": json.dumps([op.to_json() for op in self.witness], separators=(",", ":")),
            "memory_bytes": self.memory_bytes,
        }


def validity_text(valid: Validity) -> str:
    """``'true'``, ``'false'`` or ``'unknown'``: a verdict in the KEYS table's ``valid``."""
    if valid is True:
        return "true"
    if valid is False:
        return "false"
    if valid == UNKNOWN:
        return "unknown"
    raise ValueError(f"a verdict is True, False or 'unknown', not {valid!r}")


def validity_of_keys_row(row: Mapping[str, Any]) -> Validity:
    """The verdict of a KEYS row, from its ``valid`` text."""
    text = row.get("valid")
    parsed = {"true": True, "false": False, "unknown": UNKNOWN}.get(str(text))
    if parsed is None:
        raise ValueError(
            f"KEYS row of key {row.get('key')!r}: valid must be 'true', 'false' or 'unknown', "
            f"not {text!r}"
        )
    return validity_from_json(parsed)


def keys_row_to_anomaly(row: Mapping[str, Any]) -> Anomaly | None:
    """The ``linearizable`` anomaly of a KEYS row whose ``valid`` is ``'false'``, else None."""
    if validity_of_keys_row(row) is not False:
        return None
    text = row.get("witness")
    try:
        witness = json.loads(text) if text is not None else []
    except json.JSONDecodeError as e:
        raise ValueError(f"KEYS row of key {row.get('key')!r}: witness is not JSON ({e})") from e
    if not isinstance(witness, list) or not all(isinstance(w, dict) for w in witness):
        raise ValueError(f"KEYS row of key {row.get('key')!r}: witness is not a list of objects")
    return Anomaly(
        check=LINEARIZABLE,
        kind=row.get("kind") or NONLINEARIZABLE,
        message=row.get("message") or "no linearization",
        run=row.get("run"),
        key=row.get("key"),
        witness=tuple(witness),
    )


@dataclass(frozen=True, slots=True)
class _Item:
    """An op in the search: its step, and its return (+inf when optional)."""

    op: CheckOp
    step: Step
    ret: float
    kind: str
    """The canonical f: read, write, cas, delete or append."""
    refused: bool
    """A cas that failed with ``precondition`` (required, no effect)."""

    @property
    def required(self) -> bool:
        return self.ret != _INF

    @property
    def effect_free(self) -> bool:
        return self.kind == "read" or self.refused

    def demoted(self) -> _Item:
        return _Item(self.op, self.step, _INF, self.kind, self.refused)


@dataclass(frozen=True, slots=True)
class _Search:
    verdict: bool | None
    """True: linearizable; False: not; None: the budget ran out."""
    states: int
    blocker: _Item | None
    """False: the op whose return the deepest partial linearization could not pass."""
    observer: _Item | None
    """The op whose return is the blocker's deadline, if not its own (see _deadlines)."""
    depth: int = 0
    """The deepest partial linearization's size (ops linearized at once)."""
    memory: int = 0
    """The bytes of the compiled loop's cache (0 for the reference loop)."""
    exhausted: str | None = None
    """Undecided: ``"time"`` (the budget) or ``"memory"`` (the cache's bound)."""


def check_key(
    ops: Sequence[CheckOp],
    model: Model | str,
    *,
    budget_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    max_bytes: int = DEFAULT_KEY_MEMORY,
    compiled: bool = True,
) -> KeyResult:
    """Whether one key's ops are linearizable under ``model``, within ``budget_s`` seconds.

    ``ops`` are one (run, key)'s ops in any order.  ``max_bytes`` bounds the
    compiled loop's cache; ``compiled=False`` runs the reference loop even
    where the compiled one could.  Raises ``ValueError`` for ops of several
    keys or an op the model does not accept.
    """
    start = clock()
    deadline = start + budget_s
    m = model_of(model) if isinstance(model, str) else model
    keys = {(op.run, op.key) for op in ops}
    if len(keys) > 1:
        raise ValueError(f"check_key takes the ops of one key, got {len(keys)}: {sorted(keys)!r}")
    items = _items(ops, m)

    def elapsed() -> float:
        return (clock() - start) * 1000.0

    loop = _Loop(clock, deadline, max_bytes, compiled and COMPILED)
    found = _search(items, loop)
    if found.verdict is True:
        return KeyResult(
            True, None, None, (), elapsed(), found.states, len(ops), True, found.memory
        )
    if found.verdict is None:
        return KeyResult(
            UNKNOWN,
            None,
            _undecided(found, budget_s, max_bytes, len(items)),
            (),
            elapsed(),
            found.states,
            len(ops),
            memory_bytes=found.memory,
        )
    shrunk, why, minimal = _shrink(items, found, loop)
    witness = tuple(sorted((it.op for it in shrunk), key=lambda op: op.index))
    message = _message(why, m, len(witness), minimal)
    return KeyResult(
        False,
        NONLINEARIZABLE,
        message,
        witness,
        elapsed(),
        found.states,
        len(ops),
        minimal,
        found.memory,
    )


def _undecided(found: _Search, budget_s: float, max_bytes: int, ops: int) -> str:
    """Why a key is undecided, and how far its search got."""
    if found.exhausted == "memory":
        why = f"its cache of seen configurations reached its {_size(max_bytes)} bound"
    else:
        why = f"it ran out of its {budget_s:g} s budget"
    return (
        f"undecided: the search stopped as {why}, after {found.states:,} states "
        f"(at most {found.depth:,} of the key's {ops:,} ops linearized at once)"
    )


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:,.0f} MiB"
    return f"{n / 2**10:,.0f} KiB"


@dataclass(frozen=True, slots=True)
class _Loop:
    """How a search runs: its clock and deadline, its cache's bound, which loop."""

    clock: Callable[[], float]
    deadline: float
    max_bytes: int
    compiled: bool


def _items(ops: Iterable[CheckOp], model: Model) -> list[_Item]:
    out = []
    for op in ops:
        compiled = model.step_of(op)
        if compiled is None:
            continue
        step, required = compiled
        ret = op.ret if required and op.ret is not None else _INF
        refused = op.type == "fail"
        out.append(_Item(op, step, ret, model.canonical(op.f), refused))
    return out


def _written(it: _Item) -> State:
    """The value an effectful op leaves (for an append: its suffix)."""
    if it.kind == "cas":
        value: State = it.op.arg[1]
        return value
    if it.kind == "delete":
        return None
    value = it.op.arg
    return value


def _prune(items: list[_Item]) -> list[_Item]:
    """Drop writes, cas, deletes and appends whose value no remaining op observes.

    Such an op w of value v changes nothing that matters.  In a linearization
    holding w, every state from w to the next op that sets the state (a write,
    a delete or a cas) holds v: it is v, or with appends a string that has v
    in it.  No read runs there (none returns such a state), no cas (none
    expects one), and no refused cas if none returns after w's invoke.  So
    only appends and writes or deletes, which are legal in any state, and
    removing w leaves a linearization of the rest: for an optional w, the
    verdict does not change.  Without this, each ``info`` write that nobody
    read doubles the configurations to explore.

    "Observes": a read returns, or a cas expects, v itself; with appends, any
    string that has v in it; a delete (v is None), with appends, also a
    string that starts with an append's suffix (appends after the delete
    start the value afresh).  A w invoked before a
    refused cas returns is kept: any value but the cas's ``expected`` lets it
    pass, v too.  Only optional ops are pruned: a required w, unobserved,
    still matters by the time it must take effect by (it may be the write
    that makes a later read stale).
    """
    appends = any(it.kind == "append" for it in items)
    last_refusal = max((it.ret for it in items if it.refused), default=-_INF)
    while True:
        seen: set[State] = set()
        for it in items:
            if it.kind == "read":
                seen.add(it.op.result)
            elif it.kind == "cas" and not it.refused:
                seen.add(it.op.arg[0])
        # One text holding every observed string, for substring tests in C;
        # a value holding the separator is at worst kept for nothing.
        text = "\x00".join(v for v in seen if isinstance(v, str)) if appends else ""
        # After a delete and appends the value is a concatenation of appends
        # from scratch: a delete is observed by a value starting with one.
        fresh = (
            appends
            and any(it.kind == "delete" and not it.required for it in items)
            and any(
                v.startswith(it.op.arg)
                for v in seen
                if isinstance(v, str)
                for it in items
                if it.kind == "append"
            )
        )
        kept = [
            it
            for it in items
            if it.effect_free
            or it.required
            or it.op.call <= last_refusal
            or _is_observed(_written(it), seen, text, appends, fresh)
        ]
        if len(kept) == len(items):
            return items
        items = kept  # a dropped cas no longer observes its expected: look again


def _drop_satisfied_refusals(items: list[_Item]) -> list[_Item]:
    """Drop each refused cas that has a place in every linearization of the others.

    A refused cas c expecting e is a step that changes nothing, legal in any
    state but e.  If an ``ok`` op q runs within c's interval (``c.call <=
    q.call`` and ``q.ret <= c.ret``) and shows a state other than e next to
    its own step (a read or write of x != e: the state after q; a cas [a, x]
    with x != e: after q, or with a != e: before q; a delete, if e is not
    None), then c can be placed right next to q in any linearization of the
    rest: legal there, at q's instant (inside c's interval), and every op
    that real time orders before or after c is also ordered so with q.  So
    dropping c changes no verdict.  Likewise a c whose e is a string that no
    op writes (without appends: the state is never e).  Refused cas are
    common (most cas of a contended register fail), and each one that stays
    keeps :func:`_prune` from dropping the ``info`` ops invoked before it returns.
    """
    refused = [it for it in items if it.refused]
    if not refused:
        return items
    appends = any(it.kind == "append" for it in items)
    written = {_written(it) for it in items if not it.effect_free}
    shown = sorted(
        (
            (it.op.call, it.ret, _shown(it))
            for it in items
            if it.op.type == "ok" and it.kind in ("read", "write", "cas", "delete")
        ),
        key=lambda s: s[0],
    )
    calls = [c for c, _, _ in shown]
    drop: set[int] = set()
    for c in refused:
        expected = c.op.arg[0]
        if not appends and expected is not None and expected not in written:
            drop.add(id(c))
            continue
        for k in range(bisect_left(calls, c.op.call), bisect_right(calls, c.ret)):
            _, ret, states = shown[k]
            if ret <= c.ret and any(x != expected for x in states):
                drop.add(id(c))
                break
    return [it for it in items if id(it) not in drop] if drop else items


def _shown(it: _Item) -> tuple[State, ...]:
    """States an ``ok`` op leaves, or needs, right next to its own step."""
    if it.kind == "read":
        value: State = it.op.result
        return (value,)
    if it.kind == "cas":
        return (it.op.arg[0], it.op.arg[1])
    return (_written(it),)


def _is_observed(value: State, seen: set[State], text: str, appends: bool, fresh: bool) -> bool:
    if value is None:
        return fresh or None in seen
    return value in text if appends and isinstance(value, str) else value in seen


def _deadlines(items: Sequence[_Item]) -> tuple[list[float], list[int]]:
    """Each op's return, tightened where another op's outcome shows it happened earlier.

    Values are unique per key, so a read (or a cas) that returned (expected)
    a value v names the one op that wrote it, w: in every linearization w
    comes before that read, so w must take effect by the read's return.  An
    optional (``info``) w that a required op observed is therefore required,
    with that return as its deadline; a required w gets the earlier of the
    two.  This is an equivalence (it keeps every linearization), and it turns
    the ``info`` writes that were read into ordinary ops: each optional op
    left pending doubles the configurations to explore.  Chains (w read by a
    cas whose own value is read) tighten to a fixpoint.  Not applied to
    values written twice, to ``None`` (the initial value too) or with appends.

    Returns the deadlines and, per op, the op whose return set it (or -1).
    """
    rets = [it.ret for it in items]
    why = [-1] * len(items)
    if any(it.kind == "append" for it in items):
        return rets, why
    writer: dict[State, int] = {}
    twice: set[State] = set()
    for i, it in enumerate(items):
        if it.kind in ("write", "cas") and not it.refused:
            value = _written(it)
            if value in writer:
                twice.add(value)
            writer[value] = i
    observers = []
    for j, it in enumerate(items):
        if it.kind == "read":
            value = it.op.result
        elif it.kind == "cas" and not it.refused:
            value = it.op.arg[0]
        else:
            continue
        i = writer.get(value, -1)
        if value is not None and value not in twice and i >= 0 and i != j:
            observers.append((i, j))
    changed = True
    while changed:
        changed = False
        for i, j in observers:
            if rets[j] < rets[i]:
                rets[i] = rets[j]
                why[i] = j
                changed = True
    return rets, why


def _hopeless(items: Sequence[_Item], rets: Sequence[float]) -> int:
    """An op that can be seen at once to have no place, or -1.

    A read of a value that no op wrote (without appends), or an op whose
    deadline comes before its invoke.  The search would find these too, but
    only after exploring every configuration up to that op's return.
    """
    appends = any(it.kind == "append" for it in items)
    written = {_written(it) for it in items if it.kind in ("write", "cas") and not it.refused}
    for i, it in enumerate(items):
        if rets[i] < it.op.call:
            return i
        if (
            not appends
            and it.kind == "read"
            and it.required
            and it.op.result is not None
            and it.op.result not in written
        ):
            return i
    return -1


def _search(items: Sequence[_Item], loop: _Loop) -> _Search:
    """Wing & Gong's search over ``items`` (see the module's docstring).

    The ops are first simplified in ways that keep the verdict (refusals that
    always have a place, ops that change nothing observed).
    """
    deadline, clock = loop.deadline, loop.clock
    items = _prune(_drop_satisfied_refusals(list(items)))
    n = len(items)
    rets, why = _deadlines(items)
    required = [r != _INF for r in rets]
    remaining = sum(required)
    if remaining == 0:
        return _Search(True, 0, None, None)
    hopeless = _hopeless(items, rets)
    if hopeless >= 0:
        return _Search(False, 0, items[hopeless], _observer(items, why, hopeless))
    # Entries 1..2n are the calls and returns in time order; 0 is the head and
    # 2n+1 the tail of a doubly linked list that linearized ops are lifted out
    # of (Porcupine's lift/unlift), kept in arrays for speed.
    events = sorted(
        [(it.op.call, 0, i) for i, it in enumerate(items)] + [(rets[i], 1, i) for i in range(n)]
    )
    if loop.compiled and not any(it.kind == "append" for it in items):
        return _search_compiled(items, events, required, why, loop)
    size = 2 * n + 2
    is_call = [False] * size
    op_of = [-1] * size
    call_entry = [0] * n
    ret_entry = [0] * n
    for e, (_, kind, i) in enumerate(events, start=1):
        op_of[e] = i
        if kind == 0:
            is_call[e] = True
            call_entry[i] = e
        else:
            ret_entry[i] = e
    match = [0] * size
    for i in range(n):
        match[call_entry[i]] = ret_entry[i]
    nxt = list(range(1, size + 1))
    prv = list(range(-1, size - 1))
    # Any: a step returns a State or ILLEGAL, told apart by identity below.
    steps: list[Callable[[State], Any]] = [it.step for it in items]
    bits = [1 << i for i in range(n)]

    cache: set[tuple[int, State]] = set()
    stack: list[tuple[int, State]] = []
    linearized = 0
    state: State = None
    best_depth = -1
    blocker = -1
    countdown = _CLOCK_EVERY
    entry = nxt[0]
    while True:
        countdown -= 1
        if countdown == 0:
            countdown = _CLOCK_EVERY
            if clock() > deadline:
                depth = max(best_depth, len(stack))
                return _Search(None, len(cache), None, None, depth, 0, "time")
        i = op_of[entry]
        if is_call[entry]:
            new = steps[i](state)
            if new is not ILLEGAL:
                lin = linearized | bits[i]
                config = (lin, new)
                if config not in cache:
                    cache.add(config)
                    stack.append((entry, state))
                    state = new
                    linearized = lin
                    if required[i]:
                        remaining -= 1
                        if remaining == 0:
                            return _Search(
                                True, len(cache), None, None, max(best_depth, len(stack))
                            )
                    # lift the call and its return out of the list
                    m = match[entry]
                    nxt[prv[entry]] = nxt[entry]
                    prv[nxt[entry]] = prv[entry]
                    nxt[prv[m]] = nxt[m]
                    prv[nxt[m]] = prv[m]
                    entry = nxt[0]
                    continue
            entry = nxt[entry]
            continue
        # The return of an op not yet linearized (it is required: optional
        # returns are at +inf, after every required one): undo the last step.
        if i < 0:  # the tail: cannot happen while a required op is left
            raise AssertionError("linearizability search ran past the last return")
        if len(stack) > best_depth:
            best_depth = len(stack)
            blocker = i
        if not stack:
            found = items[blocker]
            observer = _observer(items, why, blocker)
            return _Search(False, len(cache), found, observer, best_depth)
        entry, state = stack.pop()
        j = op_of[entry]
        linearized ^= bits[j]
        if required[j]:
            remaining += 1
        m = match[entry]
        nxt[prv[m]] = m
        prv[nxt[m]] = m
        nxt[prv[entry]] = entry
        prv[nxt[entry]] = entry
        entry = nxt[entry]


def _search_compiled(
    items: Sequence[_Item],
    events: Sequence[tuple[float, int, int]],
    required: Sequence[bool],
    why: Sequence[int],
    loop: _Loop,
) -> _Search:
    """The loop of :func:`_search` in compiled form, over the same events.

    Ops are renumbered in the order of their calls (so that the bitsets of
    the configurations differ only in a window of concurrent ops), and each
    value is interned as a small integer, 0 being no value (``None``).
    """
    rank = [-1] * len(items)
    order: list[int] = []
    coded: list[int] = []
    for _, kind, i in events:
        if kind == 0:
            rank[i] = len(order)
            order.append(i)
            coded.append(rank[i])
        else:
            coded.append(~rank[i])
    interned: dict[State, int] = {None: 0}

    def code(value: State) -> int:
        return interned.setdefault(value, len(interned))

    kinds, a, b = [], [], []
    for i in order:
        it = items[i]
        if it.kind == "read":
            kinds.append(_READ)
            a.append(code(it.op.result))
            b.append(0)
        elif it.refused:
            kinds.append(_REFUSED)
            a.append(code(it.op.arg[0]))
            b.append(0)
        elif it.kind == "cas":
            kinds.append(_CAS)
            a.append(code(it.op.arg[0]))
            b.append(code(it.op.arg[1]))
        else:  # a write, or a delete (no value)
            kinds.append(_WRITE)
            a.append(code(_written(it)))
            b.append(0)
    outcome, states, blocker, depth, memory = _compiled.search(
        coded,
        kinds,
        a,
        b,
        [required[i] for i in order],
        loop.clock,
        loop.deadline,
        loop.max_bytes,
        _CLOCK_EVERY,
    )
    if outcome == 1:
        return _Search(True, states, None, None, depth, memory)
    if outcome == 0:
        i = order[blocker]
        return _Search(False, states, items[i], _observer(items, why, i), depth, memory)
    exhausted = "time" if outcome == -1 else "memory"
    return _Search(None, states, None, None, depth, memory, exhausted)


def _observer(items: Sequence[_Item], why: Sequence[int], i: int) -> _Item | None:
    return items[why[i]] if why[i] >= 0 else None


def _shrink(items: list[_Item], found: _Search, loop: _Loop) -> tuple[list[_Item], _Search, bool]:
    """A smaller non-linearizable set of ops, its search's outcome, and whether it is 1-minimal.

    Delta debugging (Zeller's ddmin, chunks halving down to single ops) over
    the required ops, first those without effect, then the others; see the
    module's docstring for the moves and why the result is a witness.
    """
    current = _prune(items)
    for effect_free in (True, False):
        chunk = 0
        while chunk != 1:
            candidates = [
                it.op.index for it in current if it.required and it.effect_free == effect_free
            ]
            chunk = max(1, len(candidates) // 2 if chunk == 0 else chunk // 2)
            for start in range(0, len(candidates), chunk):
                left = {it.op.index for it in current if it.required}
                moved = left.intersection(candidates[start : start + chunk])
                if not moved:
                    continue  # an earlier move already pruned them
                trial = _weaken(current, moved)
                if loop.clock() > loop.deadline:
                    return current, found, False
                tried = _search(trial, loop)
                if tried.verdict is None:
                    return current, found, False
                if tried.verdict is False:
                    current, found = trial, tried
    return current, found, True


def _weaken(items: list[_Item], moved: set[int]) -> list[_Item]:
    """Remove the effect-free ops of ``moved``, demote the rest, then prune."""
    out = []
    for it in items:
        if it.op.index not in moved:
            out.append(it)
        elif not it.effect_free:
            out.append(it.demoted())
    return _prune(out)


def _fmt(value: State) -> str:
    return "no value" if value is None else repr(value)


def _describe(op: CheckOp) -> str:
    kind = kind_of(op.f)
    if kind == "read":
        what = f"{op.f} of {_fmt(op.result)}"
    elif kind == "cas":
        what = f"cas from {_fmt(op.arg[0])} to {_fmt(op.arg[1])}"
        if op.type == "fail":
            what = f"refused {what}"
    elif kind == "delete":
        what = op.f
    else:
        what = f"{op.f} of {_fmt(op.arg)}"
    if op.type == "info":
        what = f"{what} (info)"
    end = "..." if op.ret is None else str(op.ret)
    return f"{what} by process {op.process} [{op.call}, {end}]"


def _message(found: _Search, model: Model, size: int, minimal: bool) -> str:
    proof = (
        f"a minimal witness of {size} ops"
        if minimal
        else f"a witness of {size} ops, not shown minimal (the budget ran out while shrinking)"
    )
    blocker = found.blocker
    if blocker is None:
        return f"no linearization ({proof})"
    op = blocker.op
    noun = model.noun
    if found.observer is not None:
        why = (
            f"it must take effect before {_describe(found.observer.op)} returns, as that op "
            f"saw its value, and no order of the ops overlapping them allows it"
        )
    elif blocker.kind == "read":
        why = f"no order of the ops overlapping it leaves {_fmt(op.result)} in the {noun}"
    elif blocker.refused:
        why = (
            f"it found a value other than {_fmt(op.arg[0])}, but no order of the ops "
            f"overlapping it leaves another value in the {noun}"
        )
    elif blocker.kind == "cas":
        why = f"no order of the ops overlapping it leaves {_fmt(op.arg[0])} in the {noun} for it"
    else:
        why = (
            "no order of the ops overlapping it places it within its interval and still "
            "leaves every later op a legal place"
        )
    return f"{_describe(op)}: {why} ({proof})"


def find_aborted_reads(ops: Iterable[CheckOp]) -> list[Anomaly]:
    """Reads of values that no op that could have taken effect wrote (check ``aborted-reads``).

    Values are unique per key (``docs/history-format.md``), so a value names
    its writer.  An ``ok`` read that returns a value written only by ``fail``
    ops is an ``aborted-read`` (Adya's G1a: the failed write took effect);
    witness: the read and the failed writes.  A read of a value no op wrote at
    all is a ``phantom-read``; witness: the read.  Keys with an ``append`` are
    skipped: their reads return concatenations, which the linearizability
    check covers.
    """
    by_key: dict[tuple[str | None, str | None], list[CheckOp]] = {}
    for op in ops:
        by_key.setdefault((op.run, op.key), []).append(op)
    out: list[Anomaly] = []
    for (run, key), key_ops in by_key.items():
        kinds = [kind_of(op.f) for op in key_ops]
        if "append" in kinds:
            continue
        effective: set[State] = set()
        failed: dict[State, list[CheckOp]] = {}
        for op, kind in zip(key_ops, kinds, strict=True):
            value = _written_value(op, kind)
            if value is None:
                continue
            if op.type == "fail":
                failed.setdefault(value, []).append(op)
            else:
                effective.add(value)
        for op, kind in zip(key_ops, kinds, strict=True):
            if kind != "read" or op.type != "ok" or op.result is None:
                continue
            if op.result in effective:
                continue
            writers = sorted(failed.get(op.result, ()), key=lambda w: w.index)
            if writers:
                names = ", ".join(f"{w.f} {w.index} (error {w.error or 'none'})" for w in writers)
                message = f"{_describe(op)} returned a value that only failed ops wrote: {names}"
                kind_name = "aborted-read"
            else:
                message = f"{_describe(op)} returned a value that no op wrote"
                kind_name = "phantom-read"
            out.append(
                Anomaly(
                    check=ABORTED_READS,
                    kind=kind_name,
                    message=message,
                    run=run,
                    key=key,
                    node=op.node,
                    witness=tuple(w.to_json() for w in [op, *writers]),
                )
            )
    return out


def _written_value(op: CheckOp, kind: str | None) -> State:
    """The value a write or cas leaves (None for anything else, or a null write)."""
    if kind == "write" and is_scalar(op.arg):
        value: State = op.arg
        return value
    if kind == "cas" and isinstance(op.arg, list) and len(op.arg) == 2:
        new = op.arg[1]
        return new if is_scalar(new) else None
    return None

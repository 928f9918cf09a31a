"""Sequential specifications of the ``register`` and ``kv`` models.

``register`` is Knossos' cas-register (knossos.model/cas-register): ``read``,
``write`` and ``cas [expected, new]``, one register per key, initially empty
(``None``).  ``kv`` adds ``delete`` (the key holds no value again), ``get`` and
``put`` (aliases of ``read`` and ``write``) and ``append`` as in Porcupine's kv
model (porcupine/models/kv.go): the value becomes ``(value or "") + arg``.
``docs/history-format.md`` (sections Models and "kv: get, put and append")
defines the shapes.

A model turns each operation into a *step*: a function from the state before
to the state after, or :data:`ILLEGAL` when the op cannot happen in that state.
What an outcome means for the search (Jepsen's semantics):

- ``ok``: happened, exactly once, within its interval: a *required* step.
- ``fail`` ``cas`` with error ``precondition``: a definite outcome too.  The
  cas read some value other than ``expected`` at an instant within its
  interval, so it is a required step that changes nothing and is legal iff
  ``state != expected``.
- any other ``fail``: no effect at all; not in the search.
- ``info`` write, put, cas, delete or append: may have taken effect at any
  instant after its invoke, or never: an *optional* step.
- ``fail``/``info`` read: a read has no effect; not in the search.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from spark_verify.ops import CheckOp, Exact, is_scalar

__all__ = [
    "ILLEGAL",
    "KV",
    "MODELS",
    "REGISTER",
    "Model",
    "State",
    "Step",
    "kind_of",
    "model_of",
]

State = str | int | Exact | None
"""A key's value: a JSON scalar (a string, an integer, a boolean or a decimal
as :class:`spark_verify.ops.Exact`), or ``None`` when it holds none."""


class _Illegal:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ILLEGAL"


ILLEGAL: Final = _Illegal()
"""What a step returns when its op cannot happen in the given state."""

Step = Callable[[State], "State | _Illegal"]

# The canonical operation of each f: get/put are read/write under another name.
_CANONICAL: Final[Mapping[str, str]] = {
    "read": "read",
    "get": "read",
    "write": "write",
    "put": "write",
    "cas": "cas",
    "delete": "delete",
    "append": "append",
}


@dataclass(frozen=True, slots=True)
class Model:
    """A sequential specification: its ``f`` values and each op's step."""

    name: str
    fs: frozenset[str]
    noun: str
    """What one key is called in messages: "register" or "key"."""

    def canonical(self, f: str) -> str:
        """``read``, ``write``, ``cas``, ``delete`` or ``append`` for one of the model's f."""
        if f not in self.fs:
            raise ValueError(f"{self.name} has no f {f!r} (it has {', '.join(sorted(self.fs))})")
        return _CANONICAL[f]

    def problems(self, op: CheckOp) -> list[str]:
        """Why ``op`` is not a well-formed op of this model (empty if it is).

        The rules of ``docs/history-format.md`` (``model-f``, ``model-value``,
        ``model-error``) over a paired op: ``arg`` is the invoke's value,
        ``result`` the completion's.
        """
        if op.f not in self.fs:
            return [f"{self.name} has no f {op.f!r} (it has {', '.join(sorted(self.fs))})"]
        out: list[str] = []
        kind = _CANONICAL[op.f]
        arg, result = op.arg, op.result
        if op.key is None:
            out.append(f"a {self.name} op needs a key")
        if kind == "read":
            if arg is not None:
                out.append(f"a {op.f}'s invoke value is null, got {arg!r}")
            if op.type == "ok" and not is_scalar(result):
                out.append(f"a {op.f} returns a value (a JSON scalar) or null, got {result!r}")
            if op.type != "ok" and result is not None:
                out.append(f"a {op.f}'s {op.type} value is null, got {result!r}")
        else:
            if kind == "write" and not is_scalar(arg):
                out.append(f"a {op.f}'s value is a JSON scalar, got {arg!r}")
            elif kind == "append" and not isinstance(arg, str):
                out.append(f"an {op.f}'s value is a string, got {arg!r}")
            elif kind == "append" and arg == "":
                out.append(f"an {op.f}'s value is a non-empty string")
            elif kind == "cas" and not (
                isinstance(arg, list) and len(arg) == 2 and all(is_scalar(v) for v in arg)
            ):
                out.append(
                    f"a cas's value is [expected, new] (JSON scalars, null for no value), "
                    f"got {arg!r}"
                )
            elif kind == "delete" and arg is not None:
                out.append(f"a {op.f}'s value is null, got {arg!r}")
            if result != arg:
                out.append(
                    f"a {op.f}'s completion repeats its invoke's value {arg!r}, got {result!r}"
                )
        if op.error == "precondition" and not (kind == "cas" and op.type == "fail"):
            out.append("error precondition belongs to a failed cas only")
        return out

    def step_of(self, op: CheckOp) -> tuple[Step, bool] | None:
        """The op's step and whether it is required, or ``None`` if it is not in the search.

        Raises ``ValueError`` naming the op if it is not well formed.
        """
        problems = self.problems(op)
        if problems:
            raise ValueError(f"op {op.index} ({op.f} of key {op.key!r}): {'; '.join(problems)}")
        kind = _CANONICAL[op.f]
        if kind == "read":
            return (_read(op.result), True) if op.type == "ok" else None
        if op.type == "fail":
            if kind == "cas" and op.error == "precondition":
                return _refused_cas(op.arg[0]), True
            return None
        required = op.type == "ok"
        if kind == "write":
            return _write(op.arg), required
        if kind == "cas":
            return _cas(op.arg[0], op.arg[1]), required
        if kind == "delete":
            return _write(None), required
        return _append(op.arg), required


# Steps are closures over the op's values: the search calls them millions of
# times, and a closure is cheaper than dispatching on the op's f each time.


def _read(value: State) -> Step:
    def step(state: State) -> State | _Illegal:
        return state if state == value else ILLEGAL

    return step


def _write(value: State) -> Step:
    def step(state: State) -> State | _Illegal:
        return value

    return step


def _cas(expected: State, new: State) -> Step:
    def step(state: State) -> State | _Illegal:
        return new if state == expected else ILLEGAL

    return step


def _refused_cas(expected: State) -> Step:
    def step(state: State) -> State | _Illegal:
        return state if state != expected else ILLEGAL

    return step


def _append(suffix: str) -> Step:
    def step(state: State) -> State | _Illegal:
        if state is None:
            return suffix
        # Appending to a value that is not a string: no such state.
        return state + suffix if isinstance(state, str) else ILLEGAL

    return step


REGISTER: Final = Model("register", frozenset({"read", "write", "cas"}), "register")
KV: Final = Model("kv", frozenset(_CANONICAL), "key")

MODELS: Final[Mapping[str, Model]] = {m.name: m for m in (REGISTER, KV)}
"""Every model the linearizability checker knows, by name."""


def kind_of(f: str) -> str | None:
    """The operation ``f`` stands for in ``kv`` (``get`` is a ``read``), or ``None`` if unknown."""
    return _CANONICAL.get(f)


def model_of(name: str) -> Model:
    """The model called ``name``; a ``ValueError`` listing the known ones otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"no linearizability model {name!r}; known: {', '.join(sorted(MODELS))}"
        ) from None

"""One client operation after pairing its invoke with its completion.

A row of the PAIRED table (``docs/history-format.md``: an invoke and its one
completion merged) becomes a :class:`CheckOp`, the unit every per-key checker
works on.  This module imports nothing of Spark: the checkers run inside
executors over plain Python values.

The operation's interval is ``[call, ret]``; an ``info`` op has ``ret = None``:
it may take effect at any instant after its invoke, or never (Jepsen's
indeterminate outcome).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "Exact",
    "JEPSEN_MODELS",
    "KEYS_COLUMNS",
    "KEYS_SCHEMA_DDL",
    "KNOWN_MODELS",
    "OUTCOMES",
    "PAIRED_COLUMNS",
    "PAIRED_SCHEMA_DDL",
    "CheckOp",
    "exact",
    "is_scalar",
    "plain",
]

PAIRED_SCHEMA_DDL: Final = (
    "run string, key string, process string, f string, type string, index long, "
    "complete_index long, call long, ret long, value string, result string, error string, "
    "node long, offset long, epoch long"
)
"""The PAIRED table: one row per client operation, invoke and completion merged."""

PAIRED_COLUMNS: Final = tuple(part.split()[0] for part in PAIRED_SCHEMA_DDL.split(", "))

KEYS_SCHEMA_DDL: Final = (
    "run string, key string, ops long, valid string, elapsed_ms double, states long, "
    "kind string, message string, witness string, memory_bytes long"
)
"""The KEYS table: one row per (run, key) with its linearizability verdict
(``memory_bytes``: the size the search's cache of configurations reached)."""

KEYS_COLUMNS: Final = tuple(part.split()[0] for part in KEYS_SCHEMA_DDL.split(", "))

KNOWN_MODELS: Final = ("register", "kv", "log", "topics", "queue")
"""The history models of ``docs/history-format.md`` (``config.json``'s ``model``)."""

JEPSEN_MODELS: Final[Mapping[str, str]] = {
    "cas-register": "register",
    "knossos.model/cas-register": "register",
    "knossos.model/register": "register",
}
"""Jepsen's (Knossos') model names that mean one of kq's models (``--model``).
Knossos' ``register`` (read and write only) is kq's ``register`` without cas."""

OUTCOMES: Final = ("ok", "fail", "info")
"""A completion's type: happened, did not happen, unknown."""


@dataclass(frozen=True, slots=True)
class Exact:
    """A boolean or a decimal number, told apart from the integers Python equates it with.

    Values are compared by value *and* type, as Jepsen's models compare them
    (Clojure's ``=``: ``(= 1 1.0)``, ``(= 1 true)`` and ``(= 1 "1")`` are all
    false; knossos.model/cas-register compares with ``=``).  Python's ``==``
    says ``1 == 1.0 == True``, and a set or a dict would merge them, so
    booleans and decimals are wrapped: an :class:`Exact` equals only an
    :class:`Exact` of the same kind and value.  Strings, integers and null
    need no wrapper (``1 != "1"`` already).  1 and 1.0 are different values
    here, as in Clojure; but a history read through Spark comes as the
    variant's rendering of each value, which writes a decimal with no
    fraction as an integer (``1.0`` as ``1``), so in ``kq verify`` they meet
    as the same value (``docs/history-format.md``, Histories from Jepsen).
    """

    kind: str
    """``boolean`` or ``decimal``."""
    value: bool | float

    def __repr__(self) -> str:
        if self.kind == "boolean":
            return "true" if self.value else "false"
        return repr(self.value)


def exact(value: Any) -> Any:
    """A parsed JSON value with its booleans and decimals wrapped in :class:`Exact`,
    lists turned into lists of the same (a cas's ``[expected, new]``)."""
    if isinstance(value, bool):
        return Exact("boolean", value)
    if isinstance(value, float):
        return Exact("decimal", value)
    if isinstance(value, list):
        return [exact(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """The JSON value of an :func:`exact` value."""
    if isinstance(value, Exact):
        return value.value
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def is_scalar(value: Any) -> bool:
    """Whether ``value`` (an :func:`exact` value) is a JSON scalar: null, a
    string, an integer, a boolean or a decimal."""
    return value is None or isinstance(value, str | int | Exact) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class CheckOp:
    """A client operation: its invoke's arguments and its completion's outcome.

    ``arg`` is the invoke's value and ``result`` the completion's, both parsed
    JSON with booleans and decimals as :class:`Exact` (wrapped on
    construction, so that every checker compares values as Jepsen does).
    ``call``/``ret`` are the invoke's and the completion's times in
    nanoseconds; ``ret`` is ``None`` for an ``info`` op (open-ended).
    ``offset``/``epoch`` are the completion's version data.
    """

    run: str | None
    key: str | None
    process: str
    f: str
    type: str
    index: int
    complete_index: int | None
    call: int
    ret: int | None
    arg: Any = None
    result: Any = None
    error: str | None = None
    node: int | None = None
    offset: int | None = None
    epoch: int | None = None

    def __post_init__(self) -> None:
        # Frozen: the wrapped values are set once, here.
        object.__setattr__(self, "arg", exact(self.arg))
        object.__setattr__(self, "result", exact(self.result))
        if self.type not in OUTCOMES:
            raise ValueError(
                f"op {self.index}: type must be one of {', '.join(OUTCOMES)}, not {self.type!r}"
            )
        if self.type != "info" and self.ret is None:
            raise ValueError(f"op {self.index}: an {self.type} op needs its completion time (ret)")
        if self.ret is not None and self.ret < self.call:
            raise ValueError(
                f"op {self.index}: completes at {self.ret}, before its invoke at {self.call}"
            )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckOp:
        """A :class:`CheckOp` from a PAIRED row (``value``/``result`` are JSON texts or None).

        Raises ``ValueError`` naming the op's index and the field for a missing
        field or a JSON text that does not parse.
        """
        index = row.get("index")
        where = f"op {index}" if index is not None else "a paired op"
        for name in ("process", "f", "type", "index", "call"):
            if row.get(name) is None:
                raise ValueError(f"{where}: field {name!r} is missing or null")
        values: dict[str, Any] = {}
        for name in ("value", "result"):
            text = row.get(name)
            if text is None:
                values[name] = None
                continue
            if not isinstance(text, str):
                raise ValueError(f"{where}: field {name!r} must be JSON text, got {text!r}")
            try:
                values[name] = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: field {name!r} is not JSON ({e.msg}): {text!r}") from e
        return cls(
            run=row.get("run"),
            key=row.get("key"),
            process=str(row["process"]),
            f=row["f"],
            type=row["type"],
            index=int(row["index"]),
            complete_index=_opt_int(row.get("complete_index")),
            call=int(row["call"]),
            ret=_opt_int(row.get("ret")),
            arg=values["value"],
            result=values["result"],
            error=row.get("error"),
            node=_opt_int(row.get("node")),
            offset=_opt_int(row.get("offset")),
            epoch=_opt_int(row.get("epoch")),
        )

    def to_json(self) -> dict[str, Any]:
        """The witness object: invoke and completion merged, None fields left out but ``value``.

        ``process`` is written as in the history: a number when it is one.
        """
        fields: tuple[tuple[str, Any], ...] = (
            ("index", self.index),
            ("complete_index", self.complete_index),
            ("process", int(self.process) if self.process.isdigit() else self.process),
            ("f", self.f),
            ("key", self.key),
            ("type", self.type),
            ("value", plain(self.arg)),
            ("result", plain(self.result)),
            ("error", self.error),
            ("time", self.call),
            ("complete_time", self.ret),
            ("node", self.node),
            ("offset", self.offset),
            ("epoch", self.epoch),
        )
        return {k: v for k, v in fields if v is not None or k == "value"}


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)

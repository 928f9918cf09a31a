"""Operation histories: the records and their rules (no I/O).

A history is what a test run did, one operation per line of
``history.jsonl`` (``docs/history-format.md`` is the contract; this module
implements it).  Each client operation is an ``invoke`` followed by exactly
one completion (``ok``, ``fail`` or ``info``) by the same process; the
nemesis (process ``"nemesis"``) records each fault the same way.

- :class:`Op` is one line.
- :class:`HistoryRecorder` assigns ``index`` and ``time`` and refuses
  operations that would break the process rules.
- :func:`check_well_formed` lists every way a history breaks the rules.

Pure (no clock, files or threads: time comes from an injected clock), so the
deterministic simulator records with it; :mod:`history.files` adds files.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Literal

from history.queue import QUEUE_FS, group_field_problems, queue_op_problems, sent_values

__all__ = [
    "COMPLETIONS",
    "FIELDS",
    "GROUP_FIELDS",
    "MODELS",
    "NEMESIS",
    "NEMESIS_ENDS",
    "OP_TYPES",
    "PROBLEM_KINDS",
    "HistoryError",
    "HistoryFormatError",
    "Clock",
    "HistoryRecorder",
    "Op",
    "Problem",
    "Process",
    "check_well_formed",
    "next_process",
    "op_problems",
]

OpType = Literal["invoke", "ok", "fail", "info"]
Process = int | str
Clock = Callable[[], int]

OP_TYPES: Final = ("invoke", "ok", "fail", "info")
COMPLETIONS: Final = ("ok", "fail", "info")
NEMESIS: Final = "nemesis"
"""The process of every fault operation."""

FIELDS: Final = (
    "index",
    "time",
    "type",
    "process",
    "f",
    "key",
    "value",
    "error",
    "node",
    "offset",
    "epoch",
)
"""Every field of a history line, in the order they are written."""

GROUP_FIELDS: Final = ("assigned", "revoked")
"""The consumer-group fields of a ``queue`` poll's ``ok`` completion
(``docs/history-format.md``, the ``queue`` model), written after
:data:`FIELDS` and only when set: ``assigned`` ``{"k": [start, time]}``,
``revoked`` ``[k, ...]``."""

REQUIRED: Final = ("index", "time", "type", "process", "f")

MODELS: Final = ("register", "kv", "log", "topics", "queue")
"""The data models whose ``f`` values and ``value`` shapes are checked."""

NEMESIS_ENDS: Final[Mapping[str, str]] = {
    "kill": "start",
    "pause": "resume",
    "partition": "heal",
    "packet": "heal",
}
"""A fault that lasts (``f`` of its start) and the ``f`` that ends it.
``kill``/``start`` and ``pause``/``resume`` pair per node (``value.nodes``);
one ``heal`` ends every open ``partition`` and ``packet`` fault."""

PROBLEM_KINDS: Final = (
    "invalid-op",
    "index",
    "time",
    "concurrent-invoke",
    "unmatched-completion",
    "completion-mismatch",
    "open-invoke",
    "invoke-after-info",
    "nemesis-unended",
    "nemesis-missing",
    "model-f",
    "model-value",
    "duplicate-value",
    "model-version",
    "model-error",
)
"""Every ``Problem.kind`` that :func:`check_well_formed` reports."""

_PER_NODE_FAULTS: Final = frozenset({"kill", "start", "pause", "resume"})

_MODEL_FS: Final[Mapping[str, frozenset[str]]] = {
    "register": frozenset({"read", "write", "cas"}),
    # get and put are read and write by their Porcupine/etcd names; append
    # concatenates (Porcupine's kv model).
    "kv": frozenset({"read", "write", "cas", "delete", "get", "put", "append"}),
    "log": frozenset({"write"}),
    "topics": frozenset({"create-topic", "delete-topic", "register-broker", "heartbeat"}),
    "queue": QUEUE_FS,
}


class HistoryError(ValueError):
    """An operation the recorder refuses: it would break the history's rules."""


class HistoryFormatError(ValueError):
    """A history file that cannot be parsed; the message names the line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.reason = message


@dataclass(frozen=True, slots=True)
class Op:
    """One line of a history.  ``None`` stands for an absent optional field.

    ``value`` is any JSON value (lists, not tuples, so that a parsed op
    compares equal to the one that was written).
    """

    index: int
    time: int
    type: OpType
    process: Process
    f: str
    key: str | None = None
    value: Any = None
    error: str | None = None
    node: int | None = None
    offset: int | None = None
    epoch: int | None = None
    assigned: dict[str, Any] | None = None
    revoked: list[Any] | None = None

    @property
    def is_invoke(self) -> bool:
        return self.type == "invoke"

    @property
    def is_nemesis(self) -> bool:
        return self.process == NEMESIS

    def to_json(self) -> dict[str, Any]:
        """The line's object: required fields and ``value`` always, the
        other optional fields only when set."""
        obj: dict[str, Any] = {
            "index": self.index,
            "time": self.time,
            "type": self.type,
            "process": self.process,
            "f": self.f,
        }
        if self.key is not None:
            obj["key"] = self.key
        obj["value"] = self.value
        for name in ("error", "node", "offset", "epoch", *GROUP_FIELDS):
            v = getattr(self, name)
            if v is not None:
                obj[name] = v
        return obj

    def to_line(self) -> str:
        """One JSON Lines line, without the newline."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, obj: object) -> Op:
        """Parse one line's object; :class:`ValueError` says what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        missing = [name for name in REQUIRED if name not in obj]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        unknown = sorted(set(obj) - set(FIELDS) - set(GROUP_FIELDS))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        fields: dict[str, Any] = {name: obj.get(name) for name in (*FIELDS, *GROUP_FIELDS)}
        op = cls(**fields)
        problems = op_problems(op)
        if problems:
            raise ValueError("; ".join(problems))
        return op


@dataclass(frozen=True, slots=True)
class Problem:
    """One way a history (or a node export) breaks the rules.

    ``index`` is the op's ``index`` (for an export, the 0-based line), or
    None for the history as a whole.
    """

    kind: str
    message: str
    index: int | None = None

    def __str__(self) -> str:
        where = f"op {self.index}: " if self.index is not None else ""
        return f"{where}{self.kind}: {self.message}"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def op_problems(op: Op) -> list[str]:
    """What is wrong with ``op`` on its own (field types and which fields
    each type allows); empty if nothing."""
    out: list[str] = []
    if not _is_count(op.index):
        out.append(f"index must be an integer >= 0, got {op.index!r}")
    if not _is_count(op.time):
        out.append(f"time must be an integer >= 0 (nanoseconds), got {op.time!r}")
    if op.type not in OP_TYPES:
        out.append(f"type must be one of {', '.join(OP_TYPES)}, got {op.type!r}")
    if not (_is_count(op.process) or op.process == NEMESIS):
        out.append(f"process must be an integer >= 0 or {NEMESIS!r}, got {op.process!r}")
    if not isinstance(op.f, str) or not op.f:
        out.append(f"f must be a non-empty string, got {op.f!r}")
    if op.key is not None and not isinstance(op.key, str):
        out.append(f"key must be a string, got {op.key!r}")
    if op.error is not None and (not isinstance(op.error, str) or not op.error):
        out.append(f"error must be a non-empty string, got {op.error!r}")
    for name in ("node", "offset", "epoch"):
        v = getattr(op, name)
        if v is not None and not _is_count(v):
            out.append(f"{name} must be an integer >= 0, got {v!r}")
    if op.type in ("invoke", "ok") and op.error is not None:
        out.append(f"an {op.type} carries no error, got {op.error!r}")
    if op.type in ("fail", "info") and op.error is None:
        out.append(f"a {op.type} needs an error saying why")
    if op.type == "invoke" and (op.offset is not None or op.epoch is not None):
        out.append("an invoke carries no offset or epoch (versions come with completions)")
    if op.type != "ok" and (op.assigned is not None or op.revoked is not None):
        out.append(f"only an ok completion carries assigned or revoked, not an {op.type}")
    if op.process == NEMESIS:
        if op.key is not None or op.offset is not None or op.epoch is not None:
            out.append("a nemesis op carries no key, offset or epoch")
        if not isinstance(op.value, dict):
            out.append(f"a nemesis op's value must be an object, got {op.value!r}")
        elif op.f in _PER_NODE_FAULTS and not _node_list(op.value.get("nodes")):
            out.append(f"a nemesis {op.f} needs value.nodes, a list of node ids")
    return out


def _node_list(v: object) -> bool:
    return isinstance(v, list) and all(_is_count(n) for n in v)


# -- recording -----------------------------------------------------------------


class _Same:
    def __repr__(self) -> str:
        return "SAME"


SAME: Final = _Same()
"""Default completion ``value``: repeat the invoke's value."""


def next_process(process: int, concurrency: int) -> int:
    """The process that takes over a retired one's worker (Jepsen's rule:
    the old number plus the number of client workers)."""
    return process + concurrency


class HistoryRecorder:
    """Builds a history op by op: assigns ``index`` (0, 1, 2, ...) and
    ``time`` (``clock()`` minus ``start_ns``), copies ``f`` and ``key`` from
    the invoke to its completion, and raises :class:`HistoryError` for an op
    that would break the process rules (an invoke by a process that has one
    in flight or that was retired by an ``info``, a completion with nothing
    in flight).  Every op goes to ``sink`` as it is made.

    Record an invoke *before* sending the request and its completion *after*
    the answer (or the timeout): then the order of the history is a sound
    real-time order.  Given a ``lock`` it is safe to share between threads;
    with asyncio, call it from the event loop's thread (it never awaits).
    """

    def __init__(
        self,
        clock: Clock,
        sink: Callable[[Op], None],
        *,
        start_ns: int | None = None,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        self._clock = clock
        self._sink = sink
        self._start = clock() if start_ns is None else start_ns
        # A threading.Lock to share the recorder between threads (the
        # writer passes one); none needed on one thread or event loop.
        self._lock: AbstractContextManager[object] = lock or contextlib.nullcontext()
        self._next_index = 0
        self._last_time = 0
        self._open: dict[Process, Op] = {}
        self._retired: set[Process] = set()

    @property
    def count(self) -> int:
        """How many ops were recorded."""
        return self._next_index

    def now(self) -> int:
        """The history's clock now (ns since the start): the ``time`` an op
        recorded now would get (a queue poll's ``assigned`` times)."""
        with self._lock:
            return max(self._clock() - self._start, self._last_time)

    def in_flight(self) -> dict[Process, Op]:
        """The invoke of each process that has an op in flight."""
        with self._lock:
            return dict(self._open)

    def retired(self, process: Process) -> bool:
        with self._lock:
            return process in self._retired

    def invoke(
        self,
        process: Process,
        f: str,
        *,
        key: str | None = None,
        value: Any = None,
        node: int | None = None,
    ) -> Op:
        with self._lock:
            if process in self._open:
                raise HistoryError(
                    f"process {process!r} invokes {f!r} while its "
                    f"{self._open[process].f!r} (op {self._open[process].index}) is in flight"
                )
            if process in self._retired:
                raise HistoryError(
                    f"process {process!r} was retired by an info; invoke with a new process"
                )
            op = self._emit("invoke", process, f, key, value, None, node, None, None)
            self._open[process] = op
            return op

    def complete(
        self,
        process: Process,
        type: OpType,
        *,
        value: Any = SAME,
        error: str | None = None,
        node: int | None = None,
        offset: int | None = None,
        epoch: int | None = None,
        assigned: dict[str, Any] | None = None,
        revoked: list[Any] | None = None,
    ) -> Op:
        """Complete ``process``'s op; ``value`` defaults to the invoke's;
        ``assigned`` and ``revoked`` are a queue poll's group fields."""
        if type not in COMPLETIONS:
            raise HistoryError(f"a completion is ok, fail or info, not {type!r}")
        with self._lock:
            inv = self._open.get(process)
            if inv is None:
                raise HistoryError(f"process {process!r} has no op in flight to complete")
            out = inv.value if value is SAME else value
            op = self._emit(
                type, process, inv.f, inv.key, out, error, node, offset, epoch, assigned, revoked
            )
            del self._open[process]
            if type == "info" and process != NEMESIS:
                self._retired.add(process)
            return op

    def ok(
        self,
        process: Process,
        *,
        value: Any = SAME,
        node: int | None = None,
        offset: int | None = None,
        epoch: int | None = None,
        assigned: dict[str, Any] | None = None,
        revoked: list[Any] | None = None,
    ) -> Op:
        return self.complete(
            process,
            "ok",
            value=value,
            node=node,
            offset=offset,
            epoch=epoch,
            assigned=assigned,
            revoked=revoked,
        )

    def fail(
        self,
        process: Process,
        error: str,
        *,
        value: Any = SAME,
        node: int | None = None,
        offset: int | None = None,
        epoch: int | None = None,
    ) -> Op:
        return self.complete(
            process, "fail", value=value, error=error, node=node, offset=offset, epoch=epoch
        )

    def info(
        self,
        process: Process,
        error: str,
        *,
        value: Any = SAME,
        node: int | None = None,
        offset: int | None = None,
        epoch: int | None = None,
    ) -> Op:
        """An unknown outcome; a client process is retired by it."""
        return self.complete(
            process, "info", value=value, error=error, node=node, offset=offset, epoch=epoch
        )

    def close_open(self, error: str = "run-ended") -> list[Op]:
        """Complete every op still in flight as ``info`` (the run is ending
        and their outcome is unknown), in invoke order."""
        with self._lock:
            pending = sorted(self._open.values(), key=lambda op: op.index)
        return [self.info(op.process, error) for op in pending]

    def _emit(
        self,
        type: OpType,
        process: Process,
        f: str,
        key: str | None,
        value: Any,
        error: str | None,
        node: int | None,
        offset: int | None,
        epoch: int | None,
        assigned: dict[str, Any] | None = None,
        revoked: list[Any] | None = None,
    ) -> Op:
        now = self._clock() - self._start
        if now < self._last_time:
            raise HistoryError(f"the clock went back from {self._last_time} to {now} ns")
        op = Op(
            self._next_index,
            now,
            type,
            process,
            f,
            key,
            value,
            error,
            node,
            offset,
            epoch,
            assigned,
            revoked,
        )
        problems = op_problems(op)
        if problems:
            raise HistoryError("; ".join(problems))
        self._sink(op)
        self._next_index += 1
        self._last_time = now
        return op


# -- well-formedness -----------------------------------------------------------


def check_well_formed(
    ops: Sequence[Op],
    *,
    model: str | None = None,
    require_nemesis: bool = False,
) -> list[Problem]:
    """Every way ``ops`` breaks the history rules (empty if none).

    Always checked: each op's fields (``invalid-op``); ``index`` counts 0, 1,
    2, ... (``index``); ``time`` never decreases (``time``); each process has
    at most one op in flight (``concurrent-invoke``); each completion answers
    an invoke of its process (``unmatched-completion``) with the same ``f``
    and ``key`` (``completion-mismatch``); every invoke is completed
    (``open-invoke``); a client process never invokes after an ``info``
    (``invoke-after-info``); every fault that lasts is ended
    (``nemesis-unended``).  With ``require_nemesis``: at least one nemesis op
    (``nemesis-missing``).  With ``model`` (one of :data:`MODELS`): its ``f``
    values (``model-f``), value shapes (``model-value``), unique written
    values per key (``duplicate-value``), version fields
    (``model-version``) and errors (``model-error``).
    """
    if model is not None and model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    problems: list[Problem] = []

    def add(kind: str, message: str, op: Op | None = None) -> None:
        problems.append(Problem(kind, message, op.index if op is not None else None))

    open_ops: dict[Process, Op] = {}
    retired: dict[Process, Op] = {}
    last: Op | None = None
    for op in ops:
        for message in op_problems(op):
            add("invalid-op", message, op)
        due = 0 if last is None or not _is_int(last.index) else last.index + 1
        if op.index != due:
            after = "first op" if last is None else f"after {last.index}"
            add("index", f"index {op.index} where {due} was due ({after})", op)
        if last is not None and _is_int(op.time) and _is_int(last.time) and op.time < last.time:
            add("time", f"time {op.time} is before the previous op's {last.time}", op)
        last = op
        if op.type == "invoke":
            prior = open_ops.get(op.process)
            if prior is not None:
                add(
                    "concurrent-invoke",
                    f"process {op.process!r} invokes {op.f!r} while op {prior.index} "
                    f"({prior.f!r}) is in flight",
                    op,
                )
            if op.process in retired:
                add(
                    "invoke-after-info",
                    f"process {op.process!r} invokes after its info at op "
                    f"{retired[op.process].index}",
                    op,
                )
            open_ops[op.process] = op
        elif op.type in COMPLETIONS:
            inv = open_ops.pop(op.process, None)
            if inv is None:
                add(
                    "unmatched-completion",
                    f"{op.type} by process {op.process!r} with no invoke in flight",
                    op,
                )
                continue
            if inv.f != op.f or inv.key != op.key:
                add(
                    "completion-mismatch",
                    f"{op.type} of f={op.f!r} key={op.key!r} completes op {inv.index}, "
                    f"an invoke of f={inv.f!r} key={inv.key!r}",
                    op,
                )
            if op.type == "info" and op.process != NEMESIS:
                retired.setdefault(op.process, op)
    for inv in sorted(open_ops.values(), key=lambda o: o.index):
        add(
            "open-invoke",
            f"process {inv.process!r}'s {inv.f!r} was never completed (a run ends by "
            "completing each op in flight as info)",
            inv,
        )
    problems.extend(_nemesis_problems(ops, require_nemesis))
    if model is not None:
        problems.extend(_model_problems(ops, model))
    return problems


def _nemesis_problems(ops: Sequence[Op], require: bool) -> list[Problem]:
    """Faults that start (ok or info: may have started) must end (ok)."""
    out: list[Problem] = []
    nemesis = [op for op in ops if op.process == NEMESIS]
    if require and not nemesis:
        out.append(
            Problem("nemesis-missing", "faults were configured but no nemesis op was recorded")
        )
    # (start f, node or None) -> the completion that started it
    active: dict[tuple[str, int | None], Op] = {}
    for op in nemesis:
        if op.type not in COMPLETIONS or not isinstance(op.value, dict):
            continue
        nodes: Any = op.value.get("nodes")
        if op.f in _PER_NODE_FAULTS and not _node_list(nodes):
            continue  # reported as invalid-op
        targets: list[int | None] = (
            list(nodes) if op.f in _PER_NODE_FAULTS and _node_list(nodes) else [None]
        )
        if op.f in NEMESIS_ENDS and op.type in ("ok", "info"):
            for node in targets:
                active.setdefault((op.f, node), op)
        elif op.type == "ok":
            for start, end in NEMESIS_ENDS.items():
                if end != op.f:
                    continue
                for key in [k for k in active if k[0] == start]:
                    if start not in _PER_NODE_FAULTS or key[1] in targets:
                        del active[key]
    for (start, node), op in sorted(active.items(), key=lambda item: item[1].index):
        target = f" of node {node}" if node is not None else ""
        out.append(
            Problem(
                "nemesis-unended",
                f"{start}{target} is never ended by a {NEMESIS_ENDS[start]}",
                op.index,
            )
        )
    return out


_READS: Final = frozenset({"read", "get"})


def _model_problems(ops: Sequence[Op], model: str) -> list[Problem]:
    if model == "queue":
        return _queue_problems(ops)
    out: list[Problem] = []
    allowed = _MODEL_FS[model]
    written: dict[tuple[str | None, str], Op] = {}
    invokes: dict[Process, Op] = {}

    def add(kind: str, message: str, op: Op) -> None:
        out.append(Problem(kind, message, op.index))

    for op in ops:
        if op.process == NEMESIS:
            continue
        if op.f not in allowed:
            add("model-f", f"{model} has no f {op.f!r} (it has {', '.join(sorted(allowed))})", op)
            continue
        if op.key is None:
            add("model-value", f"a {model} op needs a key", op)
        if op.assigned is not None or op.revoked is not None:
            add("model-value", "only a queue poll carries assigned or revoked", op)
        if op.type == "invoke":
            invokes[op.process] = op
        else:
            inv = invokes.pop(op.process, None)
            if inv is not None and op.f not in _READS and op.value != inv.value:
                add("model-value", f"a {op.f}'s completion repeats its invoke's value", op)
        shape = _value_shape_problem(model, op)
        if shape:
            add("model-value", shape, op)
        elif op.type == "invoke" and op.f in ("write", "cas", "put", "append"):
            for v in _written_values(model, op):
                first = written.get((op.key, v))
                if first is None:
                    written[(op.key, v)] = op
                else:
                    add(
                        "duplicate-value",
                        f"value {v!r} of key {op.key!r} was already written by op {first.index}",
                        op,
                    )
        version = _version_problem(op, model)
        if version:
            add("model-version", version, op)
        if op.error == "precondition" and not (op.f == "cas" and op.type == "fail"):
            add("model-error", "error precondition belongs to a failed cas only", op)
    return out


def _queue_problems(ops: Sequence[Op]) -> list[Problem]:
    """The ``queue`` model (``history.queue``): micro-op shapes, no ``key``
    or version fields, unique sent values, crashes always ``info``."""
    out: list[Problem] = []
    invokes: dict[Process, Op] = {}
    sent: dict[object, Op] = {}
    for op in ops:
        if op.process == NEMESIS:
            continue
        if op.f not in QUEUE_FS:
            out.append(
                Problem(
                    "model-f",
                    f"queue has no f {op.f!r} (it has {', '.join(sorted(QUEUE_FS))})",
                    op.index,
                )
            )
            continue
        if op.key is not None:
            out.append(
                Problem(
                    "model-value", "a queue op has no key (its keys are in its value)", op.index
                )
            )
        if op.offset is not None or op.epoch is not None:
            out.append(
                Problem(
                    "model-version",
                    "a queue op has no offset or epoch (its offsets are in its value)",
                    op.index,
                )
            )
        inv = None
        if op.type == "invoke":
            invokes[op.process] = op
        else:
            inv = invokes.pop(op.process, None)
        for kind, message in queue_op_problems(
            op.type, op.f, op.value, inv.value if inv is not None else None
        ):
            out.append(Problem(kind, message, op.index))
        for message in group_field_problems(op.f, op.assigned, op.revoked):
            out.append(Problem("model-value", message, op.index))
        if op.type == "invoke" and op.f in ("send", "txn"):
            for _, v in sent_values(op.value):
                first = sent.get(v)
                if first is None:
                    sent[v] = op
                else:
                    out.append(
                        Problem(
                            "duplicate-value",
                            f"value {v!r} was already sent by op {first.index}",
                            op.index,
                        )
                    )
    return out


def _written_values(model: str, op: Op) -> list[str]:
    if model == "log":
        return list(op.value)
    if op.f == "cas":
        return [op.value[1]]
    return [op.value]


def _is_str_or_none(v: object) -> bool:
    return v is None or isinstance(v, str)


def _value_shape_problem(model: str, op: Op) -> str | None:
    v = op.value
    if model == "topics":
        return _topics_shape_problem(op)
    if model == "log":
        if not (isinstance(v, list) and v and all(isinstance(r, str) for r in v)):
            return f"a log write's value is a non-empty list of strings, got {v!r}"
        return None
    if op.f in _READS:
        if op.type == "ok":
            return None if _is_str_or_none(v) else f"a {op.f} returns a string or null, got {v!r}"
        return None if v is None else f"a {op.f}'s {op.type} value is null, got {v!r}"
    if op.f in ("write", "put"):
        return None if isinstance(v, str) else f"a {op.f}'s value is a string, got {v!r}"
    if op.f == "append":
        if isinstance(v, str) and v:
            return None
        return f"an append's value is a non-empty string, got {v!r}"
    if op.f == "cas":
        if isinstance(v, list) and len(v) == 2 and _is_str_or_none(v[0]) and isinstance(v[1], str):
            return None
        return f"a cas's value is [expected (string or null), new (string)], got {v!r}"
    if op.f == "delete":
        return None if v is None else f"a delete's value is null, got {v!r}"
    return None


def _topics_shape_problem(op: Op) -> str | None:
    v = op.value
    if op.f == "create-topic":
        fields = ("partitions", "replication_factor")
        if isinstance(v, dict) and set(v) == set(fields) and all(_positive(v[k]) for k in fields):
            return None
        return (
            "a create-topic's value is {partitions, replication_factor} "
            f"(positive integers), got {v!r}"
        )
    if op.f == "delete-topic":
        return None if v is None else f"a delete-topic's value is null, got {v!r}"
    if op.key is not None and not op.key.isdigit():
        return f"a {op.f}'s key is a broker id (decimal), got {op.key!r}"
    if op.f == "register-broker":
        if isinstance(v, dict) and set(v) == {"incarnation"} and isinstance(v["incarnation"], str):
            return None
        return f"a register-broker's value is {{incarnation (string)}}, got {v!r}"
    if isinstance(v, dict) and set(v) == {"fence"} and isinstance(v["fence"], bool):
        return None
    return f"a heartbeat's value is {{fence (boolean)}}, got {v!r}"


def _positive(v: object) -> bool:
    return _is_int(v) and isinstance(v, int) and v > 0


def _version_problem(op: Op, model: str) -> str | None:
    has = (op.offset is not None, op.epoch is not None)
    if has[0] != has[1]:
        return "offset and epoch come together"
    if op.type != "ok" or model == "topics":
        return None
    if op.f in _READS:
        # A read's version is optional: not every store reports which write
        # set the value it returns (the metadata controller's configs do not).
        if op.value is None and has[0]:
            return f"a {op.f} that found no value carries no offset or epoch"
        return None
    if not has[0]:
        return f"an ok {op.f} carries the offset and epoch it committed at"
    return None

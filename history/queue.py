"""The ``queue`` model: Jepsen's Kafka workload ops as kq writes them (no I/O).

``docs/history-format.md`` ("`queue`") is the contract.  A ``send`` carries
micro-ops ``["send", k, v]`` completing as ``["send", k, [offset, v]]``; a
``poll`` carries ``[["poll"]]`` completing as ``[["poll", {"k": [[offset, v],
...]}]]``; ``assign`` takes ``{"keys": [...], "seek_to_beginning": bool}``;
``crash`` is always ``info``; with consumer groups, ``subscribe`` takes
``{"keys": [...]}``, ``commit`` carries ``[["commit", {"k": offset, ...}]]``
and an ``ok`` poll may carry ``assigned`` and ``revoked``; a ``txn`` (one
Kafka transaction) carries send and poll micro-ops in any mix, each
completing as in a send or a poll.  Keys are integers naming
topic-partitions (:class:`KeyMap`); values are integers unique over the run.

This module builds those values (for the workload) and checks them (for
:func:`history.ops.check_well_formed`), so writer and checker share one
definition of each shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ISOLATION_LEVELS",
    "QUEUE_FS",
    "KeyMap",
    "assign_value",
    "commit_value",
    "group_field_problems",
    "isolation_level",
    "poll_invoke_value",
    "poll_ok_value",
    "queue_op_problems",
    "record_key",
    "send_completion_value",
    "send_invoke_value",
    "sent_values",
    "subscribe_value",
    "txn_completion_value",
    "txn_invoke_value",
    "txn_plan",
]

QUEUE_FS: Final = frozenset({"send", "poll", "txn", "assign", "subscribe", "commit", "crash"})
"""The ``f`` values of a queue history."""

ISOLATION_LEVELS: Final = ("read_uncommitted", "read_committed")
"""``config.json``'s ``queue.isolation_level``: the isolation the run's
consumers fetched with (Kafka's ``isolation.level``), the first the default."""


def isolation_level(config: Mapping[str, Any]) -> str:
    """A run's ``queue.isolation_level`` from its ``config.json``
    (``read_uncommitted`` when absent: a run written before the field);
    anything else is refused by name."""
    queue = config.get("queue")
    level = queue.get("isolation_level") if isinstance(queue, Mapping) else None
    if level is None:
        return ISOLATION_LEVELS[0]
    if level not in ISOLATION_LEVELS:
        raise ValueError(
            f"queue.isolation_level is one of {', '.join(ISOLATION_LEVELS)}, got {level!r}"
        )
    return str(level)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_count(v: object) -> bool:
    return _is_int(v) and isinstance(v, int) and v >= 0


@dataclass(frozen=True, slots=True)
class KeyMap:
    """Integer keys <-> topic-partitions: the topics in order, each with its
    partition count; key k is the partition of the topic whose range covers
    it (with one topic, the key is the partition)."""

    topics: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("a queue needs at least one topic")
        names = [name for name, _ in self.topics]
        if len(set(names)) != len(names):
            raise ValueError(f"topic names repeat: {names}")
        for name, partitions in self.topics:
            if not name or not _is_int(partitions) or partitions < 1:
                raise ValueError(f"topic {name!r} needs a name and partitions >= 1")

    @property
    def keys(self) -> list[int]:
        return list(range(sum(n for _, n in self.topics)))

    def topic_partition(self, key: int) -> tuple[str, int]:
        start = 0
        for name, partitions in self.topics:
            if start <= key < start + partitions:
                return name, key - start
            start += partitions
        raise ValueError(f"key {key} names no partition (keys 0..{start - 1})")

    def key(self, topic: str, partition: int) -> int:
        start = 0
        for name, partitions in self.topics:
            if name == topic:
                if not 0 <= partition < partitions:
                    raise ValueError(f"topic {topic!r} has no partition {partition}")
                return start + partition
            start += partitions
        raise ValueError(f"no topic {topic!r} in the queue's topics")

    def to_json(self) -> list[dict[str, Any]]:
        return [{"name": name, "partitions": n} for name, n in self.topics]

    @classmethod
    def from_json(cls, obj: object) -> KeyMap:
        if not isinstance(obj, list):
            raise ValueError(f"queue.topics must be a list, got {obj!r}")
        topics = []
        for t in obj:
            if not isinstance(t, dict) or set(t) != {"name", "partitions"}:
                raise ValueError(f"a queue topic is {{name, partitions}}, got {t!r}")
            topics.append((t["name"], t["partitions"]))
        return cls(tuple(topics))


# -- building values -----------------------------------------------------------


def record_key(key: int, value: int, record_keys: int) -> str:
    """The record key (as text; its UTF-8 bytes are the record's key) of
    value ``value`` sent to queue key ``key``: with ``record_keys`` 0 the
    key's decimal text (every record of a partition shares it), else the
    decimal text of ``value mod record_keys``.  The record keys of a
    partition then recur, so that compaction has records to remove, while
    every value stays unique and names the one send that wrote it
    (``config.json``'s ``queue.record_keys``)."""
    return str(key if record_keys == 0 else value % record_keys)


def send_invoke_value(records: Sequence[tuple[int, int]]) -> list[list[Any]]:
    """``[["send", k, v], ...]`` for ``(key, value)`` records."""
    return [["send", k, v] for k, v in records]


def send_completion_value(
    records: Sequence[tuple[int, int]], offsets: Sequence[int | None]
) -> list[list[Any]]:
    """``[["send", k, [offset, v]], ...]``; ``None`` where not known."""
    if len(records) != len(offsets):
        raise ValueError("one offset (or None) per record")
    return [["send", k, [o, v]] for (k, v), o in zip(records, offsets, strict=True)]


def poll_invoke_value() -> list[list[Any]]:
    return [["poll"]]


def poll_ok_value(records: Mapping[int, Sequence[tuple[int, int]]]) -> list[list[Any]]:
    """``[["poll", {"k": [[offset, v], ...]}]]``, keys in decimal text."""
    return [["poll", {str(k): [[o, v] for o, v in recs] for k, recs in sorted(records.items())}]]


def txn_invoke_value(mops: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """``[["send", k, v], ["poll"], ...]``: a transaction's micro-ops
    (``("send", k, v)`` or ``("poll",)``) in order."""
    return [list(m) for m in mops]


def txn_completion_value(
    mops: Sequence[Sequence[Any]],
    offsets: Mapping[int, int | None],
    polled: Mapping[int, Mapping[int, Sequence[tuple[int, int]]]],
) -> list[list[Any]]:
    """A transaction's completion: each send micro-op (by position) with its
    offset (``offsets``; None or absent: not known), each poll with the
    records it returned (``polled``, by position; absent: ``["poll"]``, no
    records known)."""
    out: list[list[Any]] = []
    for i, m in enumerate(mops):
        if m[0] == "send":
            out.append(["send", m[1], [offsets.get(i), m[2]]])
        elif i in polled:
            out.append(poll_ok_value(polled[i])[0])
        else:
            out.append(["poll"])
    return out


def assign_value(keys: Iterable[int], seek_to_beginning: bool) -> dict[str, Any]:
    return {"keys": sorted(keys), "seek_to_beginning": bool(seek_to_beginning)}


def subscribe_value(keys: Iterable[int]) -> dict[str, Any]:
    return {"keys": sorted(keys)}


def commit_value(offsets: Mapping[int, int]) -> list[list[Any]]:
    """``[["commit", {"k": offset, ...}]]``, keys in decimal text, each
    offset the next one to read (as Kafka commits)."""
    return [["commit", {str(k): o for k, o in sorted(offsets.items())}]]


def sent_values(value: object) -> list[tuple[int, int]]:
    """``(key, value)`` of each micro-op of a send's invoke or completion
    value (empty if it is not one)."""
    out: list[tuple[int, int]] = []
    if not isinstance(value, list):
        return out
    for mop in value:
        if isinstance(mop, list) and len(mop) == 3 and mop[0] == "send":
            v = mop[2]
            if isinstance(v, list) and len(v) == 2:
                v = v[1]
            out.append((mop[1], v))
    return out


# -- checking ------------------------------------------------------------------

VALUE: Final = "model-value"
"""The kind (``history.ops.Problem``) of a value of the wrong shape."""
VERSION: Final = "model-version"
"""The kind of an offset where none may be (a failed send's)."""


def _send_problem(op_type: str, value: object) -> tuple[str, str] | None:
    if not isinstance(value, list) or not value:
        return VALUE, f"a send's value is a non-empty list of send micro-ops, got {value!r}"
    for mop in value:
        if not (isinstance(mop, list) and len(mop) == 3 and mop[0] == "send"):
            return VALUE, f'a send micro-op is ["send", key, value], got {mop!r}'
        k, v = mop[1], mop[2]
        if not _is_count(k):
            return VALUE, f"a queue key is an integer >= 0, got {k!r}"
        if op_type == "invoke" or (op_type in ("fail", "info") and not isinstance(v, list)):
            # A fail or info may repeat the invoke's micro-op (Jepsen's form;
            # what the recorder's close writes for a send cut short).
            if not _is_int(v):
                return VALUE, f"a sent value is an integer, got {v!r}"
            continue
        if not (isinstance(v, list) and len(v) == 2 and _is_int(v[1])):
            return VALUE, f"a send completion's micro-op value is [offset, value], got {v!r}"
        offset = v[0]
        if offset is not None and not _is_count(offset):
            return VALUE, f"a sent record's offset is an integer >= 0 or null, got {offset!r}"
        if op_type == "fail" and offset is not None:
            return VERSION, f"a failed send wrote nothing, yet names offset {offset} for key {k}"
    return None


def _poll_map_problem(reads: object) -> str | None:
    """What is wrong with a poll micro-op's ``{key: [[offset, v], ...]}``."""
    if not isinstance(reads, dict):
        return f"a poll's records are {{key: [[offset, value], ...]}}, got {reads!r}"
    for k, records in reads.items():
        if not (k.isdigit() and str(int(k)) == k):
            return f"a poll's key is the decimal text of an integer >= 0, got {k!r}"
        if not isinstance(records, list):
            return f"a poll's records of key {k} are a list, got {records!r}"
        last = -1
        for rec in records:
            if not (isinstance(rec, list) and len(rec) == 2 and _is_count(rec[0])):
                return f"a polled record is [offset, value], got {rec!r} (key {k})"
            if not _is_int(rec[1]):
                return f"a polled value is an integer, got {rec[1]!r} (key {k})"
            if rec[0] <= last:
                return f"a poll's offsets of key {k} ascend, got {rec[0]} after {last}"
            last = rec[0]
    return None


def _poll_problem(op_type: str, value: object) -> str | None:
    if op_type != "ok":
        if value == [["poll"]]:
            return None
        return f'a poll\'s {op_type} value is [["poll"]], got {value!r}'
    if not (
        isinstance(value, list)
        and len(value) == 1
        and isinstance(value[0], list)
        and len(value[0]) == 2
        and value[0][0] == "poll"
        and isinstance(value[0][1], dict)
    ):
        return f'an ok poll\'s value is [["poll", {{key: records}}]], got {value!r}'
    return _poll_map_problem(value[0][1])


def _txn_send_problem(op_type: str, mop: list[Any]) -> tuple[str, str] | None:
    """A transaction's ``["send", k, v]`` (invoke; a ``fail`` or ``info`` may
    repeat it) or ``["send", k, [offset, v]]`` (completion)."""
    k, v = mop[1], mop[2]
    if not _is_count(k):
        return VALUE, f"a queue key is an integer >= 0, got {k!r}"
    if op_type == "invoke" or (op_type != "ok" and not isinstance(v, list)):
        if not _is_int(v):
            return VALUE, f"a sent value is an integer, got {v!r}"
        return None
    if not (isinstance(v, list) and len(v) == 2 and _is_int(v[1])):
        return VALUE, f"a txn completion's send micro-op value is [offset, value], got {v!r}"
    offset = v[0]
    if offset is not None and not _is_count(offset):
        return VALUE, f"a sent record's offset is an integer >= 0 or null, got {offset!r}"
    if op_type == "fail" and offset is not None:
        return (
            VERSION,
            f"an aborted transaction's records are not in the log for its readers, yet it "
            f"names offset {offset} for key {k}",
        )
    return None


def _txn_problem(op_type: str, value: object) -> tuple[str, str] | None:
    """A ``txn``: send and poll micro-ops in any mix (Jepsen's ``:txn``).  An
    ``ok`` one carries every send's ``[offset, v]`` and every poll's
    records; a ``fail`` or ``info`` one may repeat a micro-op as invoked
    (``["send", k, v]``, ``["poll"]``) or carry what it learned, but a
    ``fail`` names no offset."""
    if not isinstance(value, list) or not value:
        return VALUE, f"a txn's value is a non-empty list of send and poll micro-ops, got {value!r}"
    for mop in value:
        if isinstance(mop, list) and len(mop) == 3 and mop[0] == "send":
            wrong = _txn_send_problem(op_type, mop)
            if wrong:
                return wrong
        elif isinstance(mop, list) and mop == ["poll"]:
            if op_type == "ok":
                return VALUE, 'an ok txn\'s poll micro-op is ["poll", {key: records}], got ["poll"]'
        elif isinstance(mop, list) and len(mop) == 2 and mop[0] == "poll":
            if op_type == "invoke":
                return VALUE, f'a txn\'s invoke polls with ["poll"], got {mop!r}'
            shape = _poll_map_problem(mop[1])
            if shape:
                return VALUE, shape
        else:
            return (
                VALUE,
                f'a txn micro-op is ["send", key, value] or ["poll"] (completed: '
                f'["send", key, [offset, value]], ["poll", {{key: records}}]), got {mop!r}',
            )
    return None


def txn_plan(value: object) -> list[tuple[Any, ...]]:
    """A txn's micro-ops reduced to what its invoke and completion share:
    ``("send", k, v)`` or ``("poll",)`` each, in order."""
    out: list[tuple[Any, ...]] = []
    for mop in value if isinstance(value, list) else ():
        if isinstance(mop, list) and mop and mop[0] == "poll":
            out.append(("poll",))
        elif isinstance(mop, list) and len(mop) == 3:
            v = mop[2]
            out.append(("send", mop[1], v[1] if isinstance(v, list) and len(v) == 2 else v))
    return out


def _assign_problem(value: object) -> str | None:
    if (
        isinstance(value, dict)
        and set(value) == {"keys", "seek_to_beginning"}
        and isinstance(value["keys"], list)
        and all(_is_count(k) for k in value["keys"])
        and isinstance(value["seek_to_beginning"], bool)
    ):
        return None
    return (
        f"an assign's value is {{keys: [integer >= 0], seek_to_beginning: boolean}}, got {value!r}"
    )


def _subscribe_problem(value: object) -> str | None:
    if (
        isinstance(value, dict)
        and set(value) == {"keys"}
        and isinstance(value["keys"], list)
        and all(_is_count(k) for k in value["keys"])
    ):
        return None
    return f"a subscribe's value is {{keys: [integer >= 0]}}, got {value!r}"


def _decimal_key(k: object) -> bool:
    return isinstance(k, str) and k.isdigit() and str(int(k)) == k


def _commit_problem(value: object) -> str | None:
    if not (
        isinstance(value, list)
        and len(value) == 1
        and isinstance(value[0], list)
        and len(value[0]) == 2
        and value[0][0] == "commit"
        and isinstance(value[0][1], dict)
        and value[0][1]
    ):
        return f'a commit\'s value is [["commit", {{key: offset}}]] naming a key, got {value!r}'
    for k, o in value[0][1].items():
        if not _decimal_key(k):
            return f"a commit's key is the decimal text of an integer >= 0, got {k!r}"
        if not _is_count(o):
            return f"a committed offset is an integer >= 0, got {o!r} (key {k})"
    return None


def group_field_problems(f: str, assigned: object, revoked: object) -> list[str]:
    """Shape problems of an ``ok`` completion's ``assigned`` and ``revoked``
    (None: absent): only a poll carries them; ``assigned`` maps each key's
    decimal text to ``[start, time]``, ``revoked`` lists keys."""
    if assigned is None and revoked is None:
        return []
    if f != "poll":
        return [f"only an ok poll carries assigned or revoked, not a {f}"]
    out: list[str] = []
    if assigned is not None:
        if not isinstance(assigned, dict):
            out.append(f"a poll's assigned is {{key: [start, time]}}, got {assigned!r}")
        else:
            for k, at in assigned.items():
                if not _decimal_key(k):
                    out.append(f"an assigned key is the decimal text of an integer >= 0, got {k!r}")
                elif not (isinstance(at, list) and len(at) == 2 and all(_is_count(x) for x in at)):
                    out.append(
                        f"an assignment is [start offset, time ns], both integers >= 0, "
                        f"got {at!r} (key {k})"
                    )
    if revoked is not None and not (
        isinstance(revoked, list) and all(_is_count(k) for k in revoked)
    ):
        out.append(f"a poll's revoked is a list of keys (integers >= 0), got {revoked!r}")
    return out


def queue_op_problems(
    op_type: str, f: str, value: object, invoke_value: object
) -> list[tuple[str, str]]:
    """Shape problems of one queue op as ``(kind, message)``, the kind
    :data:`VALUE` or :data:`VERSION` (``invoke_value``: its invoke's value,
    for a completion; None for an invoke or when unknown)."""
    out: list[tuple[str, str]] = []
    if f == "send":
        shape = _send_problem(op_type, value)
        if shape:
            return [shape]
        if (
            op_type != "invoke"
            and isinstance(invoke_value, list)
            and sent_values(value) != sent_values(invoke_value)
        ):
            out.append(
                (VALUE, "a send's completion names the keys and values of its invoke, in order")
            )
    elif f == "txn":
        shape = _txn_problem(op_type, value)
        if shape:
            return [shape]
        if (
            op_type != "invoke"
            and isinstance(invoke_value, list)
            and txn_plan(value) != txn_plan(invoke_value)
        ):
            out.append(
                (
                    VALUE,
                    "a txn's completion names its invoke's micro-ops in order: the same "
                    "sends (keys and values) and polls",
                )
            )
    elif f == "poll":
        wrong = _poll_problem(op_type, value)
        if wrong:
            out.append((VALUE, wrong))
    elif f == "assign":
        wrong = _assign_problem(value)
        if wrong:
            out.append((VALUE, wrong))
        elif op_type != "invoke" and invoke_value is not None and value != invoke_value:
            out.append((VALUE, "an assign's completion repeats its invoke's value"))
    elif f == "subscribe":
        wrong = _subscribe_problem(value)
        if wrong:
            out.append((VALUE, wrong))
        elif op_type != "invoke" and invoke_value is not None and value != invoke_value:
            out.append((VALUE, "a subscribe's completion repeats its invoke's value"))
    elif f == "commit":
        wrong = _commit_problem(value)
        if wrong:
            out.append((VALUE, wrong))
        elif op_type != "invoke" and invoke_value is not None and value != invoke_value:
            out.append((VALUE, "a commit's completion repeats its invoke's offsets"))
    elif f == "crash":
        if value is not None:
            out.append((VALUE, f"a crash's value is null, got {value!r}"))
        if op_type == "ok" or op_type == "fail":
            out.append((VALUE, f"a crash is always info (error crash), got {op_type}"))
    return out

"""The queue checks: Jepsen's Kafka analysis and kq's no-loss rule (pure).

A ``queue`` history is Jepsen's Kafka workload (``jepsen.tests.kafka``):

- ``send``: invoke ``[["send", k, v], ...]``, completion
  ``[["send", k, [offset, v]], ...]`` (``offset`` null if unknown; an
  ``info`` may repeat the invoke's ``[..., k, v]``);
- ``poll``: invoke ``[["poll"]]``, completion ``[["poll", {k: [[offset, v], ...]}]]``;
- ``txn``: one transaction, send and poll micro-ops in any mix, each
  completing as in a send or a poll;
- ``assign`` / ``subscribe``: the keys, ``[k, ...]``;
- ``crash``: the client is torn down.

Keys are compared as strings (a poll's keys are JSON object keys); values
are unique per key.  :func:`check_queue` runs every check of Jepsen's
``analysis`` with Jepsen's definitions (``jepsen/tests/kafka.clj``:
``version-orders``, ``g1a-cases``, ``lost-write-cases``, ``unseen``,
``poll-skip+nonmonotonic-cases``, ``int-poll-skip+nonmonotonic-cases``,
``nonmonotonic-send-cases``, ``int-send-skip+nonmonotonic-cases``,
``duplicate-cases``, ``precommitted-read-cases``, and Elle's cycles over
the transactions: :mod:`history.queue_cycles`) plus kq's stricter
``no-loss`` rule over the final reads and its ``torn-transaction`` rule.
It is the reference the Spark job (``spark_verify.queue``) is tested
against, so every rule here is spelled out in rows (key, offset, value) the
way the job computes them.

A run's consumers read committed records or not (``isolation``, the run's
``queue.isolation_level``): reading uncommitted ones, a poll may see a
transaction's records before it commits (``precommitted-read`` and
``G1c`` are then allowed) and after it aborts (not ``G1a``), and the final
reads cannot tell a torn transaction (``torn-transaction`` is not judged).

On topics with retention or compaction (:class:`Cleanup`, from the run's
``config.json`` and ``summary.json``) a record may be legitimately gone:
below the highest log start offset the final reads saw (retention), or
superseded by a record of the same record key at a higher offset that the
final reads returned (compaction: the latest record of each record key is
always kept, ``LogCleaner``).  Such a record counts as neither lost nor
unseen, and a poll may skip it; everything else is checked as on a plain
topic (a record kept keeps its offset and value).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from history.ops import NEMESIS, Op
from history.queue_cycles import Cycle, Edge, find_cycles

__all__ = [
    "ALWAYS_ALLOWED",
    "CHECKS",
    "NO_CLEANUP",
    "READ_UNCOMMITTED_ALLOWED",
    "Cleanup",
    "FINAL_FS",
    "SUBSCRIBE_ALLOWED",
    "QueueAnomaly",
    "QueueOp",
    "QueueResult",
    "ReadRow",
    "SendRow",
    "check_queue",
    "final_from",
    "pair_queue",
    "read_rows",
    "send_rows",
]

CHECKS: Final = (
    "inconsistent-offsets",
    "duplicate",
    "G1a",
    "precommitted-read",
    "lost-write",
    "unseen",
    "poll-skip",
    "nonmonotonic-poll",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "nonmonotonic-send",
    "int-send-skip",
    "int-nonmonotonic-send",
    "G0",
    "G1c-ww",
    "G1c",
    "no-loss",
    "torn-transaction",
)
"""Every queue check, Jepsen's error types first, in the order they are reported."""

ALWAYS_ALLOWED: Final = frozenset({"int-send-skip", "G0", "G1c-ww"})
"""Jepsen's ``allowed-error-types``: a transaction's sends to one key may
interleave with other producers' (``int-send-skip`` is normal), and Kafka
orders no writes across partitions between transactions, so a cycle that
needs a ``ww`` edge (``G0``, ``G1c-ww``) is allowed, as Jepsen allows G0
always and G1c when it infers ``ww`` dependencies."""

READ_UNCOMMITTED_ALLOWED: Final = frozenset({"precommitted-read", "G1c"})
"""Allowed too in a run whose consumers read uncommitted records
(``queue.isolation_level`` ``read_uncommitted``): a poll may then return a
transaction's records before it commits, its own included."""

SUBSCRIBE_ALLOWED: Final = frozenset({"poll-skip", "nonmonotonic-poll"})
"""Allowed too once a history subscribes (a consumer group rebalances and a
consumer may resume elsewhere in the log)."""

FINAL_FS: Final = frozenset({"poll", "crash", "assign", "subscribe", "debug-topic-partitions"})
"""The ops of the final reads: Jepsen's final generator (crash, assign with
seek to the beginning, polls) and ``plot-unseen!``'s final-poll section."""


@dataclass(frozen=True, slots=True)
class QueueOp:
    """One client op of a queue history, its invoke and completion paired.

    ``index`` is the invoke's (the op's name in anomalies), ``complete`` the
    completion's; ``value`` is the completion's value, or the invoke's when
    the completion carries none."""

    index: int
    complete: int
    process: int | str
    f: str
    type: str
    value: Any


@dataclass(frozen=True, slots=True)
class SendRow:
    """One micro-op ``[send k v]`` of a completed send."""

    op: int
    process: int | str
    type: str
    key: str
    pos: int
    offset: int | None
    value: Any


@dataclass(frozen=True, slots=True)
class ReadRow:
    """One ``[offset v]`` a completed poll returned for key ``k``."""

    op: int
    process: int | str
    type: str
    key: str
    pos: int
    offset: int | None
    value: Any


@dataclass(frozen=True, slots=True)
class QueueAnomaly:
    """One anomaly: the check, the key, the values and offsets involved, and
    the ops (invoke indexes) that show it, with a sentence."""

    check: str
    key: str
    values: tuple[Any, ...]
    offsets: tuple[int, ...]
    ops: tuple[int, ...]
    message: str

    def ident(self) -> tuple[str, str, str, tuple[int, ...], tuple[int, ...]]:
        """What two checkers must agree on (the message may be worded apart)."""
        return (self.check, self.key, _j(list(self.values)), self.offsets, self.ops)


@dataclass(frozen=True, slots=True)
class QueueResult:
    """The anomalies of each check, which of them are allowed, and whether the
    history had final reads (without them ``no-loss`` cannot be decided)."""

    anomalies: Mapping[str, tuple[QueueAnomaly, ...]]
    allowed: frozenset[str]
    final_reads: bool
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fired(self) -> list[str]:
        """The checks that found anomalies and are not allowed, in :data:`CHECKS` order."""
        return [c for c in CHECKS if self.anomalies.get(c) and c not in self.allowed]

    @property
    def valid(self) -> bool | str:
        """False if a check that is not allowed fired; ``"unknown"`` if none
        did but there were no final reads to decide ``no-loss``; else True."""
        if self.fired:
            return False
        return True if self.final_reads else "unknown"

    def all(self) -> list[QueueAnomaly]:
        return [a for c in CHECKS for a in self.anomalies.get(c, ())]


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What the queue's topics may legitimately remove
    (``docs/history-format.md``, the ``queue`` model): ``log_start``, per
    key (decimal text), the highest log start offset the final reads saw,
    given only when the topics delete by a retention limit (empty: nothing
    is below a log start); ``record_keys``, the run's ``queue.record_keys``
    when the topics are compacted (None: they are not)."""

    log_start: Mapping[str, int] = field(default_factory=dict)
    record_keys: int | None = None

    @classmethod
    def of_run(cls, config: Mapping[str, Any], summary: Mapping[str, Any]) -> Cleanup:
        """From a run's ``config.json`` (``queue.cleanup_policy``,
        ``retention_ms``, ``retention_bytes``, ``record_keys``) and
        ``summary.json`` (``final_polls.log_start``); a run written before
        these fields is a plain topic's: no cleanup."""
        queue = config.get("queue")
        if not isinstance(queue, Mapping):
            return cls()
        policy = str(queue.get("cleanup_policy") or "delete").split(",")
        limits = (queue.get("retention_ms"), queue.get("retention_bytes"))
        retains = "delete" in policy and any(isinstance(v, int) and v >= 0 for v in limits)
        log_start: dict[str, int] = {}
        polls = summary.get("final_polls")
        starts = polls.get("log_start") if isinstance(polls, Mapping) else None
        if retains and isinstance(starts, Mapping):
            for k, v in starts.items():
                if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                    raise ValueError(f"final_polls.log_start[{k!r}] is an offset, got {v!r}")
                log_start[str(k)] = v
        record_keys: int | None = None
        if "compact" in policy:
            n = queue.get("record_keys", 0)
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
                raise ValueError(f"queue.record_keys is an integer >= 0, got {n!r}")
            record_keys = n
        return cls(log_start, record_keys)

    def record_key(self, key: str, value: str) -> str | None:
        """The record key of ``value`` (JSON text) sent to ``key``
        (``history.queue.record_key``); None if not compacted or the value
        is not an integer."""
        if self.record_keys is None:
            return None
        if self.record_keys == 0:
            return key
        v = json.loads(value)
        if not isinstance(v, int) or isinstance(v, bool):
            return None
        return str(v % self.record_keys)

    def latest(self, final: Mapping[str, Mapping[int, set[str]]]) -> dict[tuple[str, str], int]:
        """Per (key, record key), the highest offset the final reads
        returned a record of it at (compaction keeps that record)."""
        out: dict[tuple[str, str], int] = {}
        if self.record_keys is None:
            return out
        for key, at in final.items():
            for offset, values in at.items():
                for v in values:
                    rk = self.record_key(key, v)
                    if rk is not None and offset > out.get((key, rk), -1):
                        out[(key, rk)] = offset
        return out

    def gone(
        self, key: str, offset: int | None, value: str, latest: Mapping[tuple[str, str], int]
    ) -> bool:
        """``value`` (JSON text) at ``offset`` of ``key`` may be legitimately
        absent: below the log start, or superseded (``latest``: from
        :meth:`latest`)."""
        if offset is None:
            return False
        if offset < self.log_start.get(key, 0):
            return True
        rk = self.record_key(key, value)
        return rk is not None and offset < latest.get((key, rk), -1)


NO_CLEANUP: Final = Cleanup()
"""A plain topic's: every record stays."""


def _j(v: Any) -> str:
    """A value's canonical JSON text: how values are compared and ordered."""
    return json.dumps(v, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


# -- reading the history -------------------------------------------------------


def pair_queue(ops: Iterable[Op]) -> list[QueueOp]:
    """The client ops of ``ops`` (nemesis ops left out), invoke and completion
    paired per process, in completion order.  An invoke never completed is
    left out (a well-formed history has none)."""
    open_: dict[int | str, Op] = {}
    out: list[QueueOp] = []
    for op in ops:
        if op.process == NEMESIS:
            continue
        if op.type == "invoke":
            open_[op.process] = op
            continue
        inv = open_.pop(op.process, None)
        if inv is None:
            raise ValueError(f"op {op.index}: a {op.type} of process {op.process!r} with no invoke")
        value = op.value if op.value is not None else inv.value
        out.append(QueueOp(inv.index, op.index, op.process, op.f, op.type, value))
    return out


def _mops(op: QueueOp) -> list[Any]:
    v = op.value
    if not isinstance(v, list):
        raise ValueError(f"op {op.index}: a {op.f}'s value is a list of micro-ops, got {v!r}")
    return v


def send_rows(op: QueueOp) -> list[SendRow]:
    """The sends of a ``send`` or ``txn`` op, with the offsets its completion gave."""
    if op.f not in ("send", "txn"):
        return []
    out: list[SendRow] = []
    for pos, mop in enumerate(_mops(op)):
        if not (isinstance(mop, list) and mop and mop[0] == "send"):
            continue
        if len(mop) != 3:
            raise ValueError(f"op {op.index}: a send micro-op is [send, k, v], got {mop!r}")
        _, k, v = mop
        offset: int | None = None
        if isinstance(v, list) and len(v) == 2:
            offset, v = v
            if offset is not None and not (isinstance(offset, int) and offset >= 0):
                raise ValueError(
                    f"op {op.index}: a send's offset is an integer >= 0, got {offset!r}"
                )
        out.append(SendRow(op.index, op.process, op.type, str(k), pos, offset, v))
    return out


def read_rows(op: QueueOp) -> list[ReadRow]:
    """The records a ``poll`` or ``txn`` op returned, per key in read order."""
    if op.f not in ("poll", "txn"):
        return []
    out: list[ReadRow] = []
    # A txn may poll more than once: a key's records are numbered across
    # its polls, in the order they were returned.
    count: dict[str, int] = defaultdict(int)
    for mop in _mops(op):
        if not (isinstance(mop, list) and mop and mop[0] == "poll") or len(mop) < 2:
            continue
        reads = mop[1]
        if reads is None:
            continue
        if not isinstance(reads, dict):
            raise ValueError(
                f"op {op.index}: a poll returns {{k: [[offset, v], ...]}}, got {reads!r}"
            )
        for k, pairs in reads.items():
            for pair in pairs:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise ValueError(f"op {op.index}: a polled record is [offset, v], got {pair!r}")
                pos = count[str(k)]
                count[str(k)] += 1
                out.append(ReadRow(op.index, op.process, op.type, str(k), pos, pair[0], pair[1]))
    return out


def assigned_keys(op: QueueOp) -> tuple[set[str], bool]:
    """The keys an ``assign`` or ``subscribe`` names (``{"keys": [k, ...],
    "seek_to_beginning": b}``, or Jepsen's ``[k, ...]``) and whether it
    seeks to the beginning."""
    v = op.value
    seek = False
    if isinstance(v, dict):
        seek = v.get("seek_to_beginning") is True
        v = v.get("keys")
    if not isinstance(v, list):
        raise ValueError(f"op {op.index}: an {op.f}'s value names its keys, got {op.value!r}")
    return {str(k) for k in v}, seek


def final_from(ops: Sequence[QueueOp], history_tail: Sequence[Op] | None = None) -> int | None:
    """The invoke index from which the final reads start: the longest run of
    final-read ops (:data:`FINAL_FS`) that ends the history, as Jepsen's
    ``plot-unseen!`` finds the final polls; ``None`` if it holds no ok poll.

    ``history_tail`` is the raw history: a nemesis op inside the tail ends
    it (reads before the final heal are not final)."""
    events: list[tuple[int, bool]] = [(o.complete, o.f in FINAL_FS) for o in ops]
    events += [(o.index, o.f in FINAL_FS) for o in ops]
    if history_tail is not None:
        events += [(o.index, False) for o in history_tail if o.process == NEMESIS]
    events.sort()
    start: int | None = None
    for index, final in reversed(events):
        if not final:
            break
        start = index
    if start is None:
        return None
    if not any(o.f == "poll" and o.type == "ok" and o.index >= start for o in ops):
        return None
    return start


# -- the checks ------------------------------------------------------------------


@dataclass(slots=True)
class _Order:
    """One key's version order: offset -> values, and the dense indexes."""

    log: dict[int, set[str]] = field(default_factory=dict)
    ops: dict[int, set[int]] = field(default_factory=dict)
    value_ops: dict[str, set[int]] = field(default_factory=dict)
    index_of_offset: dict[int, int] = field(default_factory=dict)
    by_index: list[str] = field(default_factory=list)
    by_value: dict[str, int] = field(default_factory=dict)
    first_index: dict[str, int] = field(default_factory=dict)
    last_index: dict[str, int] = field(default_factory=dict)
    offsets: list[int] = field(default_factory=list)

    def add(self, offset: int, value: str, op: int) -> None:
        self.log.setdefault(offset, set()).add(value)
        self.ops.setdefault(offset, set()).add(op)
        self.value_ops.setdefault(value, set()).add(op)

    def build(self) -> None:
        self.offsets = sorted(self.log)
        for i, offset in enumerate(self.offsets):
            self.index_of_offset[offset] = i
            values = sorted(self.log[offset])
            # Jepsen's by-index takes one value per offset, and by-value
            # maps it to its index (the last one, if it recurs); with several
            # values at an offset, kq takes the least (in JSON text order)
            # so that every checker picks the same one.
            self.by_index.append(values[0])
            self.by_value[values[0]] = i
            for v in values:
                self.first_index.setdefault(v, i)
                self.last_index[v] = i

    def delta(self, v1: str, v2: str) -> int:
        i1, i2 = self.by_value.get(v1), self.by_value.get(v2)
        return i2 - i1 if i1 is not None and i2 is not None else 1

    def skipped(self, v1: str, v2: str) -> list[str]:
        return self.by_index[self.by_value[v1] + 1 : self.by_value[v2]]

    def offset_of(self, v: str) -> int | None:
        """The offset of ``v``'s first place in the version order."""
        i = self.first_index.get(v)
        return None if i is None else self.offsets[i]


def check_queue(
    history: Sequence[Op],
    *,
    final_index: int | None | bool = True,
    cleanup: Cleanup = NO_CLEANUP,
    isolation: str = "read_uncommitted",
) -> QueueResult:
    """Every queue check over ``history`` (a queue history's ops, in order).

    ``final_index``: the invoke index from which polls are final reads;
    True (default) finds them as :func:`final_from` does; None: no final reads.
    ``cleanup``: what the topics may remove (module docstring).
    ``isolation``: the run's ``queue.isolation_level``
    (``history.queue.isolation_level``).
    """
    if isolation not in ("read_uncommitted", "read_committed"):
        raise ValueError(f"isolation is read_uncommitted or read_committed, got {isolation!r}")
    committed_reads = isolation == "read_committed"
    ops = pair_queue(history)
    if final_index is True:
        final_start = final_from(ops, history)
    elif final_index is False:
        final_start = None
    else:
        final_start = final_index
    sends = [r for o in ops for r in send_rows(o)]
    reads = [r for o in ops for r in read_rows(o)]
    txns = {o.index for o in ops if o.f == "txn"}

    # Jepsen's reads-by-type :ok and writer-of.
    ok_read: dict[str, set[str]] = defaultdict(set)
    for r in reads:
        if r.type == "ok":
            ok_read[r.key].add(_j(r.value))
    # The writer of a value: its first send (by invoke index; values are unique).
    writer: dict[tuple[str, str], SendRow] = {}
    for s in sorted(sends, key=lambda s: (s.op, s.pos)):
        writer.setdefault((s.key, _j(s.value)), s)

    # must-have-committed?: ok, or info with a value read by an ok poll.
    committed: set[int] = {o.index for o in ops if o.type == "ok" and o.f in ("send", "txn")}
    for s in sends:
        if s.type == "info" and _j(s.value) in ok_read[s.key]:
            committed.add(s.op)

    orders: dict[str, _Order] = defaultdict(_Order)
    for s in sends:
        if s.op in committed and s.offset is not None:
            orders[s.key].add(s.offset, _j(s.value), s.op)
    for r in reads:
        if r.offset is not None:
            orders[r.key].add(r.offset, _j(r.value), r.op)
    for order in orders.values():
        order.build()

    # The final reads (no-loss reads them; compaction's latest records too).
    final: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    final_values: dict[str, set[str]] = defaultdict(set)
    seen_any: dict[str, set[str]] = defaultdict(set)
    for r in reads:
        seen_any[r.key].add(_j(r.value))
        if (
            final_start is not None
            and r.type == "ok"
            and r.op >= final_start
            and r.offset is not None
        ):
            final[r.key][r.offset].add(_j(r.value))
            final_values[r.key].add(_j(r.value))
    latest = cleanup.latest(final)
    # The values of the version orders that retention or compaction may have
    # removed (each at its first offset there).
    gone: dict[str, set[str]] = {
        key: {v for v in order.first_index if cleanup.gone(key, order.offset_of(v), v, latest)}
        for key, order in orders.items()
    }

    def live(key: str, values: Sequence[str]) -> list[str]:
        return [v for v in values if v not in gone.get(key, ())]

    found: dict[str, list[QueueAnomaly]] = {c: [] for c in CHECKS}

    def add(
        check: str,
        key: str,
        values: Sequence[str],
        offsets: Iterable[int],
        op_ids: Iterable[int],
        message: str,
    ) -> None:
        found[check].append(
            QueueAnomaly(
                check,
                key,
                tuple(json.loads(v) for v in values),
                tuple(offsets),
                tuple(op_ids),
                message,
            )
        )

    # inconsistent-offsets and duplicate, from the version orders.
    for key in sorted(orders):
        order = orders[key]
        for offset in sorted(order.log):
            values = sorted(order.log[offset])
            if len(values) > 1:
                add(
                    "inconsistent-offsets",
                    key,
                    values,
                    [offset],
                    sorted(order.ops[offset]),
                    f"key {key} offset {offset} holds {len(values)} values: {', '.join(values)}",
                )
        at: dict[str, list[int]] = defaultdict(list)
        for offset in sorted(order.log):
            for v in order.log[offset]:
                at[v].append(offset)
        for v in sorted(at):
            if len(at[v]) > 1:
                add(
                    "duplicate",
                    key,
                    [v],
                    at[v],
                    sorted(order.value_ops[v]),
                    f"key {key} value {v} is at {len(at[v])} offsets: {at[v]}",
                )

    # G1a: an ok poll read a value whose send failed.  An aborted
    # transaction's records are in the log, marked aborted: only a consumer
    # reading committed records must never see them.
    for r in sorted(reads, key=lambda r: (r.op, r.key, r.pos)):
        w = writer.get((r.key, _j(r.value)))
        if (
            r.type == "ok"
            and w is not None
            and w.type == "fail"
            and (committed_reads or w.op not in txns)
        ):
            add(
                "G1a",
                r.key,
                [_j(r.value)],
                [] if r.offset is None else [r.offset],
                [w.op, r.op],
                f"poll {r.op} read {_j(r.value)} of key {r.key}, whose send {w.op} failed",
            )

    # precommitted-read (Jepsen's precommitted-read-cases): an op polled a
    # value it sent itself, whatever its outcome.
    own: dict[tuple[int, str], set[str]] = defaultdict(set)
    for s in sends:
        own[(s.op, s.key)].add(_j(s.value))
    at_read: dict[tuple[int, str, str], set[int]] = defaultdict(set)
    for r in reads:
        if _j(r.value) in own.get((r.op, r.key), ()):
            at_read[(r.op, r.key, _j(r.value))].update(() if r.offset is None else (r.offset,))
    for (op_id, key, v), offs in sorted(at_read.items()):
        add(
            "precommitted-read",
            key,
            [v],
            sorted(offs),
            [op_id],
            f"op {op_id} polled {v} of key {key}, which it sent itself before committing",
        )

    # lost-write (Jepsen's lost-write-cases).
    for key in sorted(ok_read):
        if key not in orders:
            continue
        order = orders[key]
        firsts = [order.first_index[v] for v in ok_read[key] if v in order.first_index]
        bound = max(firsts, default=-1)
        must = sorted(
            (v for v, i in order.last_index.items() if i <= bound),
            key=lambda v: (order.last_index[v], v),
        )
        for v in must:
            if v in ok_read[key] or v in gone[key]:
                continue
            w = writer.get((key, v))
            if w is None or w.op not in committed:
                continue
            offset = sorted(order.log)[order.first_index[v]]
            bound_offset = sorted(order.log)[bound]
            add(
                "lost-write",
                key,
                [v],
                [offset, bound_offset],
                [w.op],
                f"key {key} value {v} (offset {offset}, sent by op {w.op}) was never read by an "
                f"ok poll, though offset {bound_offset} past it was",
            )

    # unseen: sent by an ok send, read by no ok poll.
    for s in sorted(sends, key=lambda s: (s.key, s.op, s.pos)):
        if (
            s.type == "ok"
            and _j(s.value) not in ok_read[s.key]
            and _j(s.value) not in gone.get(s.key, ())
        ):
            add(
                "unseen",
                s.key,
                [_j(s.value)],
                [] if s.offset is None else [s.offset],
                [s.op],
                f"key {s.key} value {_j(s.value)} (sent ok by op {s.op}) was never polled",
            )

    # Per process, in completion order: poll-skip, nonmonotonic-poll and
    # nonmonotonic-send (an ok or info assign/subscribe keeps the last read
    # and sent only of the keys it names).
    reads_of: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in sorted(reads, key=lambda r: (r.op, r.key, r.pos)):
        reads_of[r.op][r.key].append(_j(r.value))
    sends_of: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for s in sorted(sends, key=lambda s: (s.op, s.pos)):
        sends_of[s.op][s.key].append(_j(s.value))
    by_process: dict[int | str, list[QueueOp]] = defaultdict(list)
    for o in ops:
        by_process[o.process].append(o)
    for process in sorted(by_process, key=str):
        last_read: dict[str, int] = {}
        last_sent: dict[str, int] = {}
        for o in by_process[process]:
            if o.f in ("assign", "subscribe"):
                if o.type != "fail":
                    keep, seek = assigned_keys(o)
                    # A consumer sent back to the beginning reads its keys
                    # again: where it left off no longer binds (kq's
                    # assign may seek; Jepsen's seeks only after a crash).
                    last_read = {k: v for k, v in last_read.items() if k in keep and not seek}
                    last_sent = {k: v for k, v in last_sent.items() if k in keep}
                continue
            for key, vs in sorted(reads_of.get(o.index, {}).items()):
                prev = last_read.get(key)
                if prev is None or key not in orders:
                    continue
                v, v2 = reads_of[prev][key][-1], vs[0]
                order = orders[key]
                d = order.delta(v, v2)
                skipped = live(key, order.skipped(v, v2)) if d > 1 else []
                if skipped:
                    add(
                        "poll-skip",
                        key,
                        [v, v2],
                        [],
                        [prev, o.index],
                        f"process {process} polled {v} then {v2} of key {key}, skipping "
                        f"{d - 1} record(s): {', '.join(skipped)}",
                    )
                elif d < 1:
                    add(
                        "nonmonotonic-poll",
                        key,
                        [v, v2],
                        [],
                        [prev, o.index],
                        f"process {process} polled {v} then {v2} of key {key}: "
                        f"back {1 - d} record(s)",
                    )
            if o.type == "ok":
                for key in reads_of.get(o.index, {}):
                    last_read[key] = o.index
            if o.f in ("send", "txn") and o.type in ("ok", "info"):
                for key, vs in sorted(sends_of.get(o.index, {}).items()):
                    prev = last_sent.get(key)
                    if prev is not None and key in orders:
                        v, v2 = sends_of[prev][key][-1], vs[0]
                        d = orders[key].delta(v, v2)
                        if d < 1:
                            add(
                                "nonmonotonic-send",
                                key,
                                [v, v2],
                                [],
                                [prev, o.index],
                                f"process {process} sent {v} then {v2} to key {key}, "
                                f"{v2} sits {1 - d} record(s) before",
                            )
                    last_sent[key] = o.index

    # Inside one op: int-poll-skip, int-nonmonotonic-poll, int-send-skip,
    # int-nonmonotonic-send.
    for o in ops:
        for kind, per_key in (
            ("poll", reads_of.get(o.index, {})),
            ("send", sends_of.get(o.index, {})),
        ):
            if kind == "send" and o.f not in ("send", "txn"):
                continue
            for key, vs in sorted(per_key.items()):
                if key not in orders:
                    continue
                order = orders[key]
                for v, v2 in zip(vs, vs[1:], strict=False):
                    d = order.delta(v, v2)
                    skipped = live(key, order.skipped(v, v2)) if d > 1 else []
                    # A send's skip is Jepsen's (allowed) int-send-skip: the
                    # values between are other producers', never removed.
                    if kind == "send" and d > 1:
                        skipped = order.skipped(v, v2)
                    if skipped:
                        add(
                            f"int-{kind}-skip",
                            key,
                            [v, v2],
                            [],
                            [o.index],
                            f"op {o.index} {kind}s {v} then {v2} of key {key}, skipping "
                            f"{d - 1} record(s): {', '.join(skipped)}",
                        )
                    elif d < 1:
                        add(
                            f"int-nonmonotonic-{kind}",
                            key,
                            [v, v2],
                            [],
                            [o.index],
                            f"op {o.index} {kind}s {v} then {v2} of key {key}: "
                            f"back {1 - d} record(s)",
                        )

    # Elle's cycles over the transactions of a history with txn ops.
    edges: list[Edge] = []
    if txns:
        edges = _cycle_edges(orders, reads, writer, committed)
        for c in find_cycles(edges):
            _add_cycle(add, c)

    # no-loss: every ok send, and every record of an info send that was
    # acknowledged with an offset or that some poll saw, is in the final
    # reads at its acknowledged offset with its value, unless retention or
    # compaction removed it.  A transaction's records are required when it
    # committed (ok), or must have (info, a value of it read by an ok op):
    # an info one may have been aborted, its records acknowledged or not.
    def op_kind(op_id: int) -> str:
        return "txn" if op_id in txns else "send"

    if final_start is not None:
        for s in sorted(sends, key=lambda s: (s.key, s.op, s.pos)):
            # An info send's records are required one by one (they may have
            # gone in separate batches): one that came back with its offset
            # was acknowledged (history format: an offset only for a record
            # known written), one that a poll saw was written.
            seen = _j(s.value) in seen_any[s.key]
            if s.op in txns:
                if not (s.type == "ok" or (s.type == "info" and s.op in committed)):
                    continue
            elif not (s.type == "ok" or (s.type == "info" and (s.offset is not None or seen))):
                continue
            v = _j(s.value)
            placed = s.offset if s.offset is not None else orders[s.key].offset_of(v)
            if cleanup.gone(s.key, placed, v, latest):
                continue
            if s.offset is None:
                if v not in final_values[s.key]:
                    add(
                        "no-loss",
                        s.key,
                        [v],
                        [],
                        [s.op],
                        f"key {s.key} value {v} ({s.type} {op_kind(s.op)} {s.op}) is not in the "
                        "final reads",
                    )
                continue
            there = final[s.key].get(s.offset, set())
            if v in there:
                continue
            what = f"holds {', '.join(sorted(there))}" if there else "was not read"
            add(
                "no-loss",
                s.key,
                [v],
                [s.offset],
                [s.op],
                f"key {s.key} value {v} ({s.type} {op_kind(s.op)} {s.op}, offset {s.offset}) "
                f"is not in the final reads: offset {s.offset} {what}",
            )

    # torn-transaction: with read_committed final reads, an ok or info
    # transaction some of whose records are in the final reads and others
    # not, where the final reads reached them and nothing removed them.
    if final_start is not None and committed_reads:
        top_final = {k: max(at) for k, at in final.items() if at}
        of_txn: dict[int, list[SendRow]] = defaultdict(list)
        for s in sends:
            if s.op in txns and s.type in ("ok", "info"):
                of_txn[s.op].append(s)
        for op_id in sorted(of_txn):
            judged: list[tuple[SendRow, bool]] = []
            for s in sorted(of_txn[op_id], key=lambda s: s.pos):
                v = _j(s.value)
                if v in final_values[s.key]:
                    judged.append((s, True))
                    continue
                known = orders.get(s.key)
                placed = s.offset
                if placed is None and known is not None:
                    placed = known.offset_of(v)
                if cleanup.gone(s.key, placed, v, latest):
                    continue
                # Reached: the final reads returned the key up to its
                # acknowledged offset, or, without one, up to the highest
                # offset the history knows of the key.
                reach = s.offset
                if reach is None:
                    reach = known.offsets[-1] if known is not None and known.offsets else 0
                if top_final.get(s.key, -1) >= reach:
                    judged.append((s, False))
            states = {there for _, there in judged}
            if states != {True, False}:
                continue
            txn_type = judged[0][0].type
            witness = [
                _j({"key": s.key, "present": there, "value": s.value}) for s, there in judged
            ]
            gone_list = ", ".join(f"{_j(s.value)} (key {s.key})" for s, t in judged if not t)
            kept_list = ", ".join(f"{_j(s.value)} (key {s.key})" for s, t in judged if t)
            add(
                "torn-transaction",
                ",".join(sorted({s.key for s, _ in judged})),
                witness,
                [],
                [op_id],
                f"{txn_type} txn {op_id}: {kept_list} in the final reads, {gone_list} not",
            )

    subscribed = any(o.f == "subscribe" for o in ops)
    allowed = ALWAYS_ALLOWED | (SUBSCRIBE_ALLOWED if subscribed else frozenset())
    if not committed_reads:
        allowed |= READ_UNCOMMITTED_ALLOWED
    detail = {
        "ops": len(ops),
        "keys": len(orders),
        "sends": len(sends),
        "reads": len(reads),
        "final_from": final_start,
        "isolation": isolation,
        "transactions": len(txns),
        "edges": len(edges),
    }
    return QueueResult(
        {c: tuple(v) for c, v in found.items()}, allowed, final_start is not None, detail
    )


def _cycle_edges(
    orders: Mapping[str, _Order],
    reads: Sequence[ReadRow],
    writer: Mapping[tuple[str, str], SendRow],
    committed: set[int],
) -> list[Edge]:
    """The dependency graph of Jepsen's Kafka analysis between the ops that
    committed or must have (``committed``): ``ww`` from the writer of each
    value of a key's version order to the writer of the next one, when the
    two differ; ``wr`` from the writer of each value an ok op (or an info op
    that must have committed) polled to that op, when the two differ."""
    out: list[Edge] = []
    for key in sorted(orders):
        order = orders[key]
        for v1, v2 in zip(order.by_index, order.by_index[1:], strict=False):
            w1, w2 = writer.get((key, v1)), writer.get((key, v2))
            if (
                w1 is not None
                and w2 is not None
                and w1.op != w2.op
                and w1.op in committed
                and w2.op in committed
            ):
                out.append(Edge("ww", key, (v1, v2), w1.op, w2.op))
    for r in reads:
        if not (r.type == "ok" or r.op in committed):
            continue
        v = _j(r.value)
        w = writer.get((r.key, v))
        if w is not None and w.op != r.op and w.op in committed:
            out.append(Edge("wr", r.key, (v,), w.op, r.op))
    return out


def _add_cycle(add: Any, c: Cycle) -> None:
    """One cycle as an anomaly: its keys (comma-separated), its edges as
    values (``{"from", "to", "type", "key", "values"}``), its ops in order."""
    edges = [
        _j(
            {
                "from": e.src,
                "key": e.key,
                "to": e.dst,
                "type": e.kind,
                "values": [json.loads(v) for v in e.values],
            }
        )
        for e in c.edges
    ]
    steps = "; ".join(
        f"{e.src} {e.kind} {e.dst} (key {e.key}: {' then '.join(e.values)})" for e in c.edges
    )
    add(
        c.check,
        ",".join(sorted({e.key for e in c.edges})),
        edges,
        [],
        list(c.ops),
        f"ops {' -> '.join(str(o) for o in (*c.ops, c.ops[0]))}: {steps}",
    )

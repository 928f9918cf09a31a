"""Queue histories written for the tests: a builder, and a simulated correct log.

Shared by the reference checks' tests and the Spark job's tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from history.ops import SAME, HistoryRecorder, Op


class Queue:
    """Writes a queue history op by op (each op's invoke then its completion)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        tick = itertools.count()
        self.rec = HistoryRecorder(lambda: next(tick), self.ops.append, start_ns=0)

    def send(
        self,
        process: int,
        records: Sequence[tuple[Any, Any, int | None]],
        type: str = "ok",
        *,
        error: str = "timeout",
        acked: bool = False,
    ) -> int:
        """A send of ``(key, value, offset)`` records; returns its invoke index.
        An ``info`` or ``fail`` repeats the invoke's micro-ops unless
        ``acked`` (then each record carries its offset, null if unknown)."""
        inv = self.rec.invoke(process, "send", value=[["send", k, v] for k, v, _ in records])
        done = [["send", k, [o, v]] for k, v, o in records]
        if type == "ok":
            self.rec.ok(process, value=done)
        elif type == "info":
            self.rec.info(process, error, value=done if acked else SAME)
        else:
            self.rec.fail(process, error, value=done if acked else SAME)
        return inv.index

    def poll(
        self,
        process: int,
        reads: Mapping[str, Sequence[tuple[int, Any]]],
        type: str = "ok",
        *,
        assigned: Mapping[str, tuple[int, int]] | None = None,
        revoked: Sequence[int] | None = None,
    ) -> int:
        """A poll; an ok one may carry the group's ``assigned`` (key ->
        (start, time)) and ``revoked`` keys."""
        inv = self.rec.invoke(process, "poll", value=[["poll"]])
        if type == "ok":
            self.rec.ok(
                process,
                value=[["poll", {k: [[o, v] for o, v in rs] for k, rs in reads.items()}]],
                assigned=(
                    None if assigned is None else {k: [s, t] for k, (s, t) in assigned.items()}
                ),
                revoked=None if revoked is None else list(revoked),
            )
        elif type == "info":
            self.rec.info(process, "timeout")
        else:
            self.rec.fail(process, "timeout")
        return inv.index

    def txn(
        self,
        process: int,
        mops: Sequence[tuple[Any, ...]],
        type: str = "ok",
        *,
        error: str = "timeout",
        acked: bool = False,
    ) -> int:
        """A transaction of micro-ops ``("send", key, value, offset)`` and
        ``("poll", {key: [(offset, value), ...]})``; returns its invoke index.
        An ``info`` or ``fail`` repeats the invoke's micro-ops unless
        ``acked`` (then it carries what it learned: offsets, a fail's null)."""
        invoke: list[list[Any]] = []
        done: list[list[Any]] = []
        for m in mops:
            if m[0] == "send":
                _, k, v, o = m
                invoke.append(["send", k, v])
                done.append(["send", k, [None if type == "fail" else o, v]])
            else:
                invoke.append(["poll"])
                done.append(["poll", {k: [[o, v] for o, v in rs] for k, rs in m[1].items()}])
        inv = self.rec.invoke(process, "txn", value=invoke)
        if type == "ok":
            self.rec.ok(process, value=done)
        elif type == "info":
            self.rec.info(process, error, value=done if acked else SAME)
        else:
            self.rec.fail(process, error, value=done if acked else SAME)
        return inv.index

    def assign(
        self, process: int, keys: Sequence[str], f: str = "assign", *, seek: bool = False
    ) -> int:
        value: dict[str, Any] = {"keys": list(keys)}
        if f == "assign":
            value["seek_to_beginning"] = seek
        inv = self.rec.invoke(process, f, value=value)
        self.rec.ok(process)
        return inv.index

    def commit(
        self, process: int, offsets: Mapping[str, int], type: str = "ok", *, error: str = "timeout"
    ) -> int:
        """A commit of ``offsets`` (key -> the next offset to read); returns
        its invoke index (its invoke's time is that index too)."""
        inv = self.rec.invoke(process, "commit", value=[["commit", dict(offsets)]])
        if type == "ok":
            self.rec.ok(process)
        elif type == "info":
            self.rec.info(process, error)
        else:
            self.rec.fail(process, error)
        return inv.index

    @property
    def now(self) -> int:
        """The time the next op will be recorded at (one tick per op)."""
        return len(self.ops)

    def crash(self, process: int) -> int:
        inv = self.rec.invoke(process, "crash", value=None)
        self.rec.info(process, "crash")
        return inv.index

    def heal(self) -> None:
        self.rec.invoke("nemesis", "partition", value={"nodes": [1]})
        self.rec.ok("nemesis", value={"nodes": [1]})
        self.rec.invoke("nemesis", "heal", value={})
        self.rec.ok("nemesis", value={})


@dataclass
class SimLog:
    """A correct queue, run one op at a time: each key a log, sends given the
    next offset, each process's consumer reading on from where it left off."""

    keys: tuple[str, ...] = ("0", "1", "2")
    workers: int = 3
    q: Queue = field(default_factory=Queue)
    logs: dict[str, list[Any]] = field(default_factory=dict)
    procs: list[int] = field(default_factory=list)
    positions: dict[int, dict[str, int]] = field(default_factory=dict)
    next_value: int = 0

    def __post_init__(self) -> None:
        self.logs = {k: [] for k in self.keys}
        self.procs = list(range(self.workers))

    def retire(self, w: int) -> None:
        self.procs[w] += self.workers

    def step_send(self, w: int, key: str, outcome: str, applied: bool) -> None:
        """``outcome`` ok (applied), fail (not applied), info (``applied`` or not)."""
        p = self.procs[w]
        v = self.next_value
        self.next_value += 1
        if outcome == "ok" or (outcome == "info" and applied):
            self.logs[key].append(v)
        self.q.send(p, [(key, v, len(self.logs[key]) - 1)], outcome)
        if outcome == "info":
            self.retire(w)

    def step_poll(self, w: int, counts: Mapping[str, int]) -> None:
        p = self.procs[w]
        pos = self.positions.setdefault(p, dict.fromkeys(self.keys, 0))
        self.q.poll(p, self._read(pos, counts))

    def step_txn(
        self, w: int, plan: Sequence[tuple[Any, ...]], outcome: str, applied: bool
    ) -> None:
        """A transaction read_committed: ``plan`` of ``("send", key)`` and
        ``("poll", {key: count})``, run at once.  Its polls read committed
        records only; its sends take offsets as they go and, with the
        commit's or abort's marker after them in each key they wrote, are
        visible once it commits (``ok``, or ``info`` and ``applied``); an
        aborted one's records keep their offsets, never read."""
        p = self.procs[w]
        pos = self.positions.setdefault(p, dict.fromkeys(self.keys, 0))
        mops: list[tuple[Any, ...]] = []
        mine: list[tuple[str, int]] = []
        for m in plan:
            if m[0] == "send":
                v = self.next_value
                self.next_value += 1
                self.logs[m[1]].append(_Pending(v))
                mine.append((m[1], len(self.logs[m[1]]) - 1))
                mops.append(("send", m[1], v, len(self.logs[m[1]]) - 1))
            else:
                mops.append(("poll", self._read(pos, m[1])))
        commits = outcome == "ok" or (outcome == "info" and applied)
        for k, o in mine:
            entry = self.logs[k][o]
            self.logs[k][o] = entry.value if commits else _ABORTED
        for k in sorted({k for k, _ in mine}):
            self.logs[k].append(_ABORTED)  # the transaction's marker
        self.q.txn(p, mops, outcome, acked=outcome == "info")
        if outcome == "info":
            self.retire(w)

    def _read(self, pos: dict[str, int], counts: Mapping[str, int]) -> dict[str, Any]:
        """Up to ``counts`` committed records of each key from ``pos`` on,
        stopping at a record not yet committed (the last stable offset)."""
        reads: dict[str, list[tuple[int, Any]]] = {}
        for k in self.keys:
            got: list[tuple[int, Any]] = []
            log = self.logs[k]
            while pos[k] < len(log) and len(got) < counts.get(k, 0):
                entry = log[pos[k]]
                if isinstance(entry, _Pending):
                    break
                if entry is not _ABORTED:
                    got.append((pos[k], entry))
                pos[k] += 1
            if got:
                reads[k] = got
        return reads

    def step_crash(self, w: int) -> None:
        self.q.crash(self.procs[w])
        self.retire(w)

    def final_reads(self) -> None:
        """After the heal: a fresh consumer per worker assigns every key and
        reads each from the beginning."""
        self.q.heal()
        for w in range(self.workers):
            self.step_crash(w)
            p = self.procs[w]
            self.q.assign(p, list(self.keys), seek=True)
            self.positions[p] = dict.fromkeys(self.keys, 0)
            self.step_poll(w, {k: len(self.logs[k]) for k in self.keys})


@dataclass(frozen=True, slots=True)
class _Pending:
    """A transaction's record not yet committed or aborted."""

    value: Any


_ABORTED: Any = object()
"""An aborted record, or a transaction's marker: an offset no poll returns."""

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
        records: Sequence[tuple[str, Any, int | None]],
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
        reads: dict[str, list[tuple[int, Any]]] = {}
        for k in self.keys:
            end = min(len(self.logs[k]), pos[k] + counts.get(k, 0))
            if end > pos[k]:
                reads[k] = [(o, self.logs[k][o]) for o in range(pos[k], end)]
                pos[k] = end
        self.q.poll(p, reads)

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

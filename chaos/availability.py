"""How long a run's clients went without an answer while no lasting fault
was in force (pure: reads a history, no clock).

A fault that lasts (``kill``, ``pause``, ``partition``, ``packet``:
:data:`history.ops.NEMESIS_ENDS`) is in force from its invoke until the
``ok`` completion of the op that ends it; an instant nemesis action
(``rotate-certs``, ``heal``) leaves nothing in force.  Outside those
intervals the cluster is whole, so a stretch without any ``ok`` client
completion is unavailability that only the instant actions (a certificate
rotation) or the cluster itself can explain.  :func:`longest_outage` finds
the longest such stretch; the chaos tests bound it by one election.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from history.ops import NEMESIS, NEMESIS_ENDS, Op

__all__ = ["Outage", "fault_intervals", "longest_outage"]


@dataclass(frozen=True, slots=True)
class Outage:
    """``start_ns`` to ``end_ns`` (history times) without an ``ok`` client
    completion, no lasting fault in force; ``instant`` counts the instant
    nemesis actions (by ``f``) invoked within it."""

    start_ns: int
    end_ns: int
    instant: tuple[tuple[str, int], ...] = ()

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def fault_intervals(ops: Sequence[Op]) -> list[tuple[int, int]]:
    """When lasting faults were in force: from a fault's invoke to the
    ``ok`` completion of its end (per node for kill/pause, any heal for a
    partition or packet fault); merged, sorted.  A fault whose own
    completion is ``fail`` never was in force; one never ended lasts to the
    history's end."""
    end_of_time = max((op.time for op in ops), default=0)
    open_at: dict[tuple[str, int | None], int] = {}
    pending: list[tuple[str, int | None]] = []  # the targets of the fault in flight
    out: list[tuple[int, int]] = []
    for op in ops:
        if op.process != NEMESIS:
            continue
        value = op.value if isinstance(op.value, dict) else {}
        nodes = [int(n) for n in value.get("nodes", ())]
        if op.f in NEMESIS_ENDS:
            if op.type == "invoke":
                pending = [(op.f, n) for n in nodes] or [(op.f, None)]
                for target in pending:
                    open_at.setdefault(target, op.time)
            elif op.type == "fail":
                for target in pending:
                    open_at.pop(target, None)
        elif op.type == "ok" and op.f in NEMESIS_ENDS.values():
            for (f, n), since in list(open_at.items()):
                if NEMESIS_ENDS[f] == op.f and (op.f == "heal" or n in nodes):
                    out.append((since, op.time))
                    del open_at[(f, n)]
    out += [(since, end_of_time) for since in open_at.values()]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(out):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def longest_outage(ops: Sequence[Op]) -> Outage | None:
    """The longest stretch of the clients' run (from the first client
    invoke to the last client completion) with no ``ok`` client completion
    and no lasting fault in force; None for a history without client ops."""
    clients = [op for op in ops if op.process != NEMESIS]
    if not clients:
        return None
    begin = min(op.time for op in clients if op.type == "invoke")
    finish = max(op.time for op in clients if op.type != "invoke")
    faults = fault_intervals(ops)
    # Every ok completion, and each fault's edges, end or start a stretch.
    marks = sorted(
        {begin, finish}
        | {op.time for op in clients if op.type == "ok" and begin <= op.time <= finish}
        | {t for interval in faults for t in interval if begin <= t <= finish}
    )
    best: tuple[int, int] | None = None
    for a, b in zip(marks, marks[1:], strict=False):
        if any(s <= a and b <= e for s, e in faults):
            continue  # inside a lasting fault
        if best is None or b - a > best[1] - best[0]:
            best = (a, b)
    if best is None:
        return Outage(begin, begin)
    instant: dict[str, int] = {}
    for op in ops:
        if (
            op.process == NEMESIS
            and op.type == "invoke"
            and op.f not in NEMESIS_ENDS
            and best[0] <= op.time <= best[1]
        ):
            instant[op.f] = instant.get(op.f, 0) + 1
    return Outage(best[0], best[1], tuple(sorted(instant.items())))

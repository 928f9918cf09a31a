"""A simulation recorded as a history and node exports (docs/history-format.md).

Each client proposal is a ``write`` of the ``log`` model (key ``"log"``,
value the proposal's records as strings), invoked when the client hands it
to the node it believes leads.  It completes

- ``ok`` with the offset and epoch of its first record once any node
  applies the batch the leader appended,
- ``fail`` (``not-leader``) if that node refused it, or (``superseded``)
  once another batch is applied over its offset: it can never commit,
- ``info`` (``indeterminate``) if neither happened by the end of the run.

Each client process has one proposal in flight; a proposal takes the lowest
free process number.  Faults the schedule makes are nemesis ops (invoke and
``ok`` at the same virtual instant), recorded only when they change
something: ``kill``/``start`` of a node, ``partition`` (isolation too),
``packet`` (loss and duplication), ``heal``, ``resign``.  Every node exports
each record it applies (``log.jsonl``) and each change of its role, epoch or
leader (``changes.jsonl``).  Times are the virtual milliseconds in
nanoseconds.

Recording only observes: it draws no random number and schedules nothing,
so a seed runs the same with or without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from history.exports import Change, LogEntry, record_hash
from history.ops import NEMESIS, HistoryRecorder, Op
from quorum.types import Batch, BatchKind, NodeId

__all__ = ["LOG_KEY", "SimHistory"]

LOG_KEY: Final = "log"
NS_PER_MS: Final = 1_000_000


class SimHistory:
    """Collects one simulated run's history and node exports in memory."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._now_ms: Callable[[], int] = lambda: 0
        self.recorder = HistoryRecorder(self._clock_ns, self.ops.append, start_ns=0)
        self.changes: dict[NodeId, list[Change]] = {}
        self._log: dict[NodeId, list[LogEntry]] = {}
        self._exported: dict[NodeId, dict[int, LogEntry]] = {}
        # (base offset, epoch) of a proposal the leader appended -> process
        self._pending: dict[tuple[int, int], int] = {}
        self._busy: set[int] = set()
        self._node_of: dict[int, NodeId] = {}

    def _clock_ns(self) -> int:
        return self._now_ms() * NS_PER_MS

    def bind(self, now_ms: Callable[[], int], nodes: list[NodeId]) -> None:
        """Take time from the simulation; every node gets (maybe empty) exports."""
        self._now_ms = now_ms
        for node in nodes:
            self.changes.setdefault(node, [])
            self._log.setdefault(node, [])
            self._exported.setdefault(node, {})

    # -- client proposals ----------------------------------------------------

    def invoke_write(self, node: NodeId, records: tuple[bytes, ...]) -> int:
        """A proposal is about to go to ``node``; returns its process."""
        process = 0
        while process in self._busy:
            process += 1
        self._busy.add(process)
        self._node_of[process] = node
        self.recorder.invoke(
            process, "write", key=LOG_KEY, value=[r.decode() for r in records], node=node
        )
        return process

    def refused(self, process: int) -> None:
        self._complete(process, "fail", error="not-leader")

    def appended(self, process: int, offset: int, epoch: int) -> None:
        """The leader appended the proposal at ``offset`` in ``epoch``."""
        self._pending[(offset, epoch)] = process

    def applied(self, node: NodeId, batch: Batch) -> None:
        """``node`` applied a committed batch: export it and settle every
        proposal whose offset it covers."""
        exported = self._exported.setdefault(node, {})
        kind = "data" if batch.kind is BatchKind.DATA else "control"
        for i, record in enumerate(batch.records):
            entry = LogEntry(node, batch.base_offset + i, batch.epoch, kind, record_hash(record))
            if exported.get(entry.offset) != entry:
                exported.setdefault(entry.offset, entry)
                self._log.setdefault(node, []).append(entry)
        covered = [k for k in self._pending if batch.base_offset <= k[0] < batch.end_offset]
        for key in sorted(covered):
            process = self._pending.pop(key)
            if key == (batch.base_offset, batch.epoch):
                self._complete(process, "ok", offset=key[0], epoch=key[1])
            else:
                self._complete(process, "fail", error="superseded")

    def _complete(
        self,
        process: int,
        type: str,
        *,
        error: str | None = None,
        offset: int | None = None,
        epoch: int | None = None,
    ) -> None:
        node = self._node_of.pop(process)
        self._busy.discard(process)
        if type == "ok":
            self.recorder.ok(process, node=node, offset=offset, epoch=epoch)
        elif type == "fail":
            assert error is not None
            self.recorder.fail(process, error, node=node)
        else:
            assert error is not None
            self.recorder.info(process, error, node=node)

    # -- faults and node changes -------------------------------------------------

    def fault_begin(self, f: str, value: dict[str, object]) -> None:
        self.recorder.invoke(NEMESIS, f, value=value)

    def fault_end(self, done: bool = True, error: str = "no-effect") -> None:
        if done:
            self.recorder.ok(NEMESIS)
        else:
            self.recorder.fail(NEMESIS, error)

    def changed(self, node: NodeId, role: str, epoch: int, leader: NodeId | None) -> None:
        self.changes.setdefault(node, []).append(
            Change(node, self._clock_ns(), epoch, leader, role)
        )

    # -- the end -------------------------------------------------------------------

    def finish(self) -> None:
        """The run is over: a proposal still unsettled has an unknown outcome,
        and an op cut short (a violation stopped the run) is closed as info."""
        for _, process in sorted(self._pending.items()):
            self._complete(process, "info", error="indeterminate")
        self._pending.clear()
        for process in sorted(self._node_of):
            self._complete(process, "info", error="run-ended")
        self.recorder.close_open("run-ended")

    def node_logs(self) -> dict[NodeId, list[LogEntry]]:
        """Each node's exported log, ascending by offset."""
        return {n: sorted(entries, key=lambda e: e.offset) for n, entries in self._log.items()}

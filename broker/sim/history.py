"""A broker simulation recorded as a history (docs/history-format.md), in
the shape of Jepsen's queue workload (``brokers.md`` §5.1): one key per
partition (its number as a string), ``send`` and ``poll`` operations.

- ``send``: invoked with the record's value (a string, unique in the run)
  when the producer sends it; ``ok`` with the ``offset`` and leader
  ``epoch`` of its batch (acks=1 or all), ``fail`` when it was refused before
  anything was written (``not-enough-replicas``, no leader), ``info`` when
  the outcome is unknown (a timeout, or ``not-enough-replicas-after-append``,
  ``not-leader-or-follower`` after the append, ``run-ended``).
- ``poll``: a consumer's read of one partition from its position at the
  leader: invoked and completed at the same virtual instant (the read does
  not cross the network), ``ok`` with ``[[offset, value], ...]``, or
  ``fail`` (``unavailable``: no reachable leader).
- Faults are nemesis ops: ``kill`` (``kind`` ``power-loss`` when unsynced
  bytes were lost) and ``start``, ``pause``/``resume``, ``partition``
  (``isolate-one`` with its groups, or ``one-way`` with the cut
  ``[from, to]`` pairs, the controller and clients named so), ``packet``
  (``drop``), ``heal``.

Each send and each poll is its own process (a process's op then never
outlives it, and an ``info`` retires nothing still in use). Times are the
virtual milliseconds in nanoseconds. Recording only observes: a seed runs
the same with or without it.
"""

from __future__ import annotations

from typing import Final

from broker.sim.cluster import Consumed, Outcome, SimCluster
from history.ops import NEMESIS, HistoryRecorder, Op

__all__ = ["QueueHistory"]

NS_PER_MS: Final = 1_000_000
# Consumers' processes start here, after any producer's.
POLL_PROCESS_BASE: Final = 1_000_000


class QueueHistory:
    """Collects one simulated run's send/poll history in memory."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.ops: list[Op] = []
        self.recorder = HistoryRecorder(self._clock_ns, self.ops.append, start_ns=0)
        self._polls = 0
        cluster.recorder = self

    def _clock_ns(self) -> int:
        return self.cluster.now_ms * NS_PER_MS

    def send_invoked(self, outcome: Outcome) -> None:
        self.recorder.invoke(
            outcome.op,
            "send",
            key=str(outcome.partition),
            value=outcome.value,
            node=outcome.node if outcome.node >= 0 else None,
        )

    def send_completed(self, outcome: Outcome) -> None:
        if outcome.status == "ok":
            self.recorder.ok(outcome.op, offset=outcome.offset, epoch=outcome.epoch)
        elif outcome.status == "fail":
            self.recorder.fail(outcome.op, outcome.error or "unknown")
        else:
            self.recorder.info(outcome.op, outcome.error or "unknown")

    def polled(self, p: int, leader: int | None, got: list[Consumed] | None) -> None:
        process = POLL_PROCESS_BASE + self._polls
        self._polls += 1
        self.recorder.invoke(process, "poll", key=str(p), value=None, node=leader)
        if got is None:
            self.recorder.fail(process, "unavailable", node=leader)
        else:
            self.recorder.ok(process, value=[[c.offset, c.value] for c in got], node=leader)

    def nemesis(self, f: str, value: dict[str, object]) -> None:
        self.recorder.invoke(NEMESIS, f, value=value)
        self.recorder.ok(NEMESIS)

    def finish(self) -> list[Op]:
        """Complete what is still in flight as ``info`` and return the ops."""
        self.recorder.close_open()
        return self.ops

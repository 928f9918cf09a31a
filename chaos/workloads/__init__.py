"""Client workloads of the chaos harness: each drives a data model's
operations against a cluster's client addresses and records them as a
history (``docs/history-format.md``).

The runner drives every workload through :class:`Workload`: :meth:`run` for
the main phase, :meth:`final` after the final heal and recovery (the final
reads and the workload's check of them), :meth:`close`, and :attr:`stats`
for progress."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "FinalVerdict",
    "Pacer",
    "Workload",
    "WorkloadStats",
    "error_word",
    "run_workers",
    "sleep_unless_stopped",
]


def error_word(error: str | enum.Enum) -> str:
    """An error as the histories write it: a Kafka error name, or an
    error code by its name, in lower case with dashes (``NOT_ENOUGH_REPLICAS``
    is ``not-enough-replicas``); ``unknown`` for a blank name."""
    name = error if isinstance(error, str) else error.name
    return name.strip().lower().replace("_", "-") or "unknown"


@dataclass
class WorkloadStats:
    """What a run did: invokes and completions by type, and retirements."""

    invokes: int = 0
    completions: dict[str, int] = field(default_factory=lambda: {"ok": 0, "fail": 0, "info": 0})
    retired: int = 0


@dataclass(frozen=True, slots=True)
class FinalVerdict:
    """What a workload's final phase found.  ``event`` is a line for the
    harness log; ``check`` (if any) goes to ``summary.json`` as
    ``final_check``; ``ok`` is false if the check found problems (or could
    not be made)."""

    event: str
    check: dict[str, Any] | None = None
    ok: bool = True


class Workload(Protocol):
    """A workload as the runner drives it."""

    @property
    def stats(self) -> WorkloadStats: ...

    async def run(self, time_limit_s: float) -> object:
        """The main phase; returns when the time is up (ops still in flight
        are left for the recorder's close)."""
        ...

    async def final(self) -> FinalVerdict:
        """After the final heal and recovery: read the final state and check it."""
        ...

    async def close(self) -> None: ...


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, waking early when ``stop`` is set."""
    if seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run_workers(workers: Iterable[Coroutine[Any, Any, object]], timeout_s: float) -> None:
    """Run ``workers`` as tasks for at most ``timeout_s``: those still running
    then are cancelled (an op they had in flight stays in flight for the
    recorder's close), and the first error of one that ended is raised."""
    tasks = [asyncio.create_task(w) for w in workers]
    try:
        done, _ = await asyncio.wait(tasks, timeout=timeout_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in done:
        exc = None if t.cancelled() else t.exception()
        if exc is not None:
            raise exc


class Pacer:
    """The pacing of a workload's main phase, shared by its workers: each
    worker runs its ops after random gaps (uniform, averaging
    ``concurrency / rate`` seconds) until ``time_limit_s`` passed (from now),
    ``op_limit`` ops were started over all workers, or ``stop`` is set.  A
    worker whose next gap would pass the deadline ends then, or with
    ``sleep_out`` sleeps out the rest first."""

    def __init__(
        self,
        stop: asyncio.Event,
        rng: random.Random,
        concurrency: int,
        rate: float,
        time_limit_s: float,
        op_limit: int | None,
        *,
        sleep_out: bool = False,
    ) -> None:
        self._stop = stop
        self._rng = rng
        self._mean_gap = concurrency / rate
        self._left = op_limit
        self._sleep_out = sleep_out
        self.deadline = time.monotonic() + time_limit_s

    async def drive(self, op: Callable[[], Awaitable[object]]) -> None:
        """One worker's main phase: ``op`` again and again, paced."""
        while not self._stop.is_set():
            gap = self._rng.uniform(0, 2 * self._mean_gap)
            left = self.deadline - time.monotonic()
            if gap >= left:
                if self._sleep_out:
                    await sleep_unless_stopped(self._stop, left)
                return
            await sleep_unless_stopped(self._stop, gap)
            if self._stop.is_set() or time.monotonic() >= self.deadline:
                return
            if self._left is not None:
                if self._left <= 0:
                    return
                self._left -= 1
            await op()

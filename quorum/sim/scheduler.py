"""A single-queue discrete-event scheduler on virtual milliseconds."""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["EventScheduler"]


class EventScheduler:
    """Events run in (time, insertion) order; ties keep insertion order, so
    a run depends only on the seed that produced the events."""

    def __init__(self) -> None:
        self.now = 0
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, time_ms: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(time_ms, self.now), self._seq, action))

    def after(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.at(self.now + delay_ms, action)

    def run_next(self) -> bool:
        if not self._queue:
            return False
        time_ms, _, action = heapq.heappop(self._queue)
        self.now = time_ms
        self.events_run += 1
        action()
        return True

    def next_time(self) -> int | None:
        return self._queue[0][0] if self._queue else None

    def run_until(self, time_ms: int, after_each: Callable[[], None] | None = None) -> None:
        while self._queue and self._queue[0][0] <= time_ms:
            self.run_next()
            if after_each is not None:
                after_each()
        self.now = max(self.now, time_ms)

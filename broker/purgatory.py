"""Where delayed requests wait (Kafka's ``DelayedOperationPurgatory``): an
acks=all produce until the ISR has the records, a long-poll fetch until
``min_bytes`` are there, a DeleteRecords until the low watermark reached
its offset. Waiters name the partitions they wait on; whoever
changes a partition (an append, a HW move, a new image) wakes its waiters,
which check again (``DelayedOperation.tryComplete``) and go back to wait
until their deadline.

Each waiter names its :class:`Operation` (Kafka keeps one purgatory per
kind, ``DelayedOperationPurgatory``'s ``delayedOperation`` tag); here they
share the watch lists, since whoever changes a partition wakes every kind,
and are counted apart for the metrics.

Fetch sessions (:mod:`broker.fetch_session`) watch for as long as their
stream lasts rather than per wait: :meth:`Purgatory.watch` gives a
:class:`Watcher` every wake, so that a partition changed while the
follower was not waiting is still read at its next fetch.

One event loop: no locks, every call on the loop's thread but the two
counts the metrics exporter reads from its own thread (:meth:`Purgatory.watched`,
:meth:`Purgatory.delayed`), which count over copies: the loop may add or
remove waiters while they run.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from metadata.image import TopicIdPartition

__all__ = ["Operation", "Purgatory", "Watcher"]

T = TypeVar("T")


class Operation(enum.Enum):
    """What waits (Kafka's purgatory names)."""

    # An acks=all produce waiting for the ISR (DelayedProduce).
    PRODUCE = "Produce"
    # A long-poll fetch waiting for min_bytes (DelayedFetch).
    FETCH = "Fetch"
    # A DeleteRecords waiting for the followers' log starts to reach its
    # offset (DelayedDeleteRecords).
    DELETE_RECORDS = "DeleteRecords"
    # A group coordinator's write waiting for the offsets partition's high
    # watermark (CoordinatorRuntime's deferred events).
    GROUP_WRITE = "GroupWrite"
    # A new group coordinator waiting for the earlier leaders' records to
    # commit before it loads its groups.
    GROUP_LOAD = "GroupLoad"
    # A transaction coordinator's write waiting for its transaction log
    # partition's high watermark.
    TXN_WRITE = "TxnWrite"
    # A new transaction coordinator waiting for the earlier leaders'
    # records to commit before it loads its transactions.
    TXN_LOAD = "TxnLoad"
    # A transaction marker waiting for its partition's high watermark
    # (WriteTxnMarkers' acks=all append).
    TXN_MARKER = "TxnMarker"


class Watcher(Protocol):
    """Told of every wake until it stops watching."""

    def woken(self, key: TopicIdPartition) -> None: ...

    def woken_all(self) -> None: ...


class Purgatory:
    """Waiters keyed by partition."""

    def __init__(self) -> None:
        self._waiting: dict[TopicIdPartition, set[asyncio.Future[None]]] = {}
        # Each waiting operation's kind.
        self._operations: dict[asyncio.Future[None], Operation] = {}
        self._watchers: list[Watcher] = []

    def watch(self, watcher: Watcher) -> None:
        """``watcher`` is told of every wake from now on."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers = [w for w in self._watchers if w is not watcher]

    def watched(self, operation: Operation | None = None) -> int:
        """How many (waiter, partition) watches are open, of one kind or of
        all (Kafka's ``PurgatorySize``: an operation counts once per
        partition it watches)."""
        if operation is None:
            return sum(len(futures) for futures in list(self._waiting.values()))
        watches = [tuple(futures) for futures in list(self._waiting.values())]
        kinds = dict(self._operations)
        return sum(kinds.get(future) is operation for futures in watches for future in futures)

    def delayed(self, operation: Operation | None = None) -> int:
        """How many operations wait, of one kind or of all (Kafka's
        ``NumDelayedOperations``)."""
        if operation is None:
            return len(self._operations)
        return sum(kind is operation for kind in list(self._operations.values()))

    def wake(self, key: TopicIdPartition) -> None:
        """Something changed on ``key``: its waiters check again
        (``checkAndComplete``)."""
        self._wake_waiters(key)
        for watcher in self._watchers:
            watcher.woken(key)

    def _wake_waiters(self, key: TopicIdPartition) -> None:
        for future in self._waiting.pop(key, ()):
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        """A new image (leadership may have moved) or a shutdown: everyone
        checks again."""
        for key in list(self._waiting):
            self._wake_waiters(key)
        for watcher in self._watchers:
            watcher.woken_all()

    async def wait_until(
        self,
        keys: Iterable[TopicIdPartition],
        check: Callable[[], T | None],
        timeout_s: float,
        *,
        operation: Operation,
    ) -> T | None:
        """``check()`` once it answers something other than None, re-asked
        whenever one of ``keys`` is woken; None once ``timeout_s`` has
        passed without an answer (the caller answers its timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        watched = tuple(keys)
        while True:
            found = check()
            if found is not None:
                return found
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            future: asyncio.Future[None] = loop.create_future()
            for key in watched:
                self._waiting.setdefault(key, set()).add(future)
            self._operations[future] = operation
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                pass
            finally:
                del self._operations[future]
                for key in watched:
                    futures = self._waiting.get(key)
                    if futures is not None:
                        futures.discard(future)
                        if not futures:
                            del self._waiting[key]

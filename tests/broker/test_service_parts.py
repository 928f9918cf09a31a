"""The pieces under the broker's service: the purgatory where delayed
requests wait (broker/purgatory.py) and the producer ids from blocks
(broker/producer_ids.py)."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from broker.producer_ids import (
    BlockProducerIds,
    CountingBlocks,
    ProducerIdBlock,
    ProducerIdsError,
)
from broker.purgatory import Operation, Purgatory
from metadata.image import TopicIdPartition

A = TopicIdPartition("id-a", 0)
B = TopicIdPartition("id-b", 0)


def test_a_waiter_is_woken_by_its_partition_only() -> None:
    async def body() -> None:
        purgatory = Purgatory()
        state = {"ready": False}
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiter = asyncio.ensure_future(
            purgatory.wait_until(
                [A], lambda: True if state["ready"] else None, 10, operation=Operation.PRODUCE
            )
        )
        await asyncio.sleep(0.05)
        assert purgatory.watched() == 1
        state["ready"] = True
        purgatory.wake(B)  # not its partition: it does not check again
        await asyncio.sleep(0.05)
        assert not waiter.done()
        purgatory.wake(A)
        assert await asyncio.wait_for(waiter, 1) is True
        assert loop.time() - started < 5
        assert purgatory.watched() == 0

    asyncio.run(body())


def test_a_waiter_times_out_with_none_and_checks_first() -> None:
    async def body() -> None:
        purgatory = Purgatory()
        never: int | None = None
        fetch = Operation.FETCH
        assert await purgatory.wait_until([A], lambda: never, 0.05, operation=fetch) is None
        assert await purgatory.wait_until([A], lambda: 7, 0, operation=fetch) == 7
        assert purgatory.watched() == 0 and purgatory.delayed() == 0

    asyncio.run(body())


def test_the_purgatory_counts_its_waiters_by_operation() -> None:
    """Kafka's PurgatorySize (watches: one per partition an operation waits
    on) and NumDelayedOperations, per kind of operation."""

    async def body() -> None:
        purgatory = Purgatory()
        never: int | None = None
        produce = asyncio.ensure_future(
            purgatory.wait_until([A, B], lambda: never, 10, operation=Operation.PRODUCE)
        )
        fetch = asyncio.ensure_future(
            purgatory.wait_until([A], lambda: never, 10, operation=Operation.FETCH)
        )
        await asyncio.sleep(0.05)
        assert purgatory.watched(Operation.PRODUCE) == 2
        assert purgatory.watched(Operation.FETCH) == 1
        assert purgatory.watched() == 3
        assert (purgatory.delayed(Operation.PRODUCE), purgatory.delayed(Operation.FETCH)) == (1, 1)
        # Woken, a waiter leaves its watches while it checks, then watches
        # again (its check still answers nothing).
        purgatory.wake(A)
        await asyncio.sleep(0.05)
        assert purgatory.watched(Operation.PRODUCE) == 2 and purgatory.delayed() == 2
        for waiter in (produce, fetch):
            waiter.cancel()
        await asyncio.gather(produce, fetch, return_exceptions=True)
        assert purgatory.watched() == 0 and purgatory.delayed() == 0

    asyncio.run(body())


def test_producer_ids_come_from_successive_blocks() -> None:
    async def body() -> None:
        blocks = CountingBlocks(first=10, block_size=3)
        ids = BlockProducerIds(blocks)
        got = await asyncio.gather(*(ids.next_producer_id() for _ in range(7)))
        assert sorted(got) == list(range(10, 17))
        assert blocks.allocated == 3

    asyncio.run(body())


def test_a_block_that_goes_backwards_is_refused() -> None:
    class Backwards:
        def __init__(self) -> None:
            self.calls = 0

        async def allocate_block(self) -> ProducerIdBlock:
            self.calls += 1
            return ProducerIdBlock(100 if self.calls == 1 else 50, 1)

    async def body() -> None:
        ids = BlockProducerIds(Backwards())
        assert await ids.next_producer_id() == 100
        with pytest.raises(ProducerIdsError, match="overlaps"):
            await ids.next_producer_id()

    asyncio.run(body())
    with pytest.raises(ValueError, match="length > 0"):
        ProducerIdBlock(0, 0)


def test_the_counts_can_be_read_from_another_thread_while_waiters_come_and_go() -> None:
    """The metrics exporter reads watched() and delayed() from its own
    thread while the loop adds and removes waiters: no "changed size during
    iteration" (it came within a few hundred waiters before the counts
    read copies)."""
    keys = [TopicIdPartition("id-t", i) for i in range(100)]
    errors: list[BaseException] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                for operation in (None, *Operation):
                    assert purgatory.watched(operation) >= 0
                    assert purgatory.delayed(operation) >= 0
            except RuntimeError as error:
                errors.append(error)
                return

    async def body() -> None:
        for n in range(500):
            operation = Operation.FETCH if n % 2 else Operation.PRODUCE
            watched = keys[n % 50 : n % 50 + 50]
            ready = [False]

            def check(r: list[bool] = ready) -> str | None:
                return "done" if r[0] else None

            waiter = purgatory.wait_until(watched, check, 10, operation=operation)
            task = asyncio.ensure_future(waiter)
            await asyncio.sleep(0)
            ready[0] = True
            purgatory.wake(watched[0])
            assert await task == "done"
            if errors:
                return

    purgatory = Purgatory()
    reader = threading.Thread(target=scrape)
    # The threads take turns often, so that a read overlaps a change.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    reader.start()
    try:
        asyncio.run(body())
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert errors == []
    assert purgatory.watched() == 0 and purgatory.delayed() == 0

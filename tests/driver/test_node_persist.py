"""The node persists on its loop while writes are fast, in its I/O thread
when they are slow, so a slow disk never stalls the event loop for long."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from quorum.driver.node import NodeOptions, QuorumNode
from quorum.kv import KvStateMachine, encode_put
from quorum.memory import MemoryStores
from quorum.ready import Ready
from quorum.types import VoterSet


class TimedStores(MemoryStores):
    """MemoryStores whose persist takes ``delay_s`` and records its thread."""

    delay_s = 0.0
    threads: list[int]

    def persist(self, ready: Ready) -> None:
        self.threads.append(threading.get_ident())
        if self.delay_s:
            time.sleep(self.delay_s)
        super().persist(ready)


def _run(delay_s: float) -> tuple[int, list[int]]:
    async def go() -> tuple[int, list[int]]:
        stores = TimedStores.new()
        assert isinstance(stores, TimedStores)
        stores.delay_s = delay_s
        stores.threads = []
        node = QuorumNode(
            1, VoterSet.of(1), stores, KvStateMachine(), NodeOptions(), random.Random(1)
        )
        node.start(lambda msg: None)
        loop_thread = threading.get_ident()
        deadline = time.monotonic() + 10
        while node.core.role.value != "leader":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        for i in range(20):
            await node.propose([encode_put("k", b"%d" % i)], timeout_s=5)
        await node.stop(resign=False)
        return loop_thread, stores.threads

    return asyncio.run(go())


def test_fast_writes_stay_on_the_loop() -> None:
    loop_thread, threads = _run(0.0)
    assert threads and all(t == loop_thread for t in threads)


def test_slow_writes_move_to_the_io_thread() -> None:
    loop_thread, threads = _run(0.003)
    # The first write is timed on the loop; once the average is over the
    # threshold the rest go to the I/O thread.
    assert threads[0] == loop_thread
    assert sum(t != loop_thread for t in threads) >= len(threads) - 3

"""The asyncio node driver: where it persists, back-pressure, its logs."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from kvstore.state_machine import KvStateMachine, encode_put
from quorum.driver.node import BusyError, NodeOptions, QuorumNode
from quorum.driver.raft_client import (
    IndeterminateError,
    NotLeaderError,
    RaftClient,
    ReadTimeoutError,
)
from quorum.memory import MemoryStores
from quorum.messages import Message
from quorum.ready import Ready
from quorum.types import Role, VoterSet


class TimedStores(MemoryStores):
    """MemoryStores whose persist takes ``delay_s`` and records its thread."""

    delay_s = 0.0
    threads: list[int]

    def persist(self, ready: Ready) -> None:
        self.threads.append(threading.get_ident())
        if self.delay_s:
            time.sleep(self.delay_s)
        super().persist(ready)


async def _single_leader(delay_s: float, options: NodeOptions | None = None) -> QuorumNode:
    stores = TimedStores.new()
    assert isinstance(stores, TimedStores)
    stores.delay_s = delay_s
    stores.threads = []
    node = QuorumNode(
        1, VoterSet.of(1), stores, KvStateMachine(), options or NodeOptions(), random.Random(1)
    )
    node.start(lambda msg: None)
    deadline = time.monotonic() + 10
    while node.core.role.value != "leader":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    return node


def _run(delay_s: float) -> tuple[int, list[int]]:
    async def go() -> tuple[int, list[int]]:
        node = await _single_leader(delay_s)
        stores = node.storage
        assert isinstance(stores, TimedStores)
        loop_thread = threading.get_ident()
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


def test_back_pressure_refuses_writes_past_the_limit() -> None:
    async def go() -> None:
        node = await _single_leader(0.05, NodeOptions(max_pending_records=5))
        results = await asyncio.gather(
            *(node.propose([encode_put("k", b"%d" % i)], timeout_s=5) for i in range(20)),
            return_exceptions=True,
        )
        busy = [r for r in results if isinstance(r, BusyError)]
        done = [r for r in results if not isinstance(r, BaseException)]
        assert busy and done and len(busy) + len(done) == 20
        assert "waiting to commit" in str(busy[0])
        # Refused writes had no effect: exactly the accepted ones applied.
        sm = node.state_machine
        assert isinstance(sm, KvStateMachine)
        assert sm.get("k") is not None
        await node.stop(resign=False)

    asyncio.run(go())


def test_resignation_is_logged_in_words(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        node = await _single_leader(0.0)
        with caplog.at_level(logging.INFO, logger="kq.node"):
            assert node.resign()
            await asyncio.sleep(0.05)
        await node.stop(resign=False)

    asyncio.run(go())
    assert "node 1 resigned leadership of epoch 1" in caplog.text


def test_the_node_is_a_raft_client_and_refuses_a_submit_for_another_epoch() -> None:
    async def go() -> None:
        node = await _single_leader(0.0)
        try:
            seam: RaftClient = node
            known = seam.leader_and_epoch()
            assert known.leader_id == seam.node_id == 1
            assert (seam.max_batch_records, seam.max_batch_bytes) == (
                node.options.max_batch_records,
                node.options.max_batch_bytes,
            )
            with pytest.raises(NotLeaderError):
                seam.submit([encode_put("k", b"stale")], known.epoch - 1)
            with pytest.raises(NotLeaderError):
                seam.submit([encode_put("k", b"future")], known.epoch + 1)
            offset, future = seam.submit([encode_put("k", b"now")], known.epoch)
            outcome = await asyncio.wait_for(future, 5)
            assert (outcome.offset, outcome.epoch) == (offset, known.epoch)
            assert seam.next_offset() == offset + 1
        finally:
            await node.stop(resign=False)

    asyncio.run(go())


async def _three_nodes(cut: set[int]) -> dict[int, QuorumNode]:
    """Three in-memory nodes that talk through ``deliver``; a node in
    ``cut`` neither sends nor receives (a partition of that node)."""
    nodes: dict[int, QuorumNode] = {}

    def send(msg: Message) -> None:
        if msg.src not in cut and msg.dst not in cut and msg.dst in nodes:
            nodes[msg.dst].deliver(msg)

    for i in (1, 2, 3):
        nodes[i] = QuorumNode(
            i,
            VoterSet.of(1, 2, 3),
            MemoryStores.new(),
            KvStateMachine(),
            NodeOptions(),
            random.Random(i),
        )
    for node in nodes.values():
        node.start(send)
    return nodes


async def _abandoned_then_leader_change(what: str, leave: str) -> list[dict[str, object]]:
    """A linearizable read or a write (``what``) on a leader cut off from
    its followers, left by its caller (``leave``: its timeout ran out, or it
    was cancelled) while still pending; then the leader resigns (which
    fails a read barrier with NotLeaderError) and the nodes stop (which
    fails a write IndeterminateError).  Returns what reached the loop's
    exception handler once the abandoned futures were collected."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    cut: set[int] = set()
    nodes = await _three_nodes(cut)
    try:
        deadline = time.monotonic() + 10
        while not (leaders := [n for n in nodes.values() if n.core.role is Role.LEADER]):
            assert time.monotonic() < deadline, "no leader elected"
            await asyncio.sleep(0.01)
        leader = leaders[0]
        # A write of the leader's epoch committed, so a read barrier can start.
        await leader.propose([encode_put("k", b"v")], timeout_s=5)
        cut.add(leader.node_id)

        def wait(timeout_s: float) -> Coroutine[Any, Any, object]:
            if what == "read":
                return leader.read_barrier(timeout_s)
            return leader.propose([encode_put("k", b"w")], timeout_s)

        timed_out = ReadTimeoutError if what == "read" else IndeterminateError
        if leave == "timeout":
            with pytest.raises(timed_out):
                await wait(0.05)
        else:
            reader = asyncio.create_task(wait(5))
            await asyncio.sleep(0.05)
            assert not reader.done()
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
        assert leader.resign()
        # The node loop steps the resignation and checks the pending reads.
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        for node in nodes.values():
            await node.stop(resign=False)
    gc.collect()
    await asyncio.sleep(0)
    return reported


@pytest.mark.parametrize("leave", ["timeout", "cancel"])
@pytest.mark.parametrize("what", ["read", "write"])
def test_an_abandoned_read_or_write_leaves_no_unretrieved_exception(what: str, leave: str) -> None:
    # The read's future used to stay in the node's pending reads after its
    # waiter left (asyncio.shield keeps the inner future alive and, once the
    # outer one is cancelled, no longer retrieves its result); the leader
    # change then set NotLeaderError on it and asyncio reported "Future
    # exception was never retrieved" when it was collected.  A write's
    # future stays (its write goes on) and was failed at the stop, unread.
    reported = asyncio.run(_abandoned_then_leader_change(what, leave))
    messages = [str(c.get("message")) for c in reported]
    assert not any("never retrieved" in m for m in messages), reported

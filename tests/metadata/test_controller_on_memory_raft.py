"""The active controller runs on the quorum's seam alone.

:class:`metadata.active.QuorumController` is given the in-memory twin of
:class:`quorum.driver.raft_client.RaftClient` instead of a quorum node: no
network, disk or real clock.  That it activates, writes, answers, fences on
virtual time and falls back to standby when leadership goes shows that the
metadata layer needs nothing of the node but the seam (the layering test
checks the imports)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from metadata.active import ControllerSettings, QuorumController
from metadata.controller import HeartbeatRequest, NewTopic
from metadata.errors import ApiError, Errors
from metadata.state_machine import ControllerStateMachine
from quorum.driver.memory_raft import MemoryRaftClient
from quorum.driver.raft_client import NotLeaderError, RaftClient
from tests.metadata.controller_model import CLUSTER_ID, register_request

T = TypeVar("T")

SETTINGS = ControllerSettings(
    broker_session_timeout_ms=1_000,
    broker_heartbeat_interval_ms=100,
    tick_interval_ms=10,
    metadata_max_idle_interval_ms=0,
)


def _run(
    body: Callable[[MemoryRaftClient, ControllerStateMachine, QuorumController], Awaitable[T]],
) -> T:
    async def go() -> T:
        sm = ControllerStateMachine()
        raft = MemoryRaftClient(sm, node_id=1)
        seam: RaftClient = raft  # the twin is a RaftClient (checked by mypy)
        controller = QuorumController(seam, sm, CLUSTER_ID, SETTINGS)
        controller.start()
        try:
            return await body(raft, sm, controller)
        finally:
            await controller.stop()
            raft.stop()

    return asyncio.run(go())


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


async def _register(controller: QuorumController, raft: MemoryRaftClient, broker: int) -> int:
    epoch = await controller.write(
        lambda c: c.register_broker(register_request(broker), raft.now_ms()), 1.0
    )
    await controller.write(
        lambda c: c.heartbeat(HeartbeatRequest(broker, epoch, epoch), raft.now_ms()), 1.0
    )
    return epoch


def test_a_standby_refuses_writes_until_its_node_leads() -> None:
    async def body(
        raft: MemoryRaftClient, sm: ControllerStateMachine, controller: QuorumController
    ) -> None:
        with pytest.raises(ApiError) as refused:
            await controller.write(lambda c: c.noop(), 1.0)
        assert refused.value.code is Errors.NOT_CONTROLLER
        raft.become_leader()
        await _until(lambda: controller.is_active)
        assert controller.active_epoch == 1

    _run(body)


def test_writes_commit_through_the_seam_and_the_image_follows() -> None:
    async def body(
        raft: MemoryRaftClient, sm: ControllerStateMachine, controller: QuorumController
    ) -> None:
        raft.become_leader()
        await _until(lambda: controller.is_active)
        epochs = [await _register(controller, raft, b) for b in (1, 2, 3)]
        # A broker's epoch is the offset of its registration record, which
        # the seam's submit said before the write (KIP-631).
        assert epochs == sorted(epochs) and len(set(epochs)) == 3
        assert all(not sm.image.brokers[b].fenced for b in (1, 2, 3))

        results = await controller.write(lambda c: c.create_topics([NewTopic("orders", 3, 3)]), 1.0)
        assert [r.error for r in results] == [Errors.NONE]
        assert len(sm.image.topics) == 1
        image = await controller.read(linearizable=True, timeout_s=1.0)
        assert image is sm.image
        assert sm.applied_offset == raft.next_offset()

    _run(body)


def test_brokers_are_fenced_on_the_seams_clock() -> None:
    async def body(
        raft: MemoryRaftClient, sm: ControllerStateMachine, controller: QuorumController
    ) -> None:
        raft.become_leader()
        await _until(lambda: controller.is_active)
        await _register(controller, raft, 1)
        await asyncio.sleep(0.05)  # many ticks, no virtual time: still alive
        assert not sm.image.brokers[1].fenced
        raft.advance(SETTINGS.broker_session_timeout_ms + 1)
        await _until(lambda: sm.image.brokers[1].fenced)

    _run(body)


def test_a_write_lost_with_leadership_is_indeterminate_and_the_controller_steps_down() -> None:
    async def body(
        raft: MemoryRaftClient, sm: ControllerStateMachine, controller: QuorumController
    ) -> None:
        raft.become_leader()
        await _until(lambda: controller.is_active)
        await _register(controller, raft, 1)
        before = sm.image
        raft.auto_commit = False
        write = asyncio.ensure_future(
            controller.write(lambda c: c.create_topics([NewTopic("lost", 1, 1)]), 1.0)
        )
        await _until(lambda: raft.pending_batches == 1)
        raft.lose_leadership(leader=2)
        with pytest.raises(ApiError) as outcome:
            await write
        assert outcome.value.code is Errors.INDETERMINATE
        await _until(lambda: not controller.is_active)
        # Nothing of the lost write reached the committed image.
        assert sm.image.topics == before.topics
        with pytest.raises(ApiError) as refused:
            await controller.write(lambda c: c.noop(), 1.0)
        assert refused.value.code is Errors.NOT_CONTROLLER

        # Leading again, it decides from the committed image, not the lost one.
        raft.auto_commit = True
        raft.become_leader()
        await _until(lambda: controller.is_active)
        results = await controller.write(lambda c: c.create_topics([NewTopic("lost", 1, 1)]), 1.0)
        assert [r.error for r in results] == [Errors.NONE]

    _run(body)


def test_a_submit_for_an_epoch_the_node_no_longer_leads_is_refused() -> None:
    async def body(
        raft: MemoryRaftClient, sm: ControllerStateMachine, controller: QuorumController
    ) -> None:
        first = raft.become_leader()
        second = raft.become_leader()
        raft.auto_commit = False
        with pytest.raises(NotLeaderError):
            raft.submit([b"x"], first)
        offset, _ = raft.submit([b"x"], second)
        assert offset == sm.applied_offset
        assert raft.pending_batches == 1

    _run(body)

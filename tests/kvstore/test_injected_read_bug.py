"""The deliberate bug Q4 (``bugs.Bug.READ_WITHOUT_BARRIER``), wired in the
node's read path (``QuorumNode.read_barrier``), seen over gRPC.

Three real nodes run in this process.  The leader is cut off from the other
two (every Raft message to or from it is dropped), which elect a new leader
and commit a new value.  Check-quorum is slowed down here so that the old
leader goes on believing it leads for seconds, as a paused or overloaded one
may; the rule must not depend on how soon it notices.  A linearizable Get
sent to it must then not answer with the old value: with the read barrier
(Raft thesis §6.4) it cannot confirm its leadership and answers TIMEOUT or
NOT_LEADER; with the bug on it answers OK with the stale value, which is the
anomaly the register workload's linearizability check reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import grpc

import bugs
from bugs import Bug
from kqproto import kv_pb2, kv_pb2_grpc
from kvstore.client import KvClient
from quorum.messages import Message
from quorum.types import NodeId, Role
from server.controller import kv_of
from tests.driver.cluster_util import FAST, run, running

# The old leader resigns by check-quorum only after 30 fetch timeouts (12 s).
SLOW_CHECK_QUORUM = dataclasses.replace(
    FAST, quorum=dataclasses.replace(FAST.quorum, check_quorum_factor=30.0)
)


def _not_from(src: NodeId, deliver: Callable[[Message], None]) -> Callable[[Message], None]:
    def filtered(msg: Message) -> None:
        if msg.src != src:
            deliver(msg)

    return filtered


async def _read_from_deposed_leader(root: Path) -> tuple[kv_pb2.GetResponse, int]:
    """The answer of a deposed leader that has not noticed to a linearizable
    Get of a key the new leader has overwritten, and the old leader's id."""
    async with running(root, options=SLOW_CHECK_QUORUM) as cluster:
        old = await cluster.wait_leader()
        old_id = old.config.node_id
        async with KvClient([old.config.address]) as client:
            await client.put("r", b"old")
        await cluster.wait_for(
            lambda: all(kv_of(s).get("r") is not None for s in cluster.servers.values())
        )

        # Cut the old leader off: it hears nothing, and no one hears it.
        for server in cluster.servers.values():
            if server is old:
                server.transport._deliver = lambda msg: None
            else:
                server.transport._deliver = _not_from(old_id, server.transport._deliver)
        others = [s for s in cluster.servers.values() if s is not old]
        await cluster.wait_for(
            lambda: any(s.node.core.role is Role.LEADER for s in others), timeout_s=10
        )
        new = next(s for s in others if s.node.core.role is Role.LEADER)
        async with KvClient([new.config.address]) as client:
            await client.put("r", b"new")
        # The old leader still believes it leads its (older) epoch.
        assert old.node.core.role is Role.LEADER
        assert old.node.core.epoch < new.node.core.epoch

        async with grpc.aio.insecure_channel(old.config.address) as channel:
            kv = kv_pb2_grpc.KvServiceStub(channel)
            answer = await kv.Get(kv_pb2.GetRequest(key="r", linearizable=True), timeout=5)
        return answer, old_id


def test_a_deposed_leader_serves_a_stale_read_with_the_bug(tmp_path: Path) -> None:
    async def go() -> None:
        with bugs.injected(Bug.READ_WITHOUT_BARRIER):
            answer, old_id = await _read_from_deposed_leader(tmp_path)
        print(
            f"Q4 ({Bug.READ_WITHOUT_BARRIER.title}): deposed leader {old_id} answered "
            f"error={answer.error} value={answer.value!r}"
        )
        assert answer.error == kv_pb2.OK
        assert (answer.present, answer.value) == (True, b"old")

    run(go())


def test_a_deposed_leader_serves_no_read_without_the_bug(tmp_path: Path) -> None:
    async def go() -> None:
        answer, _ = await _read_from_deposed_leader(tmp_path)
        # It cannot confirm that it still leads: no answer with data.
        assert answer.error in (kv_pb2.TIMEOUT, kv_pb2.NOT_LEADER), answer
        assert not answer.present

    run(go())

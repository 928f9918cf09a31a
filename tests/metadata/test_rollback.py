"""Uncommitted decisions are rolled back when the active controller loses
leadership: its speculative image is dropped, and what it wrote but never
committed is gone from every controller."""

from __future__ import annotations

import asyncio
from pathlib import Path

from metadata.controller import NewTopic
from metadata.errors import ApiError, Errors
from tests.metadata.metadata_cluster import TestBroker, running_metadata


def test_a_controller_that_loses_its_quorum_drops_what_did_not_commit(tmp_path: Path) -> None:
    async def go() -> None:
        async with running_metadata(tmp_path) as cluster:
            active_node = await cluster.wait_active()
            brokers = [TestBroker(cluster, b) for b in (1, 2, 3)]
            for broker in brokers:
                await broker.start()
            for broker in brokers:
                await broker.stop()
            active = cluster.controller(active_node)
            committed_before = active.sm.image
            # Cut the active controller off: its followers stop, so nothing
            # it writes from now on can commit.
            followers = [n for n in cluster.servers if n != active_node]
            for n in followers:
                await cluster.stop(n, resign=False)
            try:
                await active.write(lambda c: c.create_topics([NewTopic("lost", 3, 3)]), 0.5)
                raise AssertionError("a write committed without a quorum")
            except ApiError as exc:
                assert exc.code is Errors.INDETERMINATE
            # Decided and replayed speculatively, but not committed.
            assert active.controller.image.topic_by_name("lost") is not None
            assert active.sm.image.topic_by_name("lost") is None
            # Check-quorum makes it resign; the speculative image goes.
            await cluster.wait_for(lambda: not active.is_active, 10)
            assert active.controller.image is active.sm.image
            assert active.sm.image.topics == committed_before.topics
            # The others come back and elect a leader without the write (the
            # old leader is down meanwhile: with its longer log it could win
            # and commit the write, which Raft allows: it was indeterminate).
            await cluster.stop(active_node, resign=False)
            for n in followers:
                await cluster.start(n)
            new_active = await cluster.wait_active()
            assert new_active != active_node
            # The old leader returns and truncates what never committed.
            await cluster.start(active_node)
            await cluster.wait_for(
                lambda: all(
                    cluster.controller(n).sm.applied_offset
                    >= cluster.controller(new_active).sm.applied_offset
                    for n in cluster.servers
                ),
                10,
            )
            for n in cluster.servers:
                image = cluster.controller(n).sm.image
                assert image.topic_by_name("lost") is None, n
                assert set(image.brokers) == {1, 2, 3}

    asyncio.run(asyncio.wait_for(go(), 90))

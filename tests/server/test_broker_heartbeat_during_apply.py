"""A broker keeps heartbeating while an image creates many partition logs:
the logs are created a part at a time with the broker's loop running between
parts (server.broker._CREATE_PART), so the controller does not fence it.
With the creation in one synchronous apply, as before, it is fenced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import server.broker
from metadata.client import MetadataClient, NewTopic
from metadata.image import TopicIdPartition
from partition_log.log import PartitionLog
from partition_log.log_config import LogConfig
from quorum.driver.identity import Identity
from server.broker import BrokerProcess
from tests.driver.cluster_util import CLUSTER_ID, free_ports
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import SETTINGS, Controllers, broker, stop_all, wait_for

BROKER = 11
PARTITIONS = 100
# Each creation made slow enough that all of them take 1.5 sessions.
CREATE_S = SETTINGS.broker_session_timeout_ms / 1000 * 1.5 / PARTITIONS


@asynccontextmanager
async def one_broker(tmp_path: Path) -> AsyncIterator[tuple[Controllers, BrokerProcess]]:
    """One controller and broker BROKER, unfenced; both stopped after."""
    cluster = Controllers(tmp_path, voters=1, options=OPTIONS, tls=True)
    process = None
    try:
        for node in cluster.voters:
            await cluster.start(node)
        process = broker(cluster, BROKER, free_ports(1)[0])
        await process.start()
        await wait_for(lambda: not process.fenced)
        yield cluster, process
    finally:
        await stop_all(cluster, process)


async def create_many(tmp_path: Path) -> tuple[int, bool, int]:
    """(heartbeats sent while the logs were created, whether the broker was
    ever fenced after its first unfencing, replicas made)."""
    async with one_broker(tmp_path) as (cluster, process):
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        window: list[float] = []
        get_or_create = process.replicas.logs.get_or_create

        def slow(
            key: TopicIdPartition, topic_name: str, config: LogConfig, now_ms: int
        ) -> PartitionLog:
            if process.replicas.logs.log(key) is None:
                now = time.monotonic()
                window[:] = [window[0] if window else now, now + CREATE_S]
                time.sleep(CREATE_S)
            return get_or_create(key, topic_name, config, now_ms)

        process.replicas.logs.get_or_create = slow  # type: ignore[method-assign]
        sent: list[float] = []
        heartbeat = process._heartbeat

        async def counted(**kwargs: bool) -> object:
            sent.append(time.monotonic())
            return await heartbeat(**kwargs)

        process._heartbeat = counted  # type: ignore[method-assign, assignment]
        fenced = False

        async def watch() -> None:
            nonlocal fenced
            while True:
                fenced = fenced or process.fenced or process.image.brokers[BROKER].fenced
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        async with MetadataClient(
            list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
        ) as admin:
            created = await admin.create_topics([NewTopic("t", PARTITIONS, 1)])
            assert created.topics[0].error == 0, created
        await wait_for(lambda: len(process.replicas.replicas) == PARTITIONS)
        # Two more heartbeats' time for a fencing to show.
        await asyncio.sleep(process.settings.heartbeat_interval_ms / 1000 * 3)
        watcher.cancel()
        start, end = window
        return (
            len([t for t in sent if start <= t <= end]),
            fenced,
            len(process.replicas.replicas),
        )


def fenced_by_controller(caplog: pytest.LogCaptureFixture) -> bool:
    return any(f"fences broker(s) [{BROKER}]" in r.getMessage() for r in caplog.records)


def test_heartbeats_go_on_while_many_logs_are_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Parts of a third of a session at this test's slow creation.
    monkeypatch.setattr(server.broker, "_CREATE_PART", 10)
    during, fenced, made = asyncio.run(asyncio.wait_for(create_many(tmp_path), 60))
    assert made == PARTITIONS
    assert not fenced and not fenced_by_controller(caplog)
    # One a second at least (the interval is 200 ms; each waits for the
    # answer and for a pause between parts).
    assert during >= SETTINGS.broker_session_timeout_ms * 1.5 / 1000, during


def test_one_synchronous_apply_gets_the_broker_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server.broker, "_CREATE_PART", PARTITIONS * 10)
    during, _, made = asyncio.run(asyncio.wait_for(create_many(tmp_path), 60))
    assert made == PARTITIONS
    assert fenced_by_controller(caplog) and during <= 1, during

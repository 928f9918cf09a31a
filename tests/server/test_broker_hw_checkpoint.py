"""A broker writes its partitions' high watermarks at Kafka's
``replica.high.watermark.checkpoint.interval.ms`` (5 s), not on every tick
of its scheduled tasks (100 ms here): records produced every 100 ms for 2 s
change the leader's checkpoint file at most once, and the last HW is in it
one interval later. One controller and one broker over mutual TLS, in this
process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.errors import Errors
from broker.log_manager import HIGH_WATERMARK_FILE
from kqproto import broker_pb2_grpc
from metadata.client import MetadataClient, NewTopic
from quorum.driver.identity import Identity
from quorum.driver.tls import dial
from server.broker import HW_CHECKPOINT_INTERVAL_MS, BrokerProcess
from tests.driver.cluster_util import CLUSTER_ID, free_ports
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import Controllers, broker, produce, stop_all, wait_for

BROKER = 11


def _checkpointed(logs: Path) -> str | None:
    found = list(logs.glob(f"t-0/{HIGH_WATERMARK_FILE}"))
    return found[0].read_text() if found else None


def test_high_watermarks_are_checkpointed_at_the_interval_not_every_tick(tmp_path: Path) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=1, options=OPTIONS, tls=True)
        process: BrokerProcess | None = None
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        logs = cluster.root / f"broker-{BROKER}" / "logs"
        try:
            for node in cluster.voters:
                await cluster.start(node)
            process = broker(cluster, BROKER, free_ports(1)[0])
            await process.start()
            running = process
            await wait_for(lambda: not running.fenced, 30)
            async with MetadataClient(
                list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
            ) as admin:
                created = await admin.create_topics([NewTopic("t", 1, 1)])
                assert created.topics[0].error == 0, created
            await wait_for(lambda: running.image.topic_by_name("t") is not None)
            seen: list[str | None] = [_checkpointed(logs)]
            async with dial(process.address, admin_tls.channel_credentials()) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                for i in range(20):
                    answer = (await stub.Produce(produce(b"v%d" % i))).topics[0].partitions[0]
                    assert (answer.error, answer.base_offset) == (Errors.NONE, i), answer
                    for _ in range(5):
                        await asyncio.sleep(0.02)
                        now = _checkpointed(logs)
                        if now != seen[-1]:
                            seen.append(now)
            # At most one checkpoint within 2 s of an interval of 5 s (one a
            # tick would have written about twenty).
            assert HW_CHECKPOINT_INTERVAL_MS >= 5_000
            assert len(seen) <= 2, seen
            deadline = time.monotonic() + HW_CHECKPOINT_INTERVAL_MS / 1000 + 3
            while time.monotonic() < deadline and not (_checkpointed(logs) or "").endswith(
                "\n20\n"
            ):
                await asyncio.sleep(0.1)
            assert (_checkpointed(logs) or "").endswith("\n20\n"), _checkpointed(logs)
        finally:
            await stop_all(cluster, process)

    asyncio.run(asyncio.wait_for(body(), 90))

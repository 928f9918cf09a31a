"""A follower's ``replica.fetch.min.bytes`` and ``replica.fetch.wait.max.ms``
(dynamic broker configs) reach its fetches, end to end: two broker
processes in this process on 127.0.0.1 with mutual TLS, a topic with
replication factor 2 and min ISR 2.  With a large min bytes the leader
holds each of the follower's fetches for the whole wait, so an acks=all
produce waits for the follower's next fetch; with the configs removed it
is answered within a fetch round trip again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker.errors import Errors
from broker.log_manager import replica_fetcher_config
from broker.replica import FetcherConfig
from kqproto import broker_pb2_grpc
from metadata.client import ConfigOp, ConfigResource, MetadataClient, NewTopic
from metadata.image import PartitionRegistration
from quorum.driver.identity import Identity
from quorum.driver.tls import dial
from server.broker import BrokerProcess
from tests.driver.cluster_util import CLUSTER_ID
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import Controllers, produce, start_all, stop_all, wait_for

BROKERS = (11, 12)
WAIT_MS = 1_200
CHUNKS = (
    ConfigOp("replica.fetch.min.bytes", str(1 << 20)),
    ConfigOp("replica.fetch.wait.max.ms", str(WAIT_MS)),
)


def test_a_followers_fetch_min_bytes_and_wait_hold_its_fetches(tmp_path: Path) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        brokers: dict[int, BrokerProcess] = {}
        admin_tls = cluster.tls_files(Identity.user(CLUSTER_ID, "admin"))
        try:
            await start_all(cluster, brokers, BROKERS)
            admin = MetadataClient(
                list(cluster.voters.values()), credentials=admin_tls.channel_credentials()
            )
            created = await admin.create_topics(
                [NewTopic("t", 1, 2, configs={"min.insync.replicas": "2"})]
            )
            assert created.topics[0].error == 0, created

            def partition() -> PartitionRegistration | None:
                topic = brokers[BROKERS[0]].image.topic_by_name("t")
                p = None if topic is None else topic.partition(0)
                return p if p is not None and len(p.isr) == 2 else None

            leader = (await wait_for(partition)).leader
            follower = next(b for b in BROKERS if b != leader)
            await wait_for(lambda: brokers[follower].image.topic_by_name("t") is not None)

            async def config(ops: list[ConfigOp], expect: FetcherConfig) -> None:
                answer = await admin.alter_configs({ConfigResource.broker(follower): ops})
                assert all(r.error == 0 for r in answer.results), answer
                await wait_for(
                    lambda: replica_fetcher_config(brokers[follower].image, follower) == expect
                )

            async with dial(brokers[leader].address, admin_tls.channel_credentials()) as channel:
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                offset = 0

                async def timed_produce() -> float:
                    nonlocal offset
                    started = time.monotonic()
                    answer = (await stub.Produce(produce(b"v%d" % offset))).topics[0].partitions[0]
                    assert (answer.error, answer.base_offset) == (Errors.NONE, offset), answer
                    offset += 1
                    return time.monotonic() - started

                await timed_produce()
                await config(list(CHUNKS), FetcherConfig(1 << 20, WAIT_MS))
                # The fetch the leader holds when the config changes may be
                # an old one: the first produce only lines the fetches up.
                await timed_produce()
                held = [await timed_produce() for _ in range(2)]
                # Each produce waits for the fetch the leader holds (a few
                # bytes, far below the min bytes) to expire.
                assert all(s >= WAIT_MS / 1000 * 0.8 for s in held), held
                await config([ConfigOp(op.key, None) for op in CHUNKS], FetcherConfig())
                await timed_produce()
                quick = [await timed_produce() for _ in range(3)]
                assert all(s < WAIT_MS / 1000 * 0.5 for s in quick), quick
            await admin.close()
        finally:
            await stop_all(cluster, *brokers.values())

    asyncio.run(asyncio.wait_for(body(), 90))

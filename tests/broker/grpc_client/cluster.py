"""Real brokers for the gRPC clients' tests: three controllers and three
brokers over mutual TLS on 127.0.0.1 (as tests/server/test_broker_process.py
starts them, with its helpers), run on an event loop in a thread so that one
cluster serves a whole test module while each test drives its clients on its
own loop (or through the sync wrappers)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from broker.grpc_client.sync import LoopThread
from metadata.client import MetadataClient, NewTopic
from metadata.image import PartitionRegistration
from quorum.driver.identity import Identity
from quorum.driver.tls import TlsFiles
from server.broker import BrokerProcess
from tests.driver.cluster_util import CLUSTER_ID, free_ports
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import BROKERS, Controllers, broker, wait_for

T = TypeVar("T")

__all__ = ["BROKERS", "BrokerCluster"]


class BrokerCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.thread = LoopThread("kq-test-cluster")
        self.controllers: Controllers | None = None
        self.brokers: dict[int, BrokerProcess] = {}
        self.ports = dict(zip(BROKERS, free_ports(len(BROKERS)), strict=True))
        self.admin_tls: TlsFiles | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return self.thread.run(coro, timeout_s)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.run(self._start(), 90)

    async def _start(self) -> None:
        self.controllers = Controllers(self.root, voters=3, options=OPTIONS, tls=True)
        self.admin_tls = self.controllers.tls_files(Identity.user(CLUSTER_ID, "admin"))
        for node in self.controllers.voters:
            await self.controllers.start(node)
        for broker_id, port in self.ports.items():
            self.brokers[broker_id] = broker(self.controllers, broker_id, port)
            await self.brokers[broker_id].start()
        await wait_for(lambda: all(not b.fenced for b in self.brokers.values()), 30)

    def stop(self) -> None:
        try:
            self.run(self._stop(), 60)
        finally:
            self.thread.stop()

    async def _stop(self) -> None:
        for process in self.brokers.values():
            await process.stop(controlled=False)
        self.brokers.clear()
        if self.controllers is not None:
            for node in list(self.controllers.servers):
                await self.controllers.stop(node)

    # -- what tests use -------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports.values()]

    @property
    def certs_dir(self) -> Path:
        assert self.controllers is not None and self.controllers.certs is not None
        return self.controllers.certs

    @property
    def controller_addresses(self) -> list[str]:
        assert self.controllers is not None
        return list(self.controllers.voters.values())

    def _admin(self) -> MetadataClient:
        """A controllers' client presenting the admin's certificate."""
        assert self.admin_tls is not None
        return MetadataClient(
            self.controller_addresses, credentials=self.admin_tls.channel_credentials()
        )

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        async def create() -> None:
            async with self._admin() as admin:
                created = await admin.create_topics(
                    [NewTopic(name, partitions, replication_factor, configs=dict(configs or {}))]
                )
                assert created.topics[0].error == 0, created

            def everywhere() -> bool:
                for process in self.brokers.values():
                    topic = process.image.topic_by_name(name)
                    if topic is None or any(p.leader < 0 for p in topic.partitions):
                        return False
                return True

            await wait_for(everywhere)

        self.run(create())

    def user_tls(self, name: str) -> TlsFiles:
        """A certificate naming ``User:name``, from the cluster's CA."""
        assert self.controllers is not None
        return self.controllers.tls_files(Identity.user(CLUSTER_ID, name))

    def grant(self, *bindings: Any) -> None:
        """Create ACL bindings (``metadata.client.acl_binding``)."""

        async def create() -> None:
            async with self._admin() as admin:
                created = await admin.create_acls(list(bindings))
                assert all(r.error == 0 for r in created.results), created

        self.run(create())

    def partition(self, topic: str, partition: int = 0) -> PartitionRegistration:
        async def find() -> PartitionRegistration:
            process = next(iter(self.brokers.values()))
            found = process.image.topic_by_name(topic)
            assert found is not None, topic
            registration = found.partition(partition)
            assert registration is not None
            return registration

        return self.run(find())

    def isr(self, topic: str, partition: int = 0, on: int | None = None) -> tuple[int, ...] | None:
        """The partition's ISR as broker ``on``'s image has it (any broker's
        by default; callable on the cluster's loop, as a wait_until check)."""
        process = next(iter(self.brokers.values())) if on is None else self.brokers[on]
        found = process.image.topic_by_name(topic)
        registration = None if found is None else found.partition(partition)
        return None if registration is None else tuple(registration.isr)

    def stop_broker(self, broker_id: int, controlled: bool = True) -> None:
        self.run(self.brokers.pop(broker_id).stop(controlled=controlled))

    def restart_broker(self, broker_id: int) -> None:
        async def restart() -> None:
            assert self.controllers is not None
            process = broker(self.controllers, broker_id, self.ports[broker_id], new=False)
            self.brokers[broker_id] = process
            await process.start()
            await wait_for(lambda: not process.fenced, 30)

        self.run(restart())

    def wait_until(self, check: Any, timeout_s: float = 30) -> Any:
        async def waiting() -> Any:
            return await wait_for(check, timeout_s)

        return self.run(waiting(), timeout_s + 5)


def sleep_on(cluster: BrokerCluster, seconds: float) -> None:
    cluster.run(asyncio.sleep(seconds))

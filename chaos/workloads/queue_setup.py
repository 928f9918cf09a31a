"""The queue workload's options and its wiring to a real cluster: the
topics it creates (through the controllers), the cluster's
``replica.lag.time.max.ms`` for the run, and each worker's producer and
consumer (:mod:`broker.grpc_client`) on the brokers."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import grpc

from broker.client.consumer import ConsumerConfig, OffsetResetStrategy
from broker.client.producer_batch import Acks, ProducerConfig
from broker.grpc_client import Consumer, Producer
from chaos.workloads.queue import QueueWorkload
from history.ops import HistoryRecorder
from history.queue import KeyMap
from metadata.client import ConfigOp, ConfigResource, MetadataClient, NewTopic

__all__ = ["ACKS", "QueueOptions", "make_queue_workload"]

ACKS: Final = {"all": Acks.ALL, "1": Acks.LEADER, "0": Acks.NONE}
"""``--acks`` values."""


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """The queue workload's flags: ``brokers`` in the cluster; ``topics``
    of ``partitions`` each (the keys: ``topics * partitions``),
    ``replication_factor`` and ``min_isr`` of each; the producer's ``acks``;
    the most records in one send (``max_send``); the final polls' deadline
    (``final_time_s``); the cluster's ``replica.lag.time.max.ms`` for the
    run (``replica_lag_ms``: short, so that ISRs shrink and grow many
    times a run)."""

    brokers: int = 3
    topics: int = 1
    partitions: int = 4
    replication_factor: int = 3
    min_isr: int = 2
    acks: str = "all"
    max_send: int = 3
    final_time_s: float = 60.0
    replica_lag_ms: int = 1_500

    def check(self) -> None:
        """:class:`ValueError` naming the first bad option."""
        for what in ("brokers", "topics", "partitions", "replication_factor", "min_isr"):
            if getattr(self, what) < 1:
                raise ValueError(f"{what} must be at least 1, got {getattr(self, what)}")
        if self.replication_factor > self.brokers:
            raise ValueError(
                f"replication factor {self.replication_factor} needs at least as many brokers, "
                f"got {self.brokers}"
            )
        if self.min_isr > self.replication_factor:
            raise ValueError(
                f"min ISR {self.min_isr} is above the replication factor "
                f"{self.replication_factor}: acks=all sends would all be refused"
            )
        if self.acks not in ACKS:
            raise ValueError(f"acks must be one of {', '.join(ACKS)}, got {self.acks!r}")
        if self.max_send < 1:
            raise ValueError(f"max_send must be at least 1, got {self.max_send}")
        if not self.final_time_s > 0:
            raise ValueError(f"final_time_s must be positive, got {self.final_time_s}")
        if not 100 <= self.replica_lag_ms <= 60_000:
            raise ValueError(f"replica_lag_ms must be in 100..60000, got {self.replica_lag_ms}")

    @property
    def keymap(self) -> KeyMap:
        names = ["queue"] if self.topics == 1 else [f"queue-{i}" for i in range(self.topics)]
        return KeyMap(tuple((name, self.partitions) for name in names))

    def to_json(self) -> dict[str, Any]:
        return {
            "brokers": self.brokers,
            "topics": self.keymap.to_json(),
            "replication_factor": self.replication_factor,
            "min_isr": self.min_isr,
            "acks": self.acks,
            "max_send": self.max_send,
            "final_time_s": self.final_time_s,
            "replica_lag_ms": self.replica_lag_ms,
        }


async def _prepare(
    options: QueueOptions,
    controllers: Mapping[int, str],
    credentials: grpc.ChannelCredentials | None,
    timeout_s: float = 60.0,
) -> None:
    """Set ``replica.lag.time.max.ms``, create the topics and wait until
    each partition has a leader and a full ISR."""
    client = MetadataClient(list(controllers.values()), timeout_s=10.0, credentials=credentials)
    try:
        answer = await client.alter_configs(
            {
                ConfigResource.cluster(): [
                    ConfigOp("replica.lag.time.max.ms", str(options.replica_lag_ms))
                ]
            }
        )
        bad = [r for r in answer.results if r.error != 0]
        if bad:
            raise RuntimeError(f"setting replica.lag.time.max.ms failed: {bad}")
        keymap = options.keymap
        created = await client.create_topics(
            [
                NewTopic(
                    name,
                    partitions,
                    options.replication_factor,
                    configs={"min.insync.replicas": str(options.min_isr)},
                )
                for name, partitions in keymap.topics
            ]
        )
        bad_topics = [t for t in created.topics if t.error != 0]
        if bad_topics:
            raise RuntimeError(f"creating the queue's topics failed: {bad_topics}")
        deadline = time.monotonic() + timeout_s
        names = [name for name, _ in keymap.topics]
        while True:
            described = await client.describe_topics(names)
            parts = [p for t in described.topics for p in t.partitions]
            if len(parts) == len(keymap.keys) and all(
                p.leader >= 0 and len(p.isr) == options.replication_factor for p in parts
            ):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the queue's partitions were not all led with a full ISR within "
                    f"{timeout_s:g} s: {described}"
                )
            await asyncio.sleep(0.2)
    finally:
        await client.close()


def make_queue_workload(
    options: QueueOptions,
    recorder: HistoryRecorder,
    controllers: Mapping[int, str],
    brokers: Mapping[int, str],
    rng: random.Random,
    credentials: grpc.ChannelCredentials | None,
    *,
    concurrency: int,
    rate: float,
    op_timeout_s: float,
    client_timeout_s: float,
) -> QueueWorkload:
    """The queue workload on the cluster's brokers (its topics made by
    :meth:`QueueWorkload.prepare`)."""
    options.check()
    if not brokers:
        raise ValueError("the queue workload needs brokers; the cluster has none")
    bootstrap = list(brokers.values())
    request_ms = max(500, int(client_timeout_s * 1000))
    # A send waits for its records at most op_timeout_s; the producer gives
    # up on a record a little earlier (delivery.timeout.ms, Jepsen's client
    # timeout), so most records resolve with the client's own verdict.
    delivery_ms = max(request_ms + 100, int(op_timeout_s * 1000) - 500)
    producer_config = ProducerConfig(
        acks=ACKS[options.acks],
        enable_idempotence=options.acks == "all",
        linger_ms=1,
        request_timeout_ms=request_ms,
        delivery_timeout_ms=delivery_ms,
        max_block_ms=request_ms,
    )
    consumer_config = ConsumerConfig(auto_offset_reset=OffsetResetStrategy.EARLIEST)

    def open_producer() -> Producer:
        return Producer(
            bootstrap, producer_config, credentials=credentials, rng=random.Random(rng.random())
        )

    def open_consumer() -> Consumer:
        return Consumer(
            bootstrap, consumer_config, credentials=credentials, request_timeout_ms=request_ms
        )

    async def prepare() -> None:
        await _prepare(options, controllers, credentials)

    return QueueWorkload(
        recorder,
        open_producer,
        open_consumer,
        rng,
        options.keymap,
        concurrency=concurrency,
        rate=rate,
        max_send=options.max_send,
        op_timeout_s=op_timeout_s,
        final_time_s=options.final_time_s,
        prepare=prepare,
    )

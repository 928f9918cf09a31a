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

from broker.client.consumer import ConsumerConfig, IsolationLevel, OffsetResetStrategy
from broker.client.producer_batch import Acks, ProducerConfig
from broker.grpc_client import Consumer, Producer
from chaos.workloads.queue import ZOMBIE_LANE, QueueWorkload
from history.ops import HistoryRecorder
from history.queue import ISOLATION_LEVELS, KeyMap
from metadata.client import ConfigOp, ConfigResource, MetadataClient, NewTopic

__all__ = ["ACKS", "CLEANUP_POLICIES", "GROUP_ID", "QueueOptions", "make_queue_workload"]

ACKS: Final = {"all": Acks.ALL, "1": Acks.LEADER, "0": Acks.NONE}
"""``--acks`` values."""

CLEANUP_POLICIES: Final = ("delete", "compact", "compact,delete")
"""``--cleanup-policy`` values (the topics' ``cleanup.policy``)."""

GROUP_ID: Final = "kq-queue"
"""The consumer group of the catalogue's subscribing runs."""

TRANSACTIONAL_ID_PREFIX: Final = "kq-queue"
"""A transactional run's ids: the prefix, then the worker's lane."""

TRANSACTION_TIMEOUT_MS: Final = 15_000
"""A transactional worker's ``transaction.timeout.ms``: a transaction left
open by a worker that retired is aborted by its coordinator within a run."""

GROUP_MAX_POLL_INTERVAL_MS: Final = 15_000
"""A subscribed worker's ``max.poll.interval.ms`` (its rebalance timeout):
long enough for an op cut short by the longest op timeout, short enough
that a stuck member's keys move within a run."""


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """The queue workload's flags: ``brokers`` in the cluster; ``topics``
    of ``partitions`` each (the keys: ``topics * partitions``),
    ``replication_factor`` and ``min_isr`` of each; the producer's ``acks``;
    the most records in one send (``max_send``); the final polls' deadline
    (``final_time_s``); the cluster's ``replica.lag.time.max.ms`` for the
    run (``replica_lag_ms``: short, so that ISRs shrink and grow many
    times a run).

    The topics' cleanup (set at creation, as ``min.insync.replicas``):
    ``cleanup_policy`` (``cleanup.policy``), ``retention_ms``,
    ``retention_bytes`` and ``segment_bytes`` (None: the cluster's
    default), and ``record_keys``, how many record keys the producer
    cycles through (:func:`history.queue.record_key`; 0: one per partition).  The chaos
    brokers check retention every second (``broker.log_retention_check_interval_ms``,
    Kafka's ``log.retention.check.interval.ms``) and clean one compacted log
    every tick (250 ms; the cleaner's backoff)."""

    brokers: int = 3
    topics: int = 1
    partitions: int = 4
    replication_factor: int = 3
    min_isr: int = 2
    acks: str = "all"
    max_send: int = 3
    final_time_s: float = 60.0
    replica_lag_ms: int = 1_500
    cleanup_policy: str = "delete"
    retention_ms: int | None = None
    retention_bytes: int | None = None
    segment_bytes: int | None = None
    record_keys: int = 0
    # The cluster's replica.fetch.max.bytes (None: Kafka's 1 MiB): small, a
    # follower back from a cut catches up over many fetches, not one.
    replica_fetch_max_bytes: int | None = None
    # The consumer group the workers' consumers subscribe in (None: they
    # assign themselves keys, Jepsen's ``assign``).
    group: str | None = None
    # Transactions: each worker's producer is transactional and writes in
    # txn ops (Jepsen's :txn); with zombie, lanes 0 and 1 share one
    # transactional id, each the other's zombie.
    transactional: bool = False
    zombie: bool = False
    # A transactional send's chance of going to a partition its client never
    # added to the transaction (KIP-890's buggy client; 0: a correct client).
    unadded_sends: float = 0.0
    # With zombie: lane 1 stalls this long between the micro-ops of each of
    # its transactions (a zombie's pause; 0: none).
    zombie_pause_ms: int = 0
    # The consumers' isolation.level (config.json's queue.isolation_level).
    isolation_level: str = "read_uncommitted"

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
        # At least replica.fetch.wait.max.ms's default (500): the controllers
        # refuse a lag time below the fetch wait in force (KafkaConfig).
        if not 500 <= self.replica_lag_ms <= 60_000:
            raise ValueError(f"replica_lag_ms must be in 500..60000, got {self.replica_lag_ms}")
        if self.cleanup_policy not in CLEANUP_POLICIES:
            raise ValueError(
                f"cleanup_policy must be one of {', '.join(CLEANUP_POLICIES)}, "
                f"got {self.cleanup_policy!r}"
            )
        for what in ("retention_ms", "retention_bytes"):
            value = getattr(self, what)
            if value is not None and value < -1:
                raise ValueError(f"{what} must be -1 (no limit) or more, got {value}")
        if self.replica_fetch_max_bytes is not None and self.replica_fetch_max_bytes < 1:
            raise ValueError(
                f"replica_fetch_max_bytes must be at least 1, got {self.replica_fetch_max_bytes}"
            )
        # metadata.configs: segment.bytes is at least one record's overhead.
        if self.segment_bytes is not None and self.segment_bytes < 14:
            raise ValueError(f"segment_bytes must be at least 14, got {self.segment_bytes}")
        if self.record_keys < 0:
            raise ValueError(f"record_keys must be 0 or more, got {self.record_keys}")
        if self.group is not None and not self.group.strip():
            raise ValueError("group must be a non-empty group id")
        if self.isolation_level not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)}, "
                f"got {self.isolation_level!r}"
            )
        if not 0.0 <= self.unadded_sends < 1.0:
            raise ValueError(f"unadded_sends must be in [0, 1), got {self.unadded_sends}")
        if self.unadded_sends and not self.transactional:
            raise ValueError("unadded_sends needs transactional: it skips AddPartitionsToTxn")
        if not 0 <= self.zombie_pause_ms <= 60_000:
            raise ValueError(f"zombie_pause_ms must be in 0..60000, got {self.zombie_pause_ms}")
        if self.zombie_pause_ms and not self.zombie:
            raise ValueError("zombie_pause_ms needs zombie: only the zombie stalls")
        if self.zombie and not self.transactional:
            raise ValueError("zombie needs transactional: a zombie shares a transactional id")
        if self.transactional and self.acks != "all":
            raise ValueError(f"transactional needs acks all, got {self.acks!r}")

    @property
    def compacts(self) -> bool:
        """The topics are compacted: a record superseded by a later one of
        its record key may go."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def retains(self) -> bool:
        """The topics delete old segments by a limit the run set: records
        below a partition's log start offset may go."""
        limits = (self.retention_ms, self.retention_bytes)
        return "delete" in self.cleanup_policy.split(",") and any(
            v is not None and v >= 0 for v in limits
        )

    def topic_configs(self) -> dict[str, str]:
        """The configs each queue topic is created with."""
        configs = {"min.insync.replicas": str(self.min_isr)}
        if self.cleanup_policy != "delete":
            configs["cleanup.policy"] = self.cleanup_policy
        for name, value in (
            ("retention.ms", self.retention_ms),
            ("retention.bytes", self.retention_bytes),
            ("segment.bytes", self.segment_bytes),
        ):
            if value is not None:
                configs[name] = str(value)
        return configs

    def topic_flags(self) -> str:
        """The ``kq chaos run`` flags of the topics' cleanup that differ from
        the defaults (for a run's replay command), each with a leading space."""
        out = ""
        if self.cleanup_policy != "delete":
            out += f" --cleanup-policy {self.cleanup_policy}"
        for flag, value in (
            ("--retention-ms", self.retention_ms),
            ("--retention-bytes", self.retention_bytes),
            ("--segment-bytes", self.segment_bytes),
            ("--replica-fetch-max-bytes", self.replica_fetch_max_bytes),
        ):
            if value is not None:
                out += f" {flag} {value}"
        if self.record_keys:
            out += f" --record-keys {self.record_keys}"
        if self.group is not None:
            out += f" --group {self.group}"
        if self.transactional:
            out += " --transactional"
        if self.zombie:
            out += " --zombie"
        if self.zombie_pause_ms:
            out += f" --zombie-pause-ms {self.zombie_pause_ms}"
        if self.unadded_sends:
            out += f" --unadded-sends {self.unadded_sends}"
        if self.isolation_level != "read_uncommitted":
            out += f" --isolation-level {self.isolation_level}"
        return out

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
            "cleanup_policy": self.cleanup_policy,
            "retention_ms": self.retention_ms,
            "retention_bytes": self.retention_bytes,
            "segment_bytes": self.segment_bytes,
            "record_keys": self.record_keys,
            "replica_fetch_max_bytes": self.replica_fetch_max_bytes,
            "group": self.group,
            "transactional": self.transactional,
            "zombie": self.zombie,
            "unadded_sends": self.unadded_sends,
            "zombie_pause_ms": self.zombie_pause_ms,
            "isolation_level": self.isolation_level,
        }


async def _prepare(
    options: QueueOptions,
    controllers: Mapping[int, str],
    credentials: grpc.ChannelCredentials | None,
    timeout_s: float = 60.0,
) -> None:
    """Set ``replica.lag.time.max.ms`` (and ``replica.fetch.max.bytes`` if
    given), create the topics and wait until each partition has a leader and
    a full ISR."""
    client = MetadataClient(list(controllers.values()), timeout_s=10.0, credentials=credentials)
    try:
        ops = [ConfigOp("replica.lag.time.max.ms", str(options.replica_lag_ms))]
        if options.replica_fetch_max_bytes is not None:
            ops.append(ConfigOp("replica.fetch.max.bytes", str(options.replica_fetch_max_bytes)))
        answer = await client.alter_configs({ConfigResource.cluster(): ops})
        bad = [r for r in answer.results if r.error != 0]
        if bad:
            raise RuntimeError(f"setting the cluster's replica configs failed: {bad}")
        keymap = options.keymap
        created = await client.create_topics(
            [
                NewTopic(
                    name,
                    partitions,
                    options.replication_factor,
                    configs=options.topic_configs(),
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
    consumer_config = ConsumerConfig(
        auto_offset_reset=OffsetResetStrategy.EARLIEST,
        isolation_level=IsolationLevel(options.isolation_level),
    )

    def open_producer(transactional_id: str | None = None) -> Producer:
        # The client real users run: OUT_OF_ORDER_SEQUENCE_NUMBER for the
        # next expected batch is read as Kafka's client reads it (a bump and
        # a resend), so a broker that refuses a duplicate so is caught.
        return Producer(
            bootstrap,
            producer_config,
            credentials=credentials,
            rng=random.Random(rng.random()),
            kafka_out_of_order=True,
            transactional_id=transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        )

    def open_consumer() -> Consumer:
        if options.group is None:
            return Consumer(
                bootstrap, consumer_config, credentials=credentials, request_timeout_ms=request_ms
            )
        # Every commit is an op of its own (no auto-commit); a member that
        # stops polling (a worker stuck in a long send) is fenced after
        # GROUP_MAX_POLL_INTERVAL_MS rather than Kafka's five minutes.
        return Consumer(
            bootstrap,
            consumer_config,
            credentials=credentials,
            request_timeout_ms=request_ms,
            group_id=options.group,
            enable_auto_commit=False,
            max_poll_interval_ms=GROUP_MAX_POLL_INTERVAL_MS,
        )

    def open_txn_producer(lane: int) -> Producer:
        # A lane's transactional id; with zombie, lane 1 takes lane 0's.
        shared = 0 if options.zombie and lane == ZOMBIE_LANE else lane
        return open_producer(f"{TRANSACTIONAL_ID_PREFIX}-{shared}")

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
        record_keys=options.record_keys,
        compacts=options.compacts,
        retains=options.retains,
        group=options.group is not None,
        open_txn_producer=open_txn_producer if options.transactional else None,
        read_committed=options.isolation_level == "read_committed",
        unadded_sends=options.unadded_sends,
        zombie_pause_s=options.zombie_pause_ms / 1000,
    )

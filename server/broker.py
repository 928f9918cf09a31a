"""A broker process: the data plane of :mod:`broker` driven by the metadata
quorum.

:class:`BrokerProcess` puts the pieces together on one gRPC server:

- a :class:`~quorum.driver.server.NodeServer` that follows the metadata log
  as an observer of the controller quorum (never a voter) and replays it
  into its own :class:`~metadata.image.MetadataImage`; each new image goes to
  the :class:`~broker.replica_manager.ReplicaManager` (become leader, become
  follower, stop, delete) and wakes the service's waiters;
- the :class:`~broker.service.BrokerService` on the same listener (mutual
  TLS when the node has TLS files, as the controllers);
- its lifecycle with the active controller: RegisterBroker (a new
  incarnation id, the listener's endpoint, the rack), a BrokerHeartbeat
  every ``heartbeat_interval_ms`` with the metadata offset applied (the
  controller unfences the broker once it has caught up), AlterPartition
  for the ISR changes its partitions decide, AllocateProducerIds behind
  InitProducerId;
- one replica fetcher per leader broker: a ReplicaFetch stream carrying
  every partition fetched from that leader, reconnected with backoff;
- on :meth:`BrokerProcess.stop`, a controlled shutdown (heartbeats with
  ``want_shutdown`` until the controller has moved leadership away) before
  the logs are closed cleanly;
- its metrics in the node's registry (served on ``metrics_listen``): the
  partition gauges computed when scraped, and the data plane's
  (:class:`~server.broker_metrics.PrometheusBrokerMetrics`, given to the
  replica manager and the service).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import Gauge
from prometheus_client.core import GaugeMetricFamily

from broker.codec import answers_in, fetch_answers, replica_fetch_request
from broker.coordinator_runtime import InternalTopicSettings
from broker.errors import Errors, from_name
from broker.fetch_session import FollowerFetchSession
from broker.group.placement import OFFSETS_TOPIC
from broker.group.shard import GroupConfig
from broker.group_coordinator import GroupCoordinator, OffsetsTopicSettings
from broker.group_service import GroupService
from broker.log_dirs import LogDirectory
from broker.log_manager import (
    RETENTION_CHECK_INTERVAL_MS,
    LogManager,
    LogManagerError,
    TopicConfigError,
    replica_fetcher_config,
)
from broker.os_log_dirs import OsLogDirectory
from broker.producer_ids import BlockProducerIds, ProducerIdBlock, ProducerIdsError
from broker.replica import AlterPartitionRequest, FetcherConfig
from broker.replica import Role as ReplicaRole
from broker.replica.follower import backs_off
from broker.replica.types import AlterPartitionResult, Restart, Truncation
from broker.replica_manager import ReplicaManager
from broker.service import BrokerService, ServiceSettings
from broker.txn.coordinator import TxnConfig
from broker.txn.placement import TRANSACTION_STATE_TOPIC
from broker.txn_coordinator import (
    TransactionCoordinator,
    TransactionStateTopicSettings,
)
from broker.txn_links import BrokerTxnLinks
from broker.txn_markers import TxnMarkerAppender
from broker.txn_service import TransactionService
from kqproto import (
    broker_pb2,
    broker_pb2_grpc,
    groups_pb2,
    groups_pb2_grpc,
    metadata_pb2,
    txn_pb2,
    txn_pb2_grpc,
)
from metadata.authorizer import AuthorizerSettings
from metadata.client import (
    Endpoint,
    IndeterminateError,
    MetadataClient,
    MetadataClientError,
    NewTopic,
    PartitionChange,
    SupportedFeature,
)
from metadata.delta import MetadataDelta
from metadata.errors import Errors as MetadataErrors
from metadata.image import MetadataImage, TopicIdPartition
from metadata.records import LeaderRecoveryState
from metadata.service import is_reserved_directory_id, is_uuid
from metadata.state_machine import ControllerStateMachine
from partition_log.errors import PartitionLogError
from partition_log.os_files import (
    OsDirectory,
    PowerLossOsDirectory,
    TornTailOsDirectory,
    tear_unsynced_tails,
)
from quorum.driver.client import ChannelPool
from quorum.driver.node import NodeOptions
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.snapshot_files import fsync_dir
from quorum.driver.storage_format import StorageFormatError, open_node_storage, read_meta
from quorum.driver.tls import TlsFiles, dial
from quorum.shared_log import SharedLog
from quorum.types import Batch
from server.broker_metrics import PrometheusBrokerMetrics
from server.config import SETTINGS, ConfigError, Settings, controller_config
from server.errors import EXIT_FAILURE
from server.injected_bugs import install_from_environment
from server.storage_mode import (
    StorageModeError,
    lose_unsynced_from_environment,
    torn_tails_from_environment,
)

__all__ = [
    "BrokerProcess",
    "BrokerSettings",
    "LogDirFormatError",
    "broker_config",
    "check_log_dirs",
    "new_directory_id",
    "format_log_dirs",
    "run_broker",
]

log = logging.getLogger("kq.broker")

# The features this broker supports (what the controllers finalize).
FEATURES = (SupportedFeature("metadata.version", 1, 1),)
_BACKOFF_S = (0.05, 1.0)
# Partition logs created between two turns of the broker's loop when an
# image creates many (_publish): about 0.4 s of creation on a slow disk.
_CREATE_PART = 50
_PART_PAUSE_S = 0.02


# Kafka's replica.high.watermark.checkpoint.interval.ms: each changed HW is
# written (a file, its fsync, a rename and the directory's fsync) at most this
# often, not on every tick (with many partitions, a tick's syncs held the
# event loop for seconds). A crash loses at most one interval of HW advances:
# the restarted replica starts from a lower HW, which the leader's answers
# raise again (Kafka's ReplicaManager.checkpointHighWatermarks).
HW_CHECKPOINT_INTERVAL_MS = 5_000

# The shortest wait for a heartbeat's answer (heartbeat_timeout_s).
HEARTBEAT_TIMEOUT_FLOOR_S = 2.0


@dataclass(frozen=True)
class BrokerSettings:
    """What one broker process needs."""

    node_id: int
    cluster_id: str
    # The controller quorum: voter id -> host:port.
    voters: dict[int, str]
    # The observer's metadata log (formatted as a node's storage).
    metadata_dir: Path
    log_dirs: Sequence[Path]
    # host:port of the broker's listener (the metadata observer and the
    # broker service share it).
    listen: str
    rack: str | None = None
    listener_name: str = "BROKER"
    tls: TlsFiles | None = None
    options: NodeOptions = field(default_factory=NodeOptions)
    authorizer: AuthorizerSettings = field(default_factory=AuthorizerSettings)
    heartbeat_interval_ms: int = 500
    # How often the ISR expiration and the log manager's tasks run.
    tick_interval_ms: int = 250
    # Kafka's replica.high.watermark.checkpoint.interval.ms.
    hw_checkpoint_interval_ms: int = HW_CHECKPOINT_INTERVAL_MS
    # Kafka's log.retention.check.interval.ms.
    log_retention_check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS
    controlled_shutdown_timeout_s: float = 30.0
    metrics_listen: str = ""
    # The group coordinator's settings and its offsets topic's.
    groups: GroupConfig = field(default_factory=GroupConfig)
    offsets_topic: OffsetsTopicSettings = field(default_factory=OffsetsTopicSettings)
    # The transaction coordinator's settings and its transaction log's.
    transactions: TxnConfig = field(default_factory=TxnConfig)
    transaction_topic: TransactionStateTopicSettings = field(
        default_factory=TransactionStateTopicSettings
    )


def heartbeat_timeout_s(interval_ms: int) -> float:
    """How long a heartbeat waits for its answer before the next is sent.
    The active controller counts a heartbeat when it arrives but answers it
    only once its earlier writes have committed; while thousands of
    partitions' records commit that took longer than the session, and a
    broker waiting on its one heartbeat sent no other, so the controller
    fenced it. Kafka's BrokerLifecycleManager likewise sends again when an
    answer does not come in time (``HeartbeatResponseHandler.onTimeout``)."""
    return max(HEARTBEAT_TIMEOUT_FLOOR_S, 4 * interval_ms / 1000)


def _error_name(code: int) -> Errors:
    """A controller's error code as the broker's error of the same name
    (``UNKNOWN_SERVER_ERROR`` for a code or name the data plane lacks)."""
    try:
        return from_name(MetadataErrors(code).name)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


def new_incarnation_id() -> str:
    """A Kafka Uuid: 16 random bytes in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class _ControllerBlocks:
    """Producer id blocks from the active controller (AllocateProducerIds)."""

    def __init__(self, process: BrokerProcess) -> None:
        self.process = process

    async def allocate_block(self) -> ProducerIdBlock:
        p = self.process
        try:
            answer = await p.client.allocate_producer_ids(p.settings.node_id, p.broker_epoch)
        except (MetadataClientError, IndeterminateError) as error:
            raise ProducerIdsError(f"AllocateProducerIds failed: {error}") from error
        if answer.error != 0:
            raise ProducerIdsError(
                f"AllocateProducerIds: {metadata_pb2.MetadataError.Name(answer.error)} "
                f"{answer.message}"
            )
        return ProducerIdBlock(answer.first_producer_id, answer.count)


class _BrokerPlugin:
    """The broker's services (the data plane's, the groups' and the
    transactions') on the observer node's gRPC server."""

    def __init__(
        self, service: BrokerService, groups: GroupService, transactions: TransactionService
    ) -> None:
        self.service = service
        self.groups = groups
        self.transactions = transactions
        self.service_names: Sequence[str] = (
            broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].full_name,
            groups_pb2.DESCRIPTOR.services_by_name["GroupService"].full_name,
            txn_pb2.DESCRIPTOR.services_by_name["TransactionService"].full_name,
        )

    def add_to_server(self, server: grpc.aio.Server) -> None:
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(self.service, server)
        groups_pb2_grpc.add_GroupServiceServicer_to_server(self.groups, server)
        txn_pb2_grpc.add_TransactionServiceServicer_to_server(self.transactions, server)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _back_off(delay_s: float) -> float:
    """Wait ``delay_s`` after a failure; the delay after the next one:
    doubled, up to ``_BACKOFF_S``'s longest."""
    await asyncio.sleep(delay_s)
    return min(delay_s * 2, _BACKOFF_S[1])


# The partition gauges, ``kq_broker_<name>_partitions``: (name, help).
_PARTITION_GAUGES = (
    ("leader", "Partitions led here."),
    ("under_replicated", "Partitions led here whose ISR is smaller than their replicas."),
    ("under_min_isr", "Partitions led here whose ISR is below min.insync.replicas."),
    ("offline", "Partitions whose log could not be served here."),
)


class _PartitionGauges:
    """The partition gauges, all from one :meth:`BrokerProcess.partition_counts`
    per scrape (a gauge each would walk every replica once per gauge)."""

    def __init__(self, node: str, counts: Callable[[], dict[str, int]]) -> None:
        self._node = node
        self._counts = counts

    def _families(self, counts: dict[str, int] | None) -> Iterator[GaugeMetricFamily]:
        for name, doc in _PARTITION_GAUGES:
            family = GaugeMetricFamily(f"kq_broker_{name}_partitions", doc, labels=["node"])
            if counts is not None:
                family.add_metric([self._node], float(counts[name]))
            yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return self._families(None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self._families(self._counts())


class BrokerProcess:
    """One broker; :meth:`start`, then :meth:`stop`.  With ``lose_unsynced``
    its partition logs and metadata log run in the power-loss test mode
    (:mod:`server.storage_mode`); with ``torn_tails`` too, its segment files
    mirror their unsynced tails for the next start to tear."""

    def __init__(
        self,
        settings: BrokerSettings,
        log_dirs: Sequence[LogDirectory] | None = None,
        *,
        lose_unsynced: bool = False,
        torn_tails: bool = False,
        directory_ids: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        files = (
            TornTailOsDirectory
            if torn_tails
            else PowerLossOsDirectory
            if lose_unsynced
            else OsDirectory
        )
        dirs = (
            log_dirs
            if log_dirs is not None
            else [OsLogDirectory(d, files) for d in settings.log_dirs]
        )
        # The data plane's metrics, in the node's registry once it exists.
        self.broker_metrics = PrometheusBrokerMetrics(settings.node_id)
        self.replicas = ReplicaManager(
            settings.node_id,
            LogManager(
                list(dirs),
                retention_check_interval_ms=settings.log_retention_check_interval_ms,
            ),
            metrics=self.broker_metrics,
        )
        self.metadata = ControllerStateMachine()
        self.broker_epoch = -1
        # The broker epoch a clean shutdown of the previous run left in the
        # log directories (KIP-966), read at start; -1 after a crash.
        self.previous_broker_epoch = -1
        self._clean_shutdown_dirs = [Path(d) for d in settings.log_dirs] if log_dirs is None else []
        # The log directories' ids it registers (KIP-858), as
        # check_log_dirs found them at start.
        self.directory_ids = tuple(directory_ids)
        self.fenced = True
        self.incarnation_id = new_incarnation_id()
        credentials = None if settings.tls is None else settings.tls.channel_credentials()
        self._credentials = credentials
        # The follower fetch settings of the image they were read from: an
        # image is immutable, so they are read once per image, not per fetch.
        self._fetcher: tuple[MetadataImage, FetcherConfig] | None = None
        # node.dscp marks every channel the broker opens to another node as
        # its Raft observer's (quorum.driver.transport): the controllers'
        # (registration, heartbeats, AlterPartition, producer ids) and the
        # leaders' (replica fetches).  A partition of the chaos harness cuts
        # a node by its mark (chaos.netfilter); an unmarked heartbeat would
        # get through it, so a broker cut off from the controllers would
        # keep its session and its leaderships (Kafka fences it when its
        # heartbeats stop: broker.session.timeout.ms).
        dscp = settings.options.dscp
        self._channel_options: list[tuple[str, int]] = [("grpc.dscp", dscp)] if dscp else []
        self.client = MetadataClient(
            list(settings.voters.values()), credentials=credentials, options=self._channel_options
        )
        producer_ids = BlockProducerIds(_ControllerBlocks(self))
        self.service = BrokerService(
            self.replicas,
            ServiceSettings(settings.cluster_id, settings.listener_name, settings.authorizer),
            image=lambda: self.replicas.image,
            producer_ids=producer_ids,
            on_alter_partition=self._queue_alter,
            controller_id=self._controller_id,
        )
        self.groups = GroupCoordinator(
            settings.node_id,
            self.replicas,
            self.service.purgatory,
            config=settings.groups,
            topic=settings.offsets_topic,
            now_ms=_now_ms,
            create_offsets_topic=self._create_offsets_topic,
            metrics=self.broker_metrics,
        )
        self.group_service = GroupService(
            self.groups, listener=settings.listener_name, authorizer=settings.authorizer
        )
        # Transactions: the coordinator of the ids whose __transaction_state
        # partitions lead here, the markers written to this broker's
        # partitions, and the links to the other brokers (markers out,
        # KIP-890 verifications) over the broker's certificate and mark.
        self._pool = ChannelPool(credentials, options=self._channel_options)
        self.transactions = TransactionCoordinator(
            settings.node_id,
            self.replicas,
            self.service.purgatory,
            markers=None,
            producer_ids=producer_ids,
            config=settings.transactions,
            topic=settings.transaction_topic,
            offsets_partitions=settings.offsets_topic.partitions,
            now_ms=_now_ms,
            create_topic=self._create_transaction_topic,
        )
        appender = TxnMarkerAppender(
            self.replicas, self.service.purgatory, self.groups, now_ms=_now_ms
        )
        self.txn_links = BrokerTxnLinks(
            settings.node_id,
            lambda: self.replicas.image,
            settings.listener_name,
            self._pool,
            coordinator=self.transactions,
            appender=appender,
        )
        # The links reach this coordinator for verifications to itself: they
        # are its marker writer once both exist.
        self.transactions.markers = self.txn_links
        self.service.transactions = self.transactions
        self.service.txn_verifier = self.txn_links
        self.groups.txn_verifier = self.txn_links
        self.txn_service = TransactionService(
            self.transactions,
            appender,
            listener=settings.listener_name,
            authorizer=settings.authorizer,
        )
        self.node = NodeServer(
            NodeConfig(
                settings.node_id,
                settings.cluster_id,
                settings.voters,
                settings.metadata_dir,
                listen=settings.listen,
                options=settings.options,
                metrics_listen=settings.metrics_listen,
                tls=settings.tls,
            ),
            open_node_storage(
                settings.metadata_dir, settings.cluster_id, settings.node_id, lose_unsynced=True
            )
            if lose_unsynced
            else None,
            state_machine=SharedLog([("metadata", self.metadata)]),
            plugins=[
                lambda host: _BrokerPlugin(self.service, self.group_service, self.txn_service)
            ],
        )
        self._metrics()
        self.metadata.add_listener(self._on_commit)
        self.metadata.add_load_listener(self._on_load)
        self.metadata.add_batch_listener(self._on_batch)
        # The observer's high watermark when it starts: its log start (the
        # HW is not persisted), so one above it came from the leader. The
        # first such HW is where the metadata log is caught up.
        self._start_high_watermark = self.node.raft.core.high_watermark
        self._catch_up_offset: int | None = None
        self._alters: asyncio.Queue[tuple[TopicIdPartition, AlterPartitionRequest]] = (
            asyncio.Queue()
        )
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        # The fetch session of each leader's stream (broker.fetch_session).
        self._fetch_sessions: dict[int, FollowerFetchSession] = {}
        # Each partition's state in its last state line (_log_partition_states).
        self._states_logged: dict[TopicIdPartition, tuple[str, tuple[object, ...]]] = {}
        # The image waiting for its logs to be created in parts, and the task
        # creating them (_publish).
        self._pending: MetadataImage | None = None
        self._applier: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._registered = asyncio.Event()
        self._stopping = False
        # Why the broker cannot go on (its logs would not load), if so.
        self.failure: str | None = None

    # -- metrics --------------------------------------------------------------------

    def partition_counts(self) -> dict[str, int]:
        """Partitions led here, and of them those whose committed ISR is
        smaller than their replicas (under-replicated) or than their
        ``min.insync.replicas`` (under min ISR); partitions offline here."""
        led = under_replicated = under_min_isr = 0
        image = self.replicas.image
        # A copy: a scrape runs on the exporter's thread while the loop may
        # add or remove replicas.
        for key, replica in list(self.replicas.replicas.items()):
            if replica.role is not ReplicaRole.LEADER:
                continue
            registration = image.partition(key.topic_id, key.partition)
            if registration is None:
                continue
            led += 1
            under_replicated += len(registration.isr) < len(registration.replicas)
            under_min_isr += len(registration.isr) < replica.min_isr
        return {
            "leader": led,
            "under_replicated": under_replicated,
            "under_min_isr": under_min_isr,
            "offline": len(self.replicas.offline),
        }

    def _metrics(self) -> None:
        registry = self.node.registry
        node = str(self.settings.node_id)
        registry.register(self.broker_metrics.registry)
        self.broker_metrics.track(self.service)
        self.broker_metrics.track_groups(self.groups)

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(name, doc, ["node"], registry=registry).labels(node=node).set_function(value)

        gauge(
            "kq_broker_metadata_offset",
            "The metadata log offset the broker has applied.",
            lambda: self.metadata.applied_offset,
        )
        gauge("kq_broker_fenced", "1 while the controller fences the broker.", lambda: self.fenced)
        registry.register(_PartitionGauges(node, self.partition_counts))

    # -- the image ------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self.replicas.image

    def _controller_id(self) -> int:
        leader = self.metadata.leader.leader_id
        return -1 if leader is None else leader

    def _on_commit(self, delta: MetadataDelta, image: MetadataImage) -> None:
        self._publish(image)

    def _on_load(self, image: MetadataImage) -> None:
        self._publish(image)

    def _publish(self, image: MetadataImage) -> None:
        """Apply ``image`` now, or, when it creates more partition logs than
        one part, in :meth:`_apply_in_parts` (and every later image after
        it, in order). Creating thousands of logs in one synchronous apply
        held the loop for seconds: no heartbeat went out and the controller
        fenced the broker (Kafka creates them on the metadata publisher's
        thread; the heartbeats have ``BrokerLifecycleManager``'s own)."""
        if self._pending is None and (
            self.replicas.loaded is None
            or self.replicas.shut_down
            or self._stopping
            or len(self.replicas.logs_to_create(image)) <= _CREATE_PART
        ):
            self._apply(image)
            return
        first = self._pending is None
        self._pending = image
        if first:
            self._applier = asyncio.get_running_loop().create_task(
                self._apply_in_parts(), name="broker-apply"
            )

    async def _apply_in_parts(self) -> None:
        """Create the new logs of the pending image a part at a time, the
        loop running between parts, then apply that image (whose apply finds
        its logs there); a newer image that came meanwhile is next."""
        while self._pending is not None:
            image = self._pending
            todo = self.replicas.logs_to_create(image)
            for start in range(0, len(todo), _CREATE_PART):
                if self._stopping or self.replicas.shut_down:
                    self._pending = None
                    return
                self.replicas.create_logs(image, todo[start : start + _CREATE_PART], _now_ms())
                # Real time, not one turn: an RPC in flight (a heartbeat and
                # its answer) needs several turns of the loop to complete.
                await asyncio.sleep(_PART_PAUSE_S)
            if self._pending is image:
                self._pending = None
            try:
                self._apply(image)
            except Exception:
                log.exception("broker %d: applying metadata failed", self.settings.node_id)

    def _on_batch(self, batch: Batch) -> None:
        # While catching up, any batch may be the one that reaches the high
        # watermark, a leader change's too (no commit listener call).
        if self.replicas.loaded is None:
            self._apply(self.metadata.image)

    def _caught_up_offset(self) -> int | None:
        """Where the first publish may come: past the high watermark learned
        at start, once the leader told it, and past this process's
        registration (the record at its broker epoch), as Kafka's
        BrokerServer publishes only once the controller says the broker
        caught up to its registration (``initialCatchUpFuture``).  Before
        it, a restarted broker's image still gives it the leaderships and
        ISR places of its previous process, which the registration takes
        away: applied, it would lead with a log that a power loss cut short,
        and its followers would truncate to that log, acknowledged records
        and all."""
        if self._catch_up_offset is None:
            high_watermark = self.node.raft.core.high_watermark
            if high_watermark > self._start_high_watermark:
                self._catch_up_offset = high_watermark
        if self._catch_up_offset is None or not self._registered.is_set():
            return None
        return max(self._catch_up_offset, self.broker_epoch + 1)

    def _apply(self, image: MetadataImage) -> None:
        if self.replicas.shut_down:
            return
        now = _now_ms()
        if self.failure is not None:
            return
        loading = self.replicas.loaded is None
        try:
            # Nothing until the image is caught up: the logs are loaded, and
            # strays decided, against a whole image, never a partial one.
            result = self.replicas.publish(image, self._caught_up_offset(), now)
        except (LogManagerError, PartitionLogError, OSError, ValueError) as error:
            if not loading:
                raise
            # Kafka's LogManager.startup failing: the broker cannot serve.
            self.failure = f"cannot load its log directories: {error}"
            log.error("broker %d %s", self.settings.node_id, self.failure)
            return
        if result is None:
            return
        if loading:
            log.info(
                "broker %d loaded its logs at metadata offset %d: %s",
                self.settings.node_id,
                image.offset,
                self.replicas.loaded,
            )
            self._log_recoveries()
        for key, why in result.failed.items():
            log.error("broker %d: partition %s is offline: %s", self.settings.node_id, key, why)
        self._plan_fetchers()
        self._mark_fetch_sessions()
        self.service.wake()
        self.groups.on_image(image)
        self.transactions.on_image(image)

    def _log_recoveries(self) -> None:
        """What recovery cut from each log loaded after an unclean shutdown
        (Kafka's "Found invalid messages in log segment ..."): a torn or
        damaged tail cut off, the later segments dropped."""
        loaded = self.replicas.loaded
        for key in loaded.loaded if loaded is not None else ():
            partition_log = self.replicas.logs.log(key)
            where = self.replicas.logs.location(key)
            if partition_log is None or where is None:
                continue
            recovery = partition_log.recovery
            if recovery.clean or not (recovery.truncated_bytes or recovery.dropped_segments):
                continue
            log.warning(
                "broker %d partition %s recovered after an unclean shutdown: cut %d bytes of "
                "%s at position %s (%s), dropped segments %s, log end offset %d",
                self.settings.node_id,
                where[1],
                recovery.truncated_bytes,
                recovery.cut_segment,
                recovery.cut_position,
                recovery.reason,
                list(recovery.dropped_segments),
                recovery.log_end_offset,
            )

    def _plan_fetchers(self) -> None:
        if self._stopping:
            return
        wanted = set(self.replicas.fetchers())
        for leader in list(self._fetchers):
            if leader not in wanted:
                self._fetchers.pop(leader).cancel()
        for leader in wanted:
            task = self._fetchers.get(leader)
            if task is None or task.done():
                self._fetchers[leader] = asyncio.get_running_loop().create_task(
                    self._fetch_from(leader), name=f"fetch-from-{leader}"
                )

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self.previous_broker_epoch = take_clean_shutdown_epoch(self._clean_shutdown_dirs)
        await self.node.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._lifecycle(), name="broker-lifecycle"),
            loop.create_task(self._send_alters(), name="broker-alter-partition"),
            loop.create_task(self._tick(), name="broker-tick"),
        ]
        self._plan_fetchers()

    @property
    def address(self) -> str:
        return self.node.config.address

    def _endpoint(self) -> Endpoint:
        host, _, port = self.settings.listen.rpartition(":")
        protocol = "PLAINTEXT" if self.settings.tls is None else "SSL"
        return Endpoint(self.settings.listener_name, host, int(port), protocol)

    async def _register(self) -> None:
        delay = _BACKOFF_S[0]
        while True:
            try:
                answer = await self.client.register_broker(
                    self.settings.node_id,
                    cluster_id=self.settings.cluster_id,
                    incarnation_id=self.incarnation_id,
                    endpoints=[self._endpoint()],
                    rack=self.settings.rack,
                    features=FEATURES,
                    previous_broker_epoch=(
                        self.broker_epoch if self.broker_epoch >= 0 else self.previous_broker_epoch
                    ),
                    log_dirs=self.directory_ids,
                )
            except (MetadataClientError, IndeterminateError) as error:
                log.warning("broker %d: RegisterBroker failed: %s", self.settings.node_id, error)
                answer = None
            if answer is not None and answer.error == 0:
                self.broker_epoch = answer.broker_epoch
                self._registered.set()
                log.info(
                    "broker %d registered with epoch %d", self.settings.node_id, self.broker_epoch
                )
                if self.replicas.loaded is None:
                    # The metadata copy may have passed the registration
                    # before its answer came: no later commit need come.
                    self._publish(self.metadata.image)
                return
            if answer is not None:
                log.warning(
                    "broker %d: RegisterBroker refused: %s %s",
                    self.settings.node_id,
                    metadata_pb2.MetadataError.Name(answer.error),
                    answer.message,
                )
            delay = await _back_off(delay)

    async def _heartbeat(
        self, *, want_shutdown: bool = False
    ) -> metadata_pb2.BrokerHeartbeatResponse:
        return await self.client.broker_heartbeat(
            self.settings.node_id,
            self.broker_epoch,
            self.metadata.applied_offset,
            # Unfenced only once the logs are loaded (Kafka's
            # BrokerLifecycleManager.setReadyToUnfence after the first publish).
            want_fence=not want_shutdown and self.replicas.loaded is None,
            want_shutdown=want_shutdown,
            timeout_s=heartbeat_timeout_s(self.settings.heartbeat_interval_ms),
        )

    async def _lifecycle(self) -> None:
        await self._register()
        interval = self.settings.heartbeat_interval_ms / 1000
        while not self._stopping and self.failure is None:
            try:
                answer = await self._heartbeat()
            except MetadataClientError as error:
                log.warning("broker %d: heartbeat refused: %s", self.settings.node_id, error)
                if error.code is MetadataErrors.STALE_BROKER_EPOCH:
                    await self._register()
                    continue
            except IndeterminateError as error:
                log.warning("broker %d: heartbeat failed: %s", self.settings.node_id, error)
            else:
                if answer.error == 0:
                    if self.fenced != answer.is_fenced:
                        log.info(
                            "broker %d is %s",
                            self.settings.node_id,
                            "fenced" if answer.is_fenced else "unfenced",
                        )
                    self.fenced = answer.is_fenced
            await asyncio.sleep(interval)

    async def _tick(self) -> None:
        interval = self.settings.tick_interval_ms / 1000
        checkpointed_ms = _now_ms()
        # Where the partition state lines of this process start (the run's
        # node exports read them: chaos.node_exports.partition_timeline).
        log.info(
            "broker %d samples its partitions every %d ms",
            self.settings.node_id,
            self.settings.tick_interval_ms,
        )
        while True:
            await asyncio.sleep(interval)
            if self.replicas.shut_down:
                return
            now = _now_ms()
            for key, request in self.replicas.tick_isr(now):
                self._queue_alter(key, request)
            self._log_partition_states()
            tick = self.replicas.logs.tick(now)
            if tick.retained:
                # Log starts moved: a leader's followers learn it, a
                # follower's leaders are told its new one.
                self.service.wake(tick.retained)
                self._mark_fetch_sessions()
            for key, why in tick.failed.items():
                log.error("broker %d: the log of %s failed: %s", self.settings.node_id, key, why)
            if now - checkpointed_ms < self.settings.hw_checkpoint_interval_ms:
                continue
            checkpointed_ms = now
            try:
                self.replicas.logs.checkpoint_high_watermarks()
            except (OSError, PartitionLogError) as error:
                log.error(
                    "broker %d: cannot checkpoint high watermarks: %s", self.settings.node_id, error
                )

    def _partition_name(self, key: TopicIdPartition) -> str:
        topic = self.image.topics.get(key.topic_id)
        return f"{topic.name if topic is not None else key.topic_id}-{key.partition}"

    def _log_partition_states(self) -> None:
        """One line per partition whose role, leader, leader epoch, HW, log
        end, log start or ISR changed since its last line: the HW and LEO
        over time per replica that the run's checks and plots read (a HW or
        leader epoch that goes down, or a log start above the HW, is a bug;
        Kafka's replica state is only in metrics)."""
        seen = self._states_logged
        for key, replica in self.replicas.replicas.items():
            state = (
                replica.role.value,
                replica.leader_id,
                replica.leader_epoch,
                replica.log.high_watermark,
                replica.log.log_end_offset,
                replica.log.log_start_offset,
                replica.isr,
            )
            last = seen.get(key)
            if last is not None and last[1] == state:
                continue
            name = last[0] if last is not None else self._partition_name(key)
            seen[key] = (name, state)
            log.info(
                "broker %d partition %s: role %s leader %d epoch %d hw %d leo %d start %d isr %s",
                self.settings.node_id,
                name,
                *state[:6],
                ",".join(map(str, state[6])),
            )
        for key in [k for k in seen if k not in self.replicas.replicas]:
            # Gone from this broker (reassigned away, deleted): a replica
            # that comes back starts a new log, from HW 0.
            name, _ = seen.pop(key)
            log.info("broker %d partition %s removed", self.settings.node_id, name)

    # -- AlterPartition ---------------------------------------------------------------

    def _queue_alter(self, key: TopicIdPartition, request: AlterPartitionRequest) -> None:
        self._alters.put_nowait((key, request))

    async def _send_alters(self) -> None:
        await self._registered.wait()
        while True:
            batch = [await self._alters.get()]
            while not self._alters.empty():
                batch.append(self._alters.get_nowait())
            try:
                await self._alter(batch)
            except MetadataClientError as error:
                log.warning("broker %d: AlterPartition refused: %s", self.settings.node_id, error)
                await asyncio.sleep(_BACKOFF_S[0])
                for key, request in batch:
                    replica = self.replicas.replicas.get(key)
                    if replica is None:
                        continue
                    again = replica.step_alter_partition_error(request, _error_name(error.code))
                    if again is not None:
                        self._queue_alter(key, again)
            except IndeterminateError as error:
                log.warning("broker %d: AlterPartition failed: %s", self.settings.node_id, error)
                await asyncio.sleep(_BACKOFF_S[0])
                for item in batch:
                    # Still pending: sent again; a change made meanwhile
                    # is found by its partition epoch.
                    self._queue_alter(*item)

    async def _alter(self, batch: list[tuple[TopicIdPartition, AlterPartitionRequest]]) -> None:
        # One in flight per partition: the last one queued for each.
        latest = dict(batch)
        changes = [
            PartitionChange(
                key.topic_id,
                key.partition,
                request.leader_epoch,
                request.partition_epoch,
                [(m.broker_id, m.broker_epoch) for m in request.new_isr],
                leader_recovered=request.leader_recovery_state is LeaderRecoveryState.RECOVERED,
            )
            for key, request in latest.items()
        ]
        answer = await self.client.alter_partition(
            self.settings.node_id, self.broker_epoch, changes
        )
        results: dict[TopicIdPartition, metadata_pb2.AlterPartitionPartitionResult] = {}
        for topic in answer.topics:
            for result in topic.partitions:
                results[TopicIdPartition(topic.topic_id, result.partition)] = result
        now = _now_ms()
        retry: list[tuple[TopicIdPartition, AlterPartitionRequest]] = []
        for key, request in latest.items():
            replica = self.replicas.replicas.get(key)
            if replica is None:
                continue
            found = results.get(key)
            error = answer.error if answer.error != 0 or found is None else found.error
            if error == 0 and found is not None:
                moved = self.replicas.step_alter_partition_result(
                    key,
                    request,
                    AlterPartitionResult(
                        found.leader,
                        found.leader_epoch,
                        found.partition_epoch,
                        tuple(found.isr),
                        LeaderRecoveryState.RECOVERING
                        if found.leader_recovering
                        else LeaderRecoveryState.RECOVERED,
                    ),
                    now,
                )
                if moved:
                    self.service.wake([key])
                continue
            again = replica.step_alter_partition_error(
                request, _error_name(error or Errors.UNKNOWN_SERVER_ERROR.value)
            )
            if again is not None:
                retry.append((key, again))
        if retry:
            await asyncio.sleep(_BACKOFF_S[0])
            for item in retry:
                self._queue_alter(*item)

    # -- replica fetchers -------------------------------------------------------------

    def _leader_address(self, leader: int) -> str | None:
        registration = self.image.brokers.get(leader)
        if registration is None:
            return None
        for endpoint in registration.endpoints:
            if endpoint.name == self.settings.listener_name:
                return f"{endpoint.host}:{endpoint.port}"
        return None

    async def _fetch_from(self, leader: int) -> None:
        """The fetcher of every partition led by ``leader``: one stream,
        reconnected with backoff while the plan names the leader."""
        await self._registered.wait()
        delay = _BACKOFF_S[0]
        while not self._stopping and self.replicas.is_fetching_from(leader):
            address = self._leader_address(leader)
            if address is None:
                await asyncio.sleep(delay)
                continue
            try:
                # Marked (node.dscp), so that a fault test can cut one
                # follower off from one leader by its mark (chaos.netfilter).
                async with dial(address, self._credentials, self._channel_options) as channel:
                    stub: broker_pb2_grpc.BrokerServiceAsyncStub = (
                        broker_pb2_grpc.BrokerServiceStub(channel)
                    )
                    await self._stream(leader, stub)
                    delay = _BACKOFF_S[0]
            except (grpc.aio.AioRpcError, OSError) as error:
                log.info(
                    "broker %d: fetching from broker %d at %s: %s",
                    self.settings.node_id,
                    leader,
                    address,
                    error,
                )
                delay = await _back_off(delay)
            except PartitionLogError as error:
                # A local log refused the leader's records: logged, fetched
                # again after the backoff (the partition stays behind).
                log.error(
                    "broker %d: applying a fetch from broker %d: %s",
                    self.settings.node_id,
                    leader,
                    error,
                )
                delay = await _back_off(delay)

    def _mark_fetch_sessions(self) -> None:
        """Every partition's fetch state may have changed (a new image, this
        broker's own retention): each session compares them all."""
        for session in self._fetch_sessions.values():
            session.mark_all()

    async def _stream(self, leader: int, stub: broker_pb2_grpc.BrokerServiceAsyncStub) -> None:
        call = stub.ReplicaFetch()
        # The stream's fetch session: after the first, each request lists
        # only the partitions whose fetch state changed.
        session = self._fetch_sessions[leader] = FollowerFetchSession()
        try:
            while not self._stopping and self.replicas.is_fetching_from(leader):
                fetch = session.next_fetch(
                    lambda keys: self.replicas.next_fetch_request(leader, self.broker_epoch, keys)
                )
                if fetch is None:
                    await asyncio.sleep(_BACKOFF_S[0])
                    continue
                fetcher = self._fetcher_config()
                await call.write(
                    replica_fetch_request(
                        self.settings.node_id,
                        self.broker_epoch,
                        fetch.listed,
                        self.image,
                        max_wait_ms=fetcher.max_wait_ms,
                        min_bytes=fetcher.min_bytes,
                        incremental=fetch.incremental,
                        forgotten=fetch.forgotten,
                    )
                )
                response = await call.read()
                if not isinstance(response, broker_pb2.FetchResponse):
                    return  # the leader ended the stream
                if response.error != 0:
                    # Refused as a whole: every partition takes the error,
                    # and the session starts again with a full request.
                    requests = session.sent
                    answered = {
                        k: (requests[k], a) for k, a in fetch_answers(response, requests).items()
                    }
                    session.reset()
                else:
                    answered = session.answered(answers_in(response))
                now = _now_ms()
                changed = []
                backoff = False
                for key, (request, answer) in answered.items():
                    outcome = self.replicas.step_fetch_answer(key, request, answer, now)
                    backoff = backoff or backs_off(answer.error, outcome)
                    if outcome is not None:
                        changed.append(key)
                        if outcome.truncation is not None:
                            self._log_truncation(key, outcome.truncation)
                        if outcome.restart is not None:
                            self._log_restart(key, outcome.restart)
                if changed:
                    self.service.wake(changed)
                if backoff:
                    await asyncio.sleep(_BACKOFF_S[0])
        finally:
            if self._fetch_sessions.get(leader) is session:
                del self._fetch_sessions[leader]
            call.cancel()

    def _fetcher_config(self) -> FetcherConfig:
        """This broker's replica.fetch.min.bytes and replica.fetch.wait.max.ms
        as the image has them now (dynamic: read again for each new image); Kafka's
        defaults if the image holds a value the configs refuse."""
        image = self.image
        if self._fetcher is not None and self._fetcher[0] is image:
            return self._fetcher[1]
        try:
            config = replica_fetcher_config(image, self.settings.node_id)
        except TopicConfigError as error:
            log.warning("broker %d: follower fetch: %s", self.settings.node_id, error)
            config = FetcherConfig()
        self._fetcher = (image, config)
        return config

    def _log_truncation(self, key: TopicIdPartition, truncation: Truncation) -> None:
        """A follower truncation, as the run's node exports read it: a
        truncation below a committed HW loses committed records unless the
        controllers elected an unclean leader (Kafka's truncateToEpochEndOffsets
        logs "Truncating partition ... to offset")."""
        replica = self.replicas.replicas.get(key)
        epoch = replica.leader_epoch if replica is not None else -1
        log.info(
            "broker %d partition %s truncated from %d to %d in epoch %d",
            self.settings.node_id,
            self._partition_name(key),
            truncation.log_end_offset,
            truncation.offset,
            epoch,
        )

    def _log_restart(self, key: TopicIdPartition, restart: Restart) -> None:
        """A follower log restarted at its leader's log start, as the run's
        node exports read it: not a truncation (the records it dropped lie
        below the leader's log start, gone there too, and its HW rises to
        the new start; Kafka's truncateFullyAndStartAt logs "Truncate and
        start at offset")."""
        replica = self.replicas.replicas.get(key)
        epoch = replica.leader_epoch if replica is not None else -1
        log.info(
            "broker %d partition %s restarted at %d from [%d, %d) in epoch %d",
            self.settings.node_id,
            self._partition_name(key),
            restart.offset,
            restart.log_start_offset,
            restart.log_end_offset,
            epoch,
        )

    # -- stop -------------------------------------------------------------------------

    async def _create_offsets_topic(self) -> None:
        """Ask the controller for the offsets topic (Kafka's broker creates
        its internal topics on first use: AutoTopicCreationManager): a
        compacted topic, ``offsets.partitions`` of
        ``offsets.replication_factor`` replicas, ``min.insync.replicas``
        ``offsets.min_insync_replicas`` (at most the replication factor)."""
        await self._create_internal_topic(OFFSETS_TOPIC, self.settings.offsets_topic)

    async def _create_internal_topic(self, name: str, topic: InternalTopicSettings) -> None:
        answer = await self.client.create_topics(
            [
                NewTopic(
                    name,
                    topic.partitions,
                    topic.replication_factor,
                    configs={
                        "cleanup.policy": "compact",
                        "segment.bytes": str(topic.segment_bytes),
                        "min.insync.replicas": str(
                            min(topic.min_insync_replicas, topic.replication_factor)
                        ),
                    },
                )
            ]
        )
        for result in answer.topics:
            if result.error not in (0, MetadataErrors.TOPIC_ALREADY_EXISTS):
                raise MetadataClientError(MetadataErrors(result.error), result.message)
        log.info("broker %d: created the internal topic %s", self.settings.node_id, name)

    async def _create_transaction_topic(self) -> None:
        """Ask the controller for the transaction log, as for the offsets
        topic: compacted, ``transaction_state.partitions`` of
        ``transaction_state.replication_factor`` replicas,
        ``min.insync.replicas`` ``transaction_state.min_insync_replicas``
        (Kafka's ``transaction.state.log.*``)."""
        await self._create_internal_topic(TRANSACTION_STATE_TOPIC, self.settings.transaction_topic)

    async def controlled_shutdown(self) -> bool:
        """Heartbeat with ``want_shutdown`` until the controller says the
        broker may go (it leads nothing); False at the timeout."""
        if not self._registered.is_set():
            return True
        deadline = time.monotonic() + self.settings.controlled_shutdown_timeout_s
        while time.monotonic() < deadline:
            try:
                answer = await self._heartbeat(want_shutdown=True)
            except (MetadataClientError, IndeterminateError) as error:
                log.warning("broker %d: controlled shutdown: %s", self.settings.node_id, error)
            else:
                if answer.error == 0 and answer.should_shut_down:
                    return True
            await asyncio.sleep(self.settings.heartbeat_interval_ms / 1000 / 2)
        log.warning(
            "broker %d: controlled shutdown did not finish within %g s; stopping anyway",
            self.settings.node_id,
            self.settings.controlled_shutdown_timeout_s,
        )
        return False

    async def stop(self, *, controlled: bool = True) -> None:
        """Controlled shutdown (unless ``controlled`` is False, as a crash),
        then stop serving and close the logs."""
        lifecycle = self._tasks[0] if self._tasks else None
        if lifecycle is not None:
            lifecycle.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lifecycle
        if controlled:
            await self.controlled_shutdown()
        self._stopping = True
        tasks = [*self._tasks[1:], *self._fetchers.values()]
        if self._applier is not None:
            tasks.append(self._applier)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fetchers.clear()
        await self.transactions.stop()
        await self.groups.stop()
        await self._pool.close()
        await self.node.stop(resign=False)
        await self.client.close()
        if not self.replicas.shut_down:
            self.replicas.shutdown()
            if controlled and self.failure is None and self.broker_epoch >= 0:
                # The logs are closed cleanly: the next run's registration
                # may say so (LogManager.shutdown(brokerEpoch), KIP-966).
                write_clean_shutdown_epoch(self._clean_shutdown_dirs, self.broker_epoch)
        log.info("broker %d stopped", self.settings.node_id)


# -- the broker's configuration and its foreground run ----------------------------------


def _section(settings: Settings, section: str) -> dict[str, object]:
    return {
        key.partition(".")[2]: settings.get(key)
        for key in SETTINGS
        if key.startswith(section + ".")
    }


def broker_config(settings: Settings) -> BrokerSettings:
    """A broker's settings from the controllers' configuration keys:
    ``node_id``, ``cluster_id``, ``data_dir`` (its copy of the metadata
    log), ``voters`` (the controller quorum), ``listen`` (required), the
    ``[broker]`` section, ``[tls]``, ``[authorizer]``, ``[quorum]`` and
    ``[node]``; ConfigError naming what is wrong."""
    listen: str = settings.require("listen", "--listen")
    log_dirs: tuple[Path, ...] = settings.require("broker.log_dirs", "--set broker.log_dirs=DIR")
    # The shared keys are checked as a node's (voters, TLS, listeners, options).
    node = controller_config(settings)
    if node.node_id in node.voters:
        raise ConfigError(
            f"broker {node.node_id} (node_id from {settings.origin('node_id')}) is also a "
            f"controller in 'voters' (from {settings.origin('voters')}): a broker's id must "
            "differ from every controller's"
        )
    values = _section(settings, "broker")
    return BrokerSettings(
        node_id=node.node_id,
        cluster_id=node.cluster_id,
        voters=dict(node.voters),
        metadata_dir=node.data_dir,
        log_dirs=log_dirs,
        listen=listen,
        rack=settings.get("broker.rack"),
        tls=node.tls,
        options=node.options,
        authorizer=node.authorizer,
        heartbeat_interval_ms=int(str(values["heartbeat_interval_ms"])),
        tick_interval_ms=int(str(values["tick_interval_ms"])),
        log_retention_check_interval_ms=int(str(values["log_retention_check_interval_ms"])),
        controlled_shutdown_timeout_s=int(str(values["controlled_shutdown_timeout_ms"])) / 1000,
        metrics_listen=node.metrics_listen,
        groups=GroupConfig(**_section(settings, "group")),  # type: ignore[arg-type]
        offsets_topic=OffsetsTopicSettings(**_section(settings, "offsets")),  # type: ignore[arg-type]
        transactions=TxnConfig(**_section(settings, "transaction")),  # type: ignore[arg-type]
        transaction_topic=TransactionStateTopicSettings(
            **_section(settings, "transaction_state")  # type: ignore[arg-type]
        ),
    )


# Each log directory's stamp (Kafka's meta.properties, as its storage tool
# writes it): the cluster and the broker it belongs to, and the directory's
# own id (directory.id, KIP-858), which the broker registers.
LOG_DIR_META = "meta.properties"


class LogDirFormatError(Exception):
    """A log directory unformatted, or formatted for another cluster or broker."""


def _read_log_dir_meta(directory: Path) -> dict[str, str] | None:
    path = directory / LOG_DIR_META
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LogDirFormatError(f"cannot read {path}: {exc}") from None
    found = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and not line.startswith("#"):
            found[key.strip()] = value.strip()
    return found


def format_log_dirs(directories: Sequence[Path], cluster_id: str, node_id: int) -> list[Path]:
    """Stamp each log directory (created if missing) with the cluster id
    and node id; one stamped for another cluster or node is refused, one
    stamped alike is left alone. The directories newly stamped."""
    stamped = []
    for directory in directories:
        found = _read_log_dir_meta(directory)
        if found is not None:
            _check_meta(directory, found, cluster_id, node_id)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        _write_log_dir_meta(
            directory,
            {
                "version": "1",
                "cluster.id": cluster_id,
                "node.id": str(node_id),
                "directory.id": new_directory_id(),
            },
        )
        stamped.append(directory)
    return stamped


def new_directory_id() -> str:
    """A log directory's id: a random Uuid, never one Kafka reserves for
    directories (``DirectoryId``: the first hundred)."""
    while True:
        found = new_incarnation_id()
        if not is_reserved_directory_id(found):
            return found


def _write_log_dir_meta(directory: Path, values: dict[str, str]) -> None:
    """``meta.properties`` written whole, synced, then renamed over the old."""
    path = directory / LOG_DIR_META
    temporary = path.with_suffix(".tmp")
    text = "".join(f"{key}={value}\n" for key, value in values.items())
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_dir(directory)


def _check_meta(directory: Path, found: dict[str, str], cluster_id: str, node_id: int) -> None:
    if found.get("cluster.id") != cluster_id:
        raise LogDirFormatError(
            f"log directory {directory} belongs to cluster {found.get('cluster.id')!r}, "
            f"not {cluster_id!r}"
        )
    if found.get("node.id") != str(node_id):
        raise LogDirFormatError(
            f"log directory {directory} belongs to broker {found.get('node.id')}, not {node_id}"
        )


# Written in each log directory once its logs are closed after a controlled
# stop, with the broker epoch (Kafka's CleanShutdownFileHandler): the next
# run registers with it as its previous broker epoch, so the controller
# keeps it in the ELRs it was in (KIP-966). Removed at start, so a crash of
# that run leaves none.
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


def write_clean_shutdown_epoch(directories: Sequence[Path], broker_epoch: int) -> None:
    """Write ``broker_epoch`` in each log directory's clean shutdown file,
    synced."""
    data = json.dumps({"version": 0, "brokerEpoch": broker_epoch}).encode()
    for directory in directories:
        path = directory / CLEAN_SHUTDOWN_FILE
        temporary = path.with_suffix(".tmp")
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        fsync_dir(directory)


def _read_clean_shutdown_epoch(path: Path) -> int | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the clean shutdown file %s: %s", path, exc)
        return None
    epoch = found.get("brokerEpoch") if isinstance(found, dict) else None
    if type(epoch) is not int or epoch < 0 or found.get("version") != 0:
        log.warning("ignoring the clean shutdown file %s: %r", path, found)
        return None
    return epoch


def take_clean_shutdown_epoch(directories: Sequence[Path]) -> int:
    """The broker epoch of the previous run's clean shutdown, -1 unless
    every log directory holds the same one
    (``LogManager.readBrokerEpochFromCleanShutdownFiles``); the files are
    removed (``LogManager.loadLogs``), so only a clean shutdown of this run
    writes them again."""
    if not directories:
        return -1
    epochs = {_read_clean_shutdown_epoch(d / CLEAN_SHUTDOWN_FILE) for d in directories}
    for directory in directories:
        path = directory / CLEAN_SHUTDOWN_FILE
        if path.exists():
            path.unlink()
            fsync_dir(directory)
    if len(epochs) != 1:
        return -1
    (epoch,) = epochs
    return -1 if epoch is None else epoch


def check_log_dirs(directories: Sequence[Path], cluster_id: str, node_id: int) -> tuple[str, ...]:
    """Every log directory formatted for this cluster and broker, or
    :class:`LogDirFormatError`; their ids, in the directories' order.  A
    directory stamped without one (by an older kq) is given one now, as
    Kafka's broker does; two directories with one id (a copied directory)
    are refused."""
    ids: dict[str, Path] = {}
    for directory in directories:
        found = _read_log_dir_meta(directory)
        if found is None:
            raise LogDirFormatError(
                f"log directory {directory} is not formatted (run `kq storage format` with "
                "the broker's configuration)"
            )
        _check_meta(directory, found, cluster_id, node_id)
        directory_id = found.get("directory.id")
        if directory_id is None:
            directory_id = new_directory_id()
            _write_log_dir_meta(directory, {**found, "directory.id": directory_id})
        elif not is_uuid(directory_id) or is_reserved_directory_id(directory_id):
            raise LogDirFormatError(
                f"log directory {directory}: directory.id {directory_id!r} in {LOG_DIR_META} "
                "is not a directory id (a Uuid, not one of the hundred reserved ones)"
            )
        if directory_id in ids:
            raise LogDirFormatError(
                f"log directories {ids[directory_id]} and {directory} have the same "
                f"directory.id {directory_id} (one is a copy of the other)"
            )
        ids[directory_id] = directory
    return tuple(ids)


def run_broker(settings: BrokerSettings) -> int:
    """Serve until SIGTERM or SIGINT, then shut down under control; the
    exit status."""
    if not install_from_environment(os.environ, log, f"broker {settings.node_id}"):
        return EXIT_FAILURE
    try:
        lose_unsynced = lose_unsynced_from_environment(os.environ)
        torn_tails = torn_tails_from_environment(os.environ)
    except StorageModeError as exc:
        log.error("cannot start broker %d: %s", settings.node_id, exc)
        return EXIT_FAILURE
    if lose_unsynced:
        log.warning(
            "broker %d runs in the power-loss test mode: writes not synced are lost at a kill",
            settings.node_id,
        )
    try:
        meta = read_meta(settings.metadata_dir)
    except StorageFormatError as exc:
        log.error("cannot start broker %d: %s", settings.node_id, exc)
        return EXIT_FAILURE
    if meta.cluster_id != settings.cluster_id or meta.node_id != settings.node_id:
        log.error(
            "cannot start broker %d: data directory %s was formatted for node %d of cluster "
            "%s, not node %d of cluster %s",
            settings.node_id,
            settings.metadata_dir,
            meta.node_id,
            meta.cluster_id,
            settings.node_id,
            settings.cluster_id,
        )
        return EXIT_FAILURE
    try:
        directory_ids = check_log_dirs(settings.log_dirs, settings.cluster_id, settings.node_id)
    except LogDirFormatError as exc:
        log.error("cannot start broker %d: %s", settings.node_id, exc)
        return EXIT_FAILURE
    if torn_tails:
        log.warning(
            "broker %d tears what a kill left of its unsynced segment tails", settings.node_id
        )
        # Before any log is opened: the disk as the power loss left it.
        rng = random.Random()
        try:
            for directory in settings.log_dirs:
                for torn in tear_unsynced_tails(directory, rng):
                    log.warning("broker %d %s", settings.node_id, torn.describe())
        except PartitionLogError as exc:
            log.error("cannot start broker %d: %s", settings.node_id, exc)
            return EXIT_FAILURE
    return asyncio.run(_serve(settings, directory_ids, lose_unsynced, torn_tails))


async def _serve(
    settings: BrokerSettings,
    directory_ids: Sequence[str],
    lose_unsynced: bool = False,
    torn_tails: bool = False,
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.warning("received %s again; already stopping", sig.name)
            return
        log.info("received %s: controlled shutdown, then stopping", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        try:
            process = BrokerProcess(
                settings,
                lose_unsynced=lose_unsynced,
                torn_tails=torn_tails,
                directory_ids=directory_ids,
            )
            await process.start()
        except (OSError, RuntimeError, ValueError) as exc:
            log.error("cannot start broker %d on %s: %s", settings.node_id, settings.listen, exc)
            return EXIT_FAILURE
        log.info(
            "broker %d of cluster %s serving on %s, log directories %s",
            settings.node_id,
            settings.cluster_id,
            settings.listen,
            ", ".join(map(str, settings.log_dirs)),
        )
        status = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if process.node.node.failure is not None:
                log.error(
                    "broker %d: its metadata log failed: %s; stopping",
                    settings.node_id,
                    process.node.node.failure,
                )
                status = EXIT_FAILURE
                break
            if process.failure is not None:
                log.error("broker %d %s; stopping", settings.node_id, process.failure)
                status = EXIT_FAILURE
                break
        await process.stop(controlled=status == 0)
        return status
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

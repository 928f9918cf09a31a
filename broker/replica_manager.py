"""The replicas of one broker (Kafka's ``ReplicaManager`` without its
threads): applies each metadata image's local changes to the
:class:`~broker.replica.PartitionReplica` of every partition it holds, and
routes the leader-side requests to them.

:meth:`ReplicaManager.apply_delta` follows ``ReplicaManager.applyDelta``:
the deletions first (a topic recreated under its name reuses its directory
name, so the old one must be out of the way), then the stops, then the
partitions to lead (``applyLocalLeadersDelta``: ``Partition.makeLeader``
records the new epoch at the LEO and forgets the followers' positions; no
more fetching), then the ones to follow (``applyLocalFollowersDelta``:
``Partition.makeFollower`` never truncates to the HW, KIP-101; a follower
with a new leader or leader epoch starts fetching from its LEO and finds any
divergence by epoch, KIP-279/KIP-595). What the driver must do comes back as
data (:class:`ApplyResult`): the partitions to fetch from each leader with
their fetch offsets, those that stopped or moved between leaders, and the
partitions that could not be served (Kafka marks them offline and goes on).

A partition whose log cannot be opened (a foreign topic id, a bad topic
config) fails alone. A fenced broker stops leading
(:mod:`broker.local_changes`); :meth:`ReplicaManager.shutdown` stops every
replica and closes the logs.

What happens is reported to a :class:`~broker.metrics.BrokerMetrics` (bytes
and records appended as leader and as follower, ISR changes once
committed); the default reports nothing.

No I/O but through the log manager's seams; time only as ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.errors import Errors, ReplicaError
from broker.local_changes import LocalChanges, LocalPartition, local_changes
from broker.log_manager import (
    LoadResult,
    LogManager,
    LogManagerError,
    TopicConfigError,
    topic_log_config,
    topic_replica_config,
)
from broker.metrics import NO_METRICS, BrokerMetrics
from broker.replica import (
    AlterPartitionRequest,
    FetchAnswer,
    FetchRequest,
    FollowerOutcome,
    LeaderAppend,
    LeaderFetchOutcome,
    MappingBrokerView,
    PartitionReplica,
    Role,
)
from broker.replica.types import NO_EPOCH, AlterPartitionResult
from metadata.image import EMPTY_IMAGE, MetadataImage, PartitionRegistration, TopicIdPartition
from metadata.records import NO_LEADER
from partition_log.errors import PartitionLogError
from partition_log.log import AppendOrigin

__all__ = [
    "ApplyResult",
    "FetchTarget",
    "NotLeaderError",
    "ReplicaManager",
]


class NotLeaderError(ReplicaError):
    """A request for a partition this broker does not lead
    (``NOT_LEADER_OR_FOLLOWER``) or does not know
    (``UNKNOWN_TOPIC_OR_PARTITION``), with the leader and leader epoch of the
    image so the client needs no metadata round trip (KIP-951)."""

    def __init__(self, code: Errors, message: str, leader: int, leader_epoch: int) -> None:
        super().__init__(code, message)
        self.current_leader = leader
        self.current_leader_epoch = leader_epoch


@dataclass(frozen=True, slots=True)
class FetchTarget:
    """One partition a follower fetches: from ``leader`` in ``leader_epoch``,
    starting at ``fetch_offset`` (its LEO when the fetching started;
    ``InitialFetchState``)."""

    leader: int
    leader_epoch: int
    fetch_offset: int


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one image changed, for the driver."""

    changes: LocalChanges
    # Every partition to fetch after the change, per leader broker: one
    # stream per follower-leader pair carries them all.
    fetchers: Mapping[int, Mapping[TopicIdPartition, FetchTarget]]
    # Partitions whose fetching (re)starts at the given offset (a new
    # leader, a new leader epoch, a new follower).
    started: Mapping[TopicIdPartition, FetchTarget]
    # Partitions no longer fetched (led here, stopped, deleted).
    stopped: frozenset[TopicIdPartition]
    # Partitions now fetched from another leader: (old leader, new leader).
    moved: Mapping[TopicIdPartition, tuple[int, int]]
    # Partitions that could not be served, with why (Kafka: offline).
    failed: Mapping[TopicIdPartition, str]
    # Directories renamed for deletion.
    deleted: tuple[str, ...] = ()


def _commits(request: AlterPartitionRequest, registration: PartitionRegistration) -> bool:
    """Whether ``registration`` is ``request`` committed by the controller:
    the same leader epoch, a later partition epoch, the ISR asked for."""
    return (
        registration.leader_epoch == request.leader_epoch
        and registration.partition_epoch > request.partition_epoch
        and sorted(registration.isr) == sorted(request.isr)
    )


@dataclass
class ReplicaManager:
    """The replicas of broker ``broker_id`` over ``logs``."""

    broker_id: int
    logs: LogManager
    image: MetadataImage = EMPTY_IMAGE
    replicas: dict[TopicIdPartition, PartitionReplica] = field(default_factory=dict)
    fetching: dict[TopicIdPartition, FetchTarget] = field(default_factory=dict)
    # Partitions whose log could not be opened (offline here), with why.
    offline: dict[TopicIdPartition, str] = field(default_factory=dict)
    brokers: MappingBrokerView = field(init=False)
    shut_down: bool = False
    metrics: BrokerMetrics = NO_METRICS
    # What loading the logs found, once :meth:`publish` has loaded them.
    loaded: LoadResult | None = None
    # ``fetching`` per leader, in partition order, rebuilt whenever it
    # changes (:meth:`_index_fetching`): the stream of each leader reads its
    # own part on every fetch round (:meth:`is_fetching_from`,
    # :meth:`next_fetch_request`) without sorting every partition fetched.
    _by_leader: dict[int, dict[TopicIdPartition, FetchTarget]] = field(
        default_factory=dict, init=False, repr=False
    )
    # (image held, image, their local changes) of the last image asked
    # about: logs_to_create and apply_delta of one image, which a broker
    # calls in turn for each image committed, compute them once.
    _changes: tuple[MetadataImage, MetadataImage, LocalChanges] | None = field(
        default=None, init=False, repr=False
    )
    # When the next ISR expiration is due (None: at the next tick). Kafka
    # schedules isr-expiration every replica.lag.time.max.ms / 2: a member
    # is out after between one and one and a half lag times, and the walk
    # over every led partition is not paid on every tick (with thousands of
    # partitions it held the loop for a tenth of each 250 ms tick).
    _next_isr_expiration_ms: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.brokers = MappingBrokerView(self.image.brokers)
        self._index_fetching()

    # -- the fetcher plan ---------------------------------------------------------

    def _index_fetching(self) -> None:
        plan: dict[int, dict[TopicIdPartition, FetchTarget]] = {}
        for key, target in sorted(self.fetching.items()):
            plan.setdefault(target.leader, {})[key] = target
        self._by_leader = plan

    def fetchers(self) -> dict[int, dict[TopicIdPartition, FetchTarget]]:
        """The partitions fetched from each leader (a copy)."""
        return {leader: dict(targets) for leader, targets in self._by_leader.items()}

    def is_fetching_from(self, leader: int) -> bool:
        """Whether any partition here is fetched from ``leader`` (its
        stream goes on while so)."""
        return leader in self._by_leader

    # -- metadata --------------------------------------------------------------

    def changes_to(self, image: MetadataImage) -> LocalChanges:
        """This broker's changes from the image held to ``image``
        (:func:`~broker.local_changes.local_changes`), computed once for
        each pair of images: kept by the identity of both, they are never
        those of another image held."""
        cached = self._changes
        if cached is not None and cached[0] is self.image and cached[1] is image:
            return cached[2]
        changes = local_changes(self.image, image, self.broker_id)
        self._changes = (self.image, image, changes)
        return changes

    def _replica(
        self, key: TopicIdPartition, local: LocalPartition, now_ms: int
    ) -> PartitionReplica:
        """The partition's replica, its log opened or created with the
        topic's configs (``getOrCreatePartition`` then
        ``createLogIfNotExists``)."""
        replica = self.replicas.get(key)
        replica_config = topic_replica_config(self.image, local.topic_name, self.broker_id)
        if replica is not None:
            replica.config = replica_config
            return replica
        config = topic_log_config(self.image, local.topic_name, self.broker_id)
        log = self.logs.get_or_create(key, local.topic_name, config, now_ms)
        replica = PartitionReplica(self.broker_id, log, replica_config, self.brokers)
        self.replicas[key] = replica
        return replica

    def logs_to_create(self, image: MetadataImage) -> list[tuple[TopicIdPartition, str]]:
        """(partition, topic name) of every replica ``image`` gives this
        broker whose log does not exist yet: what :meth:`apply_delta` would
        create, for :meth:`create_logs` to create ahead in parts."""
        changes = self.changes_to(image)
        hosted = self.logs.partitions
        return sorted(
            (key, local.topic_name)
            for group in (changes.stops, changes.leaders, changes.followers)
            for key, local in group.items()
            if key not in hosted and key not in self.replicas
        )

    def create_logs(
        self, image: MetadataImage, todo: Sequence[tuple[TopicIdPartition, str]], now_ms: int
    ) -> int:
        """Create the logs of ``todo`` (from :meth:`logs_to_create` of
        ``image``) before ``image`` is applied, so that a broker's loop can run
        between parts of a large creation (Kafka creates them on the metadata
        publisher's thread, apart from its heartbeats). Nothing serves them
        until :meth:`apply_delta` of ``image`` makes their replicas; one that
        cannot be created is left for that apply to report. How many were
        created."""
        created = 0
        with self.logs.deferred_directory_syncs():
            for key, topic_name in todo:
                try:
                    config = topic_log_config(image, topic_name, self.broker_id)
                    self.logs.get_or_create(key, topic_name, config, now_ms)
                except (LogManagerError, TopicConfigError, PartitionLogError, ValueError):
                    continue
                created += 1
        return created

    def publish(
        self, image: MetadataImage, catch_up_offset: int | None, now_ms: int
    ) -> ApplyResult | None:
        """An image of the metadata log the broker follows, as Kafka's
        ``MetadataLoader`` publishes it: nothing while it is still catching up
        (``stillNeedToCatchUp``: no high watermark learned yet, or the image
        ends before ``catch_up_offset``, the high watermark learned at start);
        the first image past it loads the logs (``BrokerMetadataPublisher``'s
        first publish: ``LogManager.startup`` with ``isStrayKraftReplica``),
        then every image is applied (:meth:`apply_delta`). A partial image
        (a restarted broker replaying its metadata log from the start) would
        make every partition created after it a stray and lose its copy.
        None while catching up; a log directory that cannot be loaded raises
        (Kafka's ``LogManager.startup`` failing: the broker stops)."""
        if self.loaded is None:
            if catch_up_offset is None or image.offset < catch_up_offset:
                return None
            self.loaded = self.logs.load(image, self.broker_id, now_ms)
        return self.apply_delta(image, now_ms)

    def apply_delta(
        self, image: MetadataImage, now_ms: int, changes: LocalChanges | None = None
    ) -> ApplyResult:
        """Move to ``image``: its local changes against the image held
        (:meth:`changes_to` unless given), in Kafka's order. The log directories
        are synced once at the end for every partition directory created
        (:meth:`LogManager.deferred_directory_syncs`)."""
        if self.shut_down:
            raise RuntimeError("the replica manager is shut down")
        with self.logs.deferred_directory_syncs():
            try:
                return self._apply_delta(image, now_ms, changes)
            except BaseException:
                # What fetching changed before the failure holds.
                self._index_fetching()
                raise

    def _apply_delta(
        self, image: MetadataImage, now_ms: int, changes: LocalChanges | None
    ) -> ApplyResult:
        if changes is None:
            changes = self.changes_to(image)
        # Past this image the pair cannot come again: the older image goes.
        self._changes = None
        previous = self.image
        self.image = image
        self.brokers.brokers = image.brokers
        before = dict(self.fetching)
        stopped: set[TopicIdPartition] = set()
        started: dict[TopicIdPartition, FetchTarget] = {}
        failed: dict[TopicIdPartition, str] = {}
        deleted: list[str] = []

        def stop_fetching(key: TopicIdPartition) -> None:
            if self.fetching.pop(key, None) is not None:
                stopped.add(key)

        # 1. Stop and delete (ReplicaManager.stopPartitions with
        # deleteLocalLog): before anything is created under a reused name.
        for key in sorted(changes.deletes):
            stop_fetching(key)
            self.replicas.pop(key, None)
            self.offline.pop(key, None)
            name = self.logs.delete(key, now_ms)
            if name is not None:
                deleted.append(name)

        # 2. Stop without deleting: no leader, or this broker fenced. A fresh
        # replica (role none) over the kept log refuses produces and fetches.
        for key, local in sorted(changes.stops.items()):
            stop_fetching(key)
            try:
                replica = self._replica(key, local, now_ms)
            except (LogManagerError, TopicConfigError, PartitionLogError, ValueError) as error:
                failed[key] = str(error)
                continue
            if replica.role is not Role.NONE:
                self.replicas[key] = PartitionReplica(
                    self.broker_id, replica.log, replica.config, self.brokers
                )

        # 3. Lead (applyLocalLeadersDelta): fetching stops first.
        for key, local in sorted(changes.leaders.items()):
            stop_fetching(key)
            try:
                replica = self._replica(key, local, now_ms)
                pending = replica.isr_state.pending
                replica.become_leader(local.registration, now_ms)
            except (LogManagerError, TopicConfigError, PartitionLogError, ValueError) as error:
                failed[key] = str(error)
                continue
            if pending is not None and _commits(pending.request, local.registration):
                # Our own change, committed, reached us through the metadata
                # log before the AlterPartition answer (which the replica
                # will ignore): it counts here. Kafka counts only on the
                # answer and misses these.
                self.metrics.isr_changed(pending.kind)

        # 4. Follow (applyLocalFollowersDelta): a new leader or leader epoch
        # (re)starts fetching from the LEO; an ISR-only change does not.
        for key, local in sorted(changes.followers.items()):
            registration = local.registration
            try:
                replica = self._replica(key, local, now_ms)
                replica.become_follower(registration, now_ms)
            except (LogManagerError, TopicConfigError, PartitionLogError, ValueError) as error:
                stop_fetching(key)
                failed[key] = str(error)
                continue
            if registration.leader not in image.brokers:
                # No registration, so no endpoint to fetch from
                # (applyLocalFollowersDelta stops fetching when the leader's
                # node is not in the image).
                stop_fetching(key)
                continue
            current = self.fetching.get(key)
            if (
                current is None
                or current.leader != registration.leader
                or current.leader_epoch != registration.leader_epoch
            ):
                target = FetchTarget(
                    registration.leader, registration.leader_epoch, replica.log.log_end_offset
                )
                self.fetching[key] = target
                started[key] = target
                stopped.discard(key)

        # 5. Topic config changes reach the logs already open
        # (DynamicConfigPublisher -> LogManager.updateTopicConfig).
        if image.configs is not previous.configs:
            self._update_configs(failed)

        for key, why in failed.items():
            self.offline[key] = why
        for key in (*changes.leaders, *changes.followers, *changes.stops):
            if key not in failed:
                self.offline.pop(key, None)
        moved = {
            key: (before[key].leader, target.leader)
            for key, target in started.items()
            if key in before and before[key].leader != target.leader
        }
        self._index_fetching()
        return ApplyResult(
            changes,
            self.fetchers(),
            started,
            frozenset(stopped),
            moved,
            failed,
            tuple(deleted),
        )

    def _update_configs(self, failed: dict[TopicIdPartition, str]) -> None:
        by_topic: dict[str, list[TopicIdPartition]] = {}
        for key in self.replicas:
            topic = self.image.topics.get(key.topic_id)
            if topic is not None:
                by_topic.setdefault(topic.name, []).append(key)
        for name, keys in by_topic.items():
            try:
                config = topic_log_config(self.image, name, self.broker_id)
                replica_config = topic_replica_config(self.image, name, self.broker_id)
            except TopicConfigError as error:
                # The logs keep running on the configs they have.
                for key in keys:
                    failed.setdefault(key, str(error))
                continue
            for key in keys:
                self.logs.update_config(key, config)
                self.replicas[key].config = replica_config

    def shutdown(self) -> ApplyResult:
        """Stop every replica (no more leading or fetching) and close the
        logs cleanly (``ReplicaManager.shutdown`` then ``LogManager.shutdown``)."""
        stopped = frozenset(self.fetching)
        self.fetching.clear()
        self._index_fetching()
        self.replicas.clear()
        self.logs.close()
        self.shut_down = True
        empty = LocalChanges({}, {}, frozenset(), {}, {})
        return ApplyResult(empty, {}, {}, stopped, {}, {})

    # -- routing (the leader side) ---------------------------------------------

    def _not_here(self, key: TopicIdPartition) -> NotLeaderError:
        registration = self.image.partition(key.topic_id, key.partition)
        if registration is None:
            return NotLeaderError(
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {key.partition} of topic id {key.topic_id} does not exist",
                NO_LEADER,
                NO_EPOCH,
            )
        offline = self.offline.get(key)
        why = f" (its log is offline here: {offline})" if offline else ""
        return NotLeaderError(
            Errors.NOT_LEADER_OR_FOLLOWER,
            f"broker {self.broker_id} does not lead partition {key.partition} of topic id "
            f"{key.topic_id}; the leader is {registration.leader} in epoch "
            f"{registration.leader_epoch}{why}",
            registration.leader,
            registration.leader_epoch,
        )

    def resolve(self, topic: str, partition: int) -> TopicIdPartition:
        """A partition named by topic name (older requests), or refused
        ``UNKNOWN_TOPIC_OR_PARTITION``."""
        found = self.image.topic_by_name(topic)
        if found is None or found.partition(partition) is None:
            raise NotLeaderError(
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has no partition {partition}",
                NO_LEADER,
                NO_EPOCH,
            )
        return TopicIdPartition(found.topic_id, partition)

    def leader_replica(self, key: TopicIdPartition) -> PartitionReplica:
        """The replica that answers a produce or fetch for ``key``
        (``ReplicaManager.getPartitionOrError`` then ``Partition.leaderLogIfLocal``),
        or :class:`NotLeaderError` with the image's leader and epoch."""
        replica = self.replicas.get(key)
        if replica is None or replica.role is not Role.LEADER:
            raise self._not_here(key)
        return replica

    def append(
        self,
        key: TopicIdPartition,
        batch: bytes,
        required_acks: int,
        now_ms: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        marker_bumps_epoch: bool = False,
    ) -> LeaderAppend:
        """A producer's batch (``appendRecordsToLeader``), or a coordinator's
        (``origin``; ``marker_bumps_epoch`` for a transaction version 2
        marker), counted in bytes and records in once appended
        (``appendToLocalLog``: a retry answered with its original offsets
        counts too, as in Kafka)."""
        appended = self.leader_replica(key).append_as_leader(
            batch, required_acks, now_ms, origin=origin, marker_bumps_epoch=marker_bumps_epoch
        )
        info = appended.info
        self.metrics.appended(len(batch), info.last_offset - info.first_offset + 1)
        return appended

    def step_fetch(
        self, key: TopicIdPartition, request: FetchRequest, now_ms: int
    ) -> LeaderFetchOutcome:
        """A follower's fetch of ``key``; a partition not led here is answered
        with the error and the image's leader hint."""
        try:
            replica = self.leader_replica(key)
        except NotLeaderError as error:
            return LeaderFetchOutcome(
                FetchAnswer(
                    error.code,
                    current_leader=error.current_leader,
                    current_leader_epoch=error.current_leader_epoch,
                    message=str(error.args[0]),
                )
            )
        return replica.step_fetch(request, now_ms)

    def step_alter_partition_result(
        self,
        key: TopicIdPartition,
        request: AlterPartitionRequest,
        result: AlterPartitionResult,
        now_ms: int,
    ) -> bool:
        """The controller's answer to an AlterPartition this broker sent as
        ``key``'s leader (``Partition.handleAlterPartitionUpdate``); whether
        the HW moved. A change the replica commits counts as an ISR shrink
        or expansion (``PendingShrinkIsr``/``PendingExpandIsr.notifyListener``:
        ``markShrink``, ``markExpand``); an answer it ignores does not."""
        replica = self.replicas.get(key)
        if replica is None:
            return False
        pending = replica.isr_state.pending
        moved = replica.step_alter_partition_result(request, result, now_ms)
        if (
            pending is not None
            and pending.request == request
            and replica.isr_state.pending is None
            and replica.partition_epoch == result.partition_epoch
        ):
            self.metrics.isr_changed(pending.kind)
        return moved

    def tick_isr(self, now_ms: int) -> list[tuple[TopicIdPartition, AlterPartitionRequest]]:
        """The ``isr-expiration`` task over every partition led here, when
        due (every half of the shortest ``replica.lag.time.max.ms`` of the
        partitions led, as ``ReplicaManager.startup`` schedules it): the
        AlterPartition requests to send, in partition order."""
        due = self._next_isr_expiration_ms
        if due is not None and now_ms < due:
            return []
        found = []
        lag_ms: int | None = None
        for key, replica in self.replicas.items():
            if replica.role is Role.LEADER:
                request = replica.tick_isr(now_ms)
                if request is not None:
                    found.append((key, request))
                lag = replica.config.replica_lag_time_max_ms
                lag_ms = lag if lag_ms is None else min(lag_ms, lag)
        # Nothing led: look again at the next tick.
        self._next_isr_expiration_ms = None if lag_ms is None else now_ms + max(1, lag_ms // 2)
        found.sort(key=lambda item: item[0])
        return found

    # -- the follower side -----------------------------------------------------

    def next_fetch_request(
        self, leader: int, broker_epoch: int, keys: Iterable[TopicIdPartition] | None = None
    ) -> dict[TopicIdPartition, FetchRequest]:
        """The fetch of every partition fetched from ``leader`` (one request
        per follower-leader pair; ``AbstractFetcherThread.buildFetch``), in
        partition order, or of those of ``keys`` fetched from it (a fetch
        session's changed partitions); the other leaders' partitions are
        not looked at. Partitions fenced by their leader (waiting for newer
        metadata) are left out: empty if all are."""
        found: dict[TopicIdPartition, FetchRequest] = {}
        fetched = self._by_leader.get(leader, {})
        for key in fetched if keys is None else (k for k in keys if k in fetched):
            request = self.replicas[key].next_fetch_request(broker_epoch)
            if request is not None:
                found[key] = request
        return found

    def next_fetch_requests(
        self, broker_epoch: int
    ) -> dict[int, dict[TopicIdPartition, FetchRequest]]:
        """:meth:`next_fetch_request` of every leader fetched from that
        has a partition to fetch."""
        found: dict[int, dict[TopicIdPartition, FetchRequest]] = {}
        for leader in self._by_leader:
            requests = self.next_fetch_request(leader, broker_epoch)
            if requests:
                found[leader] = requests
        return found

    def step_fetch_answer(
        self, key: TopicIdPartition, request: FetchRequest, answer: FetchAnswer, now_ms: int
    ) -> FollowerOutcome | None:
        """The leader's answer for one partition of our fetch; None if the
        partition is no longer fetched here (the answer is dropped)."""
        replica = self.replicas.get(key)
        if replica is None or key not in self.fetching:
            return None
        outcome = replica.step_fetch_answer(request, answer, now_ms)
        if outcome.appended_to is not None:
            # ReplicaFetcherThread.processPartitionData: replication bytes in.
            self.metrics.replicated(len(answer.records))
        return outcome

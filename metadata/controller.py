"""The active controller's decisions (Kafka's QuorumController and its
control managers, KIP-631/KIP-841).

Every handler reads the controller's current image and returns a
:class:`ControllerResult`: the records to write and the response.  It
changes nothing.  The image changes only by replaying records: the
committed image by the state machine, and on the active controller a
speculative image, the committed one plus the records this controller has
written but not yet seen committed, so that one decision sees the ones
before it (Kafka's timeline data structures).  When leadership is lost the
speculative image is dropped and the committed one taken again.

Heartbeat sessions are soft state (:mod:`metadata.heartbeats`).  Time
enters as ``now_ms``; randomness (topic ids, placement) from an injected
``random.Random``.  No I/O: the asyncio glue is :mod:`metadata.driver`.
"""

from __future__ import annotations

import base64
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from metadata import configs
from metadata.configs import ResourceType
from metadata.delta import MetadataDelta
from metadata.errors import ApiError, Errors
from metadata.heartbeats import HeartbeatManager
from metadata.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata.partition_change import Election, PartitionChange, reassignment_replicas
from metadata.placement import UsableBroker, place, validate_assignment
from metadata.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    Endpoint,
    FeatureLevelRecord,
    FeatureRange,
    LeaderRecoveryState,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)

__all__ = [
    "METADATA_VERSION",
    "SUPPORTED_FEATURES",
    "AlterConfigOp",
    "AlterPartitionItem",
    "Controller",
    "ControllerOptions",
    "ControllerResult",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "ItemResult",
    "NewTopic",
    "RegisterRequest",
]

T = TypeVar("T")

# Feature levels this build supports (KIP-584); a new cluster finalizes the
# highest.  metadata.version 1 is this build's record set.
METADATA_VERSION = "metadata.version"
SUPPORTED_FEATURES: Mapping[str, tuple[int, int]] = {METADATA_VERSION: (1, 1)}

# Kafka's producer id block size (KIP-730).
PRODUCER_ID_BLOCK = 1000
# Kafka's MAX_RECORDS_PER_USER_OP: an atomic operation must fit one batch.
MAX_RECORDS_PER_ATOMIC_OP = 10_000
# Kafka's MAX_ELECTIONS_PER_IMBALANCE.
MAX_ELECTIONS_PER_REBALANCE = 1_000

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME = 249


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    cluster_id: str
    session_timeout_ms: int = 9_000


@dataclass(frozen=True, slots=True)
class ControllerResult(Generic[T]):
    records: list[Record]
    response: T
    # True: the records must commit together (one batch); False: they may
    # be split over several (elections after a fence: each change stands
    # alone).
    atomic: bool = True


@dataclass(frozen=True, slots=True)
class ItemResult:
    """The outcome of one item of a batch request (a topic, a partition, a
    config resource)."""

    name: str
    error: Errors = Errors.NONE
    message: str = ""
    # Per-request extras (a created topic's id and sizes, a partition's
    # new state).
    topic_id: str = ""
    partition: int = -1
    num_partitions: int = -1
    replication_factor: int = -1
    partition_state: PartitionRegistration | None = None


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    # partition -> replicas; all partitions or none.
    assignments: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    broker_id: int
    cluster_id: str
    incarnation_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    features: tuple[FeatureRange, ...] = ()
    previous_broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    broker_id: int
    broker_epoch: int
    # The offset of the last metadata record the broker has applied
    # (inclusive, as Kafka's currentMetadataOffset; -1: none): caught up
    # once it reaches the broker's registration record.
    current_metadata_offset: int
    want_fence: bool = False
    want_shutdown: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    is_caught_up: bool
    is_fenced: bool
    in_controlled_shutdown: bool
    should_shut_down: bool


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    key: str
    # None: delete the override.
    value: str | None
    # Conditional update: apply only if the current override is
    # ``expected`` (``expect_absent``: only if there is none).
    expected: str | None = None
    expect_absent: bool = False

    @property
    def conditional(self) -> bool:
        return self.expected is not None or self.expect_absent


@dataclass(frozen=True, slots=True)
class AlterPartitionItem:
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    # (broker id, broker epoch or -1)
    new_isr: tuple[tuple[int, int], ...]
    leader_recovered: bool = False


def _topic_id(rng: random.Random) -> str:
    """A topic id: 16 random bytes, shown as Kafka shows them (url-safe
    base64 without padding)."""
    raw = rng.getrandbits(128).to_bytes(16, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def check_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise ApiError(Errors.INVALID_TOPIC_NAME, f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME:
        raise ApiError(
            Errors.INVALID_TOPIC_NAME,
            f"topic name is {len(name)} characters long; at most {MAX_TOPIC_NAME} are allowed",
        )
    if not _TOPIC_NAME.fullmatch(name):
        raise ApiError(
            Errors.INVALID_TOPIC_NAME,
            f"topic name {name!r} may hold only ASCII letters, digits, '.', '_' and '-'",
        )


class Controller:
    """The decisions of the active controller, on its speculative image."""

    def __init__(self, options: ControllerOptions, rng: random.Random) -> None:
        self.options = options
        self.rng = rng
        self.image = MetadataImage()
        self.heartbeats = HeartbeatManager(options.session_timeout_ms)
        # The offset the next written record will get (the node knows it;
        # the driver sets it before each decision).
        self.next_offset = 0
        self._unclean: dict[str, bool] = {}
        self._unclean_configs: object = None

    # -- the speculative image ------------------------------------------------

    def reset(self, committed: MetadataImage) -> None:
        self.image = committed

    def activate(self, committed: MetadataImage, now_ms: int) -> list[Record]:
        """Take over: the committed image, fresh sessions for every broker,
        and the records a new active controller writes (bootstrap feature
        levels on a new cluster; a NoOp otherwise, to open its term)."""
        self.image = committed
        self.heartbeats.reset(list(committed.brokers.keys()), now_ms)
        records: list[Record] = []
        for name, (_, highest) in SUPPORTED_FEATURES.items():
            if name not in committed.features:
                records.append(FeatureLevelRecord(name, highest))
        # Elections a predecessor decided but lost in its failover (they
        # are written apart from the unfencing that triggered them): every
        # leaderless partition that an eligible ISR member can lead.
        for topic in committed.topics.values():
            for i, p in enumerate(topic.partitions):
                if not p.has_leader and any(self._active(r) for r in p.isr):
                    change = self._change(topic, i).build()
                    if change is not None:
                        records.append(change)
        return records or [NoOpRecord()]

    def replay(self, records: Sequence[Record], base_offset: int, epoch: int) -> None:
        """Apply records just written (not yet committed) to the
        speculative image."""
        delta = MetadataDelta(self.image)
        for i, record in enumerate(records):
            delta.replay(record, base_offset + i, epoch)
        self.image = delta.apply()

    # -- helpers ------------------------------------------------------------------

    def _active(self, broker_id: int) -> bool:
        b = self.image.brokers.get(broker_id)
        return b is not None and b.active

    def _cluster_config(self) -> Mapping[str, str]:
        return self.image.config((int(ResourceType.CLUSTER), ""))

    def _topic_config(self, topic: TopicImage, key: str) -> str:
        return configs.effective(
            key,
            topic=self.image.config((int(ResourceType.TOPIC), topic.name)),
            cluster=self._cluster_config(),
        )

    def _unclean_allowed(self, topic: TopicImage) -> bool:
        # Fencing a broker decides for tens of thousands of partitions:
        # resolve each topic's setting once per version of the configs.
        if self._unclean_configs is not self.image.configs:
            self._unclean_configs = self.image.configs
            self._unclean.clear()
        found = self._unclean.get(topic.name)
        if found is None:
            found = configs.as_bool(self._topic_config(topic, "unclean.leader.election.enable"))
            self._unclean[topic.name] = found
        return found

    def _broker(self, broker_id: int, broker_epoch: int | None = None) -> BrokerRegistration:
        b = self.image.brokers.get(broker_id)
        if b is None:
            raise ApiError(Errors.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} is not registered")
        if broker_epoch is not None and b.epoch != broker_epoch:
            raise ApiError(
                Errors.STALE_BROKER_EPOCH,
                f"broker {broker_id} is registered with epoch {b.epoch}, not {broker_epoch}",
            )
        return b

    def _usable_brokers(self) -> list[UsableBroker]:
        return [
            UsableBroker(b.broker_id, b.rack, not b.active)
            for b in sorted(self.image.brokers.values(), key=lambda b: b.broker_id)
        ]

    def _change(
        self,
        topic: TopicImage,
        partition_id: int,
        *,
        is_active: Callable[[int], bool] | None = None,
        **kwargs: object,
    ) -> PartitionChange:
        p = topic.partitions[partition_id]
        election = Election.UNCLEAN if self._unclean_allowed(topic) else Election.ONLINE
        change = PartitionChange(
            topic.topic_id, partition_id, p, is_active or self._active, election
        )
        for key, value in kwargs.items():
            setattr(change, key, value)
        return change

    def _remove_broker_from_partitions(
        self, broker_id: int, only_leaderships: bool = False
    ) -> list[Record]:
        """Changes taking ``broker_id`` out of every ISR and leadership
        (fencing, controlled shutdown, unregistration).  With
        ``only_leaderships`` it stays in the ISRs."""
        records: list[Record] = []

        def active(b: int) -> bool:
            return b != broker_id and self._active(b)

        for topic in self.image.topics.values():
            for i, p in enumerate(topic.partitions):
                if p.leader != broker_id and broker_id not in p.isr:
                    continue
                if only_leaderships and p.leader != broker_id:
                    continue
                target_isr = p.isr
                if not only_leaderships and broker_id in p.isr:
                    target_isr = tuple(b for b in p.isr if b != broker_id)
                change = self._change(topic, i, is_active=active, target_isr=target_isr).build()
                if change is not None:
                    records.append(change)
        return records

    def _elect_leaderless(self, newly_active: int) -> list[Record]:
        """Elections for partitions without a leader that ``newly_active``
        can now lead (it is in their ISR, or unclean election is allowed)."""
        records: list[Record] = []
        for topic in self.image.topics.values():
            for i, p in enumerate(topic.partitions):
                if p.has_leader or newly_active not in p.replicas:
                    continue
                change = self._change(topic, i).build()
                if change is not None:
                    records.append(change)
        return records

    # -- broker lifecycle (KIP-631) ---------------------------------------------

    def register_broker(self, req: RegisterRequest, now_ms: int) -> ControllerResult[int]:
        if req.cluster_id != self.options.cluster_id:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"broker {req.broker_id} belongs to cluster {req.cluster_id!r}, "
                f"this is cluster {self.options.cluster_id!r}",
            )
        if req.broker_id < 0:
            raise ApiError(Errors.INVALID_REQUEST, f"broker id {req.broker_id} is negative")
        if not req.incarnation_id:
            raise ApiError(Errors.INVALID_REQUEST, "a registration needs an incarnation id")
        supported = {f.name: f for f in req.features}
        for name, level in sorted(self.image.features.items()):
            f = supported.get(name)
            if f is None or not f.min_level <= level <= f.max_level:
                offered = f"{f.min_level}..{f.max_level}" if f else "nothing"
                raise ApiError(
                    Errors.UNSUPPORTED_VERSION,
                    f"broker {req.broker_id} supports {name} {offered}; the cluster's "
                    f"finalized level is {level}",
                )
        records: list[Record] = []
        old = self.image.brokers.get(req.broker_id)
        if old is not None:
            if old.incarnation_id != req.incarnation_id and self.heartbeats.is_alive(
                req.broker_id, now_ms
            ):
                raise ApiError(
                    Errors.DUPLICATE_BROKER_REGISTRATION,
                    f"broker {req.broker_id} is registered by another incarnation "
                    f"({old.incarnation_id}) whose session is still alive",
                )
            # The old registration ends: it leaves every ISR and leadership
            # (a broker that restarted uncleanly may have lost data, KIP-966).
            records.extend(self._remove_broker_from_partitions(req.broker_id))
        epoch = self.next_offset + len(records)
        records.append(
            RegisterBrokerRecord(
                req.broker_id,
                epoch,
                req.incarnation_id,
                req.endpoints,
                req.rack,
                req.features,
                fenced=True,
            )
        )
        if len(records) > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.THROTTLING,
                f"re-registering broker {req.broker_id} needs {len(records)} records; "
                "fence it first",
            )
        self.heartbeats.touch(req.broker_id, now_ms)
        return ControllerResult(records, epoch)

    def heartbeat(self, req: HeartbeatRequest, now_ms: int) -> ControllerResult[HeartbeatResponse]:
        b = self._broker(req.broker_id, req.broker_epoch)
        self.heartbeats.touch(req.broker_id, now_ms, req.current_metadata_offset)
        caught_up = req.current_metadata_offset >= b.epoch
        records: list[Record] = []
        fenced, shutting_down, shut_down = b.fenced, b.in_controlled_shutdown, False
        if req.want_shutdown:
            # Controlled shutdown in two steps (KIP-631): first the broker
            # is marked shutting down and its leaderships and ISR places go
            # to others; once that has committed and it leads nothing, the
            # next heartbeat fences it and tells it to go.
            if b.fenced:
                shut_down = True  # leads nothing already
            elif not b.in_controlled_shutdown:
                records.append(
                    BrokerRegistrationChangeRecord(
                        b.broker_id, b.epoch, in_controlled_shutdown=True
                    )
                )
                records.extend(
                    self._after(records, lambda: self._remove_broker_from_partitions(b.broker_id))
                )
                shutting_down = True
            elif not self._leads_anything(b.broker_id):
                # _fence also takes it out of any ISR it is still in (step
                # 1's changes may have been lost with a failover while its
                # flag committed).
                records.extend(self._fence(b))
                fenced, shutting_down, shut_down = True, False, True
            else:
                # Still leads (a leadership came back meanwhile): move again.
                records.extend(self._remove_broker_from_partitions(b.broker_id))
        elif req.want_fence:
            if not b.fenced:
                records.extend(self._fence(b))
                fenced, shutting_down = True, False
        elif b.fenced and caught_up:
            records.append(BrokerRegistrationChangeRecord(b.broker_id, b.epoch, fenced=False))
            fenced = False
            # Replay the unfence into a scratch view so elections see it.
            records.extend(self._after(records, lambda: self._elect_leaderless(b.broker_id)))
        return ControllerResult(
            records,
            HeartbeatResponse(caught_up, fenced, shutting_down, shut_down),
            atomic=False,
        )

    def _leads_anything(self, broker_id: int) -> bool:
        return any(p.leader == broker_id for _, _, p in self.image.partitions())

    def _after(self, records: list[Record], then: Callable[[], T]) -> T:
        """``then()`` decided on the image as if ``records`` had been
        replayed (they will be, before anything ``then`` returns)."""
        saved = self.image
        delta = MetadataDelta(saved)
        for i, record in enumerate(records):
            delta.replay(record, self.next_offset + i, saved.epoch)
        self.image = delta.apply()
        try:
            return then()
        finally:
            self.image = saved

    def _fence(self, b: BrokerRegistration) -> list[Record]:
        records = self._remove_broker_from_partitions(b.broker_id)
        records.append(
            BrokerRegistrationChangeRecord(
                b.broker_id,
                b.epoch,
                fenced=True,
                in_controlled_shutdown=False if b.in_controlled_shutdown else None,
            )
        )
        return records

    def fence_expired(self, now_ms: int, limit: int = 1) -> ControllerResult[list[int]]:
        """Fence up to ``limit`` brokers whose session passed (Kafka fences
        one per check, so a stalled controller cannot fence everyone at
        once)."""
        live = [b.broker_id for b in self.image.brokers.values() if not b.fenced]
        expired = self.heartbeats.expired(live, now_ms)[:limit]
        records: list[Record] = []
        for broker_id in expired:

            def fence(b: int = broker_id) -> list[Record]:
                return self._fence(self.image.brokers[b])

            records.extend(self._after(records, fence))
        return ControllerResult(records, expired, atomic=False)

    def unregister_broker(self, broker_id: int) -> ControllerResult[None]:
        b = self._broker(broker_id)
        records = self._remove_broker_from_partitions(broker_id)
        records.append(UnregisterBrokerRecord(broker_id, b.epoch))
        self.heartbeats.remove(broker_id)
        return ControllerResult(records, None, atomic=False)

    # -- topics --------------------------------------------------------------------

    def create_topics(
        self, topics: Sequence[NewTopic], validate_only: bool = False
    ) -> ControllerResult[list[ItemResult]]:
        results: list[ItemResult] = []
        records: list[Record] = []
        counts: dict[str, int] = {}
        for t in topics:
            counts[t.name] = counts.get(t.name, 0) + 1
        for t in topics:
            try:
                if counts[t.name] > 1:
                    raise ApiError(Errors.INVALID_REQUEST, f"topic {t.name} appears more than once")
                made, result = self._create_topic(t)
            except ApiError as exc:
                results.append(ItemResult(t.name, exc.code, exc.message))
                continue
            if len(records) + len(made) > MAX_RECORDS_PER_ATOMIC_OP:
                results.append(
                    ItemResult(
                        t.name,
                        Errors.INVALID_REQUEST,
                        f"creating topic {t.name} would need {len(made)} more records; "
                        f"one request may write at most {MAX_RECORDS_PER_ATOMIC_OP}",
                    )
                )
                continue
            records.extend(made)
            results.append(result)
        return ControllerResult([] if validate_only else records, results)

    def _create_topic(self, t: NewTopic) -> tuple[list[Record], ItemResult]:
        check_topic_name(t.name)
        if t.name in self.image.topic_ids:
            raise ApiError(Errors.TOPIC_ALREADY_EXISTS, f"topic {t.name} already exists")
        topic_configs: dict[str, str] = {}
        for key, value in sorted(t.configs.items()):
            topic_configs[key] = configs.validate(ResourceType.TOPIC, t.name, key, value)
        cluster = self._cluster_config()
        if t.assignments:
            if t.num_partitions not in (-1, len(t.assignments)) or t.replication_factor != -1:
                raise ApiError(
                    Errors.INVALID_REQUEST,
                    "give either an explicit replica assignment or partitions and a "
                    "replication factor, not both",
                )
            if sorted(t.assignments) != list(range(len(t.assignments))):
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"the assignment must name partitions 0..{len(t.assignments) - 1}",
                )
            assignment = [tuple(t.assignments[i]) for i in range(len(t.assignments))]
            validate_assignment(assignment, {b.id: b for b in self._usable_brokers()})
        else:
            partitions = t.num_partitions
            if partitions == -1:
                partitions = configs.as_int(configs.effective("num.partitions", cluster=cluster))
            rf = t.replication_factor
            if rf == -1:
                rf = configs.as_int(
                    configs.effective("default.replication.factor", cluster=cluster)
                )
            if partitions < 1:
                raise ApiError(
                    Errors.INVALID_PARTITIONS,
                    f"a topic needs at least 1 partition, not {partitions}",
                )
            if partitions + 1 + len(topic_configs) > MAX_RECORDS_PER_ATOMIC_OP:
                raise ApiError(
                    Errors.INVALID_PARTITIONS,
                    f"{partitions} partitions are more than one request may create "
                    f"({MAX_RECORDS_PER_ATOMIC_OP - 1 - len(topic_configs)})",
                )
            assignment = place(0, partitions, rf, self._usable_brokers(), self.rng)
        topic_id = _topic_id(self.rng)
        while topic_id in self.image.topics:
            topic_id = _topic_id(self.rng)
        records: list[Record] = [TopicRecord(t.name, topic_id)]
        records.extend(self._new_partitions(topic_id, 0, assignment))
        for key, value in topic_configs.items():
            records.append(ConfigRecord(int(ResourceType.TOPIC), t.name, key, value))
        return records, ItemResult(
            t.name,
            topic_id=topic_id,
            num_partitions=len(assignment),
            replication_factor=len(assignment[0]),
        )

    def _new_partitions(
        self, topic_id: str, first: int, assignment: Sequence[tuple[int, ...]]
    ) -> list[Record]:
        out: list[Record] = []
        for i, replicas in enumerate(assignment):
            isr = tuple(r for r in replicas if self._active(r))
            if not isr:
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {first + i} has no unfenced replica among {list(replicas)}",
                )
            out.append(PartitionRecord(topic_id, first + i, replicas, isr, leader=isr[0]))
        return out

    def delete_topics(
        self, names: Sequence[str] = (), topic_ids: Sequence[str] = ()
    ) -> ControllerResult[list[ItemResult]]:
        results: list[ItemResult] = []
        records: list[Record] = []
        wanted = [(n, self.image.topic_ids.get(n)) for n in names]
        wanted += [
            (
                self.image.topics[i].name if i in self.image.topics else i,
                i if i in self.image.topics else None,
            )
            for i in topic_ids
        ]
        for label, topic_id in wanted:
            if topic_id is None:
                results.append(
                    ItemResult(
                        label, Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {label} does not exist"
                    )
                )
                continue
            if sum(1 for _, other in wanted if other == topic_id) > 1:
                results.append(
                    ItemResult(
                        label,
                        Errors.INVALID_REQUEST,
                        f"topic {label} is named more than once",
                        topic_id=topic_id,
                    )
                )
                continue
            records.append(RemoveTopicRecord(topic_id))
            results.append(ItemResult(label, topic_id=topic_id))
        return ControllerResult(records, results)

    def create_partitions(
        self,
        name: str,
        total: int,
        assignments: Sequence[tuple[int, ...]] = (),
        validate_only: bool = False,
    ) -> ControllerResult[ItemResult]:
        topic = self.image.topic_by_name(name)
        if topic is None:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name} does not exist")
        current = len(topic.partitions)
        if total <= current:
            raise ApiError(
                Errors.INVALID_PARTITIONS,
                f"topic {name} has {current} partitions; the new count {total} must be larger",
            )
        new = total - current
        if new > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.INVALID_PARTITIONS,
                f"{new} new partitions are more than one request may create "
                f"({MAX_RECORDS_PER_ATOMIC_OP})",
            )
        rf = len(topic.partitions[0].target_replicas())
        if assignments:
            if len(assignments) != new:
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"{len(assignments)} assignments given for {new} new partitions",
                )
            assignment = [tuple(a) for a in assignments]
            validate_assignment(
                assignment,
                {b.id: b for b in self._usable_brokers()},
                start_partition=current,
                replication_factor=rf,
            )
        else:
            assignment = place(current, new, rf, self._usable_brokers(), self.rng)
        records = self._new_partitions(topic.topic_id, current, assignment)
        result = ItemResult(
            name, topic_id=topic.topic_id, num_partitions=total, replication_factor=rf
        )
        return ControllerResult([] if validate_only else records, result)

    # -- partition leadership and ISR ----------------------------------------------

    def alter_partition(
        self, broker_id: int, broker_epoch: int, items: Sequence[AlterPartitionItem]
    ) -> ControllerResult[list[ItemResult]]:
        """ISR changes from partition leaders (KIP-497, KIP-841, KIP-903)."""
        self._broker(broker_id, broker_epoch)
        results: list[ItemResult] = []
        records: list[Record] = []
        for item in items:
            label = f"{item.topic_id}-{item.partition}"
            try:
                change, state = self._alter_one(broker_id, item)
            except ApiError as exc:
                results.append(
                    ItemResult(label, exc.code, exc.message, item.topic_id, item.partition)
                )
                continue
            if change is not None:
                records.append(change)
            results.append(
                ItemResult(
                    label, topic_id=item.topic_id, partition=item.partition, partition_state=state
                )
            )
        return ControllerResult(records, results, atomic=False)

    def _alter_one(
        self, broker_id: int, item: AlterPartitionItem
    ) -> tuple[PartitionChangeRecord | None, PartitionRegistration]:
        topic = self.image.topics.get(item.topic_id)
        p = topic.partition(item.partition) if topic is not None else None
        if topic is None or p is None:
            raise ApiError(
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {item.partition} of topic id {item.topic_id} does not exist",
            )
        if p.leader != broker_id:
            raise ApiError(
                Errors.NOT_LEADER_OR_FOLLOWER,
                f"broker {broker_id} does not lead {topic.name}-{item.partition} "
                f"(the leader is {p.leader})",
            )
        if item.leader_epoch < p.leader_epoch:
            raise ApiError(
                Errors.FENCED_LEADER_EPOCH,
                f"leader epoch {item.leader_epoch} is older than the partition's {p.leader_epoch}",
            )
        if item.leader_epoch > p.leader_epoch:
            raise ApiError(
                Errors.UNKNOWN_LEADER_EPOCH,
                f"leader epoch {item.leader_epoch} is newer than the partition's {p.leader_epoch}",
            )
        if item.partition_epoch < p.partition_epoch:
            raise ApiError(
                Errors.INVALID_UPDATE_VERSION,
                f"partition epoch {item.partition_epoch} is older than the partition's "
                f"{p.partition_epoch}",
            )
        if item.partition_epoch > p.partition_epoch:
            raise ApiError(
                Errors.UNKNOWN_PARTITION_EPOCH,
                f"partition epoch {item.partition_epoch} is newer than the partition's "
                f"{p.partition_epoch}",
            )
        new_isr = tuple(b for b, _ in item.new_isr)
        if len(set(new_isr)) != len(new_isr):
            raise ApiError(Errors.INVALID_REQUEST, f"the new ISR {list(new_isr)} repeats a broker")
        if broker_id not in new_isr:
            raise ApiError(
                Errors.INVALID_REQUEST, f"the new ISR {list(new_isr)} leaves out the leader"
            )
        outside = [b for b in new_isr if b not in p.replicas]
        if outside:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"the new ISR holds brokers {outside} that are not replicas {list(p.replicas)}",
            )
        for b, epoch in item.new_isr:
            reg = self.image.brokers.get(b)
            why = ""
            if reg is None:
                why = "is not registered"
            elif reg.fenced:
                why = "is fenced"
            elif reg.in_controlled_shutdown:
                why = "is shutting down"
            elif epoch != -1 and epoch != reg.epoch:
                why = f"has broker epoch {reg.epoch}, not {epoch}"
            if why and b not in p.isr:
                raise ApiError(
                    Errors.INELIGIBLE_REPLICA, f"broker {b} {why}: it may not join the ISR"
                )
            if why and b in p.isr and reg is not None and reg.fenced:
                raise ApiError(
                    Errors.INELIGIBLE_REPLICA, f"broker {b} {why}: it may not stay in the ISR"
                )
        if (
            p.leader_recovery_state is LeaderRecoveryState.RECOVERING
            and len(new_isr) > 1
            and not item.leader_recovered
        ):
            raise ApiError(
                Errors.INVALID_REQUEST,
                "a RECOVERING leader must report its log recovered before growing the ISR",
            )
        change = self._change(
            topic, item.partition, target_isr=new_isr, recovered=item.leader_recovered
        ).build()
        state = p.merge(change) if change is not None else p
        return change, state

    def elect_leaders(
        self, election: Election, partitions: Sequence[tuple[str, int]] | None
    ) -> ControllerResult[list[ItemResult]]:
        """Admin elections (kafka-leader-election.sh); ``None``: every
        partition."""
        if election is Election.ONLINE:
            raise ApiError(Errors.INVALID_REQUEST, "an election is preferred or unclean")
        wanted: list[tuple[str, int]] = []
        if partitions is None:
            for t in sorted(self.image.topics.values(), key=lambda t: t.name):
                wanted.extend((t.name, i) for i in range(len(t.partitions)))
        else:
            wanted = list(partitions)
        results: list[ItemResult] = []
        records: list[Record] = []
        for name, i in wanted:
            label = f"{name}-{i}"
            topic = self.image.topic_by_name(name)
            p = topic.partition(i) if topic is not None else None
            if topic is None or p is None:
                results.append(
                    ItemResult(
                        label,
                        Errors.UNKNOWN_TOPIC_OR_PARTITION,
                        f"{label} does not exist",
                        partition=i,
                    )
                )
                continue
            error, message, change = self._elect_one(topic, i, p, election)
            if change is not None:
                records.append(change)
            if partitions is None and error is Errors.ELECTION_NOT_NEEDED:
                continue  # "all partitions" reports only what it did or could not do
            results.append(ItemResult(label, error, message, topic.topic_id, i))
        return ControllerResult(records, results, atomic=False)

    def _elect_one(
        self, topic: TopicImage, i: int, p: PartitionRegistration, election: Election
    ) -> tuple[Errors, str, PartitionChangeRecord | None]:
        if election is Election.PREFERRED:
            preferred = p.preferred_leader
            if p.leader == preferred:
                return Errors.ELECTION_NOT_NEEDED, f"broker {preferred} already leads", None
            if preferred not in p.isr or not self._active(preferred):
                return (
                    Errors.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"preferred leader {preferred} is not an unfenced ISR member",
                    None,
                )
            change = self._change(topic, i, election=Election.PREFERRED).build()
            return Errors.NONE, "", change
        if p.has_leader:
            return Errors.ELECTION_NOT_NEEDED, f"broker {p.leader} leads", None
        change = self._change(topic, i, election=Election.UNCLEAN).build()
        if change is None or change.leader in (NO_LEADER, -2):
            return (
                Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                f"no replica of {list(p.replicas)} is unfenced",
                None,
            )
        return Errors.NONE, "", change

    def rebalance_leaders(self) -> ControllerResult[int]:
        """Automatic preferred-leader election, when on
        (``auto.leader.rebalance.enable``) and some broker's imbalance, the
        share of the partitions it prefers that it does not lead, passes
        ``leader.imbalance.per.broker.percentage``."""
        cluster = self._cluster_config()
        if not configs.as_bool(configs.effective("auto.leader.rebalance.enable", cluster=cluster)):
            return ControllerResult([], 0)
        threshold = configs.as_int(
            configs.effective("leader.imbalance.per.broker.percentage", cluster=cluster)
        )
        preferred: dict[int, int] = {}
        not_leading: dict[int, list[tuple[TopicImage, int, PartitionRegistration]]] = {}
        for topic, i, p in self.image.partitions():
            b = p.preferred_leader
            preferred[b] = preferred.get(b, 0) + 1
            if p.leader != b and b in p.isr and self._active(b):
                not_leading.setdefault(b, []).append((topic, i, p))
        records: list[Record] = []
        for b, parts in sorted(not_leading.items()):
            if 100 * len(parts) <= threshold * preferred[b]:
                continue
            for topic, i, _ in parts:
                if len(records) >= MAX_ELECTIONS_PER_REBALANCE:
                    break
                change = self._change(topic, i, election=Election.PREFERRED).build()
                if change is not None:
                    records.append(change)
        return ControllerResult(records, len(records), atomic=False)

    # -- reassignment (KIP-455) ------------------------------------------------------

    def alter_reassignments(
        self, items: Sequence[tuple[str, int, tuple[int, ...] | None]]
    ) -> ControllerResult[list[ItemResult]]:
        """Start (target replicas) or cancel (None) reassignments."""
        results: list[ItemResult] = []
        records: list[Record] = []
        brokers = {b.id: b for b in self._usable_brokers()}
        for name, i, target in items:
            label = f"{name}-{i}"
            topic = self.image.topic_by_name(name)
            p = topic.partition(i) if topic is not None else None
            try:
                if topic is None or p is None:
                    raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{label} does not exist")
                change = self._reassign_one(topic, i, p, target, brokers)
            except ApiError as exc:
                results.append(ItemResult(label, exc.code, exc.message, partition=i))
                continue
            if change is not None:
                records.append(change)
            results.append(ItemResult(label, topic_id=topic.topic_id, partition=i))
        return ControllerResult(records, results, atomic=False)

    def _reassign_one(
        self,
        topic: TopicImage,
        i: int,
        p: PartitionRegistration,
        target: tuple[int, ...] | None,
        brokers: Mapping[int, UsableBroker],
    ) -> PartitionChangeRecord | None:
        if target is None:
            if not p.is_reassigning:
                raise ApiError(
                    Errors.NO_REASSIGNMENT_IN_PROGRESS, f"{topic.name}-{i} is not being reassigned"
                )
            original = tuple(r for r in p.replicas if r not in p.adding_replicas)
            isr = tuple(r for r in p.isr if r in original)
            if not isr:
                # Every ISR member is an added replica: going back is an
                # unclean election (Kafka's PartitionReassignmentRevert).
                if not self._unclean_allowed(topic):
                    raise ApiError(
                        Errors.INVALID_REPLICA_ASSIGNMENT,
                        f"cancelling the reassignment of {topic.name}-{i} needs an unclean "
                        f"leader election: no original replica {list(original)} is in the "
                        f"ISR {list(p.isr)}",
                    )
                isr = original[:1]
            return self._change(
                topic,
                i,
                target_replicas=original,
                target_isr=isr,
                target_adding=(),
                target_removing=(),
                bump_leader_epoch=True,
            ).build()
        validate_assignment([target], brokers)
        # A new target replaces one in progress: every current replica (the
        # old ones and those added so far) not in the new target goes.
        replicas, adding, removing = reassignment_replicas(p.replicas, target)
        if replicas == p.replicas and not adding and not removing and not p.is_reassigning:
            return None
        return self._change(
            topic,
            i,
            target_replicas=replicas,
            target_adding=adding,
            target_removing=removing,
        ).build()

    def list_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None = None
    ) -> list[tuple[str, int, PartitionRegistration]]:
        out = []
        for topic, i, p in self.image.partitions():
            if p.is_reassigning and (partitions is None or (topic.name, i) in partitions):
                out.append((topic.name, i, p))
        return sorted(out, key=lambda x: (x[0], x[1]))

    # -- configs --------------------------------------------------------------------

    def alter_configs(
        self,
        changes: Sequence[tuple[ResourceType, str, Sequence[AlterConfigOp]]],
        validate_only: bool = False,
    ) -> ControllerResult[list[ItemResult]]:
        """Incremental alter (KIP-339) with conditions.  All or nothing:
        when any resource is refused (a failed condition, a bad value, an
        unknown topic), nothing of the request is written, so a request is
        a linearizable compare-and-set on configs."""
        results: list[ItemResult] = []
        records: list[Record] = []
        for rtype, rname, ops in changes:
            label = (
                "the cluster" if rtype is ResourceType.CLUSTER else f"{rtype.name.lower()} {rname}"
            )
            try:
                configs.validate_resource(rtype, rname)
                if rtype is ResourceType.TOPIC and rname not in self.image.topic_ids:
                    raise ApiError(
                        Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {rname} does not exist"
                    )
                current = self.image.config((int(rtype), rname))
                made: list[Record] = []
                keys: set[str] = set()
                mismatches: list[str] = []
                for op in ops:
                    if op.key in keys:
                        raise ApiError(Errors.INVALID_REQUEST, f"config {op.key} is altered twice")
                    keys.add(op.key)
                    value = None
                    if op.value is not None:
                        value = configs.validate(rtype, rname, op.key, op.value)
                    else:
                        configs.lookup(rtype, op.key)
                    found = current.get(op.key)
                    if op.conditional and (
                        (op.expect_absent and found is not None)
                        or (not op.expect_absent and found != op.expected)
                    ):
                        mismatches.append(
                            f"{op.key} is "
                            + ("unset" if found is None else repr(found))
                            + ", not "
                            + ("unset" if op.expect_absent else repr(op.expected))
                        )
                    made.append(ConfigRecord(int(rtype), rname, op.key, value))
                if mismatches:
                    raise ApiError(
                        Errors.CONFIG_PRECONDITION_FAILED,
                        f"on {label}: " + "; ".join(mismatches),
                    )
            except ApiError as exc:
                results.append(ItemResult(label, exc.code, exc.message))
                continue
            records.extend(made)
            results.append(ItemResult(label))
        if validate_only or not items_ok(results):
            records = []
        return ControllerResult(records, results)

    # -- producer ids and features ----------------------------------------------------

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int
    ) -> ControllerResult[tuple[int, int]]:
        b = self._broker(broker_id, broker_epoch)
        if b.fenced:
            raise ApiError(Errors.BROKER_NOT_AVAILABLE, f"broker {broker_id} is fenced")
        first = self.image.next_producer_id
        record = ProducerIdsRecord(broker_id, broker_epoch, first + PRODUCER_ID_BLOCK)
        return ControllerResult([record], (first, PRODUCER_ID_BLOCK))

    def update_features(
        self, updates: Mapping[str, int], validate_only: bool = False
    ) -> ControllerResult[list[ItemResult]]:
        results: list[ItemResult] = []
        records: list[Record] = []
        for name, level in updates.items():
            try:
                if name not in SUPPORTED_FEATURES:
                    raise ApiError(Errors.INVALID_FEATURE_UPDATE, f"unknown feature {name}")
                if level == 0 and name == METADATA_VERSION:
                    raise ApiError(
                        Errors.INVALID_FEATURE_UPDATE,
                        f"{name} cannot be removed: every record is read at its level",
                    )
                low, high = SUPPORTED_FEATURES[name]
                if not low <= level <= high:
                    raise ApiError(
                        Errors.INVALID_FEATURE_UPDATE,
                        f"{name} level {level} is outside this controller's {low}..{high}",
                    )
                for b in self.image.brokers.values():
                    ranges = {f.name: f for f in b.features}
                    f = ranges.get(name)
                    if f is None or not f.min_level <= level <= f.max_level:
                        raise ApiError(
                            Errors.INVALID_FEATURE_UPDATE,
                            f"broker {b.broker_id} does not support {name} level {level}",
                        )
            except ApiError as exc:
                results.append(ItemResult(name, exc.code, exc.message))
                continue
            if self.image.features.get(name) != level:
                records.append(FeatureLevelRecord(name, level))
            results.append(ItemResult(name))
        return ControllerResult([] if validate_only else records, results)

    def noop(self) -> ControllerResult[None]:
        return ControllerResult([NoOpRecord()], None)


def items_ok(results: Iterable[ItemResult]) -> bool:
    return all(r.error is Errors.NONE for r in results)

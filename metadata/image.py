"""The immutable metadata image: the cluster's metadata at one log offset.

Kafka's ``MetadataImage``: controllers decide from it and brokers read it;
nobody mutates it.  A new image comes from applying a
:class:`metadata.delta.MetadataDelta` to the previous one, and shares every
part the delta did not touch (persistent maps from ``immutables``: a HAMT,
so one changed topic costs O(log topics), not a copy of them all; this is
the fix of KAFKA-14735).

``to_records`` writes an image as the records that rebuild it; a snapshot is
those records, and replaying them gives an equal image (tested).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from immutables import Map

from metadata.acls import WILDCARD, AclResourceType, PatternType, StandardAcl
from metadata.records import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    AccessControlEntryRecord,
    ConfigRecord,
    Endpoint,
    FeatureLevelRecord,
    FeatureRange,
    LeaderRecoveryState,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    TopicRecord,
)

__all__ = [
    "EMPTY_IMAGE",
    "AclImage",
    "TOPIC_RESOURCE",
    "TRANSACTION_STATE_TOPIC",
    "BrokerRegistration",
    "ConfigResource",
    "MetadataImage",
    "PartitionRegistration",
    "TopicIdPartition",
    "TopicImage",
]


@dataclass(frozen=True, slots=True, order=True)
class TopicIdPartition:
    topic_id: str
    partition: int


# The topic of consumer groups and their committed offsets (Kafka's
# GROUP_METADATA_TOPIC_NAME): created on first use by a broker, written
# only by group coordinators.
OFFSETS_TOPIC = "__consumer_offsets"
# The transaction log (Kafka's TRANSACTION_STATE_TOPIC_NAME): written only
# by transaction coordinators.
TRANSACTION_STATE_TOPIC = "__transaction_state"
# Topics that belong to the cluster, not to users (Kafka's
# Topic.INTERNAL_TOPICS): clients may not produce to them.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


# (resource type number of metadata.configs.ResourceType, resource name)
ConfigResource = tuple[int, str]
# metadata.configs.ResourceType.TOPIC (a test keeps the two equal).
TOPIC_RESOURCE = 2


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    # The offset of the broker's RegisterBrokerRecord (KIP-631).
    epoch: int
    incarnation_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    features: tuple[FeatureRange, ...]
    fenced: bool
    in_controlled_shutdown: bool
    # Its log directories' ids (KIP-858), sorted; empty if it named none.
    log_dirs: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        """May lead and be in ISRs: unfenced and not shutting down (KIP-841)."""
        return not self.fenced and not self.in_controlled_shutdown

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(
            self.broker_id,
            self.epoch,
            self.incarnation_id,
            self.endpoints,
            self.rack,
            self.features,
            self.fenced,
            self.in_controlled_shutdown,
            self.log_dirs,
        )


@dataclass(frozen=True, slots=True)
class PartitionRegistration:
    # Invariants (kept by the controller, checked by the property tests):
    # isr is a subset of replicas; the leader, if any, is in the isr; during
    # a reassignment replicas is the union of the old and target sets,
    # adding_replicas = target - old and removing_replicas = old - target.
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    leader: int = NO_LEADER
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    # Grows whenever the leader changes (and when replicas are removed), so
    # replicas can tell a stale leader's requests apart.
    leader_epoch: int = 0
    # Grows with every change: the version AlterPartition is checked against.
    partition_epoch: int = 0
    # KIP-966: replicas out of the ISR that hold every committed record (they
    # left it while it was below min ISR, when the high watermark cannot
    # move); with an empty ISR one of them may lead.  Disjoint from the isr.
    elr: tuple[int, ...] = ()
    # Replicas dropped from the ELR (an unclean shutdown) or from the ISR
    # below min ISR and not eligible: what the partition last knew of them.
    last_known_elr: tuple[int, ...] = ()

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def is_reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    def target_replicas(self) -> tuple[int, ...]:
        """The replicas once any reassignment completes."""
        if not self.removing_replicas:
            return self.replicas
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    @classmethod
    def from_record(cls, r: PartitionRecord) -> PartitionRegistration:
        return cls(
            r.replicas,
            r.isr,
            r.removing_replicas,
            r.adding_replicas,
            r.leader,
            r.leader_recovery_state,
            r.leader_epoch,
            r.partition_epoch,
            r.elr,
            r.last_known_elr,
        )

    def to_record(self, topic_id: str, partition_id: int) -> PartitionRecord:
        return PartitionRecord(
            topic_id,
            partition_id,
            self.replicas,
            self.isr,
            self.removing_replicas,
            self.adding_replicas,
            self.leader,
            self.leader_recovery_state,
            self.leader_epoch,
            self.partition_epoch,
            self.elr,
            self.last_known_elr,
        )

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """This partition after ``change`` (Kafka's
        PartitionRegistration.merge): the partition epoch always grows, the
        leader epoch whenever a leader is named (even the same one: that is
        how a change asks replicas to notice it)."""
        leader, leader_epoch = self.leader, self.leader_epoch
        if change.leader != NO_LEADER_CHANGE:
            leader, leader_epoch = change.leader, leader_epoch + 1
        c = change
        return PartitionRegistration(
            self.replicas if c.replicas is None else c.replicas,
            self.isr if c.isr is None else c.isr,
            self.removing_replicas if c.removing_replicas is None else c.removing_replicas,
            self.adding_replicas if c.adding_replicas is None else c.adding_replicas,
            leader,
            self.leader_recovery_state
            if change.leader_recovery_state is None
            else change.leader_recovery_state,
            leader_epoch,
            self.partition_epoch + 1,
            self.elr if c.elr is None else c.elr,
            self.last_known_elr if c.last_known_elr is None else c.last_known_elr,
        )


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: str
    # Partition i at index i: partition ids are dense, as in Kafka.
    partitions: tuple[PartitionRegistration, ...]

    def partition(self, partition_id: int) -> PartitionRegistration | None:
        if 0 <= partition_id < len(self.partitions):
            return self.partitions[partition_id]
        return None


# (resource type, pattern type, resource name): where an ACL applies.
AclKey = tuple[AclResourceType, PatternType, str]


@dataclass(frozen=True, slots=True)
class AclImage:
    """The ACL bindings by id, and indexed by the pattern they apply to, so
    that one authorization looks up a resource's literal name, the literal
    ``*`` and each prefix of the name, not every binding (Kafka's
    StandardAuthorizerData keeps them sorted by pattern for the same
    reason).  Immutable: a change makes a new one sharing the rest."""

    by_id: Map[str, StandardAcl] = field(default_factory=Map)
    by_pattern: Map[AclKey, frozenset[str]] = field(default_factory=Map)

    def __len__(self) -> int:
        return len(self.by_id)

    def changed(self, added: Mapping[str, StandardAcl], removed: Iterable[str]) -> AclImage:
        """This set less ``removed`` (ids it holds) plus ``added``."""
        by_id, by_pattern = self.by_id, self.by_pattern
        with by_id.mutate() as ids, by_pattern.mutate() as patterns:
            for acl_id in removed:
                acl = ids.pop(acl_id)
                key = _acl_key(acl)
                left = patterns[key] - {acl_id}
                if left:
                    patterns[key] = left
                else:
                    del patterns[key]
            for acl_id, acl in added.items():
                ids[acl_id] = acl
                key = _acl_key(acl)
                patterns[key] = patterns.get(key, frozenset()) | {acl_id}
            changed = AclImage(ids.finish(), patterns.finish())
        return changed

    def _at(self, key: AclKey) -> Iterator[StandardAcl]:
        for acl_id in self.by_pattern.get(key, ()):
            yield self.by_id[acl_id]

    def on_resource(self, resource_type: AclResourceType, name: str) -> Iterator[StandardAcl]:
        """Every binding whose pattern matches the resource: its literal
        name, the literal ``*``, and every prefix of the name."""
        yield from self._at((resource_type, PatternType.LITERAL, name))
        if name != WILDCARD:
            yield from self._at((resource_type, PatternType.LITERAL, WILDCARD))
        for end in range(1, len(name) + 1):
            yield from self._at((resource_type, PatternType.PREFIXED, name[:end]))

    def sorted_items(self) -> list[tuple[str, StandardAcl]]:
        return sorted(self.by_id.items())


def _acl_key(acl: StandardAcl) -> AclKey:
    return (acl.resource_type, acl.pattern_type, acl.resource_name)


@dataclass(frozen=True, slots=True)
class MetadataImage:
    # End offset (exclusive) and epoch of the last record the image holds.
    offset: int = 0
    epoch: int = 0
    features: Map[str, int] = field(default_factory=Map)
    brokers: Map[int, BrokerRegistration] = field(default_factory=Map)
    # topic id -> topic; topic name -> topic id.
    topics: Map[str, TopicImage] = field(default_factory=Map)
    topic_ids: Map[str, str] = field(default_factory=Map)
    # Overrides only; defaults live in metadata.configs.
    configs: Map[ConfigResource, Map[str, str]] = field(default_factory=Map)
    # The next producer id to hand out (KIP-730).
    next_producer_id: int = 0
    # ACL bindings (KIP-801).
    acls: AclImage = field(default_factory=AclImage)

    def topic_by_name(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids.get(name)
        return None if topic_id is None else self.topics[topic_id]

    def partition(self, topic_id: str, partition_id: int) -> PartitionRegistration | None:
        topic = self.topics.get(topic_id)
        return None if topic is None else topic.partition(partition_id)

    def config(self, resource: ConfigResource) -> Map[str, str]:
        found = self.configs.get(resource)
        return found if found is not None else Map()

    def partitions(self) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        for topic in self.topics.values():
            for i, p in enumerate(topic.partitions):
                yield topic, i, p

    def offline_replicas(self, partition: PartitionRegistration) -> tuple[int, ...]:
        """The replicas of ``partition`` whose broker is not alive: fenced,
        or not registered at all.  In replica order.

        Kafka's ``KRaftMetadataCache.getOfflineReplicas``, less its two
        other cases: a broker without the request's listener (the
        controllers' DescribeTopics has no listener to ask about) and a
        replica in an offline log directory (kq's image records no
        directory assignments, KIP-858).  The one rule for the brokers'
        Metadata answer and the controllers' DescribeTopics."""
        offline = []
        for replica in partition.replicas:
            broker = self.brokers.get(replica)
            if broker is None or broker.fenced:
                offline.append(replica)
        return tuple(offline)

    @property
    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics.values())

    def with_provenance(self, offset: int, epoch: int) -> MetadataImage:
        return replace(self, offset=offset, epoch=epoch)

    def to_records(self) -> Iterator[Record]:
        """The records that rebuild this image from an empty one, in an
        order replay accepts (features, brokers, topics with their
        partitions, configs, producer ids, ACLs)."""
        for name, level in sorted(self.features.items()):
            yield FeatureLevelRecord(name, level)
        for _, broker in sorted(self.brokers.items()):
            yield broker.to_record()
        for _, topic in sorted(self.topics.items()):
            yield TopicRecord(topic.name, topic.topic_id)
            for i, p in enumerate(topic.partitions):
                yield p.to_record(topic.topic_id, i)
        for (rtype, rname), values in sorted(self.configs.items()):
            for key, value in sorted(values.items()):
                yield ConfigRecord(rtype, rname, key, value)
        if self.next_producer_id:
            yield ProducerIdsRecord(-1, -1, self.next_producer_id)
        for acl_id, acl in self.acls.sorted_items():
            yield AccessControlEntryRecord.of(acl_id, acl)


EMPTY_IMAGE = MetadataImage()

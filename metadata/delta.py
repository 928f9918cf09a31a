"""Changes to a :class:`MetadataImage`, gathered by replaying records.

Kafka's ``MetadataDelta``: replay records one by one (each sees the changes
of the ones before), then :meth:`MetadataDelta.apply` builds the next image,
touching only what changed.  Replay is the only way metadata changes, on the
active controller, the standbys and the brokers alike.

A record that contradicts the image (a change to a partition that does not
exist, a second topic of one name) raises :class:`ReplayError`: the
controller never writes one, so meeting one means the log or this code is
wrong, and going on would serve wrong metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from immutables import Map

from metadata.acls import InvalidAclError, StandardAcl
from metadata.image import (
    TOPIC_RESOURCE,
    BrokerRegistration,
    ConfigResource,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata.records import (
    AccessControlEntryRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

__all__ = ["MetadataDelta", "ReplayError"]


class ReplayError(ValueError):
    """A committed record that does not fit the metadata it applies to."""


@dataclass(slots=True)
class _TopicDelta:
    base: TopicImage | None
    name: str
    topic_id: str
    changed: dict[int, PartitionRegistration] = field(default_factory=dict)
    # Partitions are appended densely (replay checks it), so the count is
    # kept rather than searched for: a topic of n partitions replays in O(n).
    partition_count: int = -1

    def partition(self, partition_id: int) -> PartitionRegistration | None:
        found = self.changed.get(partition_id)
        if found is None and self.base is not None:
            return self.base.partition(partition_id)
        return found

    def __post_init__(self) -> None:
        if self.partition_count < 0:
            self.partition_count = len(self.base.partitions) if self.base is not None else 0

    def build(self) -> TopicImage:
        count = self.partition_count
        if self.base is not None and not self.changed:
            return self.base
        old = self.base.partitions if self.base is not None else ()
        parts = [self.changed.get(i) or old[i] for i in range(count)]
        return TopicImage(self.name, self.topic_id, tuple(parts))


class MetadataDelta:
    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self._offset = image.offset
        self._epoch = image.epoch
        self._features: dict[str, int] = {}
        # broker id -> registration, None: unregistered
        self._brokers: dict[int, BrokerRegistration | None] = {}
        self._topics: dict[str, _TopicDelta] = {}
        self._removed: dict[str, TopicImage] = {}
        # name -> id (or None: the name was freed)
        self._names: dict[str, str | None] = {}
        self._configs: dict[ConfigResource, dict[str, str | None]] = {}
        self._next_producer_id: int | None = None
        # ACL id -> binding, None: removed
        self._acls: dict[str, StandardAcl | None] = {}
        self.records = 0

    # -- reading through the delta ----------------------------------------------

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._brokers:
            return self._brokers[broker_id]
        return self.image.brokers.get(broker_id)

    def topic_id(self, name: str) -> str | None:
        if name in self._names:
            return self._names[name]
        return self.image.topic_ids.get(name)

    def _topic(self, topic_id: str, what: str) -> _TopicDelta:
        delta = self._topics.get(topic_id)
        if delta is not None:
            return delta
        if topic_id in self._removed:
            raise ReplayError(f"{what} names topic {topic_id}, which was removed")
        base = self.image.topics.get(topic_id)
        if base is None:
            raise ReplayError(f"{what} names unknown topic {topic_id}")
        delta = self._topics[topic_id] = _TopicDelta(base, base.name, topic_id)
        return delta

    def partition(self, topic_id: str, partition_id: int) -> PartitionRegistration | None:
        delta = self._topics.get(topic_id)
        if delta is not None:
            return delta.partition(partition_id)
        if topic_id in self._removed:
            return None
        return self.image.partition(topic_id, partition_id)

    # -- replay -----------------------------------------------------------------

    def replay(self, record: Record, offset: int, epoch: int) -> None:
        """Apply one record, the one at ``offset`` written in ``epoch``."""
        self._offset, self._epoch = offset + 1, epoch
        self.records += 1
        if isinstance(record, PartitionChangeRecord):
            self._replay_partition_change(record)
        elif isinstance(record, PartitionRecord):
            self._replay_partition(record)
        elif isinstance(record, TopicRecord):
            self._replay_topic(record)
        elif isinstance(record, RemoveTopicRecord):
            self._replay_remove_topic(record)
        elif isinstance(record, RegisterBrokerRecord):
            self._replay_register(record)
        elif isinstance(record, FenceBrokerRecord | UnfenceBrokerRecord):
            fenced = isinstance(record, FenceBrokerRecord)
            self._change_broker(record.broker_id, record.broker_epoch, fenced, None)
        elif isinstance(record, BrokerRegistrationChangeRecord):
            self._change_broker(
                record.broker_id, record.broker_epoch, record.fenced, record.in_controlled_shutdown
            )
        elif isinstance(record, UnregisterBrokerRecord):
            current = self.broker(record.broker_id)
            if current is None or current.epoch != record.broker_epoch:
                raise ReplayError(
                    f"unregistering broker {record.broker_id} at epoch {record.broker_epoch}, "
                    f"but its registration is {current}"
                )
            self._brokers[record.broker_id] = None
        elif isinstance(record, ConfigRecord):
            resource = (record.resource_type, record.resource_name)
            self._configs.setdefault(resource, {})[record.name] = record.value
        elif isinstance(record, ProducerIdsRecord):
            next_id = self.next_producer_id
            if record.next_producer_id < next_id:
                raise ReplayError(
                    f"producer ids would go back from {next_id} to {record.next_producer_id}"
                )
            self._next_producer_id = record.next_producer_id
        elif isinstance(record, FeatureLevelRecord):
            self._features[record.name] = record.level
        elif isinstance(record, AccessControlEntryRecord):
            self._replay_acl(record)
        elif isinstance(record, RemoveAccessControlEntryRecord):
            if self.acl(record.id) is None:
                raise ReplayError(f"removing ACL {record.id}, which does not exist")
            self._acls[record.id] = None
        elif isinstance(record, NoOpRecord):
            pass
        else:  # pragma: no cover - the Record union is exhaustive
            raise ReplayError(f"cannot replay {record!r}")

    def acl(self, acl_id: str) -> StandardAcl | None:
        if acl_id in self._acls:
            return self._acls[acl_id]
        return self.image.acls.by_id.get(acl_id)

    def _replay_acl(self, r: AccessControlEntryRecord) -> None:
        # Kafka's AclControlManager.replay: an id is never reused, and a
        # binding the controller would refuse never enters the image.
        if self.acl(r.id) is not None:
            raise ReplayError(f"ACL {r.id} already exists")
        acl = r.acl
        try:
            acl.check()
        except InvalidAclError as exc:
            raise ReplayError(f"ACL {r.id} is not valid: {exc}") from None
        self._acls[r.id] = acl

    def config(self, resource: ConfigResource) -> dict[str, str]:
        """The overrides of ``resource`` with this delta's changes."""
        values = dict(self.image.config(resource).items())
        for key, value in self._configs.get(resource, {}).items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        return values

    @property
    def next_producer_id(self) -> int:
        if self._next_producer_id is not None:
            return self._next_producer_id
        return self.image.next_producer_id

    def feature(self, name: str) -> int:
        if name in self._features:
            return self._features[name]
        return self.image.features.get(name, 0)

    def _replay_topic(self, r: TopicRecord) -> None:
        if self.topic_id(r.name) is not None:
            raise ReplayError(f"topic {r.name} already exists")
        if r.topic_id in self._topics or (
            r.topic_id in self.image.topics and r.topic_id not in self._removed
        ):
            raise ReplayError(f"topic id {r.topic_id} already exists")
        self._topics[r.topic_id] = _TopicDelta(None, r.name, r.topic_id)
        self._names[r.name] = r.topic_id

    def _replay_partition(self, r: PartitionRecord) -> None:
        topic = self._topic(r.topic_id, f"partition record {r.partition_id}")
        if r.partition_id != topic.partition_count:
            raise ReplayError(
                f"partition record {r.partition_id} of topic {topic.name}: the next "
                f"partition id is {topic.partition_count}"
            )
        topic.changed[r.partition_id] = PartitionRegistration.from_record(r)
        topic.partition_count += 1

    def _replay_partition_change(self, r: PartitionChangeRecord) -> None:
        topic = self._topic(r.topic_id, f"partition change of partition {r.partition_id}")
        current = topic.partition(r.partition_id)
        if current is None:
            raise ReplayError(
                f"partition change of unknown partition {r.partition_id} of topic {topic.name}"
            )
        topic.changed[r.partition_id] = current.merge(r)

    def _replay_remove_topic(self, r: RemoveTopicRecord) -> None:
        topic = self._topic(r.topic_id, "topic removal")
        self._removed[r.topic_id] = topic.build()
        del self._topics[r.topic_id]
        self._names[topic.name] = None
        # A removed topic takes its config overrides with it (Kafka's
        # ConfigurationControlManager.deleteTopicConfigs).
        resource = (TOPIC_RESOURCE, topic.name)
        overrides = self.config(resource)
        if overrides:
            # Update, not replace: deletions replayed earlier in this delta
            # must stay.
            self._configs.setdefault(resource, {}).update(dict.fromkeys(overrides, None))

    def _replay_register(self, r: RegisterBrokerRecord) -> None:
        self._brokers[r.broker_id] = BrokerRegistration(
            r.broker_id,
            r.broker_epoch,
            r.incarnation_id,
            r.endpoints,
            r.rack,
            r.features,
            r.fenced,
            r.in_controlled_shutdown,
            r.log_dirs,
        )

    def _change_broker(
        self, broker_id: int, epoch: int, fenced: bool | None, shutting_down: bool | None
    ) -> None:
        current = self.broker(broker_id)
        if current is None or current.epoch != epoch:
            raise ReplayError(
                f"registration change of broker {broker_id} at epoch {epoch}, "
                f"but its registration is {current}"
            )
        self._brokers[broker_id] = replace(
            current,
            fenced=current.fenced if fenced is None else fenced,
            in_controlled_shutdown=current.in_controlled_shutdown
            if shutting_down is None
            else shutting_down,
        )

    # -- results ------------------------------------------------------------------

    def apply(self) -> MetadataImage:
        """The image with every replayed change; unchanged parts are shared."""
        img = self.image
        features = img.features
        if self._features:
            with features.mutate() as fm:
                for name, level in self._features.items():
                    if level == 0:
                        fm.pop(name, None)
                    else:
                        fm[name] = level
                features = fm.finish()
        brokers = img.brokers
        if self._brokers:
            with brokers.mutate() as bm:
                for bid, reg in self._brokers.items():
                    if reg is None:
                        bm.pop(bid, None)
                    else:
                        bm[bid] = reg
                brokers = bm.finish()
        topics, topic_ids = img.topics, img.topic_ids
        configs = img.configs
        if self._topics or self._removed:
            with topics.mutate() as tm:
                for topic_id in self._removed:
                    tm.pop(topic_id, None)
                for topic_id, delta in self._topics.items():
                    tm[topic_id] = delta.build()
                topics = tm.finish()
            # Names change only with new and removed topics: otherwise the
            # name map is shared as it is.
            if self._names:
                with topic_ids.mutate() as nm:
                    for name, named in self._names.items():
                        if named is None:
                            nm.pop(name, None)
                        else:
                            nm[name] = named
                    topic_ids = nm.finish()
        if self._configs:
            with configs.mutate() as cm:
                for resource, changes in self._configs.items():
                    values = cm.get(resource, Map())
                    with values.mutate() as vm:
                        for key, value in changes.items():
                            if value is None:
                                vm.pop(key, None)
                            else:
                                vm[key] = value
                        new_values = vm.finish()
                    if len(new_values):
                        cm[resource] = new_values
                    else:
                        cm.pop(resource, None)
                configs = cm.finish()
        acls = img.acls
        if self._acls:
            # Every id this delta touched leaves the old set; the ones it
            # holds a binding for come back (an id added and removed within
            # this delta is in neither).
            removed = [i for i in self._acls if i in acls.by_id]
            added = {i: acl for i, acl in self._acls.items() if acl is not None}
            acls = acls.changed(added, removed)
        return MetadataImage(
            self._offset,
            self._epoch,
            features,
            brokers,
            topics,
            topic_ids,
            configs,
            self.next_producer_id,
            acls,
        )

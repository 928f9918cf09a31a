"""What one broker must do to its replicas when the metadata image changes
(Kafka's ``TopicsDelta.localChanges(brokerId)`` and ``LocalReplicaChanges``).

Pure: two images and a broker id in, a :class:`LocalChanges` out. Partitions
are named by topic **id** and partition (:class:`TopicIdPartition`), so a
topic deleted and created again under the same name is another partition:
the old replica is in ``deletes`` and the new one in ``leaders`` or
``followers`` of the same change.

The rules, each with Kafka's source:

- **deletes**: the topic was removed, or the partition's replicas no longer
  hold this broker (``TopicsDelta.localChanges`` over ``deletedTopicIds``,
  ``TopicDelta.localChanges``'s first branch). Stopped and their logs
  deleted.
- **leaders**: this broker is the named leader and the partition is new here
  or its partition epoch changed (``TopicDelta.localChanges``: an ISR or
  replica change reaches ``Partition.makeLeader`` too, so the leader's
  partition epoch follows the controller's); ``elected`` is the subset with a
  new leader epoch (``electedLeaders``).
- **followers**: a replica that is not the leader, new here or with a new
  partition epoch; ``Partition.makeFollower`` is called for it.
- **stops** (kq's, stopped but the log kept): a partition without a leader
  (Kafka's ``applyLocalFollowersDelta`` stops fetching when the leader is
  not alive) and, while this broker's registration is missing or fenced,
  every partition it would lead: a fenced broker stops serving as leader
  (the broker issue's rule; the controller moves those partitions away, this
  covers the time until it has).

A change of this broker's fencing re-examines every partition it is named
leader of, even one whose registration did not change: fenced, it stops;
unfenced again, it leads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from metadata.image import MetadataImage, PartitionRegistration, TopicIdPartition, TopicImage
from metadata.records import NO_LEADER

__all__ = ["LocalChanges", "LocalPartition", "is_serving", "local_changes"]


@dataclass(frozen=True, slots=True)
class LocalPartition:
    """A partition of the image as a replica on this broker needs it: the
    topic's id and name (its log directory is named after the name) and the
    registration (for a delete, the last one this broker held)."""

    topic_id: str
    topic_name: str
    partition: int
    registration: PartitionRegistration

    @property
    def key(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, self.partition)


@dataclass(frozen=True, slots=True)
class LocalChanges:
    """The local replica changes of one new image (``LocalReplicaChanges``)."""

    deletes: Mapping[TopicIdPartition, LocalPartition]
    leaders: Mapping[TopicIdPartition, LocalPartition]
    # The leaders whose leader epoch is new (Kafka's electedLeaders).
    elected: frozenset[TopicIdPartition]
    followers: Mapping[TopicIdPartition, LocalPartition]
    stops: Mapping[TopicIdPartition, LocalPartition]

    @property
    def empty(self) -> bool:
        return not (self.deletes or self.leaders or self.followers or self.stops)


def is_serving(image: MetadataImage, broker_id: int) -> bool:
    """Whether ``broker_id`` may serve as a leader in ``image``: it is
    registered and unfenced."""
    registration = image.brokers.get(broker_id)
    return registration is not None and not registration.fenced


def _partitions(topic: TopicImage) -> Iterator[tuple[int, PartitionRegistration]]:
    return iter(enumerate(topic.partitions))


def local_changes(previous: MetadataImage, image: MetadataImage, broker_id: int) -> LocalChanges:
    """The changes ``broker_id`` applies when its image goes from
    ``previous`` to ``image`` (the first image after a start: ``previous``
    is the empty image, and every partition of this broker is new).

    Topics the two images share as the same object are skipped: a delta
    rebuilds only the topics it touched, so the cost is the number of
    topics plus the partitions of the changed ones (and, when this broker's
    fencing changes, every partition)."""
    serving = is_serving(image, broker_id)
    fencing_changed = serving != is_serving(previous, broker_id)
    deletes: dict[TopicIdPartition, LocalPartition] = {}
    leaders: dict[TopicIdPartition, LocalPartition] = {}
    elected: set[TopicIdPartition] = set()
    followers: dict[TopicIdPartition, LocalPartition] = {}
    stops: dict[TopicIdPartition, LocalPartition] = {}

    for topic_id, removed in previous.topics.items():
        if topic_id in image.topics:
            continue
        # Removed (a topic recreated under its name has another id).
        for i, last in _partitions(removed):
            if broker_id in last.replicas:
                gone = LocalPartition(topic_id, removed.name, i, last)
                deletes[gone.key] = gone

    for topic_id, topic in image.topics.items():
        old_topic = previous.topics.get(topic_id)
        if old_topic is topic and not fencing_changed:
            continue
        for i, new in _partitions(topic):
            old = old_topic.partition(i) if old_topic is not None else None
            local = LocalPartition(topic_id, topic.name, i, new)
            was_replica = old is not None and broker_id in old.replicas
            if broker_id not in new.replicas:
                if was_replica:
                    assert old is not None
                    deletes[local.key] = LocalPartition(topic_id, topic.name, i, old)
                continue
            changed = not was_replica or old is None or old.partition_epoch != new.partition_epoch
            if new.leader == broker_id:
                if not serving:
                    if changed or fencing_changed:
                        stops[local.key] = local
                elif changed or fencing_changed:
                    leaders[local.key] = local
                    if (
                        not was_replica
                        or old is None
                        or old.leader_epoch != new.leader_epoch
                        or fencing_changed
                    ):
                        elected.add(local.key)
            elif changed:
                if new.leader == NO_LEADER:
                    stops[local.key] = local
                else:
                    followers[local.key] = local
    return LocalChanges(deletes, leaders, frozenset(elected), followers, stops)

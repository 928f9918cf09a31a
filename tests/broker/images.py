"""Metadata images for broker tests, built as the brokers build theirs: by
replaying the metadata layer's records into deltas."""

from __future__ import annotations

from collections.abc import Sequence

from metadata.delta import MetadataDelta
from metadata.image import EMPTY_IMAGE, MetadataImage
from metadata.records import (
    ConfigRecord,
    Endpoint,
    FenceBrokerRecord,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 1
EPOCHS = {1: 100, 2: 200, 3: 300, 4: 400}


def replay(image: MetadataImage, records: Sequence[Record]) -> MetadataImage:
    delta = MetadataDelta(image)
    for i, record in enumerate(records):
        delta.replay(record, image.offset + i, 1)
    return delta.apply()


def register(broker_id: int, fenced: bool = False) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        broker_id,
        EPOCHS[broker_id],
        f"incarnation-{broker_id}",
        (Endpoint("BROKER", "127.0.0.1", 9000 + broker_id),),
        None,
        (),
        fenced,
    )


def fence(broker_id: int) -> FenceBrokerRecord:
    return FenceBrokerRecord(broker_id, EPOCHS[broker_id])


def unfence(broker_id: int) -> UnfenceBrokerRecord:
    return UnfenceBrokerRecord(broker_id, EPOCHS[broker_id])


def topic(name: str, topic_id: str, *replica_sets: tuple[int, ...]) -> list[Record]:
    """A topic with one partition per replica set, led by its first replica."""
    out: list[Record] = [TopicRecord(name, topic_id)]
    for i, replicas in enumerate(replica_sets):
        out.append(PartitionRecord(topic_id, i, replicas, replicas, leader=replicas[0]))
    return out


def remove(topic_id: str) -> RemoveTopicRecord:
    return RemoveTopicRecord(topic_id)


def change(topic_id: str, partition: int, **fields: object) -> PartitionChangeRecord:
    return PartitionChangeRecord(topic_id, partition, **fields)  # type: ignore[arg-type]


def topic_config(name: str, key: str, value: str | None) -> ConfigRecord:
    return ConfigRecord(TOPIC_RESOURCE, name, key, value)


class Metadata:
    """An image that moves forward one delta at a time."""

    def __init__(self, *records: Record) -> None:
        self.image = replay(EMPTY_IMAGE, [register(b) for b in (1, 2, 3)] + list(records))

    def step(self, *records: Record) -> tuple[MetadataImage, MetadataImage]:
        """(the image before, the image after) replaying ``records``."""
        previous = self.image
        self.image = replay(previous, records)
        return previous, self.image

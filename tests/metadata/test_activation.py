"""What a controller writes when it becomes active."""

from __future__ import annotations

import random

from metadata.configs import ResourceType
from metadata.controller import SUPPORTED_FEATURES, Controller, ControllerOptions
from metadata.delta import MetadataDelta
from metadata.image import MetadataImage
from metadata.records import (
    NO_LEADER,
    ConfigRecord,
    FeatureLevelRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)


def image(*records: object) -> MetadataImage:
    delta = MetadataDelta(MetadataImage())
    for i, r in enumerate(records):
        delta.replay(r, i, 1)  # type: ignore[arg-type]
    return delta.apply()


def broker(b: int, epoch: int, fenced: bool) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(b, epoch, f"inc{b}", (), None, (), fenced=fenced)


def controller() -> Controller:
    return Controller(ControllerOptions("c"), random.Random(0))


def test_a_new_cluster_gets_its_feature_levels() -> None:
    records = controller().activate(MetadataImage(), 0)
    assert records == [FeatureLevelRecord(n, hi) for n, (_, hi) in SUPPORTED_FEATURES.items()]


def test_an_existing_cluster_gets_a_noop_to_open_the_term() -> None:
    levels = [FeatureLevelRecord(n, hi) for n, (_, hi) in SUPPORTED_FEATURES.items()]
    assert controller().activate(image(*levels), 0) == [NoOpRecord()]


def test_leaderless_partitions_an_isr_member_can_lead_are_elected() -> None:
    levels = [FeatureLevelRecord(n, hi) for n, (_, hi) in SUPPORTED_FEATURES.items()]
    committed = image(
        *levels,
        broker(1, 1, fenced=False),
        broker(2, 2, fenced=True),
        TopicRecord("t", "tid"),
        # Broker 1 came back but its election was lost with the old controller.
        PartitionRecord("tid", 0, (2, 1), (1,), leader=NO_LEADER),
        # Only a fenced broker in the ISR: stays offline.
        PartitionRecord("tid", 1, (1, 2), (2,), leader=NO_LEADER),
    )
    c = controller()
    records = c.activate(committed, 0)
    assert records == [PartitionChangeRecord("tid", 0, leader=1)]
    # Every broker starts on a fresh session.
    assert c.heartbeats.is_alive(1, 1) and c.heartbeats.is_alive(2, 1)


def test_broker_level_min_isr_is_removed_on_activation() -> None:
    # KIP-966 (Kafka's KAFKA-16540): every broker and the controller must
    # agree on min ISR, so a broker's own value, left by an older log, goes.
    levels = [FeatureLevelRecord(n, hi) for n, (_, hi) in SUPPORTED_FEATURES.items()]
    broker_type = int(ResourceType.BROKER)
    committed = image(
        *levels,
        ConfigRecord(broker_type, "2", "min.insync.replicas", "2"),
        ConfigRecord(broker_type, "2", "log.retention.ms", "5"),
        ConfigRecord(int(ResourceType.CLUSTER), "", "min.insync.replicas", "2"),
    )
    assert controller().activate(committed, 0) == [
        ConfigRecord(broker_type, "2", "min.insync.replicas", None)
    ]


def test_leaderless_partitions_an_elr_member_can_lead_are_elected() -> None:
    levels = [FeatureLevelRecord(n, hi) for n, (_, hi) in SUPPORTED_FEATURES.items()]
    committed = image(
        *levels,
        broker(1, 1, fenced=False),
        broker(2, 2, fenced=True),
        TopicRecord("t", "tid"),
        # An empty ISR: broker 1, eligible (KIP-966), came back.
        PartitionRecord("tid", 0, (2, 1), (), leader=NO_LEADER, elr=(1, 2)),
        # Only a fenced broker in the ELR: stays offline.
        PartitionRecord("tid", 1, (1, 2), (), leader=NO_LEADER, elr=(2,)),
    )
    records = controller().activate(committed, 0)
    assert records == [PartitionChangeRecord("tid", 0, leader=1, isr=(1,), elr=(2,))]

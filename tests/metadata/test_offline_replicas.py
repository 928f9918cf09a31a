"""Offline replicas (metadata/image.py ``offline_replicas``): the replicas
whose broker is fenced or not registered, as the controllers' DescribeTopics
gives them (Kafka's ``KRaftMetadataCache.getOfflineReplicas``)."""

from __future__ import annotations

from metadata.image import MetadataImage
from metadata.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    PartitionRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from metadata.service import _topic_description
from tests.metadata.test_delta import build, register


def three_brokers() -> MetadataImage:
    """Brokers 1-3 unfenced; topic t with one partition on 3, 1, 2 led by 3."""
    return build(
        [
            register(1, 0),
            register(2, 1),
            register(3, 2),
            TopicRecord("t", "T"),
            PartitionRecord("T", 0, (3, 1, 2), (3, 1, 2), leader=3),
        ]
    )


def offline(image: MetadataImage) -> tuple[int, ...]:
    p = image.partition("T", 0)
    assert p is not None
    return image.offline_replicas(p)


def test_a_fenced_or_unregistered_broker_holds_offline_replicas() -> None:
    image = three_brokers()
    assert offline(image) == ()
    fenced = build([FenceBrokerRecord(2, 1)], image)
    assert offline(fenced) == (2,)
    # Unregistered: no broker at all.  In replica order, not broker order.
    gone = build([UnregisterBrokerRecord(3, 2)], fenced)
    assert offline(gone) == (3, 2)
    # A broker is alive again once unfenced.
    back = build([UnfenceBrokerRecord(2, 1)], gone)
    assert offline(back) == (3,)


def test_a_broker_in_controlled_shutdown_is_not_offline() -> None:
    # It still serves its replicas while it hands over its leaderships
    # (KIP-841): only fencing takes it offline.
    shutting_down = BrokerRegistrationChangeRecord(1, 0, in_controlled_shutdown=True)
    image = build([shutting_down], three_brokers())
    assert not image.brokers[1].active
    assert offline(image) == ()


def test_describe_topics_gives_the_offline_replicas() -> None:
    image = three_brokers()
    (p,) = _topic_description(image, "T").partitions
    assert list(p.offline_replicas) == []
    fenced = build([FenceBrokerRecord(1, 0)], image)
    (p,) = _topic_description(fenced, "T").partitions
    assert list(p.offline_replicas) == [1]
    assert list(p.replicas) == [3, 1, 2]

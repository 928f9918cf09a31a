"""Replaying records into a delta and applying it (metadata/delta.py,
metadata/image.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from immutables import Map

from metadata.configs import ResourceType
from metadata.delta import MetadataDelta, ReplayError
from metadata.image import (
    EMPTY_IMAGE,
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
)
from metadata.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    Endpoint,
    FeatureLevelRecord,
    FenceBrokerRecord,
    LeaderRecoveryState,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from tests.metadata.controller_model import Harness

EP = (Endpoint("PLAINTEXT", "h", 9092),)
TOPIC = int(ResourceType.TOPIC)


def replay(
    records: Sequence[Record], image: MetadataImage = EMPTY_IMAGE, epoch: int = 1
) -> MetadataDelta:
    delta = MetadataDelta(image)
    for i, record in enumerate(records):
        delta.replay(record, image.offset + i, epoch)
    return delta


def build(
    records: Sequence[Record], image: MetadataImage = EMPTY_IMAGE, epoch: int = 1
) -> MetadataImage:
    return replay(records, image, epoch).apply()


def register(
    broker_id: int, epoch: int, fenced: bool = False, rack: str | None = None
) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(broker_id, epoch, f"inc-{broker_id}", EP, rack, (), fenced)


def topic(name: str, topic_id: str, *replica_sets: tuple[int, ...]) -> list[Record]:
    """A topic with one partition per replica set, led by its first replica."""
    out: list[Record] = [TopicRecord(name, topic_id)]
    for i, replicas in enumerate(replica_sets):
        out.append(PartitionRecord(topic_id, i, replicas, replicas, leader=replicas[0]))
    return out


def base_image() -> MetadataImage:
    """Brokers 1-3, topics a (2 partitions) and b (1), a config on each."""
    return build(
        [
            FeatureLevelRecord("metadata.version", 1),
            register(1, 0),
            register(2, 1),
            register(3, 2),
            *topic("a", "A", (1, 2), (2, 3)),
            *topic("b", "B", (3, 1)),
            ConfigRecord(TOPIC, "a", "retention.ms", "1000"),
            ConfigRecord(TOPIC, "b", "retention.ms", "2000"),
            ConfigRecord(int(ResourceType.CLUSTER), "", "num.partitions", "3"),
        ]
    )


# -- replay builds images ------------------------------------------------------------


def test_replay_builds_the_expected_image() -> None:
    image = base_image()
    assert image.offset == 12 and image.epoch == 1
    assert dict(image.features) == {"metadata.version": 1}
    assert image.brokers[2] == BrokerRegistration(2, 1, "inc-2", EP, None, (), False, False)
    assert dict(image.topic_ids) == {"a": "A", "b": "B"}
    a = image.topics["A"]
    assert a.name == "a" and a.topic_id == "A"
    assert a.partitions == (
        PartitionRegistration((1, 2), (1, 2), leader=1),
        PartitionRegistration((2, 3), (2, 3), leader=2),
    )
    assert image.partition("B", 0) == PartitionRegistration((3, 1), (3, 1), leader=3)
    assert image.partition("B", 1) is None
    assert image.partition("nope", 0) is None
    assert image.topic_by_name("a") is a
    assert image.topic_by_name("c") is None
    assert dict(image.config((TOPIC, "a"))) == {"retention.ms": "1000"}
    assert dict(image.config((TOPIC, "zzz"))) == {}
    assert image.partition_count == 3


def test_partition_change_merges_only_what_it_names() -> None:
    image = base_image()
    after = build([PartitionChangeRecord("A", 0, isr=(1,))], image)
    p = after.partition("A", 0)
    assert p == PartitionRegistration((1, 2), (1,), leader=1, leader_epoch=0, partition_epoch=1)
    # Naming a leader bumps the leader epoch, even the same leader.
    after = build([PartitionChangeRecord("A", 0, leader=1)], after)
    assert after.partition("A", 0) == PartitionRegistration(
        (1, 2), (1,), leader=1, leader_epoch=1, partition_epoch=2
    )
    after = build(
        [
            PartitionChangeRecord(
                "A",
                0,
                leader=NO_LEADER,
                replicas=(2, 3, 1),
                adding_replicas=(3,),
                removing_replicas=(1,),
                leader_recovery_state=LeaderRecoveryState.RECOVERING,
            )
        ],
        after,
    )
    assert after.partition("A", 0) == PartitionRegistration(
        (2, 3, 1),
        (1,),
        removing_replicas=(1,),
        adding_replicas=(3,),
        leader=NO_LEADER,
        leader_recovery_state=LeaderRecoveryState.RECOVERING,
        leader_epoch=2,
        partition_epoch=3,
    )


def test_broker_lifecycle() -> None:
    image = build([register(1, 10, fenced=True)])
    assert image.brokers[1].fenced and not image.brokers[1].active
    image = build([UnfenceBrokerRecord(1, 10)], image)
    assert image.brokers[1].active
    image = build([BrokerRegistrationChangeRecord(1, 10, in_controlled_shutdown=True)], image)
    b = image.brokers[1]
    assert not b.fenced and b.in_controlled_shutdown and not b.active
    image = build(
        [BrokerRegistrationChangeRecord(1, 10, fenced=True, in_controlled_shutdown=False)], image
    )
    assert image.brokers[1].fenced and not image.brokers[1].in_controlled_shutdown
    image = build([BrokerRegistrationChangeRecord(1, 10, fenced=False)], image)
    assert image.brokers[1].active
    image = build([FenceBrokerRecord(1, 10)], image)
    assert image.brokers[1].fenced
    # A new registration replaces the old one.
    image = build([register(1, 20, rack="r")], image)
    assert image.brokers[1].epoch == 20 and image.brokers[1].rack == "r"
    image = build([UnregisterBrokerRecord(1, 20)], image)
    assert 1 not in image.brokers


def test_features_configs_and_producer_ids() -> None:
    image = build(
        [
            FeatureLevelRecord("metadata.version", 1),
            FeatureLevelRecord("other", 3),
            ConfigRecord(TOPIC, "t", "k", "v"),
            ProducerIdsRecord(1, 0, 1000),
            ProducerIdsRecord(2, 0, 2000),
            NoOpRecord(),
        ]
    )
    assert dict(image.features) == {"metadata.version": 1, "other": 3}
    assert image.next_producer_id == 2000
    assert dict(image.config((TOPIC, "t"))) == {"k": "v"}
    # Level 0 removes a feature; a None value removes an override, and a
    # resource without overrides disappears.
    image = build([FeatureLevelRecord("other", 0), ConfigRecord(TOPIC, "t", "k", None)], image)
    assert dict(image.features) == {"metadata.version": 1}
    assert (TOPIC, "t") not in image.configs
    # Producer ids may stay (an equal next id) but not go back.
    assert build([ProducerIdsRecord(1, 0, 2000)], image).next_producer_id == 2000


def test_the_delta_reads_its_own_changes() -> None:
    delta = replay([register(1, 0), *topic("a", "A", (1,)), ConfigRecord(TOPIC, "a", "k", "v")])
    assert delta.broker(1) is not None and delta.broker(2) is None
    assert delta.topic_id("a") == "A" and delta.topic_id("b") is None
    assert delta.partition("A", 0) == PartitionRegistration((1,), (1,), leader=1)
    assert delta.partition("A", 1) is None
    assert delta.config((TOPIC, "a")) == {"k": "v"}
    delta.replay(ProducerIdsRecord(1, 0, 5), 10, 1)
    assert delta.next_producer_id == 5
    delta.replay(FeatureLevelRecord("x", 2), 11, 1)
    assert delta.feature("x") == 2 and delta.feature("y") == 0
    delta.replay(RemoveTopicRecord("A"), 12, 1)
    assert delta.topic_id("a") is None
    assert delta.partition("A", 0) is None
    assert delta.records == 7


def test_provenance() -> None:
    image = base_image()
    delta = MetadataDelta(image)
    delta.replay(NoOpRecord(), 40, 7)
    after = delta.apply()
    assert (after.offset, after.epoch) == (41, 7)
    # An empty delta keeps the image's provenance.
    assert MetadataDelta(after).apply() == after
    assert after.with_provenance(3, 2) == MetadataImage(
        3, 2, after.features, after.brokers, after.topics, after.topic_ids, after.configs
    )


# -- apply shares what did not change ----------------------------------------------------


def test_apply_shares_untouched_parts() -> None:
    image = base_image()
    after = build([PartitionChangeRecord("A", 1, isr=(2,))], image)
    assert after.topics["B"] is image.topics["B"]
    assert after.topics["A"] is not image.topics["A"]
    # Within a changed topic, untouched partitions are shared too.
    assert after.topics["A"].partitions[0] is image.topics["A"].partitions[0]
    assert after.brokers is image.brokers
    assert after.features is image.features
    assert after.configs is image.configs
    assert after.topic_ids == image.topic_ids


def test_apply_shares_topics_on_a_broker_change() -> None:
    image = base_image()
    after = build([FenceBrokerRecord(2, 1)], image)
    assert after.topics is image.topics
    assert after.brokers is not image.brokers
    assert after.brokers[1] is image.brokers[1]
    assert after.brokers[2].fenced


def test_apply_shares_topics_on_a_config_change() -> None:
    image = base_image()
    after = build([ConfigRecord(TOPIC, "a", "segment.ms", "5")], image)
    assert after.topics is image.topics
    assert after.brokers is image.brokers
    assert after.configs[(TOPIC, "b")] is image.configs[(TOPIC, "b")]
    assert dict(after.configs[(TOPIC, "a")]) == {"retention.ms": "1000", "segment.ms": "5"}


def test_a_new_topic_leaves_the_others_shared() -> None:
    image = base_image()
    after = build(topic("c", "C", (1,)), image)
    assert after.topics["A"] is image.topics["A"]
    assert after.topics["B"] is image.topics["B"]
    assert after.topic_by_name("c") is not None


def test_images_are_immutable_values() -> None:
    image = base_image()
    with pytest.raises(AttributeError):
        image.offset = 5  # type: ignore[misc]
    # Equal content, equal images (what the property tests compare).
    assert base_image() == image
    assert isinstance(image.topics, Map)


# -- bad records ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "fragment"),
    [
        ([PartitionChangeRecord("A", 5, isr=(1,))], "unknown partition 5"),
        ([PartitionChangeRecord("X", 0, isr=(1,))], "unknown topic X"),
        ([PartitionRecord("X", 0, (1,), (1,))], "unknown topic X"),
        ([TopicRecord("a", "Z")], "topic a already exists"),
        ([TopicRecord("z", "A")], "topic id A already exists"),
        ([TopicRecord("z", "Z"), TopicRecord("z", "Y")], "topic z already exists"),
        ([TopicRecord("z", "Z"), TopicRecord("y", "Z")], "topic id Z already exists"),
        ([PartitionRecord("A", 3, (1,), (1,))], "the next partition id is 2"),
        ([PartitionRecord("A", 1, (1,), (1,))], "the next partition id is 2"),
        (
            [TopicRecord("z", "Z"), PartitionRecord("Z", 1, (1,), (1,))],
            "the next partition id is 0",
        ),
        ([ProducerIdsRecord(1, 0, 1000), ProducerIdsRecord(1, 0, 999)], "go back from 1000 to 999"),
        ([FenceBrokerRecord(1, 99)], "broker 1 at epoch 99"),
        ([UnfenceBrokerRecord(9, 0)], "broker 9 at epoch 0"),
        ([BrokerRegistrationChangeRecord(2, 0, fenced=True)], "broker 2 at epoch 0"),
        ([UnregisterBrokerRecord(1, 7)], "unregistering broker 1 at epoch 7"),
        ([UnregisterBrokerRecord(1, 0), UnregisterBrokerRecord(1, 0)], "unregistering broker 1"),
        ([RemoveTopicRecord("X")], "unknown topic X"),
        ([RemoveTopicRecord("A"), RemoveTopicRecord("A")], "which was removed"),
        ([RemoveTopicRecord("A"), PartitionChangeRecord("A", 0, isr=(1,))], "which was removed"),
        ([RemoveTopicRecord("A"), PartitionRecord("A", 2, (1,), (1,))], "which was removed"),
    ],
)
def test_replay_errors(records: list[Record], fragment: str) -> None:
    with pytest.raises(ReplayError) as info:
        replay(records, base_image())
    assert fragment in str(info.value)


def test_a_freed_name_and_id_may_be_taken_again() -> None:
    image = base_image()
    after = build([RemoveTopicRecord("A"), *topic("a", "A2", (3,))], image)
    assert after.topic_ids["a"] == "A2"
    assert "A" not in after.topics
    assert after.topics["A2"].partitions == (PartitionRegistration((3,), (3,), leader=3),)
    # The old topic's config overrides went with it.
    assert (TOPIC, "a") not in after.configs
    # Removed and created again in separate deltas: the same.
    step = build([RemoveTopicRecord("A")], image)
    assert build(topic("a", "A2", (3,)), step) == after.with_provenance(step.offset + 2, 1)


# -- removing a topic removes its configs ---------------------------------------------------


def test_removing_a_topic_removes_its_config_overrides() -> None:
    image = base_image()
    after = build([RemoveTopicRecord("A")], image)
    assert (TOPIC, "a") not in after.configs
    assert dict(after.config((TOPIC, "b"))) == {"retention.ms": "2000"}
    # Overrides set in the same delta go too.
    after = build([ConfigRecord(TOPIC, "a", "segment.ms", "1"), RemoveTopicRecord("A")], image)
    assert (TOPIC, "a") not in after.configs


def test_removing_a_topic_after_deleting_one_of_its_overrides() -> None:
    # One override deleted, then the topic removed, in one delta (one
    # committed batch can hold both writes): no override may survive, or a
    # later topic of the same name would inherit it.
    image = build([ConfigRecord(TOPIC, "a", "segment.ms", "5")], base_image())
    records: list[Record] = [ConfigRecord(TOPIC, "a", "retention.ms", None), RemoveTopicRecord("A")]
    together = build(records, image)
    assert (TOPIC, "a") not in together.configs
    apart = build(records[1:], build(records[:1], image))
    assert together.configs == apart.configs


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "delete", "remove", "create"]),
            st.sampled_from(["retention.ms", "segment.ms", "cleanup.policy"]),
        ),
        max_size=8,
    ),
    st.data(),
)
def test_grouping_of_records_does_not_matter(
    ops: list[tuple[str, str]], data: st.DataObject
) -> None:
    """Topic config changes and topic removals and creations, replayed in one
    delta or split anywhere into several, give the same image."""
    image = base_image()
    records: list[Record] = []
    alive, generation = True, 0
    for op, key in ops:
        if op == "set" and alive:
            records.append(ConfigRecord(TOPIC, "a", key, "1"))
        elif op == "delete" and alive:
            records.append(ConfigRecord(TOPIC, "a", key, None))
        elif op == "remove" and alive:
            records.append(RemoveTopicRecord("A" if generation == 0 else f"A{generation}"))
            alive = False
        elif op == "create" and not alive:
            generation += 1
            records.extend(topic("a", f"A{generation}", (1,)))
            alive = True
    together = build(records, image)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(records))), max_size=4))))
    apart = image
    for lo, hi in zip([0, *cuts], [*cuts, len(records)], strict=False):
        apart = build(records[lo:hi], apart)
    assert apart.with_provenance(0, 0) == together.with_provenance(0, 0)


# -- images as records --------------------------------------------------------------------


def test_an_image_rebuilds_from_its_records() -> None:
    h = Harness(seed=3)
    h.add_brokers(1, 2, 3, racks=["x", "y", "z"])
    h.create_topic("a", 3, 2, configs={"retention.ms": "60000"})
    h.create_topic("b", 1, 3)
    h.fence(2)
    h.run(lambda c: c.allocate_producer_ids(1, h.image.brokers[1].epoch))
    h.set_config(ResourceType.CLUSTER, "", "unclean.leader.election.enable", "true")
    image = h.image
    rebuilt = build(list(image.to_records()), epoch=image.epoch)
    assert rebuilt.with_provenance(image.offset, image.epoch) == image

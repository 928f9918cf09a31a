"""The local replica changes of one broker between two images
(broker/local_changes.py, Kafka's TopicDelta.localChanges)."""

from __future__ import annotations

from pathlib import Path

from broker.local_changes import local_changes
from metadata.image import EMPTY_IMAGE, TopicIdPartition
from metadata.records import NO_LEADER
from tests.broker.images import Metadata, change, fence, register, remove, topic, unfence
from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]
A0 = TopicIdPartition("id-a", 0)
A1 = TopicIdPartition("id-a", 1)


def test_the_module_is_pure() -> None:
    path = ROOT / "broker" / "local_changes.py"
    assert impurities(path.read_text(), "broker/local_changes.py") == []


def test_a_new_topic_makes_leaders_and_followers_of_its_replicas() -> None:
    md = Metadata()
    previous, image = md.step(*topic("a", "id-a", (1, 2), (2, 3)))
    one = local_changes(previous, image, 1)
    assert set(one.leaders) == {A0} and one.elected == {A0}
    assert not one.followers and not one.deletes and not one.stops
    two = local_changes(previous, image, 2)
    assert set(two.leaders) == {A1} and set(two.followers) == {A0}
    assert two.followers[A0].registration.leader == 1
    assert two.followers[A0].topic_name == "a"
    # Broker 4 holds no replica: nothing to do.
    assert local_changes(previous, image, 4).empty


def test_the_first_image_after_a_start_is_all_new() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2)))
    changes = local_changes(EMPTY_IMAGE, md.image, 2)
    assert set(changes.followers) == {A0}


def test_an_isr_change_reaches_the_leader_and_the_followers_but_is_no_new_election() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2, 3)))
    previous, image = md.step(change("id-a", 0, isr=(1, 2)))
    leader = local_changes(previous, image, 1)
    # A new partition epoch: makeLeader must see it (the next AlterPartition
    # is checked against it), but the leader epoch is the same.
    assert set(leader.leaders) == {A0} and leader.elected == frozenset()
    assert set(local_changes(previous, image, 3).followers) == {A0}


def test_a_new_leader_is_elected_and_followers_follow_it() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2, 3)))
    previous, image = md.step(change("id-a", 0, leader=2, isr=(2, 3)))
    assert local_changes(previous, image, 2).elected == {A0}
    one = local_changes(previous, image, 1)
    assert set(one.followers) == {A0} and one.followers[A0].registration.leader == 2
    assert one.followers[A0].registration.leader_epoch == 1


def test_a_replica_moved_away_is_deleted() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2, 3)))
    previous, image = md.step(change("id-a", 0, replicas=(1, 2), isr=(1, 2), leader=1))
    three = local_changes(previous, image, 3)
    assert set(three.deletes) == {A0}
    # The delete carries the last registration it held and the topic name.
    assert 3 in three.deletes[A0].registration.replicas
    assert three.deletes[A0].topic_name == "a"


def test_a_deleted_and_recreated_topic_is_another_partition() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2)))
    previous, image = md.step(remove("id-a"), *topic("a", "id-a2", (2, 1)))
    changes = local_changes(previous, image, 1)
    assert set(changes.deletes) == {A0}
    assert set(changes.followers) == {TopicIdPartition("id-a2", 0)}


def test_an_offline_partition_stops_without_deleting() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2)))
    previous, image = md.step(change("id-a", 0, leader=NO_LEADER, isr=(1,)))
    for broker in (1, 2):
        changes = local_changes(previous, image, broker)
        assert set(changes.stops) == {A0} and not changes.deletes, broker


def test_a_fenced_broker_stops_leading_and_leads_again_once_unfenced() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2), (2, 1)))
    previous, image = md.step(fence(1))
    fenced = local_changes(previous, image, 1)
    # The partition it is still named leader of stops; the one it follows
    # did not change.
    assert set(fenced.stops) == {A0} and not fenced.leaders and not fenced.followers
    # While fenced, a change to that partition still does not make it lead.
    previous, image = md.step(change("id-a", 0, isr=(1,)))
    assert set(local_changes(previous, image, 1).stops) == {A0}
    previous, image = md.step(unfence(1))
    again = local_changes(previous, image, 1)
    assert set(again.leaders) == {A0} and again.elected == {A0}


def test_an_unregistered_broker_does_not_lead() -> None:
    md = Metadata(*topic("a", "id-a", (4, 1)))
    changes = local_changes(EMPTY_IMAGE, md.image, 4)
    assert set(changes.stops) == {TopicIdPartition("id-a", 0)} and not changes.leaders
    previous, image = md.step(register(4))
    assert set(local_changes(previous, image, 4).leaders) == {TopicIdPartition("id-a", 0)}


def test_an_unchanged_topic_is_skipped() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2)), *topic("b", "id-b", (1, 2)))
    previous, image = md.step(change("id-b", 0, isr=(1,)))
    assert previous.topics["id-a"] is image.topics["id-a"]
    changes = local_changes(previous, image, 1)
    assert set(changes.leaders) == {TopicIdPartition("id-b", 0)}


def test_a_leader_epoch_bump_re_elects_the_same_leader() -> None:
    # Same leader, new leader epoch: the leader is elected again and every
    # follower follows the new epoch.
    md = Metadata(*topic("a", "id-a", (1, 2, 3)))
    previous, image = md.step(change("id-a", 0, leader=1))
    assert image.topics["id-a"].partitions[0].leader_epoch == 1
    one = local_changes(previous, image, 1)
    assert set(one.leaders) == {A0} and one.elected == {A0}
    for broker in (2, 3):
        assert set(local_changes(previous, image, broker).followers) == {A0}, broker


def test_a_reassignment_adds_a_follower_then_deletes_the_removed_replica() -> None:
    # A-1 on (2, 3) moves to (2, 1): 1 is added first, 3 removed at the end.
    md = Metadata(*topic("a", "id-a", (1, 2), (2, 3)))
    previous, image = md.step(
        change("id-a", 1, replicas=(2, 1, 3), adding_replicas=(1,), removing_replicas=(3,))
    )
    added = local_changes(previous, image, 1)
    assert set(added.followers) == {A1} and not added.deletes
    still = local_changes(previous, image, 3)
    assert not still.deletes and set(still.followers) == {A1}
    previous, image = md.step(
        change(
            "id-a",
            1,
            leader=1,
            isr=(2, 1),
            replicas=(2, 1),
            adding_replicas=(),
            removing_replicas=(),
        )
    )
    assert set(local_changes(previous, image, 3).deletes) == {A1}
    assert local_changes(previous, image, 1).elected == {A1}
    assert set(local_changes(previous, image, 2).followers) == {A1}


def test_a_topic_changed_then_deleted_in_one_step_is_only_deleted() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2), (2, 3)))
    previous, image = md.step(change("id-a", 0, leader=2, isr=(2,)), remove("id-a"))
    two = local_changes(previous, image, 2)
    assert not two.leaders and not two.followers
    assert set(two.deletes) == {A0, A1}
    assert set(local_changes(previous, image, 1).deletes) == {A0}
    assert set(local_changes(previous, image, 3).deletes) == {A1}

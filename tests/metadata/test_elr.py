"""Eligible leader replicas (KIP-966) on the controller: the ELR rules of
one partition change (Kafka's PartitionChangeBuilder), the controller's
handling of fencing, min ISR and unclean shutdowns (its
ReplicationControlManager and ClusterControlManager), KIP-966's worked
example, and the records that carry the ELR."""

from __future__ import annotations

from collections.abc import Iterable

import msgpack
import pytest

from metadata.configs import ResourceType
from metadata.delta import MetadataDelta
from metadata.image import EMPTY_IMAGE, MetadataImage, PartitionRegistration
from metadata.partition_change import Election, PartitionChange
from metadata.records import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    LeaderRecoveryState,
    MalformedRecordError,
    PartitionChangeRecord,
    PartitionRecord,
    RecordType,
    decode_record,
    encode_record,
    record_version,
)
from metadata.replication_control import ReplicationControl
from tests.metadata.controller_model import Harness, image_violations

RECOVERED = LeaderRecoveryState.RECOVERED
RECOVERING = LeaderRecoveryState.RECOVERING
MIN_ISR = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"
# With the last known leader off, the last-known ELR lists every replica that
# left the ELR (Kafka with useLastKnownLeaderInBalancedRecovery false): the
# tests of that list run so; tests/metadata/test_last_known_leader.py has
# the default.
LISTED = {"use_last_known_leader": False}


def after(p: PartitionRegistration, live: Iterable[int], **kwargs: object) -> PartitionRegistration:
    ids = set(live)
    c = PartitionChange("T", 0, p, lambda b: b in ids)
    for key, value in kwargs.items():
        setattr(c, key, value)
    record = c.build()
    assert record is not None
    return p.merge(record)


P = PartitionRegistration((1, 2, 3), (1, 2, 3), leader=1, leader_epoch=4, partition_epoch=7)


# -- the rules of one change ------------------------------------------------------------


def test_the_elr_fills_when_the_isr_shrinks_below_min_isr() -> None:
    # min ISR 2: 3 leaves an ISR of three (still at min ISR): no ELR, as it
    # may miss records committed later by 1 and 2.
    p = after(P, [1, 2, 3], target_isr=(1, 2), min_isr=2)
    assert (p.isr, p.elr, p.last_known_elr) == ((1, 2), (), ())
    # 2 leaves: below min ISR the high watermark stops, so 2 keeps every
    # committed record.
    p = after(p, [1, 2, 3], target_isr=(1,), min_isr=2)
    assert (p.isr, p.elr, p.last_known_elr) == ((1,), (2,), ())
    assert p.leader == 1 and p.leader_epoch == 4


def test_the_elr_keeps_its_members_while_the_isr_stays_below_min_isr() -> None:
    p = PartitionRegistration((1, 2, 3), (1,), leader=1, elr=(2,))
    # 1 is fenced: it joins the ELR (fencing loses nothing), and with the
    # ISR empty the first unfenced ELR member leads.
    p = after(p, [2, 3], target_isr=(), min_isr=3)
    assert (p.leader, p.isr, p.elr) == (2, (2,), (1,))
    assert p.leader_recovery_state is RECOVERED


def test_the_elr_is_cleared_at_min_isr() -> None:
    p = PartitionRegistration((1, 2, 3), (1,), leader=1, elr=(2,), last_known_elr=(3,))
    p = after(p, [1, 2, 3], target_isr=(1, 2), min_isr=2)
    assert (p.isr, p.elr, p.last_known_elr) == ((1, 2), (), ())


def test_an_unclean_shutdown_leaves_the_isr_and_the_elr_for_the_last_known_elr() -> None:
    p = PartitionRegistration((1, 2, 3), (1,), leader=1, elr=(2, 3))
    p = after(p, [1], target_isr=(1,), min_isr=2, unclean_shutdown=(3,), **LISTED)
    assert (p.isr, p.elr, p.last_known_elr) == ((1,), (2,), (3,))
    # An ISR member that restarted uncleanly goes straight to the last-known
    # ELR.
    p = PartitionRegistration((1, 2, 3), (1, 2), leader=1)
    p = after(p, [1], target_isr=(1,), min_isr=3, unclean_shutdown=(2,), **LISTED)
    assert (p.isr, p.elr, p.last_known_elr) == ((1,), (), (2,))


def test_an_empty_isr_elects_an_unfenced_elr_member_cleanly() -> None:
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, leader_epoch=5, elr=(2, 3))
    p = after(p, [3], min_isr=2)
    assert p.leader == 3 and p.leader_epoch == 6
    # The new leader is the ISR and leaves the ELR; the election is clean.
    assert p.isr == (3,) and p.elr == (2,)
    assert p.leader_recovery_state is RECOVERED


def test_a_fenced_elr_member_is_not_elected() -> None:
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, elr=(2,))
    c = PartitionChange("T", 0, p, lambda b: b in (1, 3), min_isr=2)
    assert c.build() is None


def test_an_elr_member_is_not_elected_while_the_isr_is_not_empty() -> None:
    # The ISR's only member is fenced but still in it: the ELR waits, as in
    # Kafka's isValidNewLeader.
    p = PartitionRegistration((1, 2), (1,), leader=NO_LEADER, elr=(2,))
    c = PartitionChange("T", 0, p, lambda b: b == 2, min_isr=2)
    assert c.build() is None


def test_an_unclean_election_clears_the_elr() -> None:
    p = PartitionRegistration((1, 2, 3), (), leader=NO_LEADER, elr=(2,), last_known_elr=(3,))
    # The only eligible replica is fenced: only an unclean election helps.
    assert PartitionChange("T", 0, p, lambda b: b == 1, min_isr=2).build() is None
    new = after(p, [1], election=Election.UNCLEAN, min_isr=2)
    assert new.leader == 1 and new.isr == (1,)
    assert new.leader_recovery_state is RECOVERING
    assert new.elr == () and new.last_known_elr == ()
    # With an unfenced ELR member the election stays clean, even when
    # unclean ones are allowed.
    new = after(p, [1, 2], election=Election.UNCLEAN, min_isr=2)
    assert (new.leader, new.isr, new.leader_recovery_state) == (2, (2,), RECOVERED)


def test_a_change_of_the_elr_alone_is_written() -> None:
    p = PartitionRegistration((1, 2, 3), (1,), leader=1, elr=(2, 3))
    c = PartitionChange(
        "T", 0, p, lambda b: True, min_isr=2, unclean_shutdown=(3,), use_last_known_leader=False
    )
    record = c.build()
    assert record is not None
    assert record.leader == NO_LEADER_CHANGE and record.isr is None
    assert record.elr == (2,) and record.last_known_elr == (3,)


# -- the controller ---------------------------------------------------------------------


def three_brokers(
    min_isr: int = 2, unclean: bool = False, use_last_known_leader: bool = True
) -> Harness:
    h = Harness(use_last_known_leader=use_last_known_leader)
    h.add_brokers(1, 2, 3)
    configs = {MIN_ISR: str(min_isr)}
    if unclean:
        configs[UNCLEAN] = "true"
    h.create_topic("t", assignments={0: (1, 2, 3)}, configs=configs)
    return h


def sound(h: Harness) -> None:
    assert not image_violations(h.image), image_violations(h.image)


def test_the_controller_reads_the_topics_min_isr() -> None:
    for min_isr, elr in ((1, ()), (2, (2,)), (3, (2, 3))):
        h = three_brokers(min_isr)
        h.alter_partition("t", 0, [1, 2])
        h.alter_partition("t", 0, [1])
        p = h.partition("t")
        # ISR (1, 2) is below min ISR 3 already, so 3 stays eligible.
        assert p.isr == (1,) and p.elr == elr, min_isr
        sound(h)


def test_min_isr_comes_from_the_cluster_and_is_at_most_the_replication_factor() -> None:
    h = Harness()
    h.add_brokers(1, 2, 3)
    h.set_config(ResourceType.CLUSTER, "", MIN_ISR, "2")
    h.create_topic("t", assignments={0: (1, 2, 3)})
    h.alter_partition("t", 0, [1])
    assert h.partition("t").elr == (2, 3)
    # min ISR 5 on a topic of two replicas counts as 2 (Kafka's
    # getTopicEffectiveMinIsr): an ISR of both clears the ELR.
    h.create_topic("u", assignments={0: (1, 2)}, configs={MIN_ISR: "5"})
    h.alter_partition("u", 0, [1])
    assert h.partition("u").elr == (2,)
    h.alter_partition("u", 0, [1, 2])
    assert h.partition("u").elr == ()


def test_fencing_the_last_isr_member_leaves_an_empty_isr_and_its_election_on_unfencing() -> None:
    h = three_brokers()
    h.alter_partition("t", 0, [1])
    assert h.partition("t").elr == (2, 3)
    h.fence(2)
    h.fence(3)
    h.fence(1)
    p = h.partition("t")
    assert (p.leader, p.isr, p.elr) == (NO_LEADER, (), (1, 2, 3))
    sound(h)
    # The first ELR member to come back leads.
    h.heartbeat(3)
    p = h.partition("t")
    assert (p.leader, p.isr, p.elr) == (3, (3,), (1, 2))
    assert p.leader_recovery_state is RECOVERED
    sound(h)


def test_an_unclean_restart_removes_the_broker_from_every_isr_and_elr() -> None:
    h = three_brokers(min_isr=3, use_last_known_leader=False)
    h.alter_partition("t", 0, [1, 2])
    assert h.partition("t").elr == (3,)
    # 3 restarts without its previous broker epoch: it may have lost records.
    h.register(3)
    p = h.partition("t")
    assert (p.isr, p.elr, p.last_known_elr) == ((1, 2), (), (3,))
    # 2 does too, from the ISR.
    h.register(2)
    p = h.partition("t")
    assert (p.isr, p.elr, p.last_known_elr) == ((1,), (), (2, 3))
    sound(h)


def test_a_clean_restart_keeps_the_broker_in_the_elr() -> None:
    h = three_brokers(min_isr=3)
    h.alter_partition("t", 0, [1, 2])
    epoch = h.image.brokers[3].epoch
    h.register(3, previous_broker_epoch=epoch)
    p = h.partition("t")
    assert (p.isr, p.elr, p.last_known_elr) == ((1, 2), (3,), ())


def test_unclean_election_only_with_the_topic_config() -> None:
    for unclean in (False, True):
        h = three_brokers(unclean=unclean, use_last_known_leader=False)
        h.alter_partition("t", 0, [1])
        h.register(2)  # unclean restarts: 2 and 3 are no longer eligible
        h.register(3)
        h.heartbeat(2)
        h.heartbeat(3)
        h.fence(1)
        p = h.partition("t")
        if unclean:
            assert (p.leader, p.isr, p.leader_recovery_state) == (2, (2,), RECOVERING)
            assert p.elr == () and p.last_known_elr == ()
        else:
            assert (p.leader, p.isr, p.elr) == (NO_LEADER, (), (1,))
            assert p.last_known_elr == (2, 3)
        sound(h)


def kip966_example(h: Harness) -> list[PartitionRegistration]:
    """KIP-966's worked example on brokers 1, 2, 3 (the KIP's 0, 1, 2):
    ISR (1, 2, 3) led by 3, min ISR 2.  1 is partitioned out, then 2; 3
    leads alone (the high watermark stops: strict min ISR) and shuts down
    uncleanly, losing its unsynced tail.  The partition heals, 3 first.
    The partition after each step."""
    states = []
    h.add_brokers(1, 2, 3)
    h.create_topic("t", assignments={0: (3, 1, 2)}, configs={MIN_ISR: "2"})
    h.alter_partition("t", 0, [3, 2])
    h.alter_partition("t", 0, [3])
    h.fence(1)
    h.fence(2)
    states.append(h.partition("t"))
    # 3 crashes: its session ends, then it comes back without its epoch.
    h.fence(3)
    states.append(h.partition("t"))
    h.register(3)
    states.append(h.partition("t"))
    for b in (3, 1, 2):
        h.heartbeat(b)
        p = h.partition("t")
        assert p.leader != 3, "the replica that lost its tail must not lead"
        assert p.leader != 1, "1 left the ISR at min ISR and may miss committed records"
        states.append(p)
    sound(h)
    return states


def test_kip966_worked_example_elects_the_replica_holding_every_committed_record() -> None:
    alone, crashed, restarted, *healing = kip966_example(Harness())
    # 2 left the ISR below min ISR: eligible; 1 left it at min ISR: not.
    assert (alone.leader, alone.isr, alone.elr) == (3, (3,), (2,))
    assert (crashed.leader, crashed.isr, crashed.elr) == (NO_LEADER, (), (2, 3))
    # 3 is the last known leader, but an ELR member is left: it waits.
    assert (restarted.elr, restarted.last_known_elr) == ((2,), (3,))
    # 3 and 1 come back first: nobody leads; then 2 does, and the partition
    # forgets its last known leader.
    assert [s.leader for s in healing] == [NO_LEADER, NO_LEADER, 2]
    p = healing[-1]
    assert p.leader == 2 and p.isr == (2,)
    assert p.leader_recovery_state is RECOVERED
    assert p.last_known_elr == ()


def test_kip966_worked_example_fails_when_an_unclean_restart_keeps_its_elr_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Break the rule on purpose: a restart no longer counts as unclean.
    remove = ReplicationControl.remove_broker_from_partitions

    def clean_always(
        self: ReplicationControl,
        broker_id: int,
        only_leaderships: bool = False,
        unclean_shutdown: bool = False,
    ) -> list[object]:
        return remove(self, broker_id, only_leaderships)  # type: ignore[return-value]

    monkeypatch.setattr(ReplicationControl, "remove_broker_from_partitions", clean_always)
    with pytest.raises(AssertionError, match="lost its tail"):
        kip966_example(Harness())


def test_kip966_worked_example_fails_without_the_elr(monkeypatch: pytest.MonkeyPatch) -> None:
    # Break the rule on purpose: no ELR, and Kafka's old rule of keeping the
    # last ISR member instead.
    build = PartitionChange.build

    def keep_last_member(self: PartitionChange) -> PartitionChangeRecord | None:
        self.min_isr = 0  # every ISR is "at min ISR": the ELR stays empty
        record = build(self)
        if record is not None and record.isr == () and self.partition.isr:
            return PartitionChangeRecord(
                record.topic_id,
                record.partition_id,
                leader=record.leader,
                isr=self.partition.isr[:1],
            )
        return record

    monkeypatch.setattr(PartitionChange, "build", keep_last_member)
    with pytest.raises(AssertionError, match="lost its tail"):
        kip966_example(Harness())


# -- records ------------------------------------------------------------------------------


def test_partition_records_with_an_elr_round_trip_at_version_1() -> None:
    record = PartitionRecord("T", 0, (1, 2, 3), (1,), leader=1, elr=(2,), last_known_elr=(3,))
    assert record_version(record) == 1
    assert decode_record(encode_record(record)) == record
    change = PartitionChangeRecord("T", 0, elr=(), last_known_elr=(2, 3))
    assert record_version(change) == 1
    assert decode_record(encode_record(change)) == change
    change = PartitionChangeRecord("T", 0, elr=(1,))
    assert decode_record(encode_record(change)) == change


def test_records_without_an_elr_are_written_as_before() -> None:
    # Version 0, byte for byte what a build without the ELR writes.
    record = PartitionRecord("T", 0, (1, 2), (1, 2), leader=1)
    data = encode_record(record)
    assert msgpack.unpackb(data) == [
        int(RecordType.PARTITION),
        0,
        "T",
        0,
        [1, 2],
        [1, 2],
        [],
        [],
        1,
        0,
        0,
        0,
    ]
    change = PartitionChangeRecord("T", 0, isr=(1,))
    assert msgpack.unpackb(encode_record(change))[1] == 0


def test_an_old_record_replays_with_an_empty_elr() -> None:
    old_partition = msgpack.packb(
        [int(RecordType.PARTITION), 0, "T", 0, [1, 2], [1], [], [], 1, 0, 3, 4]
    )
    record = decode_record(old_partition)
    assert isinstance(record, PartitionRecord)
    assert record.elr == () and record.last_known_elr == ()
    old_change = msgpack.packb(
        [int(RecordType.PARTITION_CHANGE), 0, "T", 0, -2, [1, 2], None, None, None, None]
    )
    change = decode_record(old_change)
    assert isinstance(change, PartitionChangeRecord)
    assert change.elr is None and change.last_known_elr is None
    # Replayed over a partition with an ELR, an old change leaves it alone.
    p = PartitionRegistration((1, 2, 3), (1,), leader=1, elr=(2,), last_known_elr=(3,))
    merged = p.merge(change)
    assert merged.isr == (1, 2) and merged.elr == (2,) and merged.last_known_elr == (3,)


def test_a_malformed_elr_is_refused_naming_the_field() -> None:
    bad = msgpack.packb(
        [int(RecordType.PARTITION), 1, "T", 0, [1, 2], [1], [], [], 1, 0, 0, 0, ["2"], []]
    )
    with pytest.raises(MalformedRecordError, match="elr"):
        decode_record(bad)
    bad = msgpack.packb(
        [int(RecordType.PARTITION_CHANGE), 1, "T", 0, -2, None, None, None, None, None, None, 3]
    )
    with pytest.raises(MalformedRecordError, match="last_known_elr"):
        decode_record(bad)
    # Version 1 has exactly two more fields.
    short = msgpack.packb([int(RecordType.PARTITION), 1, "T", 0, [1, 2], [1], [], [], 1, 0, 0, 0])
    with pytest.raises(MalformedRecordError, match="fields"):
        decode_record(short)


def replay(image: MetadataImage, records: Iterable[object]) -> MetadataImage:
    delta = MetadataDelta(image)
    for i, record in enumerate(records):
        delta.replay(decode_record(encode_record(record)), image.offset + i, 1)  # type: ignore[arg-type]
    return delta.apply()


def test_the_elr_survives_replay_and_snapshots() -> None:
    h = three_brokers(min_isr=3, use_last_known_leader=False)
    h.alter_partition("t", 0, [1, 2])
    h.register(2)
    h.heartbeat(2)
    p = h.partition("t")
    assert (p.elr, p.last_known_elr) == ((3,), (2,))
    # Replaying the whole log and a snapshot of the image give it back.
    replayed = h.state_machine().image
    assert replayed.partition(h.topic("t").topic_id, 0) == p
    snapshot = replay(EMPTY_IMAGE, list(h.image.to_records()))
    assert snapshot.partition(h.topic("t").topic_id, 0) == p
    assert list(snapshot.to_records()) == list(h.image.to_records())


# -- min.insync.replicas ------------------------------------------------------------------


def test_a_broker_may_not_override_min_isr() -> None:
    h = three_brokers()
    (result,) = h.set_config(ResourceType.BROKER, "1", MIN_ISR, "2")
    assert result.error.name == "INVALID_CONFIG" and MIN_ISR in result.message
    assert "cluster or a topic" in result.message
    # Removing one (left by an older log) stays possible.
    (result,) = h.set_config(ResourceType.BROKER, "1", MIN_ISR, None)
    assert result.error.name == "NONE"


def with_elrs() -> tuple[Harness, str, str]:
    """Topics t (min ISR 3, its own) and u (the cluster's, 3), each with an
    ELR."""
    h = Harness(use_last_known_leader=False)
    h.add_brokers(1, 2, 3)
    h.set_config(ResourceType.CLUSTER, "", MIN_ISR, "3")
    h.create_topic("t", assignments={0: (1, 2, 3)}, configs={MIN_ISR: "3"})
    h.create_topic("u", assignments={0: (1, 2, 3)})
    for name in ("t", "u"):
        h.alter_partition(name, 0, [1, 2])
        h.register(2)  # unclean: 2 goes to the last-known ELR
        h.heartbeat(2)
        p = h.partition(name)
        assert (p.isr, p.elr, p.last_known_elr) == ((1,), (3,), (2,)), name
    return h, "t", "u"


def test_changing_a_topics_min_isr_clears_its_elr() -> None:
    h, t, u = with_elrs()
    # The same value again: nothing to clear.
    before = h.partition(t)
    h.set_config(ResourceType.TOPIC, t, MIN_ISR, "3")
    assert h.partition(t) == before
    h.set_config(ResourceType.TOPIC, t, MIN_ISR, "2")
    p = h.partition(t)
    assert (p.isr, p.elr, p.last_known_elr) == ((1,), (), ())
    assert p.partition_epoch == before.partition_epoch + 1
    # The other topic keeps its ELR.
    assert h.partition(u).elr == (3,)
    sound(h)


def test_changing_the_clusters_min_isr_clears_the_elr_of_topics_without_their_own() -> None:
    h, t, u = with_elrs()
    h.set_config(ResourceType.CLUSTER, "", MIN_ISR, "2")
    assert (h.partition(u).elr, h.partition(u).last_known_elr) == ((), ())
    assert h.partition(t).elr == (3,)
    # Deleting the topic's own value changes its min ISR too.
    h.set_config(ResourceType.TOPIC, t, MIN_ISR, None)
    assert (h.partition(t).elr, h.partition(t).last_known_elr) == ((), ())
    sound(h)


def test_an_unregistered_broker_coming_back_is_no_longer_eligible() -> None:
    h = three_brokers(min_isr=3, use_last_known_leader=False)
    h.alter_partition("t", 0, [1, 2])
    assert h.partition("t").elr == (3,)
    # Unregistration keeps 3 in the ELR, as Kafka's handleBrokerUnregistered
    # does; a registration with no registration to match is unclean.
    h.run(lambda c: c.unregister_broker(3))
    assert h.partition("t").elr == (3,)
    h.register(3)
    p = h.partition("t")
    assert (p.elr, p.last_known_elr) == ((), (3,))
    sound(h)

"""The controller's decisions, handler by handler: decide, then replay
(metadata/controller.py)."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pytest

from metadata.configs import ResourceType
from metadata.controller import (
    MAX_TOPIC_NAME,
    PRODUCER_ID_BLOCK,
    AlterConfigOp,
    AlterPartitionItem,
    Controller,
    ControllerOptions,
    HeartbeatRequest,
    ItemResult,
    NewTopic,
    items_ok,
)
from metadata.errors import ApiError, Errors
from metadata.image import EMPTY_IMAGE
from metadata.partition_change import Election
from metadata.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    FeatureLevelRecord,
    FeatureRange,
    LeaderRecoveryState,
    NoOpRecord,
    PartitionChangeRecord,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)
from tests.metadata.controller_model import (
    CLUSTER_ID,
    Harness,
    image_violations,
    register_request,
)

TOPIC, CLUSTER, BROKER = ResourceType.TOPIC, ResourceType.CLUSTER, ResourceType.BROKER
UNCLEAN = "unclean.leader.election.enable"


@contextlib.contextmanager
def refused(code: Errors, *fragments: str) -> Iterator[None]:
    """Expects an ApiError with ``code`` whose message holds every fragment."""
    with pytest.raises(ApiError) as info:
        yield
    assert info.value.code is code, info.value
    missing = [f for f in fragments if f not in info.value.message]
    assert not missing, f"{missing} not in {info.value.message!r}"


def error(result: ItemResult, code: Errors, *fragments: str) -> None:
    assert result.error is code, result
    missing = [f for f in fragments if f not in result.message]
    assert not missing, f"{missing} not in {result.message!r}"


def sound(h: Harness) -> None:
    assert not image_violations(h.image), image_violations(h.image)


def three_brokers(seed: int = 0) -> Harness:
    h = Harness(seed=seed)
    h.add_brokers(1, 2, 3)
    return h


# -- activation -----------------------------------------------------------------------


def test_activation_of_a_new_cluster_finalizes_the_features() -> None:
    c = Controller(ControllerOptions(CLUSTER_ID), random.Random(0))
    assert c.activate(EMPTY_IMAGE, 0) == [FeatureLevelRecord("metadata.version", 1)]


def test_activation_of_an_existing_cluster_writes_a_noop() -> None:
    h = three_brokers()
    c = Controller(ControllerOptions(CLUSTER_ID), random.Random(1))
    assert c.activate(h.image, 50_000) == [NoOpRecord()]
    assert c.image is h.image
    # Every broker gets a fresh session: none is fenced for the failover.
    assert c.heartbeats.expired([1, 2, 3], 50_000 + 8_999) == []
    assert c.heartbeats.expired([1, 2, 3], 50_000 + 9_000) == [1, 2, 3]
    assert c.fence_expired(50_000 + 8_999).records == []


def test_noop() -> None:
    h = Harness()
    result = h.run(lambda c: c.noop())
    assert result.records == [NoOpRecord()] and result.response is None


# -- registration ---------------------------------------------------------------------------


def test_register_gives_the_epoch_of_the_record() -> None:
    h = Harness()
    offset = h.offset
    result = h.run(lambda c: c.register_broker(register_request(1, rack="r1"), h.now_ms))
    assert result.response == offset
    (record,) = result.records
    assert isinstance(record, RegisterBrokerRecord)
    assert record.broker_epoch == offset and record.fenced
    b = h.image.brokers[1]
    assert (b.epoch, b.rack, b.fenced, b.incarnation_id) == (offset, "r1", True, "incarnation-1")
    assert b.features == (FeatureRange("metadata.version", 1, 1),)
    # The next one gets the next offset.
    assert h.register(2) == offset + 1


def test_a_registration_keeps_its_log_dirs_and_none_is_another_brokers() -> None:
    h = Harness()
    mine = ("dir-b", "dir-a")
    h.run(lambda c: c.register_broker(replace(register_request(1), log_dirs=mine), h.now_ms))
    assert h.image.brokers[1].log_dirs == ("dir-a", "dir-b")
    # Broker 2 naming one of them (a copied disk) is refused; broker 1 may
    # register again with them.
    with refused(Errors.INVALID_REQUEST, "['dir-a']", "broker 1 registered"):
        h.run(
            lambda c: c.register_broker(
                replace(register_request(2), log_dirs=("dir-a", "dir-c")), h.now_ms
            )
        )
    assert 2 not in h.image.brokers
    h.run(lambda c: c.register_broker(replace(register_request(1), log_dirs=mine), h.now_ms))
    assert h.image.brokers[1].log_dirs == ("dir-a", "dir-b")


def test_re_registration_epoch_counts_the_records_before_it() -> None:
    h = three_brokers()
    h.create_topic("t", 3, 3)
    h.advance(10_000)
    offset = h.offset
    result = h.run(lambda c: c.register_broker(register_request(1, incarnation="new"), h.now_ms))
    # The old registration leaves every ISR and leadership first.
    changes = result.records[:-1]
    assert changes and all(isinstance(r, PartitionChangeRecord) for r in changes)
    register = result.records[-1]
    assert isinstance(register, RegisterBrokerRecord)
    assert result.response == register.broker_epoch == offset + len(changes)
    assert h.image.brokers[1].epoch == offset + len(changes)
    for _, _, p in h.image.partitions():
        assert 1 not in p.isr and p.leader != 1
    sound(h)


def test_duplicate_registration_while_the_session_lives() -> None:
    h = three_brokers()
    h.advance(8_999)
    with refused(Errors.DUPLICATE_BROKER_REGISTRATION, "broker 1", "incarnation-1"):
        h.decide(lambda c: c.register_broker(register_request(1, incarnation="x"), h.now_ms))
    # The same incarnation may register again (a retry).
    epoch = h.image.brokers[1].epoch
    assert h.register(1) > epoch
    assert h.image.brokers[1].fenced


def test_same_id_after_the_session_expired() -> None:
    h = three_brokers()
    h.advance(9_000)
    epoch = h.register(1, incarnation="second")
    assert h.image.brokers[1].incarnation_id == "second"
    assert h.image.brokers[1].epoch == epoch


def test_a_heartbeat_keeps_the_session_alive() -> None:
    h = three_brokers()
    h.advance(8_000)
    h.heartbeat(1)
    h.advance(8_000)
    with refused(Errors.DUPLICATE_BROKER_REGISTRATION):
        h.decide(lambda c: c.register_broker(register_request(1, incarnation="x"), h.now_ms))


@pytest.mark.parametrize(
    ("kwargs", "code", "fragments"),
    [
        (
            {"cluster_id": "other"},
            Errors.INVALID_REQUEST,
            ("belongs to cluster 'other'", f"this is cluster {CLUSTER_ID!r}"),
        ),
        ({"incarnation": ""}, Errors.INVALID_REQUEST, ("incarnation id",)),
        ({"features": ()}, Errors.UNSUPPORTED_VERSION, ("supports metadata.version nothing",)),
        (
            {"features": (FeatureRange("metadata.version", 2, 3),)},
            Errors.UNSUPPORTED_VERSION,
            ("metadata.version 2..3", "finalized level is 1"),
        ),
    ],
)
def test_registration_refusals(
    kwargs: dict[str, object], code: Errors, fragments: tuple[str, ...]
) -> None:
    h = Harness()
    req = register_request(1, **kwargs)  # type: ignore[arg-type]
    with refused(code, *fragments):
        h.decide(lambda c: c.register_broker(req, h.now_ms))


def test_negative_broker_id() -> None:
    h = Harness()
    with refused(Errors.INVALID_REQUEST, "broker id -1 is negative"):
        h.decide(lambda c: c.register_broker(register_request(-1), h.now_ms))


# -- heartbeats --------------------------------------------------------------------------------


def test_unfence_once_caught_up() -> None:
    h = Harness()
    epoch = h.register(1)
    # Not caught up: the broker has not applied its registration.
    response = h.heartbeat(1, offset=epoch - 1)
    assert not response.is_caught_up and response.is_fenced
    assert h.image.brokers[1].fenced
    response = h.heartbeat(1, offset=epoch)
    assert response.is_caught_up and not response.is_fenced
    assert not h.image.brokers[1].fenced
    # Unfenced already: nothing more to write.
    assert (
        h.decide(lambda c: c.heartbeat(HeartbeatRequest(1, epoch, epoch + 5), h.now_ms)).records
        == []
    )


def test_heartbeat_refusals() -> None:
    h = three_brokers()
    with refused(Errors.BROKER_ID_NOT_REGISTERED, "broker 9"):
        h.decide(lambda c: c.heartbeat(HeartbeatRequest(9, 0, 100), h.now_ms))
    epoch = h.image.brokers[1].epoch
    with refused(Errors.STALE_BROKER_EPOCH, f"registered with epoch {epoch}, not {epoch - 1}"):
        h.decide(lambda c: c.heartbeat(HeartbeatRequest(1, epoch - 1, 100), h.now_ms))


def test_unfencing_elects_leaderless_partitions() -> None:
    h = Harness()
    h.add_brokers(1, 2)
    h.create_topic("t", assignments={0: (1, 2)})
    h.fence(2)
    h.fence(1)
    p = h.partition("t")
    # The ISR is empty; broker 1, its last member, is eligible (KIP-966).
    assert p.leader == NO_LEADER and p.isr == () and p.elr == (1,)
    # Broker 2 is neither in the ISR nor in the ELR: it may not lead.
    h.heartbeat(2)
    assert h.partition("t").leader == NO_LEADER
    # Broker 1 leads again when it comes back, and is the ISR again.
    h.heartbeat(1)
    p = h.partition("t")
    assert (p.leader, p.isr, p.elr) == (1, (1,), ())
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERED
    sound(h)


def test_want_fence() -> None:
    h = three_brokers()
    h.create_topic("t", 3, 3)
    response = h.heartbeat(2, want_fence=True)
    assert response.is_fenced
    assert h.image.brokers[2].fenced
    for _, _, p in h.image.partitions():
        assert 2 not in p.isr and p.leader != 2 and p.has_leader
    # A fenced broker asking again writes nothing.
    assert (
        h.decide(
            lambda c: c.heartbeat(
                HeartbeatRequest(2, h.image.brokers[2].epoch, 0, want_fence=True), 0
            )
        ).records
        == []
    )
    sound(h)


def test_controlled_shutdown_in_two_steps() -> None:
    h = three_brokers()
    h.create_topic("t", 6, 2)
    led_by_1 = [i for i, p in enumerate(h.topic("t").partitions) if p.leader == 1]
    assert led_by_1
    # Step 1: marked shutting down, its leaderships and ISR places move.
    first = h.heartbeat(1, want_shutdown=True)
    assert first.in_controlled_shutdown and not first.is_fenced and not first.should_shut_down
    b = h.image.brokers[1]
    assert b.in_controlled_shutdown and not b.fenced
    for i, p in enumerate(h.topic("t").partitions):
        assert p.leader != 1
        assert 1 not in p.isr
        if i in led_by_1:
            assert p.has_leader
    sound(h)
    # Step 2, once that committed: fenced and told to go.
    second = h.heartbeat(1, want_shutdown=True)
    assert second.should_shut_down and second.is_fenced and not second.in_controlled_shutdown
    b = h.image.brokers[1]
    assert b.fenced and not b.in_controlled_shutdown
    sound(h)


def test_controlled_shutdown_of_a_fenced_broker_is_immediate() -> None:
    h = three_brokers()
    h.fence(1)
    result = h.decide(
        lambda c: c.heartbeat(
            HeartbeatRequest(1, h.image.brokers[1].epoch, 0, want_shutdown=True), 0
        )
    )
    assert result.records == [] and result.response.should_shut_down


def test_controlled_shutdown_of_the_last_isr_member() -> None:
    # The only ISR member shuts down: the partition goes offline with it in
    # the ELR (KIP-966).
    h = three_brokers()
    h.create_topic("t", assignments={0: (1,)})
    h.heartbeat(1, want_shutdown=True)
    p = h.partition("t")
    assert p.leader == NO_LEADER and p.isr == () and p.elr == (1,)
    assert h.heartbeat(1, want_shutdown=True).should_shut_down
    sound(h)


def test_controlled_shutdown_moves_again_if_step_one_was_lost() -> None:
    # Step 1's flag committed but its partition changes did not (a write too
    # big for one batch, then a failover): step 2 must not fence a broker
    # that still leads or is in ISRs.
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2), 1: (2, 1)})
    epoch = h.image.brokers[1].epoch
    h.write([BrokerRegistrationChangeRecord(1, epoch, in_controlled_shutdown=True)])
    assert h.partition("t", 0).leader == 1 and 1 in h.partition("t", 1).isr
    h.heartbeat(1, want_shutdown=True)
    sound(h)
    assert h.partition("t", 0).leader == 2
    assert h.heartbeat(1, want_shutdown=True).should_shut_down
    sound(h)


def test_controlled_shutdown_fences_a_follower_only_once_it_left_the_isrs() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (2, 1)})
    epoch = h.image.brokers[1].epoch
    h.write([BrokerRegistrationChangeRecord(1, epoch, in_controlled_shutdown=True)])
    assert 1 in h.partition("t").isr and h.partition("t").leader == 2
    h.heartbeat(1, want_shutdown=True)
    sound(h)
    assert 1 not in h.partition("t").isr and h.image.brokers[1].fenced


# -- session expiry ----------------------------------------------------------------------------


def test_fence_expired_after_the_session_timeout() -> None:
    h = three_brokers()
    h.create_topic("t", 3, 3)
    h.advance(8_999)
    assert h.decide(lambda c: c.fence_expired(h.now_ms)).response == []
    h.advance(1)
    # One broker per check by default, the one heard from longest ago first.
    result = h.run(lambda c: c.fence_expired(h.now_ms))
    assert result.response == [1] and not result.atomic
    assert h.image.brokers[1].fenced
    for _, _, p in h.image.partitions():
        assert 1 not in p.isr and p.leader != 1 and p.has_leader
    result = h.run(lambda c: c.fence_expired(h.now_ms, limit=5))
    assert result.response == [2, 3]
    sound(h)


def test_fence_expired_spares_brokers_that_heartbeat() -> None:
    h = three_brokers()
    h.advance(5_000)
    h.heartbeat(2)
    h.advance(5_000)
    assert h.run(lambda c: c.fence_expired(h.now_ms, limit=3)).response == [1, 3]
    assert not h.image.brokers[2].fenced


def test_session_timeout_is_an_option() -> None:
    h = Harness(session_timeout_ms=1_000)
    h.add_brokers(1)
    h.advance(1_000)
    assert h.run(lambda c: c.fence_expired(h.now_ms)).response == [1]


def test_fencing_re_elects_from_the_isr() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2, 3)})
    h.alter_partition("t", 0, [1, 3])
    h.advance(9_000)
    h.heartbeat(2)
    h.heartbeat(3)
    h.run(lambda c: c.fence_expired(h.now_ms))
    p = h.partition("t")
    # Broker 2 is up but out of the ISR: broker 3 leads.
    assert p.leader == 3 and p.isr == (3,)
    assert p.leader_epoch == 1


def test_fencing_moves_the_last_isr_member_to_the_elr() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2)})
    h.alter_partition("t", 0, [1])
    h.fence(1)
    p = h.partition("t")
    assert p.leader == NO_LEADER and p.isr == () and p.elr == (1,)
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERED
    sound(h)


@pytest.mark.parametrize(
    ("topic_value", "cluster_value", "unclean"),
    [
        (None, None, False),
        ("true", None, True),
        (None, "true", True),
        ("false", "true", False),
        ("true", "false", True),
    ],
)
def test_unclean_election_only_when_enabled(
    topic_value: str | None, cluster_value: str | None, unclean: bool
) -> None:
    h = three_brokers()
    configs = {} if topic_value is None else {UNCLEAN: topic_value}
    h.create_topic("t", assignments={0: (1, 2)}, configs=configs)
    if cluster_value is not None:
        assert items_ok(h.set_config(CLUSTER, "", UNCLEAN, cluster_value))
    h.alter_partition("t", 0, [1])
    h.fence(1)
    p = h.partition("t")
    if unclean:
        assert p.leader == 2 and p.isr == (2,)
        assert p.leader_recovery_state is LeaderRecoveryState.RECOVERING
        assert p.elr == () and p.last_known_elr == ()
    else:
        assert p.leader == NO_LEADER and p.isr == () and p.elr == (1,)
    sound(h)


def test_unregister_broker() -> None:
    h = three_brokers()
    h.create_topic("t", 3, 2)
    result = h.run(lambda c: c.unregister_broker(2))
    assert isinstance(result.records[-1], UnregisterBrokerRecord)
    assert 2 not in h.image.brokers
    for _, _, p in h.image.partitions():
        assert 2 not in p.isr and p.leader != 2
    assert h.controller.heartbeats.session(2) is None
    with refused(Errors.BROKER_ID_NOT_REGISTERED):
        h.decide(lambda c: c.unregister_broker(2))
    sound(h)


# -- topics ----------------------------------------------------------------------------------


def test_create_topic() -> None:
    h = three_brokers()
    result = h.run(
        lambda c: c.create_topics([NewTopic("orders", 6, 2, configs={"retention.ms": " 1000 "})])
    )
    (item,) = result.response
    assert item.error is Errors.NONE and result.atomic
    assert (item.num_partitions, item.replication_factor) == (6, 2)
    topic = h.image.topics[item.topic_id]
    assert topic.name == "orders" and h.image.topic_ids["orders"] == item.topic_id
    for p in topic.partitions:
        assert len(p.replicas) == 2
        assert p.isr == p.replicas and p.leader == p.replicas[0]
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    # Configs are stored in normal form.
    assert dict(h.image.config((int(TOPIC), "orders"))) == {"retention.ms": "1000"}
    # Leaders are spread evenly.
    assert sorted(Counter(p.leader for p in topic.partitions).values()) == [2, 2, 2]


def test_create_topic_spreads_replicas_over_racks() -> None:
    h = Harness()
    h.add_brokers(1, 2, 3, 4, 5, 6, racks=["a", "a", "b", "b", "c", "c"])
    topic = h.create_topic("t", 12, 3)
    rack = {b: h.image.brokers[b].rack for b in h.image.brokers}
    for p in topic.partitions:
        assert len({rack[b] for b in p.replicas}) == 3
    assert sorted(Counter(p.leader for p in topic.partitions).values()) == [2] * 6


def test_create_topic_uses_the_cluster_defaults() -> None:
    h = three_brokers()
    h.set_config(CLUSTER, "", "num.partitions", "4")
    h.set_config(CLUSTER, "", "default.replication.factor", "3")
    result = h.run(lambda c: c.create_topics([NewTopic("t")]))
    assert (result.response[0].num_partitions, result.response[0].replication_factor) == (4, 3)


def test_replication_factor_larger_than_the_live_brokers() -> None:
    h = three_brokers()
    h.fence(3)
    result = h.run(lambda c: c.create_topics([NewTopic("t", 1, 3)]))
    error(result.response[0], Errors.INVALID_REPLICATION_FACTOR, "replication factor 3", "(2)")
    assert result.records == []


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "x" * (MAX_TOPIC_NAME + 1), "with space", "slash/y", "ünïcode", "a:b"],
)
def test_invalid_topic_names(name: str) -> None:
    h = three_brokers()
    result = h.run(lambda c: c.create_topics([NewTopic(name, 1, 1)]))
    assert result.response[0].error is Errors.INVALID_TOPIC_NAME, result.response[0]
    assert result.records == []


def test_valid_unusual_topic_names() -> None:
    h = three_brokers()
    for name in ("x" * MAX_TOPIC_NAME, "a.b_c-D9", "...", "_"):
        h.create_topic(name)


@pytest.mark.parametrize(
    ("configs", "fragments"),
    [
        ({"retention.ms": "soon"}, ("invalid value", "retention.ms")),
        ({"no.such.config": "1"}, ("unknown topic config",)),
        ({"log.retention.ms": "1"}, ("log.retention.ms",)),
        ({UNCLEAN: "maybe"}, ("must be true or false",)),
    ],
)
def test_topic_configs_are_validated(configs: dict[str, str], fragments: tuple[str, ...]) -> None:
    h = three_brokers()
    result = h.run(lambda c: c.create_topics([NewTopic("t", 1, 1, configs=configs)]))
    error(result.response[0], Errors.INVALID_CONFIG, *fragments)
    assert result.records == [] and "t" not in h.image.topic_ids


def test_create_topic_with_an_explicit_assignment() -> None:
    h = three_brokers()
    h.fence(3)
    topic = h.create_topic("t", assignments={0: (3, 1), 1: (2, 3), 2: (1, 2)})
    # Fenced replicas start outside the ISR; the leader is the first
    # unfenced replica.
    assert [(p.replicas, p.isr, p.leader) for p in topic.partitions] == [
        ((3, 1), (1,), 1),
        ((2, 3), (2,), 2),
        ((1, 2), (1, 2), 1),
    ]
    sound(h)


@pytest.mark.parametrize(
    ("topic", "code", "fragment"),
    [
        (NewTopic("t", assignments={0: (1, 9)}), Errors.INVALID_REPLICA_ASSIGNMENT, "broker 9"),
        (
            NewTopic("t", assignments={0: (1, 1)}),
            Errors.INVALID_REPLICA_ASSIGNMENT,
            "more than once",
        ),
        (NewTopic("t", assignments={0: (1,), 2: (2,)}), Errors.INVALID_REPLICA_ASSIGNMENT, "0..1"),
        (
            NewTopic("t", assignments={0: (1,), 1: (2, 3)}),
            Errors.INVALID_REPLICA_ASSIGNMENT,
            "same number",
        ),
        (
            NewTopic("t", assignments={0: (3,)}),
            Errors.INVALID_REPLICA_ASSIGNMENT,
            "no unfenced replica",
        ),
        (
            NewTopic("t", replication_factor=1, assignments={0: (1,)}),
            Errors.INVALID_REQUEST,
            "not both",
        ),
        (NewTopic("t", 2, assignments={0: (1,)}), Errors.INVALID_REQUEST, "not both"),
        (NewTopic("t", 0, 1), Errors.INVALID_PARTITIONS, "at least 1 partition"),
        (NewTopic("t", 1, 0), Errors.INVALID_REPLICATION_FACTOR, "at least 1"),
    ],
)
def test_create_topic_refusals(topic: NewTopic, code: Errors, fragment: str) -> None:
    h = three_brokers()
    h.fence(3)
    result = h.run(lambda c: c.create_topics([topic]))
    error(result.response[0], code, fragment)
    assert result.records == []


def test_validate_only_writes_nothing() -> None:
    h = three_brokers()
    result = h.decide(lambda c: c.create_topics([NewTopic("t", 3, 2)], validate_only=True))
    assert result.records == []
    assert result.response[0].error is Errors.NONE and result.response[0].num_partitions == 3
    assert "t" not in h.image.topic_ids


def test_topic_already_exists_and_partial_success() -> None:
    h = three_brokers()
    h.create_topic("a")
    result = h.run(
        lambda c: c.create_topics(
            [
                NewTopic("a", 1, 1),
                NewTopic("b", 1, 1),
                NewTopic("c", 1, 1),
                NewTopic("c", 1, 1),
                NewTopic("d", 1, 9),
            ]
        )
    )
    codes = [r.error for r in result.response]
    assert codes == [
        Errors.TOPIC_ALREADY_EXISTS,
        Errors.NONE,
        Errors.INVALID_REQUEST,
        Errors.INVALID_REQUEST,
        Errors.INVALID_REPLICATION_FACTOR,
    ]
    # A topic named twice is refused both times.
    assert "more than once" in result.response[2].message
    assert set(h.image.topic_ids) == {"a", "b"}


def test_delete_topics() -> None:
    h = three_brokers()
    a = h.create_topic("a", configs={"retention.ms": "5"})
    b = h.create_topic("b")
    h.create_topic("c")
    result = h.run(lambda c: c.delete_topics(["a", "nope"], [b.topic_id, "no-such-id"]))
    assert [(r.name, r.error) for r in result.response] == [
        ("a", Errors.NONE),
        ("nope", Errors.UNKNOWN_TOPIC_OR_PARTITION),
        ("b", Errors.NONE),
        ("no-such-id", Errors.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert len(result.records) == 2
    assert result.response[0].topic_id == a.topic_id
    assert set(h.image.topic_ids) == {"c"}
    # The deleted topic's overrides went with it; a new topic of the same
    # name starts without them.
    assert (int(TOPIC), "a") not in h.image.configs
    again = h.create_topic("a")
    assert again.topic_id != a.topic_id
    assert dict(h.image.config((int(TOPIC), "a"))) == {}


def test_delete_a_topic_named_twice() -> None:
    h = three_brokers()
    c = h.create_topic("c")
    result = h.run(lambda ctl: ctl.delete_topics(["c"], [c.topic_id]))
    assert [r.error for r in result.response] == [Errors.INVALID_REQUEST] * 2
    assert "more than once" in result.response[0].message
    assert result.records == [] and "c" in h.image.topic_ids


def test_create_partitions() -> None:
    h = three_brokers()
    h.create_topic("t", 2, 2)
    result = h.run(lambda c: c.create_partitions("t", 5))
    assert result.response.num_partitions == 5 and result.response.replication_factor == 2
    topic = h.topic("t")
    assert len(topic.partitions) == 5
    assert all(len(p.replicas) == 2 and p.has_leader for p in topic.partitions)
    # Explicit assignments for the new ones.
    h.run(lambda c: c.create_partitions("t", 6, [(3, 1)]))
    assert h.partition("t", 5).replicas == (3, 1)
    # validate_only writes nothing.
    result = h.decide(lambda c: c.create_partitions("t", 9, validate_only=True))
    assert result.records == [] and result.response.num_partitions == 9
    sound(h)


@pytest.mark.parametrize(
    ("name", "total", "assignments", "code", "fragments"),
    [
        ("nope", 3, (), Errors.UNKNOWN_TOPIC_OR_PARTITION, ("nope",)),
        ("t", 2, (), Errors.INVALID_PARTITIONS, ("has 2 partitions", "new count 2")),
        ("t", 1, (), Errors.INVALID_PARTITIONS, ("new count 1",)),
        ("t", 4, [(1, 2)], Errors.INVALID_REPLICA_ASSIGNMENT, ("1 assignments given for 2",)),
        ("t", 3, [(1, 9)], Errors.INVALID_REPLICA_ASSIGNMENT, ("broker 9",)),
        # The new partitions must have the topic's replication factor.
        ("t", 3, [(1,)], Errors.INVALID_REPLICA_ASSIGNMENT, ("replication factor is 2",)),
        ("t", 3, [(1, 2, 3)], Errors.INVALID_REPLICA_ASSIGNMENT, ("replication factor is 2",)),
    ],
)
def test_create_partitions_refusals(
    name: str,
    total: int,
    assignments: list[tuple[int, ...]],
    code: Errors,
    fragments: tuple[str, ...],
) -> None:
    h = three_brokers()
    h.create_topic("t", 2, 2)
    with refused(code, *fragments):
        h.decide(lambda c: c.create_partitions(name, total, assignments))


def test_create_partitions_rf_too_large_for_the_live_brokers() -> None:
    h = three_brokers()
    h.create_topic("t", 1, 3)
    h.fence(3)
    with refused(Errors.INVALID_REPLICATION_FACTOR, "replication factor 3", "(2)"):
        h.decide(lambda c: c.create_partitions("t", 2))


# -- AlterPartition ---------------------------------------------------------------------------


def alter_setup() -> Harness:
    """Brokers 1-4; t-0 on (1, 2, 3) led by 1, ISR (1, 2); broker 4 fenced."""
    h = Harness()
    h.add_brokers(1, 2, 3, 4)
    h.create_topic("t", assignments={0: (1, 2, 3)})
    assert h.alter_partition("t", 0, [1, 2]).error is Errors.NONE
    h.fence(4)
    return h


def test_alter_partition_shrinks_and_expands_the_isr() -> None:
    h = alter_setup()
    before = h.partition("t")
    result = h.alter_partition("t", 0, [1])
    after = h.partition("t")
    assert result.error is Errors.NONE and result.partition_state == after
    assert after.isr == (1,)
    assert after.leader == 1 and after.leader_epoch == before.leader_epoch
    assert after.partition_epoch == before.partition_epoch + 1
    epochs = {b: h.image.brokers[b].epoch for b in (2, 3)}
    result = h.alter_partition("t", 0, [1, 2, 3], broker_epochs=epochs)
    after2 = h.partition("t")
    assert result.error is Errors.NONE and after2.isr == (1, 2, 3)
    assert after2.leader_epoch == before.leader_epoch
    assert after2.partition_epoch == after.partition_epoch + 1


def test_alter_partition_with_the_same_isr_writes_nothing() -> None:
    h = alter_setup()
    p = h.partition("t")
    item = h.alter_item("t", 0, [1, 2])
    result = h.decide(lambda c: c.alter_partition(1, h.image.brokers[1].epoch, [item]))
    assert result.records == []
    assert result.response[0].error is Errors.NONE and result.response[0].partition_state == p


def alter_one(h: Harness, broker: int, item: AlterPartitionItem) -> ItemResult:
    result = h.run(lambda c: c.alter_partition(broker, h.image.brokers[broker].epoch, [item]))
    return result.response[0]


def test_alter_partition_epoch_errors() -> None:
    h = alter_setup()
    # Leadership goes to 2 and back: leader epoch 2.
    h.fence(1)
    h.heartbeat(1)
    h.alter_partition("t", 0, [2, 1])
    h.run(lambda c: c.elect_leaders(Election.PREFERRED, [("t", 0)]))
    p = h.partition("t")
    assert p.leader == 1 and p.leader_epoch == 2
    le, pe = p.leader_epoch, p.partition_epoch
    error(
        alter_one(h, 1, h.alter_item("t", 0, [1, 2], leader_epoch=le - 1)),
        Errors.FENCED_LEADER_EPOCH,
        f"leader epoch {le - 1} is older",
    )
    error(
        alter_one(h, 1, h.alter_item("t", 0, [1, 2], leader_epoch=le + 1)),
        Errors.UNKNOWN_LEADER_EPOCH,
        f"leader epoch {le + 1} is newer",
    )
    error(
        alter_one(h, 1, h.alter_item("t", 0, [1, 2], partition_epoch=pe - 1)),
        Errors.INVALID_UPDATE_VERSION,
        f"partition epoch {pe - 1} is older",
    )
    error(
        alter_one(h, 1, h.alter_item("t", 0, [1, 2], partition_epoch=pe + 1)),
        Errors.UNKNOWN_PARTITION_EPOCH,
        f"partition epoch {pe + 1} is newer",
    )
    assert h.partition("t") == p


def test_alter_partition_from_a_broker_that_does_not_lead() -> None:
    h = alter_setup()
    error(
        alter_one(h, 2, h.alter_item("t", 0, [2])), Errors.NOT_LEADER_OR_FOLLOWER, "the leader is 1"
    )


def test_alter_partition_of_an_unknown_partition() -> None:
    h = alter_setup()
    topic_id = h.topic("t").topic_id
    for item in (
        AlterPartitionItem(topic_id, 7, 0, 0, ((1, -1),)),
        AlterPartitionItem("nope", 0, 0, 0, ((1, -1),)),
    ):
        error(alter_one(h, 1, item), Errors.UNKNOWN_TOPIC_OR_PARTITION)


def test_alter_partition_request_from_a_stale_or_unknown_broker() -> None:
    h = alter_setup()
    item = h.alter_item("t", 0, [1])
    epoch = h.image.brokers[1].epoch
    with refused(Errors.STALE_BROKER_EPOCH):
        h.decide(lambda c: c.alter_partition(1, epoch - 1, [item]))
    with refused(Errors.BROKER_ID_NOT_REGISTERED):
        h.decide(lambda c: c.alter_partition(9, 0, [item]))


def test_alter_partition_invalid_isrs() -> None:
    h = alter_setup()
    error(
        alter_one(h, 1, h.alter_item("t", 0, [2])), Errors.INVALID_REQUEST, "leaves out the leader"
    )
    error(alter_one(h, 1, h.alter_item("t", 0, [1, 4])), Errors.INVALID_REQUEST, "not replicas")
    error(alter_one(h, 1, h.alter_item("t", 0, [1, 2, 1])), Errors.INVALID_REQUEST, "repeats")


def test_alter_partition_ineligible_replicas() -> None:
    h = Harness()
    h.add_brokers(1, 2, 3, 4, 5)
    h.create_topic("t", assignments={0: (1, 2, 3, 4, 5)})
    h.alter_partition("t", 0, [1])
    h.fence(2)
    h.heartbeat(3, want_shutdown=True)
    h.run(lambda c: c.unregister_broker(4))
    for broker, fragment in [
        (2, "is fenced"),
        (3, "is shutting down"),
        (4, "is not registered"),
    ]:
        error(
            alter_one(h, 1, h.alter_item("t", 0, [1, broker])),
            Errors.INELIGIBLE_REPLICA,
            f"broker {broker} {fragment}: it may not join the ISR",
        )
    epoch = h.image.brokers[5].epoch
    error(
        alter_one(h, 1, h.alter_item("t", 0, [1, 5], broker_epochs={5: epoch + 1})),
        Errors.INELIGIBLE_REPLICA,
        f"has broker epoch {epoch}, not {epoch + 1}",
    )
    # The right epoch, or -1, lets it in.
    result = alter_one(h, 1, h.alter_item("t", 0, [1, 5], broker_epochs={5: epoch}))
    assert result.error is Errors.NONE and h.partition("t").isr == (1, 5)


def test_alter_partition_may_not_keep_a_fenced_member() -> None:
    h = alter_setup()
    # Broker 2 is fenced behind the controller's back (its ISR place
    # would have gone with a proper fence): the leader may not keep it.
    epoch = h.image.brokers[2].epoch
    h.write([BrokerRegistrationChangeRecord(2, epoch, fenced=True)])
    error(
        alter_one(h, 1, h.alter_item("t", 0, [1, 2])),
        Errors.INELIGIBLE_REPLICA,
        "broker 2 is fenced: it may not stay in the ISR",
    )


def test_alter_partition_of_a_recovering_leader() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2)}, configs={UNCLEAN: "true"})
    h.alter_partition("t", 0, [1])
    h.fence(1)
    p = h.partition("t")
    assert p.leader == 2 and p.leader_recovery_state is LeaderRecoveryState.RECOVERING
    h.heartbeat(1)
    error(
        alter_one(h, 2, h.alter_item("t", 0, [2, 1])),
        Errors.INVALID_REQUEST,
        "must report its log recovered",
    )
    result = alter_one(h, 2, h.alter_item("t", 0, [2, 1], recovered=True))
    assert result.error is Errors.NONE
    p = h.partition("t")
    assert p.isr == (2, 1) and p.leader_recovery_state is LeaderRecoveryState.RECOVERED


def test_alter_partition_items_are_independent() -> None:
    h = alter_setup()
    h.create_topic("u", assignments={0: (1, 2)})
    good = h.alter_item("u", 0, [1])
    bad = h.alter_item("t", 0, [1], leader_epoch=99)
    result = h.run(lambda c: c.alter_partition(1, h.image.brokers[1].epoch, [bad, good]))
    assert [r.error for r in result.response] == [Errors.UNKNOWN_LEADER_EPOCH, Errors.NONE]
    assert not result.atomic and len(result.records) == 1
    assert h.partition("u").isr == (1,)


# -- elections ----------------------------------------------------------------------------------


def test_elect_preferred_leaders() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2), 1: (2, 3), 2: (3, 1)})
    h.fence(1)
    h.heartbeat(1)
    # Broker 1 is back but outside the ISRs.
    result = h.run(
        lambda c: c.elect_leaders(Election.PREFERRED, [("t", 0), ("t", 1), ("t", 9), ("x", 0)])
    )
    assert [(r.name, r.error) for r in result.response] == [
        ("t-0", Errors.PREFERRED_LEADER_NOT_AVAILABLE),
        ("t-1", Errors.ELECTION_NOT_NEEDED),
        ("t-9", Errors.UNKNOWN_TOPIC_OR_PARTITION),
        ("x-0", Errors.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert result.records == []
    h.alter_partition("t", 0, [2, 1])
    result = h.run(lambda c: c.elect_leaders(Election.PREFERRED, [("t", 0)]))
    assert result.response[0].error is Errors.NONE
    assert h.partition("t", 0).leader == 1
    # "All partitions" reports only what it did or could not do.
    h.alter_partition("t", 2, [3, 1])
    result = h.run(lambda c: c.elect_leaders(Election.PREFERRED, None))
    assert [r.name for r in result.response] == []
    sound(h)


def test_elect_preferred_of_a_fenced_preferred_replica() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2)})
    h.fence(1)
    result = h.run(lambda c: c.elect_leaders(Election.PREFERRED, None))
    error(result.response[0], Errors.PREFERRED_LEADER_NOT_AVAILABLE, "preferred leader 1")


def test_elect_unclean_leaders() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2), 1: (2, 3)})
    h.alter_partition("t", 0, [1])
    h.fence(1)
    assert h.partition("t", 0).leader == NO_LEADER
    # An admin's unclean election needs no config.
    result = h.run(lambda c: c.elect_leaders(Election.UNCLEAN, [("t", 0), ("t", 1)]))
    assert [r.error for r in result.response] == [Errors.NONE, Errors.ELECTION_NOT_NEEDED]
    p = h.partition("t", 0)
    assert p.leader == 2 and p.isr == (2,)
    assert p.leader_recovery_state is LeaderRecoveryState.RECOVERING
    sound(h)


def test_elect_unclean_without_a_live_replica() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2)})
    h.fence(2)
    h.fence(1)
    result = h.run(lambda c: c.elect_leaders(Election.UNCLEAN, [("t", 0)]))
    error(result.response[0], Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE, "[1, 2]")
    assert result.records == []


def test_elect_online_is_not_an_admin_election() -> None:
    h = three_brokers()
    with refused(Errors.INVALID_REQUEST, "preferred or unclean"):
        h.decide(lambda c: c.elect_leaders(Election.ONLINE, None))


# -- leader rebalance ---------------------------------------------------------------------------


def rebalance_setup(moved: int, partitions: int = 10) -> Harness:
    """Brokers 1 and 2; ``partitions`` partitions preferring broker 1, of
    which ``moved`` are led by broker 2 (broker 1 in their ISR)."""
    h = Harness()
    h.add_brokers(1, 2)
    h.create_topic("t", assignments=dict.fromkeys(range(partitions), (1, 2)))
    epoch = h.image.brokers[1].epoch
    for i in range(moved):
        h.write([PartitionChangeRecord(h.topic("t").topic_id, i, leader=2, isr=(2, 1))])
    assert h.image.brokers[1].epoch == epoch
    assert sum(p.leader == 2 for p in h.topic("t").partitions) == moved
    return h


def test_rebalance_below_the_threshold_does_nothing() -> None:
    # 1 of 10 (10%) is not above the default 10%.
    h = rebalance_setup(1)
    assert h.decide(lambda c: c.rebalance_leaders()).records == []


def test_rebalance_above_the_threshold() -> None:
    h = rebalance_setup(2)
    result = h.run(lambda c: c.rebalance_leaders())
    assert result.response == 2 and not result.atomic
    assert all(p.leader == 1 for p in h.topic("t").partitions)
    sound(h)


def test_rebalance_threshold_and_switch_are_cluster_configs() -> None:
    h = rebalance_setup(3)
    h.set_config(CLUSTER, "", "leader.imbalance.per.broker.percentage", "30")
    assert h.decide(lambda c: c.rebalance_leaders()).records == []
    h.set_config(CLUSTER, "", "leader.imbalance.per.broker.percentage", "29")
    assert h.decide(lambda c: c.rebalance_leaders()).response == 3
    h.set_config(CLUSTER, "", "auto.leader.rebalance.enable", "false")
    assert h.decide(lambda c: c.rebalance_leaders()).records == []


def test_rebalance_skips_preferred_replicas_that_cannot_lead() -> None:
    h = rebalance_setup(5)
    h.fence(1)
    assert h.decide(lambda c: c.rebalance_leaders()).records == []


# -- reassignment ----------------------------------------------------------------------------


def test_reassignment_start_and_completion() -> None:
    h = Harness()
    h.add_brokers(1, 2, 3, 4)
    h.create_topic("t", assignments={0: (1, 2), 1: (2, 3)})
    before = h.partition("t", 0)
    result = h.run(lambda c: c.alter_reassignments([("t", 0, (3, 4))]))
    assert result.response[0].error is Errors.NONE
    p = h.partition("t", 0)
    assert p.replicas == (3, 4, 1, 2)
    assert p.adding_replicas == (3, 4) and p.removing_replicas == (1, 2)
    assert p.isr == before.isr and p.leader == 1
    listed = h.controller.list_reassignments()
    assert [(n, i) for n, i, _ in listed] == [("t", 0)]
    assert h.controller.list_reassignments([("t", 1)]) == []
    # One new replica joins: not done.
    h.alter_partition("t", 0, [1, 2, 3])
    assert h.partition("t", 0).is_reassigning
    # Both: done; the removed leader hands over, the leader epoch grows.
    h.alter_partition("t", 0, [1, 2, 3, 4])
    p = h.partition("t", 0)
    assert (p.replicas, p.isr, p.leader) == ((3, 4), (3, 4), 3)
    assert not p.is_reassigning and p.leader_epoch > before.leader_epoch
    assert h.controller.list_reassignments() == []
    sound(h)


def test_reassignment_cancel() -> None:
    h = Harness()
    h.add_brokers(1, 2, 3, 4)
    h.create_topic("t", assignments={0: (1, 2)})
    h.run(lambda c: c.alter_reassignments([("t", 0, (3, 4))]))
    h.alter_partition("t", 0, [1, 2, 3])
    epoch = h.partition("t").leader_epoch
    result = h.run(lambda c: c.alter_reassignments([("t", 0, None)]))
    assert result.response[0].error is Errors.NONE
    p = h.partition("t")
    assert (p.replicas, p.isr, p.leader) == ((1, 2), (1, 2), 1)
    assert not p.is_reassigning and p.leader_epoch == epoch + 1
    result = h.run(lambda c: c.alter_reassignments([("t", 0, None)]))
    error(result.response[0], Errors.NO_REASSIGNMENT_IN_PROGRESS, "t-0")
    sound(h)


def test_reassignment_refusals() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2)})
    result = h.run(
        lambda c: c.alter_reassignments(
            [("t", 5, (1,)), ("x", 0, (1,)), ("t", 0, (1, 9)), ("t", 0, (2, 2)), ("t", 0, ())]
        )
    )
    assert [r.error for r in result.response] == [
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.INVALID_REPLICA_ASSIGNMENT,
        Errors.INVALID_REPLICA_ASSIGNMENT,
        Errors.INVALID_REPLICA_ASSIGNMENT,
    ]
    assert result.records == []


def test_reassignment_to_the_current_replicas_does_nothing() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2)})
    result = h.run(lambda c: c.alter_reassignments([("t", 0, (1, 2))]))
    assert result.response[0].error is Errors.NONE and result.records == []


def test_reassignment_that_only_removes_a_replica() -> None:
    h = three_brokers()
    h.create_topic("t", assignments={0: (1, 2, 3)})
    before = h.partition("t")
    h.run(lambda c: c.alter_reassignments([("t", 0, (1, 2))]))
    p = h.partition("t")
    assert (p.replicas, p.isr, p.leader) == ((1, 2), (1, 2), 1)
    assert not p.is_reassigning
    # A replica went away: its leader epoch grows so it notices.
    assert p.leader_epoch == before.leader_epoch + 1


def test_replacing_a_reassignment_in_progress() -> None:
    # (1) -> (2, 3), broker 2 joins the ISR, then the target changes to (4):
    # the ISR must stay within the replicas.
    h = Harness()
    h.add_brokers(1, 2, 3, 4)
    h.create_topic("t", assignments={0: (1,)})
    h.run(lambda c: c.alter_reassignments([("t", 0, (2, 3))]))
    h.alter_partition("t", 0, [1, 2])
    assert h.partition("t").is_reassigning
    result = h.run(lambda c: c.alter_reassignments([("t", 0, (4,))]))
    assert result.response[0].error is Errors.NONE
    sound(h)
    p = h.partition("t")
    assert p.target_replicas() == (4,)
    assert 4 in p.adding_replicas
    h.alter_partition("t", 0, [*p.isr, 4])
    p = h.partition("t")
    assert (p.replicas, p.isr, p.leader) == ((4,), (4,), 4)
    sound(h)


def test_cancelling_when_no_original_replica_is_in_the_isr() -> None:
    # (1) -> (2, 3); 2 joins the ISR; 1 is fenced, so 2 leads.  Cancelling
    # would put the partition back on broker 1, which is out of the ISR.
    h = Harness()
    h.add_brokers(1, 2, 3)
    h.create_topic("t", assignments={0: (1,)})
    h.run(lambda c: c.alter_reassignments([("t", 0, (2, 3))]))
    h.alter_partition("t", 0, [1, 2])
    h.fence(1)
    assert h.partition("t").leader == 2 and h.partition("t").isr == (2,)
    result = h.run(lambda c: c.alter_reassignments([("t", 0, None)]))
    error(result.response[0], Errors.INVALID_REPLICA_ASSIGNMENT, "unclean")
    assert result.records == []
    sound(h)
    # With unclean elections allowed it goes back, broker 1 in the ISR.
    h.set_config(TOPIC, "t", UNCLEAN, "true")
    result = h.run(lambda c: c.alter_reassignments([("t", 0, None)]))
    assert result.response[0].error is Errors.NONE
    p = h.partition("t")
    assert p.replicas == (1,) and p.isr == (1,) and not p.is_reassigning
    sound(h)


# -- configs ----------------------------------------------------------------------------------


def alter(
    h: Harness, *changes: tuple[ResourceType, str, list[AlterConfigOp]], validate_only: bool = False
) -> list[ItemResult]:
    return h.run(lambda c: c.alter_configs(list(changes), validate_only=validate_only)).response


def test_alter_configs_set_and_delete() -> None:
    h = three_brokers()
    h.create_topic("t")
    results = alter(
        h,
        (TOPIC, "t", [AlterConfigOp("retention.ms", "100"), AlterConfigOp(UNCLEAN, "TRUE")]),
        (CLUSTER, "", [AlterConfigOp("log.retention.ms", "200")]),
        (BROKER, "1", [AlterConfigOp("log.retention.ms", "300")]),
    )
    assert items_ok(results)
    assert [r.name for r in results] == ["topic t", "the cluster", "broker 1"]
    assert dict(h.image.config((int(TOPIC), "t"))) == {"retention.ms": "100", UNCLEAN: "true"}
    assert dict(h.image.config((int(CLUSTER), ""))) == {"log.retention.ms": "200"}
    assert dict(h.image.config((int(BROKER), "1"))) == {"log.retention.ms": "300"}
    assert items_ok(alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", None)])))
    assert dict(h.image.config((int(TOPIC), "t"))) == {UNCLEAN: "true"}
    # Deleting an override that is not there is fine.
    assert items_ok(alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", None)])))


@pytest.mark.parametrize(
    ("change", "code", "fragment"),
    [
        (
            (TOPIC, "nope", [AlterConfigOp("retention.ms", "1")]),
            Errors.UNKNOWN_TOPIC_OR_PARTITION,
            "nope",
        ),
        ((TOPIC, "t", [AlterConfigOp("retention.ms", "x")]), Errors.INVALID_CONFIG, "retention.ms"),
        ((TOPIC, "t", [AlterConfigOp("bogus", "1")]), Errors.INVALID_CONFIG, "bogus"),
        ((TOPIC, "t", [AlterConfigOp("bogus", None)]), Errors.INVALID_CONFIG, "bogus"),
        ((CLUSTER, "x", [AlterConfigOp("log.retention.ms", "1")]), Errors.INVALID_REQUEST, "empty"),
        (
            (BROKER, "01", [AlterConfigOp("log.retention.ms", "1")]),
            Errors.INVALID_REQUEST,
            "broker id",
        ),
        (
            (TOPIC, "t", [AlterConfigOp("retention.ms", "1"), AlterConfigOp("retention.ms", "2")]),
            Errors.INVALID_REQUEST,
            "altered twice",
        ),
    ],
)
def test_alter_configs_validation(
    change: tuple[ResourceType, str, list[AlterConfigOp]], code: Errors, fragment: str
) -> None:
    h = three_brokers()
    h.create_topic("t")
    before = h.image.configs
    # All or nothing: a refused resource stops the others too.
    results = alter(h, change, (CLUSTER, "", [AlterConfigOp("num.partitions", "2")]))
    error(results[0], code, fragment)
    assert results[1].error is Errors.NONE
    assert h.image.configs is before


def test_conditional_config_updates() -> None:
    h = three_brokers()
    h.create_topic("t")
    assert items_ok(
        alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", "1", expect_absent=True)]))
    )
    results = alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", "2", expect_absent=True)]))
    error(
        results[0], Errors.CONFIG_PRECONDITION_FAILED, "topic t", "retention.ms is '1', not unset"
    )
    assert items_ok(alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", "2", expected="1")])))
    results = alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", "3", expected="1")]))
    error(results[0], Errors.CONFIG_PRECONDITION_FAILED, "is '2', not '1'")
    # A conditional delete.
    assert items_ok(alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", None, expected="2")])))
    assert dict(h.image.config((int(TOPIC), "t"))) == {}
    results = alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", "4", expected="2")]))
    error(results[0], Errors.CONFIG_PRECONDITION_FAILED, "is unset, not '2'")


def test_a_failed_condition_writes_nothing_of_the_request() -> None:
    h = three_brokers()
    h.create_topic("t")
    h.create_topic("u")
    before = h.image.configs
    result = h.run(
        lambda c: c.alter_configs(
            [
                (TOPIC, "t", [AlterConfigOp("retention.ms", "1")]),
                (TOPIC, "u", [AlterConfigOp("retention.ms", "1", expected="nope")]),
                (CLUSTER, "", [AlterConfigOp("num.partitions", "3")]),
            ]
        )
    )
    assert [r.error for r in result.response] == [
        Errors.NONE,
        Errors.CONFIG_PRECONDITION_FAILED,
        Errors.NONE,
    ]
    assert result.records == [] and h.image.configs is before


WAIT, LAG = "replica.fetch.wait.max.ms", "replica.lag.time.max.ms"


def test_the_fetch_wait_in_force_may_not_exceed_the_lag_time() -> None:
    """KafkaConfig's replica.fetch.wait.max.ms <= replica.lag.time.max.ms,
    judged on the configs as the whole request leaves them: on a broker's
    own values, and on the cluster's for itself and for every broker with
    a value of its own."""
    h = three_brokers()
    before = h.image.configs
    # The cluster's lag time below the default wait (500).
    [result] = alter(h, (CLUSTER, "", [AlterConfigOp(LAG, "400")]))
    error(result, Errors.INVALID_CONFIG, "500 (the default) is above", "400 (the cluster's)")
    assert h.image.configs is before
    # A broker's own wait above the cluster's lag time.
    assert items_ok(alter(h, (CLUSTER, "", [AlterConfigOp(LAG, "1500")])))
    [result] = alter(h, (BROKER, "2", [AlterConfigOp(WAIT, "2000")]))
    error(result, Errors.INVALID_CONFIG, "for broker 2")
    assert items_ok(alter(h, (BROKER, "2", [AlterConfigOp(WAIT, "1000")])))
    # The cluster's lag time may not go below a broker's own wait...
    results = alter(h, (CLUSTER, "", [AlterConfigOp(LAG, "800")]))
    error(results[0], Errors.INVALID_CONFIG, "1000 (the broker's own)", "for broker 2")
    # ...unless the same request lowers that wait, or the broker has a lag
    # time of its own.
    assert items_ok(
        alter(
            h,
            (CLUSTER, "", [AlterConfigOp(LAG, "800")]),
            (BROKER, "2", [AlterConfigOp(WAIT, "700")]),
        )
    )
    assert items_ok(
        alter(h, (BROKER, "3", [AlterConfigOp(WAIT, "1000"), AlterConfigOp(LAG, "1000")]))
    )
    # Removing a broker's own lag time leaves its wait above the cluster's.
    [result] = alter(h, (BROKER, "3", [AlterConfigOp(LAG, None)]))
    error(result, Errors.INVALID_CONFIG, "for broker 3")
    # validate_only says the same and writes nothing.
    [result] = alter(h, (BROKER, "1", [AlterConfigOp(WAIT, "900")]), validate_only=True)
    error(result, Errors.INVALID_CONFIG, "for broker 1")
    assert dict(h.image.config((int(BROKER), "2"))) == {WAIT: "700"}
    assert dict(h.image.config((int(CLUSTER), ""))) == {LAG: "800"}


def test_alter_configs_validate_only() -> None:
    h = three_brokers()
    h.create_topic("t")
    results = alter(h, (TOPIC, "t", [AlterConfigOp("retention.ms", "1")]), validate_only=True)
    assert items_ok(results)
    assert dict(h.image.config((int(TOPIC), "t"))) == {}


# -- producer ids and features -----------------------------------------------------------------


def test_allocate_producer_ids() -> None:
    h = three_brokers()
    blocks = []
    for broker in (1, 2, 1):
        epoch = h.image.brokers[broker].epoch
        blocks.append(
            h.run(
                partial(Controller.allocate_producer_ids, broker_id=broker, broker_epoch=epoch)
            ).response
        )
    assert blocks == [(0, PRODUCER_ID_BLOCK), (1000, PRODUCER_ID_BLOCK), (2000, PRODUCER_ID_BLOCK)]
    assert h.image.next_producer_id == 3000
    # Survives a snapshot (the block handed out is never handed out again).
    assert h.state_machine().image.next_producer_id == 3000


def test_allocate_producer_ids_refusals() -> None:
    h = three_brokers()
    h.fence(3)
    with refused(Errors.BROKER_NOT_AVAILABLE, "broker 3 is fenced"):
        h.decide(lambda c: c.allocate_producer_ids(3, h.image.brokers[3].epoch))
    with refused(Errors.STALE_BROKER_EPOCH):
        h.decide(lambda c: c.allocate_producer_ids(1, h.image.brokers[1].epoch + 1))
    with refused(Errors.BROKER_ID_NOT_REGISTERED):
        h.decide(lambda c: c.allocate_producer_ids(7, 0))


def test_update_features() -> None:
    h = three_brokers()
    # The level already finalized: nothing to write.
    result = h.run(lambda c: c.update_features({"metadata.version": 1}))
    assert items_ok(result.response) and result.records == []
    result = h.run(lambda c: c.update_features({"nope": 1, "metadata.version": 2}))
    # Answers come in request order.
    assert [(r.name, r.error) for r in result.response] == [
        ("nope", Errors.INVALID_FEATURE_UPDATE),
        ("metadata.version", Errors.INVALID_FEATURE_UPDATE),
    ]
    assert "unknown feature nope" in result.response[0].message
    assert "outside this controller's 1..1" in result.response[1].message
    result = h.run(lambda c: c.update_features({"metadata.version": 0}))
    error(result.response[0], Errors.INVALID_FEATURE_UPDATE, "cannot be removed")


def test_update_features_checks_every_broker() -> None:
    h = Harness()
    # A cluster whose feature was removed: brokers that do not support it
    # may register, and an update must check them.
    h.write([FeatureLevelRecord("metadata.version", 0)])
    h.register(1, incarnation="old")
    h.run(lambda c: c.register_broker(register_request(2, features=()), h.now_ms))
    result = h.run(lambda c: c.update_features({"metadata.version": 1}))
    error(result.response[0], Errors.INVALID_FEATURE_UPDATE, "broker 2 does not support")
    h.run(lambda c: c.unregister_broker(2))
    result = h.run(lambda c: c.update_features({"metadata.version": 1}, validate_only=True))
    assert items_ok(result.response) and result.records == []
    result = h.run(lambda c: c.update_features({"metadata.version": 1}))
    assert result.records == [FeatureLevelRecord("metadata.version", 1)]
    assert dict(h.image.features) == {"metadata.version": 1}


# -- decisions change nothing ---------------------------------------------------------------------


def test_handlers_change_nothing_but_sessions() -> None:
    h = three_brokers()
    h.create_topic("t", 3, 2)
    image = h.image
    decisions = [
        lambda c: c.create_topics([NewTopic("u", 2, 2)]),
        lambda c: c.delete_topics(["t"]),
        lambda c: c.create_partitions("t", 5),
        lambda c: c.heartbeat(HeartbeatRequest(1, image.brokers[1].epoch, 100, want_fence=True), 0),
        lambda c: c.heartbeat(
            HeartbeatRequest(2, image.brokers[2].epoch, 100, want_shutdown=True), 0
        ),
        lambda c: c.fence_expired(100_000, limit=3),
        lambda c: c.unregister_broker(3),
        lambda c: c.alter_reassignments([("t", 0, (3,))]),
        lambda c: c.alter_configs([(TOPIC, "t", [AlterConfigOp("retention.ms", "1")])]),
        lambda c: c.allocate_producer_ids(1, image.brokers[1].epoch),
        lambda c: c.register_broker(register_request(4), 0),
    ]
    for decide in decisions:
        result = h.decide(decide)
        assert result.records
        assert h.image is image

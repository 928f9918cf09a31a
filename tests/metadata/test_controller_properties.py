"""The controller against a simulated log (tests/metadata/controller_model.py):
random requests, commits of random prefixes in random batches, failovers,
snapshots; the invariants of every image after every step."""

from __future__ import annotations

import random
from functools import partial

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstore.state_machine import encode_put
from metadata.configs import ResourceType
from metadata.controller import (
    AlterConfigOp,
    AlterPartitionItem,
    Controller,
    HeartbeatRequest,
    NewTopic,
)
from metadata.errors import ApiError, Errors
from metadata.image import MetadataImage
from metadata.partition_change import Election
from tests.metadata.controller_model import SimulatedCluster, register_request

BROKERS = range(6)
TOPICS = ("alpha", "beta", "gamma", "delta")
CUTS = st.lists(st.integers(1, 8), max_size=3)
RANDOM = st.randoms(use_true_random=False)


def rack(broker_id: int) -> str:
    return f"rack-{broker_id % 3}"


class ControllerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = SimulatedCluster(0)
        self.incarnations = dict.fromkeys(BROKERS, 0)

    @initialize(
        seed=st.integers(0, 2**16),
        brokers=st.integers(0, len(BROKERS)),
        topics=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), max_size=len(TOPICS)),
    )
    def start(self, seed: int, brokers: int, topics: list[tuple[int, int]]) -> None:
        """A cluster of ``brokers`` live brokers and some topics, all
        committed (or, with no broker, an empty one)."""
        self.cluster = c = SimulatedCluster(seed)
        for broker in range(brokers):
            req = register_request(broker, incarnation=f"b{broker}-0", rack=rack(broker))
            c.decide(partial(Controller.register_broker, req=req, now_ms=c.now_ms))
        self.settle()
        for (partitions, rf), name in zip(topics, TOPICS, strict=False):
            c.decide(partial(Controller.create_topics, topics=[NewTopic(name, partitions, rf)]))
        c.commit_all()

    # -- helpers ---------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self.cluster.controller.image

    def applied(self) -> int:
        """The offset of the last record a broker applied: everything
        committed."""
        return self.cluster.committed.applied_offset - 1

    def registered(self) -> list[int]:
        return sorted(self.image.brokers)

    def heartbeat_request(self, broker_id: int, **flags: bool) -> HeartbeatRequest | None:
        b = self.image.brokers.get(broker_id)
        if b is None:
            return None
        return HeartbeatRequest(broker_id, b.epoch, self.applied(), **flags)

    # -- brokers ------------------------------------------------------------------------

    @rule(broker=st.sampled_from(BROKERS), new_incarnation=st.booleans(), clean=st.booleans())
    def register(self, broker: int, new_incarnation: bool, clean: bool) -> None:
        if new_incarnation:
            self.incarnations[broker] += 1
        # A clean restart names its previous broker epoch; an unclean one
        # does not, and leaves every ELR (KIP-966).
        old = self.image.brokers.get(broker)
        req = register_request(
            broker,
            incarnation=f"b{broker}-{self.incarnations[broker]}",
            rack=rack(broker),
            previous_broker_epoch=old.epoch if clean and old is not None else -1,
        )
        c = self.cluster
        result = c.decide(lambda ctl: ctl.register_broker(req, c.now_ms))
        if isinstance(result, ApiError):
            assert result.code is Errors.DUPLICATE_BROKER_REGISTRATION, result
        else:
            assert self.image.brokers[broker].epoch == result.response
            assert self.image.brokers[broker].fenced
            for _, _, p in self.image.partitions():
                assert broker not in p.isr and p.leader != broker
                if not clean or old is None:
                    assert broker not in p.elr, "an unclean restart stays eligible"

    @rule(
        broker=st.sampled_from(BROKERS),
        mode=st.sampled_from(["plain", "plain", "lagging", "fence", "shutdown", "stale"]),
        cuts=CUTS,
    )
    def heartbeat(self, broker: int, mode: str, cuts: list[int]) -> None:
        req = self.heartbeat_request(
            broker, want_fence=mode == "fence", want_shutdown=mode == "shutdown"
        )
        if req is None:
            return
        if mode == "stale":
            req = HeartbeatRequest(broker, req.broker_epoch - 1, req.current_metadata_offset)
        elif mode == "lagging":
            # A broker that has not applied its own registration yet.
            req = HeartbeatRequest(broker, req.broker_epoch, req.broker_epoch - 1)
        c = self.cluster
        before = self.image.brokers[broker]
        result = c.decide(lambda ctl: ctl.heartbeat(req, c.now_ms), cuts)
        if mode == "stale":
            assert isinstance(result, ApiError) and result.code is Errors.STALE_BROKER_EPOCH
            return
        assert not isinstance(result, ApiError), result
        b = self.image.brokers[broker]
        response = result.response
        assert response.is_caught_up == (req.current_metadata_offset >= b.epoch)
        if not response.is_caught_up:
            assert b.fenced or not before.fenced
        assert response.is_fenced == b.fenced
        assert response.in_controlled_shutdown == b.in_controlled_shutdown
        if response.should_shut_down:
            assert b.fenced

    @rule(cuts=CUTS)
    def heartbeat_everyone(self, cuts: list[int]) -> None:
        c = self.cluster
        for broker in self.registered():
            req = self.heartbeat_request(broker)
            assert req is not None
            result = c.decide(partial(Controller.heartbeat, req=req, now_ms=c.now_ms), cuts)
            assert not isinstance(result, ApiError), result

    @rule()
    def settle(self) -> None:
        """Everything commits, every broker heartbeats, that commits too."""
        c = self.cluster
        c.commit_all()
        for broker in self.registered():
            req = self.heartbeat_request(broker)
            assert req is not None
            c.decide(partial(Controller.heartbeat, req=req, now_ms=c.now_ms))
        c.commit_all()

    @rule(ms=st.integers(0, 12_000), limit=st.integers(1, 3), cuts=CUTS)
    def time_passes(self, ms: int, limit: int, cuts: list[int]) -> None:
        c = self.cluster
        c.now_ms += ms
        result = c.decide(lambda ctl: ctl.fence_expired(c.now_ms, limit), cuts)
        assert not isinstance(result, ApiError), result
        for broker in result.response:
            assert self.image.brokers[broker].fenced

    @rule(broker=st.sampled_from(BROKERS), cuts=CUTS)
    def unregister(self, broker: int, cuts: list[int]) -> None:
        result = self.cluster.decide(lambda ctl: ctl.unregister_broker(broker), cuts)
        if isinstance(result, ApiError):
            assert result.code is Errors.BROKER_ID_NOT_REGISTERED
        else:
            assert broker not in self.image.brokers

    @rule(broker=st.sampled_from(BROKERS))
    def allocate_producer_ids(self, broker: int) -> None:
        b = self.image.brokers.get(broker)
        if b is None:
            return
        before = self.image.next_producer_id
        result = self.cluster.decide(lambda ctl: ctl.allocate_producer_ids(broker, b.epoch))
        if isinstance(result, ApiError):
            assert result.code is Errors.BROKER_NOT_AVAILABLE and b.fenced
        else:
            assert result.response == (before, 1000)
            assert self.image.next_producer_id == before + 1000

    # -- topics ------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(TOPICS),
        partitions=st.integers(1, 3),
        rf=st.integers(1, 3),
        unclean=st.sampled_from([None, "true", "false"]),
        min_isr=st.sampled_from([None, "2", "3"]),
    )
    def create_topic(
        self, name: str, partitions: int, rf: int, unclean: str | None, min_isr: str | None
    ) -> None:
        configs = {} if unclean is None else {"unclean.leader.election.enable": unclean}
        if min_isr is not None:
            configs["min.insync.replicas"] = min_isr
        new = NewTopic(name, partitions, rf, configs=configs)
        result = self.cluster.decide(lambda ctl: ctl.create_topics([new]))
        assert not isinstance(result, ApiError), result
        item = result.response[0]
        if item.error is Errors.NONE:
            topic = self.image.topics[item.topic_id]
            assert topic.name == name and len(topic.partitions) == partitions
            for p in topic.partitions:
                assert len(p.replicas) == rf and p.has_leader
        else:
            assert item.error in (
                Errors.TOPIC_ALREADY_EXISTS,
                Errors.INVALID_REPLICATION_FACTOR,
            ), item

    @rule(name=st.sampled_from(TOPICS))
    def delete_topic(self, name: str) -> None:
        result = self.cluster.decide(lambda ctl: ctl.delete_topics([name]))
        assert not isinstance(result, ApiError), result
        assert name not in self.image.topic_ids
        assert (int(ResourceType.TOPIC), name) not in self.image.configs

    @rule(name=st.sampled_from(TOPICS), more=st.integers(1, 2))
    def create_partitions(self, name: str, more: int) -> None:
        topic = self.image.topic_by_name(name)
        total = more + (len(topic.partitions) if topic is not None else 0)
        result = self.cluster.decide(lambda ctl: ctl.create_partitions(name, total))
        if isinstance(result, ApiError):
            assert result.code in (
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                Errors.INVALID_REPLICATION_FACTOR,
            ), result
        else:
            assert len(self.image.topics[result.response.topic_id].partitions) == total

    # -- partitions ----------------------------------------------------------------------

    @rule(
        rnd=RANDOM,
        action=st.sampled_from(["shrink", "expand", "expand", "stale", "newer", "recovered"]),
        epochs=st.sampled_from(["unknown", "right", "wrong"]),
    )
    def alter_partition(self, rnd: random.Random, action: str, epochs: str) -> None:
        led = [(t, i, p) for t, i, p in self.image.partitions() if p.has_leader]
        if not led:
            return
        topic, i, p = rnd.choice(sorted(led, key=lambda x: (x[0].name, x[1])))
        leader = self.image.brokers[p.leader]
        if action == "shrink":
            isr = [p.leader] + [b for b in p.isr if b != p.leader and rnd.random() < 0.5]
        else:
            isr = list(p.isr) + [b for b in p.replicas if b not in p.isr and rnd.random() < 0.7]

        def broker_epoch(b: int) -> int:
            reg = self.image.brokers.get(b)
            if epochs == "unknown" or reg is None:
                return -1
            return reg.epoch if epochs == "right" else reg.epoch + 1

        leader_epoch, partition_epoch = p.leader_epoch, p.partition_epoch
        if action == "stale":
            if rnd.random() < 0.5:
                leader_epoch -= 1
            else:
                partition_epoch -= 1
        elif action == "newer":
            partition_epoch += 1
        item = AlterPartitionItem(
            topic.topic_id,
            i,
            leader_epoch,
            partition_epoch,
            tuple((b, broker_epoch(b)) for b in isr),
            leader_recovered=action == "recovered",
        )
        result = self.cluster.decide(
            lambda ctl: ctl.alter_partition(leader.broker_id, leader.epoch, [item])
        )
        assert not isinstance(result, ApiError), result
        outcome = result.response[0]
        if action in ("stale", "newer"):
            assert outcome.error in (
                Errors.FENCED_LEADER_EPOCH,
                Errors.INVALID_UPDATE_VERSION,
                Errors.UNKNOWN_PARTITION_EPOCH,
            ), outcome
            assert not result.records
        elif outcome.error is Errors.NONE:
            after = self.image.topics[topic.topic_id].partitions[i]
            assert outcome.partition_state == after
            assert after.leader_epoch >= p.leader_epoch
        else:
            assert outcome.error in (
                Errors.INELIGIBLE_REPLICA,
                Errors.INVALID_REQUEST,
            ), outcome

    @rule(
        election=st.sampled_from([Election.PREFERRED, Election.UNCLEAN]),
        everything=st.booleans(),
        rnd=RANDOM,
        cuts=CUTS,
    )
    def elect(
        self, election: Election, everything: bool, rnd: random.Random, cuts: list[int]
    ) -> None:
        wanted = None
        if not everything:
            wanted = [(t.name, i) for t, i, _ in self.image.partitions() if rnd.random() < 0.5]
        result = self.cluster.decide(lambda ctl: ctl.elect_leaders(election, wanted), cuts)
        assert not isinstance(result, ApiError), result

    @rule(cuts=CUTS)
    def rebalance(self, cuts: list[int]) -> None:
        result = self.cluster.decide(lambda ctl: ctl.rebalance_leaders(), cuts)
        assert not isinstance(result, ApiError), result

    @rule(rnd=RANDOM, cancel=st.booleans(), size=st.integers(1, 3), cuts=CUTS)
    def reassign(self, rnd: random.Random, cancel: bool, size: int, cuts: list[int]) -> None:
        parts = sorted(((t.name, i) for t, i, _ in self.image.partitions()))
        if not parts:
            return
        name, i = rnd.choice(parts)
        registered = self.registered()
        target: tuple[int, ...] | None = None
        if not cancel:
            if len(registered) < size:
                return
            target = tuple(rnd.sample(registered, size))
        result = self.cluster.decide(lambda ctl: ctl.alter_reassignments([(name, i, target)]), cuts)
        assert not isinstance(result, ApiError), result
        outcome = result.response[0]
        if cancel:
            # Going back to replicas that are all out of the ISR needs an
            # unclean election, refused when the topic does not allow one.
            assert outcome.error in (
                Errors.NONE,
                Errors.NO_REASSIGNMENT_IN_PROGRESS,
                Errors.INVALID_REPLICA_ASSIGNMENT,
            ), outcome
        else:
            assert outcome.error is Errors.NONE, outcome
        listed = {(n, j) for n, j, _ in self.cluster.controller.list_reassignments()}
        p = self.image.topic_by_name(name).partitions[i]  # type: ignore[union-attr]
        assert ((name, i) in listed) == p.is_reassigning

    @rule(
        where=st.sampled_from(["cluster", *TOPICS]),
        key=st.sampled_from(
            ["unclean.leader.election.enable", "retention.ms", "min.insync.replicas"]
        ),
        value=st.sampled_from([None, "true", "false", "1000"]),
        condition=st.sampled_from(["none", "absent", "current", "wrong"]),
    )
    def alter_configs(self, where: str, key: str, value: str | None, condition: str) -> None:
        if where == "cluster":
            rtype, rname = ResourceType.CLUSTER, ""
            if key == "retention.ms":
                key = "log.retention.ms"
        else:
            rtype, rname = ResourceType.TOPIC, where
        if value in ("true", "false") and key.endswith("retention.ms"):
            value = "1000"
        if value == "1000" and key == "unclean.leader.election.enable":
            value = "true"
        if value is not None and key == "min.insync.replicas":
            value = {"true": "2", "false": "1", "1000": "3"}[value]
        current = self.image.config((int(rtype), rname)).get(key)
        op = AlterConfigOp(key, value)
        if condition == "absent":
            op = AlterConfigOp(key, value, expect_absent=True)
        elif condition == "current" and current is not None:
            op = AlterConfigOp(key, value, expected=current)
        elif condition == "wrong":
            op = AlterConfigOp(key, value, expected="no such value")
        before = self.image.configs
        result = self.cluster.decide(lambda ctl: ctl.alter_configs([(rtype, rname, [op])]))
        assert not isinstance(result, ApiError), result
        outcome = result.response[0]
        if outcome.error is Errors.NONE:
            assert self.image.config((int(rtype), rname)).get(key) == value
        else:
            assert self.image.configs == before
            assert outcome.error in (
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                Errors.CONFIG_PRECONDITION_FAILED,
            ), outcome

    # -- the log ---------------------------------------------------------------------------

    @rule(keys=st.lists(st.sampled_from("abc"), min_size=1, max_size=3))
    def key_value_write(self, keys: list[str]) -> None:
        self.cluster.write_key_value([encode_put(k, b"v") for k in keys])

    @rule(writes=st.integers(0, 8), merge=st.lists(st.booleans(), max_size=8))
    def commit(self, writes: int, merge: list[bool]) -> None:
        self.cluster.commit(writes, merge)

    @rule(merge=st.lists(st.booleans(), max_size=8))
    def commit_everything(self, merge: list[bool]) -> None:
        self.cluster.commit(len(self.cluster.uncommitted), merge)

    @rule()
    def failover(self) -> None:
        self.cluster.failover()

    @rule()
    def snapshot(self) -> None:
        self.cluster.take_snapshot()

    @precondition(lambda self: bool(self.cluster.snapshots))
    @rule(which=st.integers(0, 10))
    def restart_standby(self, which: int) -> None:
        self.cluster.restart_standby(which)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def images_are_sound(self) -> None:
        self.cluster.check()


ControllerModel.TestCase.settings = settings(
    max_examples=max(150, settings().max_examples * 3 // 10),
    stateful_step_count=50,
    deadline=None,
)
TestControllerModel = ControllerModel.TestCase

"""Shared helpers of the controller tests.

- :class:`Harness`: an active controller whose every decision is written
  and replayed at once, as if it committed immediately (decide, then
  replay); the written batches are kept so that a state machine can replay
  them too.
- :class:`SimulatedCluster`: a controller against a simulated log.  Records
  are appended to an uncommitted tail and committed in prefixes, in batches
  that may merge several writes (as the quorum node does), into a committed
  :class:`ControllerStateMachine` and a standby one.  A failover drops the
  uncommitted tail and a new controller activates from the committed image.
- :func:`image_violations`: the invariants every image must keep.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from metadata.configs import ResourceType
from metadata.controller import (
    AlterConfigOp,
    AlterPartitionItem,
    Controller,
    ControllerOptions,
    ControllerResult,
    HeartbeatRequest,
    HeartbeatResponse,
    ItemResult,
    NewTopic,
    RegisterRequest,
)
from metadata.errors import ApiError, Errors
from metadata.image import EMPTY_IMAGE, MetadataImage, PartitionRegistration, TopicImage
from metadata.records import (
    Endpoint,
    FeatureRange,
    Record,
    RegisterBrokerRecord,
    decode_record,
    encode_record,
    is_metadata_record,
)
from metadata.state_machine import ControllerStateMachine
from quorum.types import Batch, BatchKind, SnapshotId

__all__ = [
    "CLUSTER_ID",
    "FEATURES",
    "Harness",
    "SimulatedCluster",
    "endpoints",
    "image_violations",
    "register_request",
    "replay_batches",
]

T = TypeVar("T")

CLUSTER_ID = "kq-test-cluster"
# What every test broker supports: this build's metadata.version.
FEATURES = (FeatureRange("metadata.version", 1, 1),)


def endpoints(broker_id: int) -> tuple[Endpoint, ...]:
    return (Endpoint("PLAINTEXT", f"broker-{broker_id}.test", 9092),)


def register_request(
    broker_id: int,
    *,
    incarnation: str | None = None,
    rack: str | None = None,
    cluster_id: str = CLUSTER_ID,
    features: tuple[FeatureRange, ...] = FEATURES,
    previous_broker_epoch: int = -1,
) -> RegisterRequest:
    return RegisterRequest(
        broker_id,
        cluster_id,
        incarnation if incarnation is not None else f"incarnation-{broker_id}",
        endpoints(broker_id),
        rack,
        features,
        previous_broker_epoch,
    )


def encode_batch(base_offset: int, epoch: int, records: Sequence[Record]) -> Batch:
    return Batch(base_offset, epoch, tuple(encode_record(r) for r in records))


def replay_batches(batches: Iterable[Batch]) -> ControllerStateMachine:
    sm = ControllerStateMachine()
    for batch in batches:
        sm.handle_commit(batch)
    return sm


def ok(results: Sequence[ItemResult]) -> None:
    bad = [r for r in results if r.error is not Errors.NONE]
    assert not bad, bad


# -- everything commits at once -------------------------------------------------


class Harness:
    """An active controller whose decisions are replayed as soon as they are
    made.  ``batches`` holds everything written, one batch per decision."""

    def __init__(
        self,
        seed: int = 0,
        session_timeout_ms: int = 9_000,
        epoch: int = 1,
        use_last_known_leader: bool = True,
    ) -> None:
        options = ControllerOptions(
            CLUSTER_ID,
            session_timeout_ms=session_timeout_ms,
            use_last_known_leader=use_last_known_leader,
        )
        self.controller = Controller(options, random.Random(seed))
        self.now_ms = 0
        self.epoch = epoch
        self.offset = 0
        self.batches: list[Batch] = []
        self.write(self.controller.activate(EMPTY_IMAGE, self.now_ms))

    @property
    def image(self) -> MetadataImage:
        return self.controller.image

    def write(self, records: Sequence[Record]) -> None:
        if not records:
            return
        self.controller.replay(records, self.offset, self.epoch)
        self.batches.append(encode_batch(self.offset, self.epoch, records))
        self.offset += len(records)

    def decide(self, decide: Callable[[Controller], ControllerResult[T]]) -> ControllerResult[T]:
        """A decision, not written."""
        self.controller.next_offset = self.offset
        return decide(self.controller)

    def run(self, decide: Callable[[Controller], ControllerResult[T]]) -> ControllerResult[T]:
        """A decision, written and replayed."""
        result = self.decide(decide)
        self.write(result.records)
        return result

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    def state_machine(self) -> ControllerStateMachine:
        """A state machine that committed everything written."""
        return replay_batches(self.batches)

    # -- brokers ------------------------------------------------------------------

    def register(
        self,
        broker_id: int,
        *,
        incarnation: str | None = None,
        rack: str | None = None,
        previous_broker_epoch: int = -1,
    ) -> int:
        """A registration; ``previous_broker_epoch`` -1 (the default) is a
        restart after an unclean shutdown (KIP-966)."""
        req = register_request(
            broker_id,
            incarnation=incarnation,
            rack=rack,
            previous_broker_epoch=previous_broker_epoch,
        )
        return self.run(lambda c: c.register_broker(req, self.now_ms)).response

    def heartbeat(
        self,
        broker_id: int,
        *,
        offset: int | None = None,
        epoch: int | None = None,
        want_fence: bool = False,
        want_shutdown: bool = False,
    ) -> HeartbeatResponse:
        """A heartbeat; by default with the broker's epoch, caught up to
        everything written."""
        if epoch is None:
            epoch = self.image.brokers[broker_id].epoch
        req = HeartbeatRequest(
            broker_id,
            epoch,
            self.offset - 1 if offset is None else offset,
            want_fence=want_fence,
            want_shutdown=want_shutdown,
        )
        return self.run(lambda c: c.heartbeat(req, self.now_ms)).response

    def add_broker(self, broker_id: int, *, rack: str | None = None, unfence: bool = True) -> int:
        epoch = self.register(broker_id, rack=rack)
        if unfence:
            assert not self.heartbeat(broker_id).is_fenced
        return epoch

    def add_brokers(self, *ids: int, racks: Sequence[str | None] | None = None) -> None:
        for i, broker_id in enumerate(ids):
            self.add_broker(broker_id, rack=None if racks is None else racks[i])

    def fence(self, broker_id: int) -> None:
        self.heartbeat(broker_id, want_fence=True)

    # -- topics -------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        rf: int = 1,
        *,
        configs: dict[str, str] | None = None,
        assignments: dict[int, tuple[int, ...]] | None = None,
    ) -> TopicImage:
        if assignments:
            new = NewTopic(name, assignments=assignments, configs=configs or {})
        else:
            new = NewTopic(name, partitions, rf, configs=configs or {})
        result = self.run(lambda c: c.create_topics([new]))
        ok(result.response)
        return self.image.topics[result.response[0].topic_id]

    def topic(self, name: str) -> TopicImage:
        topic = self.image.topic_by_name(name)
        assert topic is not None, name
        return topic

    def partition(self, name: str, partition: int = 0) -> PartitionRegistration:
        found = self.topic(name).partition(partition)
        assert found is not None
        return found

    def alter_item(
        self,
        name: str,
        partition: int,
        isr: Sequence[int],
        *,
        leader_epoch: int | None = None,
        partition_epoch: int | None = None,
        broker_epochs: dict[int, int] | None = None,
        recovered: bool = False,
    ) -> AlterPartitionItem:
        """An AlterPartition item for ``isr``, with the partition's current
        epochs unless given and every member's broker epoch -1 unless given."""
        p = self.partition(name, partition)
        epochs = broker_epochs or {}
        return AlterPartitionItem(
            self.topic(name).topic_id,
            partition,
            p.leader_epoch if leader_epoch is None else leader_epoch,
            p.partition_epoch if partition_epoch is None else partition_epoch,
            tuple((b, epochs.get(b, -1)) for b in isr),
            leader_recovered=recovered,
        )

    def alter_partition(
        self,
        name: str,
        partition: int,
        isr: Sequence[int],
        *,
        leader_epoch: int | None = None,
        partition_epoch: int | None = None,
        broker_epochs: dict[int, int] | None = None,
        recovered: bool = False,
    ) -> ItemResult:
        """The leader asks for ``isr``; one item, its result."""
        leader = self.partition(name, partition).leader
        item = self.alter_item(
            name,
            partition,
            isr,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            broker_epochs=broker_epochs,
            recovered=recovered,
        )
        broker_epoch = self.image.brokers[leader].epoch
        result = self.run(lambda c: c.alter_partition(leader, broker_epoch, [item]))
        return result.response[0]

    def set_config(
        self, rtype: ResourceType, name: str, key: str, value: str | None
    ) -> list[ItemResult]:
        ops = [AlterConfigOp(key, value)]
        return self.run(lambda c: c.alter_configs([(rtype, name, ops)])).response


# -- the invariants ------------------------------------------------------------------


def image_violations(image: MetadataImage) -> list[str]:
    """What is wrong with ``image`` (nothing, for a good one)."""
    out: list[str] = []
    if len(image.topic_ids) != len(image.topics):
        out.append(f"{len(image.topic_ids)} topic names but {len(image.topics)} topic ids")
    for name, topic_id in image.topic_ids.items():
        topic = image.topics.get(topic_id)
        if topic is None or topic.name != name:
            out.append(f"topic name {name} maps to {topic_id}, which is {topic}")
    for topic_id, topic in image.topics.items():
        if topic.topic_id != topic_id or image.topic_ids.get(topic.name) != topic_id:
            out.append(f"topic {topic.name} is filed under id {topic_id}, not {topic.topic_id}")
        for i, p in enumerate(topic.partitions):
            where = f"{topic.name}-{i} {p}"
            replicas, isr = set(p.replicas), set(p.isr)
            if len(replicas) != len(p.replicas) or len(isr) != len(p.isr):
                out.append(f"{where}: a broker twice in the replicas or the ISR")
            if not isr <= replicas:
                out.append(f"{where}: the ISR is not a subset of the replicas")
            if not set(p.adding_replicas) <= replicas or not set(p.removing_replicas) <= replicas:
                out.append(f"{where}: adding or removing replicas outside the replicas")
            if set(p.adding_replicas) & set(p.removing_replicas):
                out.append(f"{where}: a replica both added and removed")
            if p.has_leader:
                leader = image.brokers.get(p.leader)
                if leader is None or leader.fenced:
                    out.append(f"{where}: the leader is not a registered unfenced broker")
                if p.leader not in isr:
                    out.append(f"{where}: the leader is not in the ISR")
            # KIP-966: the ISR may be empty (its last members are the ELR).
            elr, last_known = set(p.elr), set(p.last_known_elr)
            if len(elr) != len(p.elr) or len(last_known) != len(p.last_known_elr):
                out.append(f"{where}: a broker twice in the ELR or the last-known ELR")
            if not elr <= replicas or not last_known <= replicas:
                out.append(f"{where}: the ELR or last-known ELR is not a subset of the replicas")
            # The last-known ELR never overlaps the ISR; it may hold an ELR
            # member only as the last known leader, its one member (the
            # leader fenced last joins the ELR too: Kafka's
            # testEligibleLeaderReplicas_IsrCanShrinkToZero).
            if elr & isr or last_known & isr or (len(last_known) > 1 and last_known & elr):
                out.append(f"{where}: the ISR, ELR and last-known ELR overlap")
            if p.has_leader or len(p.isr) > 1:
                for b in p.isr:
                    reg = image.brokers.get(b)
                    if reg is None or reg.fenced:
                        out.append(f"{where}: ISR member {b} is not a registered unfenced broker")
    return out


def check_image(image: MetadataImage, what: str) -> None:
    violations = image_violations(image)
    assert not violations, f"{what}:\n  " + "\n  ".join(violations)


Epochs = dict[tuple[str, int], tuple[int, int]]


def partition_epochs(image: MetadataImage) -> Epochs:
    return {
        (topic.topic_id, i): (p.leader_epoch, p.partition_epoch)
        for topic, i, p in image.partitions()
    }


def check_epochs_grow(before: Epochs, after: Epochs, what: str) -> None:
    for key, (leader_epoch, partition_epoch) in after.items():
        old = before.get(key)
        if old is None:
            continue
        assert leader_epoch >= old[0], (
            f"{what}: leader epoch of {key} went {old[0]} -> {leader_epoch}"
        )
        assert partition_epoch >= old[1], (
            f"{what}: partition epoch of {key} went {old[1]} -> {partition_epoch}"
        )


# -- a simulated log ------------------------------------------------------------------


@dataclass(slots=True)
class _Write:
    """Records written together: they land in one batch (a write may share
    its batch with others).  ``metadata`` is False for key-value records
    written by others on the same log."""

    base_offset: int
    epoch: int
    raw: tuple[bytes, ...]
    metadata: bool = True


class SimulatedCluster:
    """An active controller on a simulated log, a committed state machine,
    a standby replaying the same batches, and failovers."""

    def __init__(self, seed: int, session_timeout_ms: int = 9_000) -> None:
        self.seed = seed
        self.options = ControllerOptions(CLUSTER_ID, session_timeout_ms=session_timeout_ms)
        self.committed = ControllerStateMachine()
        self.standby = ControllerStateMachine()
        self.batches: list[Batch] = []
        self.snapshots: list[tuple[SnapshotId, bytes]] = []
        self.uncommitted: list[_Write] = []
        self.epoch = 0
        self.now_ms = 0
        self.controller = Controller(self.options, random.Random(seed))
        # The highest epochs seen of every partition, committed and
        # speculative (the latter reset at failover).
        self.committed_epochs: Epochs = {}
        self.speculative_epochs: Epochs = {}
        # Offset -> every RegisterBrokerRecord committed.
        self.registrations: dict[int, RegisterBrokerRecord] = {}
        self.failover()

    # -- the log --------------------------------------------------------------------

    @property
    def log_end(self) -> int:
        if self.uncommitted:
            last = self.uncommitted[-1]
            return last.base_offset + len(last.raw)
        return self.committed.applied_offset

    def _commit_batch(self, batch: Batch) -> None:
        self.committed.handle_commit(batch)
        self.standby.handle_commit(batch)
        self.batches.append(batch)
        for i, raw in enumerate(batch.records):
            if batch.kind is BatchKind.DATA and is_metadata_record(raw):
                record = decode_record(raw)
                if isinstance(record, RegisterBrokerRecord):
                    self.registrations[batch.base_offset + i] = record

    def write(self, records: Sequence[Record], atomic: bool, cuts: Sequence[int] = ()) -> None:
        """Append ``records``; a write that need not be atomic is cut before
        the given indexes (the node splits writes too large for one batch)."""
        if not records:
            return
        bounds = [0, len(records)]
        if not atomic:
            bounds[1:1] = sorted({c for c in cuts if 0 < c < len(records)})
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            chunk = list(records[lo:hi])
            base = self.log_end
            self.controller.replay(chunk, base, self.epoch)
            raw = tuple(encode_record(r) for r in chunk)
            self.uncommitted.append(_Write(base, self.epoch, raw))

    def write_key_value(self, raw: Sequence[bytes]) -> None:
        """Key-value records of another client of the log: they take
        offsets but are no metadata."""
        self.uncommitted.append(_Write(self.log_end, self.epoch, tuple(raw), metadata=False))

    def decide(
        self,
        decide: Callable[[Controller], ControllerResult[T]],
        cuts: Sequence[int] = (),
    ) -> ControllerResult[T] | ApiError:
        """Decide on the speculative image and write the records; a refusal
        is returned, not raised."""
        self.controller.next_offset = self.log_end
        try:
            result = decide(self.controller)
        except ApiError as exc:
            return exc
        self.write(result.records, result.atomic, cuts)
        return result

    def commit(self, writes: int, merge: Sequence[bool] = ()) -> None:
        """Commit the first ``writes`` uncommitted writes; write ``i + 1``
        shares write ``i``'s batch when ``merge[i]``."""
        taken, self.uncommitted = self.uncommitted[:writes], self.uncommitted[writes:]
        group: list[_Write] = []
        for i, w in enumerate(taken):
            if group and not (i - 1 < len(merge) and merge[i - 1]):
                self._commit_group(group)
                group = []
            group.append(w)
        if group:
            self._commit_group(group)
        if taken:
            epochs = partition_epochs(self.committed.image)
            check_epochs_grow(self.committed_epochs, epochs, "committed image")
            self.committed_epochs.update(epochs)
        if not self.uncommitted and taken:
            # Everything written has committed: the speculative image is
            # the committed one (the driver then takes the committed one).
            self.check_caught_up()
            self.controller.reset(self.committed.image)

    def check_caught_up(self) -> None:
        """With nothing uncommitted, the speculative image is the committed
        one (at the same offset, unless key-value records came last)."""
        assert not self.uncommitted
        speculative, committed = self.controller.image, self.committed.image
        last = self.batches[-1]
        if last.kind is BatchKind.DATA and is_metadata_record(last.records[-1]):
            assert speculative == committed, (
                "the speculative image differs from the committed one after everything committed"
            )
        else:
            assert speculative.with_provenance(committed.offset, committed.epoch) == committed, (
                "the speculative image differs from the committed one after everything committed"
            )

    def _commit_group(self, group: list[_Write]) -> None:
        raw = tuple(r for w in group for r in w.raw)
        self._commit_batch(Batch(group[0].base_offset, group[0].epoch, raw))

    def failover(self) -> None:
        """The active controller is lost with everything uncommitted; the
        next leader's LeaderChange batch commits and its controller takes
        over from the committed image."""
        self.uncommitted.clear()
        self.epoch += 1
        self._commit_batch(
            Batch(
                self.committed.applied_offset,
                self.epoch,
                (b"leader-change",),
                BatchKind.LEADER_CHANGE,
            )
        )
        assert self.committed.last_leader_change_epoch == self.epoch
        self.controller = Controller(self.options, random.Random(self.seed * 1_000 + self.epoch))
        self.controller.next_offset = self.log_end
        self.write(self.controller.activate(self.committed.image, self.now_ms), atomic=True)
        self.speculative_epochs = dict(self.committed_epochs)

    def take_snapshot(self) -> None:
        sm = self.committed
        snapshot_id = SnapshotId(sm.applied_offset, sm.image.epoch)
        self.snapshots.append((snapshot_id, sm.capture_snapshot()()))

    def restart_standby(self, which: int) -> None:
        """The standby restarts from one of the snapshots taken (or from an
        empty log when there is none) and replays the batches after it."""
        sm = ControllerStateMachine()
        start = 0
        if self.snapshots:
            snapshot_id, data = self.snapshots[which % len(self.snapshots)]
            sm.handle_load_snapshot(snapshot_id, data)
            start = snapshot_id.end_offset
        for batch in self.batches:
            if batch.base_offset >= start:
                sm.handle_commit(batch)
        self.standby = sm

    # -- checks ------------------------------------------------------------------------

    def check(self) -> None:
        check_image(self.controller.image, "speculative image")
        check_image(self.committed.image, "committed image")
        epochs = partition_epochs(self.controller.image)
        check_epochs_grow(self.speculative_epochs, epochs, "speculative image")
        self.speculative_epochs.update(epochs)
        assert self.standby.image == self.committed.image, "the standby's image differs"
        assert self.standby.applied_offset == self.committed.applied_offset
        sm = self.committed
        snapshot_id = SnapshotId(sm.applied_offset, sm.image.epoch)
        loaded = ControllerStateMachine()
        loaded.handle_load_snapshot(snapshot_id, sm.capture_snapshot()())
        assert loaded.image == sm.image, "a snapshot does not load as the image it holds"
        assert loaded.applied_offset == sm.applied_offset
        # A broker's epoch is the offset of its RegisterBrokerRecord.
        for broker in sm.image.brokers.values():
            record = self.registrations.get(broker.epoch)
            assert record is not None and record.broker_id == broker.broker_id, (
                f"broker {broker.broker_id}'s epoch {broker.epoch} is not the offset of its "
                f"registration ({record})"
            )
            assert record.incarnation_id == broker.incarnation_id

    def commit_all(self) -> None:
        self.commit(len(self.uncommitted))
        self.check_caught_up()

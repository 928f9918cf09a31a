"""A seeded simulation of the group coordinator's runtime over three
in-memory brokers: clients commit offsets and heartbeat while followers
fetch or not, leadership of the offsets partitions moves, a broker loses
power (its unsynced bytes) and restarts, every broker restarts cleanly, and
the offsets partitions are compacted.

Every commit answered OK is recorded; after each event the current
coordinator of each offsets partition is checked: its OffsetFetch shows,
for every acknowledged commit, an offset at least the last acknowledged
one and one that some client committed (KAFKA-20634, Redpanda's
CORE-16998/17000/17001), and its groups equal the groups rebuilt from the
leader's log below the high watermark.

Time is the simulation's clock (``now``); everything runs on one asyncio
loop, moved on by ``asyncio.sleep(0)`` turns. The durability the checks
rely on is Kafka's: leaders come from the ISR, at most one broker is down
at a time, and a broker that lost power leaves the ISR until its leader
takes it back (``Partition.maybeExpandIsr``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from broker.errors import Errors
from broker.group import codec
from broker.group.api import (
    CommitPartition,
    HeartbeatResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
)
from broker.group.placement import OFFSETS_TOPIC, partition_for
from broker.group.state import Groups
from broker.group_coordinator import (
    CoordinatorFailure,
    GroupCoordinator,
    OffsetsTopicSettings,
    ShardState,
)
from broker.log_manager import LogManager
from broker.purgatory import Purgatory
from broker.replica.types import AlterPartitionRequest
from broker.replica_manager import ReplicaManager
from metadata.configs import ResourceType
from metadata.image import TopicIdPartition
from metadata.records import ConfigRecord
from metadata.records import Record as MetadataRecord
from partition_log import BatchHeader, decode_records
from partition_log.batch import split_batches
from partition_log.log import PartitionLog
from tests.broker.group.harness import Client, dump
from tests.broker.images import EPOCHS, change, topic, topic_config
from tests.broker.test_replica_manager import Cluster

__all__ = ["TOPIC_ID", "GroupSim", "Key", "turns"]

TOPIC_ID = "id-offsets"
# Groups committing outside membership (member epoch -1 on an empty group).
EMPTY_GROUPS = ("g0", "g1", "g2", "g3")
# Groups whose members join by heartbeats and commit with their epoch.
MEMBER_GROUPS = ("m0", "m1")
# The topic the clients commit offsets of (it need not exist).
DATA_TOPIC = "t"
DATA_PARTITIONS = 3

Key = tuple[str, str, int]


async def turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@dataclass(eq=False)
class _Pending:
    """A request sent to a coordinator, its answer not yet seen."""

    task: asyncio.Task[Any]
    broker: int
    # What an OK answer acknowledges (a commit), or the client it answers
    # (a heartbeat).
    commits: tuple[Key, ...] = ()
    offsets: tuple[int, ...] = ()
    client: Client | None = None


@dataclass
class _Stats:
    events: dict[str, int] = field(default_factory=dict)
    acked: int = 0
    refused: int = 0
    checks: int = 0
    cleanings: int = 0
    # Offsets a power loss took from a broker's logs (its unsynced tails).
    lost_on_crash: int = 0

    def count(self, name: str) -> None:
        self.events[name] = self.events.get(name, 0) + 1


class GroupSim(Cluster):
    """Brokers 1-3 (:class:`Cluster`), each with a :class:`GroupCoordinator`,
    over an offsets topic of ``partitions`` partitions, RF 3,
    min.insync.replicas 2, compacted, in small segments (so its cleaner has
    something to clean)."""

    def __init__(
        self, seed: int, partitions: int = 1, *, power_loss: bool = True, compaction: bool = False
    ) -> None:
        super().__init__()
        self.seed = seed
        self.power_loss = power_loss
        self.compaction = compaction
        self.rng = random.Random(seed)
        self.partitions = partitions
        self.purgatories: dict[int, Purgatory] = {}
        self.coordinators: dict[int, GroupCoordinator] = {}
        self.pending: list[_Pending] = []
        # Every commit answered OK: the highest offset per key.
        self.acked: dict[Key, int] = {}
        # Every offset some client sent per key (answered or not).
        self.issued: dict[Key, set[int]] = {}
        self.next_offset: dict[Key, int] = {}
        self.clients = [Client(g, (DATA_TOPIC,)) for g in MEMBER_GROUPS for _ in range(2)]
        self.stats = _Stats()
        self.trace: list[str] = []
        self._ends_before_crash: dict[TopicIdPartition, int] = {}
        for b in self.brokers:
            self._start_coordinator(b)
        replica_sets = [tuple((b + i) % 3 + 1 for b in range(3)) for i in range(partitions)]
        self.step_and_publish(
            *topic(OFFSETS_TOPIC, TOPIC_ID, *replica_sets),
            topic_config(OFFSETS_TOPIC, "cleanup.policy", "compact"),
            topic_config(OFFSETS_TOPIC, "min.insync.replicas", "2"),
            topic_config(OFFSETS_TOPIC, "segment.bytes", "1024"),
            topic_config(OFFSETS_TOPIC, "min.cleanable.dirty.ratio", "0.01"),
            # A follower that stopped fetching stops holding the HW back
            # after ten rounds (Partition.maybeIncrementLeaderHW counts the
            # replicas caught up within replica.lag.time.max.ms).
            ConfigRecord(int(ResourceType.CLUSTER), "", "replica.lag.time.max.ms", "1000"),
        )

    # -- the cluster --------------------------------------------------------------------

    def key(self, partition: int) -> TopicIdPartition:
        return TopicIdPartition(TOPIC_ID, partition)

    def _start_coordinator(self, b: int) -> None:
        self.purgatories[b] = Purgatory()
        self.coordinators[b] = GroupCoordinator(
            b,
            self.brokers[b],
            self.purgatories[b],
            # No timeout and no ticker fire within a run: time is ours.
            topic=OffsetsTopicSettings(
                partitions=self.partitions, commit_timeout_ms=3_600_000, tick_interval_ms=10**9
            ),
            now_ms=lambda: self.now,
            rng=random.Random(self.rng.random()),
        )

    def step_and_publish(self, *records: MetadataRecord) -> None:
        self.step(*records)
        for b, coordinator in self.coordinators.items():
            coordinator.on_image(self.brokers[b].image)
            self.purgatories[b].wake_all()

    def fetch_round(
        self, fetch_probability: float = 1.0, followers: tuple[int, ...] = (1, 2, 3)
    ) -> None:
        """Each live follower fetches once from its live leader, with
        ``fetch_probability``; the ISR expansions leaders ask for are
        committed by the controller. A round is 100 ms."""
        self.now += 100
        expansions: list[tuple[TopicIdPartition, AlterPartitionRequest]] = []
        for b, manager in list(self.brokers.items()):
            if b not in followers:
                continue
            for leader, requests in manager.next_fetch_requests(EPOCHS[b]).items():
                if leader not in self.brokers or self.rng.random() >= fetch_probability:
                    continue
                for key, request in requests.items():
                    outcome = self.brokers[leader].step_fetch(key, request, self.now)
                    manager.step_fetch_answer(key, request, outcome.answer, self.now)
                    if outcome.alter_partition is not None:
                        expansions.append((key, outcome.alter_partition))
        for purgatory in self.purgatories.values():
            purgatory.wake_all()
        for key, expansion in expansions:
            registration = self.md.image.partition(key.topic_id, key.partition)
            if (
                registration is not None
                and registration.leader == expansion.leader_id
                and registration.partition_epoch == expansion.partition_epoch
            ):
                self.step_and_publish(change(TOPIC_ID, key.partition, isr=expansion.isr))

    def registration(self, partition: int) -> Any:
        found = self.md.image.partition(TOPIC_ID, partition)
        assert found is not None
        return found

    def move_leader(
        self, partition: int, leader: int | None = None, isr: tuple[int, ...] | None = None
    ) -> bool:
        """Elect another live ISR member (``leader`` if given), maybe with a
        smaller ISR; False if there is none."""
        current = self.registration(partition)
        candidates = [b for b in current.isr if b in self.brokers and b != current.leader]
        if leader is None:
            if not candidates:
                return False
            leader = self.rng.choice(candidates)
        if isr is None:
            isr = tuple(current.isr)
            others = [b for b in isr if b != leader]
            if len(isr) > 2 and self.rng.random() < 0.3:
                dropped = self.rng.choice(others)
                isr = tuple(b for b in isr if b != dropped)
        self.step_and_publish(change(TOPIC_ID, partition, leader=leader, isr=tuple(sorted(isr))))
        return True

    def can_crash(self, b: int) -> bool:
        """At most one broker down, and never the last ISR member of a
        partition (its loss would be Kafka's too)."""
        if len(self.brokers) < 3:
            return False
        return all(tuple(self.registration(p).isr) != (b,) for p in range(self.partitions))

    async def crash(self, b: int) -> None:
        """A power loss: the broker's unsynced bytes are gone, the
        controller takes it out of the ISRs and elects another leader
        where it led."""
        coordinator = self.coordinators.pop(b)
        manager = self.brokers.pop(b)
        self._ends_before_crash = {
            key: replica.log.log_end_offset for key, replica in manager.replicas.items()
        }
        self.purgatories.pop(b)
        # Its waiting answers are never sent; stop() fails them, and a
        # failure is no acknowledgement.
        await coordinator.stop()
        self.dirs[b].crash(self.rng)
        records: list[MetadataRecord] = []
        for p in range(self.partitions):
            current = self.registration(p)
            isr = tuple(x for x in current.isr if x != b)
            if current.leader == b:
                records.append(change(TOPIC_ID, p, leader=self.rng.choice(isr), isr=isr))
            elif b in current.isr:
                records.append(change(TOPIC_ID, p, isr=isr))
        self.step_and_publish(*records)

    def restart(self, b: int) -> None:
        """A broker starts again over its directory (``LogManager.load``)."""
        logs = LogManager([self.dirs[b]])
        logs.load(self.md.image, b, now_ms=self.now)
        manager = self.brokers[b] = ReplicaManager(b, logs)
        manager.apply_delta(self.md.image, self.now)
        for key, end in self._ends_before_crash.items():
            if key in manager.replicas:
                self.stats.lost_on_crash += max(0, end - manager.replicas[key].log.log_end_offset)
        self._ends_before_crash = {}
        self._start_coordinator(b)
        self.coordinators[b].on_image(manager.image)

    async def restart_all(self) -> None:
        """Every broker shuts down cleanly and starts again."""
        for b in sorted(self.brokers):
            await self.coordinators.pop(b).stop()
            self.brokers[b].shutdown()
        await turns()
        for b in (1, 2, 3):
            self.restart(b)

    def in_sync(self) -> bool:
        """Every broker up with every offsets partition's log to its
        leader's end."""
        if len(self.brokers) < 3:
            return False
        for p in range(self.partitions):
            ends = {m.replicas[self.key(p)].log.log_end_offset for m in self.brokers.values()}
            if len(ends) != 1:
                return False
        return True

    def compact(self, brokers: tuple[int, ...] | None = None) -> int:
        """One cleaning of the offsets partitions' logs on ``brokers`` (the
        live ones by default); how many cleanings happened."""
        cleaned = 0
        for b in sorted(self.brokers) if brokers is None else brokers:
            if b in self.brokers:
                cleaned += self.brokers[b].logs.cleaner.maybe_clean(self.now)
        self.stats.cleanings += cleaned
        return cleaned

    # -- the clients ----------------------------------------------------------------------

    def coordinator_of(self, group_id: str) -> int | None:
        leader = self.registration(partition_for(group_id, self.partitions)).leader
        return leader if leader in self.brokers else None

    def commit(
        self,
        group_id: str,
        partition: int = 0,
        offset: int | None = None,
        broker: int | None = None,
        client: Client | None = None,
    ) -> _Pending | None:
        """Send one commit (the next offset of its key unless given) to the
        group's coordinator (or ``broker``)."""
        broker = self.coordinator_of(group_id) if broker is None else broker
        if broker is None or broker not in self.coordinators:
            return None
        key: Key = (group_id, DATA_TOPIC, partition)
        if offset is None:
            offset = self.next_offset.get(key, 0) + self.rng.randint(1, 3)
        self.next_offset[key] = max(self.next_offset.get(key, 0), offset)
        self.issued.setdefault(key, set()).add(offset)
        member_id, epoch = ("", -1) if client is None else (client.member_id, client.epoch)
        request = OffsetCommitRequest(
            group_id, member_id, epoch, (CommitPartition(DATA_TOPIC, partition, offset),)
        )
        task = asyncio.get_running_loop().create_task(
            self.coordinators[broker].commit_offsets(request)
        )
        pending = _Pending(task, broker, (key,), (offset,))
        self.pending.append(pending)
        return pending

    def heartbeat(self, client: Client) -> None:
        broker = self.coordinator_of(client.group_id)
        if broker is None or any(p.client is client for p in self.pending):
            return
        task = asyncio.get_running_loop().create_task(
            self.coordinators[broker].heartbeat(client.request())
        )
        self.pending.append(_Pending(task, broker, client=client))

    def harvest(self, probability: float = 1.0) -> None:
        """Read the answers that came (each with ``probability``: an answer
        may be seen later)."""
        still = []
        for pending in self.pending:
            if not pending.task.done() or self.rng.random() >= probability:
                still.append(pending)
                continue
            try:
                answer = pending.task.result()
            except CoordinatorFailure as failure:
                self.stats.refused += 1
                self.stats.count(f"refused {failure.code.name}")
                continue
            except asyncio.CancelledError:
                continue
            if isinstance(answer, OffsetCommitResponse):
                if answer.error is not Errors.NONE:
                    self.stats.refused += 1
                    self.stats.count(f"refused {answer.error.name}")
                    continue
                for key, offset, result in zip(
                    pending.commits, pending.offsets, answer.partitions, strict=True
                ):
                    if result.error is Errors.NONE:
                        self.acked[key] = max(self.acked.get(key, -1), offset)
                        self.stats.acked += 1
                    else:
                        self.stats.refused += 1
            elif isinstance(answer, HeartbeatResponse):
                assert pending.client is not None
                if answer.error in (
                    Errors.NONE,
                    Errors.FENCED_MEMBER_EPOCH,
                    Errors.UNKNOWN_MEMBER_ID,
                ):
                    pending.client.step_response(answer)
        self.pending = still

    # -- the checks -----------------------------------------------------------------------

    def fail(self, why: str) -> AssertionError:
        recent = "; ".join(self.trace[-12:])
        return AssertionError(f"seed {self.seed}: {why} (last events: {recent})")

    def loaded(self, partition: int) -> tuple[GroupCoordinator, Any] | None:
        """The current coordinator of ``partition`` and its shard's context,
        if it is loaded and has no write waiting for the HW."""
        leader = self.registration(partition).leader
        coordinator = self.coordinators.get(leader)
        if (
            coordinator is None
            or coordinator.shard_states().get(partition) is not ShardState.ACTIVE
        ):
            return None
        context = coordinator._contexts[partition]
        log = self.brokers[leader].logs.log(self.key(partition))
        assert log is not None
        if context.last_written > log.high_watermark:
            return None
        return coordinator, context

    def rebuilt(self, log: PartitionLog) -> Groups:
        """The groups of the records below the HW of ``log``."""
        groups = Groups()
        end = log.high_watermark
        offset = log.log_start_offset
        while offset < end:
            data = log.read(offset, 1 << 20, end)
            if not data:
                break
            for batch in split_batches(data):
                header = BatchHeader.parse(batch)
                if not header.is_control:
                    for record in decode_records(batch):
                        if offset <= record.offset < end:
                            assert record.key is not None
                            groups.replay(
                                codec.decode(record.key, record.value), offset=record.offset
                            )
                offset = max(offset, header.next_offset)
        return groups

    async def check(self) -> int:
        """The invariants on every loaded coordinator; how many partitions
        were checked."""
        checked = 0
        for p in range(self.partitions):
            found = self.loaded(p)
            if found is None:
                continue
            coordinator, context = found
            checked += 1
            log = self.brokers[coordinator.broker_id].logs.log(self.key(p))
            assert isinstance(log, PartitionLog)
            rebuilt = dump(self.rebuilt(log))
            shard = dump(context.shard.groups)
            if rebuilt != shard:
                raise self.fail(
                    f"broker {coordinator.broker_id}'s groups of {OFFSETS_TOPIC}-{p} differ "
                    f"from its log below the HW {log.high_watermark}: shard {shard}, log {rebuilt}"
                )
            for group in sorted({k[0] for k in self.acked}):
                if partition_for(group, self.partitions) != p:
                    continue
                answer = await coordinator.fetch_offsets(OffsetFetchRequest(group))
                fetched = {(group, o.topic, o.partition): o.offset for o in answer.offsets}
                for key, offset in sorted(self.acked.items()):
                    if key[0] != group:
                        continue
                    shown = fetched.get(key, -1)
                    if shown < offset:
                        raise self.fail(
                            f"an acknowledged commit was lost or went back: {key} at "
                            f"{offset}, broker {coordinator.broker_id} shows {shown}"
                        )
                    if shown not in self.issued[key]:
                        raise self.fail(f"{key} shows {shown}, which no client committed")
        self.stats.checks += checked
        return checked

    # -- the run --------------------------------------------------------------------------

    async def settle(self, rounds: int = 200) -> None:
        """Everyone back, full replication until every answer came and every
        partition is loaded with nothing waiting."""
        for b in (1, 2, 3):
            if b not in self.brokers:
                self.restart(b)
        for _ in range(rounds):
            self.fetch_round()
            await turns(5)
            self.harvest()
            if (
                not self.pending
                and self.in_sync()
                and all(self.loaded(p) is not None for p in range(self.partitions))
            ):
                return
        raise self.fail(
            f"did not settle: {[self.coordinators[b].shard_states() for b in self.coordinators]}, "
            f"{len(self.pending)} answers missing"
        )

    def events(self) -> Iterator[str]:
        weights = {
            "commit": 30,
            "member-commit": 8,
            "heartbeat": 10,
            "fetch": 40,
            "answers": 6,
            "leader": 4,
            "crash": 3 if self.power_loss else 0,
            "restart": 5 if self.power_loss else 0,
            "compact": 6 if self.compaction else 0,
            "restart-all": 1,
        }
        names = list(weights)
        while True:
            yield self.rng.choices(names, [weights[n] for n in names])[0]

    async def step_event(self, name: str) -> None:
        rng = self.rng
        if name == "commit":
            self.commit(rng.choice(EMPTY_GROUPS), rng.randrange(DATA_PARTITIONS))
        elif name == "member-commit":
            joined = [c for c in self.clients if c.epoch > 0]
            if joined:
                client = rng.choice(joined)
                self.commit(client.group_id, rng.randrange(DATA_PARTITIONS), client=client)
        elif name == "heartbeat":
            self.heartbeat(rng.choice(self.clients))
        elif name == "fetch":
            self.fetch_round(rng.choice((0.3, 0.6, 1.0)))
        elif name == "answers":
            self.harvest(0.5)
        elif name == "leader":
            self.move_leader(rng.randrange(self.partitions))
        elif name == "crash":
            b = rng.choice(sorted(self.brokers))
            if self.can_crash(b):
                await self.crash(b)
            else:
                name += " (refused)"
        elif name == "restart":
            down = [b for b in (1, 2, 3) if b not in self.brokers]
            if down:
                self.restart(down[0])
        elif name == "compact":
            # Only over logs every replica has to the end: a follower behind
            # a cleaned leader cannot fetch across the gap yet (see the
            # test of that below).
            if self.in_sync():
                self.compact()
            else:
                name += " (refused)"
        elif name == "restart-all" and len(self.brokers) == 3:
            await self.restart_all()
        self.stats.count(name)
        self.trace.append(name)

    async def run(self, events: int) -> None:
        await self.settle()
        for name in self.events():
            if events <= 0:
                break
            events -= 1
            await self.step_event(name)
            await turns(3)
            self.harvest(0.7)
            await self.check()
        await self.settle()
        self.harvest()
        await self.check()

    async def stop(self) -> None:
        for coordinator in self.coordinators.values():
            await coordinator.stop()
        for pending in self.pending:
            pending.task.cancel()
        await asyncio.gather(*(p.task for p in self.pending), return_exceptions=True)

"""Several replicas of one partition as objects, each a
:class:`~broker.replica.PartitionReplica` over a :class:`PartitionLog` on a
:class:`MemoryDirectory`, and a tiny controller that changes the partition's
registration as kq's controller does (elections from the ISR, AlterPartition
with its epoch checks, fencing a crashed broker out of the ISR). No network:
a fetch is one request and its answer, delivered at once.

The scenario tests (``test_scenarios.py``) and the random histories
(``test_replica_properties.py``) drive it; the simulator (``broker/sim/``)
runs the same replicas over a network, a controller stub and faults, and
its ``broker.sim.logs`` reads the batches for both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from broker.errors import Errors, ReplicaError
from broker.replica import (
    AlterPartitionRequest,
    AlterPartitionResult,
    FollowerOutcome,
    MappingBrokerView,
    PartitionReplica,
    ReplicaConfig,
)
from broker.sim.logs import BatchId, batches
from metadata.image import BrokerRegistration, PartitionRegistration
from metadata.records import NO_LEADER
from partition_log.batch import build_batch
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.records import Record


def value_batch(value: bytes) -> bytes:
    return build_batch([Record(0, 1000, b"k", value)])


@dataclass
class Node:
    broker_id: int
    directory: MemoryDirectory
    log: PartitionLog
    replica: PartitionReplica
    alive: bool = True


@dataclass(frozen=True)
class Acked:
    """An acks=all produce answered NONE: its batch at ``offset``."""

    offset: int
    batch: BatchId


class Cluster:
    """Replicas ``0..n-1`` of one partition and its controller."""

    def __init__(
        self,
        n: int = 3,
        *,
        min_isr: int = 1,
        lag_ms: int = 10_000,
        log_config: LogConfig | None = None,
        leader: int = 0,
        fetch_max_bytes: int = 1 << 20,
        elr: bool = False,
    ) -> None:
        self.now_ms = 1_000
        self.log_config = log_config or LogConfig()
        self.replica_config = ReplicaConfig(
            replica_lag_time_max_ms=lag_ms,
            min_insync_replicas=min_isr,
            replica_fetch_max_bytes=fetch_max_bytes,
        )
        self.registrations: dict[int, BrokerRegistration] = {}
        self.view = MappingBrokerView(self.registrations)
        self._next_broker_epoch = 100
        for b in range(n):
            self._register(b)
        self.nodes = [self._open(b, MemoryDirectory(), 0) for b in range(n)]
        # KIP-966: with ``elr`` the controller keeps the eligible leader
        # replicas (those that left the ISR while it was below min ISR and
        # did not shut down uncleanly) and elects one when the ISR has no
        # live member.
        self.use_elr = elr
        self.elr: set[int] = set()
        self.partition = PartitionRegistration(
            replicas=tuple(range(n)), isr=tuple(range(n)), leader=leader
        )
        # What clients were told: acks=all successes, and waiting ones.
        self.acked: list[Acked] = []
        self.waiting: list[tuple[int, int, int, BatchId]] = []
        self.refused: list[Errors] = []
        self.publish(self.partition)

    # -- brokers ------------------------------------------------------------

    def _register(self, broker_id: int) -> None:
        """A (re-)registration: a new broker epoch, unfenced."""
        self._next_broker_epoch += 1
        self.registrations[broker_id] = BrokerRegistration(
            broker_id,
            self._next_broker_epoch,
            f"inc-{self._next_broker_epoch}",
            (),
            None,
            (),
            False,
            False,
        )

    def broker_epoch(self, broker_id: int) -> int:
        return self.registrations[broker_id].epoch

    def _open(self, broker_id: int, directory: MemoryDirectory, high_watermark: int) -> Node:
        log = PartitionLog.open(
            directory, self.log_config, now_ms=self.now_ms, high_watermark=high_watermark
        )
        replica = PartitionReplica(broker_id, log, self.replica_config, self.view)
        return Node(broker_id, directory, log, replica)

    @property
    def leader(self) -> Node:
        return self.nodes[self.partition.leader]

    # -- the controller --------------------------------------------------------

    def publish(self, registration: PartitionRegistration) -> None:
        """A new registration reaches every live replica (a metadata delta)."""
        old = self.partition
        if len(registration.isr) >= self.replica_config.min_insync_replicas:
            self.elr = set()
        else:
            # PartitionChangeBuilder.maybePopulateTargetElr
            self.elr = (self.elr | set(old.isr)) - set(registration.isr)
        self.partition = registration
        for node in self.nodes:
            if not node.alive:
                continue
            if node.broker_id == registration.leader:
                node.replica.become_leader(registration, self.now_ms)
            else:
                node.replica.become_follower(registration, self.now_ms)
        self.check_acks()

    def elect(self, leader: int, isr: tuple[int, ...] | None = None) -> None:
        """A new leader (a clean election from the ISR, or the scenario's
        choice), its epoch one up."""
        p = self.partition
        self.publish(
            replace(
                p,
                leader=leader,
                isr=p.isr if isr is None else isr,
                leader_epoch=p.leader_epoch + 1,
                partition_epoch=p.partition_epoch + 1,
            )
        )

    def change_isr(self, isr: tuple[int, ...]) -> None:
        p = self.partition
        self.publish(replace(p, isr=isr, partition_epoch=p.partition_epoch + 1))

    def alter_partition(self, request: AlterPartitionRequest) -> None:
        """kq's AlterPartition checks (docs/metadata.md §3), answered at once."""
        p = self.partition
        leader = self.nodes[request.leader_id].replica
        error = Errors.NONE
        if request.leader_id != p.leader or request.leader_epoch < p.leader_epoch:
            error = Errors.FENCED_LEADER_EPOCH
        elif request.partition_epoch != p.partition_epoch:
            error = Errors.INVALID_UPDATE_VERSION
        else:
            for member in request.new_isr:
                reg = self.registrations[member.broker_id]
                bad = (
                    reg.fenced
                    or reg.in_controlled_shutdown
                    or (member.broker_epoch not in (-1, reg.epoch))
                )
                if bad and member.broker_id not in p.isr:
                    error = Errors.INELIGIBLE_REPLICA
        if error is not Errors.NONE:
            leader.step_alter_partition_error(request, error)
            return
        new = replace(
            p,
            isr=request.isr,
            partition_epoch=p.partition_epoch + 1,
            leader_recovery_state=request.leader_recovery_state,
        )
        leader.step_alter_partition_result(
            request,
            AlterPartitionResult(
                new.leader,
                new.leader_epoch,
                new.partition_epoch,
                new.isr,
                new.leader_recovery_state,
            ),
            self.now_ms,
        )
        self.publish(new)

    # -- data ------------------------------------------------------------------

    def fetch(self, follower: int, max_bytes: int | None = None) -> FollowerOutcome | None:
        """One fetch of ``follower`` from the leader (of at most ``max_bytes``,
        but at least one batch), answered and handled."""
        node = self.nodes[follower]
        p = self.partition
        if not node.alive or p.leader == NO_LEADER or not self.leader.alive:
            return None
        request = node.replica.next_fetch_request(self.broker_epoch(follower))
        if request is None:
            return None
        if max_bytes is not None:
            request = replace(request, max_bytes=max_bytes)
        outcome = self.leader.replica.step_fetch(request, self.now_ms)
        if outcome.alter_partition is not None:
            self.alter_partition(outcome.alter_partition)
        result = node.replica.step_fetch_answer(request, outcome.answer, self.now_ms)
        self.check_acks()
        return result

    def produce(self, value: bytes, acks: int = -1) -> Errors:
        """A produce to the leader; acks=all waits in ``waiting``."""
        leader = self.leader
        try:
            append = leader.replica.append_as_leader(value_batch(value), acks, self.now_ms)
        except ReplicaError as error:
            self.refused.append(error.code)
            return error.code
        offset = append.info.first_offset
        if acks == -1:
            ids = batches(leader.log)
            self.waiting.append(
                (offset, append.info.last_offset + 1, append.leader_epoch, ids[offset])
            )
        self.check_acks()
        return Errors.NONE

    def check_acks(self) -> None:
        """The delayed produces: complete those the leader says are done."""
        if self.partition.leader == NO_LEADER:
            return
        replica = self.leader.replica
        still = []
        for offset, required, epoch, batch in self.waiting:
            check = replica.check_enough_replicas_reach_offset(required, epoch)
            if not check.done:
                still.append((offset, required, epoch, batch))
            elif check.error is Errors.NONE:
                self.acked.append(Acked(offset, batch))
        self.waiting = still

    def tick(self, ms: int) -> None:
        """Time passes; the leader's ISR expiration runs."""
        self.now_ms += ms
        if self.partition.leader == NO_LEADER or not self.leader.alive:
            return
        request = self.leader.replica.tick_isr(self.now_ms)
        if request is not None:
            self.alter_partition(request)

    def _reopen(
        self, broker_id: int, lose_unsynced: bool, rng: random.Random | None = None
    ) -> None:
        """The process restarts: a power loss keeps only what was synced (or
        a clean close keeps all), the log is opened again with the high
        watermark it had (Kafka's replication-offset-checkpoint), and the
        replica starts with no state."""
        node = self.nodes[broker_id]
        high_watermark = node.log.high_watermark
        if lose_unsynced:
            node.directory.crash(rng)
        else:
            node.log.close()
        self.nodes[broker_id] = self._open(broker_id, node.directory, high_watermark)

    def bounce(self, broker_id: int, *, lose_unsynced: bool = False) -> None:
        """A restart faster than the session timeout: the registration and
        the ISR are unchanged, and the replica learns its role again."""
        self._reopen(broker_id, lose_unsynced)
        self.publish(self.partition)

    def kill(
        self, broker_id: int, *, lose_unsynced: bool = True, rng: random.Random | None = None
    ) -> None:
        """``broker_id`` stops (a power loss by default); the controller
        fences it, takes it out of the ISR unless it is the last member (kq
        keeps the last one), and elects another live ISR member if it led
        (or, with ELR, an eligible leader replica). With ``rng``, a torn
        prefix of an unsynced tail may survive; a power loss is an unclean
        shutdown, which takes the broker out of the ELR."""
        self._reopen(broker_id, lose_unsynced, rng)
        self.nodes[broker_id].alive = False
        self.registrations[broker_id] = replace(self.registrations[broker_id], fenced=True)
        p = self.partition
        isr = tuple(b for b in p.isr if b != broker_id) or p.isr
        if p.leader == broker_id:
            live = [b for b in isr if b != broker_id and self.nodes[b].alive]
            eligible = sorted(b for b in self.elr if b != broker_id and self.nodes[b].alive)
            if live:
                self.elect(live[0], isr)
            elif self.use_elr and eligible:
                self.elect(eligible[0], (eligible[0],))
            else:
                self.elect(NO_LEADER, isr)
        elif isr != p.isr:
            self.change_isr(isr)
        if lose_unsynced:
            self.elr.discard(broker_id)

    def restart(self, broker_id: int) -> None:
        """A killed broker comes back with a new broker epoch, unfenced; a
        partition without a leader elects it if it is in the ISR."""
        self.nodes[broker_id].alive = True
        self._register(broker_id)
        p = self.partition
        if p.leader == NO_LEADER and broker_id in p.isr:
            self.elect(broker_id)
        elif p.leader == NO_LEADER and self.use_elr and broker_id in self.elr:
            self.elect(broker_id, (broker_id,))
        else:
            self.publish(replace(p, partition_epoch=p.partition_epoch + 1))

    def crash(self, broker_id: int, rng: random.Random | None = None) -> None:
        """A power loss and restart."""
        self.kill(broker_id, rng=rng)
        self.restart(broker_id)

    def committed(self) -> dict[int, BatchId]:
        """The leader's batches below its HW: what it has told consumers and
        producers is there for good."""
        leader = self.leader.log
        return {o: b for o, b in batches(leader).items() if o < leader.high_watermark}

    def lost(self, expected: dict[int, BatchId]) -> dict[int, BatchId]:
        """Those of ``expected`` the current leader does not hold at their
        offset (everything, if there is no leader)."""
        if self.partition.leader == NO_LEADER:
            return {}
        have = batches(self.leader.log)
        return {o: b for o, b in expected.items() if have.get(o) != b}

    def lost_acks(self) -> list[Acked]:
        """acks=all successes the current leader does not hold."""
        if self.partition.leader == NO_LEADER:
            return []
        have = batches(self.leader.log)
        return [a for a in self.acked if have.get(a.offset) != a.batch]

    def inconsistent(self) -> dict[int, set[BatchId]]:
        """Offsets at which live replicas hold different batches."""
        seen: dict[int, set[BatchId]] = {}
        for node in self.nodes:
            if node.alive:
                for offset, batch in batches(node.log).items():
                    seen.setdefault(offset, set()).add(batch)
        return {o: b for o, b in seen.items() if len(b) > 1}

    def replicate(self, rounds: int = 3) -> None:
        """Every follower fetches ``rounds`` times."""
        for _ in range(rounds):
            for node in self.nodes:
                if node.broker_id != self.partition.leader:
                    self.fetch(node.broker_id)

"""The simulation's controller stub: what kq's controller does for
partitions, over plain dictionaries (no quorum).

- Broker registrations with a broker epoch that grows at every registration
  (KIP-631); a broker whose heartbeats stop for ``session_timeout_ms`` is
  fenced (``BrokerHeartbeatManager``) and leaves every ISR, except as its
  last member (kq keeps one); a new registration fences the old
  incarnation, and one after a power loss is an unclean shutdown (KIP-966:
  it leaves the ISR and the ELR).
- Elections (``PartitionChangeBuilder``): a live ISR member; else, under
  strict min ISR, an eligible leader replica (KIP-966); else, only if
  configured, any live replica (unclean, the leader ``RECOVERING``, KIP-704).
- ``AlterPartition`` with kq's checks (docs/metadata.md §3): the leader and
  its epoch, the partition epoch, and for a replica added to the ISR that it
  is unfenced, not shutting down (KIP-841) and at its current broker epoch
  (KIP-903).
- Every change is appended to a metadata log that brokers pull, each at its
  own pace (:meth:`changes_since`), so they see changes late.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import bugs
from broker.errors import Errors
from broker.replica.types import AlterPartitionRequest, AlterPartitionResult
from broker.sim.config import SimConfig
from bugs import Bug
from metadata.image import BrokerRegistration, PartitionRegistration
from metadata.records import NO_LEADER, LeaderRecoveryState

__all__ = ["BrokerChange", "MetadataChange", "PartitionChange", "SimController"]


@dataclass(frozen=True, slots=True)
class BrokerChange:
    registration: BrokerRegistration


@dataclass(frozen=True, slots=True)
class PartitionChange:
    partition: int
    registration: PartitionRegistration


MetadataChange = BrokerChange | PartitionChange


class SimController:
    def __init__(self, config: SimConfig, assignments: dict[int, tuple[int, ...]]) -> None:
        self.config = config
        self.registrations: dict[int, BrokerRegistration] = {}
        self.partitions: dict[int, PartitionRegistration] = {}
        self.last_heartbeat: dict[int, int] = {}
        self.log: list[MetadataChange] = []
        self.elections = 0
        # Partitions that had an unclean election: their acknowledged records
        # may be gone (design.html §4.7), which the invariants then say.
        self.unclean: set[int] = set()
        self._next_epoch = 100
        self._assignments = assignments
        for partition, replicas in assignments.items():
            self._publish(
                partition,
                PartitionRegistration(
                    replicas=replicas, isr=replicas, leader=replicas[0], leader_epoch=0
                ),
            )

    # -- the metadata log -------------------------------------------------------

    def changes_since(self, offset: int) -> list[MetadataChange]:
        return self.log[offset:]

    def _use_elr(self) -> bool:
        return self.config.elr and not bugs.on(Bug.NO_ELR)  # R9: no ELR kept

    def _publish(
        self, partition: int, new: PartitionRegistration, exclude: int | None = None
    ) -> None:
        """Append a partition change, with the ELR of KIP-966
        (``PartitionChangeBuilder.maybePopulateTargetElr``): replicas that
        leave the ISR while it is below min ISR join the ELR; an ISR at min
        ISR empties it."""
        old = self.partitions.get(partition)
        if self._use_elr() and old is not None:
            if len(new.isr) >= self.config.min_insync_replicas:
                elr: tuple[int, ...] = ()
            else:
                # The ELR the change keeps, and whoever it takes out of the ISR.
                left = set(old.isr) - set(new.isr)
                elr = tuple(sorted((set(new.elr) | left) - set(new.isr) - {exclude}))
            new = replace(new, elr=elr)
        elif not self._use_elr():
            new = replace(new, elr=())
        self.partitions[partition] = new
        self.log.append(PartitionChange(partition, new))

    def _change(self, partition: int, exclude: int | None = None, **fields: object) -> None:
        old = self.partitions[partition]
        new = replace(old, partition_epoch=old.partition_epoch + 1, **fields)  # type: ignore[arg-type]
        self._publish(partition, new, exclude)

    # -- brokers ----------------------------------------------------------------

    def active(self, broker_id: int) -> bool:
        registration = self.registrations.get(broker_id)
        return registration is not None and registration.active

    def register(self, broker_id: int, now_ms: int, *, unclean_shutdown: bool) -> int:
        """A broker (re-)registers: its old incarnation is fenced first (it
        leaves the ISRs and its leaderships), then the new one is unfenced
        with a new broker epoch; returns that epoch. After a power loss
        (``unclean_shutdown``) it also leaves the ELR (KIP-966). With
        ``restart_keeps_isr`` it is not fenced first (the restart was faster
        than the session timeout, as with ZooKeeper-era brokers)."""
        if broker_id in self.registrations and not self.config.restart_keeps_isr:
            self.fence(broker_id)
        if unclean_shutdown and not self.config.restart_keeps_isr:
            # KIP-966 (handleBrokerUncleanShutdown): out of the ELR, and with
            # ELR out of the ISR even as its last member (the ISR may then be
            # empty, and an ELR member lead).
            for partition, p in sorted(self.partitions.items()):
                in_isr = self._use_elr() and broker_id in p.isr
                if broker_id in p.elr or in_isr:
                    self._change(
                        partition,
                        exclude=broker_id,
                        isr=tuple(b for b in p.isr if b != broker_id),
                        elr=tuple(b for b in p.elr if b != broker_id),
                        last_known_elr=tuple(sorted({*p.last_known_elr, broker_id})),
                    )
        self._next_epoch += 1
        registration = BrokerRegistration(
            broker_id, self._next_epoch, f"inc-{self._next_epoch}", (), None, (), False, False
        )
        self.registrations[broker_id] = registration
        self.last_heartbeat[broker_id] = now_ms
        self.log.append(BrokerChange(registration))
        for partition in sorted(self.partitions):
            if self.partitions[partition].leader == NO_LEADER:
                self._elect(partition)
        return registration.epoch

    def heartbeat(self, broker_id: int, broker_epoch: int, now_ms: int) -> bool:
        """A heartbeat of the broker's current registration; one from a
        fenced broker unfences it (``BrokerHeartbeatManager``: a live,
        caught-up broker asks to be unfenced), and leaderless partitions may
        then elect it. An old broker epoch is refused."""
        registration = self.registrations.get(broker_id)
        if registration is None or registration.epoch != broker_epoch:
            return False
        self.last_heartbeat[broker_id] = now_ms
        if registration.fenced and not registration.in_controlled_shutdown:
            registration = replace(registration, fenced=False)
            self.registrations[broker_id] = registration
            self.log.append(BrokerChange(registration))
            for partition in sorted(self.partitions):
                if self.partitions[partition].leader == NO_LEADER:
                    self._elect(partition)
        return True

    def fence(self, broker_id: int) -> None:
        """The broker is fenced: out of every ISR (kq keeps a last member)
        and of its leaderships."""
        registration = self.registrations.get(broker_id)
        if registration is None or registration.fenced:
            return
        registration = replace(registration, fenced=True)
        self.registrations[broker_id] = registration
        self.log.append(BrokerChange(registration))
        for partition in sorted(self.partitions):
            p = self.partitions[partition]
            if broker_id not in p.isr and p.leader != broker_id:
                continue
            isr = tuple(b for b in p.isr if b != broker_id) or p.isr
            if p.leader == broker_id:
                self._elect(partition, isr)
            elif isr != p.isr:
                self._change(partition, isr=isr)

    def controlled_shutdown(self, broker_id: int) -> None:
        """``BrokerHeartbeat`` with ``WantShutDown``: the broker is marked
        shutting down (no longer eligible: KIP-841), its leaderships move to
        other live ISR members, and it leaves every ISR (kq keeps a last
        member); leaving below min ISR puts it in the ELR (a clean
        shutdown keeps it eligible, KIP-966)."""
        registration = self.registrations.get(broker_id)
        if registration is None or not registration.active:
            return
        registration = replace(registration, in_controlled_shutdown=True)
        self.registrations[broker_id] = registration
        self.log.append(BrokerChange(registration))
        for partition in sorted(self.partitions):
            p = self.partitions[partition]
            isr = tuple(b for b in p.isr if b != broker_id) or p.isr
            if p.leader == broker_id:
                self._elect(partition, isr)
            elif isr != p.isr:
                self._change(partition, isr=isr)

    def tick(self, now_ms: int) -> list[int]:
        """Fence the brokers whose heartbeats stopped; returns them."""
        fenced = []
        for broker_id, registration in sorted(self.registrations.items()):
            if registration.fenced:
                continue
            if now_ms - self.last_heartbeat.get(broker_id, 0) > self.config.session_timeout_ms:
                self.fence(broker_id)
                fenced.append(broker_id)
        return fenced

    # -- elections ----------------------------------------------------------------

    def _elect(self, partition: int, isr: tuple[int, ...] | None = None) -> None:
        p = self.partitions[partition]
        isr = p.isr if isr is None else isr
        live_isr = [b for b in isr if self.active(b)]
        recovery = LeaderRecoveryState.RECOVERED
        if live_isr:
            leader = live_isr[0]
        elif self._use_elr() and any(self.active(b) for b in p.elr):
            leader = next(b for b in p.elr if self.active(b))
            isr = (leader,)
        elif self.config.unclean_election and any(self.active(b) for b in p.replicas):
            leader = next(b for b in p.replicas if self.active(b))
            isr = (leader,)
            recovery = LeaderRecoveryState.RECOVERING
            self.unclean.add(partition)
        else:
            leader = NO_LEADER
        if leader == p.leader and isr == p.isr:
            return
        if leader != NO_LEADER:
            self.elections += 1
        self._change(
            partition,
            leader=leader,
            isr=isr,
            leader_epoch=p.leader_epoch + 1,
            leader_recovery_state=recovery,
        )

    def elect(self, partition: int, leader: int) -> None:
        """A chosen leader from the ISR (a preferred-leader election), for
        scripted schedules."""
        p = self.partitions[partition]
        if leader not in p.isr:
            raise ValueError(f"broker {leader} is not in the ISR {list(p.isr)} of {partition}")
        self.elections += 1
        self._change(partition, leader=leader, leader_epoch=p.leader_epoch + 1)

    # -- AlterPartition -----------------------------------------------------------

    def alter_partition(
        self, partition: int, request: AlterPartitionRequest
    ) -> tuple[AlterPartitionResult | None, Errors]:
        """kq's AlterPartition checks; the new state or the error."""
        p = self.partitions.get(partition)
        if p is None:
            return None, Errors.UNKNOWN_TOPIC_OR_PARTITION
        if request.leader_id != p.leader or request.leader_epoch != p.leader_epoch:
            return None, Errors.FENCED_LEADER_EPOCH
        if request.partition_epoch != p.partition_epoch:
            return None, Errors.INVALID_UPDATE_VERSION
        ineligible_ok = bugs.on(Bug.EXPAND_WITH_INELIGIBLE)
        for member in request.new_isr:
            registration = self.registrations.get(member.broker_id)
            eligible = (
                registration is not None
                and registration.active
                and member.broker_epoch in (-1, registration.epoch)
            )
            # B8 (KIP-841, KIP-903): the leader's check undone, and this one
            # with it (the controller would otherwise refuse the expansion).
            if not eligible and member.broker_id not in p.isr and not ineligible_ok:
                return None, Errors.INELIGIBLE_REPLICA
        if not request.isr or p.leader not in request.isr:
            return None, Errors.INVALID_REQUEST
        self._change(
            partition, isr=request.isr, leader_recovery_state=request.leader_recovery_state
        )
        new = self.partitions[partition]
        return (
            AlterPartitionResult(
                new.leader,
                new.leader_epoch,
                new.partition_epoch,
                new.isr,
                new.leader_recovery_state,
            ),
            Errors.NONE,
        )

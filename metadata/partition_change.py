"""One partition's next state: elections, ISR changes, reassignment steps.

Kafka's ``PartitionChangeBuilder``: given a partition and what should
change (a new ISR, target replicas, an election), compute the
:class:`PartitionChangeRecord` with only the fields that change, or None
when nothing does.  Pure: the caller says which brokers may lead or be in
the ISR (registered, unfenced, not shutting down: KIP-841).

Eligible leader replicas (KIP-966; Kafka's ``maybePopulateTargetElr``,
``isValidNewLeader`` and ``maybeUpdateRecordElr``): brokers replicate under
strict min ISR (the high watermark does not move while the ISR is below
``min.insync.replicas``), so a replica that leaves the ISR while the ISR is
below min ISR still holds every committed record.  Such replicas form the
ELR; when the ISR is empty, an unfenced ELR member may lead in a clean
election.  The ISR may therefore become empty; a replica that restarted
uncleanly (it may have lost its unsynced tail) leaves the ELR for the
last-known ELR.

The last known leader (KIP-966; Kafka's ``canElectLastKnownLeader`` and
``maybeUpdateLastKnownLeader``, on by default there:
``useLastKnownLeaderInBalancedRecovery``): the last-known ELR then holds
only the leader the partition had when its ISR became empty, and once no
ISR or ELR member is left (every one restarted uncleanly) that leader, if
unfenced, is elected in an unclean election (RECOVERING, the ISR itself
alone, KIP-704), as Kafka 4.1 does; without it a partition whose replicas
all crashed at once would stay offline for ever.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import bugs
from bugs import Bug
from metadata.image import PartitionRegistration
from metadata.records import (
    NO_LEADER,
    NO_LEADER_CHANGE,
    LeaderRecoveryState,
    PartitionChangeRecord,
)

__all__ = ["Election", "PartitionChange", "reassignment_replicas"]


class Election(enum.Enum):
    # Keep a valid leader; else the first active ISR member in replica order,
    # or, with an empty ISR, the first active ELR member (KIP-966).
    ONLINE = "online"
    # The first replica, if it is an active ISR member (else as ONLINE).
    PREFERRED = "preferred"
    # As ONLINE; if no ISR or ELR member can lead, any active replica
    # (KIP-704: the new leader is RECOVERING, the ISR shrinks to it alone and
    # the ELR and last-known ELR are cleared).
    UNCLEAN = "unclean"


def reassignment_replicas(
    current: tuple[int, ...], target: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(replicas, adding, removing) while moving ``current`` to ``target``
    (Kafka's PartitionReassignmentReplicas, KIP-455): the target first, then
    the replicas being removed."""
    removing = tuple(r for r in current if r not in target)
    adding = tuple(r for r in target if r not in current)
    return target + removing, adding, removing


@dataclass(slots=True)
class PartitionChange:
    topic_id: str
    partition_id: int
    partition: PartitionRegistration
    # May this broker lead or join the ISR (registered, unfenced, not
    # shutting down)?
    is_active: Callable[[int], bool]
    election: Election = Election.ONLINE
    target_isr: tuple[int, ...] | None = None
    target_replicas: tuple[int, ...] | None = None
    target_adding: tuple[int, ...] | None = None
    target_removing: tuple[int, ...] | None = None
    # The leader reports its log recovered after an unclean election.
    recovered: bool = False
    # Bump the leader epoch even if the leader stays (Kafka does when
    # replicas are removed, so the old ones notice).
    bump_leader_epoch: bool = False
    # The topic's effective min.insync.replicas (at most its replication
    # factor): an ISR at least this large clears the ELR (KIP-966).
    min_isr: int = 1
    # Brokers that re-registered after an unclean shutdown: they leave the
    # ELR (Kafka's uncleanShutdownReplicas).
    unclean_shutdown: tuple[int, ...] = ()
    # KIP-966's last known leader (Kafka's
    # useLastKnownLeaderInBalancedRecovery, true there): the last-known ELR
    # holds the leader the partition had when its ISR became empty, elected
    # (uncleanly) when no ISR or ELR member is left.  False: the last-known
    # ELR lists the replicas that left the ELR, for information only.
    use_last_known_leader: bool = True

    def build(self) -> PartitionChangeRecord | None:
        p = self.partition
        replicas = p.replicas if self.target_replicas is None else self.target_replicas
        isr = p.isr if self.target_isr is None else self.target_isr
        adding = p.adding_replicas if self.target_adding is None else self.target_adding
        removing = p.removing_replicas if self.target_removing is None else self.target_removing
        bump = self.bump_leader_epoch

        # Complete a reassignment once every target replica is in the ISR.
        if (adding or removing) and all(r in isr for r in adding):
            target = tuple(r for r in replicas if r not in removing)
            new_isr = tuple(r for r in isr if r in target)
            if new_isr:
                # Replicas go away: the leader epoch grows so they notice
                # (whether the removal started now or earlier).
                bump = bump or bool(removing)
                replicas, isr, adding, removing = target, new_isr, (), ()

        # The ISR never holds a broker that is not a replica (a replica
        # dropped by a new reassignment target leaves it too).
        if any(r not in replicas for r in isr):
            isr = tuple(r for r in isr if r in replicas)
            bump = True
        if bugs.on(Bug.NO_ELR):
            # R9 (KIP-966 undone): as Kafka before it, no ELR is kept and
            # the ISR never becomes empty (PartitionChangeBuilder set the
            # ISR only to a non-empty target): the last member stays in it
            # when fenced, and leads again when back, even after an unclean
            # shutdown that may have lost its unsynced tail.
            if not isr:
                isr = tuple(r for r in p.isr if r in replicas)
            elr: tuple[int, ...] = ()
            last_known_elr: tuple[int, ...] = ()
        else:
            elr, last_known_elr = self._target_elr(isr, replicas)
        leader = p.leader
        recovery = p.leader_recovery_state
        if self.recovered and recovery is LeaderRecoveryState.RECOVERING:
            recovery = LeaderRecoveryState.RECOVERED

        def can_lead(b: int) -> bool:
            # Kafka's isValidNewLeader: an ISR member, or an ELR member when
            # the ISR is empty; and unfenced, not shutting down.
            in_sync = b in isr or (not isr and b in elr)
            return in_sync and b in replicas and self.is_active(b)

        preferred = replicas[0] if replicas else NO_LEADER
        unclean = False
        last_known_leader = self._last_known_leader(isr, elr, replicas)
        if self.election is Election.PREFERRED and preferred != leader and can_lead(preferred):
            leader = preferred
        elif not can_lead(leader):
            candidates = [r for r in replicas if can_lead(r)]
            if candidates:
                leader = candidates[0]
            elif last_known_leader != NO_LEADER and not bugs.on(Bug.UNCLEAN_ELECTION):
                # Kafka's electAnyLeader: after the ISR and the ELR, before
                # any replica, the last known leader (an unclean election:
                # it restarted uncleanly, so its log may lack a tail that
                # only the page cache held).  B9 keeps its own fallback.
                leader = last_known_leader
                unclean = True
            elif self.election is Election.UNCLEAN or bugs.on(Bug.UNCLEAN_ELECTION):
                # B9 (a positive control): any election falls back on an
                # out-of-sync live replica, as unclean.leader.election.enable.
                live = [r for r in replicas if self.is_active(r)]
                if live:
                    leader = live[0]
                    unclean = True
                else:
                    leader = NO_LEADER
            else:
                leader = NO_LEADER
        if leader != NO_LEADER and leader not in isr and leader in elr:
            # A clean election from the ELR (Kafka's tryElection): the new
            # leader is the ISR, and leaves the ELR.  (Kafka tests that the
            # leader changed; a leader that stays is in the ISR in every
            # change the controller makes, so this also covers a caller
            # asking for an ISR without a leader that may still lead.)
            isr = (leader,)
            elr = tuple(r for r in elr if r != leader)
        if unclean:
            # An unclean election may lose committed records: the new leader
            # alone is the ISR, RECOVERING until it says its log is
            # consistent (KIP-704), and no ELR survives it (Kafka's
            # maybeUpdateRecordElr).
            isr = (leader,)
            recovery = LeaderRecoveryState.RECOVERING
            elr, last_known_elr = (), ()
        if self.use_last_known_leader and not bugs.on(Bug.NO_ELR):
            last_known_elr = self._next_last_known_leader(isr, leader, replicas)

        change = PartitionChangeRecord(
            self.topic_id,
            self.partition_id,
            leader=leader if (leader != p.leader or bump) else NO_LEADER_CHANGE,
            isr=isr if isr != p.isr else None,
            replicas=replicas if replicas != p.replicas else None,
            removing_replicas=removing if removing != p.removing_replicas else None,
            adding_replicas=adding if adding != p.adding_replicas else None,
            leader_recovery_state=recovery if recovery != p.leader_recovery_state else None,
            elr=elr if elr != p.elr else None,
            last_known_elr=last_known_elr if last_known_elr != p.last_known_elr else None,
        )
        if (
            change.leader == NO_LEADER_CHANGE
            and change.isr is None
            and change.replicas is None
            and change.removing_replicas is None
            and change.adding_replicas is None
            and change.leader_recovery_state is None
            and change.elr is None
            and change.last_known_elr is None
        ):
            return None
        return change

    def _last_known_leader(
        self, isr: tuple[int, ...], elr: tuple[int, ...], replicas: tuple[int, ...]
    ) -> int:
        """The last known leader if it may be elected now, else NO_LEADER:
        Kafka's ``canElectLastKnownLeader``.  Only with the ISR and the ELR
        empty, only from a last-known ELR of one member (with the option
        off it lists several replicas and names no leader), and only when
        that broker is unfenced (KAFKA-19522, Kafka 4.1: before it a fenced
        last known leader was elected too)."""
        if not self.use_last_known_leader or bugs.on(Bug.NO_ELR) or isr or elr:
            return NO_LEADER
        known = self.partition.last_known_elr
        if len(known) != 1 or known[0] not in replicas or not self.is_active(known[0]):
            return NO_LEADER
        return known[0]

    def _next_last_known_leader(
        self, isr: tuple[int, ...], leader: int, replicas: tuple[int, ...]
    ) -> tuple[int, ...]:
        """The last-known ELR after this change, holding the last known
        leader: Kafka's ``maybeUpdateLastKnownLeader``.  The leader of the
        moment the ISR becomes empty is remembered (once: a later change
        with the ISR still empty keeps it); a partition with a leader after
        the change forgets it; otherwise it stays."""
        p = self.partition
        if not isr and p.isr:
            if p.leader != NO_LEADER and p.leader in replicas:
                return (p.leader,)
            # Kafka would write the leader -1, which no election takes: a
            # partition that had no leader when its ISR emptied names none.
            return ()
        if leader != NO_LEADER:
            return ()
        return p.last_known_elr

    def _target_elr(
        self, isr: tuple[int, ...], replicas: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(ELR, last-known ELR) for the new ISR: Kafka's
        ``maybePopulateTargetElr``.  At min ISR both are empty.  Below it,
        the ELR is the old ELR and the old ISR, less the new ISR and the
        brokers that shut down uncleanly; the last-known ELR is the old one
        and the old ISR and ELR, less the new ISR and the new ELR (so it
        keeps the unclean ones).  A fenced broker stays eligible: fencing
        loses nothing it wrote, it only may not lead until unfenced.  Both
        keep only replicas of the partition (a replica reassigned away
        cannot lead), in broker id order."""
        p = self.partition
        if len(isr) >= self.min_isr:
            return (), ()
        candidates = set(p.elr) | set(p.isr)
        elr = tuple(
            sorted(
                r
                for r in candidates
                if r not in isr and r not in self.unclean_shutdown and r in replicas
            )
        )
        last_known = tuple(
            sorted(
                r
                for r in candidates | set(p.last_known_elr)
                if r not in isr and r not in elr and r in replicas
            )
        )
        return elr, last_known

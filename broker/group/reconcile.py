"""How a member moves toward its target assignment, one heartbeat at a time
(KIP-848's reconciliation, Kafka's ``CurrentAssignmentBuilder``).

The rule that keeps a partition from having two owners: a partition of a
member's target is added to its assignment only once no member owns it
(assigned or pending revocation), and a member that must give partitions
up stays at its old epoch, owning them as "pending revocation", until a
heartbeat says it no longer holds them.  Only then are they free.
"""

from __future__ import annotations

from collections.abc import Callable

import bugs
from broker.group.records import CurrentAssignmentValue
from broker.group.types import MemberState, Partitions
from bugs import Bug

__all__ = ["next_assignment", "owns_any"]


def owns_any(owned: Partitions | None, partitions: Partitions) -> bool:
    """Whether the member may still hold some of ``partitions``: it does
    unless its heartbeat listed what it owns and none of them is there
    (``CurrentAssignmentBuilder.ownsRevokedPartitions``; a heartbeat that
    omits its owned partitions tells nothing, so they are held)."""
    if owned is None:
        return True
    return not owned.isdisjoint(partitions)


def next_assignment(
    current: CurrentAssignmentValue,
    target_epoch: int,
    target: Partitions,
    owned: Partitions | None,
    owner_of: Callable[[tuple[str, int]], str | None],
    member_id: str,
) -> CurrentAssignmentValue:
    """The member's assignment after this heartbeat (``build``).

    ``owned`` is what the heartbeat says the member holds (``None`` if it
    did not say); ``owner_of`` who owns a partition now (assigned or
    pending revocation), the member itself included.
    """
    if current.state is MemberState.UNREVOKED_PARTITIONS and owns_any(
        owned, current.pending_revocation
    ):
        # Still revoking: nothing moves until it has let them go.
        return current
    if (
        current.state is MemberState.STABLE
        and current.member_epoch == target_epoch
        and not current.pending_revocation
    ):
        return current
    keep = current.assigned & target
    revoke = current.assigned - target
    if revoke and owns_any(owned, revoke):
        # Revoke first, at the old epoch (KIP-848: "the member ... must
        # revoke partitions before it can transition to the new epoch").
        return CurrentAssignmentValue(
            member_epoch=current.member_epoch,
            previous_member_epoch=current.previous_member_epoch,
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=keep,
            pending_revocation=revoke,
        )
    assigned = set(keep)
    unreleased = False
    for partition in target - current.assigned:
        owner = owner_of(partition)
        # The member's own pending revocation is released by this very
        # step (it has revoked: we are past the check above).
        if (
            owner is None
            or (owner == member_id and partition in current.pending_revocation)
            # B20: given while another member still holds it (assigned, or
            # pending revocation): two owners.
            or bugs.on(Bug.ASSIGN_BEFORE_REVOKE)
        ):
            assigned.add(partition)
        else:
            unreleased = True
    epoch_moves = current.member_epoch != target_epoch
    return CurrentAssignmentValue(
        member_epoch=target_epoch,
        previous_member_epoch=(
            current.member_epoch if epoch_moves else current.previous_member_epoch
        ),
        state=MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE,
        assigned=frozenset(assigned),
        pending_revocation=frozenset(),
    )

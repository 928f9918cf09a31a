"""Deliberate bugs, for proving that kq's checks can fail.

Each :class:`Bug` breaks one rule of the quorum or of the brokers, at the
exact line that keeps it, the way a historical bug broke it (Raft's rules,
Kafka's KIP-101, KIP-279, KAFKA-7128 and the others of the brokers'
reference notes, §5.7). The chaos catalogue (``kq chaos catalogue``) starts
clusters with one bug on and shows that a check of the history or of the
node exports fires; the same recipes with no bug must raise nothing.

Every bug is off unless a process turns it on, and a process turns bugs on
only from two environment variables read at its start (never from a config
file, a flag or a request): ``KQ_INJECT_BUGS`` names the bugs (ids or names,
comma-separated) and ``KQ_INJECT_BUGS_ACK`` must say exactly
:data:`ACKNOWLEDGEMENT`; a process given the first without the second
refuses to start. Tests turn bugs on with :func:`injected`.

The module is at the bottom of the layers (it imports nothing, not even
``os``), so the pure cores check a bug where their rule is kept:
``if bugs.on(Bug.COMMIT_WITHOUT_MAJORITY): ...``. With no bug on, the check
is one lookup in an empty frozenset.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

__all__ = [
    "ACKNOWLEDGEMENT",
    "ACK_VARIABLE",
    "BUGS_VARIABLE",
    "Bug",
    "BugSwitchError",
    "active",
    "from_environment",
    "injected",
    "install",
    "on",
    "parse",
]

BUGS_VARIABLE = "KQ_INJECT_BUGS"
ACK_VARIABLE = "KQ_INJECT_BUGS_ACK"
ACKNOWLEDGEMENT = "this-build-loses-data"


class Bug(enum.Enum):
    """A rule broken on purpose: ``(id, name)``; the comment says which rule
    and which check is expected to catch it."""

    def __init__(self, bug_id: str, title: str) -> None:
        self.id = bug_id
        self.title = title

    # -- the quorum (Raft, the thesis's sections) ----------------------------------------------
    # §3.6.2: the leader commits an entry once it is in its own log, without
    # a majority; a failover loses acknowledged writes.
    COMMIT_WITHOUT_MAJORITY = ("Q1", "commit-without-majority")
    # §3.4: a voter grants a second vote in an epoch it already voted in
    # (for another candidate); two leaders of one epoch.
    DOUBLE_VOTE = ("Q2", "double-vote")
    # §3.4 and Figure 3.1 (votedFor is persistent state): the vote is not
    # persisted, so a restarted voter may vote again in the same epoch.
    FORGET_VOTE = ("Q3", "forget-vote")
    # §6.4: a linearizable read is served from the local state without the
    # read barrier (no commit in the leader's term, no quorum check); a
    # deposed leader serves stale reads.
    READ_WITHOUT_BARRIER = ("Q4", "read-without-barrier")
    # §3.8 and §11.7: an entry is acknowledged (counted toward the commit)
    # before it is fsynced; a power loss on a majority loses it.
    ACK_BEFORE_FSYNC = ("Q5", "ack-before-fsync")

    # -- the brokers (brokers.md §5.7) ------------------------------------------------------------
    # B1, pre-KIP-101: a follower truncates its log to its HW when it starts
    # following; lost-write under kill-leader and restart.
    TRUNCATE_TO_HW_ON_BECOME_FOLLOWER = ("B1", "truncate-to-hw-on-become-follower")
    # B2, KIP-101 before KIP-279 (KAFKA-6361): truncation by offset, not by
    # the leader's end offset of the diverging epoch; inconsistent-offsets.
    TRUNCATE_BY_OFFSET = ("B2", "truncate-by-offset")
    # B3, KIP-279: a new leader does not record (epoch, LEO) in its epoch
    # cache; a follower's divergence check answers wrongly.
    NO_EPOCH_START_ENTRY = ("B3", "no-epoch-start-entry")
    # B4, KAFKA-7128: a follower rejoins the ISR on LEO >= HW alone, not also
    # at least the leader epoch's start offset; lost-write after a failover.
    EXPAND_WITHOUT_EPOCH_START = ("B4", "expand-without-epoch-start")
    # B5: the HW is the leader's LEO (the ISR ignored); acks=all is answered
    # at the append; lost-write on a leader kill.
    HW_AT_LEADER_LEO = ("B5", "hw-at-leader-leo")
    # B6, KAFKA-15583: the HW advances while the ISR is below
    # min.insync.replicas (acks=all is still refused at the append: R10
    # breaks that too); records consumed from the leader alone are lost
    # when it loses power and an eligible replica leads (isolated
    # followers, then a power loss).
    HW_UNDER_MIN_ISR = ("B6", "hw-under-min-isr")
    # B7, KIP-497: a pending ISR shrink counts toward the HW before the
    # controller committed it; lost-write when the AlterPartition fails.
    PENDING_SHRINK_COUNTS = ("B7", "pending-shrink-counts")
    # B8, KIP-841: fenced, shutting-down or stale-epoch replicas are taken
    # into the ISR; lost-write after a restart and a failover.
    EXPAND_WITH_INELIGIBLE = ("B8", "expand-with-ineligible")
    # B9 (a positive control): the controller elects an out-of-sync replica
    # when no ISR member is alive; lost-write by design.
    UNCLEAN_ELECTION = ("B9", "unclean-election")
    # B10, KAFKA-2334: consumers read up to the LEO instead of the HW; a
    # polled value is later truncated and its offset reused.
    CONSUME_TO_LEO = ("B10", "consume-to-leo")
    # B11: no idempotence window; a retried batch is appended twice
    # (duplicate).
    NO_DEDUP_WINDOW = ("B11", "no-dedup-window")
    # B12, Redpanda #3039: a retried batch already in the window is refused
    # with OUT_OF_ORDER_SEQUENCE instead of answered as a duplicate; the
    # client resends it under a new sequence (duplicate).
    OUT_OF_ORDER_FOR_DUPLICATE = ("B12", "out-of-order-for-duplicate")
    # B13: appends stay in a process buffer, not written to the OS, when the
    # produce is answered; lost-write under kill -9 of every replica.
    UNFLUSHED_APPEND = ("B13", "unflushed-append")
    # B14: recovery trusts a segment without checking the CRCs; a corrupt
    # tail is served (inconsistent-offsets after a bit flip).
    RECOVERY_SKIPS_CRC = ("B14", "recovery-skips-crc")
    # B15: retention deletes segments above the HW; unseen and lost-write.
    RETENTION_ABOVE_HW = ("B15", "retention-above-hw")
    # B16: compaction renumbers the records it keeps; inconsistent-offsets
    # and nonmonotonic-poll.
    COMPACTION_RENUMBERS = ("B16", "compaction-renumbers")

    # -- consumer groups (brokers.md §4) --------------------------------------------------------
    # B17, KAFKA-20634: an OffsetCommit is answered as soon as its records
    # are in the coordinator's log, before the offsets partition's HW passes
    # them; a leader change loses an acknowledged commit (commit-lost).
    COMMIT_BEFORE_HW = ("B17", "commit-before-hw")
    # B19, Redpanda CORE-16998: a broker that leads an offsets partition
    # again reuses the groups it held in memory from its earlier leadership
    # instead of rebuilding them from the log below the HW; the commits made
    # at the other leader meanwhile are gone from its answers (commit-lost,
    # commit-backwards).
    GROUP_STATE_FROM_MEMORY = ("B19", "group-state-from-memory")
    # B20, KIP-848 (CurrentAssignmentBuilder): reconciliation gives a
    # partition to its new owner while the old owner still holds it
    # (assigned, or pending revocation); two consumers read and commit one
    # partition at once (commit-backwards, commit-lost).
    ASSIGN_BEFORE_REVOKE = ("B20", "assign-before-revoke")
    # -- transactions (brokers.md, "Transactions") --------------------------------------------
    # B21: the coordinator completes a commit once the first of its
    # partitions has the COMMIT marker; the others keep the transaction open,
    # their last stable offset stops there (torn-transaction, no-loss).
    PARTIAL_COMMIT_MARKERS = ("B21", "partial-commit-markers")
    # B22 (KAFKA-18042's rule): a leader takes a transactional batch of an
    # epoch older than its producer's as the producer's own: the open
    # transaction of a newer epoch lets it skip verification, and the epoch
    # check appends it; a fenced zombie's write joins its successor's
    # transaction (torn-transaction, G1a).
    FENCED_EPOCH_PRODUCE = ("B22", "fenced-epoch-produce")
    # B23: a partition's last stable offset is its high watermark, past the
    # transactions still open there; read_committed readers see records of
    # transactions that later abort (G1a, aborted_read).
    LSO_PAST_OPEN_TXN = ("B23", "lso-past-open-txn")
    # B24, KIP-890 part 1 turned off: a leader appends a transactional batch
    # without asking the coordinator whether its partition is in the
    # producer's transaction; a buggy client's write to a partition it never
    # added opens a transaction there that no marker ends (no-loss,
    # torn-transaction: the hanging transaction).
    NO_TXN_VERIFICATION = ("B24", "no-txn-verification")
    # R2, KIP-101 scenario 2 (KIP-595's check removed): the leader answers a
    # follower's fetch at its offset without checking the last fetched
    # epoch; replicas diverge below the HW after a double power loss.
    NO_DIVERGENCE_CHECK = ("R2", "no-divergence-check")
    # R9, KIP-966: the controller keeps no eligible leader replicas, so the
    # last ISR member is the only clean candidate; lost-write when it loses
    # power with an unsynced tail.
    NO_ELR = ("R9", "no-elr")
    # R10, Jepsen's Kafka 0.8 test: min.insync.replicas is ignored (taken as
    # 1); acks=all is accepted and acknowledged by a leader alone, lost when
    # it dies.
    IGNORE_MIN_ISR = ("R10", "ignore-min-isr")
    # B18: the test client records NOT_LEADER_OR_FOLLOWER after sending as a
    # definite failure; a harness bug that G1a must expose.
    HARNESS_NOT_LEADER_AS_FAIL = ("B18", "harness-not-leader-as-fail")


class BugSwitchError(ValueError):
    """The bug switch was given what it cannot accept (an unknown bug, or
    bugs without the acknowledgement)."""


_BY_KEY: dict[str, Bug] = {
    **{b.id.lower(): b for b in Bug},
    **{b.title: b for b in Bug},
    **{b.name.lower(): b for b in Bug},
}

_active: frozenset[Bug] = frozenset()


def on(bug: Bug) -> bool:
    """Whether ``bug`` is on in this process."""
    return bug in _active


def active() -> frozenset[Bug]:
    """The bugs on in this process."""
    return _active


def parse(names: str | Iterable[str]) -> frozenset[Bug]:
    """Bugs from ids or names (``"B1,hw-at-leader-leo"``); an unknown one is
    named in the error."""
    items = names.split(",") if isinstance(names, str) else list(names)
    found: set[Bug] = set()
    for raw in items:
        key = raw.strip().lower()
        if not key:
            continue
        bug = _BY_KEY.get(key)
        if bug is None:
            known = ", ".join(f"{b.id} ({b.title})" for b in Bug)
            raise BugSwitchError(f"unknown bug {raw.strip()!r}; the bugs are: {known}")
        found.add(bug)
    return frozenset(found)


def from_environment(env: Mapping[str, str]) -> frozenset[Bug]:
    """The bugs ``env`` turns on: none unless ``KQ_INJECT_BUGS`` names some,
    and then only if ``KQ_INJECT_BUGS_ACK`` acknowledges that the process
    will lose data."""
    bugs = parse(env.get(BUGS_VARIABLE, ""))
    if bugs and env.get(ACK_VARIABLE) != ACKNOWLEDGEMENT:
        raise BugSwitchError(
            f"{BUGS_VARIABLE} turns on deliberate bugs "
            f"({', '.join(sorted(b.id for b in bugs))}) that lose or corrupt data; "
            f"refusing to start unless {ACK_VARIABLE}={ACKNOWLEDGEMENT}"
        )
    return bugs


def install(bugs: Iterable[Bug]) -> None:
    """Turn exactly ``bugs`` on in this process (a process's start, from
    :func:`from_environment`)."""
    global _active
    _active = frozenset(bugs)


@contextmanager
def injected(*bugs: Bug) -> Iterator[None]:
    """Turn ``bugs`` on for the body (tests), then restore what was on."""
    global _active
    before = _active
    _active = before | frozenset(bugs)
    try:
        yield
    finally:
        _active = before

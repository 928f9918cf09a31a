"""The catalogue of deliberate bugs: the proof that kq's checks can fail.

Every member of :class:`bugs.Bug` has a :class:`Recipe` in :data:`RECIPES`:
the workload (``queue`` on the brokers, ``register`` on the quorum's
key-value store), the nemesis faults and the flags that expose the bug on a
real cluster (acks, min ISR, replication factor, a short
``replica.lag.time.max.ms``, the rate), the checks expected to fire, and a
budget of runs.  :func:`run_catalogue` runs each bug's recipe with that bug
on (``RunConfig.bugs``: the controllers' and brokers' environment, or the
chaos client itself for a harness bug) until a check fires or the budget is
spent, verifies every run with a :data:`Verifier` (the Spark job of ``kq
chaos run --verify``), then runs the same recipes with no bug.

The verdict of a catalogue (:class:`Catalogue`): a bug that no check caught
within its budget is a *finding*, listed, never hidden; a clean run in which
any check fired is a *false alarm*, and so is a clean run that gave no
verdict (the catalogue cannot vouch for it).  The catalogue passes only
with neither.  A *benign* bug (a recipe with ``benign`` set) is one shown,
by a test on the broker simulator, to lose and misplace nothing in kq's
protocol: no check can rightly fire on it, so it is left out of the
default selection, and when chosen its runs are negative controls, where a
check firing (or no verdict) is a finding too.  The reference's list of
bugs and their expected anomalies is
Jepsen's Kafka workload and the brokers' notes (§5.7, B1-B18; §4 for the
consumer groups' B17, B19 and B20); the quorum's
bugs break Raft's rules (§3.4, §3.6.2, §3.8, §6.4 of Ongaro's thesis).

A library: ``kq chaos catalogue`` (:mod:`kq.commands.chaos`) adapts it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bugs import Bug
from chaos.runner import RunConfig, RunResult, expand_nemesis, run_chaos
from chaos.workloads.queue_setup import GROUP_ID, QueueOptions

__all__ = [
    "RECIPES",
    "RECIPE_IDS",
    "BatchVerifier",
    "BugResult",
    "Catalogue",
    "Recipe",
    "RunOutcome",
    "Verifier",
    "bug_order",
    "default_bugs",
    "fired_checks",
    "recipe_table",
    "render_table",
    "run_catalogue",
    "run_view",
]

Verifier = Callable[[Path], Mapping[str, Any]]
"""Verifies one run folder and returns its verdict (``verdict.json``'s
object: ``checks`` by name, each with ``valid``); raises if it cannot."""
BatchVerifier = Callable[[Sequence[Path]], Mapping[str, Any]]
"""Verifies run folders together, in one job: its verdict has a row per run
(``runs``: ``path``, ``verdict``, ``failed``); raises if it cannot."""

RunFn = Callable[[RunConfig], Awaitable[RunResult]]
"""Runs one chaos run (:func:`chaos.runner.run_chaos`)."""

HARNESS_FINAL_CHECK: Final = "final-check"
"""The name a fired harness final check (the workload's own final reads,
``summary.json``'s ``final_check``) gets among the Spark checks."""


@dataclass(frozen=True, slots=True)
class Recipe:
    """How to expose a bug: ``workload`` with the ``nemesis`` names of
    ``kq chaos run --nemesis`` for ``time_limit_s``, at ``rate`` by
    ``concurrency`` clients on ``controllers`` controllers (and, for
    ``queue``, ``brokers`` brokers); for ``queue``, the topic's ``partitions``,
    ``replication_factor`` and ``min_isr``, the producer's ``acks`` and the
    cluster's ``replica_lag_ms``; ``op_timeout_s`` and ``client_timeout_s``
    as ``RunConfig``'s (the queue producer's delivery and request
    timeouts derive from them).  ``expected``: the checks that should
    fire; ``budget``: runs before the bug counts as not caught; ``note``:
    why these faults (or what the recipe still lacks); ``benign``: why the
    bug cannot lose or misplace a record in kq and the test that shows it
    (then ``expected`` is empty: its runs are negative controls)."""

    workload: str
    nemesis: tuple[str, ...]
    expected: tuple[str, ...]
    budget: int = 3
    time_limit_s: float = 15.0
    rate: float = 30.0
    concurrency: int = 3
    partitions: int = 2
    replication_factor: int = 3
    min_isr: int = 2
    acks: str = "all"
    replica_lag_ms: int = 1_500
    final_time_s: float = 20.0
    fault_interval_s: float = 1.5
    fault_period_s: float = 10.0
    quiet_s: float = 2.0
    keys: int = 3
    controllers: int = 3
    brokers: int = 3
    op_timeout_s: float = 5.0
    client_timeout_s: float = 2.0
    note: str = ""
    # register: each client bound to one node (RunConfig.pin_clients).
    pin_clients: bool = False
    # The queue topics' cleanup (QueueOptions): retention and compaction.
    cleanup_policy: str = "delete"
    retention_bytes: int | None = None
    segment_bytes: int | None = None
    record_keys: int = 0
    # The cluster's replica.fetch.max.bytes (QueueOptions); None: Kafka's.
    replica_fetch_max_bytes: int | None = None
    # queue: the consumers subscribe in one consumer group (QueueOptions.group).
    group: bool = False
    # queue: transactions (QueueOptions.transactional, zombie) and the
    # consumers' isolation (read_committed).
    transactional: bool = False
    zombie: bool = False
    # queue: the misbehaving client's chance of a send to a partition it never
    # added to its transaction (QueueOptions.unadded_sends).
    unadded_sends: float = 0.0
    # queue, with zombie: the zombie's stall between micro-ops
    # (QueueOptions.zombie_pause_ms).
    zombie_pause_ms: int = 0
    read_committed: bool = False
    benign: str = ""

    def __post_init__(self) -> None:
        # Invariant: a bug either has checks that must fire or is benign.
        if bool(self.benign) == bool(self.expected):
            raise ValueError("a recipe names the checks expected to fire, or why it is benign")

    def describe(self) -> str:
        """One line for a table: workload, faults, flags, time and budget."""
        faults = ",".join(self.nemesis) or "none"
        flags = ""
        if self.workload == "queue":
            flags = (
                f" acks={self.acks} rf={self.replication_factor} min-isr={self.min_isr}"
                f" lag={self.replica_lag_ms / 1000:g}s"
            )
        nodes = f" controllers={self.controllers}" if self.controllers != 3 else ""
        if self.workload == "queue" and self.brokers != 3:
            nodes += f" brokers={self.brokers}"
        if self.workload == "queue":
            words = self._queue().topic_flags().split()
            for i, word in enumerate(words):
                if not word.startswith("--"):
                    continue
                value = words[i + 1] if i + 1 < len(words) else ""
                if value and not value.startswith("--"):
                    nodes += f" {word.lstrip('-')}={value}"
                else:
                    nodes += f" {word.lstrip('-')}"
        if self.pin_clients:
            nodes += " pinned-clients"
        if (self.op_timeout_s, self.client_timeout_s) != (5.0, 2.0):
            nodes += f" timeouts={self.op_timeout_s:g}/{self.client_timeout_s:g}s"
        return (
            f"{self.workload} {faults}{flags}{nodes} {self.rate:g}/s "
            f"{self.time_limit_s:g}s x{self.budget}"
        )

    def _queue(self) -> QueueOptions:
        return QueueOptions(
            brokers=self.brokers,
            partitions=self.partitions,
            replication_factor=self.replication_factor,
            min_isr=self.min_isr,
            acks=self.acks,
            final_time_s=self.final_time_s,
            replica_lag_ms=self.replica_lag_ms,
            cleanup_policy=self.cleanup_policy,
            retention_bytes=self.retention_bytes,
            segment_bytes=self.segment_bytes,
            record_keys=self.record_keys,
            replica_fetch_max_bytes=self.replica_fetch_max_bytes,
            group=GROUP_ID if self.group else None,
            transactional=self.transactional,
            zombie=self.zombie,
            unadded_sends=self.unadded_sends,
            zombie_pause_ms=self.zombie_pause_ms,
            isolation_level="read_committed" if self.read_committed else "read_uncommitted",
        )

    def config(
        self,
        *,
        name: str,
        bugs: frozenset[Bug],
        seed: int,
        runs_dir: str,
        backend: str = "local",
    ) -> RunConfig:
        """The run of this recipe with ``bugs`` on."""
        nodes = self.controllers
        queue = self._queue()
        brokers = queue.brokers if self.workload == "queue" else 0
        return RunConfig(
            name=name,
            backend=backend,
            workload=self.workload,
            faults=tuple(expand_nemesis(self.nemesis, nodes + brokers)),
            nodes=nodes,
            time_limit_s=self.time_limit_s,
            rate=self.rate,
            concurrency=self.concurrency,
            keys=self.keys,
            store="kv",
            pin_clients=self.pin_clients,
            seed=seed,
            runs_dir=runs_dir,
            fault_interval_s=self.fault_interval_s,
            fault_period_s=self.fault_period_s,
            quiet_s=self.quiet_s,
            op_timeout_s=self.op_timeout_s,
            client_timeout_s=self.client_timeout_s,
            queue=queue,
            bugs=bugs,
        )


_ISR_CHURN: Final = ("isolate-follower", "kill-partition-leader")
_LOSS: Final = ("lost-write", "no-loss")
# Leadership moved by preferred elections with every node up, also while a
# follower is cut off (and still in the ISR), when a purgatory holds produces.
_ISR_MOVES: Final = ("isolate-follower", "elect-leader")


# Faults that outlast the brokers' session (controller.broker_session_timeout_ms,
# 4 s in a chaos run), so that a paused or cut-off leader is fenced and its
# partitions move while it still holds appends.
_LONG_FAULTS: Final[dict[str, Any]] = {
    "time_limit_s": 30.0,
    "fault_interval_s": 6.0,
    "fault_period_s": 20.0,
}
# A follower cut off (isolate-follower) stays in the ISR for the 2 s lag, so
# the leader's purgatory holds every acks=all produce it appended; at the 1 s
# request timeout it answers REQUEST_TIMED_OUT and the producer retries the
# batch with its sequence, to a leader that holds it.
_HELD_RETRIES: Final[dict[str, Any]] = {
    "time_limit_s": 30.0,
    "replica_lag_ms": 2_000,
    "client_timeout_s": 1.0,
}
# Preferred elections every 0.25 to 0.75 s: a follower that a partition
# change made truncate is elected before it fetched back.
_FAST_ELECTIONS: Final[dict[str, Any]] = {
    "time_limit_s": 30.0,
    "rate": 60.0,
    "concurrency": 6,
    "fault_interval_s": 0.5,
    "fault_period_s": 14.0,
    "quiet_s": 1.0,
}
# One controller: a fault on one node of four, rather than of six, then
# hits a partition's leader half of the time.
_ONE_CONTROLLER: Final[dict[str, Any]] = {"controllers": 1}
# Two strands a run (chaos.nemesis.STRAND_KINDS: each about 14 s from the
# followers' cut to the leader's restart, which takes a few seconds more).
_STRANDS: Final[dict[str, Any]] = {"time_limit_s": 40.0}

_BY_ID: Final[Mapping[str, Recipe]] = {
    # -- the quorum: the register workload on the key-value store, whose
    # reads carry versions, failing over the metadata quorum's leader.
    "Q1": Recipe(  # commit-without-majority
        "register",
        ("isolate-leader",),
        ("linearizable", "lost-writes", "log-agreement"),
        note="an isolated leader commits alone, the clients still reaching it; the "
        "majority elects another and its acknowledged writes vanish",
        **_LONG_FAULTS,
    ),
    "Q2": Recipe(  # double-vote
        "register",
        ("kill-leader",),
        ("single-leader", "linearizable", "log-agreement"),
        note="two candidates of one epoch, and voters that grant both: leaders killed "
        "in a quorum of five, whose four survivors each campaign a random moment (under "
        "half the election timeout) after the connection to the dead leader is refused, "
        "so that now and then two of them become candidates of the next epoch before "
        "either's request reaches the other, and the two others vote for both. With "
        "three voters the two survivors are the only candidates and no voter is left "
        "to vote twice",
        controllers=5,
        time_limit_s=30.0,
        fault_interval_s=1.5,
        fault_period_s=10.0,
    ),
    "Q3": Recipe(  # forget-vote
        "register",
        ("kill", "kill-leader"),
        ("vote-durability",),
        note="voters and leaders killed in a quorum of five, each back in the epoch it "
        "voted in (a leader voted for itself): vote-durability finds each start that "
        "restored that epoch without the vote, and the stored states without theirs. A "
        "second vote in the same epoch (single-leader) stays rare: a candidate asks a voter "
        "again only if it never answered, a voter that granted learns the winner within a "
        "round trip, and a candidacy ends within two election timeouts while a restart "
        "takes about a second",
        controllers=5,
        time_limit_s=30.0,
        fault_interval_s=1.5,
        fault_period_s=10.0,
    ),
    "Q4": Recipe(  # read-without-barrier
        "register",
        ("isolate-leader",),
        ("linearizable", "stale-reads"),
        note="a deposed, isolated leader answers linearizable reads from its own state "
        "while the new one takes writes. Clients pinned to nodes, as Jepsen binds them: "
        "clients that follow the leader leave the isolated one once their writes time "
        "out, so none asked it for a read in the moments between the new leader's "
        "election and its check-quorum resignation; pinned, three of nine still ask it. "
        "Short client deadlines (0.5 s) free them from writes that cannot commit there",
        pin_clients=True,
        concurrency=9,
        rate=90.0,
        keys=2,
        op_timeout_s=1.0,
        client_timeout_s=0.5,
        **_LONG_FAULTS,
    ),
    "Q5": Recipe(  # ack-before-fsync
        "register",
        ("power-loss", "kill-majority"),
        ("lost-writes", "linearizable"),
        note="entries counted before they are synced: a majority losing power at once "
        "(kill-majority, in a run with power loss every kill drops what was not synced) "
        "takes acknowledged entries that no survivor had synced. Nodes losing power one "
        "at a time (power-loss, kill-leader) lose nothing: the others hold every entry. "
        "30 s, so that several majorities lose power (a run of 15 s had one, which spared "
        "the leader, and lost nothing)",
        time_limit_s=30.0,
    ),
    # -- the brokers: the queue workload (Jepsen's Kafka workload).
    "B1": Recipe(  # truncate-to-hw-on-become-follower
        "queue",
        ("elect-leader",),
        ("inconsistent-offsets", *_LOSS),
        note="KIP-101's first scenario without a crash: every partition change (the "
        "election's reorder, then the election) makes each follower truncate to its own HW, "
        "which lags the leader's by a fetch; preferred elections every 0.25 to 0.75 s elect "
        "such a follower before it fetched back what it cut, and the records acknowledged "
        "between its HW and the leader's are gone",
        **_FAST_ELECTIONS,
    ),
    "B2": Recipe(  # truncate-by-offset
        "queue",
        ("sever-partition-leader", "elect-leader"),
        ("inconsistent-offsets", *_LOSS),
        note="KIP-279: divergent tails kept where the epochs differ. It needs a leader "
        "whose epoch no other replica fetched, a follower that led in the next epoch at "
        "the same offsets, and that leader elected again: the follower asks it for an "
        "epoch it never had and, by offset, keeps its own tail below the leader's end of "
        "the epoch before.  A partition's leader is severed from the other brokers (its "
        "controller session kept, so it is not fenced and learns every election) while "
        "preferred elections every 0.25 to 0.75 s move the partition to a follower and "
        "back to it; one partition, so that every election is of the severed one, and a "
        "2 s lag, so that the severed leader stays in the new leader's ISR long enough to "
        "be elected back (the broker simulator's B2 scenario)",
        partitions=1,
        replica_lag_ms=2_000,
        **{**_FAST_ELECTIONS, "time_limit_s": 40.0, "fault_period_s": 18.0},
    ),
    "B3": Recipe(  # no-epoch-start-entry
        "queue",
        ("kill-partition-leader", "elect-leader"),
        (),
        note="KIP-279: a new leader without its (epoch, LEO) entry, asked by a follower "
        "for the end of an epoch it never started (the follower led in between, with "
        "writes nobody fetched): leaders killed and preferred elections every 0.25 to "
        "0.75 s, so that leaders alternate faster than followers fetch",
        benign="KIP-279's loss needs the follower to truncate by offset to the leader's "
        "answer; under KIP-320's fetch the leader answers an epoch it cannot place "
        "OFFSET_OUT_OF_RANGE, the follower truncates only to the leader's LEO when it is "
        "longer and otherwise waits, the leader counts no refused fetch toward the HW, and "
        "its first append of the epoch writes the missing entry, after which the "
        "divergence is found as without the bug: a stall until the next write "
        "(tests/broker/test_b3_epoch_start.py; KAFKA-20961 is the same stall in Kafka)",
        **_FAST_ELECTIONS,
    ),
    "B4": Recipe(  # expand-without-epoch-start
        "queue",
        ("elect-catching-up-follower",),
        _LOSS,
        note="KAFKA-7128: a follower back in the ISR before it reached the epoch start, "
        "then elected (the broker simulator's R4).  The composite fault makes the "
        "sequence: a follower severed from the other brokers until it is out of the ISR; "
        "the leader killed, so that the other follower leads, alone in the ISR below min "
        "ISR, with its HW frozen a fetch behind the old leader's; the heal once it leads, "
        "the severed follower catching up one batch every 200 ms (its own "
        "replica.fetch.max.bytes 1, KIP-74, and replica.fetch.min.bytes 64 KiB with "
        "replica.fetch.wait.max.ms 200, so that the leader holds each fetch); the other "
        "follower, until the election, "
        "fetching in chunks of a second (replica.fetch.min.bytes 64 KiB, "
        "replica.fetch.wait.max.ms 1000, below the 1.5 s lag time), so that its HW, learned "
        "a fetch late, lags its log end by a chunk and, once it leads, its epoch start by "
        "a few batches of each partition instead of one (the clients' acks=all sends wait "
        "for that HW, a send per client a chunk): paced, the re-admitted follower needs half "
        "a second or more to pass the epoch start, where fetching back to back it passed it "
        "within milliseconds, before the election (a run without chunks or pace made the "
        "sequence twice and lost nothing); and that follower elected as "
        "soon as the controllers show it back in the ISR, then the old leader restarted. "
        "In the broker simulator the bug then loses acknowledged records when the "
        "election reaches the follower before it has fetched up to the epoch start, and "
        "not when every follower fetches one batch at a time (the follower wins that "
        "race: tests/broker/test_sim_catch_up.py).  Earlier recipes moved leaders with "
        "every node up (isolate-follower, elect-leader): the old leader kept fetching, "
        "so the new leader's HW reached its epoch start within a fetch",
        rate=60.0,
        concurrency=6,
        time_limit_s=40.0,
        fault_interval_s=1.0,
        fault_period_s=30.0,
        quiet_s=1.0,
    ),
    "B5": Recipe(  # hw-at-leader-leo
        "queue",
        ("isolate-one",),
        _LOSS,
        rate=50.0,
        concurrency=6,
        brokers=2,
        replication_factor=2,
        note="acks=all answered at the append: a partition leader cut off from every "
        "other node (the clients still reach it) goes on acknowledging what no follower "
        "fetches, while the controllers fence it (cut off from them, its heartbeats stop) "
        "and elect its follower; healed, it truncates to the new leader's log and the "
        "acknowledged records are gone.  Cuts of 5 to 15 s outlast the 4 s session; one "
        "controller and two brokers each leading a partition, so that two node picks in "
        "three isolate a leader.  Killing leaders (5 runs) never caught it: a follower "
        "fetches within milliseconds of the append, so a kill almost never finds an "
        "acknowledged record it lacks",
        time_limit_s=40.0,
        fault_interval_s=10.0,
        fault_period_s=30.0,
        **_ONE_CONTROLLER,
    ),
    "B6": Recipe(  # hw-under-min-isr
        "queue",
        ("strand-power-loss-partition-leader",),
        _LOSS,
        note="KAFKA-15583: a leader stranded (its followers cut off, the ISR shrunk to it "
        "alone) still moves the HW over the batches they never fetched, commits and serves "
        "them; it loses power and a follower of the ELR leads without them",
        **_STRANDS,
    ),
    "B7": Recipe(  # pending-shrink-counts
        "queue",
        ("strand-isolated-power-loss-partition-leader",),
        (*_LOSS, "inconsistent-offsets"),
        min_isr=1,
        note="KIP-497: a partition leader cut off from its followers and from the "
        "controllers (the clients still reach it) asks to shrink the ISR to itself, and "
        "the request stays pending; with the bug the next append moves the HW over the "
        "batches no follower fetched and acknowledges them (min ISR 1, as the broker "
        "simulator's scenario), while the controllers fence the silent leader and elect a "
        "follower of the committed ISR, which never had them; the leader then loses power. "
        "With the strand that kept its controllers the shrink committed within "
        "milliseconds and nothing recomputed the HW under it (2 runs, not caught)",
        **_STRANDS,
    ),
    "B8": Recipe(  # expand-with-ineligible
        "queue",
        ("kill", "kill-partition-leader"),
        ("ineligible-isr",),
        note="KIP-841, KIP-903: a restarting or fenced replica taken into the ISR.  A "
        "restarted broker is taken back into a leader's ISR while the controllers still "
        "fence it (its new registration not yet unfenced): ineligible-isr finds it in the "
        "controllers' exports (partition changes against broker registrations, by "
        "offset).  No record is lost under these faults (the replica holds every record "
        "below the HW): a loss needs the broker simulator's scenario, a power loss inside "
        "the AlterPartition's round trip and then both other ISR members failing at once",
    ),
    "B9": Recipe(  # unclean-election
        "queue",
        ("strand-partition-leader",),
        _LOSS,
        min_isr=1,
        note="positive control: with min ISR 1 a stranded leader (the ISR shrunk to it) "
        "acknowledges sends alone; it is killed, and the controllers elect a cut-off "
        "follower (unfenced: the strand keeps the followers' controller sessions) that "
        "never had them",
        **_STRANDS,
    ),
    "B10": Recipe(  # consume-to-leo
        "queue",
        _ISR_MOVES,
        ("inconsistent-offsets", "duplicate", "nonmonotonic-poll", "G1a", "no-loss"),
        time_limit_s=30.0,
        rate=60.0,
        concurrency=6,
        fault_interval_s=1.0,
        fault_period_s=14.0,
        quiet_s=1.0,
        note="KAFKA-2334: a poll reads past the HW: while a follower is cut off (still in "
        "the ISR for 1.5 s) the leader's tail waits uncommitted and polls read it; an "
        "election then moves the leadership to a replica without that tail (the cut-off "
        "follower, or one that had not fetched it), the old leader truncates it and the "
        "retried sends land at other offsets",
    ),
    "B11": Recipe(  # no-dedup-window
        "queue",
        ("isolate-follower",),
        ("duplicate",),
        note="a retried batch appended again: a follower cut off stays in the ISR for the "
        "2 s lag, so the leader's purgatory holds every acks=all produce it appended and "
        "answers REQUEST_TIMED_OUT at the 1 s request timeout; the producer retries each "
        "with its sequence and the leader, which holds it, appends it again.  Pauses of "
        "partition leaders (3 runs) made no retry: the broker answers a produce itself at "
        "its timeout, and the producer's call outlasts the pause by 5 s more",
        **_HELD_RETRIES,
    ),
    "B12": Recipe(  # out-of-order-for-duplicate
        "queue",
        ("isolate-follower",),
        ("duplicate",),
        note="Redpanda #3039: the retries of held produces (as B11's) are refused "
        "OUT_OF_ORDER_SEQUENCE_NUMBER instead of answered as duplicates; the producer "
        "reads that as Kafka's does (a bump, and the batches resent from sequence 0 of "
        "the new epoch) and the leader appends them again.  kq's stricter reading would "
        "fail them as info and hide the bug, so the queue workload runs Kafka's",
        **_HELD_RETRIES,
    ),
    "B13": Recipe(  # unflushed-append
        "queue",
        ("kill-majority",),
        _LOSS,
        note="appends kept in the process: only a kill of every replica of a partition at "
        "once loses them (a follower holds what it fetched).  One controller and three "
        "brokers, three partitions of two replicas (acks=all, min ISR 2): a kill of three "
        "of the four nodes takes both replicas of at least one partition every time; its "
        "last known leader (KIP-966) leads it again after the restart.  A kill of one "
        "leader, or of six nodes' majority, rarely does (its earlier recipe)",
        partitions=3,
        replication_factor=2,
        time_limit_s=30.0,
        **_ONE_CONTROLLER,
    ),
    "B14": Recipe(  # recovery-skips-crc
        "queue",
        ("torn-power-loss-partition-leader",),
        ("replica-divergence", "unseen", "no-loss"),
        rate=60.0,
        concurrency=4,
        time_limit_s=30.0,
        note="a torn tail: partition leaders lose power and come back with a random "
        "prefix of their unsynced segment tails, some sectors of it zeroed (each loss tears "
        "every partition the broker holds).  A correct recovery cuts at the first damaged "
        "batch; the bug keeps the batch whose header survived and whose records did not, "
        "at offsets its replica then fetches past: the exports show that replica differing "
        "from the others below the HW, and once it leads, consumers refuse the batch's CRC "
        "and cannot poll past it.  A plain power loss leaves only whole synced batches, "
        "with nothing damaged for the CRC to catch",
        **_ONE_CONTROLLER,
    ),
    "B15": Recipe(  # retention-above-hw
        "queue",
        ("isolate-follower",),
        ("log-start-above-hw",),
        rate=80.0,
        concurrency=4,
        acks="1",
        min_isr=1,
        segment_bytes=256,
        retention_bytes=512,
        note="retention by size on segments of a few batches: while a cut-off follower "
        "holds the HW back (until it leaves the ISR), acks=1 sends go on growing the "
        "leader's log past retention.bytes above the HW, and the bug deletes segments the "
        "HW has not reached (acks=all sends would wait for the HW instead; min ISR 1 lets "
        "the HW move on with the leader alone, as a follower that fell below the log start "
        "does not come back)",
    ),
    "B16": Recipe(  # compaction-renumbers
        "queue",
        ("kill-partition-leader",),
        ("inconsistent-offsets", "duplicate", "no-loss"),
        rate=60.0,
        concurrency=4,
        cleanup_policy="compact",
        segment_bytes=256,
        record_keys=16,
        note="a compacted topic of segments of a few batches, values cycling through 16 "
        "record keys: the cleaner removes a batch's superseded records and the bug gives "
        "the ones it keeps the offsets of those before them",
    ),
    # -- consumer groups: the queue workload's consumers subscribe in one
    # group and commit (QueueOptions.group); the Spark group checks judge
    # each key's commits against where the group later starts a consumer.
    "B17": Recipe(  # commit-before-hw
        "queue",
        ("isolate-coordinator",),
        ("commit-lost",),
        group=True,
        rate=20.0,
        concurrency=4,
        partitions=6,
        op_timeout_s=10.0,
        brokers=2,
        replication_factor=2,
        min_isr=1,
        note="KAFKA-20634: commits answered at the append, before the offsets partition's "
        "HW passes them.  The group's coordinator cut off from every other node (the "
        "clients still reach it) goes on acknowledging commits that no follower fetches, "
        "while the controllers fence it and elect its follower; that one loads the group "
        "once the heal lets its HW pass its epoch start (min ISR 2), without them, and the "
        "members that come over from the cut-off coordinator are given their keys from "
        "below what was acknowledged.  One controller and two brokers; the queue "
        "partitions the cut-off broker led go to the other once it is fenced, and the "
        "producers follow (a REQUEST_TIMED_OUT refreshes their metadata), so the workers "
        "go on sending, reading and committing new offsets through the cut (min ISR 1 on "
        "the queue topic: the other broker's partitions take sends once their ISR has "
        "shrunk to it).  Cuts of 8 to 24 s, past the brokers' 4 s session.  Not caught by "
        "isolate-one in 4 runs (its cuts hit the controller two times in three), nor by "
        "this fault while the producers kept retrying at the cut-off leader (their "
        "sends blocked the workers for the whole cut)",
        time_limit_s=45.0,
        fault_interval_s=16.0,
        fault_period_s=35.0,
        **_ONE_CONTROLLER,
    ),
    "B19": Recipe(  # group-state-from-memory
        "queue",
        ("elect-leader",),
        ("commit-lost", "commit-backwards"),
        group=True,
        rate=60.0,
        concurrency=6,
        time_limit_s=40.0,
        fault_interval_s=1.5,
        fault_period_s=18.0,
        quiet_s=1.0,
        note="Redpanda CORE-16998: a broker that leads an offsets partition again answers "
        "from the groups it held when it last led it, not from the log.  Preferred "
        "elections every 0.75 to 2.25 s, in a group run of the queue partitions and of "
        "the offsets topic's (chaos.runner.fault_topics), move the group's coordinator "
        "among the three brokers, all up, every 7 s or so, and soon back to one that led "
        "it before: the commits made at the others meanwhile are missing there, and the "
        "members that joined or moved since are unknown or fenced there and rejoin, their "
        "keys starting at the remembered offsets.  Elections every 0.25 to 0.75 s (1 run, "
        "not caught) moved the coordinator faster than the 6 s session: every load "
        "restarts the sessions, so crashed members kept their keys and the group stopped "
        "assigning.  A kill would not show it: a restarted broker has no memory",
    ),
    "B20": Recipe(  # assign-before-revoke
        "queue",
        ("elect-leader",),
        ("commit-backwards", "commit-lost"),
        group=True,
        partitions=6,
        rate=60.0,
        concurrency=4,
        time_limit_s=30.0,
        note="KIP-848: a partition given to its new owner while the old owner still holds "
        "it.  Four members of one group on six partitions: a crashed worker's new process "
        "joins at once, while the crashed member keeps its partitions until its session "
        "ends 6 s later, so the target gives the newcomer a partition of a live member; "
        "with the bug the newcomer starts it at the last commit at once, while the old "
        "owner reads on and commits until its next heartbeat (every second) tells it to "
        "revoke, so both commit the key and its commits go back.  With fewer partitions "
        "than members a join moves nothing from a live member (the holders keep theirs). "
        "Preferred elections every 1.5 s or so, which stop no process: with kills of "
        "partition leaders (1 run, not caught) the workers waited out sends to the killed "
        "broker and made 14 commits in 30 s; the run had newcomers given keys a second "
        "before their old owner revoked them, but no commit of the old owner in between",
        fault_interval_s=1.5,
    ),
    "B21": Recipe(  # partial-commit-markers
        "queue",
        ("kill-partition-leader",),
        ("torn-transaction", "no-loss"),
        transactional=True,
        read_committed=True,
        partitions=3,
        rate=30.0,
        concurrency=4,
        time_limit_s=30.0,
        note="a commit completed with its first partition's COMMIT marker: every "
        "transaction of two partitions or more leaves the others open, where the last "
        "stable offset stops; read_committed final reads see one partition's records of "
        "an acknowledged commit and none of the others'.  Kills of partition leaders "
        "only add aborts; the bug needs no fault",
    ),
    "B22": Recipe(  # fenced-epoch-produce
        "queue",
        ("elect-leader",),
        ("torn-transaction", "G1a"),
        transactional=True,
        zombie=True,
        zombie_pause_ms=300,
        read_committed=True,
        partitions=1,
        rate=40.0,
        concurrency=2,
        time_limit_s=40.0,
        note="a zombie's write joins its successor's transaction: two workers share one "
        "transactional id and each one's InitProducerId fences the other mid-transaction "
        "(the coordinator aborts it); the fenced one goes on sending to a partition it "
        "added, where its successor's transaction is open by then, and the bug skips the "
        "verification and the epoch check for it.  The successor commits the record, the "
        "zombie's earlier records stay aborted (torn-transaction), or the zombie's next "
        "AddPartitionsToTxn is fenced and its transaction fails with a record committed "
        "(G1a).  Two partitions, so that the two mostly write the same ones; preferred "
        "elections only move leaders",
    ),
    "B23": Recipe(  # lso-past-open-txn
        "queue",
        ("kill-partition-leader",),
        ("G1a", "precommitted-read"),
        transactional=True,
        zombie=True,
        read_committed=True,
        partitions=3,
        rate=40.0,
        concurrency=4,
        time_limit_s=30.0,
        note="the last stable offset taken as the high watermark: read_committed polls "
        "return records of transactions still open, a transaction's own sends to its "
        "own poll (precommitted-read), and records of transactions that then abort "
        "(G1a): two clients share a transactional id and fence each other's, and kills "
        "of partition leaders fail sends, so transactions abort all through a run",
    ),
    "B24": Recipe(  # no-txn-verification
        "queue",
        ("elect-leader",),
        ("no-loss", "torn-transaction"),
        transactional=True,
        unadded_sends=0.05,
        read_committed=True,
        partitions=3,
        rate=30.0,
        concurrency=4,
        time_limit_s=30.0,
        note="KIP-890 part 1 off, with its buggy client: one send in twenty goes to a "
        "partition the client never added to its transaction.  With the check the leader "
        "refuses it and the transaction fails; without it the record opens a transaction "
        "the coordinator does not know of, no marker ends it, and the partition's last "
        "stable offset stays there: the read_committed final reads miss every later "
        "commit of the partition (no-loss) and the rest of that record's own commit "
        "(torn-transaction).  Preferred elections only move leaders",
    ),
    "R2": Recipe(  # no-divergence-check
        "queue",
        ("isolate-one",),
        ("replica-divergence", "inconsistent-offsets", "no-loss"),
        rate=50.0,
        concurrency=6,
        partitions=3,
        note="a divergent tail the epoch check must cut: a partition leader cut off from "
        "every other node (the clients still reach it) appends the sends it gets in its "
        "epoch, which no follower fetches, while the controllers fence it and elect a "
        "follower, which with the other one still makes min ISR 2 and appends other records "
        "at those offsets in the next epoch (with two replicas it could not); healed, "
        "the old leader fetches with its last epoch, and without the check the new leader "
        "serves it from its log end, so it keeps the old tail under the HW.  KIP-101's "
        "second scenario itself (both replicas losing unsynced tails, the one with less "
        "back first) needs min ISR 1 and two power losses within one session, and "
        "power-loss runs, whose plain kills drop the unsynced tails too, never made a "
        "divergent tail (docs/verification.md)",
        time_limit_s=40.0,
        fault_interval_s=10.0,
        fault_period_s=30.0,
        **_ONE_CONTROLLER,
    ),
    "R9": Recipe(  # no-elr
        "queue",
        ("strand-power-loss-partition-leader",),
        _LOSS,
        note="KIP-966's worked example: the followers cut off, the ISR shrinks to the "
        "leader, which loses power with acknowledged records it had not synced; with no "
        "ELR it stays the ISR, leads again when back, and the followers truncate to its "
        "shorter log",
        **_STRANDS,
    ),
    "R10": Recipe(  # ignore-min-isr
        "queue",
        ("strand-power-loss-partition-leader",),
        _LOSS,
        note="Jepsen's Kafka 0.8 test: a stranded leader (the ISR shrunk to it) takes min "
        "ISR as 1 and acknowledges acks=all sends alone; it loses power and a follower of "
        "the ELR leads without them",
        **_STRANDS,
    ),
    "B18": Recipe(  # harness-not-leader-as-fail
        "queue",
        _ISR_MOVES,
        ("G1a",),
        budget=5,
        partitions=1,
        rate=80.0,
        concurrency=8,
        time_limit_s=60.0,
        fault_interval_s=0.8,
        fault_period_s=18.0,
        quiet_s=1.0,
        replica_lag_ms=2_000,
        op_timeout_s=2.0,
        client_timeout_s=1.0,
        **_ONE_CONTROLLER,
        note="a harness bug: NOT_LEADER_OR_FOLLOWER after sending recorded as fail. The "
        "producer retries that answer until delivery.timeout.ms, so it ends a record only "
        "when it comes after the deadline and before the sender's next expiry sweep: a "
        "follower cut off and kept in the ISR (for the 2 s lag) makes the leader's purgatory hold "
        "every acks=all produce, and preferred elections then answer the held ones with "
        "it; 1 s requests and a 1.5 s delivery timeout bring their ages near the deadline, "
        "one partition keeps a send's records in one batch (a send is fail only if all its "
        "records are), and the follower elected had fetched them, so a poll sees them. The "
        "window is narrow (2 or 3 answers in 300 land in it), so a run of 60 s and 5 runs",
    ),
}
"""Recipes by bug id."""

RECIPES: Final[Mapping[Bug, Recipe]] = {b: _BY_ID[b.id] for b in Bug if b.id in _BY_ID}
"""The recipe of every bug (a test checks that none is missing, and that
every recipe's id names a bug)."""

RECIPE_IDS: Final = frozenset(_BY_ID)
"""The bug ids that have a recipe."""


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """One run of a recipe: its folder, its seed, the checks that fired
    (Spark's, and the harness's final check as :data:`HARNESS_FINAL_CHECK`),
    and ``error`` when the run or its verification gave no verdict."""

    path: Path | None
    seed: int
    fired: tuple[str, ...]
    seconds: float
    error: str | None = None

    @property
    def detected(self) -> bool:
        return bool(self.fired)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": None if self.path is None else str(self.path),
            "seed": self.seed,
            "fired": list(self.fired),
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class BugResult:
    """A recipe's runs with ``bug`` on (``None``: a clean run, no bug), of
    ``budget`` allowed (they stop at the first detection)."""

    bug: Bug | None
    recipe: Recipe
    runs: tuple[RunOutcome, ...]
    budget: int = 1

    @property
    def first_detection(self) -> int | None:
        """The number of runs until a check first fired (1-based)."""
        for i, run in enumerate(self.runs, 1):
            if run.detected:
                return i
        return None

    @property
    def fired(self) -> tuple[str, ...]:
        """The checks that fired in the first run where any did."""
        n = self.first_detection
        return () if n is None else self.runs[n - 1].fired

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    @property
    def caught(self) -> bool:
        return self.first_detection is not None

    @property
    def benign(self) -> bool:
        """A benign bug's runs (negative controls, :class:`Recipe`)."""
        return self.bug is not None and bool(self.recipe.benign)

    @property
    def status(self) -> str:
        """``caught`` or ``NOT CAUGHT`` (a finding) for a bug; ``benign``,
        ``FIRED`` or ``NO VERDICT`` (findings) for a benign bug; ``clean``,
        ``FALSE ALARM`` or ``NO VERDICT`` for a clean run."""
        if self.bug is not None and not self.benign:
            return "caught" if self.caught else "NOT CAUGHT"
        if self.caught:
            return "FIRED" if self.benign else "FALSE ALARM"
        if any(r.error for r in self.runs):
            return "NO VERDICT"
        return "benign" if self.benign else "clean"

    @property
    def finding(self) -> bool:
        """A bug not caught, or a benign bug on which a check fired or that
        gave no verdict (its analysis, or a check, is wrong)."""
        if self.bug is None:
            return False
        return self.status not in ("caught", "benign")

    def to_json(self) -> dict[str, Any]:
        return {
            "bug": None if self.bug is None else self.bug.id,
            "title": None if self.bug is None else self.bug.title,
            "recipe": self.recipe.describe(),
            "expected": list(self.recipe.expected),
            "benign": self.recipe.benign or None,
            "status": self.status,
            "fired": list(self.fired),
            "runs_until_detection": self.first_detection,
            "budget": self.budget,
            "seconds": round(self.seconds, 3),
            "runs": [r.to_json() for r in self.runs],
        }


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The catalogue's results: ``bugs`` one per bug, ``clean`` one per
    clean run."""

    bugs: tuple[BugResult, ...]
    clean: tuple[BugResult, ...] = ()
    seconds: float = 0.0

    @property
    def findings(self) -> tuple[BugResult, ...]:
        """Bugs no check caught within their budget, and benign bugs whose
        runs were not all clean."""
        return tuple(b for b in self.bugs if b.finding)

    @property
    def false_alarms(self) -> tuple[BugResult, ...]:
        """Clean runs in which a check fired or that gave no verdict."""
        return tuple(c for c in self.clean if c.status != "clean")

    @property
    def ok(self) -> bool:
        """Every bug caught and every clean run clean."""
        return not self.findings and not self.false_alarms

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "bugs": [b.to_json() for b in self.bugs],
            "clean": [c.to_json() for c in self.clean],
            "findings": [b.bug.id for b in self.findings if b.bug is not None],
            "false_alarms": [
                {"recipe": c.recipe.describe(), "fired": list(c.fired)} for c in self.false_alarms
            ],
        }


def fired_checks(verdict: Mapping[str, Any], summary: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The checks that found an anomaly: every check of the Spark verdict
    whose ``valid`` is false, then the harness's own final check
    (``summary.json``'s ``final_check``) if it failed."""
    checks = verdict.get("checks") or {}
    fired = [name for name, check in checks.items() if check.get("valid") is False]
    final = (summary or {}).get("final_check")
    if isinstance(final, Mapping) and final.get("ok") is False:
        fired.append(HARNESS_FINAL_CHECK)
    return tuple(fired)


# -- running it --------------------------------------------------------------------------


def _run_seed(base: int, what: str, i: int) -> int:
    return random.Random(f"{base}-{what}-{i}").randrange(2**32)


def bug_order(bug: Bug) -> tuple[int, int]:
    """Q bugs, then B, then R, each by number."""
    return "QBR".find(bug.id[0]), int(bug.id[1:])


def _clean_recipes(chosen: Sequence[Bug], recipes: Mapping[Bug, Recipe]) -> list[Recipe]:
    """The distinct recipes of ``chosen``, in order."""
    out: list[Recipe] = []
    for bug in chosen:
        if recipes[bug] not in out:
            out.append(recipes[bug])
    return out


async def _execute(config: RunConfig, run: RunFn, timeout_s: float) -> RunResult | RunOutcome:
    """Run ``config``: its result, or the outcome of a run that gave
    nothing to verify (it timed out or did not complete)."""
    assert config.seed is not None
    t0 = time.monotonic()
    try:
        result = await asyncio.wait_for(run(config), timeout_s)
    except TimeoutError:
        return RunOutcome(
            None, config.seed, (), time.monotonic() - t0, f"the run took over {timeout_s:g} s"
        )
    if not result.completed:
        error = f"the run did not complete: {result.error}"
        return RunOutcome(result.path, config.seed, (), time.monotonic() - t0, error)
    return result


def _judge(result: RunResult, verdict: Mapping[str, Any], seed: int, seconds: float) -> RunOutcome:
    """A verified run's outcome: the checks that fired, or why it gives no
    verdict though none fired."""
    fired = fired_checks(verdict, result.summary)
    problem: str | None = None
    if not fired and verdict.get("verdict") not in (None, "valid"):
        problem = f"the verdict is {verdict.get('verdict')}"
    elif not fired and not result.recovered:
        problem = "the cluster did not recover after the final heal"
    return RunOutcome(result.path, seed, fired, seconds, problem)


async def _one_run(
    config: RunConfig, verifier: Verifier, run: RunFn, timeout_s: float
) -> RunOutcome:
    """Run ``config`` and verify it as ``kq chaos run --verify`` does
    (a run that did not complete is not verified)."""
    assert config.seed is not None
    t0 = time.monotonic()
    done = await _execute(config, run, timeout_s)
    if isinstance(done, RunOutcome):
        return done
    try:
        # In this thread: a Spark session kept warm across runs is the
        # active one of the thread that made it.
        verdict = verifier(done.path)
    except Exception as exc:  # the outcome says so; the catalogue goes on
        error = f"verification: {type(exc).__name__}: {exc}"
        return RunOutcome(done.path, config.seed, (), time.monotonic() - t0, error)
    return _judge(done, verdict, config.seed, time.monotonic() - t0)


def run_view(verdict: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """One run's verdict out of a verification of several runs, in the
    shape of a verification of that run alone (``verdict``, ``checks``):
    the checks its row names as failed are the invalid ones when the run is
    invalid (or cannot be verified); an unknown run's undecided checks stay
    undecided.  A run the verdict has no row for has no verdict."""
    target = path.resolve()
    row = next(
        (r for r in verdict.get("runs") or () if Path(str(r.get("path"))).resolve() == target),
        None,
    )
    if row is None:
        return {"verdict": None, "checks": {}, "missing": True}
    failed = [str(name) for name in row.get("failed") or ()]
    fired = row.get("verdict") in ("invalid", "cannot-verify")
    return {
        "verdict": row.get("verdict"),
        "checks": {name: {"valid": False if fired else None} for name in failed},
    }


async def _clean_runs_together(
    configs: Sequence[tuple[Recipe, RunConfig]],
    verify_together: BatchVerifier,
    run: RunFn,
    timeout: Callable[[Recipe], float],
    say: Callable[[str], None],
) -> list[BugResult]:
    """The clean runs one after the other, then verified together in one
    job (its time shared out among them): as many verdicts as one job per
    run gives, at the cost of one job."""
    done: list[tuple[Recipe, RunConfig, RunResult | RunOutcome, float]] = []
    for i, (recipe, config) in enumerate(configs):
        say(f"clean run {i + 1}/{len(configs)} ({recipe.describe()})")
        t0 = time.monotonic()
        result = await _execute(config, run, timeout(recipe))
        done.append((recipe, config, result, time.monotonic() - t0))
        if isinstance(result, RunOutcome):
            say(f"clean run {i + 1}: {_outcome_text(result)}")
        else:
            say(f"clean run {i + 1}: ran ({result.path})")
    paths = [r.path for _, _, r, _ in done if isinstance(r, RunResult)]
    verdict: Mapping[str, Any] = {}
    error: str | None = None
    share = 0.0
    if paths:
        say(f"verifying the {len(paths)} clean run(s) together")
        t0 = time.monotonic()
        try:
            verdict = verify_together(paths)
        except Exception as exc:  # every run then says so
            error = f"verification: {type(exc).__name__}: {exc}"
        share = (time.monotonic() - t0) / len(paths)
    out: list[BugResult] = []
    for i, (recipe, config, result, seconds) in enumerate(done):
        assert config.seed is not None
        if isinstance(result, RunOutcome):
            outcome = result
        elif error is not None:
            outcome = RunOutcome(result.path, config.seed, (), seconds + share, error)
        else:
            view = run_view(verdict, result.path)
            if view.get("missing"):
                missing = "the verification has no verdict for it"
                outcome = RunOutcome(result.path, config.seed, (), seconds + share, missing)
            else:
                outcome = _judge(result, view, config.seed, seconds + share)
        if not isinstance(result, RunOutcome):
            say(f"clean run {i + 1}: {_outcome_text(outcome)}")
        out.append(BugResult(None, recipe, (outcome,)))
    return out


async def run_catalogue(
    bugs: Iterable[Bug],
    verifier: Verifier,
    *,
    runs: int | None = None,
    clean_runs: int = 1,
    backend: str = "local",
    runs_dir: str = "runs",
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
    run: RunFn = run_chaos,
    recipes: Mapping[Bug, Recipe] = RECIPES,
    verify_together: BatchVerifier | None = None,
) -> Catalogue:
    """Run each bug's recipe with the bug on, up to ``runs`` times (default:
    the recipe's budget), stopping at the first run where a check fires;
    then ``clean_runs`` runs with no bug, over the distinct recipes of
    ``bugs`` in turn.  ``runs=0`` runs no bug, only the clean runs (of
    every chosen bug's recipe).  Every run is verified with ``verifier``;
    with ``verify_together``, the clean runs are instead verified in one
    job after the last of them."""
    chosen = sorted(set(bugs), key=bug_order)
    missing = [b.id for b in chosen if b not in recipes]
    if missing:
        raise ValueError(f"no recipe for {', '.join(missing)}")
    if runs is not None and runs < 0:
        raise ValueError(f"runs must not be negative, got {runs}")
    if clean_runs < 0:
        raise ValueError(f"clean runs must not be negative, got {clean_runs}")
    base = seed if seed is not None else random.randrange(2**32)
    t0 = time.monotonic()

    def say(message: str) -> None:
        if progress is not None:
            progress(f"{time.monotonic() - t0:7.1f}s  {message}")

    def timeout(recipe: Recipe) -> float:
        # The workload, the final polls, and starting, recovering and
        # collecting a cluster of six processes on a loaded host.
        return recipe.time_limit_s + recipe.final_time_s + 240.0

    results: list[BugResult] = []
    for bug in chosen if runs != 0 else ():
        recipe = recipes[bug]
        budget = runs if runs is not None else recipe.budget
        outcomes: list[RunOutcome] = []
        for i in range(budget):
            config = recipe.config(
                name=f"catalogue-{bug.id}",
                bugs=frozenset({bug}),
                seed=_run_seed(base, bug.id, i),
                runs_dir=runs_dir,
                backend=backend,
            )
            say(f"{bug.id} {bug.title}: run {i + 1}/{budget} ({recipe.describe()})")
            outcome = await _one_run(config, verifier, run, timeout(recipe))
            outcomes.append(outcome)
            say(f"{bug.id}: run {i + 1}: {_outcome_text(outcome)}")
            if outcome.detected:
                break
        results.append(BugResult(bug, recipe, tuple(outcomes), budget))

    clean: list[BugResult] = []
    plain = _clean_recipes(chosen, recipes)
    configs = [
        (
            plain[i % len(plain)],
            plain[i % len(plain)].config(
                name="catalogue-clean",
                bugs=frozenset(),
                seed=_run_seed(base, "clean", i),
                runs_dir=runs_dir,
                backend=backend,
            ),
        )
        for i in range(clean_runs if plain else 0)
    ]
    if verify_together is not None:
        clean = await _clean_runs_together(configs, verify_together, run, timeout, say)
    for i, (recipe, config) in enumerate(configs if verify_together is None else ()):
        say(f"clean run {i + 1}/{clean_runs} ({recipe.describe()})")
        outcome = await _one_run(config, verifier, run, timeout(recipe))
        say(f"clean run {i + 1}: {_outcome_text(outcome)}")
        clean.append(BugResult(None, recipe, (outcome,)))
    return Catalogue(tuple(results), tuple(clean), time.monotonic() - t0)


def _outcome_text(outcome: RunOutcome) -> str:
    where = f" ({outcome.path})" if outcome.path is not None else ""
    if outcome.fired:
        return f"fired: {', '.join(outcome.fired)}{where}"
    if outcome.error:
        return f"no verdict: {outcome.error}{where}"
    return f"nothing fired{where}"


# -- tables ------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def render_table(catalogue: Catalogue) -> str:
    """The catalogue for people: one line per bug and per clean run (bug,
    recipe, checks fired, runs until the first detection over the budget,
    time, result), then the findings and false alarms by name."""
    rows = []
    for r in (*catalogue.bugs, *catalogue.clean):
        n = r.first_detection
        rows.append(
            [
                "clean" if r.bug is None else f"{r.bug.id} {r.bug.title}",
                r.recipe.describe(),
                ", ".join(r.fired) or "-",
                f"{'-' if n is None else n}/{r.budget}",
                f"{r.seconds:.0f}s",
                r.status,
            ]
        )
    lines = _table(["BUG", "RECIPE", "CHECKS FIRED", "RUNS", "TIME", "RESULT"], rows)
    real = [b for b in catalogue.bugs if not b.benign]
    benign = [b for b in catalogue.bugs if b.benign]
    caught = sum(1 for b in real if b.caught)
    quiet = sum(1 for b in benign if b.status == "benign")
    lines.append(
        (f"{caught}/{len(real)} bugs caught; " if real else "")
        + (f"{quiet}/{len(benign)} benign bugs raised nothing; " if benign else "")
        + f"{len(catalogue.clean) - len(catalogue.false_alarms)}/{len(catalogue.clean)} clean "
        f"runs clean; {catalogue.seconds:.0f} s"
    )
    for b in catalogue.findings:
        assert b.bug is not None
        if not b.benign:
            lines.append(f"finding: {b.bug.id} {b.bug.title} not caught in {len(b.runs)} run(s)")
        elif b.caught:
            lines.append(f"finding: benign {b.bug.id} {b.bug.title} fired: {', '.join(b.fired)}")
        else:
            why = "; ".join(r.error for r in b.runs if r.error)
            lines.append(f"finding: benign {b.bug.id} {b.bug.title} gave no verdict: {why}")
    for c in catalogue.false_alarms:
        if c.caught:
            lines.append(f"false alarm: clean {c.recipe.describe()}: {', '.join(c.fired)}")
        else:
            why = "; ".join(r.error for r in c.runs if r.error)
            lines.append(f"no verdict: clean {c.recipe.describe()}: {why}")
    return "\n".join(lines)


def default_bugs() -> list[Bug]:
    """What ``kq chaos catalogue`` runs unless told: every bug but the
    benign ones, in :func:`bug_order`."""
    return sorted((b for b in Bug if not (b in RECIPES and RECIPES[b].benign)), key=bug_order)


def _expected_text(recipe: Recipe) -> str:
    return ", ".join(recipe.expected) or "none (benign: a negative control)"


def recipe_table(chosen: Iterable[Bug] = tuple(Bug)) -> str:
    """Every recipe, without running: bug, recipe, the checks expected."""
    rows = [
        [f"{b.id} {b.title}", RECIPES[b].describe(), _expected_text(RECIPES[b])]
        if b in RECIPES
        else [f"{b.id} {b.title}", "(no recipe)", "-"]
        for b in chosen
    ]
    return "\n".join(_table(["BUG", "RECIPE", "EXPECTED CHECKS"], rows))

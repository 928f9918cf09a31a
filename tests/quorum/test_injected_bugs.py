"""The quorum's deliberate bugs (``bugs.Bug`` Q1, Q2, Q3 and Q5), wired at
the line of the real core that keeps each rule, caught by the simulator.

Each bug is turned on with :func:`bugs.injected` around seeded schedules of
the real :class:`quorum.core.RaftCore`: the first seed whose run fails is
printed, the violation must be the property the broken rule protects, and
the same seed must pass with the bug off.  Two bugs are also played as
scripts with only the checks a real cluster can make (what nodes lead,
apply and acknowledge, not what their stores hold), to show the harm they
do: a forgotten vote elects two leaders of one epoch after a restart (Q3),
and entries acknowledged before their fsync are lost by a power loss (Q5).
Q4 lives in the node's read path: tests/kvstore/test_injected_read_bug.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import pytest

import bugs
from bugs import Bug
from quorum.messages import Message, VoteRequest
from quorum.sim import SimCluster, SimConfig, Violation, run_schedule
from quorum.sim.cluster import SIM_QUORUM_CONFIG
from quorum.sim.invariants import InvariantChecker
from quorum.sim.node import SimNode
from quorum.types import NodeId, Role

SEEDS = range(40)

SEEDED_CASES = [
    # Raft thesis §3.6.2: the leader counts its own durable end alone.
    (Bug.COMMIT_WITHOUT_MAJORITY, 3, "MajorityReachedHighWatermark"),
    # §3.4: one vote per epoch; two candidates of one epoch both win.
    (Bug.DOUBLE_VOTE, 5, "SingleLeader"),
    # Figure 3.1: votedFor is persistent; a grant leaves with no durable vote.
    (Bug.FORGET_VOTE, 3, "VoteDurableBeforeGrant"),
    # §3.8 and the Ready contract: a fetch names entries that are not synced.
    (Bug.ACK_BEFORE_FSYNC, 3, "DurableBeforeFetch"),
]


@pytest.mark.parametrize(
    ("bug", "voters", "rule"), SEEDED_CASES, ids=[bug.id for bug, _, _ in SEEDED_CASES]
)
def test_a_seeded_schedule_catches_the_bug_and_passes_without_it(
    bug: Bug, voters: int, rule: str
) -> None:
    config = SimConfig(voters=voters)
    with bugs.injected(bug):
        failing = None
        for seed in SEEDS:
            result = run_schedule(seed, config)
            if not result.ok:
                failing = result
                break
    assert bugs.active() == frozenset()
    assert failing is not None, f"{bug.id} ({bug.title}) was not caught by seeds {SEEDS}"
    print(f"{bug.id} ({bug.title}): seed {failing.seed}, {voters} voters: {failing.violation}")
    assert failing.violation is not None
    # The simulator blames the property the broken rule protects.
    assert failing.violation.split(":")[0] == rule, failing.violation
    clean = run_schedule(failing.seed, config)
    assert clean.ok, f"seed {failing.seed} fails with no bug on: {clean.violation}"


# -- scripts with only a real cluster's checks --------------------------------


class OutsideChecker(InvariantChecker):
    """The simulator's checks minus those that read a node's stores (the
    Ready contract's durability checks and MajorityReachedHighWatermark): a
    chaos run cannot see a disk either, only who leads, what is applied and
    what was acknowledged."""

    def on_send(self, node: SimNode, msg: Message) -> None:
        pass

    def _check_majority_has(self, nodes: Iterable[SimNode], end_offset: int) -> None:
        pass


class ScriptedCluster(SimCluster):
    """A simulated cluster whose script may drop chosen messages."""

    def __init__(self, seed: int, config: SimConfig) -> None:
        super().__init__(seed, config)
        self.checker = OutsideChecker(self.checker.voters)
        self.drop: Callable[[Message], bool] = lambda msg: False

    def _send(self, msg: Message) -> None:
        if not self.drop(msg):
            super()._send(msg)

    def role_of(self, node: NodeId) -> Role | None:
        core = self.nodes[node].core
        return None if core is None else core.role

    def must(self, cond: Callable[[], bool], what: str, ms: int = 30_000) -> None:
        if not self.run_until(cond, ms):
            raise AssertionError(f"script stuck (seed {self.seed}): {what}")


def _two_candidates_ask_one_voter(
    restart_voter: bool, seed: int = 11
) -> tuple[ScriptedCluster, int, NodeId]:
    """Two candidates of one epoch, A and B, ask the same third voter G.

    All three are cut apart until each has lost the first leader, then A and
    B may talk to G (not to each other) and G never campaigns itself.  Long
    election timeouts keep A and B candidates of the same epoch while their
    vote requests are held back; then the first request to reach G is
    granted (its sender is W); if ``restart_voter``, G crashes at once and
    restarts once W leads; G is cut off from W.  G then hears the other
    candidate's request for the same epoch.  Returns the cluster, the epoch
    and W.
    """
    quorum = replace(SIM_QUORUM_CONFIG, election_timeout_ms=5_000)
    cluster = ScriptedCluster(seed, SimConfig(voters=3, quorum=quorum, snapshot_every=0))
    net = cluster.network
    ids = sorted(cluster.nodes)
    cluster.start()
    cluster.start_client()
    cluster.must(lambda: cluster.leader() is not None, "a first leader")
    cluster.run_for(500)
    cluster.stop_client()
    first = cluster.leader()
    assert first is not None and first.core is not None
    end = first.core.log.end_offset
    cluster.must(lambda: cluster.all_applied(end), "every node caught up")
    g = min(n for n in ids if n != first.node_id)
    a, b = (n for n in ids if n != g)

    for n in ids:
        net.isolate(n, ids)
    cluster.must(
        lambda: all(cluster.role_of(n) is Role.PROSPECTIVE for n in ids), "all prospective"
    )
    held = {"real votes": True}
    cluster.drop = lambda msg: (
        isinstance(msg, VoteRequest) and (msg.src == g or (held["real votes"] and not msg.pre_vote))
    )
    net.heal()
    net.isolate(a, [b])
    cluster.must(
        lambda: cluster.role_of(a) is Role.CANDIDATE and cluster.role_of(b) is Role.CANDIDATE,
        "A and B candidates",
    )
    a_core, b_core = cluster.nodes[a].core, cluster.nodes[b].core
    assert a_core is not None and b_core is not None
    epoch = a_core.epoch
    assert b_core.epoch == epoch, "the candidates campaign in different epochs"

    held["real votes"] = False

    def g_voted() -> bool:
        core = cluster.nodes[g].core
        return core is not None and core.voted_for in (a, b) and core.epoch == epoch

    cluster.must(g_voted, "G grants a vote")
    g_core = cluster.nodes[g].core
    assert g_core is not None and g_core.voted_for is not None
    w = g_core.voted_for
    if restart_voter:
        cluster.crash(g, lose_all_unflushed=True)
    cluster.must(lambda: cluster.role_of(w) is Role.LEADER, "W leads with G's vote")
    # W's announcement, now in flight, must not reach G (G would follow W
    # and refuse votes for that reason alone): cut them apart.
    net.isolate(w, [g])
    if restart_voter:
        cluster.restart(g)
    return cluster, epoch, w


@pytest.mark.parametrize(
    ("bug", "restart_voter"),
    [(Bug.FORGET_VOTE, True), (Bug.DOUBLE_VOTE, False)],
    ids=["Q3-restarted-voter", "Q2-live-voter"],
)
def test_two_leaders_of_one_epoch_with_the_bug_one_without(bug: Bug, restart_voter: bool) -> None:
    with bugs.injected(bug), pytest.raises(Violation) as caught:
        cluster, epoch, w = _two_candidates_ask_one_voter(restart_voter)
        cluster.run_for(3_000)
    print(f"{bug.id} ({bug.title}): seed 11: {caught.value}")
    assert caught.value.rule == "SingleLeader", caught.value

    cluster, epoch, w = _two_candidates_ask_one_voter(restart_voter)
    cluster.run_for(3_000)
    # W won the epoch with G's vote; the other candidate never led it.
    assert cluster.checker.leaders.get(epoch) == w


def _power_loss_after_acknowledged_writes(seed: int = 5) -> ScriptedCluster:
    """A 3-voter cluster acknowledges writes, then every node loses its
    power at once (unsynced writes gone) and comes back; a new write must
    commit after the acknowledged ones."""
    cluster = ScriptedCluster(seed, SimConfig(voters=3, snapshot_every=0))
    cluster.start()
    cluster.must(lambda: cluster.leader() is not None, "a leader")
    cluster.start_client()
    cluster.must(lambda: len(cluster.acked) >= 10, "ten acknowledged writes")
    cluster.stop_client()
    for n in sorted(cluster.nodes):
        cluster.crash(n, lose_all_unflushed=True)
    for n in sorted(cluster.nodes):
        cluster.restart(n)
    cluster.must(lambda: cluster.leader() is not None, "a leader after the power loss")
    leader = cluster.leader()
    assert leader is not None
    key = cluster.propose((b"after-power-loss",))
    assert key is not None
    cluster.must(lambda: key in cluster.acked and cluster.all_applied(key[0] + 1), "a new commit")
    cluster.check_converged()
    return cluster


def test_acknowledged_before_fsync_is_lost_by_a_power_loss() -> None:
    with bugs.injected(Bug.ACK_BEFORE_FSYNC), pytest.raises(Violation) as caught:
        _power_loss_after_acknowledged_writes()
    print(f"Q5 ({Bug.ACK_BEFORE_FSYNC.title}): seed 5: {caught.value}")
    # Committed entries are gone: a new leader lacks them, or another batch
    # is applied at their offsets, or the final log misses them.
    assert caught.value.rule in {
        "LeaderCompleteness",
        "ConsistentCommittedData",
        "LostAcknowledgedWrite",
    }, caught.value

    cluster = _power_loss_after_acknowledged_writes()
    assert len(cluster.acked) >= 11

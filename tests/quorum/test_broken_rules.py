"""Proof that the simulator's checks can fail.

Each test breaks one rule of the protocol on purpose and shows the simulator
reports the violation of the property that rule protects, on every schedule
it fails, while the correct core passes the very same schedules. The rules
the core's deliberate bugs break (``bugs.Bug`` Q1-Q3, wired at the line that
keeps each rule) are broken by turning the bug on; Figure 8's, which no bug
covers, by a subclass of the core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

import bugs
from bugs import Bug
from quorum.core import RaftCore
from quorum.majority import committed_offset
from quorum.sim import SimCluster, SimConfig, Violation, run_schedule
from quorum.sim.cluster import SIM_QUORUM_CONFIG
from quorum.sim.node import CoreFactory, SimNode
from quorum.types import Role


class HighWatermarkIntoPreviousEpoch(RaftCore):
    """The leader commits by counting replicas alone, even entries of older
    epochs before any entry of its own epoch commits (the Figure 8 bug)."""

    def _maybe_update_high_watermark(self) -> bool:
        acked = {n: p.end_offset for n, p in self._progress.items() if p.is_voter}
        acked[self.node_id] = self._stable_end
        candidate = committed_offset(self.voters.voters, acked)
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            self._complete_parked_fetches()
            return True
        return False


SEEDS = range(40)


def _first_violations(core: CoreFactory, voters: int) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for seed in SEEDS:
        result = run_schedule(seed, SimConfig(voters=voters), core_factory=core)
        if not result.ok:
            assert result.violation is not None
            found.setdefault(result.violation.split(":")[0], []).append(seed)
    return found


@pytest.mark.parametrize(
    ("bug", "rule", "voters"),
    [
        # The leader commits whatever it has itself durably written.
        (Bug.COMMIT_WITHOUT_MAJORITY, "MajorityReachedHighWatermark", 3),
        # A voter forgets it already voted in this epoch.
        (Bug.DOUBLE_VOTE, "SingleLeader", 5),
        # The grant is sent, but the vote never reaches the quorum-state store.
        (Bug.FORGET_VOTE, "VoteDurableBeforeGrant", 3),
    ],
    ids=["commit-without-majority", "two-votes-per-epoch", "vote-not-persisted"],
)
def test_random_schedules_catch_broken_rule(bug: Bug, rule: str, voters: int) -> None:
    with bugs.injected(bug):
        found = _first_violations(RaftCore, voters)
    assert rule in found, f"{bug.id} ({bug.title}) was not caught; violations seen: {found}"
    # The broken rule is what the simulator blames, not some side effect.
    assert set(found) == {rule}, found


def test_correct_core_passes_the_same_schedules() -> None:
    for voters in (3, 5):
        assert _first_violations(RaftCore, voters) == {}


# -- Figure 8, scripted ------------------------------------------------------


@dataclass(frozen=True)
class Figure8:
    cluster: SimCluster
    x_offset: int
    x_epoch: int
    x_durable_on: tuple[int, ...]
    a_high_watermark: int
    overwriter: int


def _figure8(core: CoreFactory) -> Figure8:
    """Raft thesis §3.6.2, Figure 3.7 (the paper's Figure 8), on 5 voters.

    A leader A writes x at offset i in its epoch and crashes before anyone
    fetches it.  E wins the next epoch without x and writes its own epoch's
    LeaderChange at offset i, then crashes before anyone fetches it.  A comes
    back, wins a later epoch and replicates x to C and D, which now makes x
    present on a majority (A, C, D), though no record of A's new epoch has
    reached any follower.  A crashes.  E, whose last epoch is newer than x's,
    can then win with C and D and overwrite x.  So x must not have been
    counted as committed: KIP-595 lets the high watermark pass only the start
    offset of the leader's own epoch.
    """
    quorum = replace(SIM_QUORUM_CONFIG, fetch_max_bytes=1)  # one batch per fetch
    cluster = SimCluster(8, SimConfig(voters=5, observers=0, quorum=quorum, snapshot_every=0), core)
    net = cluster.network
    ids = sorted(cluster.nodes)

    def node(n: int) -> SimNode:
        return cluster.nodes[n]

    def end_of(n: int) -> int:
        core = cluster.nodes[n].core
        return -1 if core is None else core.log.end_offset

    def leads(n: int) -> bool:
        core = cluster.nodes[n].core
        return core is not None and core.role is Role.LEADER

    def must(cond: Callable[[], bool], what: str, ms: int = 10_000) -> None:
        if not cluster.run_until(cond, ms):
            raise AssertionError(f"figure 8 script stuck: {what}")

    cluster.start()
    must(lambda: cluster.leader() is not None, "first leader")
    leader = cluster.leader()
    assert leader is not None and leader.core is not None
    a = leader.node_id
    must(lambda: cluster.all_applied(end_of(a)), "first epoch committed")
    b, c, d, e = [n for n in ids if n != a]
    cluster.crash(b)  # b takes no part: a majority is 3 of the other 4

    # A writes x alone and crashes.
    net.isolate(a, ids)
    key = cluster.propose((b"x",))
    assert key is not None
    i, x_epoch = key
    must(lambda: node(a).stores.log.durable_end_offset() > i, "x durable on A")
    cluster.crash(a)

    # One of the others leads the next epoch, writes its LeaderChange at
    # offset i and is cut off and crashed before anyone fetches it.
    net.heal()
    net.isolate(a, ids)
    must(lambda: cluster.leader() is not None, "second leader")
    second = cluster.leader()
    assert second is not None and second.node_id in (c, d, e)
    e = second.node_id
    c, d = [n for n in ids if n not in (a, b, e)]
    net.isolate(e, ids)
    cluster.crash(e)

    # A returns, leads a later epoch and hands x to C and D one batch at a
    # time; its answers after that are lost, so they never get A's own
    # LeaderChange record.
    net.heal()
    net.isolate(e, ids)
    net.isolate(b, ids)
    cluster.restart(a)
    must(lambda: leads(a), "A leads again")

    def hand_x_over() -> bool:
        for follower in (c, d):
            if end_of(follower) > i:
                net.blocked.add((a, follower))
        return all((a, f) in net.blocked for f in (c, d))

    must(hand_x_over, "C and D fetch x")
    a_core = node(a).core
    assert a_core is not None
    cluster.run_until(lambda: a_core.high_watermark > i, 1_000)
    a_high_watermark = a_core.high_watermark
    x_durable_on = tuple(
        n for n in ids if cluster.nodes[n].stores.log.durable_epoch_of_end(i + 1) == x_epoch
    )

    # A crashes; E comes back.  E's last epoch is newer than x's, so C and D
    # vote for it and it overwrites x.
    cluster.crash(a)
    net.heal()
    net.isolate(a, ids)
    net.isolate(b, ids)
    cluster.restart(e)

    def e_leads_and_c_caught_up() -> bool:
        leader = cluster.leader()
        c_core = node(c).core
        return (
            leader is not None
            and leader.node_id == e
            and c_core is not None
            and c_core.log.end_offset > i + 1
        )

    must(e_leads_and_c_caught_up, "E leads and C fetched from it")
    return Figure8(cluster, i, x_epoch, x_durable_on, a_high_watermark, e)


def test_figure8_correct_core_never_commits_x() -> None:
    run = _figure8(RaftCore)
    i = run.x_offset
    # x did reach a majority of the five voters, in an older epoch ...
    assert len(run.x_durable_on) >= 3, run.x_durable_on
    # ... yet the leader did not count it as committed ...
    assert run.a_high_watermark <= i
    assert run.cluster.checker.committed_marks.get(i + 1) != run.x_epoch
    # ... which is what lets E overwrite it without losing anything committed.
    c_log = next(
        n.core.log
        for n in run.cluster.nodes.values()
        if n.core is not None and n.node_id not in (run.overwriter,) and n.core.log.end_offset > i
    )
    assert c_log.epoch_of_end(i + 1) != run.x_epoch


def test_figure8_high_watermark_into_previous_epoch_is_caught() -> None:
    with pytest.raises(Violation) as caught:
        _figure8(HighWatermarkIntoPreviousEpoch)
    assert caught.value.rule == "LeaderCompleteness", caught.value

"""Linearizable reads: the read barrier (Raft thesis §6.4, read index).

A read may be served once a majority of voters has fetched from the leader
after the read began, and the state machine has applied up to the read index.
"""

from __future__ import annotations

import pytest

from quorum.core import NotLeaderError, RaftCore
from quorum.sim import SimCluster, SimConfig


def _cluster(voters: int = 3, seed: int = 1) -> tuple[SimCluster, RaftCore]:
    cluster = SimCluster(seed, SimConfig(voters=voters, observers=1, snapshot_every=0))
    cluster.start()
    assert cluster.run_until(lambda: cluster.leader() is not None, 5_000)
    leader = cluster.leader()
    assert leader is not None and leader.core is not None
    core = leader.core
    assert cluster.run_until(lambda: core.high_watermark > core.epoch_start_offset, 5_000)
    return cluster, core


def test_read_is_confirmed_after_a_majority_fetches_again() -> None:
    cluster, core = _cluster()
    cluster.propose((b"x",))
    barrier = core.begin_read(cluster.now)
    assert barrier is not None
    assert barrier.epoch == core.epoch
    assert barrier.read_index == core.high_watermark
    # Nothing has fetched since the read began.
    assert not core.read_confirmed(barrier)
    # Parked fetches were answered at once, so the followers fetch again
    # within a few network delays, not after the long poll.
    start = cluster.now
    assert cluster.run_until(lambda: core.read_confirmed(barrier), 1_000)
    assert cluster.now - start < cluster.config.quorum.fetch_max_wait_ms


def test_read_is_not_confirmed_without_a_majority() -> None:
    cluster, core = _cluster(voters=5)
    leader_id = core.node_id
    others = [n for n in cluster.nodes if n != leader_id]
    # Cut the leader off from all but one voter: 2 of 5 can still fetch.
    cut = [n for n in others if n in cluster.voter_ids][1:]
    for n in cut:
        cluster.network.isolate(n, cluster.nodes)
    barrier = core.begin_read(cluster.now)
    assert barrier is not None
    # Well within check-quorum's window (1.5 fetch timeouts), so it still leads.
    cluster.run_for(cluster.config.quorum.fetch_timeout_ms // 2)
    assert not core.read_confirmed(barrier)


def test_read_fails_once_leadership_is_lost() -> None:
    cluster, core = _cluster()
    barrier = core.begin_read(cluster.now)
    assert barrier is not None
    assert cluster.resign(core.node_id)
    with pytest.raises(NotLeaderError):
        core.read_confirmed(barrier)


def test_only_the_leader_begins_reads() -> None:
    cluster, core = _cluster()
    follower = next(
        n.core
        for n in cluster.nodes.values()
        if n.core is not None and n.core is not core and n.core.is_voter
    )
    with pytest.raises(NotLeaderError) as err:
        follower.begin_read(cluster.now)
    assert err.value.leader_id == core.node_id


def test_no_read_index_before_the_leader_commits_in_its_epoch() -> None:
    cluster = SimCluster(3, SimConfig(voters=3, observers=0))
    cluster.start()
    assert cluster.run_until(lambda: cluster.leader() is not None, 5_000)
    leader = cluster.leader()
    assert leader is not None and leader.core is not None
    core = leader.core
    # Right after winning, its LeaderChange record is not committed yet: the
    # leader does not know the committed prefix, so it cannot give an index.
    assert core.high_watermark <= core.epoch_start_offset
    assert core.begin_read(cluster.now) is None


def test_single_voter_confirms_at_once() -> None:
    cluster, core = _cluster(voters=1)
    barrier = core.begin_read(cluster.now)
    assert barrier is not None and core.read_confirmed(barrier)

"""report_unreachable: a follower told its leader's connection is gone."""

from __future__ import annotations

from quorum.sim import SimCluster, SimConfig
from quorum.types import Role


def _settled(seed: int) -> tuple[SimCluster, int]:
    cluster = SimCluster(seed, SimConfig(voters=3, observers=0))
    cluster.start()
    assert cluster.run_until(lambda: cluster.leader() is not None, 5_000)
    cluster.run_for(500)
    leader = cluster.leader()
    assert leader is not None
    return cluster, leader.node_id


def test_crashed_leader_is_replaced_well_before_the_fetch_timeout() -> None:
    took: list[int] = []
    for seed in range(15):
        cluster, old = _settled(seed)
        epoch = cluster.nodes[old].core.epoch  # type: ignore[union-attr]
        cluster.crash(old)
        start = cluster.now
        for n, node in cluster.nodes.items():
            if n != old and node.core is not None:
                node.core.report_unreachable(old, cluster.now)
                cluster._after(node)

        def replaced(cluster: SimCluster = cluster, epoch: int = epoch) -> bool:
            leader = cluster.leader()
            return leader is not None and leader.core is not None and leader.core.epoch > epoch

        assert cluster.run_until(replaced, 5_000)
        took.append(cluster.now - start)
    q = cluster.config.quorum
    # Every trial beats waiting out the fetch timeout (split votes and their
    # backoff included), and a typical one takes about the random delay,
    # drawn below half an election timeout, plus two rounds of messages.
    assert max(took) < q.fetch_timeout_ms, took
    assert sorted(took)[len(took) // 2] <= q.election_timeout_ms // 2 + 50, took


def test_a_lone_report_does_not_disrupt_a_live_leader() -> None:
    cluster, leader = _settled(3)
    epoch = cluster.nodes[leader].core.epoch  # type: ignore[union-attr]
    follower = next(n for n in cluster.voter_ids if n != leader)
    node = cluster.nodes[follower]
    assert node.core is not None
    node.core.report_unreachable(leader, cluster.now)
    cluster._after(node)
    cluster.run_for(3_000)
    # Its pre-votes were refused by the other follower, which still hears the
    # leader; the leader's BeginQuorumEpoch re-send brought it back.
    assert cluster.nodes[leader].core.epoch == epoch  # type: ignore[union-attr]
    assert cluster.nodes[leader].core.role is Role.LEADER  # type: ignore[union-attr]
    assert node.core.role is Role.FOLLOWER and node.core.leader_id == leader


def test_report_about_another_node_changes_nothing() -> None:
    cluster, leader = _settled(4)
    follower = next(n for n in cluster.voter_ids if n != leader)
    other = next(n for n in cluster.voter_ids if n not in (leader, follower))
    core = cluster.nodes[follower].core
    assert core is not None
    before = core.next_deadline_ms()
    core.report_unreachable(other, cluster.now)
    assert core.next_deadline_ms() == before
    assert core.role is Role.FOLLOWER

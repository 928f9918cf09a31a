"""Random fault schedules on the deterministic simulator.

Hypothesis draws the seed and the cluster shape (1, 3 or 5 voters, 0 to 3
observers) and which faults to inject; the simulator checks every safety
invariant after every event, then heals the network and requires a new
commit on every node in bounded virtual time.  A failure prints the seed,
the trace and the command that replays it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from quorum.sim import FaultPlan, SimConfig, run_schedule
from quorum.sim.schedule import ALL_FAULTS

SHAPES = [(v, o) for v in (1, 3, 5) for o in range(4)]


def _explain(seed: int, voters: int, observers: int, trace: tuple[str, ...]) -> str:
    tail = "\n".join(trace[-60:])
    return (
        f"seed {seed} with {voters} voters and {observers} observers failed.\n"
        f"replay: kq sim --seed {seed} --voters {voters} --observers {observers} --trace\n"
        f"last events:\n{tail}"
    )


@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    shape=st.sampled_from(SHAPES),
    faults=st.lists(st.sampled_from(ALL_FAULTS), min_size=1, unique=True),
)
def test_random_schedules_keep_every_invariant(
    seed: int, shape: tuple[int, int], faults: list
) -> None:
    voters, observers = shape
    note(f"replay: kq sim --seed {seed} --voters {voters} --observers {observers}")
    result = run_schedule(
        seed,
        SimConfig(voters=voters, observers=observers),
        FaultPlan(faults=tuple(faults)),
    )
    assert result.ok, f"{result.violation}\n" + _explain(seed, voters, observers, result.trace)
    # A schedule that never elected anyone or committed nothing would prove
    # nothing: the liveness phase must have committed on every node.
    assert result.elections >= 1
    assert result.committed_offset >= 1


# Seeds whose schedules exposed a bug during development, kept as replays.
# A change to the core changes what a seed's schedule does, so these guard
# the neighbourhood of each bug rather than its exact interleaving; each bug
# also has a targeted test or scenario script.
REGRESSIONS = [
    # follower trusted the leader's high watermark after a diverging fetch
    (16, 3, 1),
    (30, 3, 1),
    # compacted leader answered an epoch-0 divergence instead of a snapshot
    (43, 3, 1),
    (125, 3, 1),
    # a restarted leader, resigned, was still named in vote responses
    (3, 3, 1),
    # a timer due at the instant a message arrived was skipped
    (260, 1, 2),
]


@pytest.mark.parametrize(("seed", "voters", "observers"), REGRESSIONS)
def test_replay_regression_seed(seed: int, voters: int, observers: int) -> None:
    result = run_schedule(seed, SimConfig(voters=voters, observers=observers))
    assert result.ok, _explain(seed, voters, observers, result.trace)


def test_same_seed_same_run() -> None:
    first = run_schedule(7, SimConfig(voters=3, observers=2))
    again = run_schedule(7, SimConfig(voters=3, observers=2))
    assert first == again
    assert first.trace == again.trace
    assert first.trace != run_schedule(8, SimConfig(voters=3, observers=2)).trace


@pytest.mark.parametrize("seed", range(12))
def test_resign_hands_leadership_to_the_preferred_successor(seed: int) -> None:
    """KIP-595 graceful resignation: EndQuorumEpoch names the successors in
    order and the first starts its election at once, so with a healthy
    network it wins (leadership transfer)."""
    from quorum.sim import SimCluster

    cluster = SimCluster(seed, SimConfig(voters=5, observers=1))
    cluster.start()
    assert cluster.run_until(lambda: cluster.leader() is not None, 5_000)
    cluster.run_for(300)
    leader = cluster.leader()
    assert leader is not None and leader.core is not None
    old_epoch = leader.core.epoch
    target = [v for v in cluster.voter_ids if v != leader.node_id][seed % 4]
    assert cluster.resign(leader.node_id, (target,))

    def new_epoch_led() -> bool:
        new = cluster.leader()
        return new is not None and new.core is not None and new.core.epoch > old_epoch

    assert cluster.run_until(new_epoch_led, 5_000)
    new = cluster.leader()
    assert new is not None and new.node_id == target
    assert new.core is not None and new.core.epoch == old_epoch + 1


def test_apply_is_bounded_per_ready_and_still_converges() -> None:
    """QuorumConfig.max_apply_bytes: committed batches are handed out in
    steps of at most that many bytes (or one batch), and nodes still agree."""
    from dataclasses import replace

    from quorum.core import RaftCore
    from quorum.ready import Ready
    from quorum.sim.cluster import SIM_QUORUM_CONFIG

    limit = 60
    sizes: list[int] = []

    class Checked(RaftCore):
        def ready(self) -> Ready | None:
            ready = super().ready()
            if ready is not None and ready.committed:
                total = sum(b.size_bytes for b in ready.committed)
                assert len(ready.committed) == 1 or total <= limit, total
                sizes.append(len(ready.committed))
            return ready

    config = SimConfig(
        voters=3, observers=1, quorum=replace(SIM_QUORUM_CONFIG, max_apply_bytes=limit)
    )
    for seed in range(10):
        result = run_schedule(seed, config, core_factory=Checked)
        assert result.ok, result.violation
    assert max(sizes) > 1  # several small batches still share a Ready

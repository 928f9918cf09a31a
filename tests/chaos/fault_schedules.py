"""What the schedule tests of the broker faults share: a schedule of a few
kinds drawn from a seed, with its lengths drawn too; the actions of each
multi-step fault from its partition to its start; the network faults
whose node is found at run time, each ended by a heal; and the elections
drawn while a partition is in force."""

from __future__ import annotations

import random
from collections.abc import Container, Sequence

from chaos.nemesis import ELECT_LEADER_KIND, Action, schedule
from tests.chaos.strand_fakes import NODES


def drawn_schedule(
    seed: int,
    pool: Sequence[str],
    count: int | None = None,
    needed: str | None = None,
    interval_s: tuple[float, float] = (0.5, 3.0),
    fault_period_s: tuple[float, float] = (5.0, 20.0),
) -> list[Action]:
    """The schedule of :data:`NODES` for ``count`` kinds (1 to 4 if None)
    drawn from ``pool`` by ``seed``, with ``needed`` added if not drawn; its
    length (10 to 60 s), interval, fault period (in the ranges given) and
    quiet time (0 to 4 s) drawn too.  Its actions come in time order."""
    rng = random.Random(seed)
    kinds = rng.sample(list(pool), rng.randint(1, 4) if count is None else count)
    if needed is not None and needed not in kinds:
        kinds.append(needed)
    actions = schedule(
        random.Random(seed),
        NODES,
        kinds,
        duration_s=rng.uniform(10.0, 60.0),
        interval_s=rng.uniform(*interval_s),
        fault_period_s=rng.uniform(*fault_period_s),
        quiet_s=rng.uniform(0.0, 4.0),
    )
    times = [a.time_s for a in actions]
    assert times == sorted(times)
    return actions


def fault_spans(actions: list[Action], kinds: Container[str], name: str) -> list[list[Action]]:
    """The actions from each partition of one of ``kinds`` to the start of
    one of them, each span ended before the next begins (``name`` says
    which fault, in the failure)."""
    out: list[list[Action]] = []
    current: list[Action] | None = None
    for a in actions:
        if a.f == "partition" and a.kind in kinds:
            assert current is None, f"a {name} started while another was in force"
            current = [a]
        elif current is not None:
            current.append(a)
            if a.f == "start" and a.kind in kinds:
                out.append(current)
                current = None
    assert current is None, f"a {name} was never ended"
    return out


def check_cuts_found_at_run_time(actions: list[Action], kind: str, target: str) -> None:
    """Every ``partition`` of ``kind`` in ``actions`` names no node, only its
    ``target`` (the node is found at run time, from the controllers'
    metadata); at most one network fault is in force at a time, and each
    is ended by a heal, the last action one too."""
    cut: str | None = None
    for a in actions:
        if a.f == "partition":
            assert cut is None, "two network faults in force"
            cut = a.kind
            if a.kind == kind:
                assert a.target == target and a.groups == () and a.nodes == ()
        elif a.f == "heal":
            cut = None
    assert cut is None and actions[-1].f == "heal"


def elections_during_partitions(actions: list[Action]) -> int:
    """How many elections the schedule draws while a partition is in force
    (from a partition to its heal)."""
    cut = False
    during = 0
    for a in actions:
        if a.f == "partition":
            cut = True
        elif a.f == "heal":
            cut = False
        elif a.f == ELECT_LEADER_KIND and cut:
            during += 1
    return during

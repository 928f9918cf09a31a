"""Random fault schedules, then recovery, liveness and final checks.

A schedule is fully determined by its seed: faults are drawn from the same
``random.Random`` as everything else.  ``run_schedule`` never raises for a
protocol failure; it returns a :class:`SimResult` naming the violation, with
the trace of what happened.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from quorum.core import SafetyError
from quorum.sim.cluster import SimCluster, SimConfig, SimResult
from quorum.sim.history import SimHistory
from quorum.sim.invariants import Violation
from quorum.sim.network import NetworkConditions
from quorum.sim.node import CoreFactory

__all__ = ["ALL_FAULTS", "Fault", "FaultPlan", "run_schedule"]


class Fault(enum.Enum):
    CRASH = "crash"
    RESTART = "restart"
    PARTITION = "partition"
    ISOLATE = "isolate"
    ISOLATE_LEADER = "isolate-leader"
    LOSSY = "lossy"
    HEAL = "heal"
    RESIGN = "resign"
    TRANSFER = "transfer"
    CRASH_LEADER = "crash-leader"


ALL_FAULTS: tuple[Fault, ...] = tuple(Fault)


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """How much trouble to make, and for how long."""

    duration_ms: int = 8_000
    min_gap_ms: int = 100
    max_gap_ms: int = 1_500
    faults: tuple[Fault, ...] = ALL_FAULTS
    # After the faults: heal everything and require a leader and a fresh
    # commit on every node within this much virtual time (liveness).
    liveness_bound_ms: int = 15_000


def run_schedule(
    seed: int,
    config: SimConfig | None = None,
    plan: FaultPlan | None = None,
    core_factory: CoreFactory | None = None,
    history: SimHistory | None = None,
) -> SimResult:
    """Run one schedule; with ``history``, record the run in it."""
    plan = plan or FaultPlan()
    cluster = (
        SimCluster(seed, config, core_factory, history=history)
        if core_factory
        else SimCluster(seed, config, history=history)
    )
    try:
        cluster.start()
        cluster.start_client()
        _inject_faults(cluster, plan)
        _recover_and_check(cluster, plan)
    except (Violation, SafetyError, AssertionError) as exc:
        rule = exc.rule if isinstance(exc, Violation) else type(exc).__name__
        detail = exc.detail if isinstance(exc, Violation) else str(exc)
        cluster.log(f"VIOLATION {rule}: {detail}")
        return cluster.result(f"{rule}: {detail}")
    finally:
        if history is not None:
            history.finish()
    return cluster.result(None)


def _inject_faults(cluster: SimCluster, plan: FaultPlan) -> None:
    rng = cluster.rng
    end = cluster.now + plan.duration_ms
    if not plan.faults:
        cluster.run_for(plan.duration_ms)
        return
    ids = sorted(cluster.nodes)
    while True:
        gap = rng.randint(plan.min_gap_ms, plan.max_gap_ms)
        if cluster.now + gap >= end:
            cluster.run_for(end - cluster.now)
            return
        cluster.run_for(gap)
        fault = rng.choice(plan.faults)
        leader = cluster.leader()
        down = [n for n in ids if cluster.nodes[n].core is None]
        if fault is Fault.CRASH:
            cluster.crash(rng.choice(ids))
        elif fault is Fault.CRASH_LEADER and leader is not None:
            cluster.crash(leader.node_id)
        elif fault is Fault.RESTART and down:
            cluster.restart(rng.choice(down))
        elif fault is Fault.PARTITION:
            shuffled = ids[:]
            rng.shuffle(shuffled)
            cut = rng.randint(1, len(ids) - 1) if len(ids) > 1 else 1
            groups = [sorted(shuffled[:cut]), sorted(shuffled[cut:])]
            with cluster.fault(
                "partition", {"groups": groups, "kind": fault.value}, record=len(ids) > 1
            ):
                cluster.network.partition(shuffled[:cut], shuffled[cut:])
            cluster.log(f"PARTITION {sorted(shuffled[:cut])} | {sorted(shuffled[cut:])}")
        elif fault is Fault.ISOLATE or (fault is Fault.ISOLATE_LEADER and leader is not None):
            victim = leader.node_id if fault is Fault.ISOLATE_LEADER and leader else rng.choice(ids)
            groups = [[victim], [n for n in ids if n != victim]]
            with cluster.fault(
                "partition", {"groups": groups, "kind": fault.value}, record=len(ids) > 1
            ):
                cluster.network.isolate(victim, ids)
            cluster.log(f"ISOLATE n{victim}")
        elif fault is Fault.LOSSY:
            c = NetworkConditions(
                cluster.config.min_delay_ms,
                rng.randint(cluster.config.max_delay_ms, 200),
                drop_rate=rng.choice((0.05, 0.2, 0.5)),
                duplicate_rate=rng.choice((0.0, 0.1, 0.3)),
            )
            packet: dict[str, object] = {
                "drop": c.drop_rate,
                "duplicate": c.duplicate_rate,
                "max_delay_ms": c.max_delay_ms,
            }
            with cluster.fault("packet", packet):
                cluster.network.conditions = c
            cluster.log(
                f"LOSSY drop={c.drop_rate} dup={c.duplicate_rate} delay<={c.max_delay_ms}ms"
            )
        elif fault is Fault.HEAL:
            with cluster.fault("heal", {}, record=cluster.network_faulted()):
                cluster.network.heal()
            cluster.log("HEAL")
        elif fault in (Fault.RESIGN, Fault.TRANSFER) and leader is not None and leader.core:
            others = [v for v in cluster.voter_ids if v != leader.node_id]
            target = (rng.choice(others),) if fault is Fault.TRANSFER and others else ()
            cluster.resign(leader.node_id, target)


def _recover_and_check(cluster: SimCluster, plan: FaultPlan) -> None:
    with cluster.fault("heal", {}, record=cluster.network_faulted()):
        cluster.network.heal()
    cluster.log("HEAL (final)")
    for node_id in sorted(cluster.nodes):
        cluster.restart(node_id)
    cluster.stop_client()
    start = cluster.now
    if not cluster.run_until(lambda: cluster.leader() is not None, plan.liveness_bound_ms):
        raise Violation("Liveness", f"no leader {plan.liveness_bound_ms} ms after healing")
    # A fresh proposal must commit and reach every node in bounded time.
    # If it went to a leader that then lost its epoch, propose again to the
    # new leader, as a client would after a not-leader answer: a new
    # proposal with its own record, so that no value is written twice.
    final: list[tuple[int, int]] = []
    attempts = [0]

    def committed_everywhere() -> bool:
        leader = cluster.leader()
        if final:
            key = final[0]
            if key in cluster.acked:
                return cluster.all_applied(key[0] + 1)
            if leader is None or leader.core is None or leader.core.epoch == key[1]:
                return False
            final.clear()
        if leader is not None:
            suffix = f"-{attempts[0] + 1}" if attempts[0] else ""
            attempts[0] += 1
            proposed = cluster.propose((f"s{cluster.seed}-final{suffix}".encode(),))
            if proposed is not None:
                final.append(proposed)
        return False

    remaining = plan.liveness_bound_ms - (cluster.now - start)
    if not cluster.run_until(committed_everywhere, max(remaining, 0)):
        raise Violation(
            "Liveness",
            f"a proposal made after healing did not reach every node within "
            f"{plan.liveness_bound_ms} ms",
        )
    # Let followers learn the final high watermark, then compare everyone.
    cluster.run_until(
        lambda: cluster.all_applied(
            max(n.core.high_watermark for n in cluster.nodes.values() if n.core is not None)
        ),
        plan.liveness_bound_ms,
    )
    cluster.check_converged()

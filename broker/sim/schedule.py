"""Random schedules of the broker simulation: workload and nemesis drawn
from the run's seed, the invariants checked after every event.

``run_random(seed, steps, config)`` is the whole run: the same arguments
give the same events, trace and verdict, so a failing seed replays with
the same call (or ``kq sim brokers --seed S --steps N``). It never raises
for a broken invariant: the :class:`SimResult` names it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from broker.sim.cluster import CLIENT, CONTROLLER, SimCluster
from broker.sim.config import SimConfig
from broker.sim.invariants import InvariantChecker, Violation

__all__ = ["ALL_NEMESES", "Nemesis", "SimResult", "replay_command", "run_random"]


class Nemesis(enum.Enum):
    POWER_LOSS = "power-loss"
    KILL = "kill"
    SHUTDOWN = "shutdown"
    RESTART = "restart"
    PAUSE = "pause"
    RESUME = "resume"
    ISOLATE = "isolate"
    CUT = "cut"
    LOSSY = "lossy"
    HEAL = "heal"


ALL_NEMESES: tuple[Nemesis, ...] = tuple(Nemesis)


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    steps: int
    events: int
    virtual_ms: int
    violation: str | None
    rule: str | None
    violation_event: int | None
    produced: int
    acked_all: int
    consumed: int
    elections: int
    unclean_partitions: tuple[int, ...]
    messages_sent: int
    messages_dropped: int
    trace: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.violation is None


def replay_command(seed: int, steps: int) -> str:
    return f"kq sim brokers --seed {seed} --steps {steps} --trace"


def run_random(
    seed: int,
    steps: int = 400,
    config: SimConfig | None = None,
    nemeses: tuple[Nemesis, ...] = ALL_NEMESES,
    observe: Callable[[SimCluster], None] | None = None,
) -> SimResult:
    """One seeded run of ``steps`` events of faults and clients, then a
    healed phase in which every broker is up; ``observe`` is given the
    cluster before the first event (a history recorder attaches there)."""
    checker = InvariantChecker()
    cluster = SimCluster(seed, config, check=checker)
    if observe is not None:
        observe(cluster)
    violation: Violation | None = None
    try:
        _faults(cluster, steps, nemeses)
        _heal(cluster)
    except Violation as found:
        violation = found
        cluster.log(f"VIOLATION {found}")
    return SimResult(
        seed=seed,
        steps=steps,
        events=cluster.events,
        virtual_ms=cluster.now_ms,
        violation=None if violation is None else str(violation),
        rule=None if violation is None else violation.rule,
        violation_event=None if violation is None else violation.event,
        produced=len(cluster.outcomes),
        acked_all=len(cluster.acked),
        consumed=len(cluster.consumed),
        elections=cluster.controller.elections,
        unclean_partitions=tuple(sorted(cluster.controller.unclean)),
        messages_sent=cluster.messages_sent,
        messages_dropped=cluster.messages_dropped,
        trace=tuple(cluster.trace),
    )


def _faults(cluster: SimCluster, steps: int, nemeses: tuple[Nemesis, ...]) -> None:
    rng = cluster.rng
    brokers = sorted(cluster.brokers)
    partitions = sorted(cluster.assignments)
    while cluster.events < steps:
        cluster.run_for(rng.randint(5, 150), max_events=steps - cluster.events)
        if cluster.events >= steps:
            break
        if cluster.config.delete_rate and rng.random() < cluster.config.delete_rate:
            # An application deleting what its consumer has read.
            p = rng.choice(partitions)
            if cluster.positions[p] > 0:
                op = cluster.delete_records(p, cluster.positions[p])
                cluster.action(f"delete op {op} p{p} below {cluster.positions[p]}")
            cluster.expire_produces()
            continue
        roll = rng.random()
        if roll < 0.45:
            p = rng.choice(partitions)
            acks = rng.choice((-1, -1, 1))
            op = cluster.produce(p, acks)
            cluster.action(f"produce op {op} p{p} acks={acks}")
        elif roll < 0.75 or not nemeses:
            cluster.poll(rng.choice(partitions), from_start=rng.random() < 0.15)
        else:
            fault = rng.choice(nemeses)
            # Faults pile up unless undone: a dead broker is restarted and
            # the network healed often enough that the cluster keeps serving.
            if Nemesis.RESTART in nemeses and rng.random() < 0.4:
                fault = Nemesis.RESTART
            elif Nemesis.HEAL in nemeses and rng.random() < 0.15:
                fault = Nemesis.HEAL
            _nemesis(cluster, fault, brokers)
        cluster.expire_produces()


def _nemesis(cluster: SimCluster, fault: Nemesis, brokers: list[int]) -> None:
    rng = cluster.rng
    alive = [b for b in brokers if cluster.brokers[b].alive]
    dead = [b for b in brokers if not cluster.brokers[b].alive]
    if fault is Nemesis.POWER_LOSS and alive:
        victim = rng.choice(alive)
        if not cluster.config.guard_power_loss or cluster.safe_to_lose_power(victim):
            cluster.power_loss(victim)
        else:
            cluster.kill(victim)
    elif fault is Nemesis.KILL and alive:
        cluster.kill(rng.choice(alive))
    elif fault is Nemesis.SHUTDOWN and alive:
        cluster.controlled_shutdown(rng.choice(alive))
    elif fault is Nemesis.RESTART and dead:
        cluster.restart(rng.choice(dead))
    elif fault is Nemesis.PAUSE and alive:
        cluster.pause(rng.choice(alive))
    elif fault is Nemesis.RESUME:
        paused = [b for b in brokers if cluster.brokers[b].paused]
        if paused:
            cluster.resume(rng.choice(paused))
    elif fault is Nemesis.ISOLATE:
        cluster.isolate(rng.choice(brokers))
    elif fault is Nemesis.CUT:
        nodes = [*brokers, CONTROLLER]
        src = rng.choice(nodes)
        dst = rng.choice([n for n in [*nodes, CLIENT] if n != src])
        cluster.cut_link(src, dst)
    elif fault is Nemesis.LOSSY:
        cluster.lossy(rng.choice((0.05, 0.2, 0.5)))
    elif fault is Nemesis.HEAL:
        cluster.heal()


def _heal(cluster: SimCluster, heal_ms: int = 6_000) -> None:
    """Everything healed and up; the invariants keep being checked while
    the replicas catch up; then every partition is read from the start and
    must have recovered."""
    cluster.heal()
    for b, broker in sorted(cluster.brokers.items()):
        if broker.paused:
            cluster.resume(b)
        if not broker.alive:
            cluster.restart(b)
    cluster.run_for(heal_ms)
    cluster.expire_produces()
    for p in sorted(cluster.assignments):
        cluster.poll(p, from_start=True)
    _check_recovered(cluster)


def _check_recovered(cluster: SimCluster) -> None:
    """Liveness after healing: a partition that has a clean candidate (an
    ISR or ELR member) has a leader serving it, and its replicas hold the
    same log with the same HW, each starting no lower than the leader's
    (a follower raises its log start to the leader's from its fetch
    answers; it may start higher, never going back). (One whose ISR and
    ELR are both empty waits for an unclean election: KIP-966's offline
    partition.)"""
    for p, replicas in sorted(cluster.assignments.items()):
        registration = cluster.controller.partitions[p]
        if not registration.isr and not registration.elr:
            continue
        if cluster.serving_leader(p) is None:
            raise Violation(
                "liveness",
                f"p{p} has no serving leader after healing (controller: leader "
                f"{registration.leader}, ISR {list(registration.isr)}, "
                f"ELR {list(registration.elr)})",
                cluster.seed,
                cluster.events,
            )
        logs = {b: cluster.brokers[b].logs[p] for b in replicas}
        ends = {b: (log.log_end_offset, log.high_watermark) for b, log in logs.items()}
        if len(set(ends.values())) > 1:
            raise Violation(
                "liveness",
                f"p{p} replicas did not converge after healing: (LEO, HW) {ends}",
                cluster.seed,
                cluster.events,
            )
        leader = cluster.serving_leader(p)
        assert leader is not None
        starts = {b: log.log_start_offset for b, log in logs.items()}
        if min(starts.values()) < starts[leader]:
            raise Violation(
                "liveness",
                f"p{p} replicas did not follow leader {leader}'s log start after healing: "
                f"log starts {starts}",
                cluster.seed,
                cluster.events,
            )

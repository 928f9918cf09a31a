"""Runs of the transaction simulation (:mod:`broker.sim.txn`): random
schedules of producers and faults, and scripted scenarios of the holes
KIP-890 closes.

:func:`run_txn_random` draws everything from its seed: producers of a
few transactional ids (zombies among them), power losses of any broker
(the coordinator's too, under the power-loss guard), kills, restarts,
pauses, isolation, one-way cuts, message loss, leader moves; then it
heals, stops new transactions, waits out every timeout and marker, and
checks the end (:func:`~broker.sim.txn_invariants.check_settled`).  It
never raises for a broken invariant: the :class:`TxnSimResult` names it.

Each scenario of :data:`TXN_SCENARIOS` passes with every rule, and with
its defence switched off (:class:`~broker.sim.txn_config.TxnSimConfig`'s
rule switches) the invariant it names fires:

- ``kafka-17754``: transaction 1's EndTxn(commit) is delayed until
  transaction 2 of the same producer is open.  With KIP-890 part 2 the
  late request is of an old epoch and changes nothing; with transaction
  version 1 it commits transaction 2, which its producer then aborts
  (``read-committed``).
- ``late-marker``: a held copy of transaction 1's COMMIT marker arrives
  after the coordinator's retry completed it and transaction 2 wrote the
  partition at the marker's (bumped) epoch.  The partition refuses a
  version 2 marker at the epoch of the transaction open there; without
  that it commits transaction 2's record there, which its producer then
  aborts (``read-committed``).
- ``hanging-unadded``: a producer writes to a partition it never added.
  KIP-890 part 1's verification refuses the batch; without it the batch
  opens a transaction there that no marker ends (``hanging-transaction``).
- ``hanging-delayed``: a batch is delayed past its transaction's abort.
  Part 1 refuses it, and so does part 2's bumped marker epoch; with both
  off it opens a transaction no marker ends (``hanging-transaction``).
- ``partial-commit``: with the coordinator completing after its first
  marker, a commit is marked in only one of its partitions
  (``complete-after-markers``).
- ``lso-past-open``: with readers bounded by the HW instead of the last
  stable offset, a reader passes an open transaction (``stable-offset``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace

from broker.sim.cluster import CLIENT, CONTROLLER
from broker.sim.invariants import Violation
from broker.sim.schedule import _check_recovered
from broker.sim.txn import TxnSimCluster
from broker.sim.txn_clients import TxnPlan
from broker.sim.txn_config import TxnSimConfig
from broker.sim.txn_invariants import TxnInvariantChecker, check_settled
from broker.sim.txn_messages import (
    EndTxnRequest,
    MarkerRequest,
    TxnBody,
    TxnProduce,
    TxnRequest,
)
from metadata.records import NO_LEADER

__all__ = [
    "ALL_TXN_FAULTS",
    "TXN_SCENARIOS",
    "TxnFault",
    "TxnScenario",
    "TxnScenarioRun",
    "TxnSimResult",
    "run_txn_random",
    "run_txn_scenario",
    "settle",
]


class TxnFault(enum.Enum):
    POWER_LOSS = "power-loss"
    KILL = "kill"
    RESTART = "restart"
    PAUSE = "pause"
    RESUME = "resume"
    ISOLATE = "isolate"
    CUT = "cut"
    LOSSY = "lossy"
    HEAL = "heal"
    MOVE_LEADER = "move-leader"


ALL_TXN_FAULTS: tuple[TxnFault, ...] = tuple(TxnFault)

# At most this many producer instances in a random run (replacements of
# fenced ones and zombies), so that a run stays short.
MAX_PRODUCERS = 12


@dataclass(frozen=True, slots=True)
class TxnSimResult:
    seed: int
    steps: int
    events: int
    virtual_ms: int
    violation: str | None
    rule: str | None
    committed: int
    aborted: int
    unknown: int
    producers: int
    duplicated: int
    messages_sent: int
    messages_dropped: int
    trace: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.violation is None


def settle(
    cluster: TxnSimCluster, checker: TxnInvariantChecker, quiet_ms: int | None = None
) -> None:
    """Heal everything, restart and resume every broker, let no producer
    begin another transaction, wait out every timeout and marker (the
    invariants still checked after every event), then check the end."""
    cluster.heal()
    for b, broker in sorted(cluster.brokers.items()):
        if broker.paused:
            cluster.resume(b)
        if not broker.alive:
            cluster.restart(b)
    for producer in cluster.producers.values():
        producer.stopped = True
    config = cluster.txn_config
    if quiet_ms is None:
        quiet_ms = config.txn_timeout_ms + config.delivery_timeout_ms + 6_000
    cluster.run_for(quiet_ms)
    _check_recovered(cluster)
    check_settled(cluster, checker)


def run_txn_random(
    seed: int,
    steps: int = 3_000,
    config: TxnSimConfig | None = None,
    faults: tuple[TxnFault, ...] = ALL_TXN_FAULTS,
) -> TxnSimResult:
    """One seeded run: ``steps`` events of producers and faults, then the
    quiet healed end."""
    config = config or TxnSimConfig()
    checker = TxnInvariantChecker()
    cluster = TxnSimCluster(seed, config, check=checker)
    violation: Violation | None = None
    try:
        ids = [f"tx{i}" for i in range(config.transactional_ids)]
        latest = {tid: cluster.start_producer(tid) for tid in ids}
        _faults(cluster, steps, faults, latest)
        settle(cluster, checker)
    except Violation as found:
        violation = found
        cluster.log(f"VIOLATION {found}")
    outcomes = [t.outcome for t in cluster.client_txns.values()]
    return TxnSimResult(
        seed=seed,
        steps=steps,
        events=cluster.events,
        virtual_ms=cluster.now_ms,
        violation=None if violation is None else str(violation),
        rule=None if violation is None else violation.rule,
        committed=outcomes.count("committed"),
        aborted=outcomes.count("aborted"),
        unknown=outcomes.count("unknown"),
        producers=len(cluster.producers),
        duplicated=cluster.duplicated,
        messages_sent=cluster.messages_sent,
        messages_dropped=cluster.messages_dropped,
        trace=tuple(cluster.trace),
    )


def _faults(
    cluster: TxnSimCluster, steps: int, faults: tuple[TxnFault, ...], latest: dict[str, int]
) -> None:
    rng = cluster.rng
    config = cluster.txn_config
    while cluster.events < steps:
        cluster.run_for(rng.randint(20, 200), max_events=steps - cluster.events)
        if cluster.events >= steps:
            break
        roll = rng.random()
        room = len(cluster.producers) < MAX_PRODUCERS
        if config.zombie_rate and roll < config.zombie_rate and room:
            # A second instance: its InitProducerId fences the first, which
            # keeps sending what it had in flight.
            tid = rng.choice(sorted(latest))
            latest[tid] = cluster.start_producer(tid)
        elif faults and roll < 0.4:
            fault = rng.choice(faults)
            if TxnFault.RESTART in faults and rng.random() < 0.4:
                fault = TxnFault.RESTART
            elif TxnFault.HEAL in faults and rng.random() < 0.15:
                fault = TxnFault.HEAL
            _fault(cluster, fault)
        for tid, instance in sorted(latest.items()):
            if cluster.producers[instance].dead and len(cluster.producers) < MAX_PRODUCERS:
                latest[tid] = cluster.start_producer(tid)


def _fault(cluster: TxnSimCluster, fault: TxnFault) -> None:
    rng = cluster.rng
    brokers = sorted(cluster.brokers)
    alive = [b for b in brokers if cluster.brokers[b].alive]
    dead = [b for b in brokers if not cluster.brokers[b].alive]
    if fault is TxnFault.POWER_LOSS and alive:
        # Often the coordinator's broker.
        coordinator = cluster.serving_leader(cluster.state_partition)
        victim = coordinator if coordinator is not None and rng.random() < 0.5 else None
        if victim is None:
            victim = rng.choice(alive)
        if cluster.safe_to_lose_power(victim):
            cluster.power_loss(victim)
        else:
            cluster.kill(victim)
    elif fault is TxnFault.KILL and alive:
        cluster.kill(rng.choice(alive))
    elif fault is TxnFault.RESTART and dead:
        cluster.restart(rng.choice(dead))
    elif fault is TxnFault.PAUSE and alive:
        cluster.pause(rng.choice(alive))
    elif fault is TxnFault.RESUME:
        paused = [b for b in brokers if cluster.brokers[b].paused]
        if paused:
            cluster.resume(rng.choice(paused))
    elif fault is TxnFault.ISOLATE:
        cluster.isolate(rng.choice(brokers))
    elif fault is TxnFault.CUT:
        nodes = [*brokers, CONTROLLER]
        src = rng.choice(nodes)
        cluster.cut_link(src, rng.choice([n for n in [*nodes, CLIENT] if n != src]))
    elif fault is TxnFault.LOSSY:
        cluster.lossy(rng.choice((0.05, 0.2)))
    elif fault is TxnFault.HEAL:
        cluster.heal()
    elif fault is TxnFault.MOVE_LEADER:
        # A preferred-leader election to another in-sync replica (the
        # transaction-state partition's too: the coordinator moves).
        p = rng.choice(sorted(cluster.assignments))
        registration = cluster.controller.partitions[p]
        others = [
            b
            for b in registration.isr
            if b != registration.leader
            and cluster.brokers[b].alive
            and cluster.controller.active(b)
        ]
        if registration.leader != NO_LEADER and others:
            target = rng.choice(others)
            cluster.controller.elect(p, target)
            cluster.action(f"move p{p} leader to {target}")


# -- scenarios -------------------------------------------------------------------------


@dataclass(slots=True)
class TxnScenarioRun:
    """A scripted run: the cluster as it ended, the violation that stopped
    it (None if every invariant and the end check held), and facts."""

    cluster: TxnSimCluster
    violation: Violation | None
    facts: dict[str, object]


@dataclass(frozen=True, slots=True)
class TxnScenario:
    title: str
    script: Callable[[TxnSimCluster, dict[str, object]], None]
    # The config switches that turn the defence off.
    broken: tuple[tuple[str, bool], ...]
    # The invariant (or end check) that fires with the defence off.
    fires: str


def _is_end(commit: bool) -> Callable[[TxnBody], bool]:
    def pick(body: TxnBody) -> bool:
        return (
            isinstance(body, TxnRequest)
            and isinstance(body.request, EndTxnRequest)
            and body.request.commit is commit
        )

    return pick


def _is_produce_to(p: int) -> Callable[[TxnBody], bool]:
    def pick(body: TxnBody) -> bool:
        return isinstance(body, TxnProduce) and body.partition == p

    return pick


def _is_marker_to(p: int) -> Callable[[TxnBody], bool]:
    def pick(body: TxnBody) -> bool:
        return isinstance(body, MarkerRequest) and body.marker.partition == p

    return pick


def _outcomes(cluster: TxnSimCluster) -> list[str]:
    return [t.outcome for _, t in sorted(cluster.client_txns.items())]


def kafka_17754(c: TxnSimCluster, facts: dict[str, object]) -> None:
    """Transaction 1 commits, but its first EndTxn(commit) is held 2.5 s;
    the producer's retry commits it, and transaction 2 (partition 0) is
    open, one record written, when the held request arrives.  Then the
    producer aborts transaction 2."""
    c.delay_next(_is_end(True), 2_500)
    c.start_producer(
        "tx0",
        [TxnPlan(((0, 1),), commit=True), TxnPlan(((0, 1),), commit=False, think_ms=3_000)],
    )
    c.run_for(8_000)
    facts["outcomes"] = _outcomes(c)
    facts["end_answers"] = list(c.end_txn_answers)


def late_marker(c: TxnSimCluster, facts: dict[str, object]) -> None:
    """Transaction 1 commits on partition 0, but the first copy of its
    COMMIT marker there is held 2 s; the coordinator's retry lands and
    completes it, and transaction 2 has written partition 0, at the
    marker's epoch, when the held copy arrives.  Then the producer aborts
    transaction 2."""
    c.delay_next(_is_marker_to(0), 2_000)
    c.start_producer(
        "tx0",
        [TxnPlan(((0, 1),), commit=True), TxnPlan(((0, 1),), commit=False, think_ms=3_000)],
    )
    c.run_for(7_000)
    facts["outcomes"] = _outcomes(c)
    facts["refused"] = [line for line in c.trace if "refuses COMMIT marker" in line]


def hanging_unadded(c: TxnSimCluster, facts: dict[str, object]) -> None:
    """A transaction adds partition 0 but writes partition 1 too (never
    added), then commits."""
    c.start_producer("tx0", [TxnPlan(((0, 1), (1, 1)), commit=True, unadded=frozenset({1}))])
    c.run_for(3_000)
    facts["outcomes"] = _outcomes(c)


def hanging_delayed(c: TxnSimCluster, facts: dict[str, object]) -> None:
    """Every attempt of a transaction's batch to partition 0 is held 5 s:
    the batch expires, the producer aborts the transaction, and the
    attempts land after the abort's marker."""
    c.delay_next(_is_produce_to(0), 5_000, times=10)
    c.start_producer("tx0", [TxnPlan(((0, 1),), commit=True)])
    c.run_for(9_000)
    facts["outcomes"] = _outcomes(c)


def partial_commit(c: TxnSimCluster, facts: dict[str, object]) -> None:
    """A transaction over partitions 0 and 1 commits."""
    c.start_producer("tx0", [TxnPlan(((0, 1), (1, 1)), commit=True)])
    c.run_for(3_000)
    facts["outcomes"] = _outcomes(c)


def lso_past_open(c: TxnSimCluster, facts: dict[str, object]) -> None:
    """A transaction writes partition 0, replicated, and waits 1 s before
    it commits."""
    c.start_producer("tx0", [TxnPlan(((0, 1),), commit=True, think_ms=1_000)])
    c.run_for(3_000)
    facts["outcomes"] = _outcomes(c)


TXN_SCENARIOS: dict[str, TxnScenario] = {
    "kafka-17754": TxnScenario(
        "KAFKA-17754: a delayed EndTxn ends the next transaction",
        kafka_17754,
        (("bump_epoch_on_end", False),),
        "read-committed",
    ),
    "late-marker": TxnScenario(
        "KAFKA-19446: a late copy of a transaction's marker ends the next one",
        late_marker,
        (("refuse_late_markers", False),),
        "read-committed",
    ),
    "hanging-unadded": TxnScenario(
        "the hanging transaction: a write to a partition never added",
        hanging_unadded,
        (("verify_transactional_produce", False),),
        "hanging-transaction",
    ),
    "hanging-delayed": TxnScenario(
        "the hanging transaction: a write delayed past its transaction's end",
        hanging_delayed,
        (("verify_transactional_produce", False), ("bump_epoch_on_end", False)),
        "hanging-transaction",
    ),
    "partial-commit": TxnScenario(
        "a commit marked in only one of its partitions",
        partial_commit,
        (("complete_after_first_marker", True),),
        "complete-after-markers",
    ),
    "lso-past-open": TxnScenario(
        "a read_committed reader bounded by the HW passes an open transaction",
        lso_past_open,
        (("read_to_high_watermark", True),),
        "stable-offset",
    ),
}


def run_txn_scenario(
    name: str,
    *,
    broken: bool = False,
    switches: tuple[tuple[str, bool], ...] | None = None,
    seed: int = 0,
) -> TxnScenarioRun:
    """Run scenario ``name`` with every rule, or with its defence off
    (``broken``), or with the given ``switches`` of the config."""
    scenario = TXN_SCENARIOS.get(name)
    if scenario is None:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(sorted(TXN_SCENARIOS))}")
    chosen = scenario.broken if broken else (switches or ())
    config = replace(TxnSimConfig(), **dict(chosen))  # type: ignore[arg-type]
    checker = TxnInvariantChecker()
    cluster = TxnSimCluster(seed, config, check=checker)
    facts: dict[str, object] = {}
    violation = None
    try:
        cluster.run_for(300)
        scenario.script(cluster, facts)
        settle(cluster, checker)
    except Violation as found:
        violation = found
        cluster.log(f"VIOLATION {found}")
    return TxnScenarioRun(cluster, violation, facts)

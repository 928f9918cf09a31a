"""Kafka's historical replication bugs (``brokers.md`` §1.12, and B5, B7
and B8 of the bug catalogue, §5.7) as scripted schedules of the
simulator. Each runs with every rule in place, when no invariant may fire,
and with its rule broken by its :class:`Bug`, when the invariant named in
:data:`SCENARIOS` fires. A bug is turned on with the
process-wide switch (:func:`bugs.injected`) for the run, so the rule breaks
at its line in the replica state machine or the controller stub.

Scripts fetch explicitly (``auto_fetch`` off) so that each fetch lands
where the recipe says; everything else (heartbeats, fencing, metadata
pulls, ISR expiration, AlterPartition, delayed produces, message delays)
runs as in random schedules, and the invariants are checked after every
event.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace

import bugs
from broker.sim.cluster import CONTROLLER, SimCluster
from broker.sim.config import SimConfig
from broker.sim.invariants import InvariantChecker, Violation
from broker.sim.logs import batches
from bugs import Bug
from metadata.records import NO_LEADER

__all__ = ["SCENARIOS", "Scenario", "ScenarioRun", "run_scenario"]

P = 0
LONG_LAG = 60_000


@dataclass(slots=True)
class ScenarioRun:
    """A scripted run: the cluster as the script left it, the violation
    that stopped it (None if every invariant held), and what the script
    recorded along the way."""

    cluster: SimCluster
    violation: Violation | None
    facts: dict[str, object]


class _Script:
    def __init__(self, config: SimConfig, seed: int) -> None:
        self.c = SimCluster(seed, config, auto_fetch=False, check=InvariantChecker())
        self.facts: dict[str, object] = {}
        self.settle()

    def settle(self, ms: int = 300) -> None:
        self.c.run_for(ms)

    def round_trip(self) -> None:
        self.c.run_for(2 * self.c.config.max_delay_ms + 1)

    def fetch(self, broker: int, times: int = 1, max_bytes: int | None = None) -> None:
        for _ in range(times):
            self.c.fetch(broker, P, max_bytes)
            self.round_trip()

    def produce(self, acks: int = -1) -> int:
        op = self.c.produce(P, acks)
        self.c.action(f"produce op {op} acks={acks}")
        self.round_trip()
        return op

    def keep_fetching(self, brokers: tuple[int, ...], ms: int) -> None:
        """Time passes while ``brokers`` keep fetching."""
        end = self.c.now_ms + ms
        while self.c.now_ms < end:
            for b in brokers:
                self.c.fetch(b, P)
            self.round_trip()

    def fence_wait(self) -> None:
        """Long enough for the controller to fence a silent broker and the
        brokers to learn the change."""
        self.settle(self.c.config.session_timeout_ms + 400)

    def end_offset(self, broker: int) -> int:
        return self.c.brokers[broker].logs[P].log_end_offset

    def hw(self, broker: int) -> int:
        return self.c.brokers[broker].logs[P].high_watermark

    def status(self, op: int) -> str:
        return self.c.outcomes[op].status


def _config(brokers: int, min_isr: int, **fields: object) -> SimConfig:
    base = SimConfig(
        brokers=brokers,
        partitions=1,
        replication_factor=brokers,
        min_insync_replicas=min_isr,
        # acks=all produces wait as long as a script needs.
        produce_timeout_ms=60_000,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def r1(s: _Script) -> None:
    """KIP-101 scenario 1: the follower fetched m2 but not yet the HW that
    covers it; it restarts (fast: still in the ISR), then the leader dies
    and it is elected. Without truncation to the HW it still has m2."""
    m1 = s.produce()
    s.fetch(1, 2)
    m2 = s.produce()
    s.fetch(1, 2)
    s.facts["acked"] = [s.status(m1), s.status(m2)]
    s.facts["follower"] = (s.end_offset(1), s.hw(1))
    s.c.kill(1)
    s.c.restart(1)
    s.settle()
    s.c.kill(0)
    s.fence_wait()
    s.facts["leader"] = s.c.serving_leader(P)


def r2(s: _Script) -> None:
    """KIP-101 scenario 2: both replicas lose power; the leader had synced
    m2, the follower had not. The follower comes back first, leads, and
    takes m3 at m2's offset; then the old leader comes back and follows."""
    s.produce()
    s.fetch(1, 2)
    s.c.flush(0)
    s.c.flush(1)
    s.produce(acks=1)
    s.c.flush(0)
    s.fetch(1)  # m2 reaches the follower, unsynced; the HW stays 1
    s.c.power_loss(0)
    s.c.power_loss(1)
    s.c.restart(1)
    s.fence_wait()
    s.facts["leader"] = s.c.serving_leader(P)
    s.produce(acks=1)  # m3
    s.c.restart(0)
    s.settle()
    s.fetch(0, 4)
    s.facts["logs"] = [batches(s.c.brokers[b].logs[P]) for b in (0, 1)]


def r3(s: _Script) -> None:
    """KIP-279: leaders alternate 0, 1, 0, 1, 0 with writes nobody
    replicates; then 1 follows 0 and must find where their logs part (in two
    rounds: it does not know the leader's epoch)."""
    s.produce(acks=1)
    s.produce(acks=1)
    s.fetch(1, 2)
    for leader, writes in ((1, 1), (0, 2), (1, 1), (0, 1)):
        s.c.controller.elect(P, leader)
        s.settle()
        for _ in range(writes):
            s.produce(acks=1)
    s.fetch(1, 6)
    s.facts["truncations"] = [
        line.split("truncates ")[1] for line in s.c.trace if "truncates" in line
    ]
    s.facts["ends"] = (s.end_offset(0), s.end_offset(1))


def r4(s: _Script) -> None:
    """KAFKA-7128, min ISR 2: replica 2 stops at offset 5 and leaves the ISR;
    5..9 are acknowledged by 0 and 1; 0 dies and 1 leads with its HW still
    5 (frozen, the ISR is {1}); 2 comes back and fetches one batch; then 1
    stops. 2 must not have joined the ISR: it lacks 6..9."""
    for _ in range(5):
        s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    s.c.kill(2)
    s.fence_wait()
    acked = [s.produce() for _ in range(5)]
    s.fetch(1, 2)
    s.facts["acked"] = [s.status(op) for op in acked]
    s.c.kill(0)
    s.fence_wait()
    s.facts["leader1"] = (s.c.serving_leader(P), s.hw(1))
    s.c.restart(2)
    s.settle()
    s.fetch(2, 1, max_bytes=1)
    s.settle()
    s.facts["isr"] = s.c.controller.partitions[P].isr
    s.c.kill(1)
    s.fence_wait()
    s.facts["leader_after"] = s.c.controller.partitions[P].leader
    s.c.restart(1)
    s.settle()


def r5(s: _Script) -> None:
    """KAFKA-15583, min ISR 2: the followers stop fetching and leave the
    ISR; producers go on with acks=all and acks=1; a consumer reads; the
    leader loses power and an ELR member leads."""
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    s.produce(acks=1)
    s.settle(s.c.config.replica_lag_time_max_ms + 600)
    s.facts["isr"] = s.c.controller.partitions[P].isr
    refused = s.produce()
    s.produce(acks=1)
    s.produce(acks=1)
    s.settle()
    s.facts["refused"] = s.c.outcomes[refused].error
    s.facts["hw"] = s.hw(0)
    s.c.poll(P)
    s.c.power_loss(0)
    s.fence_wait()
    s.facts["leader"] = s.c.serving_leader(P)


def r9(s: _Script) -> None:
    """KIP-966, min ISR 2: replica 2 leaves the ISR, then replica 1 (the ISR
    is below min: 1 is an eligible leader replica). The leader takes acks=1
    writes alone, then loses power with nothing synced. ELR elects 1; with
    no ELR the leader, the last ISR member, comes back without its tail."""
    lag = s.c.config.replica_lag_time_max_ms
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    s.produce()
    s.keep_fetching((1,), lag + 600)
    s.facts["isr1"] = s.c.controller.partitions[P].isr
    s.produce()
    s.fetch(1)
    s.settle(lag + 600)
    s.facts["isr2"] = s.c.controller.partitions[P].isr
    s.facts["elr"] = s.c.controller.partitions[P].elr
    s.produce(acks=1)
    s.produce(acks=1)
    s.c.power_loss(0)
    s.fence_wait()
    s.facts["leader"] = s.c.controller.partitions[P].leader
    if s.facts["leader"] == NO_LEADER:
        s.c.restart(0)
        s.settle()


def r10(s: _Script) -> None:
    """Jepsen's Kafka 0.8 test, min ISR 2: the followers are cut off from the
    leader, the ISR shrinks to the leader, producers keep writing acks=all;
    the leader loses power; heal. With min ISR the writes are refused, so
    nothing acknowledged is lost when an ELR member leads."""
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    for follower in (1, 2):
        s.c.cut_link(0, follower)
        s.c.cut_link(follower, 0)
    # A follower at the leader's end counts as caught up however long ago
    # it fetched (Replica.isCaughtUp): the leader gets a write first.
    s.produce(acks=1)
    s.settle(s.c.config.replica_lag_time_max_ms + 600)
    s.facts["isr"] = s.c.controller.partitions[P].isr
    ops = [s.produce() for _ in range(3)]
    s.settle()
    s.facts["outcomes"] = [(s.c.outcomes[op].status, s.c.outcomes[op].error) for op in ops]
    s.c.power_loss(0)
    s.fence_wait()
    s.c.heal()
    s.settle()
    s.facts["leader"] = s.c.serving_leader(P)


def b2(s: _Script) -> None:
    """B2 (KIP-279) under a sever, min ISR 2: leader 0 is cut off from the
    other brokers only (``sever-partition-leader``: it keeps its controller
    session, so it is not fenced and learns every election) and appends x
    alone in its epoch; a preferred election moves the partition to 1,
    which appends y at x's offset and the next (2 fetches them); a second
    one moves it back to 0, still in the ISR (the lag has not passed),
    before the heal. 1 and 2 then ask 0 for the end of an epoch it never
    had; 0 answers with its end of the epoch before, past their own end of
    it. By the leader's epoch they cut at their own end of that epoch and
    fetch x; by offset they keep y below 0's x."""
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    start = s.end_offset(0)
    s.c.sever(0)
    s.produce(acks=1)
    s.facts["x"] = (start, s.end_offset(0))
    s.c.controller.elect(P, 1)
    s.settle()
    # More of y than of x: the follower's tail by offset then stays in the
    # new leader's epoch, its epoch cache consistent, and only the replicas'
    # records at one offset tell them apart.
    s.produce(acks=1)
    s.produce(acks=1)
    s.fetch(2, 2)
    s.facts["y"] = (s.end_offset(1), s.end_offset(2))
    s.c.controller.elect(P, 0)
    s.settle()
    s.facts["leader"] = s.c.serving_leader(P)
    s.c.heal()
    s.settle()
    acked = s.produce()
    s.fetch(1, 4)
    s.fetch(2, 4)
    s.facts["acked"] = s.status(acked)
    s.facts["logs"] = [batches(s.c.brokers[b].logs[P]) for b in (0, 1, 2)]


def _wait_for_pending(s: _Script, broker: int, limit_ms: int) -> None:
    """Run events until ``broker``'s replica has an AlterPartition in
    flight (at most ``limit_ms`` of virtual time); its kind and replicas
    are recorded."""
    replica = s.c.brokers[broker].replicas[P]
    end = s.c.now_ms + limit_ms
    while replica.isr_state.pending is None and s.c.now_ms < end and s.c.step():
        pass
    pending = replica.isr_state.pending
    s.facts["pending"] = None if pending is None else (pending.kind.value, pending.replicas)


def b5(s: _Script) -> None:
    """B5, min ISR 2: an acks=all write while both followers are in the ISR
    but have not fetched it; the leader dies and a follower leads. With the
    HW at the leader's LEO the write was answered at its append."""
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    op = s.produce()
    s.facts["status"] = s.status(op)
    s.c.kill(0)
    s.fence_wait()
    s.facts["leader"] = s.c.serving_leader(P)


def b7(s: _Script) -> None:
    """B7 (KIP-497), min ISR 1: the followers stop fetching; the leader's
    link to the controller is cut, so its shrink of the ISR to itself stays
    pending (never committed). An acks=all write then; the controller
    fences the silent leader and a follower, still in the committed ISR,
    leads."""
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    s.produce(acks=1)  # the followers fall behind the leader's LEO
    s.settle(s.c.config.replica_lag_time_max_ms // 2)
    s.c.cut_link(0, CONTROLLER)
    _wait_for_pending(s, 0, s.c.config.replica_lag_time_max_ms)
    op = s.produce()
    s.facts["status"] = s.status(op)
    s.facts["isr"] = s.c.controller.partitions[P].isr
    s.fence_wait()
    s.facts["leader"] = s.c.serving_leader(P)


def b8(s: _Script) -> None:
    """B8 (KIP-903), min ISR 2: replica 2 left the ISR and catches up; its
    fetch at the leader's end has the leader ask to add it back with its
    broker epoch, but before the controller sees the request 2 loses power
    (its unsynced records with it) and registers again under a new epoch.
    Then 0 and 1 die."""
    s.produce()
    s.fetch(1, 2)
    s.fetch(2, 2)
    s.c.kill(2)
    s.fence_wait()
    s.c.restart(2)
    s.settle()
    acked = [s.produce() for _ in range(3)]
    s.fetch(1, 2)
    s.facts["acked"] = [s.status(op) for op in acked]
    s.fetch(2)  # the three records, not synced
    s.c.fetch(2, P)  # at the leader's end: the leader proposes 2 for the ISR
    _wait_for_pending(s, 0, 100)
    s.c.power_loss(2)
    s.c.restart(2)
    s.settle()
    s.facts["isr"] = s.c.controller.partitions[P].isr
    s.c.kill(0)
    s.fence_wait()
    s.c.kill(1)
    s.fence_wait()
    s.facts["leader"] = s.c.controller.partitions[P].leader


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario: its script and shape, the bug that breaks its
    rule, and the invariant that then fires."""

    name: str
    script: Callable[[_Script], None]
    brokers: int
    min_isr: int
    bug: Bug
    fires: str
    options: tuple[tuple[str, object], ...] = ()


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "R1",
            r1,
            2,
            1,
            Bug.TRUNCATE_TO_HW_ON_BECOME_FOLLOWER,
            "acked-on-leader",
            (("restart_keeps_isr", True), ("replica_lag_time_max_ms", LONG_LAG)),
        ),
        Scenario(
            "R2",
            r2,
            2,
            1,
            Bug.NO_DIVERGENCE_CHECK,
            "replicas-agree",
            (("restart_keeps_isr", True), ("replica_lag_time_max_ms", LONG_LAG)),
        ),
        Scenario(
            "R3",
            r3,
            2,
            1,
            Bug.TRUNCATE_BY_OFFSET,
            "replicas-agree",
            (("replica_lag_time_max_ms", LONG_LAG),),
        ),
        Scenario(
            "R4",
            r4,
            3,
            2,
            Bug.EXPAND_WITHOUT_EPOCH_START,
            "acked-on-leader",
            (("replica_lag_time_max_ms", LONG_LAG),),
        ),
        Scenario("R5", r5, 3, 2, Bug.HW_UNDER_MIN_ISR, "consumed-on-leader"),
        Scenario(
            "B2",
            b2,
            3,
            2,
            Bug.TRUNCATE_BY_OFFSET,
            "replicas-agree",
            (("replica_lag_time_max_ms", LONG_LAG),),
        ),
        Scenario("R9", r9, 3, 2, Bug.NO_ELR, "acked-on-leader"),
        Scenario("R10", r10, 3, 2, Bug.IGNORE_MIN_ISR, "acked-on-leader"),
        Scenario(
            "B5",
            b5,
            3,
            2,
            Bug.HW_AT_LEADER_LEO,
            "acked-on-leader",
            (("replica_lag_time_max_ms", LONG_LAG),),
        ),
        Scenario(
            "B7",
            b7,
            3,
            1,
            Bug.PENDING_SHRINK_COUNTS,
            "acked-on-leader",
            (("replica_lag_time_max_ms", 1_000),),
        ),
        Scenario(
            "B8",
            b8,
            3,
            2,
            Bug.EXPAND_WITH_INELIGIBLE,
            "acked-on-leader",
            (("replica_lag_time_max_ms", LONG_LAG),),
        ),
    )
}


def run_scenario(name: str, *, broken: bool = False, seed: int = 0) -> ScenarioRun:
    """Run scenario ``name`` (with its rule broken if ``broken``); the
    violation that stopped it, if any, is in the result."""
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    config = _config(scenario.brokers, scenario.min_isr, **dict(scenario.options))
    with bugs.injected(scenario.bug) if broken else nullcontext():
        script = _Script(config, seed)
        violation = None
        try:
            scenario.script(script)
        except Violation as found:
            violation = found
            script.c.log(f"VIOLATION {found}")
    return ScenarioRun(script.c, violation, script.facts)

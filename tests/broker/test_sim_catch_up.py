"""The ``elect-catching-up-follower`` fault's sequence (KAFKA-7128, B4) in
the broker simulator, with the followers fetching on their own (not
scripted fetch by fetch as R4 is): a follower severed until it leaves the
ISR, the leader killed, the heal once the other follower leads, and the
severed follower elected the moment the controller has it back in the
ISR.  What decides the outcome is whether the follower, once re-admitted
at the new leader's frozen HW, has fetched up to that leader's epoch start
before it learns of its election."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import bugs
from broker.sim.cluster import SimCluster
from broker.sim.config import SimConfig
from broker.sim.invariants import InvariantChecker, Violation
from bugs import Bug

P = 0


class _SlowFollower(SimCluster):
    """Only ``slow`` fetches one batch at a time; the others in bulk."""

    slow = -1

    def fetch(self, broker_id: int, p: int, max_bytes: int | None = None) -> bool:
        return super().fetch(broker_id, p, 1 if broker_id == self.slow else max_bytes)


@dataclass(frozen=True, slots=True)
class CatchUp:
    rule: str | None
    # At the election: the new leader's HW and epoch start, and the severed
    # follower's log end.
    hw: int = -1
    start: int = -1
    follower_end: int = -1


CHUNK_MS = 1_000
"""The other follower's held fetches in a chunked catch-up (the chaos
harness's replica.fetch.wait.max.ms 1000, with a min bytes no chunk of the
test's writes reaches)."""


def _catch_up(
    seed: int, *, broken: bool, every_follower_one_batch: bool, chunked: bool = False
) -> CatchUp:
    config = SimConfig(
        brokers=3,
        partitions=1,
        replication_factor=3,
        min_insync_replicas=2,
        produce_timeout_ms=60_000,
        replica_fetch_max_bytes=1 if every_follower_one_batch else None,
    )
    switch = bugs.injected(Bug.EXPAND_WITHOUT_EPOCH_START) if broken else contextlib.nullcontext()
    with switch:
        c = _SlowFollower(seed, config, check=InvariantChecker())
        try:
            c.run_for(300)
            for _ in range(20):
                c.produce(P)
                c.run_for(20)
            leader = c.controller.partitions[P].leader
            follower = max(r for r in c.controller.partitions[P].isr if r != leader)
            if not every_follower_one_batch:
                c.slow = follower
            if chunked:
                # The other follower, the next leader, fetches in chunks from
                # the sever to the election.
                [other] = [r for r in c.controller.partitions[P].isr if r not in (leader, follower)]
                c.held_fetches[other] = CHUNK_MS
            c.sever(follower)
            end = c.now_ms + 10_000
            while follower in c.controller.partitions[P].isr and c.now_ms < end:
                c.produce(P)
                c.run_for(20)
            for _ in range(40):
                c.produce(P)
                c.run_for(20)
            c.kill(leader)
            c.run_for(config.session_timeout_ms + 400)
            other = c.controller.partitions[P].leader
            assert other not in (leader, follower)
            c.heal()
            end = c.now_ms + 20_000
            while follower not in c.controller.partitions[P].isr and c.now_ms < end and c.step():
                pass
            seen = CatchUp(
                None,
                c.brokers[other].logs[P].high_watermark,
                c.brokers[other].replicas[P].leader_epoch_start_offset or -1,
                c.brokers[follower].logs[P].log_end_offset,
            )
            c.controller.elect(P, follower)
            c.held_fetches.clear()
            c.run_for(500)
            c.restart(leader)
            c.run_for(1_000)
            return seen
        except Violation as found:
            return CatchUp(found.rule)


def test_with_the_rule_the_follower_rejoins_at_the_epoch_start_and_nothing_is_lost() -> None:
    for every in (True, False):
        for seed in range(5):
            seen = _catch_up(seed, broken=False, every_follower_one_batch=every)
            assert seen.rule is None, (every, seed)
            assert seen.follower_end >= seen.start > seen.hw, (every, seed, seen)


def test_broken_the_severed_follower_alone_fetching_one_batch_loses_acknowledged_records() -> None:
    # The new leader fetched in bulk, so its HW is several records below its
    # epoch start; the follower, re-admitted at that HW, needs a fetch per
    # batch to reach it and learns of its election first.
    rules = [_catch_up(s, broken=True, every_follower_one_batch=False).rule for s in range(10)]
    assert rules.count("acked-on-leader") >= 5, rules
    assert set(rules) <= {"acked-on-leader", None}


def test_broken_with_every_follower_fetching_one_batch_the_follower_wins_the_race() -> None:
    # The new leader fetched one batch at a time too: its HW is a batch or
    # two below its epoch start, and the follower, re-admitted there, has
    # fetched those before the election reaches it, so it leads with every
    # acknowledged record although it rejoined early.
    seen = [_catch_up(s, broken=True, every_follower_one_batch=True) for s in range(5)]
    assert all(s.rule is None for s in seen), seen
    assert any(s.follower_end < s.start for s in seen), seen


def test_chunked_fetches_widen_the_window_and_with_the_rule_nothing_is_lost() -> None:
    # The other follower, whose fetches its leader holds a second, learns
    # the HW a chunk late: once it leads, its HW is a second of writes (a
    # produce every 20 ms) below its epoch start instead of a fetch's few.
    for seed in range(4):
        bulk = _catch_up(seed, broken=False, every_follower_one_batch=False)
        chunked = _catch_up(seed, broken=False, every_follower_one_batch=False, chunked=True)
        assert bulk.rule is None and chunked.rule is None, (seed, bulk, chunked)
        assert bulk.start - bulk.hw <= 10, (seed, bulk)
        assert chunked.start - chunked.hw >= 40, (seed, chunked)
        # With the rule the follower rejoins only at the epoch start.
        assert chunked.follower_end >= chunked.start, (seed, chunked)


def test_broken_with_chunked_fetches_the_follower_is_elected_inside_the_chunk() -> None:
    seen = [
        _catch_up(s, broken=True, every_follower_one_batch=False, chunked=True) for s in range(4)
    ]
    rules = [s.rule for s in seen]
    assert rules.count("acked-on-leader") >= 3, rules
    assert set(rules) <= {"acked-on-leader", None}

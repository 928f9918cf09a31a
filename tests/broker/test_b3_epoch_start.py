"""B3 (no-epoch-start-entry, KIP-279) on the broker simulator: why the
catalogue's faults cannot make it lose or misplace a record in kq.

A new leader that does not record ``(epoch, LEO)`` when it is elected
answers a follower whose last fetched epoch it never saw (the follower led
an epoch in between, with writes nobody fetched) ``OFFSET_OUT_OF_RANGE``
instead of the divergence point. The follower truncates only to the
leader's LEO when it is longer (``fetchOffsetAndTruncate``), keeps its
divergent tail above the HW and waits; the leader counts no refused fetch.
The leader's first append of its epoch writes the very entry the bug left
out, and the next fetch is answered with the divergence as without the bug.
So the bug stalls the follower until the next write, and nothing else."""

from __future__ import annotations

from dataclasses import replace

import bugs
from broker.sim.cluster import SimCluster
from broker.sim.config import SimConfig
from broker.sim.invariants import InvariantChecker
from broker.sim.logs import batches
from bugs import Bug

P = 0


class _Run:
    def __init__(self) -> None:
        config = replace(
            SimConfig(brokers=2, partitions=1, replication_factor=2, min_insync_replicas=1),
            produce_timeout_ms=60_000,
            replica_lag_time_max_ms=60_000,
        )
        self.c = SimCluster(0, config, auto_fetch=False, check=InvariantChecker())
        self.c.run_for(300)

    def round_trip(self) -> None:
        self.c.run_for(2 * self.c.config.max_delay_ms + 1)

    def produce(self, count: int) -> None:
        for _ in range(count):
            self.c.produce(P, 1)
            self.round_trip()

    def fetch(self, broker: int, times: int) -> None:
        for _ in range(times):
            self.c.fetch(broker, P)
            self.round_trip()

    def elect(self, leader: int) -> None:
        self.c.controller.elect(P, leader)
        self.c.run_for(300)

    def log(self, broker: int) -> dict[int, tuple[int, int]]:
        return batches(self.c.brokers[broker].logs[P])

    def epochs(self, broker: int) -> list[int]:
        return [e.epoch for e in self.c.brokers[broker].logs[P].epoch_cache.entries]


def _fast_failovers() -> _Run:
    """Leaders 0, 1, 0, 1 with writes nobody fetched: 1 wrote offsets 3 and
    4 in epoch 1, 0 wrote offset 3 in epoch 2; 1 leads epoch 3 and has not
    written in it when 0 fetches."""
    run = _Run()
    run.produce(3)
    run.fetch(1, 2)
    run.elect(1)
    run.produce(2)
    run.elect(0)
    run.produce(1)
    run.elect(1)
    run.fetch(0, 3)
    return run


def test_b3_stalls_the_follower_until_the_leaders_first_append_and_loses_nothing() -> None:
    with bugs.injected(Bug.NO_EPOCH_START_ENTRY):
        run = _fast_failovers()
        # The leader of epoch 3 never recorded it: 0's epoch 2 is past its
        # cache, so 0 is answered out of range and keeps its offset 3.
        assert run.epochs(1) == [0, 1]
        assert run.log(0)[3][0] == 2 and run.log(1)[3][0] == 1
        assert run.log(0) != run.log(1)
        # The first write of epoch 3 records the entry; 0 then truncates to
        # where epoch 0 ends for both and takes the leader's log.
        run.produce(1)
        assert run.epochs(1) == [0, 1, 3]
        run.fetch(0, 3)
        assert run.log(0) == run.log(1)
        assert sorted(run.log(0)) == [0, 1, 2, 3, 4, 5]


def test_without_b3_the_follower_finds_the_divergence_at_once() -> None:
    run = _fast_failovers()
    assert run.epochs(1) == [0, 1, 3]
    assert run.log(0) == run.log(1)

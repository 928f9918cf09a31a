"""Random histories of two or three replicas of one partition: produces with acks=1
and acks=all, follower fetches, the passage of time (ISR shrinks), power
losses that keep only synced bytes (a torn tail at random) followed by a
restart, and leader changes within the ISR. After every step:

- no acks=all record acknowledged NONE, and nothing below any HW a leader
  reached, is missing from the current leader;
- every replica agrees with the leader below its own HW;
- on a leader the HW never goes backwards within its leadership, and the
  leader epoch never goes backwards;
- the leader's latest epoch in its log's cache is its leader epoch.

A power loss is drawn only for a broker that leaves another ISR member
behind: losing the last in-sync copy of unsynced data is the loss Kafka
documents (brokers.md §1.10, R9), not a bug.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from unittest import mock

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from broker.replica import PartitionReplica
from broker.replica import partition as partition_module
from broker.replica.types import DivergingEpoch
from metadata.image import PartitionRegistration
from partition_log.divergence import TruncationStep
from partition_log.epoch_cache import LeaderEpochCache
from partition_log.log import LogConfig
from tests.broker.cluster import BatchId, Cluster, batches

LAG = 10_000

Op = tuple[str, int]

OPS = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from([1, -1])),
    st.tuples(st.just("fetch"), st.integers(0, 2)),
    # A fetch of one batch (a small max_bytes).
    st.tuples(st.just("fetch_one"), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.sampled_from([1_000, LAG + 1])),
    st.tuples(st.just("crash"), st.integers(0, 2)),
    # A restart faster than the session timeout: still registered and in
    # the ISR, nothing lost (a clean shutdown).
    st.tuples(st.just("bounce"), st.integers(0, 2)),
    st.tuples(st.just("elect"), st.integers(0, 2)),
)


def check(c: Cluster, committed: dict[int, BatchId], hw_of: dict[tuple[int, int], int]) -> None:
    p = c.partition
    leader = c.leader
    assert c.lost_acks() == [], "an acknowledged acks=all record is missing from the leader"
    assert c.lost(committed) == {}, "a committed record is missing from the leader"
    have = batches(leader.log)
    for node in c.nodes:
        mine = batches(node.log)
        below = {o: b for o, b in mine.items() if o < node.log.high_watermark}
        assert all(have.get(o) == b for o, b in below.items()), (
            f"replica {node.broker_id} disagrees with the leader below its HW"
        )
    key = (p.leader, p.leader_epoch)
    hw = leader.log.high_watermark
    assert hw >= hw_of.get(key, 0), "the HW went backwards on a leader"
    hw_of[key] = hw
    assert leader.log.epoch_cache.latest_epoch == p.leader_epoch == leader.replica.leader_epoch


HISTORIES = given(
    ops=st.lists(OPS, min_size=10, max_size=80),
    replicas=st.sampled_from([2, 3]),
    min_isr=st.sampled_from([1, 2]),
    synced=st.booleans(),
    rng=st.randoms(use_true_random=False),
)


def run_history(
    ops: list[Op], replicas: int, min_isr: int, synced: bool, rng: random.Random
) -> None:
    # synced: flush.messages=1, so a power loss keeps every append.
    config = LogConfig(flush_messages=1 if synced else None)
    c = Cluster(replicas, min_isr=min_isr, lag_ms=LAG, elr=True, log_config=config)
    committed: dict[int, BatchId] = {}
    hw_of: dict[tuple[int, int], int] = {}
    epochs = [c.partition.leader_epoch]
    for step, (kind, broker) in enumerate(ops):
        arg = broker % replicas if kind not in ("produce", "tick") else broker
        p = c.partition
        if kind == "produce":
            c.produce(b"v%d" % step, acks=arg)
        elif kind in ("fetch", "fetch_one"):
            if arg != p.leader:
                c.fetch(arg, 1 if kind == "fetch_one" else None)
        elif kind == "tick":
            c.tick(arg)
        elif kind == "crash":
            # Another in-sync copy (ISR or, under min ISR, ELR) survives.
            if any(b != arg for b in p.isr) or any(b != arg for b in c.elr):
                c.crash(arg, rng)
        elif kind == "bounce":
            c.bounce(arg)
        elif kind == "elect":
            # A clean election: another ISR member (a preferred-leader
            # election, or a failover before the old leader is fenced).
            others = [b for b in p.isr if b != p.leader]
            if others:
                c.elect(others[arg % len(others)])
        committed |= c.committed()
        check(c, committed, hw_of)
        epochs.append(c.partition.leader_epoch)
    assert epochs == sorted(epochs)
    # Healed: every replica catches up with the leader and all agree.
    for _ in range(4):
        c.tick(1_000)
        c.replicate(3)
    leader_end = c.leader.log.log_end_offset
    assert c.inconsistent() == {}
    assert all(n.log.log_end_offset == leader_end for n in c.nodes)
    check(c, committed | c.committed(), hw_of)


test_random_histories_keep_committed_records = HISTORIES(run_history)


def no_strict_min_isr(monkeypatch: pytest.MonkeyPatch) -> None:
    original = PartitionReplica.maybe_increment_leader_hw

    def without(self: PartitionReplica, now_ms: int) -> bool:
        with mock.patch.object(PartitionReplica, "is_under_min_isr", False):
            return original(self, now_ms)

    monkeypatch.setattr(PartitionReplica, "maybe_increment_leader_hw", without)


def truncation_by_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    def by_offset(
        cache: LeaderEpochCache, log_end_offset: int, high_watermark: int, diverging: DivergingEpoch
    ) -> TruncationStep:
        return TruncationStep(min(diverging.end_offset, log_end_offset), completed=True)

    monkeypatch.setattr(partition_module, "divergence_truncation", by_offset)


def truncation_to_hw_on_become_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    original = PartitionReplica.become_follower

    def become_follower(
        self: PartitionReplica, registration: PartitionRegistration, now_ms: int
    ) -> bool:
        changed = original(self, registration, now_ms)
        self.log.truncate_to(self.log.high_watermark)
        return changed

    monkeypatch.setattr(PartitionReplica, "become_follower", become_follower)


@pytest.mark.parametrize(
    "breaking", [no_strict_min_isr, truncation_by_offset, truncation_to_hw_on_become_follower]
)
def test_the_histories_catch_a_broken_rule(
    breaking: Callable[[pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same histories with strict min ISR (KAFKA-15583, under ELR
    # elections), truncation by epoch (KIP-279) or no truncation to the HW
    # (KIP-101) broken find a loss or a divergence. (KAFKA-7128 needs a
    # longer search: the scenario R4 shows it.)
    breaking(monkeypatch)
    search = settings(
        max_examples=500, phases=[Phase.generate], report_multiple_bugs=False, deadline=None
    )(HISTORIES(run_history))
    with pytest.raises(AssertionError):
        search()

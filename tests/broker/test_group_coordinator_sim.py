"""The group coordinator's runtime through failures, simulated
(:mod:`tests.broker.group_sim`): seeded runs of commits, heartbeats, partial
replication, leader changes, power losses, restarts and compaction, checked
after every event; and the named scenarios of the reference notes (§4:
KAFKA-20634, Redpanda CORE-16998/17000/17001), each shown to fail with the
rule that prevents it broken."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.group import codec
from broker.group.api import OffsetFetchRequest
from broker.group.records import OffsetCommitKey
from broker.group_coordinator import GroupCoordinator
from partition_log import compaction, decode_records
from partition_log.batch import split_batches
from partition_log.compaction import OffsetMap
from tests.broker.group_sim import TOPIC_ID, GroupSim, turns
from tests.broker.images import change

KEY = ("g0", "t", 0)


def run(body: Callable[[GroupSim], Awaitable[None]], seed: int = 0, **options: Any) -> GroupSim:
    """``body`` over a new simulation on its own event loop."""
    made: list[GroupSim] = []

    async def main() -> None:
        sim = GroupSim(seed, **options)
        made.append(sim)
        try:
            await asyncio.wait_for(body(sim), 60)
        finally:
            await sim.stop()

    asyncio.run(main())
    return made[0]


def simulate(seed: int, events: int, **options: Any) -> GroupSim:
    async def body(sim: GroupSim) -> None:
        await sim.run(events)

    return run(body, seed, **options)


# -- seeded runs ---------------------------------------------------------------------------

SIM_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SIM_SETTINGS
@given(seed=st.integers(0, 2**32 - 1), events=st.integers(50, 150))
def test_acknowledged_commits_survive_power_losses_and_leader_changes(
    seed: int, events: int
) -> None:
    simulate(seed, events)


@SIM_SETTINGS
@given(seed=st.integers(0, 2**32 - 1), events=st.integers(50, 150))
def test_acknowledged_commits_survive_two_offsets_partitions(seed: int, events: int) -> None:
    simulate(seed, events, partitions=2)


@SIM_SETTINGS
@given(seed=st.integers(0, 2**32 - 1), events=st.integers(50, 150))
def test_acknowledged_commits_survive_compaction_and_restarts(seed: int, events: int) -> None:
    simulate(seed, events, power_loss=False, compaction=True)


def test_the_runs_acknowledge_check_and_clean() -> None:
    """The seeded runs are not vacuous: over a few seeds commits are
    acknowledged, every kind of event happens, checks run, members join and
    the cleaner cleans, and power losses take records."""
    acked = checks = cleanings = lost = 0
    events: set[str] = set()
    for seed in range(6):
        for options in ({}, {"partitions": 2}, {"power_loss": False, "compaction": True}):
            sim = simulate(seed, 120, **options)
            acked += sim.stats.acked
            checks += sim.stats.checks
            cleanings += sim.stats.cleanings
            lost += sim.stats.lost_on_crash
            events |= set(sim.stats.events)
            assert any(c.epoch > 0 for c in sim.clients), (seed, options)
    assert acked > 100 and checks > 100 and cleanings > 5, (acked, checks, cleanings)
    # The power losses took unsynced records from the brokers' logs.
    assert lost > 0
    kinds = {"commit", "member-commit", "heartbeat", "fetch", "leader", "crash", "restart"}
    assert kinds | {"compact", "restart-all"} <= events, events


# -- KAFKA-20634 ---------------------------------------------------------------------------


async def kafka_20634(sim: GroupSim) -> None:
    """A commit appended by the old coordinator, then leadership moves to a
    replica that never fetched it."""
    await sim.settle()
    sim.commit("g0", 0, 5)
    await sim.settle()
    assert sim.acked == {KEY: 5}
    lost = sim.commit("g0", 0, 9)
    assert lost is not None and lost.broker == 1
    await turns()
    sim.harvest()
    sim.move_leader(0, leader=2, isr=(2, 3))
    await turns()
    sim.harvest()
    await sim.settle()
    await sim.check()
    # The old coordinator did not answer OK, the new one does not show it.
    assert sim.acked == {KEY: 5}
    answer = await sim.coordinators[2].fetch_offsets(OffsetFetchRequest("g0"))
    assert [o.offset for o in answer.offsets] == [5]


def test_kafka_20634_a_commit_lost_with_its_leader_is_not_acknowledged() -> None:
    run(kafka_20634)


def test_kafka_20634_is_caught_when_a_write_answers_at_its_append(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_wait(self: GroupCoordinator, context: object, end: int) -> None:
        return None

    monkeypatch.setattr(GroupCoordinator, "_committed", no_wait)
    with pytest.raises(AssertionError, match=r"seed 0: an acknowledged commit was lost"):
        run(kafka_20634)


# -- Redpanda: the committed offset changes after a failover ----------------------------------


async def commit_three(sim: GroupSim) -> None:
    await sim.settle()
    for offset in (1, 2, 3):
        sim.commit("g0", 0, offset)
        await sim.settle()
    assert sim.acked == {KEY: 3}


async def shows_three(sim: GroupSim) -> None:
    await sim.settle()
    await sim.check()
    leader = sim.registration(0).leader
    answer = await sim.coordinators[leader].fetch_offsets(OffsetFetchRequest("g0"))
    assert [o.offset for o in answer.offsets] == [3]


async def after_a_leader_change(sim: GroupSim) -> None:
    await commit_three(sim)
    sim.move_leader(0, leader=3, isr=(1, 2, 3))
    await shows_three(sim)


async def after_a_restart_of_every_broker(sim: GroupSim) -> None:
    await commit_three(sim)
    await sim.restart_all()
    await shows_three(sim)


async def after_compaction(sim: GroupSim) -> None:
    await sim.settle()
    # Enough commits of a few keys to fill several segments.
    for round_ in range(1, 16):
        for group in ("g0", "g1", "g2"):
            sim.commit(group, 0, round_)
        await sim.settle()
    for offset in (40, 41, 42):
        sim.commit("g0", 0, offset)
        await sim.settle()
    assert sim.acked[KEY] == 42
    records_before = records(sim, 1)
    assert sim.compact() == 3
    assert records(sim, 1) < records_before // 2
    await sim.check()
    sim.move_leader(0, leader=2, isr=(1, 2, 3))
    await sim.settle()
    await sim.check()
    answer = await sim.coordinators[2].fetch_offsets(OffsetFetchRequest("g0"))
    assert [o.offset for o in answer.offsets] == [42]


def records(sim: GroupSim, broker: int) -> int:
    """How many records broker ``broker``'s log of the offsets partition holds."""
    log = sim.brokers[broker].logs.log(sim.key(0))
    assert log is not None
    data = log.read(log.log_start_offset, 1 << 24, log.log_end_offset)
    return sum(len(list(decode_records(batch))) for batch in split_batches(data))


SCENARIOS = {
    "leader-change": after_a_leader_change,
    "restart-all": after_a_restart_of_every_broker,
    "compaction": after_compaction,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_redpanda_the_committed_offset_survives(name: str) -> None:
    run(SCENARIOS[name])


def load_keeps_the_first_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the load's replay: a commit of a key already loaded is skipped
    (the first value kept instead of the last)."""
    original = GroupCoordinator._replay_stored
    seen: dict[int, set[OffsetCommitKey]] = {}

    def replay(self: GroupCoordinator, context: Any, record: Any, *producer: int) -> None:
        decoded = codec.decode(record.key, record.value)
        if isinstance(decoded.key, OffsetCommitKey) and decoded.value is not None:
            keys = seen.setdefault(id(context), set())
            if decoded.key in keys:
                return
            keys.add(decoded.key)
        original(self, context, record, *producer)

    monkeypatch.setattr(GroupCoordinator, "_replay_stored", replay)


def cleaner_keeps_the_first_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the cleaner: its map keeps each key's first offset and a batch
    keeps the records at or below it (the oldest value survives)."""
    put = OffsetMap.put

    def put_first(self: OffsetMap, key: bytes, offset: int) -> None:
        if self.get(key) is None:
            put(self, key, offset)

    def retains(info: Any, header: Any, offset_map: OffsetMap, now_ms: int) -> bool:
        offset, key, _ = info
        if offset > offset_map.latest_offset:
            return True
        first = None if key is None else offset_map.get(key)
        return first is None or offset <= first

    monkeypatch.setattr(OffsetMap, "put", put_first)
    monkeypatch.setattr(compaction, "_retains", retains)


@pytest.mark.parametrize(
    ("name", "brake"),
    [
        ("leader-change", load_keeps_the_first_commit),
        ("restart-all", load_keeps_the_first_commit),
        ("compaction", cleaner_keeps_the_first_record),
    ],
)
def test_redpanda_is_caught_when_the_rule_is_broken(
    name: str, brake: Callable[[pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    brake(monkeypatch)
    with pytest.raises(AssertionError, match=r"seed 0: .*(differ from its log|was lost)"):
        run(SCENARIOS[name])


# -- a follower behind a cleaned leader -------------------------------------------------------


def test_a_follower_behind_a_cleaned_leader_catches_up() -> None:
    """The batch at a lagging follower's log end was removed by the leader's
    cleaner: the follower takes the next one past the gap (it used to be
    refused OFFSET_OUT_OF_RANGE for ever, the follower never catching up)."""

    async def body(sim: GroupSim) -> None:
        await sim.settle()
        # Broker 3 stops fetching and leaves the ISR; the others go on.
        sim.step_and_publish(change(TOPIC_ID, 0, isr=(1, 2)))
        for round_ in range(1, 16):
            for group in ("g0", "g1"):
                sim.commit(group, 0, round_)
            for _ in range(5):
                sim.fetch_round(followers=(1, 2))
                await turns(5)
            sim.harvest()
        # The leader's cleaner removes the batch at broker 3's log end.
        assert sim.compact((1,)) == 1
        for _ in range(20):
            sim.fetch_round()
            await turns(5)
        ends = [sim.brokers[b].replicas[sim.key(0)].log.log_end_offset for b in (1, 3)]
        assert ends[1] == ends[0], f"broker 3 stopped at {ends[1]}, the leader's end is {ends[0]}"

    run(body)

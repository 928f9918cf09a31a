"""The ``elect-catching-up-follower`` fault (KAFKA-7128's sequence, the
broker simulator's R4): a follower severed until it is out of the ISR, the
leader killed, the heal once another broker leads, the follower elected as
soon as it is back in the ISR, and the killed leader restarted.  The
schedule (pure), the runner's steps against a backend and leadership moves
played by the test, and one real local run in which each step saw what it
waited for."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from pathlib import Path

import pytest

from chaos.leader_moves import ELECT, Move, PartitionView
from chaos.nemesis import (
    BROKER_KINDS,
    CATCH_UP_FAILOVER_S,
    CATCH_UP_HOLD_S,
    CATCH_UP_KIND,
    CATCH_UP_SHRINK_S,
    ELECT_LEADER_KIND,
    FAULT_KINDS,
    NETWORK_KINDS,
    POWER_LOSS_KINDS,
    STRAND_KINDS,
    Action,
    schedule,
)
from chaos.runner import (
    CATCH_UP_CHUNK_MIN_BYTES,
    CATCH_UP_CHUNK_WAIT_MS,
    CATCH_UP_PACE_MS,
    PartitionReplicas,
    RunConfig,
    _Nemesis,
    expand_nemesis,
    storage_environment,
)
from tests.chaos.cluster_scenarios import need_iptables, scratch_tempdir
from tests.chaos.fault_schedules import drawn_schedule, fault_spans
from tests.chaos.strand_fakes import (
    NODES,
    RecordingBackend,
    act_all,
    local_fault_config,
    nemesis_ops,
    recording_nemesis,
    run_local_fault,
)

K = CATCH_UP_KIND

# -- the kind and the schedule -----------------------------------------------------------


def test_the_catch_up_is_an_exclusive_network_fault_of_the_brokers() -> None:
    assert K == "elect-catching-up-follower"
    assert K in set(FAULT_KINDS) & set(BROKER_KINDS) & set(NETWORK_KINDS)
    assert K not in POWER_LOSS_KINDS and K not in STRAND_KINDS
    assert expand_nemesis([K], 6) == [K]
    assert storage_environment(RunConfig(faults=(K,)), {}) == {}
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        expand_nemesis([K], 1)


def _catch_ups(actions: list[Action]) -> list[list[Action]]:
    """The actions from each catch-up's sever to its restart."""
    return fault_spans(actions, (K,), "catch-up")


@pytest.mark.parametrize("seed", range(30))
def test_each_catch_up_is_a_sever_kill_heal_election_and_restart_alone(seed: int) -> None:
    pool = [K, "kill-partition-leader", "isolate-follower", "kill", "pause"]
    actions = drawn_schedule(seed, pool, count=3, needed=K)
    for steps in _catch_ups(actions):
        sever, kill, heal, elect, start = steps  # nothing else comes in between
        assert (sever.f, sever.target, sever.groups) == ("partition", "catch-up", ())
        assert (kill.f, kill.kind, kill.target, kill.nodes) == ("kill", K, "catch-up", ())
        assert kill.time_s == pytest.approx(sever.time_s + CATCH_UP_SHRINK_S)
        assert (heal.f, heal.target) == ("heal", "catch-up")
        assert heal.time_s == pytest.approx(kill.time_s + CATCH_UP_FAILOVER_S)
        assert (elect.f, elect.kind, elect.target) == (ELECT_LEADER_KIND, K, "catch-up")
        assert elect.time_s == heal.time_s
        assert (start.kind, start.target) == (K, "partition-leader")
        assert start.time_s == pytest.approx(heal.time_s + CATCH_UP_HOLD_S)


def test_a_catch_up_needs_its_whole_length_and_is_exempt_from_keep_majority() -> None:
    whole = CATCH_UP_SHRINK_S + CATCH_UP_FAILOVER_S + CATCH_UP_HOLD_S
    for seed in range(10):
        short = schedule(random.Random(seed), NODES, [K], duration_s=whole - 0.5)
        assert [a.f for a in short] == ["heal"]
    assert len(_catch_ups(schedule(random.Random(1), NODES, [K], duration_s=40.0))) >= 2
    # Two nodes: an isolation would leave no majority; the sever keeps the
    # controllers with every node.
    assert _catch_ups(schedule(random.Random(3), [1, 2], [K], duration_s=30.0))


# -- the runner ----------------------------------------------------------------------------


class FakeMoves:
    """Leadership moves played by the test: each is done at once."""

    def __init__(self) -> None:
        self.applied: list[Move] = []
        self.in_force = None

    async def apply(self, move: Move) -> tuple[str | None, PartitionView | None]:
        self.applied.append(move)
        now = PartitionView(move.topic, move.partition, move.replicas[0], move.replicas, ())
        return None, now


PLAN = (
    Action(0, "partition", kind=K, target="catch-up"),
    Action(4, "kill", kind=K, target="catch-up"),
    Action(10, "heal", kind=K, target="catch-up"),
    Action(10, ELECT_LEADER_KIND, kind=K, target="catch-up"),
    Action(14, "start", kind=K, target="partition-leader"),
)
"""A catch-up's five steps as the schedule gives them."""


CHUNKS = {
    "replica.fetch.min.bytes": CATCH_UP_CHUNK_MIN_BYTES,
    "replica.fetch.wait.max.ms": CATCH_UP_CHUNK_WAIT_MS,
}
"""The other follower's chunked fetches, as the catch-up sets them."""
PACE = {**CHUNKS, "replica.fetch.wait.max.ms": CATCH_UP_PACE_MS}
"""The severed follower's paced fetches."""


def _run(
    tmp_path: Path,
    back_after: int | None,
    wait_s: float = 15.0,
    refuse: str | None = None,
    refuse_chunks: str | None = None,
    replica_lag_ms: int | None = None,
) -> tuple[RecordingBackend, _Nemesis, FakeMoves, list[str]]:
    """A catch-up of partition queue-0 (leader 5, replicas 5, 4, 6) against
    a recording backend.  The controllers' metadata: the severed follower
    leaves the ISR at the second answer after the sever; once the leader is
    killed, the other follower leads alone; the severed follower is back in
    its ISR ``back_after`` answers after the heal (never if None).  The
    brokers' own config changes are recorded in ``backend.done``, one entry
    a config (refused with ``refuse``; the chunked fetches' with
    ``refuse_chunks``)."""
    backend, nemesis, writer = recording_nemesis(tmp_path)
    moves = FakeMoves()
    nemesis.moves = moves  # type: ignore[assignment]
    nemesis.catch_up_wait_s = wait_s
    nemesis.replica_lag_ms = replica_lag_ms

    async def configs(broker: int, values: Mapping[str, str | None]) -> str | None:
        for name, value in values.items():
            backend.done.append((name, (broker, None if value is None else int(value))))
        if refuse_chunks is not None and "replica.fetch.min.bytes" in values:
            return refuse_chunks
        return refuse

    nemesis.broker_configs = configs
    calls: dict[str, int] = {"after_sever": 0, "after_heal": 0}

    def severed() -> int | None:
        cut = [g for f, g in backend.done if f == "partition"]
        return next((n for n in cut[0][0] if n > 3), None) if cut else None

    async def replicas() -> list[PartitionReplicas]:
        follower = severed()
        if follower is None:
            return [
                PartitionReplicas("queue-0", 5, (5, 4, 6), (5, 4, 6)),
                PartitionReplicas("queue-1", 4, (4, 5, 6), (4,)),
            ]
        other = 10 - follower  # 4 or 6
        if ("kill", 5) not in backend.done:
            calls["after_sever"] += 1
            isr: tuple[int, ...] = (5, 4, 6) if calls["after_sever"] < 2 else (5, other)
            return [PartitionReplicas("queue-0", 5, (5, 4, 6), isr)]
        if ("heal", None) not in backend.done:
            return [PartitionReplicas("queue-0", other, (5, 4, 6), (other,))]
        calls["after_heal"] += 1
        back = back_after is not None and calls["after_heal"] > back_after
        isr_now = (other, follower) if back else (other,)
        return [PartitionReplicas("queue-0", other, (5, 4, 6), isr_now)]

    nemesis.replicas = replicas
    outcomes = asyncio.run(act_all(nemesis, PLAN))
    writer.close()
    return backend, nemesis, moves, outcomes


def test_the_runner_severs_kills_heals_and_elects_the_follower_once_back(tmp_path: Path) -> None:
    backend, nemesis, moves, outcomes = _run(tmp_path, back_after=3)
    assert outcomes == ["ok"] * 5
    [(_, groups), *rest] = backend.done
    [follower] = [n for n in groups[0] if n > 3]
    other = 10 - follower
    assert follower in (4, 6)
    assert groups == ((1, 2, 3, follower), tuple(n for n in NODES if n != follower))
    # The follower fetches one batch every 200 ms from its sever to its
    # election, the other follower (the next leader) in chunks of a second,
    # then both as the cluster says again.
    assert rest == [
        ("replica.fetch.max.bytes", (follower, 1)),
        ("replica.fetch.min.bytes", (follower, 64 * 1024)),
        ("replica.fetch.wait.max.ms", (follower, 200)),
        ("replica.fetch.min.bytes", (other, 64 * 1024)),
        ("replica.fetch.wait.max.ms", (other, 1000)),
        ("kill", 5),
        ("heal", None),
        ("replica.fetch.max.bytes", (follower, None)),
        ("replica.fetch.min.bytes", (follower, None)),
        ("replica.fetch.wait.max.ms", (follower, None)),
        ("replica.fetch.min.bytes", (other, None)),
        ("replica.fetch.wait.max.ms", (other, None)),
        ("restart", 5),
    ]
    [move] = moves.applied
    assert move == Move(ELECT, K, "queue", 0, (follower, 5, other), (5, 4, 6), other)
    [note] = nemesis.catch_ups
    assert note["partition"] == "queue-0" and note["follower"] == follower
    assert note["follower_out"] is True and note["isr_at_kill"] == [5, other]
    assert note["killed"] == 5 and note["leader_at_heal"] == other
    assert note["follower_back"] is True and note["isr_at_election"] == [other, follower]
    assert note["elected"] is True
    assert note["follower_fetch_bytes"] == 1 and note["follower_fetch_bytes_removed"] is True
    assert note["follower_paced"] == PACE and note["follower_paced_removed"] is True
    assert note["chunked_fetches"] == {str(other): CHUNKS}
    assert note["chunked_fetches_removed"] == {str(other): True}
    ops = nemesis_ops(tmp_path)
    done = [(op.f, op.value) for op in ops if op.type == "ok"]
    assert [f for f, _ in done] == ["partition", "kill", "heal", ELECT_LEADER_KIND, "start"]
    assert done[0][1]["kind"] == K and done[1][1] == {"nodes": [5], "kind": K}
    assert done[3][1]["kind"] == K and done[3][1]["preferred"] == follower
    assert done[4][1] == {"nodes": [5], "kind": K}
    # Nothing stays in force: the leader is back, the network whole.
    assert nemesis.down == {} and nemesis.partition is None and nemesis.catching is None


def test_the_runner_skips_the_election_when_the_follower_never_comes_back(
    tmp_path: Path,
) -> None:
    backend, nemesis, moves, outcomes = _run(tmp_path, back_after=None, wait_s=0.3)
    assert outcomes == ["ok", "ok", "ok", "skipped", "ok"]
    assert moves.applied == [] and ("restart", 5) in backend.done
    [note] = nemesis.catch_ups
    assert note["follower_back"] is False and note["waited_election_s"] >= 0.3
    # The follower's own fetch size is removed all the same, and the other
    # follower's chunked fetches.
    sizes = [v for f, v in backend.done if f == "replica.fetch.max.bytes"]
    assert [value for _, value in sizes] == [1, None]
    waits = [v for f, v in backend.done if f == "replica.fetch.wait.max.ms"]
    assert [value for _, value in waits] == [200, 1000, None, None]
    assert list(note["chunked_fetches_removed"].values()) == [True]


def test_a_refused_fetch_size_is_noted_and_the_fault_goes_on(tmp_path: Path) -> None:
    backend, nemesis, moves, outcomes = _run(tmp_path, back_after=1, refuse="POLICY_VIOLATION")
    assert outcomes == ["ok"] * 5 and len(moves.applied) == 1
    [note] = nemesis.catch_ups
    assert note["follower_fetch_bytes"] == "POLICY_VIOLATION"
    # Nothing was set, so nothing is removed.
    assert [v for f, v in backend.done if f == "replica.fetch.max.bytes"] == [(note["follower"], 1)]
    assert "follower_fetch_bytes_removed" not in note
    other = 10 - note["follower"]
    assert note["chunked_fetches"] == {str(other): "POLICY_VIOLATION"}
    assert note["follower_paced"] == "POLICY_VIOLATION"
    assert [v for f, v in backend.done if f == "replica.fetch.min.bytes"] == [
        (note["follower"], 65536),
        (other, 65536),
    ]
    assert "chunked_fetches_removed" not in note and "follower_paced_removed" not in note


def test_refused_chunked_fetches_are_noted_and_the_rest_goes_on(tmp_path: Path) -> None:
    refusal = "INVALID_CONFIG: replica.fetch.wait.max.ms 1000 is above replica.lag.time.max.ms"
    backend, nemesis, moves, outcomes = _run(tmp_path, back_after=1, refuse_chunks=refusal)
    assert outcomes == ["ok"] * 5 and len(moves.applied) == 1
    [note] = nemesis.catch_ups
    follower = note["follower"]
    other = 10 - follower
    assert note["chunked_fetches"] == {str(other): refusal}
    assert note["follower_paced"] == refusal
    # The follower's own fetch size was set and is removed; the refused
    # configs are not removed.
    assert note["follower_fetch_bytes"] == 1 and note["follower_fetch_bytes_removed"] is True
    assert "chunked_fetches_removed" not in note and "follower_paced_removed" not in note
    assert [v for f, v in backend.done if f == "replica.fetch.min.bytes"] == [
        (follower, 65536),
        (other, 65536),
    ]


def test_the_chunked_fetches_wait_stays_below_a_short_lag_time(tmp_path: Path) -> None:
    backend, nemesis, moves, outcomes = _run(tmp_path, back_after=1, replica_lag_ms=900)
    assert outcomes == ["ok"] * 5
    [note] = nemesis.catch_ups
    [chunks] = note["chunked_fetches"].values()
    assert chunks == {**CHUNKS, "replica.fetch.wait.max.ms": 600}
    assert note["follower_paced"] == PACE  # 200 ms: below it already
    # The recipe's lag time (1.5 s) leaves the second's wait.
    nemesis.replica_lag_ms = 1_500
    assert nemesis.chunk_wait_ms() == CATCH_UP_CHUNK_WAIT_MS == 1000


def test_a_catch_up_cut_short_by_the_runs_end_removes_the_follower_fetch_size(
    tmp_path: Path,
) -> None:
    backend, nemesis, writer = recording_nemesis(tmp_path)
    sizes: list[tuple[int, dict[str, str | None]]] = []

    async def configs(broker: int, values: Mapping[str, str | None]) -> str | None:
        sizes.append((broker, dict(values)))
        return None

    async def replicas() -> list[PartitionReplicas]:
        return [PartitionReplicas("queue-0", 5, (5, 6, 4), (5, 6, 4))]

    nemesis.broker_configs = configs
    nemesis.replicas = replicas

    async def main() -> list[str]:
        sever = Action(0, "partition", kind=K, target="catch-up")
        out: list[str] = [(await nemesis.act(sever))[0]]
        ends = nemesis.ends()
        assert [(a.f, a.target) for a in ends] == [("heal", None), ("heal", "catch-up-end")]
        out += await act_all(nemesis, ends)
        return out

    assert asyncio.run(main()) == ["ok", "ok", "skipped"]
    writer.close()
    [(follower, _), *_] = sizes
    other = 10 - follower
    chunks = {k: str(v) for k, v in CHUNKS.items()}
    pace = {k: str(v) for k, v in PACE.items()}
    assert sizes == [
        (follower, {"replica.fetch.max.bytes": "1"}),
        (follower, pace),
        (other, chunks),
        (follower, {"replica.fetch.max.bytes": None}),
        (follower, dict.fromkeys(pace)),
        (other, dict.fromkeys(chunks)),
    ]
    assert follower in (4, 6)
    [note] = nemesis.catch_ups
    assert note["follower_fetch_bytes_removed"] is True and nemesis.catching is None
    assert note["chunked_fetches_removed"] == {str(other): True}
    assert nemesis.ends() == [Action(0.0, "heal")]


def test_the_runner_skips_a_catch_up_with_no_two_followers_in_an_isr(tmp_path: Path) -> None:
    backend, nemesis, writer = recording_nemesis(tmp_path)

    async def replicas() -> list[PartitionReplicas]:
        return [
            PartitionReplicas("queue-0", 4, (4, 5, 6), (4, 5)),
            PartitionReplicas("queue-1", 5, (5, 4, 6), (5, 4, 6)),
        ]

    nemesis.replicas = replicas
    nemesis.down = {6: "kill"}  # queue-1's third replica is down

    assert asyncio.run(act_all(nemesis, PLAN)) == ["skipped"] * 5
    writer.close()
    assert backend.done == [] and nemesis.catch_ups == []


# -- a real local cluster ------------------------------------------------------------------


@pytest.mark.slow
def test_a_local_catch_up_elects_the_follower_once_back_in_the_isr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_iptables()
    scratch_tempdir(tmp_path, monkeypatch)
    config = local_fault_config(
        tmp_path,
        "queue-catch-up",
        K,
        partitions=1,
        rate=40,
        concurrency=3,
        seed=5,
        fault_interval_s=1.0,
        fault_period_s=18.0,
        quiet_s=1.0,
    )
    steps = ("partition", "kill", ELECT_LEADER_KIND, "start")
    result, notes = run_local_fault(config, "catch_ups", steps)
    for note in notes:
        # Each step saw what it waited for: the follower out of the ISR
        # before the kill, another leader before the heal, the follower
        # back in the ISR before its election.
        assert note["follower_out"] and note["follower"] not in note["isr_at_kill"], note
        assert note["leader_at_heal"] not in (note["killed"], note["follower"], -1), note
        assert note["follower_back"] and note["elected"], note
        # The follower fetched one batch every 200 ms meanwhile, by its own
        # configs, and the other follower in chunks of a second, all
        # removed after the election.
        assert note["follower_fetch_bytes"] == 1 and note["follower_fetch_bytes_removed"], note
        assert note["follower_paced"] == PACE and note["follower_paced_removed"], note
        [(other, chunks)] = note["chunked_fetches"].items()
        assert chunks == CHUNKS and note["chunked_fetches_removed"] == {other: True}, note
    # A correct build loses nothing: the follower rejoins only at the
    # leader's epoch start, so it holds every committed record when elected.
    assert result.recovered and result.final_ok, result.final_check

"""DeleteRecords in the broker simulator (``broker/sim/``): an admin client's
delete goes to the leader, which answers once the low watermark reached it
(``DelayedDeleteRecords``); the invariants ``log-start`` (a replica's log
start never goes back) and ``deleted-stay-deleted`` (whichever replica
leads, no record below an acknowledged delete is readable) and the liveness
check (after healing, every replica starts no lower than its leader) hold
in random schedules with deletes, and fire when a rule is broken."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

import broker.replica.partition as partition_module
from broker.errors import Errors
from broker.replica.leader import RemoteReplica
from broker.replica.leader import low_watermark as kept_low_watermark
from broker.sim import InvariantChecker, SimCluster, SimConfig, Violation, run_random
from broker.sim.logs import batches
from broker.sim.schedule import _check_recovered
from kq.cli import main as kq_main

DELETES = SimConfig(delete_rate=0.25)


def _ignore_leader_log_start(leader_log_start_offset: int, high_watermark: int) -> int:
    """The follower rule broken: the leader's log start never followed."""
    del leader_log_start_offset, high_watermark
    return -1


def _leader_only(
    leader_log_start_offset: int,
    remotes: Iterable[RemoteReplica],
    alive: Callable[[int], bool],
    electable: Iterable[int] = (),
) -> int:
    """The low watermark broken: the leader's log start alone (the answer
    kq gave before DeleteRecords was replicated)."""
    del remotes, alive, electable
    return leader_log_start_offset


def _live_brokers_only(
    leader_log_start_offset: int,
    remotes: Iterable[RemoteReplica],
    alive: Callable[[int], bool],
    electable: Iterable[int] = (),
) -> int:
    """Kafka's lowWatermarkIfLeader: the ISR and ELR members on fenced
    brokers are not waited for."""
    del electable
    return kept_low_watermark(leader_log_start_offset, remotes, alive)


def _replicated(records: int = 6) -> SimCluster:
    """Three brokers, one partition, ``records`` acks=all records committed
    everywhere."""
    c = SimCluster(0, SimConfig(partitions=1), check=InvariantChecker())
    c.run_for(300)
    for _ in range(records):
        c.produce(0, acks=-1)
    c.run_for(1_000)
    assert len(c.acked) == records
    assert all(b.logs[0].high_watermark == records for b in c.brokers.values())
    return c


def test_a_delete_is_answered_once_every_replica_moved_and_survives_the_leaders_death() -> None:
    c = _replicated()
    op = c.delete_records(0, 4)
    c.run_for(500)
    reply = c.delete_replies[op]
    assert (reply.error, reply.offset, reply.low_watermark) == (Errors.NONE, 4, 4)
    assert [b.logs[0].log_start_offset for b in c.brokers.values()] == [4, 4, 4]
    leader = c.leader_of(0)
    c.kill(leader)
    c.run_for(3_000)
    new = c.serving_leader(0)
    assert new is not None and new != leader
    assert min(batches(c.brokers[new].logs[0])) == 4
    # A consumer reading from the start is reset to the log start.
    assert [r.offset for r in c.poll(0, from_start=True) or []] == [4, 5]
    c.restart(leader)
    c.run_for(3_000)
    _check_recovered(c)


def test_a_delete_above_the_hw_is_refused_and_an_unanswered_one_times_out() -> None:
    c = _replicated()
    refused = c.delete_records(0, 7)
    c.run_for(200)
    assert c.delete_replies[refused].error is Errors.OFFSET_OUT_OF_RANGE
    # A follower whose fetches no longer reach the leader, its broker
    # alive (it heartbeats): waited for until the request's timeout.
    c.cut_link(2, c.leader_of(0))
    late = c.delete_records(0, 3)
    c.run_for(DELETES.produce_timeout_ms + 200)
    reply = c.delete_replies[late]
    assert (reply.error, reply.offset) == (Errors.REQUEST_TIMED_OUT, 3)
    assert c.brokers[c.leader_of(0)].logs[0].log_start_offset == 3


def test_random_schedules_with_deletes_keep_every_invariant() -> None:
    answered: set[Errors] = set()
    for seed in range(12):
        clusters: list[SimCluster] = []
        result = run_random(seed, 1_500, DELETES, observe=clusters.append)
        assert result.ok, f"seed {seed}: {result.violation}"
        answered |= {r.error for r in clusters[0].delete_replies.values()}
    assert Errors.NONE in answered and Errors.REQUEST_TIMED_OUT in answered


def test_deleted_stay_deleted_fires_when_a_delete_is_answered_by_the_leader_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The review's DeleteRecords: answered with the leader's log start at
    # once, the followers never moving theirs; the leader dies.
    monkeypatch.setattr(partition_module, "low_watermark", _leader_only)
    monkeypatch.setattr(partition_module, "follower_log_start", _ignore_leader_log_start)
    c = _replicated()
    op = c.delete_records(0, 4)
    c.run_for(200)
    assert c.delete_replies[op].error is Errors.NONE
    c.kill(c.leader_of(0))
    with pytest.raises(Violation, match=r"deleted-stay-deleted: p0: records below 4 were"):
        c.run_for(3_000)


def test_liveness_fires_when_followers_ignore_the_leaders_log_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the follower rule broken a delete is never acknowledged (the low
    # watermark waits for the followers), so no safety rule fires: the
    # followers never follow, which the check after healing names.
    monkeypatch.setattr(partition_module, "follower_log_start", _ignore_leader_log_start)
    c = _replicated()
    op = c.delete_records(0, 4)
    c.run_for(DELETES.produce_timeout_ms + 200)
    assert c.delete_replies[op].error is Errors.REQUEST_TIMED_OUT
    with pytest.raises(Violation, match=r"liveness: p0 replicas did not follow leader 0's log"):
        _check_recovered(c)
    seen = []
    for seed in range(20):
        result = run_random(seed, 1_500, DELETES)
        seen.append(result.rule)
        if result.rule == "liveness":
            break
    else:
        pytest.fail(f"20 schedules never fired liveness: {seen}")


def test_deleted_stay_deleted_fires_without_waiting_for_fenced_elr_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kafka's low watermark skips fenced brokers; KIP-966 then elects an ELR
    # member that was fenced at the delete and never fetched it.
    monkeypatch.setattr(partition_module, "low_watermark", _live_brokers_only)
    seen = []
    for seed in range(40):
        result = run_random(seed, 2_000, DELETES)
        seen.append(result.rule)
        if result.rule == "deleted-stay-deleted":
            break
    else:
        pytest.fail(f"40 schedules never fired deleted-stay-deleted: {seen}")
    monkeypatch.undo()
    assert run_random(seed, 2_000, DELETES).ok


def test_log_start_fires_when_a_replicas_log_start_goes_back() -> None:
    c = _replicated()
    op = c.delete_records(0, 4)
    c.run_for(500)
    assert c.delete_replies[op].error is Errors.NONE
    c.brokers[2].logs[0]._log_start_offset = 2  # the bug the rule catches
    with pytest.raises(Violation, match="log-start: p0 on broker 2: log start 2 after 4"):
        c.action("a log start goes back")


def test_config_refuses_a_bad_delete_rate() -> None:
    with pytest.raises(ValueError, match=r"delete_rate must be in \[0, 1\), not 1.0"):
        SimConfig(delete_rate=1.0)


def test_kq_sim_brokers_with_deletes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "brokers", "--seed", "1", "--steps", "800", "--delete-rate", "0.3"]
    assert kq_main([*argv, "--trace"]) == 0
    out = capsys.readouterr().out
    assert "deletes records below" in out and ": NONE (low watermark" in out
    with pytest.raises(SystemExit):
        kq_main(["sim", "brokers", "--delete-rate", "1"])
    assert "--delete-rate: must be in [0, 1), got 1.0" in capsys.readouterr().err

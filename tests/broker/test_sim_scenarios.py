"""Kafka's historical replication bugs (brokers.md §1.12) as scripted
schedules of the broker simulator (``broker/sim/scenarios.py``): with every
rule in place no invariant fires and the recipe ends as Kafka's fix says;
with the scenario's rule broken (its bug switch) the invariant named for it
fires."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.sim.logs import batches
from broker.sim.scenarios import SCENARIOS, run_scenario
from metadata.records import NO_LEADER
from tests.quorum.test_purity import impurities

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_holds_with_every_rule(name: str) -> None:
    run = run_scenario(name)
    assert run.violation is None, "\n".join(run.cluster.trace[-40:])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_fires_with_its_rule_broken(name: str) -> None:
    run = run_scenario(name, broken=True)
    assert run.violation is not None, f"{name} with {SCENARIOS[name].bug.title}: nothing fired"
    assert run.violation.rule == SCENARIOS[name].fires, str(run.violation)
    assert f"seed {run.cluster.seed}, event {run.violation.event}" in str(run.violation)


def test_r1_the_restarted_follower_keeps_m2_and_leads() -> None:
    run = run_scenario("R1")
    assert run.facts["acked"] == ["ok", "ok"]
    # It had m2 and a HW before it when it restarted (the answer's HW lags).
    assert run.facts["follower"] == (2, 1)
    assert run.facts["leader"] == 1
    assert sorted(batches(run.cluster.brokers[1].logs[0])) == [0, 1]


def test_r2_the_old_leader_truncates_m2_and_takes_m3() -> None:
    run = run_scenario("R2")
    assert run.facts["leader"] == 1
    logs = run.facts["logs"]
    assert isinstance(logs, list)
    on_0, on_1 = logs
    assert on_0 == on_1 and sorted(on_0) == [0, 1]
    assert on_1[1][0] == 1  # m3, written in the new leader's epoch


def test_r3_the_follower_truncates_in_two_rounds() -> None:
    run = run_scenario("R3")
    # Its epoch 3 is unknown to the leader, whose answer (epoch 2) is unknown
    # to it: cut at its end of epoch 1 and ask again; epoch 0 ends at 2.
    assert run.facts["truncations"] == ["4 -> 3", "3 -> 2"]
    assert run.facts["ends"] == (5, 5)


def test_r4_the_lagging_follower_stays_out_and_the_partition_waits() -> None:
    run = run_scenario("R4")
    assert run.facts["acked"] == ["ok"] * 5
    # 1 leads with its HW frozen below its epoch start (10).
    assert run.facts["leader1"] == (1, 5)
    assert run.facts["isr"] == (1,)
    assert run.facts["leader_after"] == NO_LEADER
    assert run.cluster.serving_leader(0) == 1  # back, with 6..9


def test_r5_acks_all_refused_and_the_hw_frozen_under_min_isr() -> None:
    run = run_scenario("R5")
    assert run.facts["isr"] == (0,)
    assert run.facts["refused"] == "not-enough-replicas"
    assert run.facts["hw"] == 1
    assert run.facts["leader"] == 1


def test_r9_the_eligible_leader_replica_is_elected() -> None:
    run = run_scenario("R9")
    assert run.facts["isr1"] == (0, 1) and run.facts["isr2"] == (0,)
    assert run.facts["elr"] == (1,)
    assert run.facts["leader"] == 1


def test_r9_without_elr_nobody_is_eligible_until_the_leader_returns() -> None:
    run = run_scenario("R9", broken=True)
    assert run.facts["elr"] == ()
    assert run.facts["leader"] == NO_LEADER


def test_r10_acks_all_refused_when_the_isr_is_the_leader_alone() -> None:
    run = run_scenario("R10")
    assert run.facts["isr"] == (0,)
    assert run.facts["outcomes"] == [("fail", "not-enough-replicas")] * 3
    assert run.facts["leader"] == 1


def test_b5_acks_all_waits_for_the_followers_so_a_failover_keeps_it() -> None:
    run = run_scenario("B5")
    assert run.facts["status"] == "pending"
    assert run.facts["leader"] == 1
    assert run_scenario("B5", broken=True).facts["status"] == "ok"


def test_b7_a_pending_shrink_leaves_the_hw_to_the_committed_isr() -> None:
    run = run_scenario("B7")
    assert run.facts["pending"] == ("shrink", (1, 2))
    # Never committed: the controller's ISR still names the followers.
    assert run.facts["isr"] == (0, 1, 2)
    assert run.facts["status"] == "pending"
    assert run.facts["leader"] == 1
    assert run_scenario("B7", broken=True).facts["status"] == "ok"


def test_b8_the_controller_refuses_the_stale_broker_epoch_and_nobody_leads() -> None:
    run = run_scenario("B8")
    assert run.facts["acked"] == ["ok"] * 3
    assert run.facts["pending"] == ("expand", (2,))
    assert run.facts["isr"] == (0, 1)
    # 0 and 1 are gone; 2 was never in sync again: the partition waits.
    assert run.facts["leader"] == NO_LEADER
    assert run_scenario("B8", broken=True).facts["isr"] == (0, 1, 2)


def test_unknown_scenario_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'R7'; known: R1, R2"):
        run_scenario("R7")


def pure_modules() -> list[Path]:
    return sorted((ROOT / "broker" / "sim").rglob("*.py"))


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_simulator_module_is_pure(path: Path) -> None:
    assert impurities(path.read_text(), str(path.relative_to(ROOT))) == []

"""The broker simulator's B2 scenario: a leader severed from the other
brokers (its controller session kept, as ``sever-partition-leader`` does on
a real cluster) appends alone while preferred elections move its partition
away and back; after the heal the followers must find where their logs part
by the leader's epochs (KIP-279), not by offset."""

from __future__ import annotations

from broker.sim.cluster import CONTROLLER, SimCluster
from broker.sim.config import SimConfig
from broker.sim.scenarios import run_scenario


def test_a_severed_broker_keeps_its_controller_and_client_links_only() -> None:
    c = SimCluster(0, SimConfig(brokers=3, partitions=1, replication_factor=3))
    c.sever(0)
    assert not c.connected(0, 1) and not c.connected(1, 0)
    assert not c.connected(0, 2) and not c.connected(2, 0)
    assert c.connected(0, CONTROLLER) and c.connected(CONTROLLER, 0)
    assert c.connected(1, 2) and c.connected(2, 1)
    c.heal()
    assert c.connected(0, 1) and c.connected(2, 0)


def test_the_severed_leader_leads_again_and_the_followers_take_its_tail() -> None:
    run = run_scenario("B2")
    assert run.violation is None
    # x at offset 1 on 0 alone; y at 1 and 2 on 1 and 2; 0 leads again.
    assert run.facts["x"] == (1, 2)
    assert run.facts["y"] == (3, 3)
    assert run.facts["leader"] == 0
    assert run.facts["acked"] == "ok"
    logs = run.facts["logs"]
    assert isinstance(logs, list)
    on_0, on_1, on_2 = logs
    assert on_0 == on_1 == on_2 and sorted(on_0) == [0, 1, 2]
    # Offset 1 holds x (epoch 0), the leader's: y was cut at the followers'
    # own end of epoch 0.
    assert on_0[1][0] == 0
    assert [line.split("truncates ")[1] for line in run.cluster.trace if "truncates" in line] == [
        "3 -> 1",
        "3 -> 1",
    ]


def test_by_offset_the_followers_keep_y_where_the_leader_has_x() -> None:
    run = run_scenario("B2", broken=True)
    assert run.violation is not None and run.violation.rule == "replicas-agree"
    assert "offset 1" in str(run.violation)
    # Cut at 0's end of epoch 0 (2), past their own (1): y's first record kept.
    assert "3 -> 2" in "\n".join(run.cluster.trace)

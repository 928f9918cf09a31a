"""The sever fault (``sever-partition-leader``): a queue partition's leader,
drawn from the controllers' metadata when the fault starts, cut off from
the other brokers only, the controllers and the clients still reaching it;
ended by ``heal``.  The groups and the schedule (pure), the runner's
resolution against a backend played by the test, and one real local
cluster on which the severed leader keeps leading, unfenced, with its ISR
shrunk to itself, while the other brokers still replicate each other."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from pathlib import Path

import pytest

from broker.client.producer_batch import Acks, ProducerConfig
from broker.grpc_client import Producer, RecordMetadata
from chaos.backend import partition_pairs, reaches
from chaos.local import LocalCluster
from chaos.nemesis import (
    BROKER_KINDS,
    ELECT_LEADER_KIND,
    FAULT_KINDS,
    NETWORK_KINDS,
    POWER_LOSS_KINDS,
    SEVER_KIND,
    Action,
    schedule,
    sever_groups,
)
from chaos.runner import (
    PartitionReplicas,
    RunConfig,
    _Nemesis,
    expand_nemesis,
    partition_replicas,
    storage_environment,
)
from history.files import HistoryWriter, read_history
from history.ops import NEMESIS
from metadata.client import ConfigOp, ConfigResource, MetadataClient, NewTopic
from quorum.driver.client import describe
from server.local_brokers import broker_registrations
from tests.chaos.cluster_scenarios import need_iptables, processes_under, scratch_tempdir
from tests.chaos.fault_schedules import (
    check_cuts_found_at_run_time,
    drawn_schedule,
    elections_during_partitions,
)
from tests.chaos.polling import until
from tests.chaos.strand_fakes import NODES, RecordingBackend, nemesis_ops, recording_nemesis

# -- the groups ------------------------------------------------------------------------


def test_a_sever_cuts_the_node_off_from_the_other_brokers_only() -> None:
    groups = sever_groups(NODES, [1, 2, 3], 5)
    assert groups == ((1, 2, 3, 5), (1, 2, 3, 4, 6))
    talk = reaches(partition_pairs(NODES, groups), NODES)
    assert talk[5] == {1, 2, 3, 5}
    # The other brokers reach each other and the controllers; the
    # controllers reach every node.
    assert talk[4] == talk[6] == {1, 2, 3, 4, 6}
    for c in (1, 2, 3):
        assert talk[c] == set(NODES)


@pytest.mark.parametrize(
    ("controllers", "node", "message"),
    [
        ([], 5, "needs the controllers"),
        ([1, 2, 3], 9, "severed node \\[9\\] not one of"),
        ([1, 2, 8], 5, "controller \\[8\\] not one of"),
        ([1, 2, 3], 2, "is a controller"),
    ],
)
def test_sever_groups_refuse_what_is_not_a_sever(
    controllers: list[int], node: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        sever_groups(NODES, controllers, node)


def test_a_lone_broker_has_nothing_to_be_severed_from() -> None:
    with pytest.raises(ValueError, match="the only broker"):
        sever_groups([1, 2, 3, 4], [1, 2, 3], 4)


# -- the kind and the schedule -----------------------------------------------------------


def test_the_sever_is_a_network_fault_of_the_brokers_that_needs_no_power_loss() -> None:
    assert SEVER_KIND == "sever-partition-leader"
    assert SEVER_KIND in set(FAULT_KINDS) & set(BROKER_KINDS) & set(NETWORK_KINDS)
    assert SEVER_KIND not in POWER_LOSS_KINDS
    assert expand_nemesis([SEVER_KIND, ELECT_LEADER_KIND], 6) == [SEVER_KIND, ELECT_LEADER_KIND]
    assert storage_environment(RunConfig(faults=(SEVER_KIND,)), {}) == {}
    with pytest.raises(ValueError, match="needs at least 2 nodes"):
        expand_nemesis([SEVER_KIND], 1)


@pytest.mark.parametrize("seed", range(20))
def test_each_sever_is_a_leader_intent_ended_by_a_heal_one_network_fault_at_a_time(
    seed: int,
) -> None:
    actions = drawn_schedule(
        seed,
        [SEVER_KIND, "isolate-follower", "kill", ELECT_LEADER_KIND],
        needed=SEVER_KIND,
        interval_s=(0.3, 3.0),
        fault_period_s=(4.0, 20.0),
    )
    check_cuts_found_at_run_time(actions, SEVER_KIND, "partition-leader")


def test_elections_come_while_a_leader_is_severed() -> None:
    actions = schedule(
        random.Random(7),
        NODES,
        [SEVER_KIND, ELECT_LEADER_KIND],
        duration_s=30,
        interval_s=0.5,
        fault_period_s=14,
        quiet_s=1,
    )
    assert elections_during_partitions(actions) >= 5


def test_a_sever_keeps_the_quorum_whole_so_keep_majority_allows_it() -> None:
    # Two nodes: a partition of either would leave no majority; a sever,
    # whose controllers reach every node, does not.
    actions = schedule(random.Random(3), [1, 2], [SEVER_KIND], duration_s=20)
    assert any(a.f == "partition" for a in actions)
    refused = schedule(random.Random(3), [1, 2], ["isolate-one"], duration_s=20)
    assert [a.f for a in refused] == ["heal"]


# -- the runner ----------------------------------------------------------------------------


def _nemesis(
    tmp_path: Path, answers: list[list[PartitionReplicas]]
) -> tuple[RecordingBackend, _Nemesis, HistoryWriter]:
    """The runner's nemesis on a recording backend, the controllers'
    metadata answered by ``answers`` in turn (the last one thereafter)."""
    backend, nemesis, writer = recording_nemesis(tmp_path)
    seen = iter(answers)
    last: list[list[PartitionReplicas]] = []

    async def replicas() -> list[PartitionReplicas]:
        last[:] = [next(seen, last[0] if last else [])]
        return last[0]

    nemesis.replicas = replicas
    return backend, nemesis, writer


def test_the_runner_severs_a_partition_leader_and_notes_what_the_heal_finds(
    tmp_path: Path,
) -> None:
    before = [PartitionReplicas("queue-0", 5, (5, 4, 6), (5, 4, 6))]
    at_heal = [PartitionReplicas("queue-0", 5, (5, 4, 6), (5,))]
    backend, nemesis, writer = _nemesis(tmp_path, [before, at_heal])
    sever = Action(0, "partition", kind=SEVER_KIND, target="partition-leader")

    async def main() -> list[tuple[str, Action]]:
        return [await nemesis.act(sever), await nemesis.act(Action(5, "heal"))]

    (how, done), (healed, _) = asyncio.run(main())
    writer.close()
    assert (how, healed) == ("ok", "ok")
    assert done.groups == ((1, 2, 3, 5), (1, 2, 3, 4, 6)) and done.target is None
    assert backend.done == [("partition", ((1, 2, 3, 5), (1, 2, 3, 4, 6))), ("heal", None)]
    ops = nemesis_ops(tmp_path)
    assert [(op.type, op.f, op.value) for op in ops] == [
        ("invoke", "partition", {"groups": [[1, 2, 3, 5], [1, 2, 3, 4, 6]], "kind": SEVER_KIND}),
        ("ok", "partition", {"groups": [[1, 2, 3, 5], [1, 2, 3, 4, 6]], "kind": SEVER_KIND}),
        ("invoke", "heal", {}),
        ("ok", "heal", {}),
    ]
    [seen] = nemesis.severs
    assert seen["partition"] == "queue-0" and seen["severed"] == 5
    assert (seen["isr_before"], seen["leader_at_heal"], seen["isr_at_heal"]) == (
        [5, 4, 6],
        5,
        [5],
    )
    assert seen["severed_s"] >= 0
    # The sever is not a node down: nothing restarts it.
    assert nemesis.down == {} and nemesis.targeted is None
    assert [a.f for a in nemesis.ends()] == ["heal"]


def test_the_runner_severs_no_leader_that_is_down_and_skips_when_none_is_up(
    tmp_path: Path,
) -> None:
    found = [
        PartitionReplicas("queue-0", 4, (4, 5, 6), (4, 5, 6)),
        PartitionReplicas("queue-1", 6, (6, 4, 5), (6, 4, 5)),
        PartitionReplicas("queue-2", -1, (5, 4, 6), (5,)),
    ]
    backend, nemesis, writer = _nemesis(tmp_path, [found])
    nemesis.down = {4: "kill"}
    sever = Action(0, "partition", kind=SEVER_KIND, target="partition-leader")
    how, done = asyncio.run(nemesis.act(sever))
    assert how == "ok" and done.groups == ((1, 2, 3, 6), (1, 2, 3, 4, 5))
    asyncio.run(nemesis.act(Action(1, "heal")))
    nemesis.down = {4: "kill", 6: "pause"}
    how, done = asyncio.run(nemesis.act(sever))
    writer.close()
    assert how == "skipped" and done == sever
    assert backend.done == [("partition", ((1, 2, 3, 6), (1, 2, 3, 4, 5))), ("heal", None)]
    assert [s["severed"] for s in nemesis.severs] == [6]


# -- a real local cluster ------------------------------------------------------------------


async def _feed(cluster: LocalCluster, topic: str, partitions: int) -> None:
    """Send a record to each partition of ``topic`` every 50 ms until
    cancelled (acks=1: the leader's append answers, so the sends to a
    severed leader do not wait on followers that cannot fetch)."""
    config = ProducerConfig(
        acks=Acks.LEADER,
        enable_idempotence=False,
        linger_ms=0,
        request_timeout_ms=5_000,
        delivery_timeout_ms=10_000,
    )
    sent: list[asyncio.Future[RecordMetadata]] = []
    bootstrap = list(cluster.broker_addresses().values())
    try:
        async with Producer(bootstrap, config, credentials=cluster.client_credentials()) as p:
            for i in itertools.count():
                for part in range(partitions):
                    sent.append(await p.send(topic, b"%d" % i, partition=part))
                await asyncio.sleep(0.05)
    finally:
        # Outcomes do not matter here; read them so none is left unretrieved.
        for future in sent:
            if future.done() and not future.cancelled():
                future.exception()
            else:
                future.cancel()


@pytest.mark.slow
def test_a_severed_leader_keeps_leading_unfenced_alone_in_its_isr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_iptables()
    scratch = scratch_tempdir(tmp_path, monkeypatch)

    async def body() -> None:
        # The chaos brokers' settings: heartbeats every 0.5 s, a session of 4 s.
        cluster = LocalCluster(tmp_path / "cluster", 3, brokers=3)
        writer = HistoryWriter(tmp_path / "h.jsonl")
        try:
            await cluster.start()
            async with MetadataClient(
                list(cluster.addresses().values()),
                timeout_s=5.0,
                credentials=cluster.client_credentials(),
            ) as admin:
                lag = ConfigOp("replica.lag.time.max.ms", "1500")
                answer = await admin.alter_configs({ConfigResource.cluster(): [lag]})
                assert all(r.error == 0 for r in answer.results), answer
                await admin.create_topics([NewTopic("t", 3, 3)])

                async def parts() -> list[PartitionReplicas]:
                    return await partition_replicas(cluster, ["t"])

                async def settled() -> object:
                    now = await parts()
                    full = [p for p in now if p.leader >= 0 and len(p.isr) == 3]
                    return len(full) == 3 or now

                await until("every partition led with a full ISR", 30, settled)

                # Records keep coming to every partition, so that a follower
                # that cannot fetch falls behind its leader's log end: an idle
                # follower at that end stays caught up however long it does
                # not fetch (ReplicaState.isCaughtUp), and would stay in the ISR.
                feeding = asyncio.create_task(_feed(cluster, "t", 3))
                nemesis = _Nemesis(cluster, writer, lambda line: None)
                nemesis.replicas = parts
                sever = Action(0, "partition", kind=SEVER_KIND, target="partition-leader")
                how, done = await nemesis.act(sever)
                assert how == "ok", done
                cut = time.monotonic()
                [severed] = [n for n in done.groups[0] if n in cluster.brokers]
                assert set(done.groups[1]) == set(cluster.nodes) - {severed}
                led = {p.name for p in await parts() if p.leader == severed}
                assert led

                async def alone() -> object:
                    now = await parts()
                    mine = [p for p in now if p.name in led]
                    others = [p for p in now if p.name not in led]
                    if all(p.leader == severed and p.isr == (severed,) for p in mine) and all(
                        set(p.isr) == set(p.replicas) - {severed} for p in others
                    ):
                        return True
                    return now

                # No follower fetches from it (its ISR shrinks to itself), and
                # its AlterPartition reaches the controllers; the other brokers
                # still fetch from each other (their ISRs lose it alone).
                await until(f"broker {severed} alone in the ISRs it leads", 20, alone)
                # Past the 4 s session: its heartbeats still reach the
                # controllers, so it is neither fenced nor moved.
                await asyncio.sleep(max(0.0, cut + 6.0 - time.monotonic()))
                seen = await broker_registrations(cluster.state)
                assert seen is not None and not seen[severed].fenced
                assert await alone() is True
                # The harness's clients still reach every node, the severed one too.
                credentials = cluster.client_credentials()
                for node, address in {
                    **cluster.addresses(),
                    **cluster.broker_addresses(),
                }.items():
                    assert await describe(address, 2.0, credentials) is not None, node

                how, _ = await nemesis.act(Action(0, "heal"))
                assert how == "ok"
                feeding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeding
                [noted] = nemesis.severs
                assert noted["severed"] == severed and noted["leader_at_heal"] == severed
                assert noted["isr_at_heal"] == [severed] and noted["severed_s"] >= 6.0

                async def back() -> object:
                    now = await parts()
                    return all(severed in p.isr for p in now) or now

                await until(f"broker {severed} back in every ISR", 40, back)
        finally:
            writer.close()
            await cluster.stop()

    asyncio.run(asyncio.wait_for(body(), 180))
    assert processes_under(scratch) == []
    ops = [op for op in read_history(tmp_path / "h.jsonl") if op.process == NEMESIS]
    assert [(op.type, op.f) for op in ops] == [
        ("invoke", "partition"),
        ("ok", "partition"),
        ("invoke", "heal"),
        ("ok", "heal"),
    ]

"""Pinned register clients (``kq chaos run --pin-clients``): each process
bound to one node, as Jepsen binds its clients, against a real in-process
3-node quorum on mutual TLS; and the deposed leader they exist to reach,
which serves a stale read only with the deliberate bug Q4 on."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

import bugs
from bugs import Bug
from chaos.runner import RunConfig, _replay
from chaos.workloads.register import (
    Completion,
    PinnedKvRegisterClient,
    RegisterClient,
    RegisterWorkload,
    pinned_kv_clients,
)
from history.files import HistoryWriter, check_well_formed, read_history
from kq.cli import main
from quorum.driver.identity import Identity
from quorum.messages import Message
from quorum.types import NodeId, Role
from server.controller import kv_of
from tests.chaos.test_workload_register import Scripted, memory_recorder
from tests.driver.cluster_util import CLUSTER_ID, FAST, Cluster, run, running

# The old leader resigns by check-quorum only after 30 fetch timeouts, so
# that it goes on believing it leads for seconds (as in
# tests/kvstore/test_injected_read_bug.py): the rule must not depend on how
# soon it notices.
SLOW_CHECK_QUORUM = dataclasses.replace(
    FAST, quorum=dataclasses.replace(FAST.quorum, check_quorum_factor=30.0)
)


def _admin(cluster: Cluster) -> grpc.ChannelCredentials:
    return cluster.tls_files(Identity.user(CLUSTER_ID, "admin")).channel_credentials()


# -- binding (no cluster) ---------------------------------------------------------------


def test_processes_are_bound_to_nodes_in_turn() -> None:
    async def go() -> None:
        nodes = {3: "127.0.0.1:1", 1: "127.0.0.1:2", 2: "127.0.0.1:3"}
        open_client = pinned_kv_clients(nodes, timeout_s=1.0)
        bound = []
        for p in range(7):
            client = open_client(p)
            assert isinstance(client, PinnedKvRegisterClient)
            bound.append(client.node)
            await client.close()
        # Process p to the (p mod n)-th node by id.
        assert bound == [1, 2, 3, 1, 2, 3, 1]

    run(go())


def test_a_pinned_client_needs_its_node_and_a_deadline() -> None:
    with pytest.raises(ValueError, match="node 4 is not one of the nodes"):
        PinnedKvRegisterClient({1: "127.0.0.1:1"}, 4)
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        PinnedKvRegisterClient({1: "127.0.0.1:1"}, 1, timeout_s=0)
    with pytest.raises(ValueError, match="at least one node"):
        pinned_kv_clients({})


def test_the_workload_opens_each_process_its_own_client() -> None:
    """With per_process, a worker's client is opened for its process, and a
    retired process's successor (p + concurrency) gets its own."""

    async def go() -> None:
        rec, ops = memory_recorder()
        opened: list[int] = []

        def open_client(process: int) -> RegisterClient:
            opened.append(process)
            first = process < 3
            return Scripted([Completion("info", "timeout") if first else Completion("ok")])

        wl = RegisterWorkload(rec, open_client, random.Random(1), per_process=True, concurrency=3)
        await wl.execute(1, "write", "k", "v1-1")
        await wl.execute(1, "read", "k")
        await wl.close()
        assert opened == [0, 1, 2, 4]
        assert [o.process for o in ops] == [1, 1, 4, 4]

    run(go())


def test_pinned_clients_are_a_register_kv_option() -> None:
    RunConfig(workload="register", store="kv", pin_clients=True).check()
    with pytest.raises(ValueError, match="pinned clients"):
        RunConfig(workload="register", store="configs", pin_clients=True).check()
    replay = _replay(RunConfig(store="kv", pin_clients=True), 5)
    assert " --pin-clients" in replay
    assert "--pin-clients" not in _replay(RunConfig(store="kv"), 5)


# -- a real quorum ------------------------------------------------------------------------


def test_each_pinned_client_asks_its_own_node_only(tmp_path: Path) -> None:
    """The leader's client reads and writes; a follower's is refused with
    not-leader (no effect) instead of being sent on to the leader."""

    async def go() -> None:
        async with running(tmp_path / "c", tls=True) as cluster:
            leader = await cluster.wait_leader()
            lead = leader.config.node_id
            follower = next(n for n in cluster.voters if n != lead)
            credentials = _admin(cluster)
            on_leader = PinnedKvRegisterClient(
                cluster.voters,
                lead,
                timeout_s=2.0,
                credentials=credentials,
            )
            on_follower = PinnedKvRegisterClient(
                cluster.voters,
                follower,
                timeout_s=2.0,
                credentials=credentials,
            )
            try:
                written = await on_leader.write("k", "v0-1")
                assert (written.type, written.node) == ("ok", lead)
                assert written.offset is not None and written.epoch is not None
                read = await on_leader.read("k")
                assert (read.type, read.value, read.offset) == ("ok", "v0-1", written.offset)
                swapped = await on_leader.cas("k", "v0-1", "v0-2")
                assert swapped.type == "ok"
                refused = await on_leader.cas("k", "v0-1", "v0-3")
                assert (refused.type, refused.error) == ("fail", "precondition")

                assert await on_follower.read("k") == Completion(
                    "fail", "not-leader", node=follower
                )
                assert await on_follower.write("k", "v1-1") == Completion(
                    "fail", "not-leader", node=follower
                )
                assert (await on_follower.cas("k", "v0-2", "v1-2")).error == "not-leader"
                # Nothing the follower refused was written.
                assert (await on_leader.read("k")).value == "v0-2"
            finally:
                await on_leader.close()
                await on_follower.close()

            # A node that is down: nothing sent.
            await cluster.stop(follower, resign=False)
            gone = PinnedKvRegisterClient(cluster.voters, follower, timeout_s=1.0)
            try:
                assert (await gone.write("k", "v2-1")).error == "unavailable"
                assert (await gone.read("k")).type == "fail"
            finally:
                await gone.close()

    run(go())


def _not_from(src: NodeId, deliver: Callable[[Message], None]) -> Callable[[Message], None]:
    def filtered(msg: Message) -> None:
        if msg.src != src:
            deliver(msg)

    return filtered


async def _pinned_read_of_a_deposed_leader(root: Path) -> tuple[Completion, int, int]:
    """What a client pinned to a deposed leader that has not noticed gets
    for a read of a key the new leader has overwritten; the old leader's
    id and the offset of the new write."""
    async with running(root, options=SLOW_CHECK_QUORUM, tls=True) as cluster:
        credentials = _admin(cluster)
        old = await cluster.wait_leader()
        old_id = old.config.node_id
        on_old = PinnedKvRegisterClient(cluster.voters, old_id, 2.0, credentials)
        try:
            assert (await on_old.write("r", "old")).type == "ok"
            await cluster.wait_for(
                lambda: all(kv_of(s).get("r") is not None for s in cluster.servers.values())
            )
            # Cut the old leader off from the others (its clients still reach it).
            for server in cluster.servers.values():
                if server is old:
                    server.transport._deliver = lambda msg: None
                else:
                    server.transport._deliver = _not_from(old_id, server.transport._deliver)
            others = [s for s in cluster.servers.values() if s is not old]
            await cluster.wait_for(
                lambda: any(s.node.core.role is Role.LEADER for s in others), timeout_s=10
            )
            new = next(s for s in others if s.node.core.role is Role.LEADER)
            on_new = PinnedKvRegisterClient(
                cluster.voters,
                new.config.node_id,
                2.0,
                credentials,
            )
            try:
                written = await on_new.write("r", "new")
            finally:
                await on_new.close()
            assert written.type == "ok" and written.offset is not None
            assert old.node.core.role is Role.LEADER
            return await on_old.read("r"), old_id, written.offset
        finally:
            await on_old.close()


def test_a_client_pinned_to_a_deposed_leader_reads_stale_with_the_bug(tmp_path: Path) -> None:
    async def go() -> None:
        with bugs.injected(Bug.READ_WITHOUT_BARRIER):
            read, old_id, newer = await _pinned_read_of_a_deposed_leader(tmp_path)
        # ok with the old value, at a version below the new leader's write:
        # what stale-reads and linearizable report.
        assert (read.type, read.value, read.node) == ("ok", "old", old_id)
        assert read.offset is not None and read.offset < newer

    run(go())


def test_a_client_pinned_to_a_deposed_leader_reads_nothing_without_the_bug(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        read, old_id, _ = await _pinned_read_of_a_deposed_leader(tmp_path)
        # It cannot confirm that it leads: the read fails, with no value.
        assert (read.type, read.error, read.value) == ("fail", "timeout", None), read
        assert read.node == old_id

    run(go())


def test_pinned_clients_on_the_configs_store_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["chaos", "run", "--runs-dir", str(tmp_path), "--nemesis", "none", "--pin-clients"]
    assert main(args) == 2
    assert "pinned clients are the register workload's on --store kv" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_pinned_workload_on_a_quorum(tmp_path: Path) -> None:
    """Nine processes, three a node: only the leader's answer ok, the others
    are refused with not-leader; the final reads (every worker reads every
    key) find each key through the leader's clients."""

    async def go() -> None:
        async with running(tmp_path / "c", tls=True) as cluster:
            leader = await cluster.wait_leader()
            lead = leader.config.node_id
            with HistoryWriter(tmp_path / "history.jsonl") as writer:
                wl = RegisterWorkload(
                    writer,
                    pinned_kv_clients(cluster.voters, 1.0, _admin(cluster)),
                    random.Random(5),
                    per_process=True,
                    concurrency=9,
                    keys=["k0", "k1"],
                    rate=90,
                    op_timeout_s=2.0,
                )
                await wl.run(1.5)
                before = wl.stats.invokes
                finals = await wl.final_reads()
                # Every worker read every key at the end: 9 workers, 2 keys.
                assert wl.stats.invokes - before == 18
                await wl.close()
            assert [(o.key, o.type) for o in finals] == [("k0", "ok"), ("k1", "ok")]
            assert all(o.node == lead for o in finals)
            ops = read_history(tmp_path / "history.jsonl")
            assert check_well_formed(ops, model="register") == []
            done = [o for o in ops if o.type != "invoke"]
            assert {o.node for o in done if o.type == "ok"} == {lead}
            refused = {o.node for o in done if o.error == "not-leader"}
            assert refused == set(cluster.voters) - {lead}

    run(go())

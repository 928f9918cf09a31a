"""kq groups against real brokers with a group coordinator (three
controllers, three brokers, mutual TLS, in this process): a group whose
offsets were committed with a raw OffsetCommit outside membership (member
"" epoch -1) is described with LAG = high watermark - committed, its
offsets are reset (dry run changes nothing, --execute does; shift-by stays
within the log), a group with a member (joined with a raw
ConsumerGroupHeartbeat) is neither reset nor deleted, and an empty group is
deleted."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import grpc
import pytest

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.group.placement import partition_for
from broker.grpc_client.coordinator import GroupStub
from broker.grpc_client.group_admin import GroupAdmin, GroupHasMembersError
from kq.cli import main
from kqproto import groups_pb2, groups_pb2_grpc
from quorum.driver.identity import Identity
from quorum.driver.tls import dial
from tests.broker.grpc_client.cluster import BrokerCluster
from tests.driver.cluster_util import CLUSTER_ID
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import Controllers, wait_for
from tests.server.test_group_process import group_broker

T = TypeVar("T")

# Records per partition of topic "t": its high watermarks.
HW = {0: 5, 1: 3}


class GroupCluster(BrokerCluster):
    """BrokerCluster whose brokers have a three-partition offsets topic."""

    async def _start(self) -> None:
        self.controllers = Controllers(self.root, voters=3, options=OPTIONS, tls=True)
        self.admin_tls = self.controllers.tls_files(Identity.user(CLUSTER_ID, "admin"))
        for node in self.controllers.voters:
            await self.controllers.start(node)
        for broker_id, port in self.ports.items():
            self.brokers[broker_id] = group_broker(self.controllers, broker_id, port)
            await self.brokers[broker_id].start()
        await wait_for(lambda: all(not b.fenced for b in self.brokers.values()), 30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupCluster]:
    running = GroupCluster(tmp_path_factory.mktemp("groups"))
    try:
        running.start()
        running.create_topic("t", 2, 3)
        for partition, count in HW.items():
            lines = "".join(f"r{i}\n" for i in range(count)).encode()
            assert (
                kq(["produce", "--topic", "t", "--partition", str(partition)], running, lines)[0]
                == 0
            )
        yield running
    finally:
        running.stop()


def kq(argv: list[str], cluster: GroupCluster, stdin: bytes = b"") -> tuple[int, str, str]:
    """``kq argv`` with the cluster's flags: (status, stdout, stderr)."""
    flags = [
        "--bootstrap-server",
        ",".join(cluster.addresses),
        "--certs-dir",
        str(cluster.certs_dir),
        "--user",
        "admin",
    ]
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    sys.stdout, sys.stderr = out, err
    try:
        try:
            status = main([*argv, *flags])
        except SystemExit as exc:
            status = int(exc.code or 0)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return status, out.getvalue(), err.getvalue()


def groups(cluster: GroupCluster, *argv: str) -> tuple[int, str, str]:
    return kq(["groups", *argv], cluster)


# -- raw group RPCs, independent of the code under test ---------------------------


def stub_of(channel: grpc.aio.Channel) -> GroupStub:
    stub: GroupStub = groups_pb2_grpc.GroupServiceStub(channel)
    return stub


def at_coordinator(
    cluster: GroupCluster,
    group_id: str,
    call: Callable[[GroupStub], Awaitable[T]],
) -> T:
    """``call`` at the group's coordinator, found with FindCoordinator and
    retried while it is not available or loading."""

    async def go() -> T:
        assert cluster.admin_tls is not None
        credentials = cluster.admin_tls.channel_credentials()
        channels: list[grpc.aio.Channel] = []
        try:
            for _ in range(400):
                channels.append(dial(cluster.addresses[0], credentials))
                found = await stub_of(channels[-1]).FindCoordinator(
                    groups_pb2.FindCoordinatorRequest(group_ids=[group_id])
                )
                coordinator = found.coordinators[0]
                if coordinator.error == Errors.NONE:
                    channels.append(dial(f"{coordinator.host}:{coordinator.port}", credentials))
                    answer = await call(stub_of(channels[-1]))
                    if getattr(answer, "error", Errors.NONE) not in (
                        Errors.COORDINATOR_LOAD_IN_PROGRESS,
                        Errors.COORDINATOR_NOT_AVAILABLE,
                        Errors.NOT_COORDINATOR,
                    ):
                        return answer
                await asyncio.sleep(0.05)
            raise AssertionError(f"no coordinator for group {group_id}")
        finally:
            for channel in channels:
                await channel.close()

    return cluster.run(go())


def commit(cluster: GroupCluster, group_id: str, offsets: dict[int, int]) -> None:
    request = groups_pb2.OffsetCommitRequest(
        group_id=group_id,
        member_id="",
        member_epoch=-1,
        topics=[
            groups_pb2.OffsetCommitTopic(
                name="t",
                partitions=[
                    groups_pb2.OffsetCommitPartition(partition=p, offset=o, leader_epoch=-1)
                    for p, o in offsets.items()
                ],
            )
        ],
    )
    answer = at_coordinator(cluster, group_id, lambda stub: stub.OffsetCommit(request))
    assert answer.error == Errors.NONE, answer.message
    assert all(p.error == Errors.NONE for t in answer.topics for p in t.partitions), answer


def committed(cluster: GroupCluster, group_id: str) -> dict[int, int]:
    answer = at_coordinator(
        cluster,
        group_id,
        lambda stub: stub.OffsetFetch(groups_pb2.OffsetFetchRequest(group_id=group_id)),
    )
    assert answer.error == Errors.NONE, answer.message
    return {p.partition: p.offset for t in answer.topics for p in t.partitions}


def coordinator_of(cluster: GroupCluster, group_id: str) -> int:
    request = groups_pb2.FindCoordinatorRequest(group_ids=[group_id])
    answer = at_coordinator(cluster, group_id, lambda stub: stub.FindCoordinator(request))
    return answer.coordinators[0].node_id


def heartbeat(
    cluster: GroupCluster, group_id: str, member_id: str = "", epoch: int = 0
) -> groups_pb2.ConsumerGroupHeartbeatResponse:
    request = groups_pb2.ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=epoch,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=groups_pb2.TopicNames(names=["t"]),
        owned=groups_pb2.Assignment(),
        client_id="raw-client",
    )
    answer = at_coordinator(cluster, group_id, lambda stub: stub.ConsumerGroupHeartbeat(request))
    assert answer.error == Errors.NONE, answer.message
    return answer


# -- the tests ------------------------------------------------------------------------


def test_describe_shows_the_lag_and_reset_offsets_moves_the_commits(
    cluster: GroupCluster,
) -> None:
    commit(cluster, "resettable", {0: 2, 1: 1})
    status, out, err = groups(cluster, "--describe", "--group", "resettable", "--json")
    assert status == 0, err
    rows = json.loads(out)
    assert [(r["partition"], r["current_offset"], r["log_end_offset"], r["lag"]) for r in rows] == [
        (0, 2, HW[0], HW[0] - 2),
        (1, 1, HW[1], HW[1] - 1),
    ]
    assert all(r["group"] == "resettable" and r["consumer_id"] is None for r in rows)
    status, out, err = groups(cluster, "--describe", "--group", "resettable")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "Consumer group 'resettable' has no active members."
    assert lines[1].split() == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
        "CONSUMER-ID", "HOST", "CLIENT-ID",
    ]  # fmt: skip
    assert lines[2].split() == ["resettable", "t", "0", "2", "5", "3", "-", "-", "-"]

    # A dry run prints the plan and commits nothing.
    reset = ["--reset-offsets", "--group", "resettable", "--topic", "t", "--to-earliest"]
    status, out, err = groups(cluster, *reset, "--dry-run")
    assert status == 0, err
    assert [line.split() for line in out.splitlines()] == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        ["resettable", "t", "0", "0"],
        ["resettable", "t", "1", "0"],
    ]
    assert committed(cluster, "resettable") == {0: 2, 1: 1}
    status, out, err = groups(cluster, *reset, "--execute", "--json")
    assert status == 0, err
    assert [(r["partition"], r["new_offset"]) for r in json.loads(out)] == [(0, 0), (1, 0)]
    assert committed(cluster, "resettable") == {0: 0, 1: 0}

    # --shift-by stays within [log start, high watermark]; --topic T:P
    # touches only P.
    status, out, err = groups(
        cluster, "--reset-offsets", "--group", "resettable", "--all-topics", "--shift-by", "4",
        "--execute",
    )  # fmt: skip
    assert status == 0, err
    assert committed(cluster, "resettable") == {0: 4, 1: HW[1]}
    status, out, err = groups(
        cluster, "--reset-offsets", "--group", "resettable", "--topic", "t:0", "--to-offset",
        "1", "--execute",
    )  # fmt: skip
    assert status == 0, err
    assert committed(cluster, "resettable") == {0: 1, 1: HW[1]}
    status, out, err = groups(
        cluster, "--reset-offsets", "--group", "resettable", "--topic", "t:7", "--to-latest",
        "--execute",
    )  # fmt: skip
    assert status == 1
    assert "topic 't' has no partition 7 (it has 2)" in err


def test_a_group_with_a_member_is_neither_reset_nor_deleted(cluster: GroupCluster) -> None:
    joined = heartbeat(cluster, "busy")
    status, out, err = groups(cluster, "--describe", "--group", "busy", "--members", "--json")
    assert status == 0, err
    [member] = json.loads(out)
    assert (member["consumer_id"], member["client_id"]) == (joined.member_id, "raw-client")
    status, out, err = groups(cluster, "--describe", "--group", "busy", "--json")
    assert status == 0, err
    held = sorted(p for t in joined.assignment.topics for p in t.partitions)
    assert held == [0, 1]
    assert [(r["partition"], r["current_offset"], r["lag"], r["consumer_id"]) for r in
            json.loads(out)] == [(p, None, None, joined.member_id) for p in held]  # fmt: skip
    status, out, err = groups(cluster, "--describe", "--group", "busy", "--state")
    assert status == 0, err
    header, row = out.splitlines()
    assert header.split() == [
        "GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"
    ]  # fmt: skip
    assert row.split()[0] == "busy" and row.split()[-1] == "1"

    for mode in ("--dry-run", "--execute"):
        status, out, err = groups(
            cluster, "--reset-offsets", "--group", "busy", "--topic", "t", "--to-earliest", mode
        )
        assert status == 1, (mode, out, err)
        assert "group 'busy' has active members" in err and "stop them first" in err
    assert committed(cluster, "busy") == {}

    # The library's commit outside membership: the coordinator's
    # UNKNOWN_MEMBER_ID is the clear refusal.
    async def alter() -> None:
        assert cluster.admin_tls is not None
        async with GroupAdmin(cluster.addresses, tls=cluster.admin_tls, timeout_ms=20_000) as a:
            await a.alter_group_offsets("busy", {TopicPartition("t", 0): 1})

    with pytest.raises(GroupHasMembersError, match="has active members; stop them first"):
        cluster.run(alter())

    status, out, err = groups(cluster, "--delete", "--group", "busy")
    assert status == 1
    assert "Group 'busy' not deleted" in out and "is not empty" in out
    status, out, err = groups(cluster, "--describe", "--group", "busy", "--state", "--json")
    assert status == 0 and json.loads(out)[0]["members"] == 1, err

    # Once its member leaves, it is an empty group: deleted.
    heartbeat(cluster, "busy", joined.member_id, -1)
    status, out, err = groups(cluster, "--delete", "--group", "busy")
    assert status == 0, out + err
    assert "Deletion of requested consumer groups ('busy') was successful." in out


def test_list_delete_offsets_and_delete(cluster: GroupCluster) -> None:
    # One group in each partition of the offsets topic, so that the
    # listing needs the answers of several coordinators.
    spread = {partition_for(f"spread-{i}", 3): f"spread-{i}" for i in range(30)}
    assert sorted(spread) == [0, 1, 2]
    coordinators = {}
    for group_id in spread.values():
        commit(cluster, group_id, {0: 1})
        coordinators[group_id] = coordinator_of(cluster, group_id)
    assert len(set(coordinators.values())) > 1, coordinators
    commit(cluster, "listed", {0: 1, 1: 1})
    status, out, err = groups(cluster, "--list")
    assert status == 0, err
    assert {"listed", *spread.values()} <= set(out.splitlines())
    status, out, err = groups(cluster, "--list", "--state", "Empty", "--json")
    assert status == 0, err
    found = {g["group"]: g for g in json.loads(out)}
    assert found["listed"]["state"] == "Empty"
    assert {g: found[g]["coordinator"] for g in spread.values()} == coordinators
    status, out, err = groups(cluster, "--list", "--state", "Stable", "--json")
    assert status == 0, err
    assert "listed" not in {g["group"] for g in json.loads(out)}

    status, out, err = groups(cluster, "--delete-offsets", "--group", "listed", "--topic", "t:1")
    assert status == 0, err
    assert committed(cluster, "listed") == {0: 1}

    status, out, err = groups(
        cluster, "--delete", "--group", "listed", "--group", "never", "--json"
    )
    assert status == 1
    results = {r["group"]: r for r in json.loads(out)}
    assert results["listed"]["deleted"] is True
    assert results["never"]["error"] == "GROUP_ID_NOT_FOUND"
    status, out, err = groups(cluster, "--describe", "--group", "listed")
    assert status == 1
    assert "group 'listed' does not exist" in err

"""An observer: a node outside the voter set that replicates the log.

Three voters and one observer (node 4, its own listen address, its data
directory formatted with the voters' ids) run in this process.  The observer
applies every committed write and serves stale reads, refuses linearizable
reads with a redirect to the leader, shows as an Observer in the leader's
DescribeQuorum, and never counts toward the high watermark: with two of the
three voters down, nothing commits although the observer still fetches.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from kqproto import kv_pb2, kv_pb2_grpc, quorum_pb2, quorum_pb2_grpc
from kvstore.client import KvClient
from quorum.config import QuorumConfig
from quorum.driver.client import IndeterminateWriteError
from quorum.driver.node import NodeOptions
from quorum.driver.server import NodeConfig, NodeServer
from quorum.driver.storage_format import format_storage
from quorum.types import Role
from server.controller import kv_of, kv_server
from tests.driver.cluster_util import CLUSTER_ID, Cluster, free_ports, run

OBSERVER = 4
# Fast elections, but a check-quorum window (1.5 x fetch timeout) long enough
# that the leader keeps leading while the write below waits to commit.
OPTIONS = NodeOptions(
    quorum=QuorumConfig(
        election_timeout_ms=150,
        fetch_timeout_ms=2000,
        fetch_max_wait_ms=100,
        request_timeout_ms=150,
    ),
    snapshot_every_offsets=0,
)


@contextlib.asynccontextmanager
async def voters_and_observer(root: Path) -> AsyncIterator[tuple[Cluster, NodeServer]]:
    cluster = Cluster(root, voters=3, options=OPTIONS)
    observer: NodeServer | None = None
    try:
        for n in cluster.voters:
            await cluster.start(n)
        data_dir = root / f"observer-{OBSERVER}"
        format_storage(data_dir, CLUSTER_ID, OBSERVER, cluster.voters.keys())
        (port,) = free_ports(1)
        observer = kv_server(
            NodeConfig(
                OBSERVER,
                CLUSTER_ID,
                cluster.voters,
                data_dir,
                listen=f"127.0.0.1:{port}",
                options=OPTIONS,
            )
        )
        await observer.start()
        yield cluster, observer
    finally:
        if observer is not None:
            await observer.stop(resign=False)
        for n in list(cluster.servers):
            await cluster.stop(n, resign=False)


async def _describe(address: str) -> quorum_pb2.DescribeQuorumResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = quorum_pb2_grpc.QuorumServiceStub(channel)
        return await stub.DescribeQuorum(quorum_pb2.DescribeQuorumRequest(), timeout=2)


async def _get(address: str, key: str, linearizable: bool) -> kv_pb2.GetResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = kv_pb2_grpc.KvServiceStub(channel)
        return await stub.Get(kv_pb2.GetRequest(key=key, linearizable=linearizable), timeout=3)


def test_observer_replicates_serves_stale_reads_and_redirects(tmp_path: Path) -> None:
    async def go() -> None:
        async with voters_and_observer(tmp_path) as (cluster, observer):
            leader = await cluster.wait_leader()
            assert not observer.node.core.is_voter
            async with KvClient(list(cluster.voters.values())) as client:
                positions = {}
                for i in range(10):
                    positions[f"k{i}"] = await client.put(f"k{i}", b"v%d" % i)

            # The observer's state machine applies the committed writes.
            await cluster.wait_for(lambda: kv_of(observer).get("k9") is not None)
            for key, pos in positions.items():
                found = kv_of(observer).get(key)
                assert found is not None
                assert (found.value, found.offset, found.epoch) == (
                    b"v" + key[1:].encode(),
                    pos.offset,
                    pos.epoch,
                )
            assert observer.node.core.role is Role.FOLLOWER
            assert observer.node.core.leader_id == leader.config.node_id

            # A stale read from the observer answers from its applied state.
            stale = await _get(observer.config.address, "k3", linearizable=False)
            assert stale.error == kv_pb2.OK
            assert (stale.present, stale.value) == (True, b"v3")
            assert stale.version.offset == positions["k3"].offset
            assert stale.applied_offset > positions["k9"].offset

            # A linearizable read is the leader's: NOT_LEADER with the hint.
            linear = await _get(observer.config.address, "k3", linearizable=True)
            assert linear.error == kv_pb2.NOT_LEADER
            assert not linear.present
            assert linear.leader.leader_id == leader.config.node_id
            assert linear.leader.leader_address == leader.config.address
            assert linear.leader.epoch == leader.node.core.epoch
            # So is a write.
            async with grpc.aio.insecure_channel(observer.config.address) as channel:
                wrote = await kv_pb2_grpc.KvServiceStub(channel).Put(
                    kv_pb2.PutRequest(key="via-observer", value=b"x"), timeout=3
                )
            assert wrote.error == kv_pb2.NOT_LEADER
            assert wrote.leader.leader_address == leader.config.address
            # A client bootstrapped from the observer alone follows the hint.
            async with KvClient([observer.config.address]) as client:
                await client.put("via-observer", b"y")
                got = await client.get("via-observer")
                assert got.value == b"y" and got.node_address == leader.config.address

            # The leader lists it as an observer, caught up.
            await cluster.wait_for(
                lambda: (
                    observer.node.core.status().log_end_offset
                    == leader.node.core.status().log_end_offset
                )
            )
            described = await _describe(leader.config.address)
            assert described.leader.leader_id == leader.config.node_id
            assert list(described.voters) == [1, 2, 3]
            replicas = {r.node_id: r for r in described.replicas}
            assert set(replicas) == {1, 2, 3, OBSERVER}
            entry = replicas[OBSERVER]
            assert not entry.voter
            assert entry.status == "Observer"
            assert entry.last_fetch_timestamp_ms > 0
            assert entry.log_end_offset <= described.log_end_offset
            for n in (1, 2, 3):
                assert replicas[n].voter
                expected = "Leader" if n == leader.config.node_id else "Follower"
                assert replicas[n].status == expected
            # The observer's own view: a follower of the leader, not a voter.
            own = await _describe(observer.config.address)
            assert own.node_id == OBSERVER
            assert own.role == "follower"
            assert own.leader.leader_id == leader.config.node_id
            assert OBSERVER not in own.voters

    run(go())


def test_observer_never_counts_toward_the_high_watermark(tmp_path: Path) -> None:
    async def go() -> None:
        async with voters_and_observer(tmp_path) as (cluster, observer):
            leader = await cluster.wait_leader()
            async with KvClient([leader.config.address]) as client:
                committed = await client.put("before", b"1")
            await cluster.wait_for(lambda: kv_of(observer).get("before") is not None)

            # Two of the three voters go: the leader alone is no majority, and
            # the observer must not stand in for one.
            followers = [n for n in cluster.servers if n != leader.config.node_id]
            for n in followers:
                await cluster.stop(n, resign=False)
            hw_before = leader.node.core.status().high_watermark
            assert hw_before > committed.offset

            async with KvClient([leader.config.address], timeout_s=1.0) as client:
                with pytest.raises(IndeterminateWriteError):
                    await client.put("during", b"2")

            # The record reached the leader's log and, by fetching, the
            # observer's; yet it is not committed anywhere.
            await cluster.wait_for(
                lambda: (
                    observer.node.core.status().log_end_offset
                    == leader.node.core.status().log_end_offset
                )
            )
            assert leader.node.core.status().log_end_offset > hw_before
            assert leader.node.core.role is Role.LEADER  # still inside check-quorum
            assert leader.node.core.status().high_watermark == hw_before
            assert kv_of(leader).get("during") is None
            assert kv_of(observer).get("during") is None
            assert observer.node.core.status().high_watermark <= hw_before
            # The leader sees the observer fully caught up (its next fetch
            # reports the new end), and still does not commit.
            deadline = asyncio.get_running_loop().time() + 5
            while True:
                described = await _describe(leader.config.address)
                entry = next(r for r in described.replicas if r.node_id == OBSERVER)
                if entry.lag == 0:
                    break
                assert asyncio.get_running_loop().time() < deadline, described
                await asyncio.sleep(0.02)
            assert entry.log_end_offset == described.log_end_offset > hw_before
            assert described.high_watermark == hw_before

            # A voter comes back: now a majority, the log commits, and all
            # four nodes (the observer too) apply the same committed state.
            await cluster.start(followers[0])
            async with KvClient(list(cluster.voters.values()), timeout_s=10.0) as client:
                await client.put("after", b"3")
            nodes = [*cluster.servers.values(), observer]
            await cluster.wait_for(
                lambda: (
                    kv_of(observer).get("after") is not None
                    and len(
                        {(s.state_machine.applied_offset, s.state_machine.digest()) for s in nodes}
                    )
                    == 1
                )
            )

    run(go())

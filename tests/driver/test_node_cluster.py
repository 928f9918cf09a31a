"""Real quorum nodes (gRPC, RocksDB) in one process, on loopback."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from kqproto import kv_pb2, kv_pb2_grpc, raft_pb2, raft_pb2_grpc
from kvstore.client import KvClient
from quorum.driver.client import ClientError
from server.controller import kv_of
from tests.driver.cluster_util import CLUSTER_ID, run, running


def test_write_then_linearizable_read_from_any_bootstrap(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            follower = next(s for s in cluster.servers.values() if s is not leader)
            # Bootstrap from a follower only: the client follows the redirect.
            async with KvClient([follower.config.address]) as client:
                pos = await client.put("a", b"1")
                assert pos.epoch == leader.node.core.epoch
                got = await client.get("a")
                assert (got.present, got.value) == (True, b"1")
                assert got.version == pos
                assert client.leader_address == leader.config.address
                missing = await client.get("nope")
                assert not missing.present and missing.value is None
            # Every node applies the write.
            await cluster.wait_for(
                lambda: all(kv_of(s).get("a") is not None for s in cluster.servers.values())
            )

    run(go())


def test_compare_and_set(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            async with KvClient([leader.config.address]) as client:
                first = await client.cas("r", None, b"v1")
                assert first.ok
                stale = await client.cas("r", None, b"v2")
                assert not stale.ok and stale.current == b"v1"
                swapped = await client.cas("r", b"v1", b"v2")
                assert swapped.ok
                assert (await client.get("r")).value == b"v2"

    run(go())


def test_leader_failover_keeps_acknowledged_writes(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            addresses = list(cluster.voters.values())
            async with KvClient(addresses) as client:
                for i in range(20):
                    await client.put(f"k{i}", b"%d" % i)
                old = leader.config.node_id
                old_epoch = leader.node.core.epoch
                # Kill without resigning: the others must notice and elect.
                await cluster.stop(old, resign=False)
                new = await cluster.wait_leader()
                assert new.config.node_id != old and new.node.core.epoch > old_epoch
                for i in range(20):
                    assert (await client.get(f"k{i}")).value == b"%d" % i
                await client.put("after", b"x")
                # The old leader comes back, catches up and agrees.
                await cluster.start(old)
                await cluster.wait_for(lambda: kv_of(cluster.servers[old]).get("after") is not None)
                found = kv_of(cluster.servers[old]).get("k7")
                assert found is not None and found.value == b"7"

    run(go())


def test_malformed_and_foreign_requests_are_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            node_id, address = next(iter(cluster.voters.items()))
            async with grpc.aio.insecure_channel(address) as channel:
                raft = raft_pb2_grpc.RaftServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await raft.Fetch(
                        raft_pb2.FetchRequest(
                            cluster_id="another-cluster", src=2, dst=node_id, max_bytes=1
                        )
                    )
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "another-cluster" in (err.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await raft.Fetch(
                        raft_pb2.FetchRequest(
                            cluster_id=CLUSTER_ID, src=2, dst=node_id, fetch_offset=-5
                        )
                    )
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "fetch_offset" in (err.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await raft.Vote(
                        raft_pb2.VoteRequest(cluster_id=CLUSTER_ID, src=2, dst=node_id + 100)
                    )
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                kv = kv_pb2_grpc.KvServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await kv.Put(kv_pb2.PutRequest(key="", value=b"x"))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # The node is still serving.
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("still", b"up")
                with pytest.raises(ClientError):
                    await client.put("", b"x")

    run(go())

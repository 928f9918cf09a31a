"""The epoch limit end to end, on a running plaintext cluster.

A plaintext node trusts the ids in the messages (``docs/security.md``), so a
client can speak as a voter: it pushes every node to the last epoch a node
may hold (MAX_EPOCH, 2**31-2) with a BeginQuorumEpoch in the leader's name,
then asks for one more.  The one more is refused INVALID_ARGUMENT naming the
epoch; the nodes, left at MAX_EPOCH, start no election into 2**31-1 (each
says so at ERROR), no node ever holds an epoch past MAX_EPOCH, and none
fails.  The unit tests of each path are in ``tests/quorum/test_epoch_limit.py``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from kqproto import raft_pb2, raft_pb2_grpc
from quorum.driver.tls import dial
from quorum.types import MAX_EPOCH
from tests.driver.cluster_util import CLUSTER_ID, run, running

RPC_TIMEOUT_S = 3.0


def test_no_node_goes_past_the_last_epoch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            lid = leader.config.node_id
            highest = 0

            def watch() -> None:
                nonlocal highest
                for s in cluster.servers.values():
                    stored = s.storage.state.read()
                    highest = max(highest, s.node.core.epoch, stored.epoch if stored else 0)

            for dst, address in cluster.voters.items():
                if dst == lid:
                    continue
                async with dial(address) as channel:
                    stub = raft_pb2_grpc.RaftServiceStub(channel)
                    over = raft_pb2.BeginQuorumEpochRequest(
                        cluster_id=CLUSTER_ID, src=lid, dst=dst, epoch=MAX_EPOCH + 1, leader_id=lid
                    )
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.BeginQuorumEpoch(over, timeout=RPC_TIMEOUT_S)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert str(MAX_EPOCH + 1) in (refused.value.details() or "")
                    last = raft_pb2.BeginQuorumEpochRequest(
                        cluster_id=CLUSTER_ID, src=lid, dst=dst, epoch=MAX_EPOCH, leader_id=lid
                    )
                    await stub.BeginQuorumEpoch(last, timeout=RPC_TIMEOUT_S)
            # The followers fetch at MAX_EPOCH from a leader that does not
            # lead it; it learns the epoch from their answers, and then no
            # one can start an election.  Several election rounds later:
            with caplog.at_level(logging.ERROR, logger="kq.node"):
                await cluster.wait_for(
                    lambda: all(s.node.core.epoch == MAX_EPOCH for s in cluster.servers.values())
                )
                for _ in range(30):
                    watch()
                    await asyncio.sleep(0.1)
            assert highest == MAX_EPOCH
            for n, s in cluster.servers.items():
                assert s.node.failure is None, (n, s.node.failure)
                assert s.node.core.at_last_epoch
            stuck = [
                r.getMessage()
                for r in caplog.records
                if "cannot start an election" in r.getMessage()
            ]
            assert stuck, [r.getMessage() for r in caplog.records]
            assert str(MAX_EPOCH) in stuck[0]

    run(go())

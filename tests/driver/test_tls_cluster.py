"""A quorum with mutual TLS: real handshakes, identities from certificates.

The first finding of the security review, replayed: a BeginQuorumEpoch
forged in voter 2's name (``src=2, leader_id=2``) at an epoch near the
int32 limit, sent to the other voters.  Over TLS it is refused whoever
sends it without voter 2's key: without a certificate there is no
handshake, a user's certificate or another voter's is PERMISSION_DENIED,
and the epoch, the leader and the log are unchanged.  Certificates are
re-read when their files change, without a restart.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import grpc
import pytest

from kqproto import raft_pb2, raft_pb2_grpc
from kvstore.client import KvClient
from quorum.driver.identity import Identity, Role
from quorum.driver.tls import TlsError, TlsFiles, dial
from quorum.driver.wire import MAX_EPOCH
from server.certs import issue
from tests.driver.cluster_util import CLUSTER_ID, Cluster, run, running, served_serial

RPC_TIMEOUT_S = 3.0


def tls_cluster(root: Path) -> AbstractAsyncContextManager[Cluster]:
    return running(root, tls=True)


def _user(cluster: Cluster, name: str = "ops") -> grpc.ChannelCredentials:
    return cluster.tls_files(Identity.user(CLUSTER_ID, name)).channel_credentials()


def test_a_tls_cluster_elects_and_serves_its_certified_clients(tmp_path: Path) -> None:
    async def go() -> None:
        async with tls_cluster(tmp_path) as cluster:
            await cluster.wait_leader()
            addresses = list(cluster.voters.values())
            async with KvClient(addresses, credentials=_user(cluster)) as client:
                await client.put("k", b"v")
                read = await client.get("k")
                assert read.value == b"v"
            # A client without a certificate gets no connection at all.
            async with KvClient(addresses, timeout_s=1.0) as plain:
                with pytest.raises(Exception) as refused:
                    await plain.put("k", b"plain")
                assert type(refused.value).__name__ in ("NoLeaderError", "IndeterminateWriteError")
            async with KvClient(addresses, credentials=_user(cluster)) as client:
                assert (await client.get("k")).value == b"v"

    run(go())


async def _forge(address: str, credentials: grpc.ChannelCredentials | None, dst: int) -> str:
    """A BeginQuorumEpoch in voter 2's name near the int32 limit; the gRPC
    status it gets ("OK" if answered)."""
    request = raft_pb2.BeginQuorumEpochRequest(
        cluster_id=CLUSTER_ID, src=2, dst=dst, epoch=MAX_EPOCH, leader_id=2
    )
    async with dial(address, credentials) as channel:
        try:
            await raft_pb2_grpc.RaftServiceStub(channel).BeginQuorumEpoch(
                request, timeout=RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return "OK"


def test_a_begin_quorum_epoch_forged_in_a_voters_name_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with tls_cluster(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            targets = [n for n in (1, 3) if n in cluster.servers]
            before = {
                n: (s.node.core.epoch, s.node.core.log_end_offset)
                for n, s in cluster.servers.items()
            }
            leader_id = leader.config.node_id
            controller_3 = cluster.tls_files(Identity.node(CLUSTER_ID, Role.CONTROLLER, 3))
            broker_2 = cluster.tls_files(Identity.node(CLUSTER_ID, Role.BROKER, 2))
            for dst in targets:
                address = cluster.voters[dst]
                assert (await _forge(address, None, dst)).startswith("UNAVAILABLE")
                refused = await _forge(address, _user(cluster, "mallory"), dst)
                assert refused.startswith("PERMISSION_DENIED"), refused
                assert f"kq://{CLUSTER_ID}/user/mallory may not send" in refused
                # Another voter's own certificate cannot speak for voter 2,
                # nor can a broker's that happens to carry id 2.
                refused = await _forge(address, controller_3.channel_credentials(), dst)
                assert refused.startswith("PERMISSION_DENIED"), refused
                assert "may not send a BeginQuorumEpochRequest as node 2" in refused
                refused = await _forge(address, broker_2.channel_credentials(), dst)
                assert refused.startswith("PERMISSION_DENIED"), refused
            await asyncio.sleep(1.0)  # several fetch timeouts
            for n, server in cluster.servers.items():
                epoch, _ = before[n]
                assert server.node.core.epoch == epoch, (n, server.node.core.epoch)
                assert server.node.core.leader_id == leader_id
            async with KvClient(list(cluster.voters.values()), credentials=_user(cluster)) as c:
                await c.put("after", b"still serving")

    run(go())


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    async def go() -> None:
        async with tls_cluster(tmp_path) as cluster:
            await cluster.wait_leader()
            assert cluster.certs is not None
            address = cluster.voters[1]
            me = cluster.tls_files(Identity.user(CLUSTER_ID, "ops"))
            first = await asyncio.to_thread(served_serial, address, me)
            await asyncio.sleep(0.05)  # a later modification time
            rotated = issue(cluster.certs, Identity.node(CLUSTER_ID, Role.CONTROLLER, 1))
            assert rotated.cert.name == "controller-1.crt"
            second = await asyncio.to_thread(served_serial, address, me)
            assert second != first
            # The node keeps serving, and its peers still talk to it.
            async with KvClient(list(cluster.voters.values()), credentials=_user(cluster)) as c:
                await c.put("after-rotation", b"1")

    run(go())


def test_unusable_tls_files_are_named(tmp_path: Path) -> None:
    missing = TlsFiles(tmp_path / "ca.crt", tmp_path / "n.crt", tmp_path / "n.key")
    with pytest.raises(TlsError, match="cannot read the CA certificate"):
        missing.read()
    for path in (missing.ca, missing.cert, missing.key):
        path.write_text("not pem")
    with pytest.raises(TlsError, match="is not PEM"):
        missing.read()

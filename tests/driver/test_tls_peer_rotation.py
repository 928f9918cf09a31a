"""A node's connections to its peers take a rotated certificate without a
restart: the transport re-reads its files when they change, makes its
channels anew, and the peer's next handshake sees the new certificate's
serial (real mutual-TLS handshakes against a peer that records what it was
shown).  A pair caught half replaced is not taken; and without the reload
the old certificate would still be presented, which the control shows."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from kqproto import raft_pb2 as pb
from kqproto import raft_pb2_grpc as pb_grpc
from quorum.driver.identity import Identity, Role
from quorum.driver.tls import TlsFiles
from quorum.driver.transport import RaftTransport
from quorum.messages import Message, VoteRequest
from server.certs import create_ca, issue
from tests.driver.cluster_util import CLUSTER_ID, file_serial, run

HOST = "127.0.0.1"


class RecordingPeer(pb_grpc.RaftServiceServicer):
    """Node 2: answers votes and records the serial of each caller's
    certificate."""

    def __init__(self) -> None:
        self.serials: list[int] = []

    async def Vote(self, request: pb.VoteRequest, context: Any) -> pb.VoteResponse:
        pem = context.auth_context()["x509_pem_cert"][0]
        self.serials.append(x509.load_pem_x509_certificate(pem).serial_number)
        return pb.VoteResponse(src=2, dst=1, epoch=request.epoch, leader_id=-1)


def _replace(source: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".new")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _node(certs: Path, node_id: int) -> TlsFiles:
    issue(certs, Identity.node(CLUSTER_ID, Role.CONTROLLER, node_id), [HOST])
    return TlsFiles.in_folder(certs, f"controller-{node_id}")


@pytest.mark.parametrize("reload", [True, False], ids=["reloads", "control-without-reload"])
def test_peer_connections_present_the_rotated_certificate(tmp_path: Path, reload: bool) -> None:
    certs = tmp_path / "certs"
    create_ca(certs, CLUSTER_ID)
    me, peer_files = _node(certs, 1), _node(certs, 2)
    # Node 1's next pair, made aside from the same CA.
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copyfile(certs / name, aside / name)
    new = issue(aside, Identity.node(CLUSTER_ID, Role.CONTROLLER, 1), [HOST])

    async def go() -> None:
        peer = RecordingPeer()  # type: ignore[abstract]  # only Vote is called
        server = grpc.aio.server()
        pb_grpc.add_RaftServiceServicer_to_server(peer, server)
        port = server.add_secure_port(f"{HOST}:0", peer_files.server_credentials())
        await server.start()
        answers: list[Message] = []
        transport = RaftTransport(
            1,
            CLUSTER_ID,
            {2: f"{HOST}:{port}"},
            answers.append,
            rpc_timeout_s=5.0,
            tls=me,
            # The control never looks at the files again.
            tls_check_interval_s=0.0 if reload else 3600.0,
        )

        async def vote(epoch: int) -> int:
            transport.send(VoteRequest(1, 2, epoch, 0, 0, False))
            for _ in range(500):
                if len(peer.serials) == epoch:
                    return peer.serials[-1]
                await asyncio.sleep(0.01)
            raise AssertionError(f"the peer saw {len(peer.serials)} votes, not {epoch}")

        try:
            old = file_serial(me.cert)
            assert await vote(1) == old
            await asyncio.sleep(0.05)  # later modification times
            # Half a rotation: the key replaced, the certificate not yet.
            _replace(new.key, me.key)
            assert await vote(2) == old
            _replace(new.cert, me.cert)
            seen = await vote(3)
            if reload:
                assert seen == file_serial(new.cert) != old
            else:
                assert seen == old
            # Every vote is answered; the peer sees a request before its
            # answer reaches the transport, so wait for the last one.
            for _ in range(500):
                if len(answers) == 3:
                    break
                await asyncio.sleep(0.01)
            assert len(answers) == 3
        finally:
            await transport.close()
            await server.stop(None)

    run(go())

"""A cluster's certificates (server/certs.py) and the identities they bind
(quorum/driver/identity.py), with real TLS handshakes."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest

from kqproto import quorum_pb2, quorum_pb2_grpc
from quorum.driver.identity import Identity, IdentityError, Role, identity_from_pem, peer_identity
from quorum.driver.tls import dial
from server.certs import CertError, create_ca, describe_certs, issue

CLUSTER = "c1-Ab_9"


def test_identity_uris_round_trip_and_bad_ones_are_named() -> None:
    node = Identity.node(CLUSTER, Role.CONTROLLER, 2)
    assert node.uri == f"kq://{CLUSTER}/controller/2"
    assert Identity.parse(node.uri) == node and node.node_id == 2
    assert node.principal == "Controller:2"
    user = Identity.user(CLUSTER, "alice@example")
    assert Identity.parse(user.uri) == user and user.node_id is None
    for bad, words in [
        ("https://c1/controller/1", "is not a kq://"),
        ("kq://c1/controller", "is not kq://"),
        ("kq://c1/admin/1", "role 'admin'"),
        ("kq://c1/broker/x", "needs a node id"),
        ("kq://c 1/broker/1", "cluster id"),
        ("kq://c1/broker/2147483648", "needs a node id"),
    ]:
        with pytest.raises(IdentityError, match=words):
            Identity.parse(bad)


def test_a_ca_issues_certificates_that_name_their_identity(tmp_path: Path) -> None:
    ca = create_ca(tmp_path, CLUSTER)
    assert stat.S_IMODE(ca.key.stat().st_mode) == 0o600
    node = issue(tmp_path, Identity.node(CLUSTER, Role.BROKER, 7), hosts=("127.0.0.7", "b7.test"))
    assert stat.S_IMODE(node.key.stat().st_mode) == 0o600
    assert identity_from_pem(node.cert.read_bytes()) == Identity.node(CLUSTER, Role.BROKER, 7)
    user = issue(tmp_path, Identity.user(CLUSTER, "ops"), hosts=())
    listed = {c.file: c for c in describe_certs(tmp_path)}
    assert list(listed) == ["ca.crt", "broker-7.crt", "user-ops.crt"]
    assert listed["broker-7.crt"].identity == f"kq://{CLUSTER}/broker/7"
    assert set(listed["broker-7.crt"].hosts) == {"b7.test", "127.0.0.7"}
    assert listed["user-ops.crt"].hosts == ()
    assert user.cert.name == "user-ops.crt"


def test_refusals_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CertError, match="no CA in"):
        issue(tmp_path, Identity.node(CLUSTER, Role.CONTROLLER, 1))
    create_ca(tmp_path, CLUSTER)
    with pytest.raises(CertError, match="would untrust every certificate"):
        create_ca(tmp_path, CLUSTER)
    with pytest.raises(CertError, match="cluster c1-Ab_9's, not other's"):
        issue(tmp_path, Identity.node("other", Role.CONTROLLER, 1))
    with pytest.raises(CertError, match="neither an IP address nor a DNS name"):
        issue(tmp_path, Identity.node(CLUSTER, Role.CONTROLLER, 1), hosts=("a b",))
    with pytest.raises(IdentityError, match="not a PEM certificate"):
        identity_from_pem(b"junk")


class _WhoAmI(quorum_pb2_grpc.QuorumServiceServicer):
    async def DescribeQuorum(self, request: Any, context: Any) -> Any:
        identity = peer_identity(context)
        return quorum_pb2.DescribeQuorumResponse(cluster_id=str(identity))

    async def Resign(self, request: Any, context: Any) -> Any:
        return quorum_pb2.ResignResponse()


def test_a_server_reads_the_callers_identity_from_the_verified_certificate(
    tmp_path: Path,
) -> None:
    create_ca(tmp_path, CLUSTER)
    server_files = issue(tmp_path, Identity.node(CLUSTER, Role.CONTROLLER, 1))
    alice = issue(tmp_path, Identity.user(CLUSTER, "alice"), hosts=())
    ca = (tmp_path / "ca.crt").read_bytes()
    other_ca = tmp_path / "other"
    create_ca(other_ca, CLUSTER)
    mallory = issue(other_ca, Identity.user(CLUSTER, "alice"), hosts=())

    async def call(credentials: grpc.ChannelCredentials | None, port: int) -> str:
        async with dial(f"127.0.0.1:{port}", credentials) as channel:
            stub = quorum_pb2_grpc.QuorumServiceStub(channel)
            try:
                answer = await stub.DescribeQuorum(quorum_pb2.DescribeQuorumRequest(), timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return str(answer.cluster_id)

    async def go() -> None:
        server = grpc.aio.server()
        quorum_pb2_grpc.add_QuorumServiceServicer_to_server(_WhoAmI(), server)
        credentials = grpc.ssl_server_credentials(
            [(server_files.key.read_bytes(), server_files.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        try:
            as_alice = grpc.ssl_channel_credentials(
                ca, alice.key.read_bytes(), alice.cert.read_bytes()
            )
            assert await call(as_alice, port) == f"kq://{CLUSTER}/user/alice"
            # No certificate, plaintext, or a certificate of another CA
            # that claims the same name: no handshake.
            assert await call(grpc.ssl_channel_credentials(ca), port) == "UNAVAILABLE"
            assert await call(None, port) == "UNAVAILABLE"
            forged = grpc.ssl_channel_credentials(
                ca, mallory.key.read_bytes(), mallory.cert.read_bytes()
            )
            assert await call(forged, port) == "UNAVAILABLE"
        finally:
            await server.stop(None)

    asyncio.run(go())

"""The replication stream (RaftService.FetchStream): followers fetch over one
long-lived call per leader; the unary Fetch still works; a stream that
breaks or goes silent is dropped, reported as a failed unary fetch would be,
and opened again after a backoff, fetches going unary meanwhile; a peer
that does not serve the stream gets unary fetches; over TLS every request on
a stream is checked against the certificate of the caller, as a unary
Fetch is.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from kqproto import raft_pb2, raft_pb2_grpc
from kvstore.client import KvClient
from quorum.driver.identity import Identity, Role
from quorum.driver.tls import dial
from quorum.driver.transport import RaftTransport, streaming_enabled
from quorum.messages import FetchRequest, FetchResponse, Message
from tests.driver.cluster_util import CLUSTER_ID, Cluster, free_ports, run, running

RPC_TIMEOUT_S = 3.0


def _fetch_pb(src: int, dst: int, request_id: int, **fields: Any) -> raft_pb2.FetchRequest:
    values: dict[str, Any] = {
        "cluster_id": CLUSTER_ID,
        "epoch": 0,
        "fetch_offset": 0,
        "last_fetched_epoch": 0,
        "max_wait_ms": 0,
        "max_bytes": 1 << 20,
    }
    values.update(fields)
    return raft_pb2.FetchRequest(src=src, dst=dst, request_id=request_id, **values)


def test_followers_replicate_over_one_stream_each(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values())) as client:
                for i in range(50):
                    await client.put(f"k{i}", b"v")
            end = leader.node.core.log_end_offset
            await cluster.wait_for(
                lambda: all(s.node.core.log_end_offset == end for s in cluster.servers.values())
            )
            for server in cluster.servers.values():
                if server is leader:
                    continue
                t = server.transport
                # Every fetch of the 50 writes went on the one stream.
                assert t.streams_opened == 1, t.streams_opened
                assert t.streams_broken == 0
                assert t.sent > 50

    run(go())


def test_unary_fetch_only_still_replicates(tmp_path: Path) -> None:
    class Unary(Cluster):
        def make_server(self, config: Any) -> Any:
            server = super().make_server(config)
            server.transport.streaming = False
            return server

    async def go() -> None:
        cluster = Unary(tmp_path)
        try:
            for n in cluster.voters:
                await cluster.start(n)
            leader = await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("k", b"v")
            end = leader.node.core.log_end_offset
            await cluster.wait_for(
                lambda: all(s.node.core.log_end_offset == end for s in cluster.servers.values())
            )
            assert all(s.transport.streams_opened == 0 for s in cluster.servers.values())
        finally:
            for n in list(cluster.servers):
                await cluster.stop(n, resign=False)

    run(go())


def test_the_environment_turns_streams_off_and_a_bad_value_is_named() -> None:
    assert streaming_enabled({})
    assert streaming_enabled({"KQ_FETCH_STREAM": "1"})
    assert not streaming_enabled({"KQ_FETCH_STREAM": "0"})
    assert not streaming_enabled({"KQ_FETCH_STREAM": "off"})
    with pytest.raises(ValueError, match="KQ_FETCH_STREAM must be 0 or 1, got 'maybe'"):
        streaming_enabled({"KQ_FETCH_STREAM": "maybe"})


def test_a_killed_leaders_stream_is_reported_and_the_next_leader_streams(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            old = leader.config.node_id
            followers = [s for s in cluster.servers.values() if s is not leader]
            await cluster.wait_for(lambda: all(f.transport.streams_opened for f in followers))
            await cluster.stop(old, resign=False)
            new = await cluster.wait_leader()
            assert new.config.node_id != old
            # The stream to the stopped leader broke; the survivors stream
            # from the new leader.
            assert all(f.transport.streams_broken >= 1 for f in followers)
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("after", b"failover")
            other = next(f for f in followers if f is not new)
            assert new.config.node_id in other.transport._outbound

    run(go())


class _Peer(raft_pb2_grpc.RaftServiceServicer):
    """A leader that answers unary fetches and, with ``silent``, takes a
    stream's fetches without ever answering them (a peer cut off without
    a connection error); without it, serves no stream at all."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.unary = 0
        self.streamed = 0

    async def Fetch(self, request: Any, context: Any) -> Any:
        self.unary += 1
        return raft_pb2.FetchResponse(
            src=request.dst, dst=request.src, epoch=request.epoch, leader_id=request.dst,
            fetch_offset=request.fetch_offset, request_id=request.request_id,
        )  # fmt: skip

    async def FetchStream(self, request_iterator: Any, context: Any) -> Any:
        if not self.stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no stream here")
        async for _ in request_iterator:
            self.streamed += 1
        return
        yield  # an async generator that never answers


async def _with_peer(
    peer: _Peer, timeout_s: float
) -> tuple[grpc.aio.Server, RaftTransport, list[Message], list[int]]:
    port = free_ports(1)[0]
    server = grpc.aio.server()
    raft_pb2_grpc.add_RaftServiceServicer_to_server(peer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    got: list[Message] = []
    unreachable: list[int] = []
    transport = RaftTransport(
        2, CLUSTER_ID, {1: f"127.0.0.1:{port}"}, got.append, timeout_s,
        unreachable=unreachable.append, streaming=True,
    )  # fmt: skip
    return server, transport, got, unreachable


def _fetch(request_id: int) -> FetchRequest:
    return FetchRequest(2, 1, 0, 0, 0, 0, 1 << 20, request_id)


async def _wait(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_a_silent_stream_is_dropped_without_a_connection_error_and_fetches_go_unary() -> None:
    async def go() -> None:
        peer = _Peer(stream=True)  # type: ignore[abstract]  # only the fetches are called
        server, transport, got, unreachable = await _with_peer(peer, timeout_s=0.2)
        try:
            transport.send(_fetch(1))
            await _wait(lambda: peer.streamed == 1)
            # No answer within the unary deadline and nothing else heard:
            # the stream is dropped, not reported as unreachable (no
            # connection error), and the next fetch goes unary.
            await _wait(lambda: transport.streams_broken == 1)
            assert unreachable == []
            assert transport.failed == 1
            transport.send(_fetch(2))
            await _wait(lambda: len(got) == 1)
            assert peer.unary == 1
            assert isinstance(got[0], FetchResponse) and got[0].request_id == 2
            # After the backoff a stream is tried again.
            await asyncio.sleep(0.1)
            transport.send(_fetch(3))
            assert transport.streams_opened == 2
        finally:
            await transport.close()
            await server.stop(None)

    run(go())


def test_a_peer_without_the_stream_gets_unary_fetches() -> None:
    async def go() -> None:
        peer = _Peer(stream=False)  # type: ignore[abstract]  # only the fetches are called
        server, transport, got, unreachable = await _with_peer(peer, timeout_s=1.0)
        try:
            transport.send(_fetch(1))
            await _wait(lambda: transport.streams_broken == 1)
            for i in range(2, 5):
                transport.send(_fetch(i))
                await _wait(lambda i=i: len(got) == i - 1)
            assert peer.unary == 3
            assert transport.streams_opened == 1
            assert unreachable == []
        finally:
            await transport.close()
            await server.stop(None)

    run(go())


def test_a_refused_peer_connection_is_reported_unreachable() -> None:
    async def go() -> None:
        port = free_ports(1)[0]  # nothing listens there
        unreachable: list[int] = []
        transport = RaftTransport(
            2, CLUSTER_ID, {1: f"127.0.0.1:{port}"}, lambda m: None, 1.0,
            unreachable=unreachable.append, streaming=True,
        )  # fmt: skip
        try:
            transport.send(_fetch(1))
            await _wait(lambda: unreachable == [1])
            assert transport.streams_broken == 1
        finally:
            await transport.close()

    run(go())


async def _stream_status(
    address: str, credentials: grpc.ChannelCredentials | None, requests: list[Any]
) -> tuple[str, list[Any]]:
    """Send ``requests`` on one FetchStream; the stream's end status and
    the answers read before it."""
    answers: list[Any] = []
    async with dial(address, credentials) as channel:
        call = raft_pb2_grpc.RaftServiceStub(channel).FetchStream(timeout=RPC_TIMEOUT_S)
        try:
            for request in requests:
                await call.write(request)
                answers.append(await call.read())
            await call.done_writing()
            await call.read()
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}", answers
        return "OK", answers


def _user(cluster: Cluster, name: str) -> grpc.ChannelCredentials:
    return cluster.tls_files(Identity.user(CLUSTER_ID, name)).channel_credentials()


def test_a_stream_checks_the_callers_certificate_as_a_unary_fetch_does(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path, tls=True) as cluster:
            leader = await cluster.wait_leader()
            n = leader.config.node_id
            address = cluster.voters[n]
            epoch = leader.node.core.epoch
            # A broker (an observer) may fetch in its own name, on a stream.
            broker_7 = cluster.tls_files(Identity.node(CLUSTER_ID, Role.BROKER, 7))
            status, answers = await _stream_status(
                address,
                broker_7.channel_credentials(),
                [_fetch_pb(7, n, 1, epoch=epoch), _fetch_pb(7, n, 2, epoch=epoch)],
            )
            assert status == "OK", status
            assert [a.request_id for a in answers] == [1, 2]
            assert all(a.leader_id == n for a in answers)
            # ... not in another node's name, even after a fetch of its own.
            status, answers = await _stream_status(
                address,
                broker_7.channel_credentials(),
                [_fetch_pb(7, n, 3, epoch=epoch), _fetch_pb(8, n, 4, epoch=epoch)],
            )
            assert status.startswith("PERMISSION_DENIED"), status
            assert "may not send a FetchRequest as node 8" in status
            assert len(answers) == 1
            # A user may not fetch at all.
            status, _ = await _stream_status(
                address, _user(cluster, "mallory"), [_fetch_pb(7, n, 5, epoch=epoch)]
            )
            assert status.startswith("PERMISSION_DENIED"), status
            assert f"kq://{CLUSTER_ID}/user/mallory may not send a FetchRequest" in status
            # No certificate: no handshake.
            status, _ = await _stream_status(address, None, [_fetch_pb(7, n, 6)])
            assert status.startswith("UNAVAILABLE"), status

    run(go())


def test_a_malformed_or_foreign_request_ends_the_stream_with_the_unary_status(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            n = leader.config.node_id
            address = cluster.voters[n]
            status, _ = await _stream_status(
                address, None, [_fetch_pb(7, n, 1, cluster_id="another")]
            )
            assert status.startswith("FAILED_PRECONDITION"), status
            assert "request for cluster 'another'" in status
            status, _ = await _stream_status(address, None, [_fetch_pb(7, n + 1, 1)])
            assert status.startswith("INVALID_ARGUMENT"), status
            assert f"addressed to node {n + 1} reached node {n}" in status
            status, _ = await _stream_status(address, None, [_fetch_pb(7, n, 1, max_wait_ms=-1)])
            assert status.startswith("INVALID_ARGUMENT"), status
            assert "max_wait_ms must not be negative" in status
            # Bytes that are no FetchRequest at all.
            async with dial(address, None) as channel:
                call = channel.stream_stream(
                    "/kq.raft.RaftService/FetchStream",
                    request_serializer=lambda b: b,
                    response_deserializer=raft_pb2.FetchResponse.FromString,
                )(timeout=RPC_TIMEOUT_S)
                await call.write(b"\xff\xff\xff")
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "malformed request" in (refused.value.details() or "")
            # The leader still leads and replicates.
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("k", b"v")

    run(go())

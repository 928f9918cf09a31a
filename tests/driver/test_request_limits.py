"""The limits on what one caller may ask of a node (docs/operations.md,
"Limits"): the size of a message, the items of a request, the calls in
flight per caller and the streams per connection.

The guard's per-caller and per-request checks run on a bare gRPC server
with the node's interceptor and a handler that blocks until told (so the
number of calls in flight is exact), in plaintext and with mutual TLS
(callers told apart by their certificates).  The message size and the items
limit run on a real cluster too, which keeps serving afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from kqproto import kv_pb2, kv_pb2_grpc, metadata_pb2, quorum_pb2, raft_pb2, raft_pb2_grpc
from kvstore.client import KvClient
from quorum.config import QuorumConfig
from quorum.driver.identity import Identity, Role
from quorum.driver.node import NodeOptions
from quorum.driver.rpc_guard import RequestGuard, count_items
from quorum.driver.tls import TlsFiles, dial
from server.certs import create_ca, issue
from server.config import ConfigError, controller_config, load_settings
from tests.driver.cluster_util import CLUSTER_ID, FAST, run, running

RPC_TIMEOUT_S = 5.0
WAIT = "/kq.test.Blocker/Wait"

# -- counting items ---------------------------------------------------------------------


def test_items_are_counted_at_every_depth_including_maps() -> None:
    topic = metadata_pb2.CreatableTopic(
        name="t",
        assignments=[metadata_pb2.ReplicaAssignment(replicas=[1, 2, 3])] * 4,
        configs={"a": "1", "b": "2"},
    )
    request = metadata_pb2.CreateTopicsRequest(topics=[topic] * 2)
    counted = count_items(request, 1000)
    # 2 topics, and in each 4 assignments of 3 replicas and 2 configs.
    assert counted.count == 2 + 2 * (4 + 4 * 3 + 2)
    assert (counted.largest, counted.largest_count) == ("topics[].assignments", 4)
    assert count_items(quorum_pb2.DescribeQuorumRequest(), 0).count == 0


def test_counting_stops_soon_after_the_limit() -> None:
    many = metadata_pb2.CreateTopicsRequest(
        topics=[metadata_pb2.CreatableTopic(name=str(i), configs={"a": "b"}) for i in range(5000)]
    )
    counted = count_items(many, 10)
    # The topics are counted whole; none is entered once past the limit.
    assert counted.count == 5000
    assert (counted.largest, counted.largest_count) == ("topics", 5000)
    assert not counted.complete
    whole = count_items(many, 10_000)
    assert (whole.count, whole.complete) == (10_000, True)


# -- a bare server with the guard ---------------------------------------------------------


@dataclass
class Blocker:
    """A handler that holds every call until ``release`` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    inside: int = 0
    most_inside: int = 0
    calls: int = 0

    async def wait(self, request: quorum_pb2.ResignRequest, context: Any) -> Any:
        self.calls += 1
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            await self.release.wait()
        finally:
            self.inside -= 1
        return quorum_pb2.ResignResponse()


@asynccontextmanager
async def guarded_server(
    *,
    max_calls: int = 1000,
    max_items: int = 1000,
    streams: int = 100,
    tls: TlsFiles | None = None,
) -> AsyncIterator[tuple[str, Blocker, RequestGuard]]:
    blocker = Blocker()
    guard = RequestGuard(1, max_calls_per_caller=max_calls, max_request_items=max_items)
    server = grpc.aio.server(
        interceptors=[guard], options=[("grpc.max_concurrent_streams", streams)]
    )
    handler = grpc.unary_unary_rpc_method_handler(
        blocker.wait,
        request_deserializer=quorum_pb2.ResignRequest.FromString,
        response_serializer=quorum_pb2.ResignResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("kq.test.Blocker", {"Wait": handler})]
    )
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}", blocker, guard
    finally:
        blocker.release.set()
        await server.stop(None)


def _wait(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(
        WAIT,
        request_serializer=quorum_pb2.ResignRequest.SerializeToString,
        response_deserializer=quorum_pb2.ResignResponse.FromString,
    )


async def _until(cond: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


async def _refusal(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


def test_a_plaintext_caller_past_its_calls_in_flight_is_refused() -> None:
    async def go() -> None:
        async with (
            guarded_server(max_calls=3) as (address, blocker, guard),
            dial(address) as one,
            dial(address) as two,
        ):
            held = [
                asyncio.ensure_future(_wait(ch)(quorum_pb2.ResignRequest(), timeout=10))
                for ch in (one, two, one)
            ]
            await _until(lambda: blocker.inside == 3)
            # A fourth from the same host, on either connection.
            for ch in (one, two):
                err = await _refusal(_wait(ch)(quorum_pb2.ResignRequest(), timeout=5))
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                details = err.details() or ""
                assert "127.0.0.1" in details and "3 calls in flight" in details, details
                assert "node.max_calls_per_caller=3" in details, details
            assert blocker.calls == 3
            blocker.release.set()
            await asyncio.gather(*held)
            assert guard.in_flight("127.0.0.1") == 0
            # Once they are answered, it may call again.
            await _wait(one)(quorum_pb2.ResignRequest(), timeout=5)

    run(go())


def test_callers_with_certificates_each_have_their_own_share(tmp_path: Path) -> None:
    create_ca(tmp_path, CLUSTER_ID)
    node = Identity.node(CLUSTER_ID, Role.CONTROLLER, 1)
    paths = issue(tmp_path, node, hosts=("127.0.0.1",))
    server_tls = TlsFiles(tmp_path / "ca.crt", paths.cert, paths.key)

    def user(name: str) -> grpc.ChannelCredentials:
        p = issue(tmp_path, Identity.user(CLUSTER_ID, name), hosts=())
        return TlsFiles(tmp_path / "ca.crt", p.cert, p.key).channel_credentials()

    async def go() -> None:
        async with guarded_server(max_calls=2, tls=server_tls) as (address, blocker, guard):
            alice, bob = user("alice"), user("bob")
            async with (
                dial(address, alice) as a1,
                dial(address, alice) as a2,
                dial(address, bob) as b1,
            ):
                held = [
                    asyncio.ensure_future(_wait(ch)(quorum_pb2.ResignRequest(), timeout=10))
                    for ch in (a1, a2, b1, b1)
                ]
                await _until(lambda: blocker.inside == 4)
                # Alice's two connections share her share; Bob used his up.
                for ch, who in ((a1, "alice"), (a2, "alice"), (b1, "bob")):
                    err = await _refusal(_wait(ch)(quorum_pb2.ResignRequest(), timeout=5))
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    details = err.details() or ""
                    assert f"kq://{CLUSTER_ID}/user/{who}" in details, details
                assert guard.in_flight(f"kq://{CLUSTER_ID}/user/alice") == 2
                blocker.release.set()
                await asyncio.gather(*held)

    run(go())


def test_streams_past_the_connection_limit_never_reach_the_node() -> None:
    """gRPC's ``grpc.max_concurrent_streams``: a client that knows the limit
    queues its extra calls; one that opens them anyway has them reset
    (REFUSED_STREAM, UNAVAILABLE to the caller, who may retry).  Either way
    no more than the limit run at once on one connection."""

    async def go() -> None:
        async with (
            guarded_server(streams=2) as (address, blocker, _),
            dial(address) as channel,
        ):
            await channel.channel_ready()
            held = [
                asyncio.ensure_future(_wait(channel)(quorum_pb2.ResignRequest(), timeout=10))
                for _ in range(6)
            ]
            await _until(lambda: blocker.inside == 2)
            await asyncio.sleep(0.3)
            assert blocker.most_inside == 2
            blocker.release.set()
            answers = await asyncio.gather(*held, return_exceptions=True)
            refused = [a for a in answers if isinstance(a, BaseException)]
            for err in refused:
                assert isinstance(err, grpc.aio.AioRpcError), err
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
                assert "RST_STREAM" in (err.details() or ""), err
            assert blocker.most_inside == 2
            assert blocker.calls == len(answers) - len(refused) >= 2

    run(go())


def test_a_request_of_too_many_items_is_refused_before_the_servicer() -> None:
    async def go() -> None:
        async with guarded_server(max_items=100) as (address, blocker, _):
            blocker.release.set()
            async with dial(address) as channel:
                fits = quorum_pb2.ResignRequest(preferred_successors=range(100))
                await _wait(channel)(fits, timeout=5)
                over = quorum_pb2.ResignRequest(preferred_successors=range(250))
                err = await _refusal(_wait(channel)(over, timeout=5))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = err.details() or ""
                for words in ("kq.quorum.ResignRequest", "250 items", "preferred_successors"):
                    assert words in details, details
                assert "100 a request may carry (node.max_request_items)" in details, details
                assert blocker.calls == 1

    run(go())


# -- on a running cluster ------------------------------------------------------------------

SMALL = NodeOptions(
    quorum=QuorumConfig(
        election_timeout_ms=150,
        fetch_timeout_ms=400,
        fetch_max_wait_ms=100,
        request_timeout_ms=150,
        fetch_max_bytes=128 * 1024,
        snapshot_chunk_bytes=64 * 1024,
    ),
    snapshot_every_offsets=0,
    max_batch_bytes=128 * 1024,
    max_message_bytes=256 * 1024,
    max_request_items=50,
)


def test_a_node_refuses_what_is_over_its_limits_and_keeps_serving(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path, options=SMALL) as cluster:
            leader = await cluster.wait_leader()
            async with dial(leader.config.address, max_message_bytes=4 * 1024 * 1024) as channel:
                kv = kv_pb2_grpc.KvServiceStub(channel)
                big = kv_pb2.PutRequest(key="big", value=b"x" * (300 * 1024))
                err = await _refusal(kv.Put(big, timeout=RPC_TIMEOUT_S))
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                many = kv_pb2.PutManyRequest(
                    puts=[kv_pb2.PutRequest(key=f"k{i}", value=b"v") for i in range(51)]
                )
                err = await _refusal(kv.PutMany(many, timeout=RPC_TIMEOUT_S))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
                assert "51 items" in (err.details() or ""), err.details()
                assert "node.max_request_items" in (err.details() or ""), err.details()
            # The client's own channel refuses to send past its limit.
            async with dial(leader.config.address, max_message_bytes=1024) as channel:
                kv = kv_pb2_grpc.KvServiceStub(channel)
                too_big = kv_pb2.PutRequest(key="k", value=b"x" * 2048)
                err = await _refusal(kv.Put(too_big, timeout=RPC_TIMEOUT_S))
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            for server in cluster.servers.values():
                assert server.node.failure is None
            async with KvClient(list(cluster.voters.values())) as client:
                await client.put("after", b"x" * (100 * 1024))
                await client.put_many([(f"k{i}", b"v") for i in range(20)])
                assert (await client.get("after")).value == b"x" * (100 * 1024)
            # Nothing refused was written.
            await cluster.wait_for(
                lambda: all(
                    s.state_machine.applied_offset == leader.state_machine.applied_offset
                    for s in cluster.servers.values()
                )
            )
            from server.controller import kv_of

            for server in cluster.servers.values():
                store = kv_of(server)
                assert store.get("big") is None and store.get("k50") is None

    run(go())


# -- configuration --------------------------------------------------------------------------


def test_the_limits_are_settings_checked_against_the_fetch_sizes(tmp_path: Path) -> None:
    base = [
        ("node_id", "1", "flag"),
        ("cluster_id", CLUSTER_ID, "flag"),
        ("data_dir", str(tmp_path), "flag"),
        ("voters", "1@127.0.0.1:9091", "flag"),
    ]
    limits = [
        ("node.max_message_bytes", "33554432", "flag"),
        ("node.max_request_items", "500", "flag"),
        ("node.max_calls_per_caller", "20", "flag"),
        ("node.max_streams_per_connection", "10", "flag"),
    ]
    options = controller_config(load_settings(None, {}, base + limits)).options
    assert (
        options.max_message_bytes,
        options.max_request_items,
        options.max_calls_per_caller,
        options.max_streams_per_connection,
    ) == (32 * 1024 * 1024, 500, 20, 10)
    small = [("node.max_message_bytes", "1048576", "flag")]
    with pytest.raises(ConfigError) as err:
        controller_config(load_settings(None, {}, base + small))
    message = str(err.value)
    assert "max_message_bytes (1048576)" in message and "fetch_max_bytes" in message, message
    with pytest.raises(ConfigError) as err:
        controller_config(load_settings(None, {}, [*base, ("node.max_calls_per_caller", "0", "f")]))
    assert "max_calls_per_caller must be at least 1" in str(err.value)


OPTIONS_TLS = replace(FAST, max_calls_per_caller=3)


def test_a_nodes_limit_on_calls_in_flight_applies_per_certificate(tmp_path: Path) -> None:
    """On a running TLS node: a broker's long-polling fetches (an observer's,
    held by the leader until there is news) use up its share; its next call
    is refused naming it, while the voters' own calls go on."""
    options = replace(
        OPTIONS_TLS,
        quorum=replace(
            OPTIONS_TLS.quorum,
            election_timeout_ms=1000,
            fetch_timeout_ms=4000,
            fetch_max_wait_ms=1500,
        ),
    )

    async def go() -> None:
        async with running(tmp_path, options=options, tls=True) as cluster:
            leader = await cluster.wait_leader()
            core = leader.node.core
            # A quiet quorum: everything committed and applied everywhere,
            # so the leader has no news to end a long poll with.
            await cluster.wait_for(
                lambda: (
                    core.high_watermark == core.log.end_offset
                    and all(
                        s.state_machine.applied_offset == core.log.end_offset
                        for s in cluster.servers.values()
                    )
                )
            )
            broker = Identity.node(CLUSTER_ID, Role.BROKER, 7)
            credentials = cluster.tls_files(broker).channel_credentials()
            status = leader.node.status()
            log = leader.node.core.log

            def fetch(request_id: int) -> raft_pb2.FetchRequest:
                return raft_pb2.FetchRequest(
                    cluster_id=CLUSTER_ID,
                    src=7,
                    dst=leader.config.node_id,
                    epoch=status.epoch,
                    fetch_offset=log.end_offset,
                    last_fetched_epoch=log.last_epoch,
                    max_wait_ms=1500,
                    max_bytes=4096,
                    request_id=request_id,
                )

            async with dial(leader.config.address, credentials) as channel:
                stub = raft_pb2_grpc.RaftServiceStub(channel)
                # The first fetch of a new observer is answered at once (it
                # has not seen the high watermark); the next ones are held.
                await stub.Fetch(fetch(0), timeout=RPC_TIMEOUT_S)
                held = [
                    asyncio.ensure_future(stub.Fetch(fetch(i), timeout=RPC_TIMEOUT_S))
                    for i in (1, 2, 3)
                ]
                await _until(lambda: leader.guard.in_flight(str(broker)) == 3)
                err = await _refusal(stub.Fetch(fetch(4), timeout=RPC_TIMEOUT_S))
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                details = err.details() or ""
                assert str(broker) in details and "max_calls_per_caller=3" in details, details
                await asyncio.gather(*held, return_exceptions=True)
            async with KvClient(
                list(cluster.voters.values()),
                credentials=cluster.tls_files(
                    Identity.user(CLUSTER_ID, "ops")
                ).channel_credentials(),
            ) as client:
                await client.put("still", b"serving")

    run(go())

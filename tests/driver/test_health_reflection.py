"""Standard gRPC health checking and server reflection on every node.

A generic gRPC tool (grpc_health_probe, grpcurl, a load balancer) knows
nothing of kq's protobuf modules: it must learn from the node itself whether
it serves (grpc.health.v1.Health) and what it serves (server reflection).
These tests play that tool: they never import kq's generated modules to
talk to the node, except to check the answers against them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kqproto import kv_pb2
from tests.driver.cluster_util import run, running

SERVICES = ("kq.raft.RaftService", "kq.kv.KvService", "kq.quorum.QuorumService")
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


async def _check(address: str, service: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return int(reply.status)


async def _reflect(
    address: str, requests: list[reflection_pb2.ServerReflectionRequest]
) -> list[reflection_pb2.ServerReflectionResponse]:
    """Send ``requests`` on one ServerReflectionInfo stream; the answers in order."""

    async def feed() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        for request in requests:
            yield request

    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(feed(), timeout=5)
        return [response async for response in call]


def test_health_serving_for_the_server_and_every_service(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            for address in cluster.voters.values():
                for service in ("", *SERVICES):
                    status = await _check(address, service)
                    assert status == health_pb2.HealthCheckResponse.SERVING, (address, service)
                # A service the node does not have is NOT_FOUND, per the
                # health protocol (not a silent SERVING).
                async with grpc.aio.insecure_channel(address) as channel:
                    stub = health_pb2_grpc.HealthStub(channel)
                    try:
                        await stub.Check(
                            health_pb2.HealthCheckRequest(service="kq.nope.Missing"), timeout=2
                        )
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.NOT_FOUND
                    else:
                        raise AssertionError("an unknown service must not be reported healthy")

    run(go())


def test_reflection_lists_services_and_describes_the_kv_api(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            address = leader.config.address
            listed, by_symbol, raft_file, missing = await _reflect(
                address,
                [
                    reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="kq.kv.KvService"
                    ),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="kq.raft.RaftService"
                    ),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="kq.kv.NoSuchService"
                    ),
                ],
            )
            names = {s.name for s in listed.list_services_response.service}
            assert set(SERVICES) | {HEALTH, REFLECTION} <= names, names

            # The file descriptor of KvService, decoded with descriptor_pb2 only.
            assert by_symbol.WhichOneof("message_response") == "file_descriptor_response"
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in by_symbol.file_descriptor_response.file_descriptor_proto
            ]
            kv_file = next(f for f in files if any(s.name == "KvService" for s in f.service))
            assert kv_file.package == "kq.kv"
            kv_service = next(s for s in kv_file.service if s.name == "KvService")
            methods = {m.name: (m.input_type, m.output_type) for m in kv_service.method}
            assert methods == {
                "Put": (".kq.kv.PutRequest", ".kq.kv.WriteResponse"),
                "PutMany": (".kq.kv.PutManyRequest", ".kq.kv.WriteResponse"),
                "Cas": (".kq.kv.CasRequest", ".kq.kv.WriteResponse"),
                "Delete": (".kq.kv.DeleteRequest", ".kq.kv.WriteResponse"),
                "Get": (".kq.kv.GetRequest", ".kq.kv.GetResponse"),
            }
            # Its dependency, the quorum's shared messages, comes with it.
            quorum_file = next(f for f in files if f.package == "kq.quorum")
            assert "QuorumService" in {s.name for s in quorum_file.service}
            assert "kqproto/quorum.proto" in kv_file.dependency
            # The reflected file is the one kq was built from.
            compiled = descriptor_pb2.FileDescriptorProto()
            kv_pb2.DESCRIPTOR.CopyToProto(compiled)
            assert kv_file == compiled

            raft_files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in raft_file.file_descriptor_response.file_descriptor_proto
            ]
            raft_service = next(s for f in raft_files for s in f.service if s.name == "RaftService")
            assert {m.name for m in raft_service.method} == {
                "Vote",
                "BeginQuorumEpoch",
                "EndQuorumEpoch",
                "Fetch",
                "FetchSnapshot",
                "FetchStream",
            }

            assert missing.WhichOneof("message_response") == "error_response"
            assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]

            # A generic client: build message classes from the reflected
            # descriptor and call Put and Get with no generated code.
            await _generic_put_get(address, files)

    run(go())


async def _generic_put_get(address: str, files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    pool = descriptor_pool.DescriptorPool()
    # A file goes into the pool after the files it imports.
    pending, added = list(files), set[str]()
    while pending:
        ready = [f for f in pending if set(f.dependency) <= added]
        assert ready, [f.name for f in pending]
        for f in ready:
            pool.Add(f)
            added.add(f.name)
            pending.remove(f)
    service = pool.FindServiceByName("kq.kv.KvService")

    def message(method: str, side: str) -> Any:
        m = service.methods_by_name[method]
        return message_factory.GetMessageClass(m.input_type if side == "in" else m.output_type)

    async with grpc.aio.insecure_channel(address) as channel:

        def call(method: str) -> Any:
            return channel.unary_unary(
                f"/{service.full_name}/{method}",
                request_serializer=lambda msg: msg.SerializeToString(),
                response_deserializer=message(method, "out").FromString,
            )

        put = message("Put", "in")(key="reflected", value=b"by a generic client")
        written = await call("Put")(put, timeout=5)
        ok = pool.FindEnumTypeByName("kq.kv.KvError").values_by_name["OK"].number
        assert written.error == ok, written
        get = message("Get", "in")(key="reflected", linearizable=True)
        read = await call("Get")(get, timeout=5)
        assert (read.error, read.present, read.value) == (ok, True, b"by a generic client")
        assert read.version.offset == written.position.offset


def test_health_goes_not_serving_then_the_server_is_gone_after_stop(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            node_id = max(cluster.servers)
            address = cluster.voters[node_id]
            seen: list[Any] = []
            async with grpc.aio.insecure_channel(address) as channel:
                # A health Watch stream sees every status change of "".
                watch = health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service=""), timeout=10
                )
                first = await watch.read()
                assert first.status == health_pb2.HealthCheckResponse.SERVING

                async def follow() -> None:
                    try:
                        while True:
                            reply = await watch.read()
                            if reply is grpc.aio.EOF:
                                seen.append("end of stream")
                                return
                            seen.append(reply.status)
                    except grpc.aio.AioRpcError as exc:
                        seen.append(exc.code())

                follower = asyncio.create_task(follow())
                await cluster.stop(node_id)
                await asyncio.wait_for(follower, 5)
            # stop() first enters graceful shutdown: the watcher is told
            # NOT_SERVING before the server (and with it the stream) goes.
            assert seen, "the watch stream ended without a word"
            assert seen[0] == health_pb2.HealthCheckResponse.NOT_SERVING, seen
            assert health_pb2.HealthCheckResponse.SERVING not in seen, seen
            # After stop() the server is gone: nothing answers on its address.
            for service in ("", "kq.kv.KvService"):
                try:
                    status = await _check(address, service)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                else:
                    assert status == health_pb2.HealthCheckResponse.NOT_SERVING, status
            # The others still serve.
            for other, other_address in cluster.voters.items():
                if other != node_id:
                    assert await _check(other_address, "") == health_pb2.HealthCheckResponse.SERVING

    run(go())

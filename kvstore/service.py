"""The key-value store on a node's gRPC server: ``kq.kv.KvService``.

:class:`KvPlugin` is a :class:`quorum.driver.plugin.ServerPlugin`: it adds
the service, served from the node's :class:`KvStateMachine` (a part of the
node's shared log) through the node's seams alone: writes go through
:class:`~quorum.driver.raft_client.RaftClient` (answered once committed and
applied), linearizable reads after its read barrier.

On a TLS node every call is authorized by the node's authorizer: reads
need READ and writes WRITE on the cluster resource (the store is one
keyspace of the cluster's; there is no finer resource).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from kqproto import kv_pb2, kv_pb2_grpc, quorum_pb2
from kvstore.state_machine import (
    CasResult,
    KvStateMachine,
    encode_cas,
    encode_delete,
    encode_put,
    encode_put_many,
)
from quorum.driver.plugin import (
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_WRITE_TIMEOUT_S,
    PluginHost,
    authorize_call,
    call_timeout,
)
from quorum.driver.raft_client import (
    BusyError,
    IndeterminateError,
    NodeStoppedError,
    NotLeaderError,
    ReadTimeoutError,
    propose,
)

__all__ = ["KvPlugin", "KvServicer"]


class KvPlugin:
    """Implements :class:`quorum.driver.plugin.ServerPlugin`."""

    service_names: Sequence[str] = (kv_pb2.DESCRIPTOR.services_by_name["KvService"].full_name,)

    def __init__(self, host: PluginHost, state_machine: KvStateMachine) -> None:
        self.state_machine = state_machine
        self._servicer = KvServicer(host, state_machine)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        kv_pb2_grpc.add_KvServiceServicer_to_server(self._servicer, server)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class KvServicer(kv_pb2_grpc.KvServiceServicer):
    def __init__(self, host: PluginHost, state_machine: KvStateMachine) -> None:
        self.host = host
        self.sm = state_machine

    async def _write(self, records: list[bytes], context: Any) -> kv_pb2.WriteResponse:
        try:
            outcome = await propose(
                self.host.raft, records, call_timeout(context, DEFAULT_WRITE_TIMEOUT_S)
            )
        except NotLeaderError as exc:
            return kv_pb2.WriteResponse(
                error=kv_pb2.NOT_LEADER, message=str(exc), leader=self.host.leader_hint()
            )
        except IndeterminateError as exc:
            return kv_pb2.WriteResponse(
                error=kv_pb2.INDETERMINATE, message=str(exc), leader=self.host.leader_hint()
            )
        except BusyError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            raise  # unreachable: abort raises
        except ValueError as exc:  # larger than one batch may be
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises
        except NodeStoppedError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # unreachable: abort raises
        position = quorum_pb2.LogPosition(offset=outcome.offset, epoch=outcome.epoch)
        for result in outcome.results:
            if isinstance(result, CasResult) and not result.ok:
                return kv_pb2.WriteResponse(
                    error=kv_pb2.PRECONDITION_FAILED,
                    message="the current value differs from the expected one",
                    position=position,
                    current=result.current or b"",
                    current_present=result.current is not None,
                )
        return kv_pb2.WriteResponse(error=kv_pb2.OK, position=position)

    async def _encode(self, context: Any, make: Any, *args: Any) -> bytes:
        """The record ``make(*args)`` encodes; INVALID_ARGUMENT naming the
        problem if the arguments are not valid."""
        try:
            return bytes(make(*args))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    async def Put(self, request: kv_pb2.PutRequest, context: Any) -> kv_pb2.WriteResponse:
        await authorize_call(self.host, context, "Put", "WRITE")
        record = await self._encode(context, encode_put, request.key, request.value)
        return await self._write([record], context)

    async def PutMany(self, request: kv_pb2.PutManyRequest, context: Any) -> kv_pb2.WriteResponse:
        await authorize_call(self.host, context, "PutMany", "WRITE")
        if not request.puts:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "PutMany needs at least one put")
        limit = self.host.raft.max_batch_records
        if len(request.puts) > limit:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"PutMany holds {len(request.puts)} puts; at most {limit} fit in one batch",
            )
        items = [(put.key, put.value) for put in request.puts]
        record = await self._encode(context, encode_put_many, items)
        return await self._write([record], context)

    async def Cas(self, request: kv_pb2.CasRequest, context: Any) -> kv_pb2.WriteResponse:
        await authorize_call(self.host, context, "Cas", "WRITE")
        expected = None if request.expect_absent else request.expected
        record = await self._encode(context, encode_cas, request.key, expected, request.value)
        if request.expect_absent and request.expected:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a compare-and-set expects either a value or expect_absent, not both",
            )
        return await self._write([record], context)

    async def Delete(self, request: kv_pb2.DeleteRequest, context: Any) -> kv_pb2.WriteResponse:
        await authorize_call(self.host, context, "Delete", "WRITE")
        record = await self._encode(context, encode_delete, request.key)
        return await self._write([record], context)

    async def Get(self, request: kv_pb2.GetRequest, context: Any) -> kv_pb2.GetResponse:
        await authorize_call(self.host, context, "Get", "READ")
        if not request.key:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a key must be non-empty")
        if request.linearizable:
            try:
                await self.host.raft.read_barrier(call_timeout(context, DEFAULT_READ_TIMEOUT_S))
            except NotLeaderError as exc:
                return kv_pb2.GetResponse(
                    error=kv_pb2.NOT_LEADER, message=str(exc), leader=self.host.leader_hint()
                )
            except (ReadTimeoutError, NodeStoppedError) as exc:
                return kv_pb2.GetResponse(
                    error=kv_pb2.TIMEOUT, message=str(exc), leader=self.host.leader_hint()
                )
        sm = self.sm
        found = sm.get(request.key)
        response = kv_pb2.GetResponse(
            error=kv_pb2.OK, leader=self.host.leader_hint(), applied_offset=sm.applied_offset
        )
        if found is not None:
            response.present = True
            response.value = found.value
            response.version.offset = found.offset
            response.version.epoch = found.epoch
        return response

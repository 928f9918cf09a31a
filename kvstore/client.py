"""The client of the replicated key-value store (``kq.kv.KvService``).

The safety rules are :class:`quorum.driver.client.LeaderFollowingClient`'s:
writes are never retried once they may have reached a node (an unknown
outcome is :class:`IndeterminateWriteError`), reads are retried until the
deadline.  Positions are :class:`quorum.types.OffsetAndEpoch`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kqproto import kv_pb2, kv_pb2_grpc
from quorum.driver.client import (
    ClientError,
    IndeterminateWriteError,
    LeaderFollowingClient,
    NoLeaderError,
    ReadDeadlineError,
    ServerBusyError,
)
from quorum.types import OffsetAndEpoch

__all__ = ["CasOutcome", "KvClient", "ReadResult"]


@dataclass(frozen=True, slots=True)
class CasOutcome:
    ok: bool
    position: OffsetAndEpoch
    # For a failed compare-and-set: the value found (None if absent).
    current: bytes | None = None


@dataclass(frozen=True, slots=True)
class ReadResult:
    present: bool
    value: bytes | None
    version: OffsetAndEpoch | None
    applied_offset: int
    node_address: str


class KvClient(LeaderFollowingClient):
    def _kv(self, address: str) -> kv_pb2_grpc.KvServiceAsyncStub:
        return kv_pb2_grpc.KvServiceStub(self._channel(address))

    # -- writes ------------------------------------------------------------

    async def _write(
        self, call: str, request: Any, timeout_s: float | None
    ) -> kv_pb2.WriteResponse:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            if time.monotonic() >= deadline:
                raise NoLeaderError("no leader accepted the write before the deadline")
            address = self._candidate()
            if not await self._ready(address, deadline):
                # Not connected: nothing was sent, another node may lead.
                self._forget(address)
                continue
            try:
                response: kv_pb2.WriteResponse = await getattr(self._kv(address), call)(
                    request, timeout=max(0.001, deadline - time.monotonic())
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # refused before appending
                    raise ServerBusyError(exc.details() or exc.code().name) from None
                if exc.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.PERMISSION_DENIED,  # no ACL: refused before appending
                ):
                    raise ClientError(exc.details() or exc.code().name) from None
                self._leader = None
                raise IndeterminateWriteError(
                    f"{call} to {address} failed after it was sent ({exc.code().name}); "
                    "it may or may not have committed",
                    timed_out=exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED,
                ) from None
            if response.error == kv_pb2.NOT_LEADER:
                self._follow(response.leader, address)
                if self._leader is None:
                    await asyncio.sleep(0.02)  # an election is under way
                continue
            if response.error == kv_pb2.INDETERMINATE:
                self._leader = None
                raise IndeterminateWriteError(response.message)
            if response.error == kv_pb2.INVALID_REQUEST:
                raise ClientError(response.message)
            self._leader = address
            return response

    async def put(self, key: str, value: bytes, timeout_s: float | None = None) -> OffsetAndEpoch:
        r = await self._write("Put", kv_pb2.PutRequest(key=key, value=value), timeout_s)
        return OffsetAndEpoch(epoch=r.position.epoch, offset=r.position.offset)

    async def put_many(
        self, items: Sequence[tuple[str, bytes]], timeout_s: float | None = None
    ) -> OffsetAndEpoch:
        request = kv_pb2.PutManyRequest(puts=[kv_pb2.PutRequest(key=k, value=v) for k, v in items])
        r = await self._write("PutMany", request, timeout_s)
        return OffsetAndEpoch(epoch=r.position.epoch, offset=r.position.offset)

    async def cas(
        self, key: str, expected: bytes | None, value: bytes, timeout_s: float | None = None
    ) -> CasOutcome:
        request = kv_pb2.CasRequest(
            key=key, expected=expected or b"", expect_absent=expected is None, value=value
        )
        r = await self._write("Cas", request, timeout_s)
        position = OffsetAndEpoch(epoch=r.position.epoch, offset=r.position.offset)
        if r.error == kv_pb2.PRECONDITION_FAILED:
            return CasOutcome(False, position, r.current if r.current_present else None)
        return CasOutcome(True, position)

    async def delete(self, key: str, timeout_s: float | None = None) -> OffsetAndEpoch:
        r = await self._write("Delete", kv_pb2.DeleteRequest(key=key), timeout_s)
        return OffsetAndEpoch(epoch=r.position.epoch, offset=r.position.offset)

    # -- reads -------------------------------------------------------------

    async def get(
        self, key: str, linearizable: bool = True, timeout_s: float | None = None
    ) -> ReadResult:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        last = "no node answered"
        while time.monotonic() < deadline:
            address = self._candidate()
            try:
                r: kv_pb2.GetResponse = await self._kv(address).Get(
                    kv_pb2.GetRequest(key=key, linearizable=linearizable),
                    timeout=max(0.001, min(1.0, deadline - time.monotonic())),
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ClientError(exc.details() or "invalid request") from None
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise ClientError(exc.details() or "permission denied") from None
                last = f"{address}: {exc.code().name}"
                self._leader = None
                continue
            if r.error == kv_pb2.NOT_LEADER and linearizable:
                self._follow(r.leader, address)
                last = f"{address} is not the leader"
                if self._leader is None:
                    await asyncio.sleep(0.02)
                continue
            if r.error != kv_pb2.OK:
                last = f"{address}: {r.message}"
                self._leader = None
                await asyncio.sleep(0.02)
                continue
            if linearizable:
                self._leader = address
            version = (
                OffsetAndEpoch(epoch=r.version.epoch, offset=r.version.offset)
                if r.present
                else None
            )
            return ReadResult(
                r.present, r.value if r.present else None, version, r.applied_offset, address
            )
        raise ReadDeadlineError(f"read of {key!r} did not complete before the deadline ({last})")

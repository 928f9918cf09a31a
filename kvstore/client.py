"""The client of the replicated key-value store (``kq.kv.KvService``).

The safety rules are :class:`quorum.driver.client.LeaderFollowingClient`'s:
writes are never retried once they may have reached a node (an unknown
outcome is :class:`IndeterminateWriteError`), reads are retried until the
deadline.  Positions are :class:`quorum.types.OffsetAndEpoch`.

Puts are batched and pipelined as a Kafka producer's records are: a put
goes out at once while fewer than ``max_requests_in_flight`` write requests
are in flight; past that, puts wait and leave together, as one PutMany
(one log record, so they commit together and share a position), when a
request in flight completes.  A lone writer's put is a plain Put with no
wait; concurrent writers from one process share requests.  A PutMany
refused before it was appended (an invalid key, no permission) is sent
again put by put, so one bad put fails only itself.  :meth:`KvClient.put_nowait`
is the streaming form: it queues a put and returns a future of its
position, for a caller that keeps many writes in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kqproto import kv_pb2, kv_pb2_grpc, quorum_pb2
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


# Puts in one PutMany at most (a PutMany must fit one batch of the node's,
# 10,000 records and 4 MiB by default), and their bytes.
MAX_PUTS_PER_REQUEST = 1000
MAX_BYTES_PER_REQUEST = 1024 * 1024
# Write requests in flight before puts wait to share the next one (Kafka's
# max.in.flight.requests.per.connection is 5).
MAX_REQUESTS_IN_FLIGHT = 4


def _position(position: quorum_pb2.LogPosition) -> OffsetAndEpoch:
    """A write's log position as the node answered it."""
    return OffsetAndEpoch(epoch=position.epoch, offset=position.offset)


@dataclass(slots=True)
class _QueuedPut:
    key: str
    value: bytes
    future: asyncio.Future[OffsetAndEpoch]
    deadline: float


class KvClient(LeaderFollowingClient):
    def __init__(
        self,
        bootstrap: Sequence[str],
        timeout_s: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        *,
        max_requests_in_flight: int = MAX_REQUESTS_IN_FLIGHT,
        max_puts_per_request: int = MAX_PUTS_PER_REQUEST,
    ) -> None:
        super().__init__(bootstrap, timeout_s, credentials)
        if max_requests_in_flight < 1:
            raise ValueError(
                f"max_requests_in_flight must be at least 1, got {max_requests_in_flight}"
            )
        if max_puts_per_request < 1:
            raise ValueError(f"max_puts_per_request must be at least 1, got {max_puts_per_request}")
        self.max_requests_in_flight = max_requests_in_flight
        self.max_puts_per_request = max_puts_per_request
        # Taken from the front as requests leave (a list's pop(0) made a
        # long stream of queued puts quadratic).
        self._queued: deque[_QueuedPut] = deque()
        self._writes_in_flight = 0
        self._senders: set[asyncio.Task[None]] = set()
        # Requests sent for puts, and puts sent: their ratio is the batching.
        self.put_requests = 0
        self.puts_sent = 0

    def _kv(self, address: str) -> kv_pb2_grpc.KvServiceAsyncStub:
        return kv_pb2_grpc.KvServiceStub(self._channel(address))

    async def close(self) -> None:
        for task in list(self._senders):
            task.cancel()
        for queued in self._queued:
            if not queued.future.done():
                queued.future.set_exception(ClientError("the client was closed"))
        self._queued.clear()
        await super().close()

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
        """Write ``key``; its position in the log.  Shares a request with
        the puts of other coroutines when enough writes are in flight."""
        if not self._queued and self._writes_in_flight < self.max_requests_in_flight:
            # Room for one more request: this put goes now, as itself.
            self._writes_in_flight += 1
            self.put_requests += 1
            self.puts_sent += 1
            try:
                r = await self._write("Put", kv_pb2.PutRequest(key=key, value=value), timeout_s)
            finally:
                self._writes_in_flight -= 1
                self._maybe_send_queued()
            return _position(r.position)
        return await self.put_nowait(key, value, timeout_s)

    def put_nowait(
        self, key: str, value: bytes, timeout_s: float | None = None
    ) -> asyncio.Future[OffsetAndEpoch]:
        """Queue a put and return at once a future of its position (the
        streaming write API: keep many puts in flight, await them later).
        Puts queued together leave together, in queue order, at most
        ``max_requests_in_flight`` requests at a time; the future fails as
        :meth:`put` would."""
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise TypeError(
                f"a put takes a str key and a bytes value, got {type(key).__name__} and "
                f"{type(value).__name__}"
            )
        future: asyncio.Future[OffsetAndEpoch] = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        self._queued.append(_QueuedPut(key, value, future, deadline))
        self._maybe_send_queued()
        return future

    async def flush(self) -> None:
        """Wait until every put queued so far has its outcome (errors stay
        with the puts' futures)."""
        pending = [q.future for q in self._queued]
        while self._senders or pending:
            await asyncio.gather(*pending, *self._senders, return_exceptions=True)
            pending = []

    def _maybe_send_queued(self) -> None:
        while self._queued and self._writes_in_flight < self.max_requests_in_flight:
            batch: list[_QueuedPut] = []
            size = 0
            while self._queued and len(batch) < self.max_puts_per_request:
                queued = self._queued[0]
                if batch and size + len(queued.value) + len(queued.key) > MAX_BYTES_PER_REQUEST:
                    break
                self._queued.popleft()
                if queued.future.done():  # cancelled by its caller
                    continue
                batch.append(queued)
                size += len(queued.value) + len(queued.key)
            if not batch:
                continue
            self._writes_in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send_batch(batch))
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def _send_batch(self, batch: list[_QueuedPut]) -> None:
        self.put_requests += 1
        self.puts_sent += len(batch)
        try:
            timeout = max(0.001, min(q.deadline for q in batch) - time.monotonic())
            if len(batch) == 1:
                request: Any = kv_pb2.PutRequest(key=batch[0].key, value=batch[0].value)
                call = "Put"
            else:
                request = kv_pb2.PutManyRequest(
                    puts=[kv_pb2.PutRequest(key=q.key, value=q.value) for q in batch]
                )
                call = "PutMany"
            try:
                r = await self._write(call, request, timeout)
            except ClientError as exc:
                if len(batch) == 1 or type(exc) is not ClientError:
                    raise
                # Refused before it was appended (an invalid put, no
                # permission): nothing was written, so each put goes alone
                # and only the bad ones fail.
                await asyncio.gather(*(self._send_alone(q) for q in batch))
                return
            position = _position(r.position)
            for q in batch:
                if not q.future.done():
                    q.future.set_result(position)
        except BaseException as exc:
            for q in batch:
                if not q.future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        q.future.cancel()
                    else:
                        q.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._writes_in_flight -= 1
            self._maybe_send_queued()

    async def _send_alone(self, q: _QueuedPut) -> None:
        try:
            r = await self._write(
                "Put",
                kv_pb2.PutRequest(key=q.key, value=q.value),
                max(0.001, q.deadline - time.monotonic()),
            )
        except Exception as exc:
            if not q.future.done():
                q.future.set_exception(exc)
            return
        if not q.future.done():
            q.future.set_result(_position(r.position))

    async def put_many(
        self, items: Sequence[tuple[str, bytes]], timeout_s: float | None = None
    ) -> OffsetAndEpoch:
        request = kv_pb2.PutManyRequest(puts=[kv_pb2.PutRequest(key=k, value=v) for k, v in items])
        r = await self._write("PutMany", request, timeout_s)
        return _position(r.position)

    async def cas(
        self, key: str, expected: bytes | None, value: bytes, timeout_s: float | None = None
    ) -> CasOutcome:
        request = kv_pb2.CasRequest(
            key=key, expected=expected or b"", expect_absent=expected is None, value=value
        )
        r = await self._write("Cas", request, timeout_s)
        position = _position(r.position)
        if r.error == kv_pb2.PRECONDITION_FAILED:
            return CasOutcome(False, position, r.current if r.current_present else None)
        return CasOutcome(True, position)

    async def delete(self, key: str, timeout_s: float | None = None) -> OffsetAndEpoch:
        r = await self._write("Delete", kv_pb2.DeleteRequest(key=key), timeout_s)
        return _position(r.position)

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
            version = _position(r.version) if r.present else None
            return ReadResult(
                r.present, r.value if r.present else None, version, r.applied_offset, address
            )
        raise ReadDeadlineError(f"read of {key!r} did not complete before the deadline ({last})")

"""The Python client of a kq quorum: finds the leader, follows redirects.

A client starts from any bootstrap addresses.  A node that is not the leader
answers NOT_LEADER with the leader's address, which the client follows; an
address that does not answer is skipped for the next.  Every call has a
deadline.

Writes are never retried once they may have reached a node: a NOT_LEADER
answer is a definite refusal (nothing was appended), so following it is
safe; but if a write's RPC fails after it was sent (the node died, the
deadline passed, the leader changed before the outcome was known), the write
may or may not have committed, and the client raises
:class:`IndeterminateWriteError`, never a plain failure.  Reads have no side
effects and are retried until the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import grpc

from kqproto import kv_pb2, kv_pb2_grpc, quorum_pb2, quorum_pb2_grpc

__all__ = [
    "ServerBusyError",
    "CasOutcome",
    "ChannelPool",
    "LeaderFollowingClient",
    "ClientError",
    "IndeterminateWriteError",
    "KvClient",
    "NoLeaderError",
    "ReadDeadlineError",
    "ReadResult",
    "describe",
]


class ClientError(Exception):
    """A definite failure: the request had no effect."""


class NoLeaderError(ClientError):
    """No leader could be found before the deadline."""


class ServerBusyError(ClientError):
    """The leader refused the request for load before appending it."""


class ReadDeadlineError(ClientError):
    """No node answered the read before the deadline (a read has no effect)."""


class IndeterminateWriteError(Exception):
    """The write may or may not have committed.

    ``timed_out``: the client stopped waiting (the deadline passed after the
    request was sent); otherwise the server said it could not tell (it lost
    leadership before it learned the outcome) or the connection broke."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Position:
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class CasOutcome:
    ok: bool
    position: Position
    # For a failed compare-and-set: the value found (None if absent).
    current: bytes | None = None


@dataclass(frozen=True, slots=True)
class ReadResult:
    present: bool
    value: bytes | None
    version: Position | None
    applied_offset: int
    node_address: str


class ChannelPool:
    """One gRPC channel per address, with the reconnect back-off a client
    wants (a node that restarts is found again within half a second)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.initial_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 500),
                    # Metadata answers (a cluster's topics) may be large.
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ],
            )
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


class LeaderFollowingClient:
    """What the kv and metadata clients share: bootstrap addresses tried in
    turn, one channel per address, and the leader's address as last learned
    from a refusal's hint."""

    def __init__(self, bootstrap: Sequence[str], timeout_s: float = 5.0) -> None:
        if not bootstrap:
            raise ValueError("a client needs at least one bootstrap address")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.bootstrap = list(dict.fromkeys(bootstrap))
        self.timeout_s = timeout_s
        self._channels = ChannelPool()
        self._leader: str | None = None
        self._next = 0

    async def close(self) -> None:
        await self._channels.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def _next_bootstrap(self) -> str:
        address = self.bootstrap[self._next % len(self.bootstrap)]
        self._next += 1
        return address

    def _candidate(self) -> str:
        """The leader if known, else the next bootstrap address."""
        return self._leader if self._leader is not None else self._next_bootstrap()

    async def _ready(self, address: str, deadline: float) -> bool:
        """Whether a connection to ``address`` is up (nothing is sent).

        Gives up at once when the connection is refused (the channel reports
        TRANSIENT_FAILURE), so a dead node costs no waiting."""
        channel = self._channel(address)
        limit = min(deadline, time.monotonic() + 0.5)
        state = channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                return False
            budget = limit - time.monotonic()
            if budget <= 0:
                return False
            try:
                await asyncio.wait_for(channel.wait_for_state_change(state), budget)
            except TimeoutError:
                return False
            state = channel.get_state(try_to_connect=True)
        return True

    @property
    def leader_address(self) -> str | None:
        """The node taken for the leader: the last one that accepted a
        leader-only request, or one a refusal pointed to."""
        return self._leader

    def _forget(self, address: str) -> None:
        """Stop taking ``address`` for the leader (if it was)."""
        if self._leader == address:
            self._leader = None

    def _follow(self, hint: quorum_pb2.LeaderHint, refused_by: str) -> None:
        """Go where a refusal's leader hint points (not back to the refuser)."""
        if hint.leader_address and hint.leader_address != refused_by:
            self._leader = hint.leader_address
        else:
            self._leader = None


class KvClient(LeaderFollowingClient):
    def _kv(self, address: str) -> kv_pb2_grpc.KvServiceAsyncStub:
        return kv_pb2_grpc.KvServiceStub(self._channel(address))

    def quorum_stub(self, address: str) -> quorum_pb2_grpc.QuorumServiceAsyncStub:
        return quorum_pb2_grpc.QuorumServiceStub(self._channel(address))

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

    async def put(self, key: str, value: bytes, timeout_s: float | None = None) -> Position:
        r = await self._write("Put", kv_pb2.PutRequest(key=key, value=value), timeout_s)
        return Position(r.position.offset, r.position.epoch)

    async def put_many(
        self, items: Sequence[tuple[str, bytes]], timeout_s: float | None = None
    ) -> Position:
        request = kv_pb2.PutManyRequest(puts=[kv_pb2.PutRequest(key=k, value=v) for k, v in items])
        r = await self._write("PutMany", request, timeout_s)
        return Position(r.position.offset, r.position.epoch)

    async def cas(
        self, key: str, expected: bytes | None, value: bytes, timeout_s: float | None = None
    ) -> CasOutcome:
        request = kv_pb2.CasRequest(
            key=key, expected=expected or b"", expect_absent=expected is None, value=value
        )
        r = await self._write("Cas", request, timeout_s)
        position = Position(r.position.offset, r.position.epoch)
        if r.error == kv_pb2.PRECONDITION_FAILED:
            return CasOutcome(False, position, r.current if r.current_present else None)
        return CasOutcome(True, position)

    async def delete(self, key: str, timeout_s: float | None = None) -> Position:
        r = await self._write("Delete", kv_pb2.DeleteRequest(key=key), timeout_s)
        return Position(r.position.offset, r.position.epoch)

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
            version = Position(r.version.offset, r.version.epoch) if r.present else None
            return ReadResult(
                r.present, r.value if r.present else None, version, r.applied_offset, address
            )
        raise ReadDeadlineError(f"read of {key!r} did not complete before the deadline ({last})")


async def describe(address: str, timeout_s: float) -> quorum_pb2.DescribeQuorumResponse | None:
    """DescribeQuorum of the node at ``address``; None if it does not answer."""
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = quorum_pb2_grpc.QuorumServiceStub(channel)
            response: quorum_pb2.DescribeQuorumResponse = await stub.DescribeQuorum(
                quorum_pb2.DescribeQuorumRequest(), timeout=timeout_s
            )
            return response
    except grpc.aio.AioRpcError:
        return None

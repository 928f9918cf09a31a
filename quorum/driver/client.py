"""Clients of a kq quorum: find the leader, follow redirects.

:class:`LeaderFollowingClient` is what the clients of the node's plug-ins
(the key-value store's :class:`kvstore.client.KvClient`, the metadata
services' :class:`metadata.client.MetadataClient`) are made of.

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
from typing import Any, Self

import grpc

from kqproto import quorum_pb2, quorum_pb2_grpc
from quorum.driver.tls import dial

__all__ = [
    "ChannelPool",
    "ClientError",
    "IndeterminateWriteError",
    "LeaderFollowingClient",
    "NoLeaderError",
    "ReadDeadlineError",
    "RefusedError",
    "ServerBusyError",
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


class RefusedError(ClientError):
    """The node answered, and refused the caller: PERMISSION_DENIED (its
    certificate lacks the ACL) or UNAUTHENTICATED.  Its message is the
    node's, which names the principal, the operation and the resource."""


class IndeterminateWriteError(Exception):
    """The write may or may not have committed.

    ``timed_out``: the client stopped waiting (the deadline passed after the
    request was sent); otherwise the server said it could not tell (it lost
    leadership before it learned the outcome) or the connection broke."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


_POOL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
    # Metadata answers (a cluster's topics) may be large.
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)


class ChannelPool:
    """One gRPC channel per address, with the reconnect back-off a client
    wants (a node that restarts is found again within half a second).

    ``options``: more channel options for every channel, after the pool's
    own.  A node's process passes its
    ``node.dscp`` mark here (``("grpc.dscp", n)``) so that its calls to
    other nodes are cut by the chaos harness's partitions like its Raft
    and replica traffic (chaos.netfilter); a client of the cluster passes
    none."""

    def __init__(
        self,
        credentials: grpc.ChannelCredentials | None = None,
        *,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Mutual TLS (quorum.driver.tls.TlsFiles.channel_credentials); None:
        # plaintext.
        self._credentials = credentials
        self.options: tuple[tuple[str, Any], ...] = _POOL_OPTIONS + tuple(options)

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = dial(address, self._credentials, self.options)
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


class LeaderFollowingClient:
    """What the kv and metadata clients share: bootstrap addresses tried in
    turn, one channel per address, and the leader's address as last learned
    from a refusal's hint.  ``options``: more channel options
    (:class:`ChannelPool`), for a node's process to mark its calls."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        timeout_s: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        *,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if not bootstrap:
            raise ValueError("a client needs at least one bootstrap address")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.bootstrap = list(dict.fromkeys(bootstrap))
        self.timeout_s = timeout_s
        self._channels = ChannelPool(credentials, options=options)
        self._leader: str | None = None
        self._next = 0

    async def close(self) -> None:
        await self._channels.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def quorum_stub(self, address: str) -> quorum_pb2_grpc.QuorumServiceAsyncStub:
        return quorum_pb2_grpc.QuorumServiceStub(self._channel(address))

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


async def describe(
    address: str, timeout_s: float, credentials: grpc.ChannelCredentials | None = None
) -> quorum_pb2.DescribeQuorumResponse | None:
    """DescribeQuorum of the node at ``address`` (over mutual TLS with
    ``credentials``); None if it does not answer.  A node that answers with a
    refusal is not silent: RefusedError says why, so a caller without the
    ACL is told so rather than that no node answered."""
    try:
        async with dial(address, credentials) as channel:
            stub = quorum_pb2_grpc.QuorumServiceStub(channel)
            response: quorum_pb2.DescribeQuorumResponse = await stub.DescribeQuorum(
                quorum_pb2.DescribeQuorumRequest(), timeout=timeout_s
            )
            return response
    except grpc.aio.AioRpcError as exc:
        if exc.code() in _REFUSALS:
            raise RefusedError(f"{address} refused DescribeQuorum: {exc.details()}") from None
        return None


_REFUSALS = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})

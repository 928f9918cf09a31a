"""The gRPC transport between quorum nodes (grpc.aio).

Inbound: each RaftService RPC is checked (cluster id, addressee, every field
via :mod:`quorum.driver.wire`), handed to the node as a core message, and
answered with the core's response to it.  Responses are matched to the RPC
waiting for them by request id (Fetch, FetchSnapshot) or, per peer and
message kind, in arrival order (Vote, BeginQuorumEpoch, EndQuorumEpoch, which
the core answers at once).  A malformed request gets INVALID_ARGUMENT naming
the problem; a request from another cluster gets FAILED_PRECONDITION.

With TLS (:class:`~quorum.driver.tls.TlsFiles`), a request is also checked
against the caller's identity, read from its verified certificate, never
from the message: its ``src`` must be the certificate's node id, Vote,
BeginQuorumEpoch and EndQuorumEpoch come only from controllers, Fetch and
FetchSnapshot from controllers or brokers (observers); any other caller
gets PERMISSION_DENIED naming who it is and what it claimed.

Outbound: each request the core sends becomes an RPC to the peer's address;
its answer is delivered back to the core.  Lost or failed RPCs are simply
dropped: the core retries on its own timers (KIP-595's transport contract).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from kqproto import raft_pb2 as pb
from kqproto import raft_pb2_grpc as pb_grpc
from quorum.driver.identity import IdentityError, Role, peer_identity
from quorum.driver.tls import DEFAULT_MAX_MESSAGE_BYTES, TlsError, TlsFiles, dial
from quorum.driver.wire import WireError, from_pb, to_pb
from quorum.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum.types import NodeId

__all__ = ["RaftTransport"]

log = logging.getLogger("kq.transport")

_RESPONSE_KIND: dict[type, str] = {
    VoteResponse: "vote",
    BeginQuorumEpochResponse: "begin",
    EndQuorumEpochResponse: "end",
    FetchResponse: "fetch",
    FetchSnapshotResponse: "snapshot",
}
_REQUEST_KIND: dict[type, str] = {
    VoteRequest: "vote",
    BeginQuorumEpochRequest: "begin",
    EndQuorumEpochRequest: "end",
    FetchRequest: "fetch",
    FetchSnapshotRequest: "snapshot",
}
# What an observer (a broker replaying the metadata) sends; the rest only
# voters, which are controllers.
_OBSERVER_REQUESTS = (FetchRequest, FetchSnapshotRequest)
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class RaftTransport(pb_grpc.RaftServiceServicer):
    def __init__(
        self,
        node_id: NodeId,
        cluster_id: str,
        peers: Mapping[NodeId, str],
        deliver: Callable[[Message], None],
        rpc_timeout_s: float,
        unreachable: Callable[[NodeId], None] | None = None,
        dscp: int = 0,
        tls: TlsFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls_check_interval_s: float = 1.0,
    ) -> None:
        self.node_id = node_id
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._credentials = tls.channel_credentials() if tls is not None else None
        # The certificate files' stamp when the channels' credentials were
        # read, and when to look at them again (not on every call).
        self._tls_stamp = tls.stamp() if tls is not None else ()
        self._tls_check_interval_s = tls_check_interval_s
        self._next_tls_check = 0.0
        # With a DSCP value, every packet of the channels to peers carries it.
        self._channel_options = _CHANNEL_OPTIONS + ([("grpc.dscp", dscp)] if dscp else [])
        self.cluster_id = cluster_id
        self.peers = dict(peers)
        self._deliver = deliver
        self._unreachable = unreachable or (lambda node: None)
        self._timeout = rpc_timeout_s
        self._channels: dict[NodeId, grpc.aio.Channel] = {}
        # Channels replaced after a rotation, closing once their calls end.
        self._retired: list[grpc.aio.Channel] = []
        self._stubs: dict[NodeId, pb_grpc.RaftServiceAsyncStub] = {}
        # Inbound RPCs waiting for the core's answer.
        self._by_id: dict[tuple[NodeId, str, int], asyncio.Future[Message]] = {}
        self._fifo: dict[tuple[NodeId, str], deque[asyncio.Future[Message]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.failed = 0

    # -- outbound ------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """Called by the node for every message the core emits."""
        kind = _RESPONSE_KIND.get(type(msg))
        if kind is not None:
            self._answer(msg, kind)
            return
        if msg.dst not in self.peers:
            log.warning("no address for node %d; dropping %s", msg.dst, type(msg).__name__)
            return
        task = asyncio.get_running_loop().create_task(self._call(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def maybe_reload_credentials(self) -> bool:
        """Take rotated certificate files for the connections to peers.

        The server picks up new files on its next handshake
        (:meth:`TlsFiles.server_credentials`); a channel keeps the
        credentials it was made with for every reconnection, so after a
        rotation the channels are made anew (the old ones close once their
        calls end) and the next call to each peer handshakes with the new
        certificate, as etcd's peer transport does on its next dial.  At most
        one look at the files per interval; a pair caught half replaced is
        left for the next look."""
        if self._tls is None:
            return False
        now = time.monotonic()
        if now < self._next_tls_check:
            return False
        self._next_tls_check = now + self._tls_check_interval_s
        stamp = self._tls.stamp()
        if not stamp or stamp == self._tls_stamp:
            return False
        try:
            credentials = self._tls.matching_channel_credentials()
        except TlsError as exc:
            log.warning("peer connections keep the current certificate: %s", exc)
            return False
        self._tls_stamp = stamp
        self._credentials = credentials
        old = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        self._retired.extend(old)
        loop = asyncio.get_running_loop()
        for channel in old:
            task = loop.create_task(self._retire(channel))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        log.info("connections to peers now present the changed certificate %s", self._tls.cert)
        return True

    async def _retire(self, channel: grpc.aio.Channel) -> None:
        await channel.close(grace=self._timeout)
        self._retired.remove(channel)

    def _stub(self, node: NodeId) -> pb_grpc.RaftServiceAsyncStub:
        self.maybe_reload_credentials()
        stub = self._stubs.get(node)
        if stub is None:
            channel = dial(
                self.peers[node], self._credentials, self._channel_options, self._max_message_bytes
            )
            self._channels[node] = channel
            stub = self._stubs[node] = pb_grpc.RaftServiceStub(channel)
        return stub

    async def _call(self, msg: Message) -> None:
        stub = self._stub(msg.dst)
        request: Any = to_pb(msg, self.cluster_id)
        timeout = self._timeout
        if isinstance(msg, FetchRequest):
            timeout += msg.max_wait_ms / 1000
        self.sent += 1
        try:
            match msg:
                case VoteRequest():
                    reply: Any = await stub.Vote(request, timeout=timeout)
                case BeginQuorumEpochRequest():
                    reply = await stub.BeginQuorumEpoch(request, timeout=timeout)
                case EndQuorumEpochRequest():
                    reply = await stub.EndQuorumEpoch(request, timeout=timeout)
                case FetchRequest():
                    reply = await stub.Fetch(request, timeout=timeout)
                case FetchSnapshotRequest():
                    reply = await stub.FetchSnapshot(request, timeout=timeout)
                case _:  # pragma: no cover
                    return
            self._deliver(from_pb(reply))
        except grpc.aio.AioRpcError as exc:
            self.failed += 1
            log.debug("%s to node %d failed: %s", type(msg).__name__, msg.dst, exc.code().name)
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                # No connection at all (refused or reset): tell the core.
                self._unreachable(msg.dst)
        except WireError as exc:
            self.failed += 1
            log.warning("malformed answer from node %d: %s", msg.dst, exc)

    # -- inbound -------------------------------------------------------------

    def _answer(self, msg: Message, kind: str) -> None:
        if isinstance(msg, FetchResponse | FetchSnapshotResponse):
            future = self._by_id.pop((msg.dst, kind, msg.request_id), None)
        else:
            queue = self._fifo.get((msg.dst, kind))
            future = queue.popleft() if queue else None
        if future is not None and not future.done():
            future.set_result(msg)

    async def _handle(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request.cluster_id != self.cluster_id:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"request for cluster {request.cluster_id!r} reached node {self.node_id} of "
                f"cluster {self.cluster_id!r}",
            )
        try:
            msg = from_pb(request)
        except WireError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if msg.dst != self.node_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request addressed to node {msg.dst} reached node {self.node_id}",
            )
        if self._tls is not None:
            refusal = self._refusal(msg, context)
            if refusal is not None:
                log.warning("node %d refused a %s: %s", self.node_id, type(msg).__name__, refusal)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        kind = _REQUEST_KIND[type(msg)]
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        if isinstance(msg, FetchRequest | FetchSnapshotRequest):
            self._by_id[(msg.src, kind, msg.request_id)] = future
        else:
            self._fifo.setdefault((msg.src, kind), deque()).append(future)
        self._deliver(msg)
        timeout = self._timeout
        if isinstance(msg, FetchRequest):
            timeout += msg.max_wait_ms / 1000
        try:
            answer = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self._forget(msg, kind, future)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer from the quorum core")
        return to_pb(answer, self.cluster_id)

    def _refusal(self, msg: Message, context: Any) -> str | None:
        """Why the caller may not send ``msg`` (None: it may)."""
        what = type(msg).__name__
        try:
            identity = peer_identity(context)
        except IdentityError as exc:
            return f"the caller's certificate names no kq identity ({exc})"
        if identity is None:
            return f"a {what} needs a certificate"
        if identity.cluster_id != self.cluster_id:
            return f"{identity} is not of cluster {self.cluster_id}"
        allowed = (
            (Role.CONTROLLER, Role.BROKER)
            if isinstance(msg, _OBSERVER_REQUESTS)
            else (Role.CONTROLLER,)
        )
        if identity.role not in allowed:
            return f"{identity} may not send a {what}"
        if identity.node_id != msg.src:
            return f"{identity} may not send a {what} as node {msg.src}"
        return None

    def _forget(self, msg: Message, kind: str, future: asyncio.Future[Message]) -> None:
        if isinstance(msg, FetchRequest | FetchSnapshotRequest):
            self._by_id.pop((msg.src, kind, msg.request_id), None)
        else:
            queue = self._fifo.get((msg.src, kind))
            if queue and future in queue:
                queue.remove(future)

    async def Vote(self, request: pb.VoteRequest, context: Any) -> pb.VoteResponse:
        result: pb.VoteResponse = await self._handle(request, context)
        return result

    async def BeginQuorumEpoch(
        self, request: pb.BeginQuorumEpochRequest, context: Any
    ) -> pb.BeginQuorumEpochResponse:
        result: pb.BeginQuorumEpochResponse = await self._handle(request, context)
        return result

    async def EndQuorumEpoch(
        self, request: pb.EndQuorumEpochRequest, context: Any
    ) -> pb.EndQuorumEpochResponse:
        result: pb.EndQuorumEpochResponse = await self._handle(request, context)
        return result

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        result: pb.FetchResponse = await self._handle(request, context)
        return result

    async def FetchSnapshot(
        self, request: pb.FetchSnapshotRequest, context: Any
    ) -> pb.FetchSnapshotResponse:
        result: pb.FetchSnapshotResponse = await self._handle(request, context)
        return result

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for channel in [*self._channels.values(), *self._retired]:
            await channel.close()
        self._channels.clear()
        self._retired.clear()
        self._stubs.clear()

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

Fetches travel on one replication stream per peer (``FetchStream``, a
long-lived bidirectional call carrying the same FetchRequest and
FetchResponse messages), so a fetch costs two messages on an open call
instead of a call set up and torn down.  A stream that fails is dropped (a
connection error is reported to the core as for a failed unary fetch) and
opened again after a backoff, the fetches meanwhile going as unary Fetch
calls; a stream whose fetch goes unanswered past the unary call's deadline,
with nothing else heard on it since that fetch left, is dropped the same
way (a silent peer gives no connection error).  A peer that does not serve
the stream gets unary fetches.  On the serving side each request on a
stream is checked as a unary Fetch is (the caller's identity read once per
stream from its certificate), and a refusal ends the stream with the unary
call's status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from kqproto import raft_pb2 as pb
from kqproto import raft_pb2_grpc as pb_grpc
from quorum.driver.identity import Identity, IdentityError, Role, peer_identity
from quorum.driver.rpc_guard import Malformed, RateLimitedLog, peer_host
from quorum.driver.switches import env_switch
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

__all__ = ["RaftTransport", "streaming_enabled"]

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
# Keepalive: an HTTP/2 ping every KEEPALIVE_MS while a call is open (the
# replication stream always is), and a connection whose ping is not
# answered within KEEPALIVE_TIMEOUT_MS is closed, failing its calls
# UNAVAILABLE: a peer cut off without a connection error is then reported
# to the core as unreachable as a refused one is (etcd's ReportUnreachable),
# well before the fetch timeout.  Pre-vote keeps a false alarm (a ping
# answered late on a loaded machine) from disturbing a live leader: the
# other voters still hear from it and refuse the pre-vote.  The servers
# accept pings this often (quorum.driver.server).
KEEPALIVE_MS = 250
KEEPALIVE_TIMEOUT_MS = 500
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 500),
]
# A replication stream that broke is opened again after this backoff,
# doubled at each failure up to the most, reset by an answer.
STREAM_BACKOFF_S = 0.05
STREAM_MAX_BACKOFF_S = 1.0
# A peer that does not serve FetchStream (an older node) is asked again
# after this long; meanwhile its fetches are unary.
STREAM_UNIMPLEMENTED_RETRY_S = 60.0
# Fetches a serving stream remembers unanswered; an older one is forgotten
# (the core answers every fetch, so this bounds only a misbehaving peer).
STREAM_MAX_PENDING = 64
_STREAM_METHOD = "/kq.raft.RaftService/FetchStream"


def streaming_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether fetches go over replication streams: yes unless the
    environment sets ``KQ_FETCH_STREAM=0`` (unary fetches only, as before
    the stream existed: a way to compare the two, or to talk to a peer
    whose stream misbehaves)."""
    return env_switch("KQ_FETCH_STREAM", environ)


class _Outbound:
    """The replication stream to one peer: fetches are written to it in
    order (one writer, since a gRPC call takes one write at a time), answers
    are read and delivered in the order they come."""

    __slots__ = (
        "call",
        "last_answer",
        "node",
        "outstanding",
        "queue",
        "reader",
        "transport",
    )

    def __init__(self, transport: RaftTransport, node: NodeId) -> None:
        self.transport = transport
        self.node = node
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        # request_id -> (when sent, the timer of its deadline)
        self.outstanding: dict[int, tuple[float, asyncio.TimerHandle]] = {}
        self.last_answer = time.monotonic()
        stub = transport._stub(node)
        self.call: Any = stub.FetchStream(self._requests())
        self.reader = asyncio.get_running_loop().create_task(
            self._read(), name=f"kq-fetch-stream-{transport.node_id}-{node}"
        )

    async def _requests(self) -> Any:
        while True:
            request = await self.queue.get()
            if request is None:
                return
            yield request

    def write(self, msg: FetchRequest, request: Any, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout, self._expire, msg.request_id)
        self.outstanding[msg.request_id] = (time.monotonic(), timer)
        self.queue.put_nowait(request)

    def _expire(self, request_id: int) -> None:
        entry = self.outstanding.pop(request_id, None)
        if entry is None:
            return
        self.transport.failed += 1
        if self.last_answer <= entry[0]:
            # Nothing heard since that fetch left: the peer or the path to it
            # is gone without a connection error (a partition).
            log.debug("fetch stream to node %d silent; dropping it", self.node)
            self.transport._stream_broken(self, unavailable=False)

    async def _read(self) -> None:
        transport = self.transport
        unavailable = False
        try:
            while True:
                reply = await self.call.read()
                if reply is grpc.aio.EOF:
                    break
                entry = self.outstanding.pop(reply.request_id, None)
                if entry is not None:
                    entry[1].cancel()
                self.last_answer = time.monotonic()
                transport._stream_answered(self.node)
                try:
                    msg = from_pb(reply)
                except WireError as exc:
                    transport.failed += 1
                    log.warning("malformed answer from node %d: %s", self.node, exc)
                    continue
                transport._deliver(msg)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            log.debug("fetch stream to node %d failed: %s", self.node, code.name)
            if code == grpc.StatusCode.UNIMPLEMENTED:
                transport._stream_unimplemented(self.node)
            unavailable = code == grpc.StatusCode.UNAVAILABLE
        except asyncio.CancelledError:
            return
        transport._stream_broken(self, unavailable=unavailable)

    def close(self) -> int:
        """Stop the stream; returns the fetches it leaves unanswered."""
        for _, timer in self.outstanding.values():
            timer.cancel()
        lost = len(self.outstanding)
        self.outstanding.clear()
        self.queue.put_nowait(None)
        self.call.cancel()
        if self.reader is not asyncio.current_task():
            self.reader.cancel()
        return lost


class _Inbound:
    """A replication stream served to one peer: answers waiting to be
    written, and the fetches it sent that are not answered yet."""

    __slots__ = ("answers", "pending")

    def __init__(self) -> None:
        self.answers: asyncio.Queue[Any] = asyncio.Queue()
        self.pending: dict[tuple[NodeId, int], None] = {}


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
        streaming: bool | None = None,
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
        # Fetches that came on a replication stream, waiting for the core's
        # answer: (fetcher, request id) -> the stream.
        self._streamed: dict[tuple[NodeId, int], _Inbound] = {}
        # Malformed bytes on a stream are logged as the request guard logs
        # them on a unary call: once per peer per interval.
        self._malformed_log = RateLimitedLog(logging.getLogger("kq.rpc"))
        self._tasks: set[asyncio.Task[None]] = set()
        # Replication streams to peers; when each peer's next may open, and
        # its current backoff.
        self.streaming = streaming_enabled() if streaming is None else streaming
        self._outbound: dict[NodeId, _Outbound] = {}
        self._stream_retry_at: dict[NodeId, float] = {}
        self._stream_backoff: dict[NodeId, float] = {}
        self.sent = 0
        self.failed = 0
        # Replication streams opened, and broken.
        self.streams_opened = 0
        self.streams_broken = 0

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
        if type(msg) is FetchRequest and self.streaming:
            stream = self._stream_to(msg.dst)
            if stream is not None:
                self.sent += 1
                stream.write(
                    msg,
                    to_pb(msg, self.cluster_id),
                    self._timeout + msg.max_wait_ms / 1000,
                )
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
        self._close_streams()
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

    def _stream_to(self, node: NodeId) -> _Outbound | None:
        """The open replication stream to ``node``, opened now if none is
        and none broke within the backoff (None: fetch unary meanwhile)."""
        self.maybe_reload_credentials()
        stream = self._outbound.get(node)
        if stream is not None:
            return stream
        if time.monotonic() < self._stream_retry_at.get(node, 0.0):
            return None
        stream = self._outbound[node] = _Outbound(self, node)
        self.streams_opened += 1
        return stream

    def _stream_answered(self, node: NodeId) -> None:
        if node in self._stream_backoff:
            del self._stream_backoff[node]

    def _stream_unimplemented(self, node: NodeId) -> None:
        self._stream_backoff[node] = STREAM_UNIMPLEMENTED_RETRY_S

    def _stream_broken(self, stream: _Outbound, *, unavailable: bool) -> None:
        """Drop a failed stream; the next fetches to its peer go unary until
        the backoff has passed.  A connection error is the core's to know,
        as a failed unary fetch's is."""
        if self._outbound.get(stream.node) is not stream:
            stream.close()
            return
        del self._outbound[stream.node]
        self.failed += stream.close()
        self.streams_broken += 1
        backoff = self._stream_backoff.get(stream.node, STREAM_BACKOFF_S / 2)
        backoff = max(backoff, min(backoff * 2, STREAM_MAX_BACKOFF_S))
        self._stream_backoff[stream.node] = backoff
        self._stream_retry_at[stream.node] = time.monotonic() + backoff
        if unavailable:
            self._unreachable(stream.node)

    def _close_streams(self) -> None:
        for stream in list(self._outbound.values()):
            stream.close()
        self._outbound.clear()

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
        if self._streamed and type(msg) is FetchResponse:
            inbound = self._streamed.pop((msg.dst, msg.request_id), None)
            if inbound is not None:
                inbound.pending.pop((msg.dst, msg.request_id), None)
                inbound.answers.put_nowait(to_pb(msg, self.cluster_id))
                return
        if isinstance(msg, FetchResponse | FetchSnapshotResponse):
            future = self._by_id.pop((msg.dst, kind, msg.request_id), None)
        else:
            queue = self._fifo.get((msg.dst, kind))
            future = queue.popleft() if queue else None
        if future is not None and not future.done():
            future.set_result(msg)

    def _check(
        self, request: Any, identity: Identity | str | None
    ) -> Message | tuple[grpc.StatusCode, str]:
        """The core message of a request, or the status refusing it.  Over
        TLS ``identity`` is the caller's (a string: why it has none)."""
        if request.cluster_id != self.cluster_id:
            return (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"request for cluster {request.cluster_id!r} reached node {self.node_id} of "
                f"cluster {self.cluster_id!r}",
            )
        try:
            msg = from_pb(request)
        except WireError as exc:
            return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        if msg.dst != self.node_id:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request addressed to node {msg.dst} reached node {self.node_id}",
            )
        if self._tls is not None:
            refusal = self._refusal_of(msg, identity)
            if refusal is not None:
                log.warning("node %d refused a %s: %s", self.node_id, type(msg).__name__, refusal)
                return grpc.StatusCode.PERMISSION_DENIED, refusal
        return msg

    async def _handle(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        checked = self._check(
            request, self._caller_identity(context) if self._tls is not None else None
        )
        if isinstance(checked, tuple):
            await context.abort(*checked)
        msg = checked
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

    @staticmethod
    def _caller_identity(context: Any) -> Identity | str | None:
        """The caller's identity from its verified certificate, or why its
        certificate names none."""
        try:
            return peer_identity(context)
        except IdentityError as exc:
            return f"the caller's certificate names no kq identity ({exc})"

    def _refusal_of(self, msg: Message, identity: Identity | str | None) -> str | None:
        """Why the caller of ``identity`` (a string: why it has none) may not
        send ``msg`` (None: it may)."""
        what = type(msg).__name__
        if isinstance(identity, str):
            return identity
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

    async def FetchStream(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        """Serve one peer's replication stream: its fetches are read and
        stepped as they come, the core's answers written as they are made."""
        inbound = _Inbound()
        identity = self._caller_identity(context) if self._tls is not None else None
        reader = asyncio.get_running_loop().create_task(
            self._read_fetches(request_iterator, context, inbound, identity)
        )
        try:
            while True:
                answer = await inbound.answers.get()
                if answer is None:
                    break
                if isinstance(answer, tuple):
                    await context.abort(*answer)
                await context.write(answer)
        finally:
            reader.cancel()
            for key in inbound.pending:
                self._streamed.pop(key, None)

    async def _read_fetches(
        self, requests: Any, context: Any, inbound: _Inbound, identity: Identity | str | None
    ) -> None:
        answers = inbound.answers
        try:
            async for request in requests:
                if isinstance(request, Malformed):
                    peer = peer_host(context.peer())
                    self._malformed_log.warning(
                        (peer, _STREAM_METHOD),
                        f"node {self.node_id}: malformed {_STREAM_METHOD} request from {peer}: "
                        f"{request.reason}",
                    )
                    answers.put_nowait(
                        (
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"malformed request: {request.reason}",
                        )
                    )
                    return
                checked = self._check(request, identity)
                if isinstance(checked, tuple):
                    answers.put_nowait(checked)
                    return
                key = (checked.src, request.request_id)
                self._streamed[key] = inbound
                inbound.pending[key] = None
                if len(inbound.pending) > STREAM_MAX_PENDING:
                    oldest = next(iter(inbound.pending))
                    del inbound.pending[oldest]
                    self._streamed.pop(oldest, None)
                self._deliver(checked)
        except grpc.aio.AioRpcError:
            pass
        answers.put_nowait(None)

    async def close(self) -> None:
        self._close_streams()
        for task in list(self._tasks):
            task.cancel()
        for channel in [*self._channels.values(), *self._retired]:
            await channel.close()
        self._channels.clear()
        self._retired.clear()
        self._stubs.clear()

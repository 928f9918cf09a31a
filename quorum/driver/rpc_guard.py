"""What any caller may ask of a node's gRPC server: a clear refusal, a
quiet log.

:class:`RequestGuard`, a server interceptor on every node (and so on every
plug-in's service), checks each unary call before its servicer runs:

- **Malformed bytes.**  gRPC deserializes a request before any servicer
  sees it; bytes that do not parse as the method's message make grpc answer
  ``UNKNOWN`` ("Unexpected DecodeError") and log a whole traceback at ERROR,
  per request, so a peer sending garbage floods the node's log.  The guard
  answers them ``INVALID_ARGUMENT`` naming the message that failed to parse
  and why.
- **Calls in flight per caller** (``node.max_calls_per_caller``): a caller
  is its verified certificate's identity over TLS
  (:func:`quorum.driver.identity.peer_identity`), its host in plaintext; one
  call past the limit is ``RESOURCE_EXHAUSTED`` naming the caller and the
  limit, so no single caller can hold all of a node's attention (gRPC's
  ``grpc.max_concurrent_streams`` bounds each connection as well).
- **Items per request** (``node.max_request_items``): the elements of a
  request's repeated and map fields, at any depth; past the limit the
  request is ``INVALID_ARGUMENT`` naming the count, the largest field and
  the limit.  Counting stops soon after the limit, so a huge request costs
  no more than a large one.  Each service still applies its own, tighter
  rules (a PutMany fits one batch; a metadata request writes at most
  10,000 records, Kafka's MAX_RECORDS_PER_USER_OP).

A refused call reaches no servicer: it cannot change any state.  Refusals
are logged at WARNING once per peer and kind per interval
(:class:`RateLimitedLog`), with the count of those kept quiet.  Messages
larger than ``node.max_message_bytes`` never get this far: gRPC refuses
them ``RESOURCE_EXHAUSTED`` itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from quorum.driver.identity import IdentityError, peer_identity

__all__ = [
    "DEFAULT_LOG_INTERVAL_S",
    "DEFAULT_MAX_CALLS_PER_CALLER",
    "DEFAULT_MAX_REQUEST_ITEMS",
    "ItemCount",
    "Malformed",
    "RateLimitedLog",
    "RequestGuard",
    "caller_of",
    "count_items",
    "peer_host",
]

log = logging.getLogger("kq.rpc")

DEFAULT_LOG_INTERVAL_S = 60.0
# Calls one caller may have in flight on a node.  Generous: in plaintext a
# caller is a host, and the nodes and clients of a local cluster share one.
DEFAULT_MAX_CALLS_PER_CALLER = 1000
# Items (elements of repeated and map fields) in one request: well above
# what any service accepts (10,000 records per metadata request or PutMany,
# with their replica lists), well below what makes a node spend seconds on
# one request.
DEFAULT_MAX_REQUEST_ITEMS = 100_000

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:127.0.0.1:5000`` ->
    ``127.0.0.1``; ``ipv6:[::1]:5000`` -> ``[::1]``): one client's
    connections share it, whatever their ports."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, _ = rest.rpartition(":")
        return host or rest
    return peer


class RateLimitedLog:
    """At most one line per key per ``interval_s``; the next line says how
    many were kept quiet since the last."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._clock = clock
        # key -> (when it was last logged, lines kept quiet since)
        self._seen: dict[tuple[str, ...], tuple[float, int]] = {}

    def warning(self, key: tuple[str, ...], message: str) -> bool:
        """Log ``message`` unless ``key`` was logged within the interval;
        True if it was logged."""
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._interval_s:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        quiet = last[1] if last is not None else 0
        suffix = f" ({quiet} more like it since the last report)" if quiet else ""
        self._log.warning("%s%s", message, suffix)
        self._seen[key] = (now, 0)
        if len(self._seen) > 10_000:  # many peers: forget the oldest
            oldest = min(self._seen, key=lambda k: self._seen[k][0])
            del self._seen[oldest]
        return True


@dataclass(frozen=True, slots=True)
class Malformed:
    """What the guarded deserializer returns instead of raising (the parse
    error names the message type).  A streaming servicer meets it among the
    requests it reads, and ends the stream INVALID_ARGUMENT with the reason
    (a unary one never does: the guard answers for it)."""

    reason: str


def caller_of(context: Any) -> str:
    """Who makes a call, for its share of the node: the identity of its
    verified certificate (``kq://<cluster>/<role>/<id>``) over TLS, its host
    in plaintext (or with a certificate that names no kq identity)."""
    try:
        identity = peer_identity(context)
    except IdentityError:
        identity = None
    if identity is not None:
        return str(identity)
    return peer_host(context.peer())


@dataclass(frozen=True, slots=True)
class ItemCount:
    """The items of a request's repeated and map fields, at any depth: a
    lower bound past ``limit`` (counting stops there), exact below it."""

    count: int
    # The largest repeated field seen (a dotted path) and its length.
    largest: str
    largest_count: int
    # False when counting stopped early: ``count`` is then a lower bound.
    complete: bool = True


def count_items(message: Message, limit: int) -> ItemCount:
    """Count the elements of ``message``'s repeated and map fields, and of
    the messages within it, until the count passes ``limit``.  Each field's
    length is taken whole, and a message is entered only while the count is
    within the limit, so at most about ``limit`` messages are visited."""
    total = 0
    largest, largest_count = "", 0
    skipped = False
    stack: list[tuple[str, Message]] = [("", message)]
    while stack and total <= limit:
        prefix, msg = stack.pop()
        for field, value in msg.ListFields():
            name = f"{prefix}{field.name}"
            if field.is_repeated:
                n = len(value)
                total += n
                if n > largest_count:
                    largest, largest_count = name, n
                entry = field.message_type
                if entry is None:
                    continue  # scalars
                inner = value
                if entry.GetOptions().map_entry:
                    if entry.fields_by_name["value"].type != FieldDescriptor.TYPE_MESSAGE:
                        continue
                    inner = value.values()
                if total > limit:
                    skipped = True
                else:
                    stack.extend((f"{name}[].", v) for v in inner)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                stack.append((f"{name}.", value))
    return ItemCount(total, largest, largest_count, complete=not (stack or skipped))


class RequestGuard(grpc.aio.ServerInterceptor):
    """Refuses, before any servicer runs: unparsable unary requests
    (``INVALID_ARGUMENT``), a caller's calls past ``max_calls_per_caller``
    in flight (``RESOURCE_EXHAUSTED``), requests of more than
    ``max_request_items`` items (``INVALID_ARGUMENT``).  Each refusal is
    logged at WARNING once per peer and kind per interval."""

    def __init__(
        self,
        node_id: int,
        interval_s: float = DEFAULT_LOG_INTERVAL_S,
        *,
        max_calls_per_caller: int = DEFAULT_MAX_CALLS_PER_CALLER,
        max_request_items: int = DEFAULT_MAX_REQUEST_ITEMS,
    ) -> None:
        self._node_id = node_id
        self._log = RateLimitedLog(log, interval_s)
        self._max_calls = max_calls_per_caller
        self._max_items = max_request_items
        # Calls in flight by caller (callers with none are not kept).
        self._in_flight: dict[str, int] = {}
        # The guarded handler of each unary method, made on its first call.
        self._guarded: dict[str, Any] = {}

    def in_flight(self, caller: str) -> int:
        return self._in_flight.get(caller, 0)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        method = handler_call_details.method
        cached: grpc.RpcMethodHandler[_Req, _Resp] | None = self._guarded.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer

        def guarded_parse(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as exc:  # DecodeError, or anything a parser raises
                return Malformed(str(exc) or type(exc).__name__)

        if handler.stream_stream is not None:
            # A stream's requests are parsed here too, so malformed bytes
            # reach its servicer as Malformed instead of a traceback per
            # message; the servicer checks each request itself.
            streamed: grpc.RpcMethodHandler[_Req, _Resp] = grpc.stream_stream_rpc_method_handler(
                handler.stream_stream,
                request_deserializer=guarded_parse,
                response_serializer=handler.response_serializer,
            )
            self._guarded[method] = streamed
            return streamed
        if handler.unary_unary is None:
            return handler
        # An aio servicer's behaviour is a coroutine function (the stubs
        # type grpc's synchronous handlers).
        behavior: Any = handler.unary_unary

        async def guarded(request: Any, context: Any) -> Any:
            if isinstance(request, Malformed):
                peer = peer_host(context.peer())
                self._log.warning(
                    (peer, method),
                    f"node {self._node_id}: malformed {method} request from {peer}: "
                    f"{request.reason}",
                )
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"malformed request: {request.reason}",
                )
            caller = caller_of(context)
            calls = self._in_flight.get(caller, 0)
            if calls >= self._max_calls:
                why = (
                    f"{caller} has {calls} calls in flight on node {self._node_id}, the most "
                    f"one caller may have (node.max_calls_per_caller={self._max_calls})"
                )
                self._log.warning((caller, "calls"), f"refused {method}: {why}")
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            items = count_items(request, self._max_items)
            if items.count > self._max_items:
                why = (
                    f"{request.DESCRIPTOR.full_name} carries {items.count} items"
                    f"{'' if items.complete else ' or more'} "
                    f"({items.largest}: {items.largest_count}), more than the "
                    f"{self._max_items} a request may carry (node.max_request_items)"
                )
                self._log.warning(
                    (peer_host(context.peer()), method), f"refused {method} from {caller}: {why}"
                )
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
            self._in_flight[caller] = calls + 1
            try:
                return await behavior(request, context)
            finally:
                left = self._in_flight[caller] - 1
                if left:
                    self._in_flight[caller] = left
                else:
                    del self._in_flight[caller]

        guarded_handler: grpc.RpcMethodHandler[_Req, _Resp] = grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=guarded_parse,
            response_serializer=handler.response_serializer,
        )
        self._guarded[method] = guarded_handler
        return guarded_handler

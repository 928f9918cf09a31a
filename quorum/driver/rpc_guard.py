"""Malformed requests on a node's gRPC server: a clear refusal, a quiet log.

gRPC deserializes a request before any servicer sees it; bytes that do not
parse as the method's message make grpc answer ``UNKNOWN`` ("Unexpected
DecodeError") and log a whole traceback at ERROR, per request, so a peer
sending garbage floods the node's log.  :class:`MalformedRequestGuard`, a
server interceptor on every node (and so on every plug-in's service),
answers them ``INVALID_ARGUMENT`` naming the message that failed to parse
and why, and logs one WARNING per peer and method per interval
(:class:`RateLimitedLog`), with the count of those it kept quiet.  A
malformed request reaches no servicer: it cannot change any state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

__all__ = ["DEFAULT_LOG_INTERVAL_S", "MalformedRequestGuard", "RateLimitedLog", "peer_host"]

log = logging.getLogger("kq.rpc")

DEFAULT_LOG_INTERVAL_S = 60.0

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
class _Malformed:
    """What the guarded deserializer returns instead of raising (the parse
    error names the message type)."""

    reason: str


class MalformedRequestGuard(grpc.aio.ServerInterceptor):
    """Answers unparsable unary requests ``INVALID_ARGUMENT``, logged at
    WARNING once per peer and method per interval."""

    def __init__(self, node_id: int, interval_s: float = DEFAULT_LOG_INTERVAL_S) -> None:
        self._node_id = node_id
        self._log = RateLimitedLog(log, interval_s)
        # The guarded handler of each unary method, made on its first call.
        self._guarded: dict[str, Any] = {}

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
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        # An aio servicer's behaviour is a coroutine function (the stubs
        # type grpc's synchronous handlers).
        behavior: Any = handler.unary_unary

        def guarded_parse(data: bytes) -> Any:
            try:
                return parse(data)
            except Exception as exc:  # DecodeError, or anything a parser raises
                return _Malformed(str(exc) or type(exc).__name__)

        async def guarded(request: Any, context: Any) -> Any:
            if isinstance(request, _Malformed):
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
            return await behavior(request, context)

        guarded_handler: grpc.RpcMethodHandler[_Req, _Resp] = grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=guarded_parse,
            response_serializer=handler.response_serializer,
        )
        self._guarded[method] = guarded_handler
        return guarded_handler

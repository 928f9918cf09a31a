"""The floor under kq's figures on this machine: a bare gRPC echo between
two Python processes (grpc.aio, the same library and loop as kq's nodes),
with no Raft, storage or state machine.

* stream round trip: one bidirectional stream, one small message written
  and its echo read, back to back (what one replication round costs at the
  least: kq's sequential write crosses such a hop twice, plus the client's
  unary call);
* unary round trip: one unary call per message (the client's Put).

    .venv/bin/python bench/grpc_floor.py [--messages 5000] [--json]

The server runs in a child process started and stopped here (by pid).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import latency_summary
from quorum.driver.loop import run as run_loop

SERVICE = "kq.bench.Echo"
PAYLOAD = b"x" * 100


def _identity(data: bytes) -> bytes:
    return data


async def _serve(port: int) -> None:
    async def unary(request: bytes, context: Any) -> bytes:
        return request

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=_identity, response_serializer=_identity
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=_identity, response_serializer=_identity
            ),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _measure(port: int, messages: int) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        unary = channel.unary_unary(
            f"/{SERVICE}/Unary", request_serializer=_identity, response_deserializer=_identity
        )
        stream = channel.stream_stream(
            f"/{SERVICE}/Stream", request_serializer=_identity, response_deserializer=_identity
        )
        call = stream()

        async def on_stream() -> None:
            await call.write(PAYLOAD)
            await call.read()

        async def by_unary() -> None:
            await unary(PAYLOAD)

        out = {"stream": await _round_trips(on_stream, messages)}
        await call.done_writing()
        out["unary"] = await _round_trips(by_unary, messages)
        return out


async def _round_trips(round_trip: Callable[[], Awaitable[None]], messages: int) -> dict[str, Any]:
    """``messages`` round trips after 200 to warm up: their rate and latencies."""
    for _ in range(200):
        await round_trip()
    times = []
    start = time.perf_counter()
    for _ in range(messages):
        t0 = time.perf_counter()
        await round_trip()
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    return {"round_trips_per_s": messages / elapsed, **latency_summary(times)}


def measure(messages: int = 5000) -> dict[str, Any]:
    """Start the echo server in a child process, measure, stop it."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        result: dict[str, Any] = run_loop(_measure(port, messages))
        return result
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        run_loop(_serve(args.serve))
        return 0
    result = measure(args.messages)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for kind, r in result.items():
            print(
                f"{kind:>6}: {r['round_trips_per_s']:,.0f} round trips/s, "
                f"p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

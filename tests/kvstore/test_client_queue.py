"""The key-value client's queue of puts (kvstore/client.py) over a node
played by the test: a long stream of queued puts leaves from the front, in
order, at most ``max_puts_per_request`` a request and
``max_requests_in_flight`` requests at a time; a put its caller cancelled
is left out; each put's future holds its request's position."""

from __future__ import annotations

import asyncio
from typing import Any

from kqproto import kv_pb2, quorum_pb2
from kvstore.client import MAX_REQUESTS_IN_FLIGHT, KvClient
from quorum.types import OffsetAndEpoch


class Node:
    """Answers each write request with the next offset, one turn of the
    loop later, and records the keys of each and the most in flight."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def write(self, call: str, request: Any, timeout_s: float | None) -> Any:
        keys = [p.key for p in request.puts] if call == "PutMany" else [request.key]
        self.requests.append(keys)
        offset = len(self.requests)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return kv_pb2.WriteResponse(position=quorum_pb2.LogPosition(epoch=3, offset=offset))


def test_a_long_stream_of_queued_puts_leaves_in_order() -> None:
    async def go() -> None:
        client = KvClient(["127.0.0.1:1"], max_requests_in_flight=2, max_puts_per_request=100)
        node = Node()
        client._write = node.write  # type: ignore[method-assign]
        futures = [client.put_nowait(f"k{i}", b"v") for i in range(5_000)]
        futures[150].cancel()
        await client.flush()
        await client.close()
        sent = [key for keys in node.requests for key in keys]
        assert sent == [f"k{i}" for i in range(5_000) if i != 150]
        assert max(len(keys) for keys in node.requests) == 100
        assert node.most_in_flight == 2
        assert client.puts_sent == 4_999
        request_of = {key: n for n, keys in enumerate(node.requests, 1) for key in keys}
        for i, future in enumerate(futures):
            if i != 150:
                assert future.result() == OffsetAndEpoch(epoch=3, offset=request_of[f"k{i}"])

    asyncio.run(go())


def test_requests_in_flight_default_to_the_module_s() -> None:
    client = KvClient(["127.0.0.1:1"])
    assert client.max_requests_in_flight == MAX_REQUESTS_IN_FLIGHT

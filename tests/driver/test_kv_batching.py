"""The key-value client's batching and pipelining: concurrent puts from one
process share requests (one PutMany, one log record), a lone writer's puts
go out at once as plain Puts, put_nowait keeps many in flight, and a bad
put in a shared request fails alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvstore.client import KvClient
from quorum.driver.client import ClientError
from tests.driver.cluster_util import run, running


def test_concurrent_puts_share_requests_and_all_commit(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values()), max_requests_in_flight=2) as client:
                await client.put("warm", b"up")
                before = client.put_requests

                async def writer(w: int) -> None:
                    for i in range(10):
                        await client.put(f"w{w}-{i}", f"{w}:{i}".encode())

                await asyncio.gather(*(writer(w) for w in range(32)))
                assert client.puts_sent == 321
                # 320 puts from 32 writers went in far fewer requests.
                assert client.put_requests - before < 160, client.put_requests - before
                for w in (0, 17, 31):
                    assert (await client.get(f"w{w}-9")).value == f"{w}:9".encode()

    run(go())


def test_a_lone_writer_sends_plain_puts_at_once(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values())) as client:
                positions = [await client.put(f"k{i}", b"v") for i in range(20)]
                assert client.put_requests == client.puts_sent == 20
                offsets = [p.offset for p in positions]
                assert offsets == sorted(set(offsets))  # one record each, in order

    run(go())


def test_put_nowait_keeps_many_in_flight_in_order(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values()), max_requests_in_flight=1) as client:
                futures = [client.put_nowait("same", str(i).encode()) for i in range(300)]
                await client.flush()
                assert all(f.done() for f in futures)
                positions = [f.result() for f in futures]
                # Queue order is log order; the last put wins.
                assert [p.offset for p in positions] == sorted(p.offset for p in positions)
                assert client.put_requests < 300
                assert (await client.get("same")).value == b"299"

    run(go())


def test_a_bad_put_in_a_shared_request_fails_alone(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            await cluster.wait_leader()
            async with KvClient(list(cluster.voters.values()), max_requests_in_flight=1) as client:
                first = client.put_nowait("a", b"1")
                bad = client.put_nowait("", b"2")  # shares a PutMany with "c"
                last = client.put_nowait("c", b"3")
                await client.flush()
                assert first.result().offset >= 0
                with pytest.raises(ClientError, match="a key must be a non-empty string"):
                    bad.result()
                assert last.result().offset > first.result().offset
                assert (await client.get("c")).value == b"3"

    run(go())


def test_bad_settings_and_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="max_requests_in_flight must be at least 1, got 0"):
        KvClient(["127.0.0.1:1"], max_requests_in_flight=0)
    with pytest.raises(ValueError, match="max_puts_per_request must be at least 1, got 0"):
        KvClient(["127.0.0.1:1"], max_puts_per_request=0)

    async def go() -> None:
        client = KvClient(["127.0.0.1:1"])
        with pytest.raises(TypeError, match="a str key and a bytes value, got bytes and str"):
            client.put_nowait(b"k", "v")  # type: ignore[arg-type]
        await client.close()

    run(go())

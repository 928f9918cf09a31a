"""kill -9 under load, repeatedly, on real processes.

Three ``kq controller start`` processes take writes from 8 concurrent
writers while random nodes (the leader included) are killed with SIGKILL at
random moments and restarted.  Afterwards every acknowledged write must be
there, and every node must have applied the same committed log (same applied
offset and state digest).  The seed is printed; set KQ_KILL9_SEED to replay
the same schedule of kills (process timing still varies).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import pytest

from kqproto import quorum_pb2
from kvstore.client import KvClient
from quorum.driver.client import ClientError, IndeterminateWriteError, NoLeaderError
from server.local_cluster import free_base_port, load_state, process_alive, run_kq

ROUNDS = 6
WRITERS = 8


# Every node process this test started: pid -> its config path (the marker
# process_alive checks, so a reused pid is never killed).
_seen: dict[int, str] = {}


def _pids(directory: Path) -> dict[int, int]:
    state = load_state(directory)
    assert state is not None
    pids = {}
    for n in state.nodes:
        if n.pid is not None:
            pids[n.node_id] = n.pid
            _seen[n.pid] = str(state.path(n.config))
    return pids


@pytest.mark.slow
def test_kill9_under_load_loses_no_acknowledged_write(tmp_path: Path) -> None:
    seed = int(os.environ.get("KQ_KILL9_SEED", random.randrange(2**32)))
    print(f"kill -9 schedule seed: {seed} (replay with KQ_KILL9_SEED={seed})")
    rng = random.Random(seed)
    directory = tmp_path / "cluster"
    up = run_kq(
        "cluster", "up", "--dir", str(directory), "--nodes", "3", "--brokers", "0",
        "--base-port", str(free_base_port(3)),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        _pids(directory)
        asyncio.run(asyncio.wait_for(_scenario(directory, rng), 180))
    finally:
        run_kq("cluster", "down", "--dir", str(directory))
        for pid, marker in _seen.items():
            if process_alive(pid, marker):
                os.kill(pid, signal.SIGKILL)


async def _scenario(directory: Path, rng: random.Random) -> None:
    state = load_state(directory)
    assert state is not None
    addresses = {n.node_id: n.address for n in state.nodes}
    # A TLS cluster (the default): the commands' admin certificate.
    credentials = state.client_credentials()
    assert credentials is not None
    acked: dict[str, bytes] = {}
    indeterminate: set[str] = set()
    stop = asyncio.Event()

    async def writer(w: int) -> None:
        async with KvClient(
            list(addresses.values()), timeout_s=3.0, credentials=credentials
        ) as client:
            seq = 0
            while not stop.is_set():
                key, value = f"w{w}-{seq}", f"v{w}-{seq}".encode()
                seq += 1
                try:
                    await client.put(key, value)
                    acked[key] = value
                except IndeterminateWriteError:
                    indeterminate.add(key)
                except (ClientError, NoLeaderError):
                    await asyncio.sleep(0.05)  # definitely not written

    writers = [asyncio.create_task(writer(w)) for w in range(WRITERS)]
    kills = []
    for _ in range(ROUNDS):
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        victim = rng.choice(sorted(addresses))
        os.kill(_pids(directory)[victim], signal.SIGKILL)
        kills.append(victim)
        await asyncio.sleep(rng.uniform(0.05, 0.6))
        started = await asyncio.to_thread(
            run_kq, "cluster", "start", str(victim), "--dir", str(directory)
        )
        assert started.returncode == 0, started.stderr
        _pids(directory)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*writers)
    print(f"killed {kills}; {len(acked)} writes acknowledged, {len(indeterminate)} indeterminate")
    assert len(acked) >= 100, "the cluster made too little progress to prove anything"

    async with KvClient(
        list(addresses.values()), timeout_s=10.0, credentials=credentials
    ) as client:
        # No acknowledged write is lost (linearizable reads through the leader).
        for key, value in acked.items():
            got = await client.get(key)
            assert got.present and got.value == value, f"acknowledged write {key} lost: {got}"
        # Every node converges on the same committed log.
        deadline = time.monotonic() + 20
        while True:
            views = {}
            for node, address in addresses.items():
                try:
                    d = await client.quorum_stub(address).DescribeQuorum(
                        quorum_pb2.DescribeQuorumRequest(), timeout=2
                    )
                    views[node] = (d.applied_offset, d.state_digest)
                except Exception as exc:
                    views[node] = (-1, repr(exc).encode())
            if len(set(views.values())) == 1 and next(iter(views.values()))[0] > 0:
                break
            assert time.monotonic() < deadline, f"nodes disagree: {views}"
            await asyncio.sleep(0.2)

"""Exactly once under kills, as real processes (``kq cluster up``: three
controllers and three brokers over mutual TLS): a read-process-write loop
(``tests/server/rpw_worker.py``: consume ``rpw-in`` in a group at
read_committed, write one ``rpw-out`` record per record read in a
transaction with the group's offsets) runs while the leaders of
``rpw-out``'s partitions, the transaction coordinator and the loop's own
process are killed with SIGKILL by pid and started again, and a zombie
copy of the loop keeps running with the same transactional id (each
fences the other; a fenced one is started again).  Afterwards ``rpw-out``,
read committed, holds every input record exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client.consumer import ConsumerConfig, IsolationLevel
from broker.client.producer_batch import ProducerConfig
from broker.grpc_client import Consumer, Producer
from server.local_cluster import broker_addresses, free_base_port, load_state, process_alive
from tests.server.rpw_worker import IN, OUT
from tests.server.test_local_cluster_brokers import kq

pytestmark = pytest.mark.slow

RECORDS = 300
TID, GROUP = "rpw", "rpw-group"
ROOT = Path(__file__).resolve().parents[2]
# The faults, in turn: 0 an rpw-out leader, 1 the transaction coordinator,
# 2 the loop's own process; then how long the loop has to finish.
FAULTS = (0, 1, 2, 0, 1, 2)
FAULTS_S, FINISH_S = 60.0, 150.0


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A cluster whose groups notice a killed member within seconds."""
    d = str(tmp_path_factory.mktemp("rpw") / "cluster")
    base = free_base_port(3, brokers=3)
    pids: dict[int, str] = {}

    def record() -> None:
        state = load_state(d)
        if state is not None:
            for n in state.members:
                if n.pid is not None:
                    pids[n.pid] = str(state.path(n.config))

    up = kq(
        "cluster", "up", "--cluster-dir", d, "--base-port", str(base),
        "--set", "group.session_timeout_ms=6000",
        "--set", "group.heartbeat_interval_ms=500",
        "--set", "offsets.partitions=3",
        "--set", "transaction_state.partitions=3",
        "--set", "controller.broker_session_timeout_ms=4000",
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        record()
        yield d
    finally:
        record()
        kq("cluster", "down", "--cluster-dir", d, "--timeout", "10")
        for pid, marker in pids.items():
            if process_alive(pid, marker):
                os.kill(pid, signal.SIGKILL)


class Worker:
    """One copy of the loop (a process), started again when it exits."""

    def __init__(self, cluster_dir: str, name: str) -> None:
        self.cluster_dir = cluster_dir
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []

    def start(self, seconds: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.server.rpw_worker", self.cluster_dir, TID, GROUP,
             str(seconds)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def alive(self) -> bool:
        if self.process is None:
            return False
        code = self.process.poll()
        if code is not None and self.process is not None:
            self.exits.append(code)
            self.process = None
        return self.process is not None

    def kill(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            self.exits.append(-9)
            self.process = None


def broker_pids(cluster_dir: str) -> dict[int, int]:
    state = load_state(cluster_dir)
    assert state is not None
    return {b.node_id: b.pid for b in state.brokers if b.pid is not None}


def kill_broker(cluster_dir: str, broker_id: int) -> None:
    pid = broker_pids(cluster_dir).get(broker_id)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def start_broker(cluster_dir: str, broker_id: int) -> None:
    started = kq("cluster", "start", str(broker_id), "--cluster-dir", cluster_dir)
    assert started.returncode == 0, started.stderr


def leaders(cluster_dir: str, topic: str) -> list[int]:
    done = kq("topics", "describe", topic, "--cluster-dir", cluster_dir, "--json")
    assert done.returncode == 0, done.stderr
    (found,) = json.loads(done.stdout)["topics"]
    return [p["leader"] for p in found["partitions"]]


def coordinator(cluster_dir: str) -> int | None:
    done = kq(
        "transactions", "--describe", "--transactional-id", TID, "--cluster-dir", cluster_dir,
        "--json",
    )  # fmt: skip
    if done.returncode != 0:
        return None
    found = json.loads(done.stdout)
    entry = found[0] if isinstance(found, list) else found
    value = entry.get("coordinator_id", entry.get("CoordinatorId"))
    return int(value) if isinstance(value, int) and value >= 0 else None


async def produce_input(cluster_dir: str) -> None:
    state = load_state(cluster_dir)
    assert state is not None
    async with Producer(
        broker_addresses(cluster_dir), ProducerConfig(linger_ms=5), tls=state.client_tls()
    ) as producer:
        futures = [await producer.send(IN, b"%04d" % i, partition=i % 3) for i in range(RECORDS)]
        await producer.flush()
        for f in futures:
            await f


async def read_output(cluster_dir: str, wait_s: float) -> list[bytes]:
    """Every record of ``rpw-out`` a read_committed consumer reads within
    ``wait_s`` of nothing new."""
    state = load_state(cluster_dir)
    assert state is not None
    got: list[bytes] = []
    async with Consumer(
        broker_addresses(cluster_dir),
        ConsumerConfig(isolation_level=IsolationLevel.READ_COMMITTED),
        tls=state.client_tls(),
    ) as consumer:
        consumer.assign([(OUT, p) for p in range(3)])
        consumer.seek_to_beginning([(OUT, p) for p in range(3)])
        quiet_until = time.monotonic() + wait_s
        while time.monotonic() < quiet_until:
            records = await consumer.poll(500)
            if records:
                got.extend(r.value or b"" for r in records)
                quiet_until = time.monotonic() + wait_s
    return got


def test_every_input_record_is_written_exactly_once_under_kills_and_a_zombie(
    cluster_dir: str,
) -> None:
    for topic in (IN, OUT):
        created = kq(
            "topics", "create", topic, "--partitions", "3", "--replication-factor", "3",
            "--config", "min.insync.replicas=2", "--cluster-dir", cluster_dir,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
    asyncio.run(asyncio.wait_for(produce_input(cluster_dir), 120))
    expected = sorted(b"out-%04d" % i for i in range(RECORDS))

    loop, zombie = Worker(cluster_dir, "loop"), Worker(cluster_dir, "zombie")
    run_s = FAULTS_S + FINISH_S
    loop.start(run_s)
    zombie.start(run_s)
    killed: list[str] = []
    try:
        for kind in FAULTS:
            time.sleep(3)
            for w in (loop, zombie):
                if not w.alive():
                    w.start(run_s)
            if kind == 0:
                victim = next((b for b in leaders(cluster_dir, OUT) if b >= 0), None)
                what = f"rpw-out leader {victim}"
            elif kind == 1:
                victim = coordinator(cluster_dir)
                what = f"transaction coordinator {victim}"
            else:
                loop.kill()
                loop.start(run_s)
                killed.append("the loop's process")
                continue
            if victim is None:
                continue
            kill_broker(cluster_dir, victim)
            killed.append(what)
            time.sleep(2)
            start_broker(cluster_dir, victim)
        assert any("leader" in k for k in killed) and "the loop's process" in killed, killed
        # Faults over: the loop (and its zombie) finish the input.
        deadline = time.monotonic() + FINISH_S
        got: list[bytes] = []
        while time.monotonic() < deadline:
            for w in (loop, zombie):
                if not w.alive():
                    w.start(max(10.0, deadline - time.monotonic()))
            got = asyncio.run(asyncio.wait_for(read_output(cluster_dir, 3), 120))
            if len(set(got)) >= RECORDS:
                break
            time.sleep(2)
        # Exactly once: every input record's output once, nothing else.
        assert sorted(got) == expected, (
            f"{len(got)} records read, {len(set(got))} distinct, of {RECORDS}; "
            f"missing {sorted(set(expected) - set(got))[:10]}, duplicated "
            f"{sorted({g for g in got if got.count(g) > 1})[:10]}; faults {killed}; "
            f"exits {loop.exits} / {zombie.exits}"
        )
    finally:
        loop.kill()
        zombie.kill()

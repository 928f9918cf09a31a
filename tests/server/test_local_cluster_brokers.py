"""``kq cluster up --brokers 3`` end to end, as real processes: three
controllers and three brokers over mutual TLS, each broker on its own
loopback address, registered and unfenced; status (text and JSON); the
admin user produces and fetches through a broker without any ACL; kill,
start, pause and resume of a broker; down stops every process (brokers
first).  One cluster for the module: the machine is small."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from broker.errors import Errors
from kqproto import broker_pb2_grpc
from partition_log.batch import decode_records, split_batches
from quorum.driver.tls import dial
from server.local_cluster import (
    broker_addresses,
    free_base_port,
    load_state,
    process_alive,
    run_kq,
)
from tests.server.test_broker_process import fetch, produce

pytestmark = pytest.mark.slow


def kq(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return run_kq(*args, timeout_s=timeout)


def kq_json(*args: str) -> Any:
    done = kq(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass
class Up:
    dir: str
    base: int
    up: subprocess.CompletedProcess[str]
    # Every pid seen, with the config file its command line names.
    pids: dict[int, str]

    def record(self) -> None:
        state = load_state(self.dir)
        if state is None:
            return
        for n in state.members:
            if n.pid is not None:
                self.pids[n.pid] = str(state.path(n.config))


def cluster_up(tmp_path_factory: pytest.TempPathFactory, name: str, *settings: str) -> Iterator[Up]:
    """A module fixture's cluster (``kq cluster up``: three controllers and
    three brokers, with ``settings`` as ``--set KEY=VALUE``) in a new folder
    ``name``: brought down at the end, and any process it ran that is still
    alive then killed."""
    d = str(tmp_path_factory.mktemp(name) / "cluster")
    base = free_base_port(3, brokers=3)
    sets = [arg for setting in settings for arg in ("--set", setting)]
    up = Up(d, base, kq("cluster", "up", "--cluster-dir", d, "--base-port", str(base), *sets), {})
    try:
        up.record()
        yield up
    finally:
        up.record()
        kq("cluster", "down", "--cluster-dir", d, "--timeout", "10")
        for pid, marker in up.pids.items():
            if process_alive(pid, marker):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from cluster_up(tmp_path_factory, "brokers")


def brokers_by_id(status: Any) -> dict[int, Any]:
    return {b["broker_id"]: b for b in status["brokers"]}


def test_up_starts_three_controllers_and_three_unfenced_brokers(cluster: Up) -> None:
    assert cluster.up.returncode == 0, cluster.up.stderr
    assert "of 3 controllers and 3 brokers" in cluster.up.stdout
    status = kq_json("cluster", "status", "--cluster-dir", cluster.dir)
    assert [n["node_id"] for n in status["nodes"]] == [1, 2, 3]
    assert [n["role"] for n in status["nodes"]].count("leader") == 1
    brokers = brokers_by_id(status)
    assert sorted(brokers) == [4, 5, 6]
    for b, row in brokers.items():
        # Ids after the controllers', each on its own 127.0.1.<id>.
        assert row["address"] == f"127.0.1.{b}:{cluster.base + b - 1}"
        assert row["alive"] is True and row["paused"] is False and row["pid"] > 0
        assert (row["registered"], row["fenced"], row["state"]) == (True, False, "unfenced")
        assert row["epoch"] >= 0 and row["security_protocol"] == "SSL"
    assert broker_addresses(cluster.dir) == [brokers[b]["address"] for b in (4, 5, 6)]

    table = kq("cluster", "status", "--cluster-dir", cluster.dir)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "Brokers: 3/3 running, 3 registered and unfenced" in lines
    header = next(line for line in lines if line.startswith("BrokerId"))
    assert header.split() == [
        "BrokerId",
        "Address",
        "Metrics",
        "Protocol",
        "Pid",
        "Alive",
        "State",
        "Epoch",
    ]
    row = next(line for line in lines if line.startswith("5 "))
    assert row.split()[1] == f"127.0.1.5:{cluster.base + 4}"
    assert row.split()[5:7] == ["yes", "unfenced"]


def test_the_admin_user_produces_and_fetches_through_the_brokers(cluster: Up) -> None:
    """No ACL is needed: the admin user and the brokers are the brokers'
    super users (the brokers replicate to each other, acks=all)."""
    created = kq(
        "topics", "create", "demo", "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=2", "--cluster-dir", cluster.dir,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    state = load_state(cluster.dir)
    assert state is not None and state.tls

    async def body() -> None:
        credentials = state.client_credentials()
        deadline = time.monotonic() + 30
        while True:
            # The leader accepts; the others answer NOT_LEADER_OR_FOLLOWER.
            for address in broker_addresses(cluster.dir):
                async with dial(address, credentials) as channel:
                    stub = broker_pb2_grpc.BrokerServiceStub(channel)
                    answer = (await stub.Produce(produce(b"hello", "demo"))).topics[0].partitions[0]
                    if answer.error != Errors.NONE:
                        continue
                    assert answer.base_offset == 0
                    got = (await stub.Fetch(fetch(0, "demo"))).topics[0].partitions[0]
                    assert got.error == Errors.NONE and got.high_watermark == 1
                    values = [
                        r.value for b in split_batches(got.records) for r in decode_records(b)
                    ]
                    assert values == [b"hello"]
                    return
            assert time.monotonic() < deadline, "no broker took the produce"
            await asyncio.sleep(0.2)

    asyncio.run(asyncio.wait_for(body(), 60))


def test_kill_start_pause_and_resume_a_broker(cluster: Up) -> None:
    before = brokers_by_id(kq_json("cluster", "status", "--cluster-dir", cluster.dir))
    killed = kq("cluster", "kill", "5", "--cluster-dir", cluster.dir)
    assert killed.returncode == 0, killed.stderr
    assert f"killed broker 5 (pid {before[5]['pid']}) with SIGKILL" in killed.stdout
    assert not process_alive(before[5]["pid"], cluster.pids[before[5]["pid"]])
    row = brokers_by_id(kq_json("cluster", "status", "--cluster-dir", cluster.dir))[5]
    assert (row["alive"], row["pid"]) == (False, None)

    started = kq("cluster", "start", "5", "--cluster-dir", cluster.dir)
    assert started.returncode == 0, started.stderr
    assert "started broker 5" in started.stdout and "registered and unfenced" in started.stdout
    cluster.record()
    row = brokers_by_id(kq_json("cluster", "status", "--cluster-dir", cluster.dir))[5]
    assert row["alive"] is True and row["pid"] != before[5]["pid"]
    # A new registration: a new broker epoch.
    assert row["state"] == "unfenced" and row["epoch"] > before[5]["epoch"]
    again = kq("cluster", "start", "5", "--cluster-dir", cluster.dir)
    assert again.returncode == 1 and "broker 5 is already running" in again.stderr

    paused = kq("cluster", "pause", "6", "--cluster-dir", cluster.dir)
    assert paused.returncode == 0, paused.stderr
    row = brokers_by_id(kq_json("cluster", "status", "--cluster-dir", cluster.dir))[6]
    assert (row["alive"], row["paused"]) == (True, True)
    twice = kq("cluster", "pause", "6", "--cluster-dir", cluster.dir)
    assert twice.returncode == 1 and "already paused" in twice.stderr
    resumed = kq("cluster", "resume", "6", "--cluster-dir", cluster.dir)
    assert resumed.returncode == 0, resumed.stderr
    row = brokers_by_id(kq_json("cluster", "status", "--cluster-dir", cluster.dir))[6]
    assert (row["alive"], row["paused"]) == (True, False)

    unknown = kq("cluster", "kill", "9", "--cluster-dir", cluster.dir)
    assert unknown.returncode == 1
    assert "no node or broker 9 (controllers 1,2,3, brokers 4,5,6)" in unknown.stderr


def test_down_stops_brokers_then_controllers(cluster: Up) -> None:
    """Last in the module: it stops the cluster."""
    cluster.record()
    # Paused, a broker still gets its SIGTERM (down resumes it).
    assert kq("cluster", "pause", "4", "--cluster-dir", cluster.dir).returncode == 0
    down = kq_json("cluster", "down", "--cluster-dir", cluster.dir)
    assert down["brokers"] == {"4": "stopped", "5": "stopped", "6": "stopped"}
    assert down["nodes"] == {"1": "stopped", "2": "stopped", "3": "stopped"}
    for pid, marker in cluster.pids.items():
        assert not process_alive(pid, marker), f"pid {pid} survived kq cluster down"
    state = load_state(cluster.dir)
    assert state is not None and all(n.pid is None for n in state.members)
    # Each broker shut down under control (SIGTERM), not killed.
    for b in state.brokers:
        log = state.path(b.log_file).read_text()
        assert "received SIGTERM: controlled shutdown" in log, log[-2000:]

"""Helpers of the real-process tests that follow one topic of one partition
on a ``kq cluster up`` cluster (:func:`tests.server.test_local_cluster_brokers.cluster_up`):
its description, waits on it, calls to a broker, a broker killed by pid,
and a broker's directory of the partition (a produce request to it is
:func:`tests.server.test_broker_process.produce`)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from kqproto import broker_pb2_grpc
from quorum.driver.tls import dial
from server.local_cluster import load_state, process_alive
from tests.server.test_local_cluster_brokers import Up, kq

T = TypeVar("T")

# Each bound below is far above what the step takes on a quiet host.
STEP_S = 60.0


def describe(cluster: Up, topic: str) -> dict[str, Any]:
    """The partition of ``topic`` as ``kq topics describe --json`` gives it."""
    done = kq("topics", "describe", topic, "--cluster-dir", cluster.dir, "--json")
    assert done.returncode == 0, done.stderr
    (described,) = json.loads(done.stdout)["topics"]
    (partition,) = described["partitions"]
    assert isinstance(partition, dict)
    return partition


def wait_for_partition(
    cluster: Up, topic: str, what: str, ok: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The partition's description once ``ok`` holds of it; fails naming
    ``what`` after :data:`STEP_S`."""
    deadline = time.monotonic() + STEP_S
    while True:
        partition = describe(cluster, topic)
        if ok(partition):
            return partition
        assert time.monotonic() < deadline, f"{what}: {partition}"
        time.sleep(0.5)


def broker_address(cluster: Up, broker_id: int) -> str:
    state = load_state(cluster.dir)
    assert state is not None
    (address,) = [b.address for b in state.brokers if b.node_id == broker_id]
    return address


async def on_broker(
    cluster: Up,
    broker_id: int,
    body: Callable[[broker_pb2_grpc.BrokerServiceStub], Awaitable[T]],
) -> T:
    """``body`` called with a stub of broker ``broker_id`` over mutual TLS."""
    state = load_state(cluster.dir)
    assert state is not None
    async with dial(broker_address(cluster, broker_id), state.client_credentials()) as channel:
        return await body(broker_pb2_grpc.BrokerServiceStub(channel))


def kill_broker(cluster: Up, broker_id: int) -> None:
    """SIGKILL to broker ``broker_id``'s process, by its pid; returns once
    it is gone."""
    state = load_state(cluster.dir)
    assert state is not None
    cluster.record()
    (pid,) = [b.pid for b in state.brokers if b.node_id == broker_id]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_alive(pid, cluster.pids.get(pid, "")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(pid, cluster.pids.get(pid, "")), pid


def partition_dir(cluster: Up, broker_id: int, topic: str) -> Path:
    """Broker ``broker_id``'s directory of partition 0 of ``topic``."""
    state = load_state(cluster.dir)
    assert state is not None
    (broker_state,) = [b for b in state.brokers if b.node_id == broker_id]
    (log_dir,) = broker_state.log_dirs
    return Path(state.path(log_dir)) / f"{topic}-0"

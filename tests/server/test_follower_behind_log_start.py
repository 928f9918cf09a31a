"""A follower whose log ends below its leader's log start comes back, as
real processes (``kq cluster up``: three controllers and three brokers over
mutual TLS). A topic of replication factor 3 and min ISR 1 with small
segments and retention by bytes; one follower is killed with SIGKILL by
pid, acks=1 produces go on until the leader's retention has moved its log
start past the follower's log end, and the follower is started again. It
restarts its log at the leader's log start (Kafka's
``truncateFullyAndStartAt``), fetches on from there and rejoins the ISR;
before, it waited for ever (``OFFSET_OUT_OF_RANGE`` with nothing to do)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.errors import Errors
from kqproto import broker_pb2, broker_pb2_grpc
from partition_log.batch import build_batch
from partition_log.log_files import LOG_START_OFFSET_FILE, decode_offset
from partition_log.records import Record
from quorum.driver.tls import dial
from server.local_cluster import load_state, process_alive
from tests.server.test_local_cluster_brokers import Up, cluster_up, kq

pytestmark = pytest.mark.slow

TOPIC = "behind"
# Records the follower holds when it is killed.
BEFORE = 3
# Each bound below is far above what the step takes on a quiet host.
STEP_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from cluster_up(tmp_path_factory, "behind-log-start")


def describe(cluster: Up) -> dict[str, Any]:
    done = kq("topics", "describe", TOPIC, "--cluster-dir", cluster.dir, "--json")
    assert done.returncode == 0, done.stderr
    (topic,) = json.loads(done.stdout)["topics"]
    (partition,) = topic["partitions"]
    assert isinstance(partition, dict)
    return partition


def wait_for_partition(cluster: Up, what: str, ok: Any) -> dict[str, Any]:
    deadline = time.monotonic() + STEP_S
    while True:
        partition = describe(cluster)
        if ok(partition):
            return partition
        assert time.monotonic() < deadline, f"{what}: {partition}"
        time.sleep(0.5)


def produce_request(value: bytes, acks: int) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=10_000,
        topics=[
            broker_pb2.ProduceTopicData(
                name=TOPIC,
                partitions=[
                    broker_pb2.ProducePartitionData(
                        partition=0,
                        records=build_batch([Record(0, int(time.time() * 1000), b"k", value)]),
                    )
                ],
            )
        ],
    )


def broker_address(cluster: Up, broker_id: int) -> str:
    state = load_state(cluster.dir)
    assert state is not None
    (address,) = [b.address for b in state.brokers if b.node_id == broker_id]
    return address


async def produce(
    cluster: Up, leader: int, values: list[bytes], acks: int
) -> list[broker_pb2.ProducePartitionResponse]:
    state = load_state(cluster.dir)
    assert state is not None
    answers = []
    async with dial(broker_address(cluster, leader), state.client_credentials()) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        for value in values:
            answer = (await stub.Produce(produce_request(value, acks))).topics[0].partitions[0]
            assert answer.error == Errors.NONE, answer
            answers.append(answer)
    return answers


def test_a_follower_behind_the_leaders_log_start_restarts_there_and_rejoins_the_isr(
    cluster: Up,
) -> None:
    assert cluster.up.returncode == 0, cluster.up.stderr
    # A killed follower leaves the ISR within 2 s (else at its session's end).
    altered = kq(
        "configs", "alter", "--entity-type", "cluster",
        "--add-config", "replica.lag.time.max.ms=2000", "--cluster-dir", cluster.dir,
    )  # fmt: skip
    assert altered.returncode == 0, altered.stderr
    created = kq(
        "topics", "create", TOPIC, "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=1", "--config", "segment.bytes=1024",
        "--config", "retention.bytes=2048", "--config", "file.delete.delay.ms=1000",
        "--cluster-dir", cluster.dir,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    first = wait_for_partition(
        cluster, "a leader and a full ISR", lambda p: p["leader"] is not None and len(p["isr"]) == 3
    )
    leader = int(first["leader"])
    follower = next(b for b in sorted(first["replicas"]) if b != leader)

    # acks=all with the whole ISR: the follower holds these three.
    answers = asyncio.run(produce(cluster, leader, [b"before-%d" % i for i in range(BEFORE)], -1))
    assert [a.base_offset for a in answers] == list(range(BEFORE))

    # The follower killed, by pid.
    state = load_state(cluster.dir)
    assert state is not None
    cluster.record()
    (pid,) = [b.pid for b in state.brokers if b.node_id == follower]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_alive(pid, cluster.pids.get(pid, "")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(pid, cluster.pids.get(pid, "")), pid

    # acks=1 produces until the leader's retention has moved its log start
    # past the follower's log end (its HW moves once the follower left the
    # ISR, and retention deletes only below the HW).
    value = b"x" * 200

    async def past_the_follower() -> int:
        deadline = time.monotonic() + STEP_S
        while True:
            (answer,) = await produce(cluster, leader, [value], 1)
            if answer.log_start_offset > BEFORE:
                return int(answer.log_start_offset)
            assert time.monotonic() < deadline, answer
            await asyncio.sleep(0.02)

    leader_start = asyncio.run(past_the_follower())
    assert describe(cluster)["leader"] == leader

    started = kq("cluster", "start", str(follower), "--cluster-dir", cluster.dir)
    assert started.returncode == 0, started.stderr
    cluster.record()
    wait_for_partition(cluster, "the follower back in the ISR", lambda p: follower in p["isr"])

    # Its broker log says where its log restarted: at the leader's log
    # start then, at or past the one the produce saw, above its old end.
    state = load_state(cluster.dir)
    assert state is not None
    (broker_state,) = [b for b in state.brokers if b.node_id == follower]
    text = state.path(broker_state.log_file).read_text(errors="replace")
    restarts = re.findall(
        rf"broker {follower} partition {TOPIC}-0 restarted at (\d+) from \[(\d+), (\d+)\)", text
    )
    assert len(restarts) == 1, restarts
    at, old_start, old_end = (int(x) for x in restarts[0])
    assert (old_start, old_end) == (0, BEFORE) and at >= leader_start > BEFORE
    assert f"partition {TOPIC}-0 truncated" not in text
    # Its log starts there: no live segment below, the checkpoint at or
    # past it (its own retention may have moved it on since).
    (log_dir,) = broker_state.log_dirs
    partition_dir = Path(state.path(log_dir)) / f"{TOPIC}-0"
    bases = [int(n.name[:20]) for n in partition_dir.iterdir() if n.name.endswith(".log")]
    assert bases and min(bases) >= at, (at, sorted(bases))
    checkpoint = partition_dir / LOG_START_OFFSET_FILE
    assert decode_offset(checkpoint.name, checkpoint.read_bytes()) >= at
    # And acks=all goes on with it in the ISR.
    (answer,) = asyncio.run(produce(cluster, leader, [b"after"], -1))
    assert answer.base_offset > at

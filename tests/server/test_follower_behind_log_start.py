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
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.errors import Errors
from kqproto import broker_pb2
from partition_log.log_files import LOG_START_OFFSET_FILE, decode_offset
from server.local_cluster import load_state
from tests.server.one_partition import (
    STEP_S,
    describe,
    kill_broker,
    on_broker,
    partition_dir,
    wait_for_partition,
)
from tests.server.test_broker_process import produce as produce_one
from tests.server.test_local_cluster_brokers import Up, cluster_up, kq

pytestmark = pytest.mark.slow

TOPIC = "behind"
# Records the follower holds when it is killed.
BEFORE = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    # Retention checked every 200 ms (Kafka's log.retention.check.interval.ms,
    # 5 minutes by default), so that the leader's log start moves at once.
    yield from cluster_up(
        tmp_path_factory, "behind-log-start", "broker.log_retention_check_interval_ms=200"
    )


async def produce(
    cluster: Up, leader: int, values: list[bytes], acks: int
) -> list[broker_pb2.ProducePartitionResponse]:
    async def each(stub: Any) -> list[broker_pb2.ProducePartitionResponse]:
        answers = []
        for value in values:
            request = produce_one(value, TOPIC, acks)
            answer = (await stub.Produce(request)).topics[0].partitions[0]
            assert answer.error == Errors.NONE, answer
            answers.append(answer)
        return answers

    return await on_broker(cluster, leader, each)


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
        cluster,
        TOPIC,
        "a leader and a full ISR",
        lambda p: p["leader"] is not None and len(p["isr"]) == 3,
    )
    leader = int(first["leader"])
    follower = next(b for b in sorted(first["replicas"]) if b != leader)

    # acks=all with the whole ISR: the follower holds these three.
    answers = asyncio.run(produce(cluster, leader, [b"before-%d" % i for i in range(BEFORE)], -1))
    assert [a.base_offset for a in answers] == list(range(BEFORE))

    # The follower killed, by pid.
    kill_broker(cluster, follower)

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
    assert describe(cluster, TOPIC)["leader"] == leader

    started = kq("cluster", "start", str(follower), "--cluster-dir", cluster.dir)
    assert started.returncode == 0, started.stderr
    cluster.record()
    wait_for_partition(
        cluster, TOPIC, "the follower back in the ISR", lambda p: follower in p["isr"]
    )

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
    directory = partition_dir(cluster, follower, TOPIC)
    bases = [int(n.name[:20]) for n in directory.iterdir() if n.name.endswith(".log")]
    assert bases and min(bases) >= at, (at, sorted(bases))
    checkpoint = directory / LOG_START_OFFSET_FILE
    assert decode_offset(checkpoint.name, checkpoint.read_bytes()) >= at
    # And acks=all goes on with it in the ISR.
    (answer,) = asyncio.run(produce(cluster, leader, [b"after"], -1))
    assert answer.base_offset > at

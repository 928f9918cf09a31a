"""Every broker killed at once, as real processes (``kq cluster up``: three
controllers and three brokers over mutual TLS): records are produced with
acks=all to every partition of a topic of replication factor 3 and min ISR
2, the three brokers are killed with SIGKILL by pid, at once, and started
again.  Each re-registers after an unclean shutdown and so leaves every ISR
and ELR (KIP-966); before the last known leader rule the partitions stayed
leaderless for ever.  Now each partition elects its last known leader
(an unclean election, RECOVERING until the leader says its log is
consistent), within a bounded time, and a produce and a fetch succeed.  A
kill keeps the page cache, so every record acknowledged before it is read
back at its offset."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.errors import Errors
from kqproto import broker_pb2, broker_pb2_grpc
from partition_log.batch import build_batch, decode_records, split_batches
from partition_log.records import Record
from quorum.driver.tls import dial
from server.local_cluster import broker_addresses, load_state, process_alive
from tests.server.test_local_cluster_brokers import Up, cluster_up, kq

pytestmark = pytest.mark.slow

TOPIC = "everyone-dies"
PARTITIONS = 3
# Every partition has a leader again this long after the last broker is
# back (the brokers' heartbeats unfence them within a second or two).
LEADER_BACK_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from cluster_up(tmp_path_factory, "kill-every-broker")


def describe(cluster: Up) -> list[dict[str, Any]]:
    done = kq("topics", "describe", TOPIC, "--cluster-dir", cluster.dir, "--json")
    assert done.returncode == 0, done.stderr
    (topic,) = json.loads(done.stdout)["topics"]
    partitions: list[dict[str, Any]] = topic["partitions"]
    return partitions


def produce_request(partition: int, value: bytes) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=10_000,
        topics=[
            broker_pb2.ProduceTopicData(
                name=TOPIC,
                partitions=[
                    broker_pb2.ProducePartitionData(
                        partition=partition,
                        records=build_batch([Record(0, int(time.time() * 1000), b"k", value)]),
                    )
                ],
            )
        ],
    )


def fetch_request(partition: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(
        max_wait_ms=0,
        topics=[
            broker_pb2.FetchTopic(
                topic=TOPIC,
                partitions=[
                    broker_pb2.FetchPartition(
                        partition=partition,
                        fetch_offset=0,
                        current_leader_epoch=-1,
                        last_fetched_epoch=-1,
                    )
                ],
            )
        ],
    )


async def produce(cluster: Up, partition: int, value: bytes, timeout_s: float) -> int:
    """The offset acks=all gave ``value``, from whichever broker leads."""
    state = load_state(cluster.dir)
    assert state is not None
    credentials = state.client_credentials()
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        for address in broker_addresses(cluster.dir):
            try:
                async with dial(address, credentials) as channel:
                    stub = broker_pb2_grpc.BrokerServiceStub(channel)
                    answer = (await stub.Produce(produce_request(partition, value))).topics[0]
            except Exception as exc:  # a broker still starting: try the next
                last = repr(exc)
                continue
            got = answer.partitions[0]
            if got.error == Errors.NONE:
                return int(got.base_offset)
            last = Errors(got.error).name
        await asyncio.sleep(0.2)
    raise AssertionError(f"no broker took a produce to partition {partition}: {last}")


async def read_all(cluster: Up, partition: int, timeout_s: float) -> list[bytes | None]:
    """Every value below the high watermark, fetched from the leader."""
    state = load_state(cluster.dir)
    assert state is not None
    credentials = state.client_credentials()
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        for address in broker_addresses(cluster.dir):
            try:
                async with dial(address, credentials) as channel:
                    stub = broker_pb2_grpc.BrokerServiceStub(channel)
                    got = (await stub.Fetch(fetch_request(partition))).topics[0].partitions[0]
            except Exception as exc:
                last = repr(exc)
                continue
            if got.error == Errors.NONE:
                return [r.value for b in split_batches(got.records) for r in decode_records(b)]
            last = Errors(got.error).name
        await asyncio.sleep(0.2)
    raise AssertionError(f"no broker served a fetch of partition {partition}: {last}")


def test_every_partition_leads_again_after_every_broker_was_killed_at_once(cluster: Up) -> None:
    assert cluster.up.returncode == 0, cluster.up.stderr
    created = kq(
        "topics", "create", TOPIC, "--partitions", str(PARTITIONS), "--replication-factor", "3",
        "--config", "min.insync.replicas=2", "--cluster-dir", cluster.dir,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    async def before() -> dict[int, list[tuple[int, bytes]]]:
        acked: dict[int, list[tuple[int, bytes]]] = {}
        for p in range(PARTITIONS):
            acked[p] = []
            for i in range(3):
                value = f"before-{p}-{i}".encode()
                acked[p].append((await produce(cluster, p, value, 30), value))
        return acked

    acked = asyncio.run(before())
    for p, written in acked.items():
        assert [offset for offset, _ in written] == [0, 1, 2], (p, written)

    # Every broker killed at once, by pid.
    state = load_state(cluster.dir)
    assert state is not None
    cluster.record()
    pids = {b.node_id: b.pid for b in state.brokers}
    assert sorted(pids) == [4, 5, 6] and all(pids.values())
    for pid in pids.values():
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    for pid in pids.values():
        assert pid is not None
        deadline = time.monotonic() + 10
        while process_alive(pid, cluster.pids.get(pid, "")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(pid, cluster.pids.get(pid, "")), pid

    # Started again (each re-registers without its previous broker epoch).
    for b in (4, 5, 6):
        started = kq("cluster", "start", str(b), "--cluster-dir", cluster.dir)
        assert started.returncode == 0, started.stderr
    cluster.record()
    back_at = time.monotonic()
    while True:
        partitions = describe(cluster)
        if all(p["leader"] is not None for p in partitions):
            break
        assert time.monotonic() - back_at < LEADER_BACK_S, partitions
        time.sleep(0.5)
    for row in partitions:
        # A last known leader elected after its unclean restart; nobody was
        # left in the ELR to lead instead.
        assert row["elr"] == [] and row["last_known_elr"] == [], row

    async def after() -> None:
        for p in range(PARTITIONS):
            offset = await produce(cluster, p, f"after-{p}".encode(), 60)
            # The kill kept the page cache: nothing acknowledged was lost,
            # and the new record follows the old ones.
            assert offset == len(acked[p]), (p, offset)
            values = await read_all(cluster, p, 30)
            assert values == [v for _, v in acked[p]] + [f"after-{p}".encode()], (p, values)

    asyncio.run(after())

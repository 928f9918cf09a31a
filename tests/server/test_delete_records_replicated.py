"""DeleteRecords is replicated, as real processes (``kq cluster up``: three
controllers and three brokers over mutual TLS). A topic of replication
factor 3; six acks=all records; a DeleteRecords below 4 is answered once
every replica's log start is there (each broker's log-start checkpoint
says so), and after the leader is killed with SIGKILL by pid, the replica
elected in its place starts at 4 too: the deleted records stay deleted.
Before, only the leader's log start moved and the new leader served the
records from 0 again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.errors import Errors
from kqproto import broker_pb2
from partition_log.log_files import LOG_START_OFFSET_FILE, decode_offset
from tests.server.one_partition import (
    STEP_S,
    kill_broker,
    on_broker,
    partition_dir,
    wait_for_partition,
)
from tests.server.test_broker_process import produce
from tests.server.test_local_cluster_brokers import Up, cluster_up, kq

pytestmark = pytest.mark.slow

TOPIC = "deleted"
RECORDS = 6
DELETE_BELOW = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from cluster_up(tmp_path_factory, "delete-records")


def log_start_checkpoint(cluster: Up, broker_id: int) -> int:
    checkpoint = partition_dir(cluster, broker_id, TOPIC) / LOG_START_OFFSET_FILE
    return decode_offset(checkpoint.name, checkpoint.read_bytes())


def test_deleted_records_stay_deleted_after_the_leader_is_killed(cluster: Up) -> None:
    assert cluster.up.returncode == 0, cluster.up.stderr
    created = kq(
        "topics", "create", TOPIC, "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=2", "--cluster-dir", cluster.dir,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    first = wait_for_partition(
        cluster,
        TOPIC,
        "a leader and a full ISR",
        lambda p: p["leader"] is not None and len(p["isr"]) == 3,
    )
    leader = int(first["leader"])
    replicas = sorted(int(b) for b in first["replicas"])

    async def produce_then_delete(stub: Any) -> Any:
        for i in range(RECORDS):
            request = produce(b"v%d" % i, TOPIC, -1)
            answer = (await stub.Produce(request)).topics[0].partitions[0]
            assert (answer.error, answer.base_offset) == (Errors.NONE, i), answer
        deleted = await stub.DeleteRecords(
            broker_pb2.DeleteRecordsRequest(
                topics=[
                    broker_pb2.DeleteRecordsTopic(
                        name=TOPIC,
                        partitions=[
                            broker_pb2.DeleteRecordsPartition(partition=0, offset=DELETE_BELOW)
                        ],
                    )
                ],
                timeout_ms=int(STEP_S * 1000),
            )
        )
        return deleted.topics[0].partitions[0]

    answer = asyncio.run(on_broker(cluster, leader, produce_then_delete))
    # Answered once the low watermark (every replica's log start) got there.
    assert (answer.error, answer.low_watermark) == (Errors.NONE, DELETE_BELOW), answer
    for broker_id in replicas:
        assert log_start_checkpoint(cluster, broker_id) == DELETE_BELOW, broker_id

    # The leader killed, by pid; another replica is elected.
    kill_broker(cluster, leader)
    moved = wait_for_partition(
        cluster,
        TOPIC,
        "another leader",
        lambda p: p["leader"] is not None and int(p["leader"]) != leader,
    )
    new_leader = int(moved["leader"])

    async def read_from_zero(stub: Any) -> tuple[Any, Any]:
        earliest = await stub.ListOffsets(
            broker_pb2.ListOffsetsRequest(
                topics=[
                    broker_pb2.ListOffsetsTopic(
                        name=TOPIC,
                        partitions=[
                            broker_pb2.ListOffsetsPartition(
                                partition=0, current_leader_epoch=-1, timestamp=-2
                            )
                        ],
                    )
                ]
            )
        )
        fetched = await stub.Fetch(
            broker_pb2.FetchRequest(
                topics=[
                    broker_pb2.FetchTopic(
                        topic=TOPIC,
                        partitions=[
                            broker_pb2.FetchPartition(
                                partition=0,
                                fetch_offset=0,
                                current_leader_epoch=-1,
                                last_fetched_epoch=-1,
                            )
                        ],
                    )
                ]
            )
        )
        return earliest.topics[0].partitions[0], fetched.topics[0].partitions[0]

    # The new leader may still be taking over: its answers settle within
    # the step's bound.
    deadline = time.monotonic() + STEP_S
    while True:
        earliest, fetched = asyncio.run(on_broker(cluster, new_leader, read_from_zero))
        if earliest.error == Errors.NONE and fetched.error != Errors.NOT_LEADER_OR_FOLLOWER:
            break
        assert time.monotonic() < deadline, (earliest, fetched)
        time.sleep(0.5)
    assert earliest.offset == DELETE_BELOW, earliest
    assert (fetched.error, fetched.log_start_offset) == (
        Errors.OFFSET_OUT_OF_RANGE,
        DELETE_BELOW,
    ), fetched

"""kq transactions end to end against real brokers (three controllers,
three brokers, mutual TLS with the admin's certificate, one cluster for the
module), in this process, with live transactional producers: a producer's
open transaction listed and described (Ongoing with its partitions, then
CompleteCommit after its commit); a partition's producers with the open
transaction's first offset, then none after the commit; find-hanging on a
cluster whose transactions are all healthy finds nothing, even when every
open transaction is made a candidate; --abort --start-offset ends a live
producer's open transaction in its partition, which read_committed readers
then read past; what is not there is exit 1, naming it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client.consumer import ConsumerConfig, IsolationLevel
from broker.client.producer_batch import ProducerConfig, TopicPartition
from broker.grpc_client.sync import SyncConsumer, SyncProducer
from broker.grpc_client.txn_admin import TransactionAdmin
from kq.cli import main
from tests.broker.grpc_client.cluster import BROKERS, BrokerCluster

TOPIC = "orders"
CONFIG = ProducerConfig(linger_ms=2, request_timeout_ms=10_000, delivery_timeout_ms=30_000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    running = BrokerCluster(tmp_path_factory.mktemp("txn-admin"))
    try:
        running.start()
        running.create_topic(TOPIC, 2, 3, {"min.insync.replicas": "2"})
        yield running
    finally:
        running.stop()


def flags(cluster: BrokerCluster) -> list[str]:
    return [
        "--bootstrap-server",
        ",".join(cluster.addresses),
        "--certs-dir",
        str(cluster.certs_dir),
        "--user",
        "admin",
        "--timeout-ms",
        "20000",
    ]


def kq(
    cluster: BrokerCluster, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    try:
        status = main(["transactions", *argv, *flags(cluster)])
    except SystemExit as exc:
        status = int(exc.code or 0)
    out = capsys.readouterr()
    return status, out.out, out.err


def kq_json(cluster: BrokerCluster, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    status, out, err = kq(cluster, capsys, *argv, "--json")
    assert status == 0, err
    return json.loads(out)


def transactional(cluster: BrokerCluster, tid: str) -> SyncProducer:
    producer = SyncProducer(
        cluster.addresses,
        CONFIG,
        tls=cluster.admin_tls,
        transactional_id=tid,
        transaction_timeout_ms=60_000,
    )
    producer.init_transactions(30_000)
    return producer


def producer_id(producer: SyncProducer) -> int:
    txn = producer.producer.transactions
    assert txn is not None
    return txn.producer.producer_id


def open_offset(cluster: BrokerCluster, tp: TopicPartition, pid: int) -> int | None:
    """The first offset of ``pid``'s open transaction in ``tp`` (the API's
    -1 read as None)."""

    async def go() -> int | None:
        async with TransactionAdmin(cluster.addresses, tls=cluster.admin_tls) as admin:
            states = (await admin.describe_producers([tp]))[tp]
        mine = [s for s in states if s.producer_id == pid]
        assert len(mine) == 1, states
        return None if mine[0].current_txn_start_offset < 0 else mine[0].current_txn_start_offset

    return asyncio.run(go())


def test_an_open_transaction_listed_described_and_not_hanging_then_committed(
    cluster: BrokerCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    producer = transactional(cluster, "tx-live")
    try:
        pid = producer_id(producer)
        producer.begin_transaction()
        sent = [producer.send(TOPIC, b"v%d" % i, partition=i % 2) for i in range(4)]
        acked = [f.result(30) for f in sent]
        first = {p: min(m.offset for m in acked if m.partition == p) for p in (0, 1)}

        listed = kq_json(cluster, capsys, "--list")
        mine = [t for t in listed if t["transactional_id"] == "tx-live"]
        assert len(mine) == 1, listed
        assert mine[0]["producer_id"] == pid and mine[0]["state"] == "Ongoing"
        assert mine[0]["coordinator"] in BROKERS
        # The filters: this producer's Ongoing transaction, and nothing else.
        assert [
            t["transactional_id"]
            for t in kq_json(cluster, capsys, "--list", "--state", "Ongoing", "--producer-id",
                             str(pid))
        ] == ["tx-live"]  # fmt: skip
        assert kq_json(cluster, capsys, "--list", "--state", "CompleteAbort") == []
        status, out, err = kq(cluster, capsys, "--list")
        assert status == 0, err
        assert out.split("\n")[0].split() == [
            "TransactionalId",
            "Coordinator",
            "ProducerId",
            "TransactionState",
        ]
        assert any(line.split()[0] == "tx-live" and "Ongoing" in line for line in out.splitlines())

        described = kq_json(cluster, capsys, "--describe", "--transactional-id", "tx-live")
        assert described["state"] == "Ongoing"
        assert described["producer_id"] == pid
        assert described["coordinator_id"] == mine[0]["coordinator"]
        assert described["transaction_timeout_ms"] == 60_000
        started = described["current_transaction_start_time_ms"]
        assert abs(started - time.time() * 1000) < 60_000
        assert described["transaction_duration_ms"] >= 0
        assert described["topic_partitions"] == [
            {"topic": TOPIC, "partition": 0},
            {"topic": TOPIC, "partition": 1},
        ]
        status, out, err = kq(cluster, capsys, "--describe", "--transactional-id", "tx-live")
        assert status == 0, err
        header, row = out.splitlines()
        assert header.split()[0] == "CoordinatorId" and header.split()[-1] == "TopicPartitions"
        assert row.split()[1:3] == ["tx-live", str(pid)]
        assert row.split()[-1] == f"{TOPIC}-0,{TOPIC}-1"

        for p in (0, 1):
            producers = kq_json(
                cluster, capsys, "--describe-producers", "--topic", TOPIC, "--partition", str(p)
            )
            entry = next(s for s in producers if s["producer_id"] == pid)
            assert entry["current_transaction_start_offset"] == first[p]
            assert entry["last_sequence"] == 1  # two records each, from sequence 0
            assert entry["producer_epoch"] == described["producer_epoch"]
        status, out, err = kq(
            cluster, capsys, "--describe-producers", "--topic", TOPIC, "--partition", "0"
        )
        assert status == 0, err
        assert out.splitlines()[0].split() == [
            "ProducerId",
            "ProducerEpoch",
            "LatestCoordinatorEpoch",
            "LastSequence",
            "LastTimestamp",
            "CurrentTransactionStartOffset",
        ]

        # Healthy: with a zero timeout every open transaction is a candidate,
        # and its coordinator still has it Ongoing with these partitions.
        time.sleep(0.05)
        for where in (["--topic", TOPIC], ["--topic", TOPIC, "--partition", "1"]):
            assert kq_json(cluster, capsys, "--find-hanging", *where,
                           "--max-transaction-timeout", "0") == []  # fmt: skip
        leader = cluster.partition(TOPIC, 0).leader
        assert kq_json(cluster, capsys, "--find-hanging", "--broker-id", str(leader),
                       "--max-transaction-timeout", "0") == []  # fmt: skip
        status, out, err = kq(cluster, capsys, "--find-hanging", "--topic", TOPIC)
        assert (status, out.strip()) == (0, "No hanging transactions found"), err

        producer.commit_transaction(30_000)
        described = kq_json(cluster, capsys, "--describe", "--transactional-id", "tx-live")
        assert described["state"] == "CompleteCommit"
        assert described["topic_partitions"] == []
        # The coordinator keeps the ended transaction's start time (as
        # Kafka's); no duration is given once it ended.
        assert described["current_transaction_start_time_ms"] == started
        assert described["transaction_duration_ms"] is None
        for p in (0, 1):
            producers = kq_json(
                cluster, capsys, "--describe-producers", "--topic", TOPIC, "--partition", str(p)
            )
            entry = next(s for s in producers if s["producer_id"] == pid)
            assert entry["current_transaction_start_offset"] is None
            assert entry["latest_coordinator_epoch"] is not None
            assert open_offset(cluster, TopicPartition(TOPIC, p), pid) is None
        assert kq_json(cluster, capsys, "--list", "--state", "CompleteCommit", "--producer-id",
                       str(pid))[0]["transactional_id"] == "tx-live"  # fmt: skip
        assert kq_json(cluster, capsys, "--find-hanging", "--topic", TOPIC,
                       "--max-transaction-timeout", "0") == []  # fmt: skip
    finally:
        producer.close(10)


def test_abort_by_start_offset_ends_a_live_producers_open_transaction(
    cluster: BrokerCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ABORT marker goes to the partition only: the coordinator still
    has the transaction Ongoing, so the producer's later commit is answered
    as the coordinator decides, a commit (PrepareCommit, a COMMIT marker at
    the next epoch, CompleteCommit): the partition takes that marker, which
    ends no open transaction there any more, and the records the admin
    aborted stay aborted; read_committed readers never see them."""
    tp = TopicPartition(TOPIC, 1)
    producer = transactional(cluster, "tx-stuck")
    plain = SyncProducer(cluster.addresses, CONFIG, tls=cluster.admin_tls)
    try:
        pid = producer_id(producer)
        producer.begin_transaction()
        acked = [producer.send(TOPIC, b"doomed-%d" % i, partition=1).result(30) for i in range(3)]
        start = acked[0].offset
        assert open_offset(cluster, tp, pid) == start

        # Nothing opens there: refused by name, nothing written.
        status, _, err = kq(cluster, capsys, "--abort", "--topic", TOPIC, "--partition", "1",
                            "--start-offset", str(start + 1))  # fmt: skip
        assert status == 1 and f"no open transaction starts at offset {start + 1}" in err
        assert open_offset(cluster, tp, pid) == start

        done = kq_json(cluster, capsys, "--abort", "--topic", TOPIC, "--partition", "1",
                       "--start-offset", str(start))  # fmt: skip
        assert done["producer_id"] == pid and done["start_offset"] == start
        assert done["coordinator_epoch"] >= 0
        assert open_offset(cluster, tp, pid) is None
        # The coordinator was not told.
        described = kq_json(cluster, capsys, "--describe", "--transactional-id", "tx-stuck")
        assert described["state"] == "Ongoing"
        assert described["topic_partitions"] == [{"topic": TOPIC, "partition": 1}]

        # The partition's LSO moved past the aborted records: a record
        # written after them is read at read_committed, they are not.
        after = plain.send(TOPIC, b"after", partition=1).result(30)
        config = ConsumerConfig(isolation_level=IsolationLevel.READ_COMMITTED)
        with SyncConsumer(cluster.addresses, config, tls=cluster.admin_tls) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, start)
            seen: list[bytes | None] = []
            deadline = time.monotonic() + 20
            while b"after" not in seen:
                assert time.monotonic() < deadline, seen
                seen.extend(r.value for r in consumer.poll(500))
        assert seen == [b"after"]

        # The producer goes on as its coordinator says: the commit succeeds.
        producer.commit_transaction(30_000)
        described = kq_json(cluster, capsys, "--describe", "--transactional-id", "tx-stuck")
        assert described["state"] == "CompleteCommit"
        assert described["producer_epoch"] == done["producer_epoch"] + 1
        assert open_offset(cluster, tp, pid) is None
        with SyncConsumer(cluster.addresses, config, tls=cluster.admin_tls) as consumer:
            consumer.assign([tp])
            consumer.seek(tp, start)
            seen = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and b"after" not in seen:
                seen.extend(r.value for r in consumer.poll(500))
        assert seen == [b"after"], "the aborted records stay aborted"
        assert after.offset > acked[-1].offset
    finally:
        plain.close(10)
        producer.close(10)


def test_abort_with_explicit_producer_epochs(
    cluster: BrokerCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """--producer-id --producer-epoch --coordinator-epoch writes the marker
    as given: at an older epoch than the producer's it is refused by the
    partition (INVALID_PRODUCER_EPOCH, exit 1, the transaction still open);
    at its own epoch it ends the transaction."""
    tp = TopicPartition(TOPIC, 0)
    producer = transactional(cluster, "tx-explicit")
    try:
        pid = producer_id(producer)
        # One committed transaction first, so that the epoch is above 0 and
        # the partition has a coordinator epoch for this producer.
        producer.begin_transaction()
        producer.send(TOPIC, b"kept", partition=0).result(30)
        producer.commit_transaction(30_000)
        producer.begin_transaction()
        start = producer.send(TOPIC, b"dropped", partition=0).result(30).offset
        entry = next(
            s
            for s in kq_json(cluster, capsys, "--describe-producers", "--topic", TOPIC,
                             "--partition", "0")
            if s["producer_id"] == pid
        )  # fmt: skip
        assert entry["current_transaction_start_offset"] == start
        epoch, coordinator_epoch = entry["producer_epoch"], entry["latest_coordinator_epoch"]
        assert epoch >= 1 and coordinator_epoch is not None

        base = ["--abort", "--topic", TOPIC, "--partition", "0", "--producer-id", str(pid)]
        status, _, err = kq(cluster, capsys, *base, "--producer-epoch", str(epoch - 1),
                            "--coordinator-epoch", str(coordinator_epoch))  # fmt: skip
        assert status == 1 and "INVALID_PRODUCER_EPOCH" in err, err
        assert open_offset(cluster, tp, pid) == start

        status, out, err = kq(cluster, capsys, *base, "--producer-epoch", str(epoch),
                              "--coordinator-epoch", str(coordinator_epoch))  # fmt: skip
        assert status == 0, err
        assert out.strip() == (
            f"Wrote the ABORT marker of producer {pid} (epoch {epoch}, coordinator epoch "
            f"{coordinator_epoch}) to {TOPIC}-0"
        )
        assert open_offset(cluster, tp, pid) is None
        producer.abort_transaction(30_000)
    finally:
        producer.close(10)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--describe", "--transactional-id", "never-used"],
         "TRANSACTIONAL_ID_NOT_FOUND: transactional id 'never-used' does not exist"),
        (["--describe-producers", "--topic", "missing", "--partition", "0"], "missing"),
        (["--describe-producers", "--topic", TOPIC, "--partition", "7"],
         f"topic '{TOPIC}' has no partition 7 (it has 2)"),
        (["--find-hanging", "--topic", TOPIC, "--partition", "2"],
         f"topic '{TOPIC}' has no partition 2 (it has 2)"),
        (["--find-hanging", "--broker-id", "99"], "broker 99 is not among the cluster's brokers"),
        (["--abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "1000000"],
         f"no open transaction starts at offset 1000000 of {TOPIC}-0"),
        (["--abort", "--topic", TOPIC, "--partition", "5", "--start-offset", "0"],
         f"topic '{TOPIC}' has no partition 5 (it has 2)"),
    ],
)  # fmt: skip
def test_what_is_not_there_is_named_with_exit_1(
    cluster: BrokerCluster, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    status, out, err = kq(cluster, capsys, *argv)
    assert status == 1, (out, err)
    assert says in err
    assert err.startswith("kq transactions: ")

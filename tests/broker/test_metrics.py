"""The data plane's metrics (broker/metrics.py, the seam; its Prometheus side
in server/broker_metrics.py): each moves when the thing it counts happens,
read from the registry. The replica manager's (ISR changes, bytes and
records appended, replication bytes in) over the managers of
test_replica_manager; the service's (requests, latencies, errors, bytes
out, requests in flight, the purgatory) on a real gRPC server with mutual
TLS, as test_service."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.errors import Errors
from broker.metrics import NO_METRICS, RequestKind, is_failure
from broker.purgatory import Operation
from broker.replica import AlterPartitionRequest
from broker.replica.types import AlterPartitionResult
from broker.replica_manager import ReplicaManager
from kqproto import broker_pb2_grpc
from metadata.image import TopicIdPartition
from quorum.driver.tls import dial
from server.broker_metrics import LATENCY_BUCKETS, PrometheusBrokerMetrics
from server.certs import create_ca
from tests.broker.images import EPOCHS, change, topic, topic_config
from tests.broker.test_replica_manager import A0, Cluster
from tests.broker.test_replica_manager import batch as one_record
from tests.broker.test_service import (
    CLUSTER,
    Brokers,
    Certs,
    batch,
    fetch,
    part,
    produce,
    run,
    serving,
)
from tests.quorum.test_purity import impurities

E = Errors


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    create_ca(tmp_path, CLUSTER)
    return Certs(tmp_path)


def measured(*managers: ReplicaManager) -> list[PrometheusBrokerMetrics]:
    """Give each manager metrics of its own."""
    found = []
    for manager in managers:
        manager.metrics = PrometheusBrokerMetrics(manager.broker_id)
        found.append(manager.metrics)
    return found


def commit(manager: ReplicaManager, key: TopicIdPartition, request: AlterPartitionRequest) -> None:
    """The controller accepts ``request`` (its ISR, the next partition
    epoch), as AlterPartition answers it."""
    result = AlterPartitionResult(
        request.leader_id,
        request.leader_epoch,
        request.partition_epoch + 1,
        request.isr,
        request.leader_recovery_state,
    )
    manager.step_alter_partition_result(key, request, result, 0)
    assert manager.replicas[key].isr == request.isr


# -- the seam -------------------------------------------------------------------------


def test_the_seam_is_pure() -> None:
    path = Path(__file__).resolve().parents[2] / "broker" / "metrics.py"
    assert impurities(path.read_text(), "broker/metrics.py") == []


def test_failures_are_kafkas_not_a_stale_clients() -> None:
    produce_, fetch_ = RequestKind.PRODUCE, RequestKind.FETCH
    for error in (E.NOT_ENOUGH_REPLICAS, E.INVALID_RECORD, E.OUT_OF_ORDER_SEQUENCE_NUMBER):
        assert is_failure(produce_, error), error
    for error in (
        E.NONE,
        E.NOT_LEADER_OR_FOLLOWER,
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.REQUEST_TIMED_OUT,
        E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        E.MESSAGE_TOO_LARGE,
    ):
        assert not is_failure(produce_, error), error
    assert is_failure(fetch_, E.CORRUPT_MESSAGE)
    assert is_failure(RequestKind.FETCH_FOLLOWER, E.UNKNOWN_SERVER_ERROR)
    for error in (E.OFFSET_OUT_OF_RANGE, E.FENCED_LEADER_EPOCH, E.UNKNOWN_TOPIC_ID):
        assert not is_failure(fetch_, error), error


def test_the_latency_buckets_resolve_half_a_millisecond_to_ten_seconds() -> None:
    assert LATENCY_BUCKETS[0] == 0.0005 and LATENCY_BUCKETS[-1] == 10.0
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))


def test_each_partition_of_an_answer_counts_its_error_and_failure() -> None:
    metrics = PrometheusBrokerMetrics(1)
    produce_ = RequestKind.PRODUCE
    codes = [E.NONE, E.NOT_ENOUGH_REPLICAS, E.NONE, E.NOT_ENOUGH_REPLICAS, E.NOT_LEADER_OR_FOLLOWER]
    metrics.answered(produce_, 0.01, E.NONE, codes, 0)

    def errors(error: Errors) -> float:
        return metrics.value("kq_broker_request_errors_total", request="Produce", error=error.name)

    assert errors(E.NONE) == 2 and errors(E.NOT_ENOUGH_REPLICAS) == 2
    assert errors(E.NOT_LEADER_OR_FOLLOWER) == 1
    assert metrics.value("kq_broker_produce_partitions_total") == 5
    assert metrics.value("kq_broker_failed_produce_partitions_total") == 2
    assert metrics.value("kq_broker_requests_total", request="Produce") == 1
    # A top-level error counts once, by its own name.
    metrics.answered(RequestKind.FETCH, 0.01, E.CLUSTER_AUTHORIZATION_FAILED, [], 0)
    assert (
        metrics.value(
            "kq_broker_request_errors_total",
            request="FetchConsumer",
            error="CLUSTER_AUTHORIZATION_FAILED",
        )
        == 1
    )
    assert (
        metrics.value("kq_broker_request_errors_total", request="FetchConsumer", error="NONE") == 0
    )
    assert metrics.value("kq_broker_fetch_partitions_total") == 0


def test_a_manager_reports_nothing_unless_given_metrics() -> None:
    c = Cluster()
    assert all(manager.metrics is NO_METRICS for manager in c.brokers.values())


# -- the replica manager ----------------------------------------------------------------


def test_an_isr_shrink_counts_once_the_controller_committed_it() -> None:
    c = Cluster()
    leader, _, _ = measured(*c.brokers.values())
    c.step(*topic("a", "id-a", (1, 2)))
    (key, request), *_ = c.brokers[1].tick_isr(c.now + 40_000)
    assert request.isr == (1,)
    # Asked for, not yet committed: nothing counted.
    assert leader.value("kq_broker_isr_shrinks_total") == 0
    # An answer from another leader epoch is ignored: still nothing.
    stale = AlterPartitionResult(1, 7, 9, (1,), request.leader_recovery_state)
    c.brokers[1].step_alter_partition_result(key, request, stale, c.now)
    assert leader.value("kq_broker_isr_shrinks_total") == 0
    commit(c.brokers[1], key, request)
    assert leader.value("kq_broker_isr_shrinks_total") == 1
    assert leader.value("kq_broker_isr_expands_total") == 0


def test_a_shrink_the_image_commits_before_the_answer_counts_once() -> None:
    c = Cluster()
    leader, _, _ = measured(*c.brokers.values())
    c.step(*topic("a", "id-a", (1, 2, 3)))
    (key, request), *_ = c.brokers[1].tick_isr(c.now + 40_000)
    assert request.isr == (1,)
    # The controller's record arrives first: the change is ours, committed.
    c.step(change("id-a", 0, isr=(1,)))
    assert leader.value("kq_broker_isr_shrinks_total") == 1
    # The answer that follows is ignored by the replica: no second count.
    late = AlterPartitionResult(
        1, 0, request.partition_epoch + 1, (1,), request.leader_recovery_state
    )
    c.brokers[1].step_alter_partition_result(key, request, late, c.now)
    assert leader.value("kq_broker_isr_shrinks_total") == 1
    # An ISR change the controller makes on its own (not asked) is not ours.
    c.step(change("id-a", 0, isr=(1, 2)))
    assert leader.value("kq_broker_isr_expands_total") == 0


def test_an_isr_expansion_counts_once_committed() -> None:
    c = Cluster()
    leader, follower, _ = measured(*c.brokers.values())
    c.step(*topic("a", "id-a", (1, 2)))
    c.step(change("id-a", 0, isr=(1,)))
    c.brokers[1].append(A0, one_record(b"x"), 1, c.now)
    expansions = []
    for _ in range(3):
        c.now += 1
        for key, request in c.brokers[2].next_fetch_requests(EPOCHS[2])[1].items():
            outcome = c.brokers[1].step_fetch(key, request, c.now)
            if outcome.alter_partition is not None:
                expansions.append(outcome.alter_partition)
            c.brokers[2].step_fetch_answer(key, request, outcome.answer, c.now)
    assert [request.isr for request in expansions] == [(1, 2)]
    commit(c.brokers[1], A0, expansions[0])
    assert leader.value("kq_broker_isr_expands_total") == 1
    assert leader.value("kq_broker_isr_shrinks_total") == 0
    # The follower's append is replication bytes in, not bytes in.
    assert follower.value("kq_broker_replication_bytes_in_total") == len(one_record(b"x"))
    assert follower.value("kq_broker_bytes_in_total") == 0


def test_an_append_counts_bytes_and_messages_in() -> None:
    c = Cluster()
    leader, *_ = measured(*c.brokers.values())
    c.step(*topic("a", "id-a", (1,)))
    three = batch(b"a", b"b", b"c")
    c.brokers[1].append(A0, three, 1, c.now)
    assert leader.value("kq_broker_bytes_in_total") == len(three)
    assert leader.value("kq_broker_messages_in_total") == 3


# -- the service --------------------------------------------------------------------------


def test_produce_and_fetch_move_their_metrics(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)))
    (metrics,) = measured(brokers.managers[1])
    brokers.service.metrics = metrics
    metrics.track(brokers.service)

    def latencies(request: str) -> float:
        return metrics.value("kq_broker_request_latency_seconds_count", request=request)

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            records = batch(b"a", b"b")
            assert part(await stub.Produce(produce("solo", 0, records))).error == E.NONE
            assert metrics.value("kq_broker_bytes_in_total") == len(records)
            assert metrics.value("kq_broker_messages_in_total") == 2
            assert latencies("Produce") == 1
            assert metrics.value("kq_broker_requests_total", request="Produce") == 1
            assert metrics.value("kq_broker_produce_partitions_total") == 1
            assert (
                metrics.value("kq_broker_request_errors_total", request="Produce", error="NONE")
                == 1
            )
            got = await stub.Fetch(fetch("solo", 0, 0))
            assert part(got).records
            assert metrics.value("kq_broker_bytes_out_total") == len(part(got).records)
            assert metrics.value("kq_broker_replication_bytes_out_total") == 0
            assert latencies("FetchConsumer") == 1 and latencies("FetchFollower") == 0
            assert metrics.value("kq_broker_fetch_partitions_total") == 1
            # A stale client's error is counted by its name, not as a failure.
            missing = await stub.Produce(produce("nope", 0, batch(b"x")))
            assert part(missing).error == E.UNKNOWN_TOPIC_OR_PARTITION
            assert (
                metrics.value(
                    "kq_broker_request_errors_total",
                    request="Produce",
                    error="UNKNOWN_TOPIC_OR_PARTITION",
                )
                == 1
            )
            assert metrics.value("kq_broker_failed_produce_partitions_total") == 0
            assert metrics.value("kq_broker_produce_partitions_total") == 2
            assert metrics.value("kq_broker_requests_in_flight", request="Produce") == 0

    run(body)


def test_a_refused_acks_all_produce_is_a_failed_produce(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)), topic_config("t", "min.insync.replicas", "2"))
    (metrics,) = measured(brokers.managers[1])
    brokers.service.metrics = metrics
    brokers.step(change("id-t", 0, isr=[1]))

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            refused = await stub.Produce(produce("t", 0, batch(b"y"), acks=-1))
            assert part(refused).error == E.NOT_ENOUGH_REPLICAS
            assert metrics.value("kq_broker_failed_produce_partitions_total") == 1
            assert metrics.value("kq_broker_bytes_in_total") == 0

    run(body)


def test_parked_requests_show_in_the_purgatory_and_in_flight(certs: Certs) -> None:
    brokers = Brokers(*topic("solo", "id-s", (1,)), *topic("t", "id-t", (1, 2)))
    (metrics,) = measured(brokers.managers[1])
    brokers.service.metrics = metrics
    metrics.track(brokers.service)

    def size(operation: Operation) -> float:
        return metrics.value("kq_broker_purgatory_size", operation=operation.value)

    async def body() -> None:
        async with serving(brokers, certs) as address, dial(address, certs.user("admin")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            poll = asyncio.ensure_future(
                stub.Fetch(fetch("solo", 0, 0, max_wait_ms=10_000, min_bytes=1))
            )
            # acks=all waits for broker 2, which does not fetch here.
            waiting = asyncio.ensure_future(
                stub.Produce(produce("t", 0, batch(b"x"), acks=-1, timeout_ms=10_000))
            )
            await asyncio.sleep(0.3)
            assert size(Operation.FETCH) == 1 and size(Operation.PRODUCE) == 1
            assert (
                metrics.value("kq_broker_delayed_operations", operation="Fetch"),
                metrics.value("kq_broker_requests_in_flight", request="FetchConsumer"),
                metrics.value("kq_broker_requests_in_flight", request="Produce"),
            ) == (1, 1, 1)
            await stub.Produce(produce("solo", 0, batch(b"a")))
            await asyncio.wait_for(poll, 5)
            assert size(Operation.FETCH) == 0
            assert metrics.value("kq_broker_requests_in_flight", request="FetchConsumer") == 0
            # The long poll's time is in its latency: past its first bucket.
            assert (
                metrics.value(
                    "kq_broker_request_latency_seconds_bucket", request="FetchConsumer", le="0.1"
                )
                == 0
            )
            waiting.cancel()

    run(body)


def test_a_follower_fetch_is_replication_bytes_out(certs: Certs) -> None:
    brokers = Brokers(*topic("t", "id-t", (1, 2)))
    leader, follower = measured(brokers.managers[1], brokers.managers[2])
    brokers.service.metrics = leader

    async def body() -> None:
        async with (
            serving(brokers, certs) as address,
            dial(address, certs.user("admin")) as client,
            dial(address, certs.broker(2)) as replica,
        ):
            stub = broker_pb2_grpc.BrokerServiceStub(client)
            records = batch(b"a", b"b")
            await stub.Produce(produce("t", 0, records))
            stream = broker_pb2_grpc.BrokerServiceStub(replica).ReplicaFetch()
            request = brokers.follower_fetch()
            assert request is not None
            await stream.write(request)
            brokers.follower_answer(await stream.read())
            await stream.done_writing()
            assert leader.value("kq_broker_replication_bytes_out_total") == len(records)
            assert leader.value("kq_broker_bytes_out_total") == 0
            assert (
                leader.value("kq_broker_request_latency_seconds_count", request="FetchFollower")
                == 1
            )
            assert follower.value("kq_broker_replication_bytes_in_total") == len(records)

    run(body)

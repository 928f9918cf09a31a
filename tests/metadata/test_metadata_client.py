"""metadata.client.MetadataClient against in-process fake controllers: it
finds the active controller, follows NOT_CONTROLLER, never resends a write
whose RPC died after it was sent, and retries reads until the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from kqproto import metadata_pb2
from metadata.client import (
    ConfigOp,
    ConfigResource,
    Endpoint,
    IndeterminateError,
    MetadataClient,
    MetadataClientError,
    NewPartitions,
    NewTopic,
    NoControllerError,
    PartitionChange,
    Reassignment,
    SupportedFeature,
    TopicPartition,
    error_code,
)
from metadata.errors import Errors
from tests.driver.cluster_util import free_ports
from tests.metadata.fake_controllers import FakeController, bare_server, two_controllers


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


def dead_address() -> str:
    return f"127.0.0.1:{free_ports(1)[0]}"


def test_a_write_goes_to_the_controller_a_standby_names() -> None:
    async def main() -> None:
        async with (
            two_controllers() as (standby, active),
            MetadataClient([standby.address], timeout_s=5) as client,
        ):
            response = await client.create_topics([NewTopic("foo", 3, 2)])
            assert [t.topic_id for t in response.topics] == ["id-foo"]
            assert client.controller_address == active.address
            # The standby was only asked who is active (a stale, cheap read).
            assert [name for name, _ in standby.requests] == ["DescribeFeatures"]
            assert not standby.requests[0][1].linearizable
            assert active.calls("CreateTopics") == 1
            sent = active.requests[-1][1]
            assert sent.topics[0].num_partitions == 3
            assert sent.topics[0].replication_factor == 2

    run(main())


def test_not_controller_refusals_of_a_write_are_followed() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):
            # The standby wrongly believes it is active, until it is asked to write.
            standby.probe_hint = (standby.node_id, standby.address)
            async with MetadataClient([standby.address], timeout_s=5) as client:
                await client.delete_topics(["foo"], topic_ids=["abc"])
                assert standby.calls("DeleteTopics") == 1  # refused: nothing written
                assert active.calls("DeleteTopics") == 1
                request = active.requests[-1][1]
                assert list(request.names) == ["foo"] and list(request.topic_ids) == ["abc"]
                # Known now: the next write goes straight to it.
                await client.unregister_broker(4)
                assert standby.calls("UnregisterBroker") == 0

    run(main())


def test_linearizable_reads_follow_the_hint_stale_reads_do_not() -> None:
    async def main() -> None:
        async with (
            two_controllers() as (standby, active),
            MetadataClient([standby.address], timeout_s=5) as client,
        ):
            stale = await client.describe_topics(["a"], linearizable=False)
            assert stale.metadata_offset == 42
            assert standby.calls("DescribeTopics") == 1
            assert active.calls("DescribeTopics") == 0
            fresh = await client.describe_topics(["a", "b"])
            assert [t.name for t in fresh.topics] == ["a", "b"]
            assert standby.calls("DescribeTopics") == 2  # NOT_CONTROLLER
            assert active.calls("DescribeTopics") == 1
            assert client.controller_address == active.address

    run(main())


def test_addresses_that_do_not_answer_are_skipped() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active), bare_server() as bare:
            bootstrap = [dead_address(), bare, standby.address]
            async with MetadataClient(bootstrap, timeout_s=5) as client:
                await client.create_topics([NewTopic("foo")])
                assert active.calls("CreateTopics") == 1
            async with MetadataClient(bootstrap, timeout_s=5) as client:
                await client.list_topics()
                assert active.calls("ListTopics") == 1

    run(main())


def test_a_write_that_died_after_it_was_sent_is_indeterminate_and_not_resent() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):
            arrived = asyncio.Event()

            async def hang(request: Any, context: Any) -> Any:
                arrived.set()
                await asyncio.sleep(60)

            active.behaviour["CreateTopics"] = hang
            async with MetadataClient([standby.address], timeout_s=10) as client:
                write = asyncio.create_task(client.create_topics([NewTopic("foo")]))
                await arrived.wait()
                await active.stop()  # the controller dies with the write in flight
                with pytest.raises(IndeterminateError, match="may or may not"):
                    await write
                assert active.calls("CreateTopics") == 1
                assert standby.calls("CreateTopics") == 0
                assert client.controller_address is None

    run(main())


def test_a_write_past_its_deadline_is_indeterminate() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):

            async def slow(request: Any, context: Any) -> Any:
                await asyncio.sleep(5)

            active.behaviour["AlterConfigs"] = slow
            async with MetadataClient([standby.address], timeout_s=5) as client:
                await client.find_controller()
                start = time.monotonic()
                with pytest.raises(IndeterminateError, match="DEADLINE_EXCEEDED"):
                    await client.alter_configs(
                        {ConfigResource.topic("t"): [ConfigOp("retention.ms", "1")]},
                        timeout_s=0.3,
                    )
                assert time.monotonic() - start < 2
                assert active.calls("AlterConfigs") == 1

    run(main())


def test_an_aborted_write_is_indeterminate_unless_refused_before_running() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):

            def abort(code: grpc.StatusCode) -> Any:
                async def handler(request: Any, context: Any) -> Any:
                    await context.abort(code, f"aborted with {code.name}")

                return handler

            async with MetadataClient([standby.address], timeout_s=5) as client:
                active.behaviour["ElectLeaders"] = abort(grpc.StatusCode.UNAVAILABLE)
                with pytest.raises(IndeterminateError):
                    await client.elect_leaders(metadata_pb2.PREFERRED)
                assert active.calls("ElectLeaders") == 1
                active.behaviour["ElectLeaders"] = abort(grpc.StatusCode.RESOURCE_EXHAUSTED)
                with pytest.raises(MetadataClientError) as busy:
                    await client.elect_leaders(metadata_pb2.PREFERRED)
                assert busy.value.code is Errors.THROTTLING
                active.behaviour["ElectLeaders"] = abort(grpc.StatusCode.INVALID_ARGUMENT)
                with pytest.raises(MetadataClientError) as bad:
                    await client.elect_leaders(metadata_pb2.PREFERRED)
                assert bad.value.code is Errors.INVALID_REQUEST
                assert active.calls("ElectLeaders") == 3

    run(main())


def test_an_indeterminate_answer_raises() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):

            async def lost(request: Any, context: Any) -> Any:
                return metadata_pb2.CreatePartitionsResponse(
                    error=metadata_pb2.INDETERMINATE, message="leadership lost"
                )

            active.behaviour["CreatePartitions"] = lost
            async with MetadataClient([standby.address], timeout_s=5) as client:
                with pytest.raises(IndeterminateError, match="leadership lost"):
                    await client.create_partitions([NewPartitions("t", 4)])
                assert active.calls("CreatePartitions") == 1

    run(main())


def test_top_level_errors_raise_and_item_errors_do_not() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):

            async def unknown(request: Any, context: Any) -> Any:
                return metadata_pb2.UnregisterBrokerResponse(
                    error=metadata_pb2.BROKER_ID_NOT_REGISTERED, message="no broker 9"
                )

            async def exists(request: Any, context: Any) -> Any:
                response = metadata_pb2.CreateTopicsResponse()
                response.topics.add(
                    name="t", error=metadata_pb2.TOPIC_ALREADY_EXISTS, message="exists"
                )
                return response

            active.behaviour["UnregisterBroker"] = unknown
            active.behaviour["CreateTopics"] = exists
            async with MetadataClient([standby.address], timeout_s=5) as client:
                with pytest.raises(MetadataClientError) as refused:
                    await client.unregister_broker(9)
                assert refused.value.code is Errors.BROKER_ID_NOT_REGISTERED
                assert refused.value.message == "no broker 9"
                assert active.calls("UnregisterBroker") == 1
                response = await client.create_topics([NewTopic("t")])
                assert error_code(response.topics[0].error) is Errors.TOPIC_ALREADY_EXISTS

    run(main())


def test_reads_are_retried_until_they_succeed() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):
            failures = [grpc.StatusCode.UNAVAILABLE, None]

            async def flaky(request: Any, context: Any) -> Any:
                if failures:
                    code = failures.pop(0)
                    if code is not None:
                        await context.abort(code, "not now")
                    return metadata_pb2.DescribeClusterResponse(
                        error=metadata_pb2.REQUEST_TIMED_OUT, message="read barrier timed out"
                    )
                return metadata_pb2.DescribeClusterResponse(
                    cluster_id="c1", controller_id=active.node_id
                )

            active.behaviour["DescribeCluster"] = flaky
            async with MetadataClient([standby.address], timeout_s=5) as client:
                response = await client.describe_cluster()
                assert response.cluster_id == "c1"
                assert active.calls("DescribeCluster") == 3

    run(main())


def test_a_read_that_never_succeeds_gives_up_at_the_deadline() -> None:
    async def main() -> None:
        async with two_controllers() as (standby, active):

            async def busy(request: Any, context: Any) -> Any:
                return metadata_pb2.DescribeConfigsResponse(error=metadata_pb2.THROTTLING)

            active.behaviour["DescribeConfigs"] = busy
            async with MetadataClient([standby.address], timeout_s=0.5) as client:
                start = time.monotonic()
                with pytest.raises(NoControllerError, match="THROTTLING"):
                    await client.describe_configs([ConfigResource.cluster()])
                assert 0.4 < time.monotonic() - start < 2
                assert active.calls("DescribeConfigs") > 1

    run(main())


def test_no_active_controller_means_nothing_is_sent() -> None:
    async def main() -> None:
        lonely = FakeController(1)
        await lonely.start()
        lonely.points_to = (-1, "")  # knows no active controller
        try:
            async with MetadataClient([lonely.address, dead_address()], timeout_s=0.5) as c:
                with pytest.raises(NoControllerError) as failed:
                    await c.create_topics([NewTopic("t")])
                assert failed.value.code is Errors.REQUEST_TIMED_OUT
                assert "knows no active controller" in failed.value.message
                assert lonely.calls("CreateTopics") == 0
                with pytest.raises(NoControllerError):
                    await c.list_topics()
        finally:
            await lonely.stop()

    run(main())


def test_broker_lifecycle_calls() -> None:
    async def main() -> None:
        async with (
            two_controllers() as (standby, active),
            MetadataClient([standby.address], timeout_s=5) as client,
        ):
            registered = await client.register_broker(
                7,
                cluster_id="c1",
                incarnation_id="inc",
                endpoints=[Endpoint("PLAINTEXT", "h", 9092)],
                rack="r1",
                features=[SupportedFeature("metadata.version", 1, 3)],
            )
            assert registered.broker_epoch == 107
            sent = active.requests[-1][1]
            assert sent.HasField("rack") and sent.rack == "r1"
            assert sent.previous_broker_epoch == -1
            assert sent.endpoints[0].security_protocol == "PLAINTEXT"
            await client.register_broker(8, cluster_id="c1", incarnation_id="inc2", endpoints=[])
            assert not active.requests[-1][1].HasField("rack")
            await client.broker_heartbeat(7, 107, 120, want_shutdown=True)
            beat = active.requests[-1][1]
            assert (beat.current_metadata_offset, beat.want_shutdown) == (120, True)
            await client.alter_partition(
                7,
                107,
                [
                    PartitionChange("A", 0, 3, 9, [(7, 107), (8, 5)]),
                    PartitionChange("B", 1, 1, 1, [(7, 107)]),
                    PartitionChange("A", 2, 3, 4, [(7, 107)], leader_recovered=True),
                ],
            )
            alter = active.requests[-1][1]
            assert [t.topic_id for t in alter.topics] == ["A", "B"]
            assert [p.partition for p in alter.topics[0].partitions] == [0, 2]
            assert alter.topics[0].partitions[1].leader_recovered
            assert [
                (m.broker_id, m.broker_epoch) for m in alter.topics[0].partitions[0].new_isr
            ] == [
                (7, 107),
                (8, 5),
            ]
            await client.allocate_producer_ids(7, 107)
            assert standby.calls("AllocateProducerIds") == 0

    run(main())


def test_request_conversions() -> None:
    op = ConfigOp("k", "v", expected="old").to_proto()
    assert (op.op, op.value, op.has_expected, op.expected_value) == (
        metadata_pb2.SET,
        "v",
        True,
        "old",
    )
    op = ConfigOp("k", None, expect_absent=True).to_proto()
    assert (op.op, op.has_expected, op.expect_absent) == (metadata_pb2.DELETE, False, True)
    op = ConfigOp("k", "").to_proto()
    assert (op.op, op.value, op.has_expected, op.expect_absent) == (
        metadata_pb2.SET,
        "",
        False,
        False,
    )
    assert ConfigResource.broker(3).to_proto() == metadata_pb2.ConfigResource(
        type=metadata_pb2.BROKER, name="3"
    )
    topic = NewTopic("t", assignments={1: [2, 3], 0: [3, 2]}, configs={"a": "b"}).to_proto()
    assert [(a.partition, list(a.replicas)) for a in topic.assignments] == [
        (0, [3, 2]),
        (1, [2, 3]),
    ]
    assert (topic.num_partitions, topic.replication_factor) == (-1, -1)
    assert list(Reassignment("t", 0, None).to_proto().replicas) == []
    assert list(Reassignment("t", 0, [4, 5]).to_proto().replicas) == [4, 5]
    assert str(TopicPartition("t", 3)) == "t-3"
    assert error_code(999) is Errors.UNKNOWN_SERVER_ERROR


def test_the_client_needs_an_address() -> None:
    with pytest.raises(ValueError):
        MetadataClient([])
    with pytest.raises(ValueError):
        MetadataClient(["h:1"], timeout_s=0)

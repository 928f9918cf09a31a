"""The client metadata's available partitions (those with a leader, what the
sticky partitioner spreads null-key records over) are computed once per
change of the metadata and follow every change: a refresh and a KIP-951
leader hint."""

from __future__ import annotations

from broker.client.producer_batch import TopicPartition
from broker.grpc_client.metadata_cache import MetadataCache
from kqproto import broker_pb2


def _response(leaders: list[int], epoch: int) -> broker_pb2.MetadataResponse:
    return broker_pb2.MetadataResponse(
        brokers=[
            broker_pb2.NodeEndpoint(node_id=b, host="127.0.0.1", port=9000 + b) for b in (1, 2)
        ],
        topics=[
            broker_pb2.MetadataTopic(
                name="t",
                partitions=[
                    broker_pb2.MetadataPartition(
                        partition=p, leader_id=leader, leader_epoch=epoch, replicas=[1, 2]
                    )
                    for p, leader in enumerate(leaders)
                ],
            )
        ],
    )


def test_available_partitions_follow_refreshes_and_leader_hints() -> None:
    cache = MetadataCache(["127.0.0.1:1"])
    assert cache.available("t") == []
    cache._take(_response([1, -1, 2], epoch=3))
    assert cache.available("t") == [0, 2]
    # Asked again with nothing changed: the same answer, not recomputed.
    assert cache.available("t") is cache.available("t")
    # A leader hint gives partition 1 a leader.
    assert cache.apply_leader_hint(TopicPartition("t", 1), 2, 4)
    assert cache.available("t") == [0, 1, 2]
    # A refresh where partition 0 lost its leader.
    cache._take(_response([-1, 2, 2], epoch=5))
    assert cache.available("t") == [1, 2]


class _Stale:
    """A broker's Metadata answers: always the same ``leaders`` at ``epoch``
    (a broker cut off from the controllers answers from metadata that no
    longer changes), counting the requests."""

    def __init__(self, leaders: list[int], epoch: int) -> None:
        self.answer = _response(leaders, epoch)
        self.asked = 0

    async def Metadata(self, request: object, timeout: float) -> broker_pb2.MetadataResponse:
        self.asked += 1
        return self.answer


def test_refreshes_do_not_always_ask_the_same_broker_first() -> None:
    import asyncio

    # Broker 1 was cut off while it led partition 0; broker 2 leads it now,
    # in epoch 4.  Both answer.  A client that always asked broker 1 first
    # would keep sending to it.
    stale, fresh = _Stale([1], epoch=3), _Stale([2], epoch=4)
    stubs = {"127.0.0.1:9001": stale, "127.0.0.1:9002": fresh}
    cache = MetadataCache(["127.0.0.1:9001"])
    cache.stub_at = stubs.__getitem__  # type: ignore[assignment,method-assign]
    tp = TopicPartition("t", 0)

    async def refreshes(n: int) -> list[int]:
        leaders = []
        for _ in range(n):
            await cache.refresh(["t"])
            leaders.append(cache.partitions[tp].leader)
        return leaders

    leaders = asyncio.run(refreshes(4))
    # The bootstrap answers first (stale); within the known brokers' count of
    # refreshes the client has asked the other one, and KIP-320 keeps it there.
    assert leaders[0] == 1 and leaders[2:] == [2, 2]
    assert stale.asked >= 1 and fresh.asked >= 1


class _Down:
    """A broker that answers Metadata only after ``failures`` refusals
    (a busy or restarting broker: UNAVAILABLE)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0

    async def Metadata(self, request: object, timeout: float) -> broker_pb2.MetadataResponse:
        import grpc

        self.asked += 1
        if self.asked <= self.failures:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata()
            )
        return _response([1], epoch=1)


def test_a_send_waits_out_brokers_that_do_not_answer_until_max_block() -> None:
    """Kafka's waitOnMetadata: a refresh no broker answered is tried again
    until max.block.ms, then NoBrokerError."""
    import asyncio

    import pytest

    from broker.grpc_client.errors import NoBrokerError

    down = _Down(failures=3)
    cache = MetadataCache(["127.0.0.1:9001"], retry_backoff_ms=10)
    cache.stub_at = lambda address: down  # type: ignore[assignment,method-assign,return-value]
    assert asyncio.run(cache.partition_count("t", 5_000)) == 1
    assert down.asked == 4
    never = _Down(failures=10**9)
    cache = MetadataCache(["127.0.0.1:9001"], retry_backoff_ms=10)
    cache.stub_at = lambda address: never  # type: ignore[assignment,method-assign,return-value]
    with pytest.raises(NoBrokerError):
        asyncio.run(cache.partition_count("t", 200))
    assert never.asked > 3

"""The admin client's broker half (Kafka's ``Admin.listOffsets`` and
``deleteRecords``): what a partition's leader answers. Topics are created,
described and configured through the controllers' API
(``metadata.client.MetadataClient``, ``kq topics``); :meth:`Admin.topic`
gives the brokers' view of one topic (leaders, epochs, ISR).

Each request goes to the partition's leader, with the leader epoch the
metadata gives (KIP-320); leadership errors, ``OFFSET_NOT_AVAILABLE`` (a new
leader whose HW is behind its epoch start, KIP-207) and lost answers are
retried after the answer's leader hint (KIP-951) or a metadata refresh,
until the timeout. Other errors raise :class:`BrokerClientError` naming the
partition. ``delete_records`` changes nothing on a refusal.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self, TypeAlias, TypeVar

import grpc

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError, NoBrokerError
from broker.grpc_client.metadata_cache import (
    PERMANENT_REFUSALS,
    MetadataCache,
    PartitionInfo,
    now_ms,
)
from kqproto import broker_pb2, broker_pb2_grpc
from quorum.driver.tls import TlsFiles

__all__ = ["Admin", "OffsetSpec", "PartitionOffset"]

T = TypeVar("T")

if TYPE_CHECKING:
    # The async stub type exists only in the generated stubs (.pyi).
    Stub: TypeAlias = broker_pb2_grpc.BrokerServiceAsyncStub
else:
    Stub = broker_pb2_grpc.BrokerServiceStub
# A leader's answer per partition: (error code, message, KIP-951 leader hint,
# the value when the error is NONE).
Answers = dict[TopicPartition, tuple[int, str, broker_pb2.CurrentLeader | None, T | None]]
Call = Callable[[Stub], Awaitable[Answers[T]]]

# Retried at the leader the answer names, or after a metadata refresh.
_RETRIABLE = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.OFFSET_NOT_AVAILABLE,
        Errors.REQUEST_TIMED_OUT,
        Errors.KAFKA_STORAGE_ERROR,
    }
)


class OffsetSpec(enum.IntEnum):
    """ListOffsets' special timestamps (``OffsetSpec``); any other
    non-negative value is a time in ms."""

    EARLIEST = -2  # the log start offset
    LATEST = -1  # the high watermark
    MAX_TIMESTAMP = -3  # the first record with the largest timestamp (KIP-734)


@dataclass(frozen=True, slots=True)
class PartitionOffset:
    """``ListOffsetsResultInfo``: offset -1 when no record has such a
    timestamp; timestamp -1 for earliest and latest."""

    offset: int
    timestamp: int
    leader_epoch: int


class Admin:
    """ListOffsets and DeleteRecords over the brokers (module docstring)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata: MetadataCache | None = None,
    ) -> None:
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, not {timeout_ms}")
        self.timeout_ms = timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata = metadata or MetadataCache(
            bootstrap,
            tls=tls,
            credentials=credentials,
            request_timeout_ms=timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._owns_metadata = metadata is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_metadata:
            await self.metadata.close()

    async def topic(self, name: str) -> list[PartitionInfo]:
        """The brokers' view of a topic's partitions;
        :class:`UnknownTopicError` if it does not exist."""
        await self.metadata.refresh([name])
        count = self.metadata.topics.get(name)
        if count is None:
            raise self.metadata.topic_error(name)
        return [self.metadata.partitions[TopicPartition(name, p)] for p in range(count)]

    async def list_offsets(
        self, specs: Mapping[TopicPartition, OffsetSpec | int]
    ) -> dict[TopicPartition, PartitionOffset]:
        """Per partition: the earliest offset, the latest (the high
        watermark), or the first offset whose timestamp is at least the one
        given (``kafka-get-offsets``)."""
        for tp, spec in specs.items():
            if spec < OffsetSpec.MAX_TIMESTAMP:
                raise ValueError(f"{tp}: {spec} is not a time in ms, earliest or latest")

        def request(
            parts: list[tuple[TopicPartition, int]],
        ) -> Call[PartitionOffset]:
            async def call(stub: Stub) -> Answers[PartitionOffset]:
                topics: dict[str, list[broker_pb2.ListOffsetsPartition]] = {}
                for tp, epoch in parts:
                    topics.setdefault(tp.topic, []).append(
                        broker_pb2.ListOffsetsPartition(
                            partition=tp.partition,
                            current_leader_epoch=epoch,
                            timestamp=int(specs[tp]),
                        )
                    )
                response = await stub.ListOffsets(
                    broker_pb2.ListOffsetsRequest(
                        topics=[
                            broker_pb2.ListOffsetsTopic(name=t, partitions=p)
                            for t, p in topics.items()
                        ]
                    ),
                    timeout=self.timeout_ms / 1000,
                )
                if response.error != Errors.NONE:
                    raise BrokerClientError(response.error, f"ListOffsets: {response.message}")
                return {
                    TopicPartition(t.name, p.partition): (
                        p.error,
                        p.message,
                        p.current_leader if p.HasField("current_leader") else None,
                        PartitionOffset(p.offset, p.timestamp, p.leader_epoch),
                    )
                    for t in response.topics
                    for p in t.partitions
                }

            return call

        found = await self._on_leaders("ListOffsets", list(specs), request)
        return {tp: value for tp, value in found.items() if value is not None}

    async def delete_records(
        self, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Move each partition's log start offset up to the offset given
        (-1: the high watermark), never past the high watermark; returns the
        new log start offsets (low watermarks)."""
        for tp, offset in offsets.items():
            if offset < -1:
                raise ValueError(f"{tp}: offset {offset} is neither -1 nor an offset")

        def request(
            parts: list[tuple[TopicPartition, int]],
        ) -> Call[int]:
            async def call(stub: Stub) -> Answers[int]:
                topics: dict[str, list[broker_pb2.DeleteRecordsPartition]] = {}
                for tp, _epoch in parts:
                    topics.setdefault(tp.topic, []).append(
                        broker_pb2.DeleteRecordsPartition(
                            partition=tp.partition, offset=offsets[tp]
                        )
                    )
                response = await stub.DeleteRecords(
                    broker_pb2.DeleteRecordsRequest(
                        topics=[
                            broker_pb2.DeleteRecordsTopic(name=t, partitions=p)
                            for t, p in topics.items()
                        ],
                        timeout_ms=self.timeout_ms,
                    ),
                    timeout=self.timeout_ms / 1000,
                )
                if response.error != Errors.NONE:
                    raise BrokerClientError(response.error, f"DeleteRecords: {response.message}")
                return {
                    TopicPartition(t.name, p.partition): (p.error, p.message, None, p.low_watermark)
                    for t in response.topics
                    for p in t.partitions
                }

            return call

        return await self._on_leaders("DeleteRecords", list(offsets), request)

    async def _on_leaders(
        self,
        what: str,
        partitions: list[TopicPartition],
        request: Callable[[list[tuple[TopicPartition, int]]], Call[T]],
    ) -> dict[TopicPartition, T]:
        """Send each partition's part to its leader, retrying the retriable
        answers until the timeout; the results by partition."""
        deadline = now_ms() + self.timeout_ms
        results: dict[TopicPartition, T] = {}
        left = list(dict.fromkeys(partitions))
        await self.metadata.refresh({tp.topic for tp in left})
        last: dict[TopicPartition, str] = {}
        while True:
            for tp in left:
                count = self.metadata.topics.get(tp.topic)
                if count is None:
                    raise self.metadata.topic_error(tp.topic)
                if not 0 <= tp.partition < count:
                    raise BrokerClientError(
                        int(Errors.UNKNOWN_TOPIC_OR_PARTITION),
                        f"topic {tp.topic!r} has no partition {tp.partition} (it has {count})",
                    )
            by_node: dict[int, list[tuple[TopicPartition, int]]] = {}
            for tp in left:
                info = self.metadata.leader(tp)
                if info is None:
                    last[tp] = "no leader"
                    continue
                by_node.setdefault(info.leader, []).append((tp, info.leader_epoch))

            async def one(node: int, parts: list[tuple[TopicPartition, int]]) -> None:
                try:
                    answers = await request(parts)(self.metadata.stub(node))
                except grpc.aio.AioRpcError as error:
                    if error.code() in PERMANENT_REFUSALS:
                        raise BrokerClientError(
                            int(Errors.TOPIC_AUTHORIZATION_FAILED),
                            f"broker {node} refused {what}: {error.details()}",
                        ) from None
                    for tp, _ in parts:
                        last[tp] = f"broker {node}: {error.code().name}"
                    self.metadata.request_refresh()
                    return
                except NoBrokerError as error:
                    for tp, _ in parts:
                        last[tp] = error.message
                    self.metadata.request_refresh()
                    return
                for tp, _ in parts:
                    code, message, hint, value = answers.get(
                        tp, (int(Errors.UNKNOWN_SERVER_ERROR), "no answer", None, None)
                    )
                    if code == Errors.NONE and value is not None:
                        results[tp] = value
                    elif code in _RETRIABLE:
                        last[tp] = f"{Errors(code).name}: {message}"
                        self.metadata.follow(tp, hint)
                    else:
                        raise BrokerClientError(code, f"{what} of {tp}: {message}")

            await asyncio.gather(*(one(n, p) for n, p in by_node.items()))
            left = [tp for tp in left if tp not in results]
            if not left:
                return results
            if now_ms() >= deadline:
                raise BrokerClientError(
                    int(Errors.REQUEST_TIMED_OUT),
                    f"{what} not answered within {self.timeout_ms} ms for "
                    + ", ".join(f"{tp} ({last.get(tp, 'no answer')})" for tp in left),
                )
            await asyncio.sleep(self.retry_backoff_ms / 1000)
            await self.metadata.maybe_refresh()

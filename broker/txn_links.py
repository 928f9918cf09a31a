"""How a broker's transaction machinery reaches the other brokers: the
coordinator's markers to the leaders of a transaction's partitions
(WriteTxnMarkers) and a leader's verification with a transactional id's
coordinator (AddPartitionsToTxn with ``verify_only``), over gRPC to
another broker, or straight to this broker's own objects when it is the
one asked (Kafka sends to itself through its network client; kq skips the
round trip).

The calls carry the broker's certificate (ClusterAction) and its
``node.dscp`` mark through the process's :class:`ChannelPool`, so that a
partition of the chaos harness cuts them like the broker's other traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import grpc

from broker.access import broker_endpoint
from broker.coordinator_runtime import CoordinatorFailure
from broker.errors import Errors
from broker.txn.api import TxnMarker
from broker.txn.types import TopicPartition, by_topic
from broker.txn_coordinator import TransactionCoordinator
from broker.txn_markers import TxnMarkerAppender
from kqproto import txn_pb2, txn_pb2_grpc
from metadata.image import MetadataImage
from quorum.driver.client import ChannelPool

__all__ = ["BrokerTxnLinks"]


def _errors(value: int) -> Errors:
    try:
        return Errors(value)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


def _topics(partitions: Sequence[TopicPartition]) -> list[txn_pb2.TxnTopic]:
    return [
        txn_pb2.TxnTopic(name=topic, partitions=numbers)
        for topic, numbers in by_topic(frozenset(partitions)).items()
    ]


class BrokerTxnLinks:
    """The process's :class:`broker.txn_coordinator.MarkerWriter` and
    :class:`broker.txn_produce.TxnVerifier`."""

    def __init__(
        self,
        broker_id: int,
        image: Callable[[], MetadataImage],
        listener: str,
        pool: ChannelPool,
        *,
        coordinator: TransactionCoordinator,
        appender: TxnMarkerAppender,
        timeout_ms: int = 10_000,
    ) -> None:
        self.broker_id = broker_id
        self._image = image
        self.listener = listener
        self.pool = pool
        self.coordinator = coordinator
        self.appender = appender
        self.timeout_ms = timeout_ms

    def _stub(self, broker_id: int) -> txn_pb2_grpc.TransactionServiceAsyncStub | None:
        endpoint = broker_endpoint(self._image(), self.listener, broker_id)
        if endpoint is None:
            return None
        channel = self.pool.get(f"{endpoint.host}:{endpoint.port}")
        stub: txn_pb2_grpc.TransactionServiceAsyncStub = txn_pb2_grpc.TransactionServiceStub(
            channel
        )
        return stub

    # -- MarkerWriter -------------------------------------------------------------------

    async def write_markers(
        self, leader_id: int, markers: Sequence[TxnMarker], coordinator_epoch: int
    ) -> Mapping[tuple[str, int], tuple[Errors, str]]:
        if leader_id == self.broker_id:
            return await self.appender.append(markers, coordinator_epoch)
        stub = self._stub(leader_id)
        if stub is None:
            raise ConnectionError(f"broker {leader_id} has no endpoint on {self.listener}")
        request = txn_pb2.WriteTxnMarkersRequest()
        by_producer: dict[tuple[int, int, bool, int], list[TopicPartition]] = {}
        for m in markers:
            key = (m.producer_id, m.producer_epoch, m.commit, m.transaction_version)
            by_producer.setdefault(key, []).append(TopicPartition(m.topic, m.partition))
        for (producer_id, epoch, commit, version), partitions in by_producer.items():
            request.markers.add(
                producer_id=producer_id,
                producer_epoch=epoch,
                committed=commit,
                topics=_topics(partitions),
                coordinator_epoch=coordinator_epoch,
                transaction_version=version,
            )
        response = await stub.WriteTxnMarkers(request, timeout=self.timeout_ms / 1000)
        if response.error:
            answer = (_errors(response.error), response.message)
            return {(m.topic, m.partition): answer for m in markers}
        out: dict[tuple[str, int], tuple[Errors, str]] = {}
        for result in response.markers:
            for topic in result.topics:
                for part in topic.partitions:
                    out[(topic.name, part.partition)] = (_errors(part.error), part.message)
        return out

    # -- TxnVerifier --------------------------------------------------------------------

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> Mapping[TopicPartition, tuple[Errors, str]]:
        def all_of(error: Errors, message: str) -> dict[TopicPartition, tuple[Errors, str]]:
            return dict.fromkeys(partitions, (error, message))

        partition = self.coordinator.partition_of(transactional_id)
        image = self._image()
        topic = image.topic_by_name(self.coordinator.topic_name)
        registration = None if topic is None or partition is None else topic.partition(partition)
        if registration is None or registration.leader < 0:
            return all_of(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"transactional id {transactional_id!r} has no coordinator now",
            )
        if registration.leader == self.broker_id:
            try:
                return await self.coordinator.verify_partitions(
                    transactional_id, producer_id, producer_epoch, partitions
                )
            except CoordinatorFailure as failure:
                return all_of(failure.code, failure.message)
        stub = self._stub(registration.leader)
        if stub is None:
            return all_of(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"coordinator broker {registration.leader} has no endpoint on {self.listener}",
            )
        try:
            response = await stub.AddPartitionsToTxn(
                txn_pb2.AddPartitionsToTxnRequest(
                    transactional_id=transactional_id,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    topics=_topics(partitions),
                    verify_only=True,
                ),
                timeout=self.timeout_ms / 1000,
            )
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as error:
            return all_of(
                Errors.COORDINATOR_NOT_AVAILABLE,
                f"coordinator broker {registration.leader} did not answer: {error}",
            )
        if response.error:
            return all_of(_errors(response.error), response.message)
        out: dict[TopicPartition, tuple[Errors, str]] = {}
        for result in response.results:
            for part in result.partitions:
                out[TopicPartition(result.name, part.partition)] = (
                    _errors(part.error),
                    part.message,
                )
        return out

"""The gRPC servicer of transactions (``kq.txn.TransactionService``,
proto/kqproto/txn.proto): the shape of each request checked, the ACLs of
the metadata image enforced, then the transaction coordinator (or, for
WriteTxnMarkers, this broker's partitions) asked.

ACLs as Kafka's ``KafkaApis``: Describe on the transactional id to find
its coordinator or describe it; Write on the id to add partitions or
offsets and to end a transaction, with Write on every topic added and Read
on the group whose offsets join; ClusterAction on the cluster for a
leader's verification (``verify_only``) and a coordinator's markers;
ListTransactions shows the ids the caller may describe.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.access import Caller, Permissions, broker_endpoint, caller_of
from broker.codec import error_to_proto as _pb
from broker.coordinator_runtime import CoordinatorFailure
from broker.errors import Errors
from broker.txn.api import TxnMarker
from broker.txn.types import (
    MAX_PRODUCER_EPOCH,
    MAX_TRANSACTIONAL_ID,
    TRANSACTION_VERSION,
    TopicPartition,
    TransactionState,
    by_topic,
)
from broker.txn_coordinator import TransactionCoordinator
from broker.txn_markers import TxnMarkerAppender
from kqproto import txn_pb2, txn_pb2_grpc
from metadata.acls import CLUSTER_NAME, AclOperation, AclResourceType
from metadata.authorizer import AuthorizerSettings
from metadata.image import INTERNAL_TOPICS, MetadataImage

__all__ = ["TransactionService"]

log = logging.getLogger("kq.broker.txn")

_STATES_BY_NAME = {state.kafka_name: state for state in TransactionState}


class _Invalid(Exception):
    """A malformed request: INVALID_REQUEST naming the field."""


def _check_id(transactional_id: str, field: str = "transactional_id") -> None:
    if not transactional_id:
        raise _Invalid(f"{field} is empty")
    if len(transactional_id) > MAX_TRANSACTIONAL_ID:
        raise _Invalid(
            f"{field} is {len(transactional_id)} characters long (at most {MAX_TRANSACTIONAL_ID})"
        )


def _check_producer(producer_id: int, producer_epoch: int) -> None:
    if producer_id < 0:
        raise _Invalid(f"producer_id {producer_id} is negative")
    if not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise _Invalid(f"producer_epoch {producer_epoch} is outside [0, {MAX_PRODUCER_EPOCH}]")


def _partitions(topics: Any, field: str = "topics") -> list[TopicPartition]:
    """The partitions of a request's ``TxnTopic`` list, each once."""
    out: list[TopicPartition] = []
    seen: set[TopicPartition] = set()
    for i, topic in enumerate(topics):
        if not topic.name:
            raise _Invalid(f"{field}[{i}].name is empty")
        if not topic.partitions:
            raise _Invalid(f"{field}[{i}] ({topic.name}) names no partition")
        for partition in topic.partitions:
            if partition < 0:
                raise _Invalid(f"{field}[{i}] ({topic.name}) names partition {partition}")
            tp = TopicPartition(topic.name, partition)
            if tp in seen:
                raise _Invalid(f"{field}: partition {partition} of {topic.name} is named twice")
            seen.add(tp)
            out.append(tp)
    if not out:
        raise _Invalid(f"{field} is empty")
    return out


def _results(
    found: dict[TopicPartition, tuple[Errors, str]],
) -> list[txn_pb2.TxnTopicResult]:
    out: list[txn_pb2.TxnTopicResult] = []
    for topic, numbers in by_topic(frozenset(found)).items():
        result = txn_pb2.TxnTopicResult(name=topic)
        for partition in numbers:
            error, message = found[TopicPartition(topic, partition)]
            result.partitions.add(partition=partition, error=_pb(error), message=message)
        out.append(result)
    return out


class TransactionService(txn_pb2_grpc.TransactionServiceServicer):
    def __init__(
        self,
        coordinator: TransactionCoordinator,
        markers: TxnMarkerAppender,
        *,
        listener: str = "BROKER",
        authorizer: AuthorizerSettings | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.markers = markers
        self.listener = listener
        self.authorizer = authorizer or AuthorizerSettings()
        self.permissions = Permissions(self._image, self.authorizer)
        self._may = self.permissions.may

    def _image(self) -> MetadataImage:
        return self.coordinator.replicas.image

    def _refused_id(
        self, response: Any, caller: Caller, operation: AclOperation, tid: str, method: str
    ) -> bool:
        """Whether the ACLs refuse ``operation`` on the transactional id: if
        so the response says so (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``)."""
        return self.permissions.refused(
            response,
            caller,
            operation,
            AclResourceType.TRANSACTIONAL_ID,
            tid,
            method,
            _pb(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
            f"transactional id {tid}",
        )

    def _refused_cluster(self, response: Any, caller: Caller, method: str) -> bool:
        return self.permissions.refused(
            response,
            caller,
            AclOperation.CLUSTER_ACTION,
            AclResourceType.CLUSTER,
            CLUSTER_NAME,
            method,
            _pb(Errors.CLUSTER_AUTHORIZATION_FAILED),
            "the cluster",
        )

    @staticmethod
    def _failed(response: Any, failure: CoordinatorFailure) -> Any:
        response.error, response.message = _pb(failure.code), failure.message
        return response

    @staticmethod
    def _invalid(response: Any, error: _Invalid) -> Any:
        response.error, response.message = _pb(Errors.INVALID_REQUEST), str(error)
        return response

    # -- FindCoordinator ------------------------------------------------------------------

    def _coordinator(self, tid: str) -> txn_pb2.TxnCoordinator:
        partition = self.coordinator.partition_of(tid)
        if partition is None:
            self.coordinator.ensure_topic()
            return txn_pb2.TxnCoordinator(
                transactional_id=tid,
                error=_pb(Errors.COORDINATOR_NOT_AVAILABLE),
                message=f"the topic {self.coordinator.topic_name} does not exist yet",
                node_id=-1,
                partition=-1,
            )
        image = self._image()
        topic = image.topic_by_name(self.coordinator.topic_name)
        registration = None if topic is None else topic.partition(partition)
        leader = -1 if registration is None else registration.leader
        endpoint = None if leader < 0 else broker_endpoint(image, self.listener, leader)
        if endpoint is None:
            return txn_pb2.TxnCoordinator(
                transactional_id=tid,
                error=_pb(Errors.COORDINATOR_NOT_AVAILABLE),
                message=f"{self.coordinator.topic_name}-{partition} has no leader reachable "
                f"on listener {self.listener}",
                node_id=-1,
                partition=partition,
            )
        return txn_pb2.TxnCoordinator(
            transactional_id=tid,
            node_id=leader,
            host=endpoint.host,
            port=endpoint.port,
            partition=partition,
        )

    async def FindCoordinator(
        self, request: txn_pb2.FindTxnCoordinatorRequest, context: Any
    ) -> txn_pb2.FindTxnCoordinatorResponse:
        caller = await caller_of(context)
        response = txn_pb2.FindTxnCoordinatorResponse()
        for tid in request.transactional_ids:
            try:
                _check_id(tid)
            except _Invalid as error:
                response.coordinators.add(
                    transactional_id=tid,
                    error=_pb(Errors.INVALID_REQUEST),
                    message=str(error),
                    node_id=-1,
                    partition=-1,
                )
                continue
            if not self._may(
                caller,
                AclOperation.DESCRIBE,
                AclResourceType.TRANSACTIONAL_ID,
                tid,
                "FindCoordinator",
            ):
                response.coordinators.add(
                    transactional_id=tid,
                    error=_pb(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                    message=f"{caller.describe()} is not allowed DESCRIBE on transactional id "
                    f"{tid}",
                    node_id=-1,
                    partition=-1,
                )
                continue
            response.coordinators.append(self._coordinator(tid))
        return response

    # -- AddPartitionsToTxn ---------------------------------------------------------------

    async def AddPartitionsToTxn(
        self, request: txn_pb2.AddPartitionsToTxnRequest, context: Any
    ) -> txn_pb2.AddPartitionsToTxnResponse:
        caller = await caller_of(context)
        response = txn_pb2.AddPartitionsToTxnResponse()
        try:
            _check_id(request.transactional_id)
            _check_producer(request.producer_id, request.producer_epoch)
            partitions = _partitions(request.topics)
        except _Invalid as error:
            return self._invalid(response, error)
        tid = request.transactional_id
        if request.verify_only:
            if self._refused_cluster(response, caller, "AddPartitionsToTxn"):
                return response
            try:
                found = await self.coordinator.verify_partitions(
                    tid, request.producer_id, request.producer_epoch, partitions
                )
            except CoordinatorFailure as failure:
                return self._failed(response, failure)
            response.results.extend(_results(found))
            return response
        if self._refused_id(response, caller, AclOperation.WRITE, tid, "AddPartitionsToTxn"):
            return response
        image = self._image()
        refused: dict[TopicPartition, tuple[Errors, str]] = {}
        for tp in partitions:
            if not self._may(
                caller, AclOperation.WRITE, AclResourceType.TOPIC, tp.topic, "AddPartitionsToTxn"
            ):
                refused[tp] = (
                    Errors.TOPIC_AUTHORIZATION_FAILED,
                    f"{caller.describe()} is not allowed WRITE on topic {tp.topic}",
                )
            elif tp.topic in INTERNAL_TOPICS:
                refused[tp] = (
                    Errors.INVALID_TOPIC_EXCEPTION,
                    f"{tp.topic} is internal (a group's offsets join by AddOffsetsToTxn)",
                )
            else:
                topic = image.topic_by_name(tp.topic)
                if topic is None or topic.partition(tp.partition) is None:
                    refused[tp] = (
                        Errors.UNKNOWN_TOPIC_OR_PARTITION,
                        f"topic {tp.topic!r} has no partition {tp.partition}",
                    )
        if refused:
            # Kafka's handleAddPartitionsToTxnRequest: nothing is added; the
            # partitions that were fine are OPERATION_NOT_ATTEMPTED.
            for tp in partitions:
                refused.setdefault(
                    tp,
                    (
                        Errors.OPERATION_NOT_ATTEMPTED,
                        "another partition of the request was refused",
                    ),
                )
            response.results.extend(_results(refused))
            return response
        try:
            answer = await self.coordinator.add_partitions(
                tid, request.producer_id, request.producer_epoch, partitions
            )
        except CoordinatorFailure as failure:
            return self._failed(response, failure)
        response.results.extend(_results(dict.fromkeys(partitions, (answer.error, answer.message))))
        if answer.error is not Errors.NONE:
            response.error, response.message = _pb(answer.error), answer.message
        return response

    # -- AddOffsetsToTxn ------------------------------------------------------------------

    async def AddOffsetsToTxn(
        self, request: txn_pb2.AddOffsetsToTxnRequest, context: Any
    ) -> txn_pb2.AddOffsetsToTxnResponse:
        caller = await caller_of(context)
        response = txn_pb2.AddOffsetsToTxnResponse()
        try:
            _check_id(request.transactional_id)
            _check_producer(request.producer_id, request.producer_epoch)
            _check_id(request.group_id, "group_id")
        except _Invalid as error:
            return self._invalid(response, error)
        tid = request.transactional_id
        if self._refused_id(response, caller, AclOperation.WRITE, tid, "AddOffsetsToTxn"):
            return response
        if not self._may(
            caller, AclOperation.READ, AclResourceType.GROUP, request.group_id, "AddOffsetsToTxn"
        ):
            response.error = _pb(Errors.GROUP_AUTHORIZATION_FAILED)
            response.message = (
                f"{caller.describe()} is not allowed READ on group {request.group_id}"
            )
            return response
        try:
            answer = await self.coordinator.add_offsets(
                tid, request.producer_id, request.producer_epoch, request.group_id
            )
        except CoordinatorFailure as failure:
            return self._failed(response, failure)
        response.error, response.message = _pb(answer.error), answer.message
        return response

    # -- EndTxn ---------------------------------------------------------------------------

    async def EndTxn(self, request: txn_pb2.EndTxnRequest, context: Any) -> txn_pb2.EndTxnResponse:
        caller = await caller_of(context)
        response = txn_pb2.EndTxnResponse(producer_id=-1, producer_epoch=-1)
        try:
            _check_id(request.transactional_id)
            _check_producer(request.producer_id, request.producer_epoch)
        except _Invalid as error:
            return self._invalid(response, error)
        tid = request.transactional_id
        if self._refused_id(response, caller, AclOperation.WRITE, tid, "EndTxn"):
            return response
        try:
            answer = await self.coordinator.end_txn(
                tid, request.producer_id, request.producer_epoch, request.committed
            )
        except CoordinatorFailure as failure:
            return self._failed(response, failure)
        response.error, response.message = _pb(answer.error), answer.message
        response.producer_id, response.producer_epoch = answer.producer_id, answer.producer_epoch
        return response

    # -- WriteTxnMarkers ------------------------------------------------------------------

    async def WriteTxnMarkers(
        self, request: txn_pb2.WriteTxnMarkersRequest, context: Any
    ) -> txn_pb2.WriteTxnMarkersResponse:
        caller = await caller_of(context)
        response = txn_pb2.WriteTxnMarkersResponse()
        if self._refused_cluster(response, caller, "WriteTxnMarkers"):
            return response
        try:
            plans: list[tuple[int, list[TxnMarker], int]] = []
            for i, entry in enumerate(request.markers):
                _check_producer(entry.producer_id, entry.producer_epoch)
                if entry.coordinator_epoch < 0:
                    raise _Invalid(
                        f"markers[{i}].coordinator_epoch {entry.coordinator_epoch} is negative"
                    )
                if not 0 <= entry.transaction_version <= TRANSACTION_VERSION:
                    raise _Invalid(
                        f"markers[{i}].transaction_version {entry.transaction_version} is not "
                        f"0 to {TRANSACTION_VERSION}"
                    )
                markers = [
                    TxnMarker(
                        tp.topic,
                        tp.partition,
                        entry.producer_id,
                        entry.producer_epoch,
                        entry.committed,
                        entry.transaction_version,
                    )
                    for tp in _partitions(entry.topics, f"markers[{i}].topics")
                ]
                plans.append((entry.producer_id, markers, entry.coordinator_epoch))
        except _Invalid as error:
            return self._invalid(response, error)
        for producer_id, markers, coordinator_epoch in plans:
            found = await self.markers.append(markers, coordinator_epoch)
            by_tp = {TopicPartition(topic, p): answer for (topic, p), answer in found.items()}
            response.markers.add(producer_id=producer_id, topics=_results(by_tp))
        return response

    # -- ListTransactions / DescribeTransactions ------------------------------------------

    async def ListTransactions(
        self, request: txn_pb2.ListTransactionsRequest, context: Any
    ) -> txn_pb2.ListTransactionsResponse:
        caller = await caller_of(context)
        response = txn_pb2.ListTransactionsResponse()
        states = []
        for name in request.state_filters:
            state = _STATES_BY_NAME.get(name)
            if state is None:
                response.unknown_state_filters.append(name)
            else:
                states.append(state)
        if request.state_filters and not states:
            # Every filter was unknown: nothing matches (Kafka's answer).
            return response
        now = self.coordinator.now_ms()
        for listing in self.coordinator.list_transactions(states, request.producer_id_filters):
            if request.duration_filter_ms >= 0:
                description = self._describe_here(listing.transactional_id)
                if description is None or description.start_ms < 0:
                    continue
                if now - description.start_ms < request.duration_filter_ms:
                    continue
            if self._may(
                caller,
                AclOperation.DESCRIBE,
                AclResourceType.TRANSACTIONAL_ID,
                listing.transactional_id,
                "ListTransactions",
            ):
                response.transactions.add(
                    transactional_id=listing.transactional_id,
                    producer_id=listing.producer_id,
                    state=listing.state.kafka_name,
                )
        return response

    def _describe_here(self, tid: str) -> Any:
        try:
            context = self.coordinator.context_for(tid, f"transactional id {tid!r}")
        except CoordinatorFailure:
            return None
        return context.shard.describe_transaction(tid)

    async def DescribeTransactions(
        self, request: txn_pb2.DescribeTransactionsRequest, context: Any
    ) -> txn_pb2.DescribeTransactionsResponse:
        caller = await caller_of(context)
        response = txn_pb2.DescribeTransactionsResponse()
        for tid in request.transactional_ids:
            out = response.transactions.add(
                transactional_id=tid, producer_id=-1, producer_epoch=-1, coordinator_id=-1
            )
            try:
                _check_id(tid)
            except _Invalid as error:
                out.error, out.message = _pb(Errors.INVALID_REQUEST), str(error)
                continue
            if self._refused_id(out, caller, AclOperation.DESCRIBE, tid, "DescribeTransactions"):
                continue
            try:
                found = await self.coordinator.describe_transaction(tid)
            except CoordinatorFailure as failure:
                self._failed(out, failure)
                continue
            out.error, out.message = _pb(found.error), found.message
            out.coordinator_id = self.coordinator.broker_id
            if found.state is not None:
                out.state = found.state.kafka_name
                out.producer_id, out.producer_epoch = found.producer_id, found.producer_epoch
                out.transaction_timeout_ms = found.timeout_ms
                out.transaction_start_time_ms = found.start_ms
                for topic, numbers in by_topic(found.partitions).items():
                    out.topics.add(name=topic, partitions=numbers)
        return response

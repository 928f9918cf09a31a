"""``kq.broker.BrokerService``: the broker's data plane over gRPC (asyncio),
over a :class:`~broker.replica_manager.ReplicaManager` and the broker's
current :class:`~metadata.image.MetadataImage` (Kafka's ``KafkaApis`` with
the delayed-operation purgatories of ``ReplicaManager``).

- Produce appends through the partition's leader replica; acks=all waits in
  the :class:`~broker.purgatory.Purgatory` until the replica's acks check
  says done (``DelayedProduce``), ``REQUEST_TIMED_OUT`` after
  ``timeout_ms``.
- Fetch: consumers read up to the high watermark, followers (with
  ``replica_state``) up to the log end through the leader side of the
  replica (``Partition.fetchRecords``); a long poll waits until
  ``min_bytes`` are there or ``max_wait_ms`` has passed (``DelayedFetch``),
  woken by appends and HW moves. ReplicaFetch is the same for followers, one
  stream per follower-leader pair.
- DeleteRecords raises the leader's log start, then waits until the low
  watermark (the least log start over the leader, the followers on live
  brokers and the ISR and ELR members, which follow the leader's in their
  fetch answers) reaches the offset (``DelayedDeleteRecords``), ``REQUEST_TIMED_OUT`` after
  ``timeout_ms``.
- Metadata, ListOffsets, OffsetForLeaderEpoch and InitProducerId as Kafka
  answers them.

Who calls is the verified certificate of the connection
(``quorum.driver.identity.peer_identity``), never a field: a
``replica_state.replica_id`` must be the caller's own broker id. The ACLs
are the image's, decided by :mod:`metadata.authorizer` (Write to produce,
Read to fetch, Describe for metadata and offsets, Delete to delete records,
ClusterAction to replicate, IdempotentWrite for producer ids), answered per
topic with ``TOPIC_AUTHORIZATION_FAILED``. A plaintext server has no
identities and allows everything (as the controllers with ``--insecure``).

Malformed requests are answered ``INVALID_REQUEST`` (or ``CORRUPT_MESSAGE``
for a batch that does not hold) naming the field, and change nothing.

Every Produce, Fetch and replica fetch is reported to the replica manager's
:class:`~broker.metrics.BrokerMetrics` once answered (its kind, time, errors
and the bytes of records it carried), and counted in :attr:`BrokerService.in_flight`
while it is handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.access import Caller as _Caller
from broker.access import broker_endpoint, caller_of, may
from broker.codec import answer_to_proto
from broker.codec import error_to_proto as _pb
from broker.coordinator_runtime import CoordinatorFailure
from broker.errors import Errors, ReplicaError, from_partition_log_error
from broker.fetch_session import AnswerSummary, LeaderFetchSession, SessionEntry
from broker.log_manager import broker_replica_lag_ms
from broker.metrics import BrokerMetrics, RequestKind
from broker.producer_ids import ProducerIdsError, ProducerIdSource
from broker.purgatory import Operation, Purgatory
from broker.replica import (
    AlterPartitionRequest,
    DeleteRecordsCheck,
    FetchAnswer,
    FetchRequest,
    Role,
)
from broker.replica.leader import check_current_leader_epoch, consumer_read_bound
from broker.replica.types import NO_EPOCH
from broker.replica_manager import NotLeaderError, ReplicaManager
from broker.txn.types import MAX_TRANSACTIONAL_ID
from broker.txn_coordinator import TransactionCoordinator
from broker.txn_produce import TxnVerifier, verify_produce
from kqproto import broker_pb2, broker_pb2_grpc
from metadata.acls import CLUSTER_NAME, AclOperation, AclResourceType
from metadata.authorizer import AuthorizerSettings
from metadata.image import INTERNAL_TOPICS, MetadataImage, TopicIdPartition
from metadata.records import NO_LEADER
from partition_log.batch import BatchScanner, ScanEnd, verify
from partition_log.errors import PartitionLogError
from partition_log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, PartitionLog
from quorum.driver.plugin import IdentityRole

__all__ = ["BrokerService", "ServiceSettings"]

log = logging.getLogger("kq.broker.service")

# ListOffsets' special timestamp for the record with the largest timestamp
# (ListOffsetsRequest.MAX_TIMESTAMP, KIP-734).
MAX_TIMESTAMP = -3
# Kafka's fetch.max.bytes and max.partition.fetch.bytes defaults: what a 0
# (proto3's "not set") stands for.
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
# The longest a request may ask to wait (Kafka has no cap; one keeps a
# caller from pinning a waiter for days).
MAX_WAIT_MS = 5 * 60 * 1000
# InitProducerId: an epoch past this gets a new producer id (KIP-360).
MAX_PRODUCER_EPOCH = 32767


# A fetch's topics resolved and authorized: (the topic, its name, its id,
# the refusal of all its partitions or None).
_Plan = list[tuple[broker_pb2.FetchTopic, str, str, tuple[Errors, str] | None]]


def _summary(part: broker_pb2.FetchPartitionResponse) -> AnswerSummary:
    return (
        part.high_watermark,
        part.last_stable_offset,
        part.log_start_offset,
        part.log_end_offset,
    )


def _keep_news(
    session: LeaderFetchSession,
    answered: broker_pb2.FetchResponse,
    incremental: bool,
    found: dict[TopicIdPartition, tuple[str, broker_pb2.FetchPartitionResponse]],
    unread: set[TopicIdPartition],
) -> None:
    """Keep in ``found`` the answers of one read of a session's partitions
    that its response carries (all of them for a full request, those with
    news for an incremental one; a later read of a partition replaces an
    earlier's); put in ``unread`` the partitions the byte budget left
    unread."""
    for topic in answered.topics:
        for part in topic.partitions:
            key = TopicIdPartition(topic.topic_id, part.partition)
            plain = part.error == 0 and not part.records and not part.HasField("diverging_epoch")
            unread.discard(key)
            if plain and part.log_end_offset > session.entries[key].partition.fetch_offset:
                # The budget ran out before this partition: nothing was read
                # (nor the follower's state moved).
                unread.add(key)
            if not incremental or session.is_news(key, _summary(part), plain):
                found[key] = (topic.topic, part)
            else:
                found.pop(key, None)


def _next_offset_after(records: bytes) -> int:
    """The offset after the last whole batch of ``records``."""
    last = None
    for found in BatchScanner(records, check_crc=False):
        last = found.header
    return -1 if last is None else last.next_offset


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """What the service needs beyond its replicas."""

    cluster_id: str
    # The listener whose endpoints Metadata gives out (the one clients use).
    listener: str = "BROKER"
    authorizer: AuthorizerSettings = field(default_factory=AuthorizerSettings)


class _Invalid(Exception):
    """A malformed request: answered INVALID_REQUEST naming the field."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error(code: int) -> Errors:
    try:
        return Errors(code)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


def _endpoint(
    image: MetadataImage, listener: str, broker_id: int
) -> broker_pb2.NodeEndpoint | None:
    found = broker_endpoint(image, listener, broker_id)
    if found is None:
        return None
    return broker_pb2.NodeEndpoint(
        node_id=found.node_id, host=found.host, port=found.port, rack=found.rack
    )


def _leader(leader: int, epoch: int) -> broker_pb2.CurrentLeader:
    return broker_pb2.CurrentLeader(leader_id=leader, leader_epoch=epoch)


def _epoch_or_none(epoch: int) -> int | None:
    return None if epoch == NO_EPOCH else epoch


def split_batches(records: bytes, where: str) -> list[bytes]:
    """The whole v2 batches of a produce's ``records``, each verified
    (CRC, fields, records) before any is appended: a bad one refuses the
    partition with nothing written. ``ReplicaError`` names the field."""
    if not records:
        raise ReplicaError(Errors.INVALID_REQUEST, f"{where}.records is empty")
    scanner = BatchScanner(records)
    batches = [records[b.position : b.end] for b in scanner]
    if scanner.end is not ScanEnd.COMPLETE:
        raise ReplicaError(
            Errors.CORRUPT_MESSAGE, f"{where}.records: {scanner.error or 'a partial batch'}"
        )
    if len(batches) > 1:
        # One batch is verified by the log itself; several are verified
        # here first so that a bad later one leaves the earlier unwritten.
        for index, batch in enumerate(batches):
            try:
                verify(batch)
            except PartitionLogError as error:
                raise ReplicaError(
                    from_partition_log_error(error), f"{where}.records batch {index}: {error}"
                ) from None
    return batches


class BrokerService(broker_pb2_grpc.BrokerServiceServicer):
    """The servicer. ``image()`` is the broker's current image (the one its
    replica manager applied, unless given); ``on_alter_partition`` receives
    the ISR expansions follower fetches decide (the process sends them to
    the controller); ``controller_id()`` the active controller as last heard."""

    def __init__(
        self,
        replicas: ReplicaManager,
        settings: ServiceSettings,
        *,
        image: Callable[[], MetadataImage] | None = None,
        producer_ids: ProducerIdSource | None = None,
        transactions: TransactionCoordinator | None = None,
        txn_verifier: TxnVerifier | None = None,
        on_alter_partition: Callable[[TopicIdPartition, AlterPartitionRequest], None] | None = None,
        controller_id: Callable[[], int] = lambda: -1,
        now_ms: Callable[[], int] = _now_ms,
        purgatory: Purgatory | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.replicas = replicas
        self.settings = settings
        self._image = image if image is not None else (lambda: replicas.image)
        self.producer_ids = producer_ids
        # The transaction coordinator of this broker (InitProducerId with a
        # transactional id), and who vouches for transactional produces.
        self.transactions = transactions
        self.txn_verifier = txn_verifier
        self.on_alter_partition = on_alter_partition
        self.controller_id = controller_id
        self.now_ms = now_ms
        self.purgatory = purgatory if purgatory is not None else Purgatory()
        # The replica manager's unless given: one broker, one set of metrics.
        self.metrics = metrics if metrics is not None else replicas.metrics
        # Requests being handled now, by kind (a long poll or an acks=all
        # produce counts until answered).
        self.in_flight = dict.fromkeys(RequestKind, 0)
        # Each topic's Metadata answer for the image it was built from: an
        # image is immutable, and clients ask for the same topics over and
        # over (a topic of thousands of partitions cost milliseconds to
        # build on every request).
        self._topic_answers: tuple[MetadataImage, dict[str, broker_pb2.MetadataTopic]] | None = None

    # -- for the process -----------------------------------------------------------

    def wake(self, keys: Iterable[TopicIdPartition] | None = None) -> None:
        """Partitions changed outside the service (a follower's append, a
        new image): their waiters check again; all of them with None."""
        if keys is None:
            self.purgatory.wake_all()
            return
        for key in keys:
            self.purgatory.wake(key)

    # -- metrics --------------------------------------------------------------------

    def _answered(
        self,
        kind: RequestKind,
        started: float,
        response: broker_pb2.ProduceResponse | broker_pb2.FetchResponse,
    ) -> None:
        partitions: list[Errors] = []
        size = 0
        if isinstance(response, broker_pb2.FetchResponse):
            for fetch_topic in response.topics:
                for fetched in fetch_topic.partitions:
                    partitions.append(_error(fetched.error))
                    size += len(fetched.records)
        else:
            for produce_topic in response.topics:
                partitions.extend(_error(p.error) for p in produce_topic.partitions)
        self.metrics.answered(
            kind, time.monotonic() - started, _error(response.error), partitions, size
        )

    # -- identity and ACLs ----------------------------------------------------------

    async def _caller(self, context: Any) -> _Caller:
        return await caller_of(context)

    def _may(
        self,
        image: MetadataImage,
        caller: _Caller,
        operation: AclOperation,
        resource_type: AclResourceType,
        name: str,
        method: str,
    ) -> bool:
        return may(image, self.settings.authorizer, caller, operation, resource_type, name, method)

    def _may_topic(
        self,
        image: MetadataImage,
        caller: _Caller,
        operation: AclOperation,
        name: str,
        method: str,
    ) -> bool:
        return self._may(image, caller, operation, AclResourceType.TOPIC, name, method)

    def _check_replica(
        self, image: MetadataImage, caller: _Caller, replica_id: int, method: str
    ) -> tuple[Errors, str] | None:
        """A replica's request: ClusterAction, and its replica id must be
        the caller's own broker id (a broker cannot fetch as another and
        move that one's position in the ISR)."""
        identity = caller.identity
        if identity is None:
            return None
        if identity.role is not IdentityRole.BROKER or identity.node_id != replica_id:
            return (
                Errors.CLUSTER_AUTHORIZATION_FAILED,
                f"{identity.principal} may not fetch as replica {replica_id}: the replica id "
                "must be the caller's own broker id",
            )
        if not self._may(
            image,
            caller,
            AclOperation.CLUSTER_ACTION,
            AclResourceType.CLUSTER,
            CLUSTER_NAME,
            method,
        ):
            return (
                Errors.CLUSTER_AUTHORIZATION_FAILED,
                f"{identity.principal} is not allowed CLUSTER_ACTION on the cluster",
            )
        return None

    def _endpoints(
        self, image: MetadataImage, leaders: Iterable[int]
    ) -> list[broker_pb2.NodeEndpoint]:
        found = []
        for broker_id in sorted(set(leaders)):
            if broker_id == NO_LEADER:
                continue
            endpoint = _endpoint(image, self.settings.listener, broker_id)
            if endpoint is not None:
                found.append(endpoint)
        return found

    # -- Metadata ------------------------------------------------------------------

    async def Metadata(
        self, request: broker_pb2.MetadataRequest, context: Any
    ) -> broker_pb2.MetadataResponse:
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.MetadataResponse(
            cluster_id=self.settings.cluster_id,
            controller_id=self.controller_id(),
            metadata_offset=image.offset,
        )
        for broker_id, registration in sorted(image.brokers.items()):
            if registration.fenced:
                continue
            endpoint = _endpoint(image, self.settings.listener, broker_id)
            if endpoint is not None:
                response.brokers.append(endpoint)
        if request.all_topics:
            # Kafka leaves out what the caller may not describe.
            names = sorted(t.name for t in image.topics.values())
            names = [
                n
                for n in names
                if self._may_topic(image, caller, AclOperation.DESCRIBE, n, "Metadata")
            ]
        else:
            names = list(request.topics)
        for index, name in enumerate(names):
            response.topics.append(self._metadata_topic(image, caller, name, index))
        return response

    def _metadata_topic(
        self, image: MetadataImage, caller: _Caller, name: str, index: int
    ) -> broker_pb2.MetadataTopic:
        if not name:
            return broker_pb2.MetadataTopic(
                error=_pb(Errors.INVALID_REQUEST), message=f"topics[{index}] is empty", name=name
            )
        if not self._may_topic(image, caller, AclOperation.DESCRIBE, name, "Metadata"):
            return broker_pb2.MetadataTopic(
                error=_pb(Errors.TOPIC_AUTHORIZATION_FAILED),
                message=f"{caller.describe()} is not allowed DESCRIBE on topic {name}",
                name=name,
            )
        cache = self._topic_answers
        if cache is None or cache[0] is not image:
            cache = self._topic_answers = (image, {})
        answer = cache[1].get(name)
        if answer is None:
            answer = self._metadata_topic_answer(image, name)
            if answer.error == _pb(Errors.NONE):
                # Only topics that exist: names asked for at random must not
                # grow the cache.
                cache[1][name] = answer
        return answer

    def _metadata_topic_answer(self, image: MetadataImage, name: str) -> broker_pb2.MetadataTopic:
        found = image.topic_by_name(name)
        if found is None:
            return broker_pb2.MetadataTopic(
                error=_pb(Errors.UNKNOWN_TOPIC_OR_PARTITION),
                message=f"topic {name!r} does not exist",
                name=name,
            )
        out = broker_pb2.MetadataTopic(name=name, topic_id=found.topic_id)
        for partition_id, registration in enumerate(found.partitions):
            out.partitions.append(
                broker_pb2.MetadataPartition(
                    error=_pb(
                        Errors.NONE
                        if registration.leader != NO_LEADER
                        else Errors.LEADER_NOT_AVAILABLE
                    ),
                    partition=partition_id,
                    leader_id=registration.leader,
                    leader_epoch=registration.leader_epoch,
                    replicas=registration.replicas,
                    isr=registration.isr,
                    offline_replicas=image.offline_replicas(registration),
                    elr=registration.elr,
                    last_known_elr=registration.last_known_elr,
                )
            )
        return out

    # -- Produce -------------------------------------------------------------------

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: Any
    ) -> broker_pb2.ProduceResponse:
        started = time.monotonic()
        self.in_flight[RequestKind.PRODUCE] += 1
        try:
            response = await self._produce(request, context)
        finally:
            self.in_flight[RequestKind.PRODUCE] -= 1
        self._answered(RequestKind.PRODUCE, started, response)
        return response

    async def _produce(
        self, request: broker_pb2.ProduceRequest, context: Any
    ) -> broker_pb2.ProduceResponse:
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.ProduceResponse()
        tid = request.transactional_id
        if tid and not self._may(
            image, caller, AclOperation.WRITE, AclResourceType.TRANSACTIONAL_ID, tid, "Produce"
        ):
            response.error = _pb(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            response.message = f"{caller.describe()} is not allowed WRITE on transactional id {tid}"
            return response
        if request.acks == -1 and request.timeout_ms < 0:
            response.error = _pb(Errors.INVALID_REQUEST)
            response.message = f"timeout_ms {request.timeout_ms} is negative"
            return response
        acks = request.acks
        # KIP-890 part 1: transactional batches the coordinator must vouch
        # for first (broker.txn_produce), refused before anything is written.
        txn_refused = await verify_produce(request, self.replicas, self.txn_verifier)
        # (key, topic index, partition response, last offset + 1, leader epoch)
        waiting: list[tuple[TopicIdPartition, broker_pb2.ProducePartitionResponse, int, int]] = []
        leaders: list[int] = []
        now = self.now_ms()
        seen: set[tuple[str, int]] = set()
        for t_index, topic in enumerate(request.topics):
            topic_out = response.topics.add(name=topic.name)
            allowed = bool(topic.name) and self._may_topic(
                image, caller, AclOperation.WRITE, topic.name, "Produce"
            )
            for p_index, part in enumerate(topic.partitions):
                where = f"topics[{t_index}].partitions[{p_index}]"
                out = topic_out.partitions.add(
                    partition=part.partition,
                    base_offset=-1,
                    log_append_time_ms=-1,
                    log_start_offset=-1,
                )

                def refuse(code: Errors, message: str, out: Any = out) -> None:
                    out.error, out.message = code, message

                if not topic.name:
                    refuse(Errors.INVALID_REQUEST, f"topics[{t_index}].name is empty")
                    continue
                if topic.name in INTERNAL_TOPICS:
                    # Only the group coordinator writes there, in its own
                    # record format (ReplicaManager.appendToLocalLog's
                    # "Cannot append to internal topic").
                    refuse(
                        Errors.INVALID_TOPIC_EXCEPTION,
                        f"cannot produce to the internal topic {topic.name}",
                    )
                    continue
                if acks not in (0, 1, -1):
                    refuse(
                        Errors.INVALID_REQUIRED_ACKS,
                        f"acks {acks}: must be 0, 1 or -1 (all)",
                    )
                    continue
                if not allowed:
                    refuse(
                        Errors.TOPIC_AUTHORIZATION_FAILED,
                        f"{caller.describe()} is not allowed WRITE on topic {topic.name}",
                    )
                    continue
                if part.partition < 0:
                    refuse(
                        Errors.INVALID_REQUEST, f"{where}.partition {part.partition} is negative"
                    )
                    continue
                if (topic.name, part.partition) in seen:
                    refuse(
                        Errors.INVALID_REQUEST,
                        f"{where}: partition {part.partition} of {topic.name} is named twice",
                    )
                    continue
                seen.add((topic.name, part.partition))
                unverified = txn_refused.get((topic.name, part.partition))
                if unverified is not None:
                    refuse(*unverified)
                    continue
                appended = None
                try:
                    key = self.replicas.resolve(topic.name, part.partition)
                    self.replicas.leader_replica(key)
                    batches = split_batches(part.records, where)
                    for batch in batches:
                        result = self.replicas.append(key, batch, acks, now)
                        if appended is None:
                            appended = result
                        last = result
                except NotLeaderError as error:
                    refuse(error.code, str(error.args[0]))
                    out.current_leader.CopyFrom(
                        _leader(error.current_leader, error.current_leader_epoch)
                    )
                    leaders.append(error.current_leader)
                    continue
                except ReplicaError as error:
                    message = str(error.args[0])
                    if appended is not None:
                        # A later batch refused by the producer state after
                        # earlier ones went in: say so (an unknown outcome).
                        self.purgatory.wake(key)
                        message = (
                            f"{message} (after the batches from offset "
                            f"{appended.info.first_offset} to {last.info.last_offset} were "
                            "appended)"
                        )
                    refuse(error.code, message)
                    continue
                assert appended is not None
                self.purgatory.wake(key)
                log_ = self.replicas.logs.log(key)
                if acks != 0:
                    out.base_offset = appended.info.first_offset
                    out.log_append_time_ms = appended.info.log_append_time
                    out.log_start_offset = -1 if log_ is None else log_.log_start_offset
                if acks == -1:
                    waiting.append((key, out, last.info.last_offset + 1, last.leader_epoch))
        if waiting:
            await self._await_acks(waiting, request.timeout_ms, leaders)
        response.node_endpoints.extend(self._endpoints(image, leaders))
        return response

    async def _await_acks(
        self,
        waiting: list[tuple[TopicIdPartition, broker_pb2.ProducePartitionResponse, int, int]],
        timeout_ms: int,
        leaders: list[int],
    ) -> None:
        """``DelayedProduce``: done when every partition's acks check is."""
        pending = {id(out): (key, out, end, epoch) for key, out, end, epoch in waiting}

        def check() -> bool | None:
            for ident, (key, out, end, epoch) in list(pending.items()):
                replica = self.replicas.replicas.get(key)
                if replica is None or replica.role is not Role.LEADER:
                    result_error = Errors.NOT_LEADER_OR_FOLLOWER
                else:
                    result = replica.check_enough_replicas_reach_offset(end, epoch)
                    if not result.done:
                        continue
                    result_error = result.error
                if result_error is not Errors.NONE:
                    out.error = _pb(result_error)
                    out.message = (
                        f"records up to offset {end - 1} of leader epoch {epoch}: "
                        f"{result_error.name}"
                    )
                    if result_error is Errors.NOT_LEADER_OR_FOLLOWER:
                        registration = self._image().partition(key.topic_id, key.partition)
                        if registration is not None:
                            out.current_leader.CopyFrom(
                                _leader(registration.leader, registration.leader_epoch)
                            )
                            leaders.append(registration.leader)
                del pending[ident]
            return True if not pending else None

        done = await self.purgatory.wait_until(
            {key for key, _, _, _ in pending.values()},
            check,
            min(timeout_ms, MAX_WAIT_MS) / 1000,
            operation=Operation.PRODUCE,
        )
        if done is None:
            for _key, out, end, _epoch in pending.values():
                out.error = _pb(Errors.REQUEST_TIMED_OUT)
                out.message = (
                    f"the ISR did not reach offset {end} within {timeout_ms} ms (the records "
                    "are in the leader's log: the outcome is unknown)"
                )

    # -- Fetch ---------------------------------------------------------------------

    async def Fetch(
        self, request: broker_pb2.FetchRequest, context: Any
    ) -> broker_pb2.FetchResponse:
        started = time.monotonic()
        kind = (
            RequestKind.FETCH_FOLLOWER if request.HasField("replica_state") else RequestKind.FETCH
        )
        self.in_flight[kind] += 1
        try:
            caller = await self._caller(context)
            response = await self._fetch(request, caller, "Fetch")
        finally:
            self.in_flight[kind] -= 1
        self._answered(kind, started, response)
        return response

    async def ReplicaFetch(
        self, request_iterator: AsyncIterator[broker_pb2.FetchRequest], context: Any
    ) -> AsyncIterator[broker_pb2.FetchResponse]:
        caller = await self._caller(context)
        kind = RequestKind.FETCH_FOLLOWER
        # The stream is the follower's fetch session (broker.fetch_session).
        woken = asyncio.Event()
        session = LeaderFetchSession(on_woken=woken.set)
        self.purgatory.watch(session)
        try:
            async for request in request_iterator:
                started = time.monotonic()
                if not request.HasField("replica_state"):
                    response = broker_pb2.FetchResponse(
                        error=_pb(Errors.INVALID_REQUEST),
                        message="replica_state is required on ReplicaFetch",
                    )
                else:
                    self.in_flight[kind] += 1
                    try:
                        response = await self._session_fetch(request, caller, session, woken)
                    finally:
                        self.in_flight[kind] -= 1
                self._answered(kind, started, response)
                yield response
        finally:
            self.purgatory.unwatch(session)

    def _check_fetch(self, request: broker_pb2.FetchRequest) -> None:
        for t_index, forgotten in enumerate(request.forgotten):
            if not request.incremental:
                raise _Invalid("forgotten partitions need an incremental fetch")
            if not forgotten.topic_id:
                raise _Invalid(f"forgotten[{t_index}].topic_id is empty")
            for p_index, partition in enumerate(forgotten.partitions):
                if partition < 0:
                    raise _Invalid(
                        f"forgotten[{t_index}].partitions[{p_index}] {partition} is negative"
                    )
        for name in ("max_wait_ms", "min_bytes", "max_bytes"):
            value = getattr(request, name)
            if value < 0:
                raise _Invalid(f"{name} {value} is negative")
        if request.HasField("replica_state") and request.replica_state.replica_id < 0:
            raise _Invalid(
                f"replica_state.replica_id {request.replica_state.replica_id} is negative"
            )
        for t_index, topic in enumerate(request.topics):
            if not topic.topic and not topic.topic_id:
                raise _Invalid(f"topics[{t_index}] names neither a topic nor a topic id")
            for p_index, part in enumerate(topic.partitions):
                where = f"topics[{t_index}].partitions[{p_index}]"
                if part.partition < 0:
                    raise _Invalid(f"{where}.partition {part.partition} is negative")
                if part.fetch_offset < 0:
                    raise _Invalid(f"{where}.fetch_offset {part.fetch_offset} is negative")
                if part.partition_max_bytes < 0:
                    raise _Invalid(
                        f"{where}.partition_max_bytes {part.partition_max_bytes} is negative"
                    )
                if part.current_leader_epoch < NO_EPOCH or part.last_fetched_epoch < NO_EPOCH:
                    raise _Invalid(f"{where}: an epoch below -1")

    def _resolve_topic(
        self, image: MetadataImage, topic: broker_pb2.FetchTopic
    ) -> tuple[str, str] | tuple[Errors, str]:
        """(name, topic id), or (error, why)."""
        if topic.topic:
            found = image.topic_by_name(topic.topic)
            if found is None:
                if topic.topic_id and topic.topic_id not in image.topics:
                    return Errors.UNKNOWN_TOPIC_ID, f"topic id {topic.topic_id} does not exist"
                return Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic.topic!r} does not exist"
            if topic.topic_id and topic.topic_id != found.topic_id:
                return (
                    Errors.INCONSISTENT_TOPIC_ID,
                    f"topic {topic.topic!r} has id {found.topic_id}, not {topic.topic_id}",
                )
            return found.name, found.topic_id
        by_id = image.topics.get(topic.topic_id)
        if by_id is None:
            return Errors.UNKNOWN_TOPIC_ID, f"topic id {topic.topic_id} does not exist"
        return by_id.name, by_id.topic_id

    def _refused_fetch(
        self, image: MetadataImage, request: broker_pb2.FetchRequest, caller: _Caller, method: str
    ) -> broker_pb2.FetchResponse | None:
        """The answer to a fetch refused as a whole (malformed, or a replica's
        fetch its caller may not make), else None."""
        try:
            self._check_fetch(request)
        except _Invalid as error:
            return broker_pb2.FetchResponse(error=_pb(Errors.INVALID_REQUEST), message=str(error))
        if request.HasField("replica_state"):
            refused = self._check_replica(image, caller, request.replica_state.replica_id, method)
            if refused is not None:
                return broker_pb2.FetchResponse(error=_pb(refused[0]), message=refused[1])
        return None

    def _fetch_plan(
        self, image: MetadataImage, request: broker_pb2.FetchRequest, caller: _Caller, method: str
    ) -> _Plan:
        """Each topic of a fetch resolved and authorized once: (the topic,
        its name, its id, the refusal of all its partitions or None)."""
        follower = request.HasField("replica_state")
        plan: _Plan = []
        for topic in request.topics:
            resolved = self._resolve_topic(image, topic)
            if isinstance(resolved[0], Errors):
                plan.append((topic, topic.topic, topic.topic_id, (resolved[0], str(resolved[1]))))
                continue
            name, topic_id = str(resolved[0]), resolved[1]
            if not follower and not self._may_topic(image, caller, AclOperation.READ, name, method):
                why = f"{caller.describe()} is not allowed READ on topic {name}"
                plan.append((topic, name, topic_id, (Errors.TOPIC_AUTHORIZATION_FAILED, why)))
                continue
            plan.append((topic, name, topic_id, None))
        return plan

    async def _fetch(
        self, request: broker_pb2.FetchRequest, caller: _Caller, method: str
    ) -> broker_pb2.FetchResponse:
        image = self._image()
        if request.incremental:
            return broker_pb2.FetchResponse(
                error=_pb(Errors.INVALID_REQUEST),
                message="incremental is only for a ReplicaFetch stream (its fetch session)",
            )
        refused = self._refused_fetch(image, request, caller, method)
        if refused is not None:
            return refused
        follower = request.HasField("replica_state")
        plan = self._fetch_plan(image, request, caller, method)
        keys = [
            TopicIdPartition(topic_id, part.partition)
            for topic, _, topic_id, refusal in plan
            if refusal is None
            for part in topic.partitions
        ]
        max_wait_ms = min(request.max_wait_ms, MAX_WAIT_MS)

        def attempt(final: bool) -> broker_pb2.FetchResponse | None:
            response, size, errors = self._fetch_once(request, plan, follower, image)
            if final or errors or size >= request.min_bytes or max_wait_ms == 0 or not keys:
                return response
            return None

        answered = attempt(False)
        if answered is None:
            answered = await self.purgatory.wait_until(
                keys, lambda: attempt(False), max_wait_ms / 1000, operation=Operation.FETCH
            )
        if answered is None:
            answered = attempt(True)
        assert answered is not None
        return answered

    async def _session_fetch(
        self,
        request: broker_pb2.FetchRequest,
        caller: _Caller,
        session: LeaderFetchSession,
        woken: asyncio.Event,
    ) -> broker_pb2.FetchResponse:
        """A follower's fetch on its stream (:mod:`broker.fetch_session`): a
        full request starts the session and is answered for every
        partition; an incremental one updates it and is answered for the
        partitions with news, reading only those listed or woken. Each
        partition read is the same read as a plain fetch's
        (:meth:`_fetch_once`), so the replica's state moves as it would."""
        image = self._image()
        refused = self._refused_fetch(image, request, caller, "ReplicaFetch")
        if refused is not None:
            return refused
        if request.incremental and not session.started:
            return broker_pb2.FetchResponse(
                error=_pb(Errors.INVALID_REQUEST),
                message="an incremental fetch before the stream's first full one",
            )
        out = broker_pb2.FetchResponse()
        listed: dict[TopicIdPartition, SessionEntry] = {}
        for topic, name, topic_id, refusal in self._fetch_plan(
            image, request, caller, "ReplicaFetch"
        ):
            if refusal is not None:
                refused_answer = FetchAnswer(refusal[0], message=refusal[1])
                out.topics.add(topic=name, topic_id=topic_id).partitions.extend(
                    answer_to_proto(part.partition, refused_answer) for part in topic.partitions
                )
                continue
            for part in topic.partitions:
                listed[TopicIdPartition(topic_id, part.partition)] = SessionEntry(
                    name, topic_id, part
                )
        if request.incremental:
            session.update(
                listed,
                [
                    TopicIdPartition(forgotten.topic_id, partition)
                    for forgotten in request.forgotten
                    for partition in forgotten.partitions
                ],
            )
        else:
            session.start(listed)
        lag_ms = broker_replica_lag_ms(image, self.replicas.broker_id)
        loop = asyncio.get_running_loop()
        max_wait_ms = min(request.max_wait_ms, MAX_WAIT_MS)
        deadline = loop.time() + max_wait_ms / 1000
        budget = request.max_bytes or DEFAULT_FETCH_MAX_BYTES
        found: dict[TopicIdPartition, tuple[str, broker_pb2.FetchPartitionResponse]] = {}
        unread: set[TopicIdPartition] = set()
        endpoints: dict[int, broker_pb2.NodeEndpoint] = {}
        size = 0
        errors = bool(out.topics)
        while True:
            woken.clear()
            keys = session.take_reads(self.now_ms(), lag_ms)
            if keys:
                image = self._image()
                part_request = broker_pb2.FetchRequest(
                    replica_state=request.replica_state,
                    max_bytes=max(1, budget - size),
                )
                plan = self._session_plan(session, keys, part_request)
                answered, got, failed = self._fetch_once(part_request, plan, True, image)
                size += got
                errors = errors or failed
                for endpoint in answered.node_endpoints:
                    endpoints[endpoint.node_id] = endpoint
                _keep_news(session, answered, request.incremental, found, unread)
            remaining = deadline - loop.time()
            if errors or size >= request.min_bytes or remaining <= 0 or not session.entries:
                break
            if not session.has_reads:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), remaining)
        by_topic: dict[str, broker_pb2.FetchTopicResponse] = {}
        for key, (name, answer) in sorted(found.items()):
            answer_topic = by_topic.get(key.topic_id)
            if answer_topic is None:
                answer_topic = by_topic[key.topic_id] = out.topics.add(
                    topic=name, topic_id=key.topic_id
                )
            answer_topic.partitions.append(answer)
            session.told(key, _summary(answer))
        session.read_again(unread)
        out.node_endpoints.extend(endpoints[node] for node in sorted(endpoints))
        return out

    def _session_plan(
        self,
        session: LeaderFetchSession,
        keys: list[TopicIdPartition],
        request: broker_pb2.FetchRequest,
    ) -> _Plan:
        """``keys`` of the session as a fetch's topics, added to
        ``request``: the plan :meth:`_fetch_once` reads."""
        plan: _Plan = []
        topics: dict[str, broker_pb2.FetchTopic] = {}
        for key in keys:
            entry = session.entries[key]
            topic = topics.get(key.topic_id)
            if topic is None:
                topic = topics[key.topic_id] = request.topics.add(
                    topic=entry.topic, topic_id=entry.topic_id
                )
                plan.append((topic, entry.topic, entry.topic_id, None))
            topic.partitions.append(entry.partition)
        return plan

    def _fetch_once(
        self,
        request: broker_pb2.FetchRequest,
        plan: _Plan,
        follower: bool,
        image: MetadataImage,
    ) -> tuple[broker_pb2.FetchResponse, int, bool]:
        """One read of every partition: (the answer, its bytes, whether a
        partition was answered an error or a divergence, which answers at
        once)."""
        response = broker_pb2.FetchResponse()
        budget = request.max_bytes or DEFAULT_FETCH_MAX_BYTES
        size = 0
        errors = False
        leaders: list[int] = []
        now = self.now_ms()
        for topic, name, topic_id, refusal in plan:
            topic_out = response.topics.add(topic=name, topic_id=topic_id)
            for part in topic.partitions:
                if refusal is not None:
                    topic_out.partitions.append(
                        answer_to_proto(part.partition, FetchAnswer(refusal[0], message=refusal[1]))
                    )
                    errors = True
                    continue
                key = TopicIdPartition(topic_id, part.partition)
                # At least one batch: the first partition with data may go
                # past the budget; after that, none is read
                # (FetchRequest v3, KIP-74).
                limit = min(part.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES, budget - size)
                if follower:
                    answer = self._follower_read(request, key, part, limit, now)
                else:
                    answer = self._consumer_read(
                        key,
                        part,
                        max(limit, 1),
                        size == 0 or limit > 0,
                        request.isolation_level == broker_pb2.READ_COMMITTED,
                    )
                if answer.diverging_epoch is not None:
                    # The follower must truncate before anything else:
                    # answered at once (DelayedFetch.tryComplete).
                    errors = True
                if answer.error is not Errors.NONE:
                    errors = True
                    if answer.current_leader != -1:
                        leaders.append(answer.current_leader)
                size += len(answer.records)
                topic_out.partitions.append(answer_to_proto(part.partition, answer))
        response.node_endpoints.extend(self._endpoints(image, leaders))
        return response, size, errors

    def _follower_read(
        self,
        request: broker_pb2.FetchRequest,
        key: TopicIdPartition,
        part: broker_pb2.FetchPartition,
        limit: int,
        now: int,
    ) -> FetchAnswer:
        if limit <= 0:
            # Out of budget: nothing read, and the follower's state is left
            # as it was (its next fetch reads this partition).
            replica = self.replicas.replicas.get(key)
            if replica is None or replica.role is not Role.LEADER:
                return self._not_leader_answer(key)
            log_ = replica.log
            return FetchAnswer(
                Errors.NONE,
                log_.high_watermark,
                log_.log_start_offset,
                log_.log_end_offset,
                current_leader=replica.leader_id,
                current_leader_epoch=replica.leader_epoch,
            )
        state = request.replica_state
        outcome = self.replicas.step_fetch(
            key,
            FetchRequest(
                replica_id=state.replica_id,
                replica_epoch=state.replica_epoch,
                current_leader_epoch=_epoch_or_none(part.current_leader_epoch),
                fetch_offset=part.fetch_offset,
                last_fetched_epoch=part.last_fetched_epoch,
                log_start_offset=part.log_start_offset,
                max_bytes=limit,
            ),
            now,
        )
        if outcome.alter_partition is not None and self.on_alter_partition is not None:
            self.on_alter_partition(key, outcome.alter_partition)
        if outcome.high_watermark_moved or outcome.low_watermark_moved:
            # Delayed acks=all produces and consumers' long polls (the HW),
            # delayed DeleteRecords (the low watermark).
            self.purgatory.wake(key)
        return outcome.answer

    def _not_leader_answer(self, key: TopicIdPartition) -> FetchAnswer:
        try:
            self.replicas.leader_replica(key)
        except NotLeaderError as error:
            return FetchAnswer(
                error.code,
                current_leader=error.current_leader,
                current_leader_epoch=error.current_leader_epoch,
                message=str(error.args[0]),
            )
        return FetchAnswer(Errors.NOT_LEADER_OR_FOLLOWER)

    def _leader_log(
        self, key: TopicIdPartition, current_leader_epoch: int
    ) -> tuple[PartitionLog, int, int] | FetchAnswer:
        """The leader's log and (leader, epoch), or the refusal."""
        try:
            replica = self.replicas.leader_replica(key)
        except NotLeaderError as error:
            return FetchAnswer(
                error.code,
                current_leader=error.current_leader,
                current_leader_epoch=error.current_leader_epoch,
                message=str(error.args[0]),
            )
        epoch_error = check_current_leader_epoch(
            _epoch_or_none(current_leader_epoch), replica.leader_epoch
        )
        if epoch_error is not Errors.NONE:
            return FetchAnswer(
                epoch_error,
                current_leader=replica.leader_id,
                current_leader_epoch=replica.leader_epoch,
                message=f"current leader epoch {current_leader_epoch}, the partition's is "
                f"{replica.leader_epoch}",
            )
        log_ = self.replicas.logs.log(key)
        if log_ is None:
            return FetchAnswer(Errors.NOT_LEADER_OR_FOLLOWER, message="the log is not open")
        return log_, replica.leader_id, replica.leader_epoch

    def _consumer_read(
        self,
        key: TopicIdPartition,
        part: broker_pb2.FetchPartition,
        limit: int,
        read: bool,
        committed: bool = False,
    ) -> FetchAnswer:
        """A consumer's read of one partition: below the high watermark, or
        with ``committed`` (READ_COMMITTED) below the last stable offset,
        with the aborted transactions that overlap what it returns
        (``UnifiedLog.read`` with ``FetchIsolation.TXN_COMMITTED`` and
        ``collectAbortedTransactions``): the consumer drops their batches
        itself, so the broker still moves batches as bytes."""
        found = self._leader_log(key, part.current_leader_epoch)
        if isinstance(found, FetchAnswer):
            return found
        log_, leader, epoch = found
        high_watermark = log_.high_watermark
        stable = log_.last_stable_offset if committed else -1
        records = b""
        aborted: tuple[tuple[int, int], ...] = ()
        start, end = log_.log_start_offset, log_.log_end_offset
        if not start <= part.fetch_offset <= end:
            return FetchAnswer(
                Errors.OFFSET_OUT_OF_RANGE,
                high_watermark,
                start,
                end,
                current_leader=leader,
                current_leader_epoch=epoch,
                message=f"fetch_offset {part.fetch_offset} is outside the log's range "
                f"[{start}, {end}]",
                last_stable_offset=stable,
            )
        if read:
            try:
                # Consumers read only below the high watermark (or the LSO).
                bound = consumer_read_bound(high_watermark, end)
                if committed:
                    bound = min(bound, stable)
                records = log_.read(part.fetch_offset, limit, max_offset=bound)
                if committed and records:
                    upper = _next_offset_after(records)
                    aborted = tuple(
                        (txn.producer_id, txn.first_offset)
                        for txn in log_.collect_aborted_transactions(part.fetch_offset, upper)
                    )
            except PartitionLogError as error:
                return FetchAnswer(
                    from_partition_log_error(error),
                    high_watermark,
                    start,
                    end,
                    current_leader=leader,
                    current_leader_epoch=epoch,
                    message=str(error.args[0]),
                    last_stable_offset=stable,
                )
        return FetchAnswer(
            Errors.NONE,
            high_watermark,
            log_.log_start_offset,
            log_.log_end_offset,
            records=records,
            current_leader=leader,
            current_leader_epoch=epoch,
            last_stable_offset=stable,
            aborted_transactions=aborted,
        )

    # -- ListOffsets ---------------------------------------------------------------

    async def ListOffsets(
        self, request: broker_pb2.ListOffsetsRequest, context: Any
    ) -> broker_pb2.ListOffsetsResponse:
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.ListOffsetsResponse()
        for t_index, topic in enumerate(request.topics):
            topic_out = response.topics.add(name=topic.name)
            allowed = bool(topic.name) and self._may_topic(
                image, caller, AclOperation.DESCRIBE, topic.name, "ListOffsets"
            )
            for p_index, part in enumerate(topic.partitions):
                out = topic_out.partitions.add(
                    partition=part.partition, timestamp=-1, offset=-1, leader_epoch=NO_EPOCH
                )
                where = f"topics[{t_index}].partitions[{p_index}]"
                if not topic.name:
                    out.error, out.message = (
                        _pb(Errors.INVALID_REQUEST),
                        f"topics[{t_index}].name is empty",
                    )
                elif not allowed:
                    out.error = _pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                    out.message = (
                        f"{caller.describe()} is not allowed DESCRIBE on topic {topic.name}"
                    )
                elif part.timestamp < MAX_TIMESTAMP:
                    out.error = _pb(Errors.INVALID_REQUEST)
                    out.message = f"{where}.timestamp {part.timestamp} is not a time, -1, -2 or -3"
                else:
                    committed = request.isolation_level == broker_pb2.READ_COMMITTED
                    self._list_offset(topic.name, part, out, committed)
        return response

    def _list_offset(
        self,
        name: str,
        part: broker_pb2.ListOffsetsPartition,
        out: broker_pb2.ListOffsetsPartitionResponse,
        committed: bool = False,
    ) -> None:
        """One partition's offset; ``committed`` (READ_COMMITTED) bounds
        "latest" and timestamp lookups by the last stable offset instead of
        the high watermark (``UnifiedLog.fetchOffsetByTimestamp`` with the
        isolation's fetchable end)."""
        try:
            key = self.replicas.resolve(name, part.partition)
        except NotLeaderError as error:
            out.error, out.message = _pb(error.code), str(error.args[0])
            return
        found = self._leader_log(key, part.current_leader_epoch)
        if isinstance(found, FetchAnswer):
            out.error, out.message = _pb(found.error), found.message
            out.current_leader.CopyFrom(_leader(found.current_leader, found.current_leader_epoch))
            return
        log_, leader, epoch = found
        cache = log_.epoch_cache
        if part.timestamp == EARLIEST_TIMESTAMP:
            out.offset = log_.log_start_offset
            out.leader_epoch = cache.epoch_for_offset(out.offset)
        elif part.timestamp == LATEST_TIMESTAMP:
            try:
                out.offset = self.replicas.leader_replica(key).latest_offset()
            except ReplicaError as error:
                out.error, out.message = _pb(error.code), str(error.args[0])
                out.current_leader.CopyFrom(_leader(leader, epoch))
                return
            if committed:
                out.offset = min(out.offset, log_.last_stable_offset)
            out.leader_epoch = cache.epoch_for_offset(out.offset - 1) if out.offset else NO_EPOCH
        else:
            timestamp = part.timestamp
            if timestamp == MAX_TIMESTAMP:
                # KIP-734: the first record with the largest timestamp, found
                # as the first at or past the segments' largest.
                start = log_.log_start_offset
                timestamp = max(
                    (s.max_timestamp for s in log_.segments if s.next_offset > start),
                    default=-1,
                )
                if timestamp < 0:
                    return
            hit = log_.offset_for_timestamp(timestamp)
            # A consumer is told only of records below the high watermark
            # (UnifiedLog.fetchOffsetByTimestamp with the fetchable end).
            end = log_.last_stable_offset if committed else log_.high_watermark
            if hit is not None and hit[0] < end:
                out.offset, out.timestamp = hit
                out.leader_epoch = cache.epoch_for_offset(hit[0])

    # -- OffsetForLeaderEpoch -------------------------------------------------------

    async def OffsetForLeaderEpoch(
        self, request: broker_pb2.OffsetForLeaderEpochRequest, context: Any
    ) -> broker_pb2.OffsetForLeaderEpochResponse:
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.OffsetForLeaderEpochResponse()
        replica = request.replica_id != -1
        if replica:
            if request.replica_id < 0:
                response.error = _pb(Errors.INVALID_REQUEST)
                response.message = f"replica_id {request.replica_id} is neither -1 nor a broker id"
                return response
            refused = self._check_replica(image, caller, request.replica_id, "OffsetForLeaderEpoch")
            if refused is not None:
                response.error, response.message = _pb(refused[0]), refused[1]
                return response
        for topic in request.topics:
            topic_out = response.topics.add(topic=topic.topic)
            allowed = replica or self._may_topic(
                image, caller, AclOperation.DESCRIBE, topic.topic, "OffsetForLeaderEpoch"
            )
            for part in topic.partitions:
                out = topic_out.partitions.add(
                    partition=part.partition, leader_epoch=NO_EPOCH, end_offset=-1
                )
                if not allowed:
                    out.error = _pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                    out.message = (
                        f"{caller.describe()} is not allowed DESCRIBE on topic {topic.topic}"
                    )
                    continue
                try:
                    key = self.replicas.resolve(topic.topic, part.partition)
                except NotLeaderError as error:
                    out.error, out.message = _pb(error.code), str(error.args[0])
                    continue
                found = self._leader_log(key, part.current_leader_epoch)
                if isinstance(found, FetchAnswer):
                    out.error, out.message = _pb(found.error), found.message
                    out.current_leader.CopyFrom(
                        _leader(found.current_leader, found.current_leader_epoch)
                    )
                    continue
                log_ = found[0]
                end = log_.epoch_cache.end_offset_for_epoch(part.leader_epoch, log_.log_end_offset)
                out.leader_epoch, out.end_offset = end.epoch, end.end_offset
        return response

    # -- DeleteRecords --------------------------------------------------------------

    async def DeleteRecords(
        self, request: broker_pb2.DeleteRecordsRequest, context: Any
    ) -> broker_pb2.DeleteRecordsResponse:
        """``ReplicaManager.deleteRecords``: each partition's leader raises its
        own log start (never above its HW: ``OFFSET_OUT_OF_RANGE``), then the
        request waits until every moved partition's low watermark (the least
        log start over the leader, the followers on live brokers and the
        ISR and ELR members, which follow the leader's in their fetch
        answers) reached its offset
        (``DelayedDeleteRecords``), or answers those still short
        ``REQUEST_TIMED_OUT`` after ``timeout_ms`` (the leader's records are
        gone; the followers' follow in their next fetches)."""
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.DeleteRecordsResponse()
        if request.timeout_ms < 0:
            response.error = _pb(Errors.INVALID_REQUEST)
            response.message = f"timeout_ms {request.timeout_ms} is negative"
            return response
        now = self.now_ms()
        # (key, partition answer, the offset the low watermark must reach)
        waiting: list[tuple[TopicIdPartition, broker_pb2.DeleteRecordsPartitionResponse, int]] = []
        for topic in request.topics:
            topic_out = response.topics.add(name=topic.name)
            allowed = bool(topic.name) and self._may_topic(
                image, caller, AclOperation.DELETE, topic.name, "DeleteRecords"
            )
            for part in topic.partitions:
                out = topic_out.partitions.add(partition=part.partition, low_watermark=-1)
                if not allowed:
                    out.error = _pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                    out.message = f"{caller.describe()} is not allowed DELETE on topic {topic.name}"
                    continue
                if part.offset < -1:
                    out.error = _pb(Errors.INVALID_REQUEST)
                    out.message = f"offset {part.offset} is neither -1 nor an offset"
                    continue
                try:
                    key = self.replicas.resolve(topic.name, part.partition)
                    result = self.replicas.leader_replica(key).delete_records(part.offset, now)
                except ReplicaError as error:
                    out.error, out.message = _pb(error.code), str(error.args[0])
                    continue
                out.low_watermark = result.low_watermark
                # The leader's log start moved: consumers' long polls below
                # it answer OFFSET_OUT_OF_RANGE now.
                self.purgatory.wake(key)
                waiting.append((key, out, result.requested_offset))
        if waiting:
            await self._await_low_watermarks(waiting, request.timeout_ms)
        return response

    # -- DescribeProducers -----------------------------------------------------------

    async def DescribeProducers(
        self, request: broker_pb2.DescribeProducersRequest, context: Any
    ) -> broker_pb2.DescribeProducersResponse:
        """``ReplicaManager.activeProducerState`` (KIP-664): each partition's
        producers as its leader's log has them, with the first offset of
        each one's open transaction; Read on the topic."""
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.DescribeProducersResponse()
        for topic in request.topics:
            topic_out = response.topics.add(name=topic.name)
            allowed = bool(topic.name) and self._may_topic(
                image, caller, AclOperation.READ, topic.name, "DescribeProducers"
            )
            for partition in topic.partitions:
                out = topic_out.partitions.add(partition=partition)
                if not topic.name:
                    out.error, out.message = _pb(Errors.INVALID_REQUEST), "topic name is empty"
                    continue
                if not allowed:
                    out.error = _pb(Errors.TOPIC_AUTHORIZATION_FAILED)
                    out.message = f"{caller.describe()} is not allowed READ on topic {topic.name}"
                    continue
                try:
                    key = self.replicas.resolve(topic.name, partition)
                    self.replicas.leader_replica(key)
                except NotLeaderError as error:
                    out.error, out.message = _pb(error.code), str(error.args[0])
                    out.current_leader.CopyFrom(
                        _leader(error.current_leader, error.current_leader_epoch)
                    )
                    continue
                log_ = self.replicas.logs.log(key)
                if log_ is None:
                    out.error = _pb(Errors.NOT_LEADER_OR_FOLLOWER)
                    out.message = "the log is not open"
                    continue
                for entry in sorted(
                    log_.producer_state.producers.values(), key=lambda e: e.producer_id
                ):
                    out.active_producers.add(
                        producer_id=entry.producer_id,
                        producer_epoch=entry.epoch,
                        last_sequence=entry.last_seq,
                        last_timestamp=entry.last_timestamp,
                        coordinator_epoch=entry.coordinator_epoch,
                        current_txn_start_offset=entry.current_txn_first_offset,
                    )
        return response

    async def _await_low_watermarks(
        self,
        waiting: list[tuple[TopicIdPartition, broker_pb2.DeleteRecordsPartitionResponse, int]],
        timeout_ms: int,
    ) -> None:
        """``DelayedDeleteRecords``: done when every partition's low
        watermark reached its offset, or it is no longer led here
        (``NOT_LEADER_OR_FOLLOWER``); woken by follower fetches that raise a
        low watermark and by new images (a fenced broker's replica out of
        the ISR and ELR is no longer waited for)."""
        pending = {id(out): (key, out, offset) for key, out, offset in waiting}

        def check() -> bool | None:
            for ident, (key, out, offset) in list(pending.items()):
                replica = self.replicas.replicas.get(key)
                if replica is None:
                    result = DeleteRecordsCheck(True, error=Errors.NOT_LEADER_OR_FOLLOWER)
                else:
                    result = replica.check_delete_records(offset)
                if not result.done:
                    continue
                out.low_watermark = result.low_watermark
                if result.error is not Errors.NONE:
                    out.error = _pb(result.error)
                    out.message = (
                        f"the leadership moved before the followers' log starts reached "
                        f"{offset}: {result.error.name}"
                    )
                del pending[ident]
            return True if not pending else None

        done = await self.purgatory.wait_until(
            {key for key, _, _ in pending.values()},
            check,
            min(timeout_ms, MAX_WAIT_MS) / 1000,
            operation=Operation.DELETE_RECORDS,
        )
        if done is None:
            for _key, out, offset in pending.values():
                out.error = _pb(Errors.REQUEST_TIMED_OUT)
                out.message = (
                    f"the low watermark did not reach {offset} within {timeout_ms} ms (the "
                    "leader's log starts there; a follower that has not fetched since still "
                    "holds the records)"
                )

    # -- InitProducerId -------------------------------------------------------------

    async def _init_transactional_producer(
        self,
        request: broker_pb2.InitProducerIdRequest,
        caller: _Caller,
        image: MetadataImage,
        response: broker_pb2.InitProducerIdResponse,
    ) -> broker_pb2.InitProducerIdResponse:
        """InitProducerId with a transactional id: its coordinator's
        (``TransactionCoordinator.handleInitProducerId``), Write on the id."""
        tid = request.transactional_id
        if len(tid) > MAX_TRANSACTIONAL_ID:
            response.error = _pb(Errors.INVALID_REQUEST)
            response.message = (
                f"transactional_id is {len(tid)} characters long (at most {MAX_TRANSACTIONAL_ID})"
            )
            return response
        if not self._may(
            image,
            caller,
            AclOperation.WRITE,
            AclResourceType.TRANSACTIONAL_ID,
            tid,
            "InitProducerId",
        ):
            response.error = _pb(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            response.message = f"{caller.describe()} is not allowed WRITE on transactional id {tid}"
            return response
        if self.transactions is None:
            response.error = _pb(Errors.COORDINATOR_NOT_AVAILABLE)
            response.message = "this broker runs no transaction coordinator"
            return response
        try:
            answer = await self.transactions.init_producer_id(
                tid, request.transaction_timeout_ms, request.producer_id, request.producer_epoch
            )
        except CoordinatorFailure as failure:
            response.error, response.message = _pb(failure.code), failure.message
            return response
        response.error, response.message = _pb(answer.error), answer.message
        response.producer_id, response.producer_epoch = answer.producer_id, answer.producer_epoch
        return response

    async def InitProducerId(
        self, request: broker_pb2.InitProducerIdRequest, context: Any
    ) -> broker_pb2.InitProducerIdResponse:
        caller = await self._caller(context)
        image = self._image()
        response = broker_pb2.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        if (request.producer_id == -1) != (request.producer_epoch == -1):
            response.error = _pb(Errors.INVALID_REQUEST)
            response.message = (
                f"producer_id {request.producer_id} and producer_epoch "
                f"{request.producer_epoch}: both -1 or neither"
            )
            return response
        if request.transactional_id:
            return await self._init_transactional_producer(request, caller, image, response)
        if not self._may(
            image,
            caller,
            AclOperation.IDEMPOTENT_WRITE,
            AclResourceType.CLUSTER,
            CLUSTER_NAME,
            "InitProducerId",
        ):
            response.error = _pb(Errors.CLUSTER_AUTHORIZATION_FAILED)
            response.message = f"{caller.describe()} is not allowed IDEMPOTENT_WRITE on the cluster"
            return response
        if request.producer_id >= 0 and 0 <= request.producer_epoch < MAX_PRODUCER_EPOCH:
            # KIP-360: an idempotent producer bumps its own epoch after an
            # UNKNOWN_PRODUCER_ID or a sequence error, keeping its id.
            response.producer_id = request.producer_id
            response.producer_epoch = request.producer_epoch + 1
            return response
        if self.producer_ids is None:
            response.error = _pb(Errors.BROKER_NOT_AVAILABLE)
            response.message = "this broker has no producer id source"
            return response
        try:
            response.producer_id = await self.producer_ids.next_producer_id()
        except ProducerIdsError as error:
            response.error = _pb(Errors.BROKER_NOT_AVAILABLE)
            response.message = f"no producer id: {error}"
            response.producer_id = -1
            return response
        response.producer_epoch = 0
        return response

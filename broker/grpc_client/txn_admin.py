"""The admin client's transactions half (Kafka's ``Admin.listTransactions``,
``describeTransactions``, ``describeProducers``, ``abortTransaction`` and
the tools' ``FindHangingTransactionsCommand``, KIP-664), what ``kq
transactions`` is built on.

- ``list_transactions`` asks EVERY broker (each answers only the
  transactions it coordinates, as Kafka's ``ListTransactionsHandler``
  does) and merges the answers; a broker that does not answer makes the
  whole listing an error naming it, never a silently shorter list.
- ``describe_transactions`` asks each id's coordinator, found with
  FindCoordinator at any broker; NOT_COORDINATOR,
  COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE and lost answers
  find it again after a back-off, until the timeout.  An id no coordinator
  knows raises :class:`TransactionNotFoundError`.
- ``describe_producers`` asks each partition's leader, leadership errors
  retried after the answer's leader hint or a metadata refresh (as
  :class:`~broker.grpc_client.admin.Admin` does).
- ``find_hanging`` chains DescribeProducers, ListTransactions and
  DescribeTransactions around the pure decision of
  :mod:`broker.client.hanging`.
- ``abort_transaction`` writes an ABORT marker (WriteTxnMarkers, which
  needs ClusterAction) to the partition's leader at the producer's epoch
  and coordinator epoch, as ``kafka-transactions.sh abort`` does: it ends
  the partition's open transaction of that producer; the coordinator is
  neither asked nor told.  ``find_open_transaction`` finds those epochs from
  the transaction's first offset (DescribeProducers).

Errors raise :class:`BrokerClientError` naming the id, partition or broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self, TypeAlias

import grpc

from broker.client.hanging import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    TRANSACTION_STATES,
    HangingTransaction,
    OpenTransaction,
    ProducerState,
    TransactionDescription,
    TransactionListing,
    candidates,
    select_hanging,
)
from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.admin import Admin, Answers, Call
from broker.grpc_client.admin import Stub as BrokerStub
from broker.grpc_client.errors import BrokerClientError, NoBrokerError
from broker.grpc_client.metadata_cache import (
    METADATA_TIMEOUT_MS,
    PERMANENT_REFUSALS,
    MetadataCache,
    now_ms,
)
from kqproto import broker_pb2, txn_pb2, txn_pb2_grpc
from quorum.driver.tls import TlsFiles

__all__ = [
    "AbortSpec",
    "HangingTransaction",
    "OpenTransaction",
    "OpenTransactionNotFoundError",
    "ProducerState",
    "TransactionAdmin",
    "TransactionDescription",
    "TransactionListing",
    "TransactionNotFoundError",
    "wall_clock_ms",
]

if TYPE_CHECKING:
    TxnStub: TypeAlias = txn_pb2_grpc.TransactionServiceAsyncStub
else:
    TxnStub = txn_pb2_grpc.TransactionServiceStub

# A coordinator's answers after which it is found again and asked again.
_COORDINATOR_RETRIED = frozenset(
    {
        Errors.NOT_COORDINATOR,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
        Errors.COORDINATOR_NOT_AVAILABLE,
    }
)
# A partition leader's answers to a marker after which it is asked again
# (at the leader the metadata names next).
_LEADER_RETRIED = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
        Errors.KAFKA_STORAGE_ERROR,
    }
)
# Lost answers: the broker may have moved or died.
_LOST = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class TransactionNotFoundError(BrokerClientError):
    """No coordinator knows the transactional id (TRANSACTIONAL_ID_NOT_FOUND)."""

    def __init__(self, transactional_id: str) -> None:
        super().__init__(
            int(Errors.TRANSACTIONAL_ID_NOT_FOUND),
            f"transactional id {transactional_id!r} does not exist",
        )
        self.transactional_id = transactional_id


class OpenTransactionNotFoundError(BrokerClientError):
    """No producer's open transaction starts at the offset given (Kafka's
    "Could not find any open transactions starting at offset")."""

    def __init__(self, tp: TopicPartition, start_offset: int) -> None:
        super().__init__(
            int(Errors.INVALID_REQUEST),
            f"no open transaction starts at offset {start_offset} of {tp}",
        )
        self.partition = tp
        self.start_offset = start_offset


@dataclass(frozen=True, slots=True)
class AbortSpec:
    """Kafka's ``AbortTransactionSpec``: the marker that ends a producer's
    open transaction in one partition."""

    partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int

    def __post_init__(self) -> None:
        if self.producer_id < 0:
            raise ValueError(f"producer id {self.producer_id} is negative")
        if self.producer_epoch < 0:
            raise ValueError(f"producer epoch {self.producer_epoch} is negative")
        if self.coordinator_epoch < 0:
            raise ValueError(f"coordinator epoch {self.coordinator_epoch} is negative")


def wall_clock_ms() -> int:
    """The brokers' timestamps' clock (records, transaction start times)."""
    return int(time.time() * 1000)


def _description(found: txn_pb2.TransactionDescription) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=found.transactional_id,
        coordinator_id=found.coordinator_id,
        state=found.state,
        producer_id=found.producer_id,
        producer_epoch=found.producer_epoch,
        transaction_timeout_ms=found.transaction_timeout_ms,
        transaction_start_time_ms=found.transaction_start_time_ms,
        partitions=tuple(
            sorted(TopicPartition(t.name, p) for t in found.topics for p in t.partitions)
        ),
    )


class TransactionAdmin:
    """Transactions over the brokers (module docstring)."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
    ) -> None:
        self.admin = Admin(
            bootstrap,
            tls=tls,
            credentials=credentials,
            timeout_ms=timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self.timeout_ms = timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata: MetadataCache = self.admin.metadata

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.admin.close()

    def _txn_stub(self, address: str) -> TxnStub:
        stub: TxnStub = txn_pb2_grpc.TransactionServiceStub(self.metadata.channel(address))
        return stub

    # -- listing ------------------------------------------------------------------

    async def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        duration_ms: int = -1,
    ) -> list[TransactionListing]:
        """Every broker's transactions, by transactional id: only those in
        ``states`` (Kafka's names, :data:`TRANSACTION_STATES`) and of
        ``producer_ids`` when given, and only those open for longer than
        ``duration_ms`` when it is >= 0 (KIP-994)."""
        wanted_states = list(dict.fromkeys(states))
        unknown = [s for s in wanted_states if s not in TRANSACTION_STATES]
        if unknown:
            raise ValueError(
                f"unknown transaction states {', '.join(unknown)} (known: "
                f"{', '.join(TRANSACTION_STATES)})"
            )
        if duration_ms < -1:
            raise ValueError(f"duration_ms must be >= 0, or -1 for every one, not {duration_ms}")
        request = txn_pb2.ListTransactionsRequest(
            state_filters=wanted_states,
            producer_id_filters=sorted(set(producer_ids)),
            duration_filter_ms=duration_ms,
        )
        await self.metadata.refresh()
        brokers = dict(self.metadata.brokers)
        if not brokers:
            raise NoBrokerError("the metadata names no broker to ask for ListTransactions")

        async def one(node: int, address: str) -> tuple[int, txn_pb2.ListTransactionsResponse]:
            try:
                answer = await self._txn_stub(address).ListTransactions(
                    request, timeout=self.timeout_ms / 1000
                )
            except grpc.aio.AioRpcError as error:
                code = (
                    Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                    if error.code() in PERMANENT_REFUSALS
                    else Errors.BROKER_NOT_AVAILABLE
                )
                raise BrokerClientError(
                    int(code),
                    f"ListTransactions at broker {node} ({address}): {error.code().name} "
                    f"{error.details()}; the listing would miss the transactions it "
                    "coordinates",
                ) from None
            if answer.error != Errors.NONE:
                raise BrokerClientError(
                    answer.error, f"ListTransactions at broker {node} ({address}): {answer.message}"
                )
            if answer.unknown_state_filters:
                raise BrokerClientError(
                    int(Errors.INVALID_REQUEST),
                    f"broker {node} ({address}) does not know the states "
                    + ", ".join(answer.unknown_state_filters),
                )
            return node, answer

        answers = await asyncio.gather(*(one(n, a) for n, a in sorted(brokers.items())))
        found: dict[str, TransactionListing] = {}
        for node, answer in answers:
            for t in answer.transactions:
                # During a coordinator move two brokers may both list an
                # id; one listing is kept.
                found.setdefault(
                    t.transactional_id,
                    TransactionListing(t.transactional_id, t.producer_id, t.state, node),
                )
        return [found[t] for t in sorted(found)]

    # -- describing ---------------------------------------------------------------

    async def _find_coordinator(
        self, transactional_id: str, deadline_ms: int
    ) -> tuple[tuple[int, str] | None, str]:
        """FindCoordinator at the brokers in turn while their answers are
        lost: ``((node, address), "")`` once found, ``(None, why)`` while
        there is none yet; raises on a refusal."""
        request = txn_pb2.FindTxnCoordinatorRequest(transactional_ids=[transactional_id])
        known = [self.metadata.brokers[n] for n in sorted(self.metadata.brokers)]
        lost = []
        for address in known or self.metadata.bootstrap:
            left = deadline_ms - now_ms()
            if left <= 0:
                break
            try:
                answer = await self._txn_stub(address).FindCoordinator(
                    request, timeout=min(left, METADATA_TIMEOUT_MS) / 1000
                )
            except grpc.aio.AioRpcError as error:
                if error.code() in PERMANENT_REFUSALS:
                    raise BrokerClientError(
                        int(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                        f"FindCoordinator of transactional id {transactional_id!r} at {address}: "
                        f"{error.code().name} {error.details()}",
                    ) from None
                lost.append(f"{address}: {error.code().name}")
                continue
            if answer.error != Errors.NONE or not answer.coordinators:
                code = int(answer.error or Errors.UNKNOWN_SERVER_ERROR)
                message = answer.message or "no coordinator in the answer"
            else:
                found = answer.coordinators[0]
                code, message = int(found.error), found.message
                if code == Errors.NONE:
                    return (found.node_id, f"{found.host}:{found.port}"), ""
            if code in _COORDINATOR_RETRIED:
                return None, f"FindCoordinator: {Errors(code).name} {message}"
            raise BrokerClientError(
                code, f"FindCoordinator of transactional id {transactional_id!r}: {message}"
            )
        return None, "no broker answered FindCoordinator (" + "; ".join(lost) + ")"

    async def _describe(self, transactional_id: str) -> TransactionDescription | None:
        """The id at its coordinator; None if no coordinator knows it."""
        if not transactional_id:
            raise ValueError("a transactional id is not empty")
        request = txn_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id])
        deadline = now_ms() + self.timeout_ms
        coordinator: tuple[int, str] | None = None
        last = "no answer"
        while True:
            if coordinator is None:
                coordinator, why = await self._find_coordinator(transactional_id, deadline)
                last = why or last
            if coordinator is not None:
                node, address = coordinator
                left = max(1, deadline - now_ms())
                try:
                    answer = await self._txn_stub(address).DescribeTransactions(
                        request, timeout=left / 1000
                    )
                except grpc.aio.AioRpcError as error:
                    if error.code() in PERMANENT_REFUSALS:
                        raise BrokerClientError(
                            int(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                            f"DescribeTransactions of transactional id {transactional_id!r} at "
                            f"broker {node}: {error.code().name} {error.details()}",
                        ) from None
                    if error.code() not in _LOST:
                        raise BrokerClientError(
                            int(Errors.UNKNOWN_SERVER_ERROR),
                            f"DescribeTransactions of transactional id {transactional_id!r} at "
                            f"broker {node}: {error.code().name} {error.details()}",
                        ) from None
                    last = f"broker {node} ({address}): {error.code().name}"
                    coordinator = None
                else:
                    if answer.error != Errors.NONE or not answer.transactions:
                        code = int(answer.error or Errors.UNKNOWN_SERVER_ERROR)
                        message = answer.message or "no description in the answer"
                    else:
                        found = answer.transactions[0]
                        code, message = int(found.error), found.message
                        if code == Errors.NONE:
                            return _description(found)
                    if code == Errors.TRANSACTIONAL_ID_NOT_FOUND:
                        return None
                    if code not in _COORDINATOR_RETRIED:
                        raise BrokerClientError(
                            code,
                            f"DescribeTransactions of transactional id {transactional_id!r}: "
                            f"{message}",
                        )
                    last = f"broker {node}: {Errors(code).name} {message}"
                    coordinator = None
            if now_ms() >= deadline:
                raise BrokerClientError(
                    int(Errors.REQUEST_TIMED_OUT),
                    f"DescribeTransactions of transactional id {transactional_id!r} not "
                    f"answered within {self.timeout_ms} ms ({last})",
                )
            await asyncio.sleep(min(self.retry_backoff_ms, max(0, deadline - now_ms())) / 1000)
            await self.metadata.maybe_refresh()

    async def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        """The id as its coordinator describes it;
        :class:`TransactionNotFoundError` if no coordinator knows it."""
        await self.metadata.refresh()
        found = await self._describe(transactional_id)
        if found is None:
            raise TransactionNotFoundError(transactional_id)
        return found

    async def describe_transactions(
        self, transactional_ids: Sequence[str]
    ) -> dict[str, TransactionDescription]:
        """Each id at its coordinator (the first failure raises)."""
        ids = list(dict.fromkeys(transactional_ids))
        found = await asyncio.gather(*(self.describe_transaction(t) for t in ids))
        return dict(zip(ids, found, strict=True))

    # -- producers ----------------------------------------------------------------

    async def topic_partitions(self, topic: str) -> list[TopicPartition]:
        """Every partition of ``topic`` (:class:`UnknownTopicError` if none)."""
        return [TopicPartition(topic, p.partition) for p in await self.admin.topic(topic)]

    async def partitions_led_by(self, broker_id: int) -> list[TopicPartition]:
        """Every partition, internal topics' included, whose leader is
        ``broker_id``; an error if the metadata names no such broker."""
        await self.metadata.refresh()
        if broker_id not in self.metadata.brokers:
            raise BrokerClientError(
                int(Errors.BROKER_NOT_AVAILABLE),
                f"broker {broker_id} is not among the cluster's brokers "
                f"({', '.join(str(b) for b in sorted(self.metadata.brokers)) or 'none'})",
            )
        try:
            answer = await self.metadata.any_stub().Metadata(
                broker_pb2.MetadataRequest(all_topics=True),
                timeout=min(self.timeout_ms, METADATA_TIMEOUT_MS) / 1000,
            )
        except grpc.aio.AioRpcError as error:
            raise BrokerClientError(
                int(Errors.BROKER_NOT_AVAILABLE),
                f"Metadata of every topic: {error.code().name} {error.details()}",
            ) from None
        if answer.error != Errors.NONE:
            raise BrokerClientError(answer.error, f"Metadata of every topic: {answer.message}")
        return sorted(
            TopicPartition(t.name, p.partition)
            for t in answer.topics
            if t.error == Errors.NONE
            for p in t.partitions
            if p.leader_id == broker_id
        )

    async def describe_producers(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerState]]:
        """Each partition's producers as its leader has them, by producer id."""

        def request(parts: list[tuple[TopicPartition, int]]) -> Call[list[ProducerState]]:
            async def call(stub: BrokerStub) -> Answers[list[ProducerState]]:
                topics: dict[str, list[int]] = {}
                for tp, _epoch in parts:
                    topics.setdefault(tp.topic, []).append(tp.partition)
                response = await stub.DescribeProducers(
                    broker_pb2.DescribeProducersRequest(
                        topics=[
                            broker_pb2.DescribeProducersTopic(name=t, partitions=p)
                            for t, p in topics.items()
                        ]
                    ),
                    timeout=self.timeout_ms / 1000,
                )
                if response.error != Errors.NONE:
                    raise BrokerClientError(
                        response.error, f"DescribeProducers: {response.message}"
                    )
                return {
                    TopicPartition(t.name, p.partition): (
                        p.error,
                        p.message,
                        p.current_leader if p.HasField("current_leader") else None,
                        [
                            ProducerState(
                                s.producer_id,
                                s.producer_epoch,
                                s.last_sequence,
                                s.last_timestamp,
                                s.coordinator_epoch,
                                s.current_txn_start_offset,
                            )
                            for s in p.active_producers
                        ],
                    )
                    for t in response.topics
                    for p in t.partitions
                }

            return call

        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        # Admin's per-leader calls with their retries (same package).
        found = await self.admin._on_leaders("DescribeProducers", wanted, request)
        return {tp: sorted(found[tp], key=lambda s: s.producer_id) for tp in wanted}

    # -- hanging transactions -----------------------------------------------------

    async def find_hanging(
        self,
        partitions: Iterable[TopicPartition],
        max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    ) -> list[HangingTransaction]:
        """The open transactions of ``partitions`` no coordinator will end
        (:mod:`broker.client.hanging`): DescribeProducers, then
        ListTransactions by the candidates' producer ids, then
        DescribeTransactions of their ids."""
        producers = await self.describe_producers(partitions)
        found = candidates(producers, wall_clock_ms(), max_transaction_timeout_ms)
        if not found:
            return []
        listed = await self.list_transactions(producer_ids={c.producer.producer_id for c in found})
        ids = {t.producer_id: t.transactional_id for t in listed}
        tids = sorted(set(ids.values()))
        described = await asyncio.gather(*(self._describe(t) for t in tids))
        return select_hanging(found, ids, dict(zip(tids, described, strict=True)))

    # -- aborting -----------------------------------------------------------------

    async def find_open_transaction(self, tp: TopicPartition, start_offset: int) -> AbortSpec:
        """The marker that ends the open transaction starting at
        ``start_offset`` of ``tp``: its producer's id and epoch, and the
        coordinator epoch of the producer's last marker there (0 for none,
        as Kafka's ``coordinatorEpoch().orElse(0)``);
        :class:`OpenTransactionNotFoundError` if none starts there."""
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} is negative")
        producers = (await self.describe_producers([tp]))[tp]
        for state in producers:
            if state.current_txn_start_offset == start_offset:
                return AbortSpec(
                    tp, state.producer_id, state.producer_epoch, max(0, state.coordinator_epoch)
                )
        raise OpenTransactionNotFoundError(tp, start_offset)

    async def abort_transaction(self, spec: AbortSpec) -> None:
        """Write an ABORT marker of ``spec``'s producer to its partition's
        leader (WriteTxnMarkers, ClusterAction). Leadership errors and lost
        answers are retried until the timeout (a second marker of a
        transaction already ended changes nothing); REQUEST_TIMED_OUT (the
        marker appended but not yet held by the ISR) and every refusal
        (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED, ...)
        raise naming the partition."""
        tp = spec.partition
        request = txn_pb2.WriteTxnMarkersRequest(
            markers=[
                txn_pb2.TxnMarker(
                    producer_id=spec.producer_id,
                    producer_epoch=spec.producer_epoch,
                    committed=False,
                    topics=[txn_pb2.TxnTopic(name=tp.topic, partitions=[tp.partition])],
                    coordinator_epoch=spec.coordinator_epoch,
                )
            ]
        )
        what = (
            f"the ABORT marker of producer {spec.producer_id} (epoch {spec.producer_epoch}, "
            f"coordinator epoch {spec.coordinator_epoch}) on {tp}"
        )
        deadline = now_ms() + self.timeout_ms
        await self.admin.topic(tp.topic)
        count = self.metadata.topics.get(tp.topic, 0)
        if not 0 <= tp.partition < count:
            raise BrokerClientError(
                int(Errors.UNKNOWN_TOPIC_OR_PARTITION),
                f"topic {tp.topic!r} has no partition {tp.partition} (it has {count})",
            )
        last = "no answer"
        while True:
            info = self.metadata.leader(tp)
            if info is None:
                last = "no leader"
                self.metadata.request_refresh()
            else:
                address = self.metadata.brokers[info.leader]
                left = max(1, deadline - now_ms())
                try:
                    answer = await self._txn_stub(address).WriteTxnMarkers(
                        request, timeout=left / 1000
                    )
                except grpc.aio.AioRpcError as error:
                    if error.code() in PERMANENT_REFUSALS:
                        raise BrokerClientError(
                            int(Errors.CLUSTER_AUTHORIZATION_FAILED),
                            f"{what}: broker {info.leader} refused WriteTxnMarkers: "
                            f"{error.code().name} {error.details()}",
                        ) from None
                    last = f"broker {info.leader}: {error.code().name}"
                    self.metadata.request_refresh()
                else:
                    if answer.error != Errors.NONE:
                        raise BrokerClientError(answer.error, f"{what}: {answer.message}")
                    results = [
                        p
                        for marker in answer.markers
                        for t in marker.topics
                        if t.name == tp.topic
                        for p in t.partitions
                        if p.partition == tp.partition
                    ]
                    if not results:
                        raise BrokerClientError(
                            int(Errors.UNKNOWN_SERVER_ERROR), f"{what}: no answer for {tp}"
                        )
                    result = results[0]
                    if result.error == Errors.NONE:
                        return
                    if result.error not in _LEADER_RETRIED:
                        raise BrokerClientError(result.error, f"{what}: {result.message}")
                    last = f"broker {info.leader}: {Errors(result.error).name} {result.message}"
                    self.metadata.request_refresh()
            if now_ms() >= deadline:
                raise BrokerClientError(
                    int(Errors.REQUEST_TIMED_OUT),
                    f"{what} not written within {self.timeout_ms} ms ({last})",
                )
            await asyncio.sleep(min(self.retry_backoff_ms, max(0, deadline - now_ms())) / 1000)
            await self.metadata.maybe_refresh()

    async def abort_open_transaction(self, tp: TopicPartition, start_offset: int) -> AbortSpec:
        """``kafka-transactions.sh abort --start-offset``: find the producer
        whose open transaction starts at ``start_offset`` of ``tp``
        (:meth:`find_open_transaction`) and abort it there
        (:meth:`abort_transaction`); the marker written."""
        spec = await self.find_open_transaction(tp, start_offset)
        await self.abort_transaction(spec)
        return spec

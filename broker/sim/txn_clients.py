"""Transactional producers of the transaction simulation, as
message-driven state machines (Kafka's ``TransactionManager`` with
transaction version 2, one request in flight).

A producer instance gets its producer id and epoch (InitProducerId, and
KIP-360's InitProducerId naming them when it recovers between
transactions), then runs its transactions one after another: for each
partition, AddPartitionsToTxn before its first batch there, then its
batches (acks=all, sequence numbers per partition and epoch), then
EndTxn(commit) or EndTxn(abort), adopting the epoch EndTxn answers.

- A request unanswered for ``request_timeout_ms`` is sent again, the same
  request under a new attempt number (the old answer is no longer read);
  a retriable error is retried after ``retry_backoff_ms``.
- A batch unacknowledged for ``delivery_timeout_ms`` expires and the
  transaction is aborted, as are transactions that meet an abortable
  error (out of order sequence, a partition not in the transaction).
- A fatal error (fenced, an unknown producer id) ends the instance; the
  workload may start another for its transactional id.

What each transaction did as its producer saw it is a :class:`ClientTxn`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from broker.errors import Errors
from broker.sim.txn_config import TxnSimConfig
from broker.sim.txn_messages import (
    AddPartitionsRequest,
    CoordinatorAnswer,
    CoordinatorRequest,
    EndTxnRequest,
    InitPidRequest,
    ProduceAnswer,
    TxnBody,
    TxnProduce,
    TxnRequest,
)
from metadata.records import NO_LEADER

__all__ = ["AckedBatch", "ClientTxn", "Producer", "ProducerHost", "TxnKey", "TxnPlan"]

# (transactional id, producer instance, the instance's transaction number)
TxnKey = tuple[str, int, int]

_RETRIABLE = frozenset(
    {
        Errors.NOT_COORDINATOR,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
        Errors.CONCURRENT_TRANSACTIONS,
        Errors.NOT_ENOUGH_REPLICAS,
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        Errors.REQUEST_TIMED_OUT,
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.UNKNOWN_SERVER_ERROR,
        Errors.KAFKA_STORAGE_ERROR,
    }
)
_FATAL = frozenset(
    {
        Errors.PRODUCER_FENCED,
        Errors.INVALID_PRODUCER_EPOCH,
        Errors.INVALID_PRODUCER_ID_MAPPING,
    }
)


@dataclass(frozen=True, slots=True)
class TxnPlan:
    """One transaction to run: its batches in order, each ``(partition,
    records)``, then commit or abort after ``think_ms``.  ``unadded``
    names partitions the producer writes without AddPartitionsToTxn (a
    misbehaving client: the hanging transaction's recipe)."""

    writes: tuple[tuple[int, int], ...]
    commit: bool = True
    think_ms: int = 0
    unadded: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class AckedBatch:
    partition: int
    offset: int
    values: tuple[str, ...]


@dataclass(slots=True)
class ClientTxn:
    """A transaction as its producer saw it.  ``outcome``: ``open``,
    ``committed`` or ``aborted`` (EndTxn answered NONE), or ``unknown``
    (the instance died before an answer)."""

    key: TxnKey
    producer_id: int
    producer_epoch: int
    added: list[int] = field(default_factory=list)
    acked: list[AckedBatch] = field(default_factory=list)
    commit_requested: bool = False
    abort_requested: bool = False
    outcome: str = "open"


class ProducerHost(Protocol):
    """What a producer needs of the simulation."""

    now_ms: int
    rng: random.Random
    txn_config: TxnSimConfig

    def log(self, line: str) -> None: ...

    def leader_of(self, p: int) -> int: ...

    def coordinator_node(self) -> int: ...

    def next_attempt(self) -> int: ...

    def client_send(self, dst: int, body: TxnBody) -> None: ...

    def register_txn(self, txn: ClientTxn) -> None: ...


@dataclass(slots=True)
class _Pending:
    """The request in flight: sent at ``sent_ms`` as ``attempt``, first at
    ``first_ms``; ``retry_at`` set while it waits to be sent again."""

    request: CoordinatorRequest | TxnProduce
    attempt: int = -1
    sent_ms: int = 0
    first_ms: int = 0
    retry_at: int | None = None


class Producer:
    """One producer instance of a transactional id."""

    def __init__(
        self,
        host: ProducerHost,
        instance: int,
        transactional_id: str,
        plans: list[TxnPlan] | None = None,
    ) -> None:
        self.host = host
        self.instance = instance
        self.transactional_id = transactional_id
        # Scripted transactions, run in order; None: random ones, forever.
        self.plans = plans
        self.state = "init"
        self.producer_id = -1
        self.producer_epoch = -1
        self.txn: ClientTxn | None = None
        self.plan: TxnPlan | None = None
        self.step = 0
        self.sequences: dict[int, int] = {}
        self.pending: _Pending | None = None
        self.think_until = 0
        self.next_start_ms = 0
        self.transactions = 0
        # No new transaction once stopped (the run's quiet end).
        self.stopped = False
        self._send_coordinator(InitPidRequest(transactional_id, host.txn_config.txn_timeout_ms))

    @property
    def name(self) -> str:
        return f"producer {self.instance} ({self.transactional_id})"

    @property
    def dead(self) -> bool:
        return self.state == "dead"

    @property
    def idle(self) -> bool:
        """Between transactions with nothing in flight."""
        return self.state == "ready" and self.pending is None

    # -- sending --------------------------------------------------------------------

    def _send_coordinator(self, request: CoordinatorRequest) -> None:
        self.pending = _Pending(request, first_ms=self.host.now_ms)
        self._send()

    def _send(self) -> None:
        pending = self.pending
        assert pending is not None
        host = self.host
        pending.attempt = host.next_attempt()
        pending.sent_ms = host.now_ms
        pending.retry_at = None
        request = pending.request
        if isinstance(request, TxnProduce):
            request = TxnProduce(
                pending.attempt,
                self.instance,
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.base_sequence,
                request.partition,
                request.values,
            )
            pending.request = request
            dst = host.leader_of(request.partition)
            body: TxnBody = request
        else:
            dst = host.coordinator_node()
            body = TxnRequest(pending.attempt, self.instance, request)
        if dst == NO_LEADER:
            pending.retry_at = host.now_ms + host.txn_config.retry_backoff_ms
            return
        host.client_send(dst, body)

    def _retry_later(self) -> None:
        assert self.pending is not None
        self.pending.retry_at = self.host.now_ms + self.host.txn_config.retry_backoff_ms

    # -- time -----------------------------------------------------------------------

    def tick(self) -> None:
        if self.dead:
            return
        host, config = self.host, self.host.txn_config
        now = host.now_ms
        pending = self.pending
        if pending is not None:
            if (
                isinstance(pending.request, TxnProduce)
                and now - pending.first_ms >= config.delivery_timeout_ms
            ):
                host.log(f"{self.name}: batch {pending.request.values} expired: aborting")
                self.pending = None
                self._abort()
            elif pending.retry_at is not None:
                if now >= pending.retry_at:
                    self._send()
            elif now - pending.sent_ms >= config.request_timeout_ms:
                self._send()
            return
        if self.state == "think" and now >= self.think_until:
            self._end()
        elif self.state == "ready" and not self.stopped and now >= self.next_start_ms:
            self._begin()

    # -- transactions ---------------------------------------------------------------

    def _next_plan(self) -> TxnPlan | None:
        if self.plans is not None:
            return self.plans.pop(0) if self.plans else None
        rng = self.host.rng
        data = self.host.txn_config.data_partitions
        chosen = rng.sample(data, rng.randint(1, min(2, len(data))))
        writes = tuple((p, rng.randint(1, 2)) for p in chosen for _ in range(rng.randint(1, 2)))
        return TxnPlan(writes, rng.random() < 0.7, rng.choice((0, 0, 50, 300)))

    def _begin(self) -> None:
        host = self.host
        if (
            self.plans is None
            and self.transactions > 0
            and host.txn_config.recover_rate
            and host.rng.random() < host.txn_config.recover_rate
        ):
            # KIP-360: bump the epoch naming the current one.
            self.state = "recover"
            self._send_coordinator(
                InitPidRequest(
                    self.transactional_id,
                    host.txn_config.txn_timeout_ms,
                    self.producer_id,
                    self.producer_epoch,
                )
            )
            return
        plan = self._next_plan()
        if plan is None:
            return
        self.plan = plan
        self.step = 0
        key = (self.transactional_id, self.instance, self.transactions)
        self.transactions += 1
        self.txn = ClientTxn(key, self.producer_id, self.producer_epoch)
        host.register_txn(self.txn)
        host.log(f"{self.name}: begins transaction {key[2]} at epoch {self.producer_epoch}")
        self._next_step()

    def _next_step(self) -> None:
        plan, txn = self.plan, self.txn
        assert plan is not None and txn is not None
        if self.step >= len(plan.writes):
            self.state = "think"
            self.think_until = self.host.now_ms + plan.think_ms
            if plan.think_ms == 0:
                self._end()
            return
        p, count = plan.writes[self.step]
        if p not in txn.added and p not in plan.unadded:
            self.state = "add"
            self._send_coordinator(
                AddPartitionsRequest(
                    self.transactional_id, self.producer_id, self.producer_epoch, (p,)
                )
            )
            return
        self.state = "produce"
        sequence = self.sequences.get(p, 0)
        values = tuple(
            f"{self.transactional_id}/{self.instance}/{txn.key[2]}/{p}/{sequence + i}"
            for i in range(count)
        )
        self.pending = _Pending(
            TxnProduce(
                -1,
                self.instance,
                self.transactional_id,
                self.producer_id,
                self.producer_epoch,
                sequence,
                p,
                values,
            ),
            first_ms=self.host.now_ms,
        )
        self._send()

    def _end(self) -> None:
        plan, txn = self.plan, self.txn
        assert plan is not None and txn is not None
        self.state = "end"
        if plan.commit:
            txn.commit_requested = True
        else:
            txn.abort_requested = True
        self._send_coordinator(
            EndTxnRequest(
                self.transactional_id, self.producer_id, self.producer_epoch, plan.commit, txn.key
            )
        )

    def _abort(self) -> None:
        txn = self.txn
        if txn is None:
            self.state = "ready"
            return
        self.state = "end"
        txn.abort_requested = True
        self._send_coordinator(
            EndTxnRequest(
                self.transactional_id, self.producer_id, self.producer_epoch, False, txn.key
            )
        )

    def _die(self, why: str) -> None:
        self.state = "dead"
        self.pending = None
        if self.txn is not None and self.txn.outcome == "open":
            self.txn.outcome = "unknown"
        self.host.log(f"{self.name}: fatal: {why}")

    def _adopt(self, producer_id: int, epoch: int) -> None:
        if (producer_id, epoch) != (self.producer_id, self.producer_epoch):
            # A new epoch starts every partition's sequence at 0.
            self.sequences = {}
        self.producer_id, self.producer_epoch = producer_id, epoch

    # -- answers --------------------------------------------------------------------

    def receive(self, answer: CoordinatorAnswer | ProduceAnswer) -> None:
        pending = self.pending
        if self.dead or pending is None or answer.attempt != pending.attempt:
            return
        error = answer.error
        if isinstance(answer, ProduceAnswer):
            self._produce_answer(answer)
            return
        request = pending.request
        if error in _RETRIABLE:
            self._retry_later()
            return
        self.pending = None
        if isinstance(request, InitPidRequest):
            if error is not Errors.NONE:
                self._die(f"InitProducerId: {error.name}")
                return
            self._adopt(answer.producer_id, answer.producer_epoch)
            self.host.log(
                f"{self.name}: producer id {self.producer_id} epoch {self.producer_epoch}"
            )
            self.state = "ready"
            self.next_start_ms = self.host.now_ms
        elif isinstance(request, AddPartitionsRequest):
            if error is Errors.NONE:
                assert self.txn is not None
                self.txn.added.extend(request.partitions)
                self._next_step()
            elif error in _FATAL:
                self._die(f"AddPartitionsToTxn: {error.name}")
            else:
                self._abort()
        elif isinstance(request, EndTxnRequest):
            txn = self.txn
            assert txn is not None
            if error is not Errors.NONE:
                self._die(f"EndTxn({'commit' if request.commit else 'abort'}): {error.name}")
                return
            txn.outcome = "committed" if request.commit else "aborted"
            self.host.log(
                f"{self.name}: transaction {txn.key[2]} {txn.outcome} (epoch "
                f"{self.producer_epoch} -> {answer.producer_epoch})"
            )
            self._adopt(answer.producer_id, answer.producer_epoch)
            self.txn = None
            self.plan = None
            self.state = "ready"
            self.next_start_ms = self.host.now_ms + self.host.rng.choice((0, 20, 100))

    def _produce_answer(self, answer: ProduceAnswer) -> None:
        pending = self.pending
        assert pending is not None and isinstance(pending.request, TxnProduce)
        request = pending.request
        error = answer.error
        if error in _RETRIABLE:
            self._retry_later()
            return
        self.pending = None
        if error is Errors.NONE:
            txn = self.txn
            assert txn is not None
            txn.acked.append(AckedBatch(request.partition, answer.offset, request.values))
            self.sequences[request.partition] = request.base_sequence + len(request.values)
            self.step += 1
            self._next_step()
        elif error in _FATAL:
            self._die(f"produce to p{request.partition}: {error.name}")
        else:
            self.host.log(f"{self.name}: produce to p{request.partition}: {error.name}: aborting")
            self._abort()

"""Transactions on the broker simulation (KIP-98 with KIP-890's
server-side defence), seeded and pure: :class:`TxnSimCluster` is a
:class:`~broker.sim.cluster.SimCluster` whose last partition is the
transaction-state partition, with a transaction coordinator on the broker
leading it, transactional producers (:mod:`broker.sim.txn_clients`) and
the partition leaders' side of transactions.  It mirrors the runtime
(``broker/txn_coordinator.py``, ``broker/txn_markers.py``,
``broker/txn_produce.py``) message for message, in virtual time.

- **The coordinator** runs on the broker leading the transaction-state
  partition at the controller's current leader epoch: a
  :class:`~broker.txn.coordinator.TransactionCoordinatorShard` loaded from
  that replica's log below the HW once the HW reaches the log end found
  when the leadership began.  A decision's records are appended to the
  leader's log and replayed at once; its answer waits until the HW passes
  them.  Losing the leadership (or the process) drops the shard and the
  answers it owed; the next leader loads again.
- **Markers**: once an end is committed, the coordinator sends each
  partition's marker to that partition's leader, stamped with its
  coordinator epoch (the leader epoch of its transaction-state partition),
  sends again what is unanswered, and completes the transaction once every
  marker is written.  A leader appends a marker as a control batch
  (``AppendOrigin.COORDINATOR``) and answers once the HW passes it.
- **KIP-890 part 1**: before appending a producer's first transactional
  batch of a transaction in a partition (unless the partition's producer
  state has that producer's transaction open at the batch's epoch), the
  leader asks the coordinator (``verify_partitions``, a round trip) and
  refuses the batch if it is not in the ongoing transaction.
- **The network** carries every request and answer with the cluster's
  delays, drops and cuts; a configured chance delivers a message twice
  (two copies, independent delays), and a script may hold chosen messages
  back (:meth:`TxnSimCluster.delay_next`).

The rule switches of :class:`~broker.sim.txn_config.TxnSimConfig` break
the defences for the scenarios (:mod:`broker.sim.txn_scenarios`); the
invariants are :mod:`broker.sim.txn_invariants`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker.errors import Errors, ReplicaError
from broker.replica import Role
from broker.sim.cluster import CLIENT, Body, BrokerSim, Message, SimCluster
from broker.sim.txn_clients import ClientTxn, Producer, TxnKey, TxnPlan
from broker.sim.txn_config import TxnSimConfig
from broker.sim.txn_messages import (
    AddPartitionsRequest,
    ClientTimer,
    CoordinatorAnswer,
    EndTxnRequest,
    InitPidRequest,
    MarkerAnswer,
    MarkerRequest,
    ProduceAnswer,
    TxnBody,
    TxnProduce,
    TxnRequest,
    VerifyAnswer,
    VerifyRequest,
)
from broker.txn import codec
from broker.txn.api import PendingMarkers, TxnMarker, verification_error
from broker.txn.coordinator import TransactionCoordinatorShard, TxnConfig
from broker.txn.records import TxnRecord
from broker.txn.types import TopicPartition, TransactionState
from metadata.records import NO_LEADER
from partition_log.batch import BatchScanner, build_batch, decode_records
from partition_log.log import AppendOrigin, PartitionLog
from partition_log.records import Record
from partition_log.txn import ControlType, EndTxnMarker, build_marker_batch

__all__ = ["TOPIC", "SimCoordinator", "TxnSimCluster", "state_records"]

# The data partitions' topic, as the coordinator names them.
TOPIC = "t"


# Marker errors after which the coordinator writes the marker again.
_MARKER_RETRIABLE = frozenset(
    {
        Errors.NOT_LEADER_OR_FOLLOWER,
        Errors.LEADER_NOT_AVAILABLE,
        Errors.NOT_ENOUGH_REPLICAS,
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        Errors.REQUEST_TIMED_OUT,
        Errors.KAFKA_STORAGE_ERROR,
        Errors.UNKNOWN_SERVER_ERROR,
        Errors.FENCED_LEADER_EPOCH,
        Errors.UNKNOWN_LEADER_EPOCH,
    }
)


def state_records(log: PartitionLog, below: int) -> list[tuple[int, TxnRecord]]:
    """(offset, record) of every transaction-log record of ``log`` below
    ``below``."""
    out: list[tuple[int, TxnRecord]] = []
    offset = log.log_start_offset
    while offset < below:
        data = log.read(offset, 1 << 30, max_offset=below)
        if not data:
            break
        for batch in BatchScanner(data, check_crc=False):
            header = batch.header
            if not header.is_control:
                for record in decode_records(data[batch.position : batch.end]):
                    if offset <= record.offset < below and record.key is not None:
                        out.append((record.offset, codec.decode(record.key, record.value)))
            offset = max(offset, header.next_offset)
    return out


class _ProducerIds:
    """The controller's producer-id blocks, as one counter: no id twice in
    a run, whichever coordinator draws it."""

    def __init__(self) -> None:
        self.next = 1000

    def next_producer_id(self) -> int:
        self.next += 1
        return self.next - 1


@dataclass(slots=True)
class _Completing:
    """A transaction whose markers are being written: the partitions still
    without one, and when each was last sent."""

    pending: PendingMarkers
    remaining: dict[int, TxnMarker]
    sent: dict[int, int] = field(default_factory=dict)
    completed: bool = False


@dataclass(slots=True)
class SimCoordinator:
    """The coordinator on one broker for one leadership of the
    transaction-state partition (its memory: lost with the process)."""

    broker_id: int
    incarnation: int
    leader_epoch: int
    shard: TransactionCoordinatorShard
    # The log end found when the leadership began: loaded once the HW
    # reaches it.
    target: int
    loaded: bool = False
    # The end of the last decision written (answers wait for the HW).
    last_written: int = 0
    waiting: list[tuple[int, Callable[[], None]]] = field(default_factory=list)
    completing: dict[str, _Completing] = field(default_factory=dict)
    next_timeout_check: int = 0


@dataclass(slots=True)
class _TxnWaiting:
    """A leader's transactional append (a batch or a marker) waiting for
    the HW, answered by ``answer(error)``."""

    partition: int
    required: int
    leader_epoch: int
    deadline_ms: int
    answer: Callable[[Errors], None]


@dataclass(slots=True)
class _Verifying:
    produce: TxnProduce
    deadline_ms: int


class TxnSimCluster(SimCluster):
    """A :class:`SimCluster` with transactions: the coordinator, the
    leaders' side, producers and the transaction messages."""

    def __init__(
        self,
        seed: int,
        config: TxnSimConfig | None = None,
        *,
        check: Callable[[SimCluster], None] | None = None,
    ) -> None:
        self.txn_config = config or TxnSimConfig()
        self.state_partition = self.txn_config.state_partition
        self.data_partitions = self.txn_config.data_partitions
        self.coordinators: dict[int, SimCoordinator] = {}
        self.txn_purgatory: dict[int, list[_TxnWaiting]] = {}
        self.verifying: dict[int, dict[int, _Verifying]] = {}
        self.producer_ids = _ProducerIds()
        self.producers: dict[int, Producer] = {}
        self.client_txns: dict[TxnKey, ClientTxn] = {}
        # Scripted delays: the next messages a predicate picks get its delay.
        self._delays: list[tuple[Callable[[TxnBody], bool], int, list[int]]] = []
        self._attempts = 0
        self._verifications = 0
        self.duplicated = 0
        # Every EndTxn the coordinator decided on: (the client's name of the
        # transaction, commit, the request's epoch, the error).
        self.end_txn_answers: list[tuple[TxnKey, bool, int, str]] = []
        # What the last event was (a violation names it).
        self.last_event = "start"
        super().__init__(seed, self.txn_config.cluster, check=check)
        self._schedule(self.txn_config.client_tick_ms, "deliver", _timer())

    def _event_done(self, what: str) -> None:
        self.last_event = what
        super()._event_done(what)

    def read_bound(self, log: PartitionLog) -> int:
        """Where a read_committed reader of ``log`` stops: its last stable
        offset (the HW with the ``read_to_high_watermark`` switch)."""
        if self.txn_config.read_to_high_watermark:
            return log.high_watermark
        return log.last_stable_offset

    # -- the network ----------------------------------------------------------------

    def send(self, src: int, dst: int, body: Body) -> None:
        if not isinstance(body, TxnBody):
            super().send(src, dst, body)
            return
        self.messages_sent += 1
        config = self.txn_config
        copies = 1
        if config.duplicate_rate and self.rng.random() < config.duplicate_rate:
            copies = 2
            self.duplicated += 1
        held = self._held(body)
        for _ in range(copies):
            if not self.connected(src, dst) or (
                self.drop_rate and self.rng.random() < self.drop_rate
            ):
                self.messages_dropped += 1
                continue
            delay = held
            if delay is None:
                delay = self.rng.randint(self.config.min_delay_ms, self.config.max_delay_ms)
            self._schedule(delay, "deliver", Message(src, dst, body))

    def delay_next(self, pick: Callable[[TxnBody], bool], delay_ms: int, times: int = 1) -> None:
        """The next ``times`` transaction messages ``pick`` chooses are
        delivered ``delay_ms`` after they are sent (a script's delayed
        request)."""
        self._delays.append((pick, delay_ms, [times]))

    def _held(self, body: TxnBody) -> int | None:
        for pick, delay, left in self._delays:
            if left[0] > 0 and pick(body):
                left[0] -= 1
                return delay
        return None

    def client_send(self, dst: int, body: TxnBody) -> None:
        self.send(CLIENT, dst, body)

    def next_attempt(self) -> int:
        self._attempts += 1
        return self._attempts

    def _deliver(self, message: Message) -> None:
        body = message.body
        if not isinstance(body, TxnBody):
            super()._deliver(message)
            return
        if not self.connected(message.src, message.dst) or not self._endpoint_up(message.dst):
            self.messages_dropped += 1
            return
        if isinstance(body, ClientTimer):
            self._client_tick()
        elif message.dst == CLIENT:
            assert isinstance(body, CoordinatorAnswer | ProduceAnswer)
            producer = self.producers.get(body.producer)
            if producer is not None:
                producer.receive(body)
        else:
            self._broker_txn_receive(self.brokers[message.dst], message.src, body)

    # -- clients --------------------------------------------------------------------

    def coordinator_node(self) -> int:
        """Where clients send coordinator requests: the leader the
        controller names for the transaction-state partition
        (FindCoordinator)."""
        return self.leader_of(self.state_partition)

    def register_txn(self, txn: ClientTxn) -> None:
        self.client_txns[txn.key] = txn

    def start_producer(self, transactional_id: str, plans: list[TxnPlan] | None = None) -> int:
        """A new producer instance of ``transactional_id`` (its
        InitProducerId fences any earlier instance); its number."""
        instance = len(self.producers)
        self.producers[instance] = Producer(self, instance, transactional_id, plans)
        self.action(f"start producer {instance} ({transactional_id})")
        return instance

    def _client_tick(self) -> None:
        for producer in list(self.producers.values()):
            producer.tick()
        self._schedule(self.txn_config.client_tick_ms, "deliver", _timer())

    # -- brokers --------------------------------------------------------------------

    def _open(self, broker: BrokerSim) -> None:
        super()._open(broker)
        # A new process: no coordinator, nothing waiting.
        self.coordinators.pop(broker.broker_id, None)
        self.txn_purgatory[broker.broker_id] = []
        self.verifying[broker.broker_id] = {}

    def _broker_tick(self, broker: BrokerSim) -> None:
        super()._broker_tick(broker)
        if not broker.up:
            return
        now = self.now_ms
        waiting = self.txn_purgatory[broker.broker_id]
        for late in [w for w in waiting if now >= w.deadline_ms]:
            waiting.remove(late)
            late.answer(Errors.REQUEST_TIMED_OUT)
        verifying = self.verifying[broker.broker_id]
        for vid, pending in list(verifying.items()):
            if now >= pending.deadline_ms:
                del verifying[vid]
                self._answer_produce(broker, pending.produce, Errors.REQUEST_TIMED_OUT)
        coordinator = self.coordinator_on(broker)
        if coordinator is not None and coordinator.loaded:
            self._coordinator_tick(coordinator)

    def _complete_waiting(self, broker: BrokerSim) -> None:
        super()._complete_waiting(broker)
        if broker.broker_id not in self.txn_purgatory:
            return  # while the base class builds the brokers
        still = []
        done = []
        for waiting in self.txn_purgatory[broker.broker_id]:
            check = broker.replicas[waiting.partition].check_enough_replicas_reach_offset(
                waiting.required, waiting.leader_epoch
            )
            if check.done:
                done.append((waiting, check.error))
            else:
                still.append(waiting)
        self.txn_purgatory[broker.broker_id] = still
        for waiting, error in done:
            waiting.answer(error)
        coordinator = self.coordinators.get(broker.broker_id)
        if coordinator is not None:
            self.coordinator_on(broker)

    def _broker_txn_receive(self, broker: BrokerSim, src: int, body: TxnBody) -> None:
        if isinstance(body, TxnRequest):
            self._coordinator_request(broker, src, body)
        elif isinstance(body, VerifyRequest):
            self._coordinator_verify(broker, src, body)
        elif isinstance(body, MarkerAnswer):
            self._marker_answer(broker, body)
        elif isinstance(body, TxnProduce):
            self._txn_produce(broker, body)
        elif isinstance(body, VerifyAnswer):
            pending = self.verifying[broker.broker_id].pop(body.verification, None)
            if pending is None:
                return
            if body.error is Errors.NONE:
                self._append_txn(broker, pending.produce)
            else:
                self._answer_produce(broker, pending.produce, verification_error(body.error))
        elif isinstance(body, MarkerRequest):
            self._write_marker(broker, src, body)

    # -- the leaders' side ----------------------------------------------------------

    def _answer_produce(
        self, broker: BrokerSim, msg: TxnProduce, error: Errors, at: int = -1
    ) -> None:
        self.send(broker.broker_id, CLIENT, ProduceAnswer(msg.attempt, msg.producer, error, at))

    def _txn_produce(self, broker: BrokerSim, msg: TxnProduce) -> None:
        replica = broker.replicas.get(msg.partition)
        if replica is None or replica.role is not Role.LEADER:
            self._answer_produce(broker, msg, Errors.NOT_LEADER_OR_FOLLOWER)
            return
        if self.txn_config.verify_transactional_produce:
            entry = broker.logs[msg.partition].producer_state.entry(msg.producer_id)
            open_here = (
                entry is not None
                and entry.epoch == msg.producer_epoch
                and entry.current_txn_first_offset >= 0
            )
            if not open_here:
                coordinator = self.coordinator_node()
                if coordinator == NO_LEADER:
                    self._answer_produce(broker, msg, Errors.NOT_ENOUGH_REPLICAS)
                    return
                self._verifications += 1
                vid = self._verifications
                self.verifying[broker.broker_id][vid] = _Verifying(
                    msg, self.now_ms + self.config.produce_timeout_ms
                )
                self.send(
                    broker.broker_id,
                    coordinator,
                    VerifyRequest(
                        vid,
                        msg.transactional_id,
                        msg.producer_id,
                        msg.producer_epoch,
                        msg.partition,
                    ),
                )
                return
        self._append_txn(broker, msg)

    def _append_txn(self, broker: BrokerSim, msg: TxnProduce) -> None:
        replica = broker.replicas[msg.partition]
        now = self.now_ms
        batch = build_batch(
            [Record(i, now, None, v.encode()) for i, v in enumerate(msg.values)],
            producer_id=msg.producer_id,
            producer_epoch=msg.producer_epoch,
            base_sequence=msg.base_sequence,
            transactional=True,
        )
        try:
            append = replica.append_as_leader(batch, -1, now)
        except ReplicaError as error:
            self._answer_produce(broker, msg, error.code)
            return
        offset = append.info.first_offset
        self.log(
            f"p{msg.partition} broker {broker.broker_id} appends {list(msg.values)} of producer "
            f"{msg.producer_id} epoch {msg.producer_epoch} at {offset}"
            + (" (duplicate)" if append.info.duplicate else "")
        )

        def answer(error: Errors) -> None:
            self._answer_produce(broker, msg, error, offset)

        self._wait(broker, msg.partition, append.info.last_offset + 1, append.leader_epoch, answer)

    def _wait(
        self,
        broker: BrokerSim,
        p: int,
        required: int,
        leader_epoch: int,
        answer: Callable[[Errors], None],
    ) -> None:
        self.txn_purgatory[broker.broker_id].append(
            _TxnWaiting(
                p, required, leader_epoch, self.now_ms + self.config.produce_timeout_ms, answer
            )
        )
        self._complete_waiting(broker)

    def _write_marker(self, broker: BrokerSim, src: int, msg: MarkerRequest) -> None:
        marker = msg.marker
        p = marker.partition

        def answer(error: Errors) -> None:
            self.send(broker.broker_id, src, MarkerAnswer(msg.transactional_id, marker, error))

        replica = broker.replicas.get(p)
        if replica is None or replica.role is not Role.LEADER:
            answer(Errors.NOT_LEADER_OR_FOLLOWER)
            return
        end = EndTxnMarker(
            ControlType.COMMIT if marker.commit else ControlType.ABORT, msg.coordinator_epoch
        )
        now = self.now_ms
        batch = build_marker_batch(marker.producer_id, marker.producer_epoch, end, now)
        try:
            append = replica.append_as_leader(
                batch,
                -1,
                now,
                origin=AppendOrigin.COORDINATOR,
                marker_bumps_epoch=marker.bumps_epoch and self.txn_config.refuse_late_markers,
            )
        except ReplicaError as error:
            self.log(
                f"p{p} broker {broker.broker_id} refuses {end.type.name} marker of producer "
                f"{marker.producer_id} epoch {marker.producer_epoch}: {error.code.name}"
            )
            answer(error.code)
            return
        self.log(
            f"p{p} broker {broker.broker_id} appends {end.type.name} marker of producer "
            f"{marker.producer_id} epoch {marker.producer_epoch} (coordinator epoch "
            f"{msg.coordinator_epoch}) at {append.info.first_offset}"
        )
        self._wait(broker, p, append.info.last_offset + 1, append.leader_epoch, answer)

    # -- the coordinator ------------------------------------------------------------

    def coordinator_on(self, broker: BrokerSim) -> SimCoordinator | None:
        """The broker's coordinator if it serves the transaction-state
        partition now (started, and loaded once its HW allows, here),
        else None (and any it had is dropped with what it owed)."""
        b = broker.broker_id
        sp = self.state_partition
        coordinator = self.coordinators.get(b)
        if not broker.up or self.serving_leader(sp) != b:
            if coordinator is not None and not broker.alive:
                return None  # a dead process's memory goes with _open
            if coordinator is not None:
                self.log(f"broker {b}: coordinator of epoch {coordinator.leader_epoch} resigns")
                del self.coordinators[b]
            return None
        replica = broker.replicas[sp]
        if coordinator is not None and (
            coordinator.leader_epoch != replica.leader_epoch
            or coordinator.incarnation != broker.incarnation
        ):
            self.log(f"broker {b}: coordinator of epoch {coordinator.leader_epoch} resigns")
            coordinator = None
        log = broker.logs[sp]
        if coordinator is None:
            shard = TransactionCoordinatorShard(
                TxnConfig(),
                self.producer_ids,
                bump_epoch_on_end=self.txn_config.bump_epoch_on_end,
            )
            coordinator = SimCoordinator(
                b, broker.incarnation, replica.leader_epoch, shard, log.log_end_offset
            )
            self.coordinators[b] = coordinator
            self.log(
                f"broker {b}: coordinator of epoch {replica.leader_epoch} loads up to "
                f"{coordinator.target}"
            )
        if not coordinator.loaded and log.high_watermark >= coordinator.target:
            self._load(broker, coordinator)
        if coordinator.loaded:
            self._release(broker, coordinator)
        return coordinator

    def _load(self, broker: BrokerSim, coordinator: SimCoordinator) -> None:
        log = broker.logs[self.state_partition]
        below = log.high_watermark
        for _, record in state_records(log, below):
            coordinator.shard.replay(record)
        coordinator.loaded = True
        coordinator.last_written = below
        coordinator.next_timeout_check = self.now_ms
        prepared = coordinator.shard.become_loaded(self.now_ms)
        self.log(
            f"broker {broker.broker_id}: coordinator loaded below {below} "
            f"({len(coordinator.shard.transactions)} ids, {len(prepared)} prepared)"
        )
        for pending in prepared:
            self._start_completing(coordinator, pending)

    def _release(self, broker: BrokerSim, coordinator: SimCoordinator) -> None:
        """The answers whose records the HW has passed."""
        hw = broker.logs[self.state_partition].high_watermark
        ready = [then for required, then in coordinator.waiting if required <= hw]
        if not ready:
            return
        coordinator.waiting = [(r, then) for r, then in coordinator.waiting if r > hw]
        for then in ready:
            then()

    def _write(
        self, coordinator: SimCoordinator, records: tuple[TxnRecord, ...], then: Callable[[], None]
    ) -> Errors:
        """Decide-then-replay: ``records`` appended to the leader's log and
        replayed at once; ``then`` runs once the HW passes them (and every
        earlier write).  An error if the append was refused (nothing
        replayed)."""
        broker = self.brokers[coordinator.broker_id]
        if records:
            now = self.now_ms
            stored = []
            for i, record in enumerate(records):
                key, value = codec.encode(record)
                stored.append(Record(i, now, key, value))
            batch = build_batch(stored, base_timestamp=now, max_timestamp=now)
            try:
                append = broker.replicas[self.state_partition].append_as_leader(batch, -1, now)
            except ReplicaError as error:
                return error.code
            for record in records:
                coordinator.shard.replay(record)
            coordinator.last_written = append.info.last_offset + 1
            self.log(
                f"broker {broker.broker_id}: coordinator writes "
                + ", ".join(_describe(r) for r in records)
                + f" at {append.info.first_offset}"
            )
        coordinator.waiting.append((coordinator.last_written, then))
        self._release(broker, coordinator)
        return Errors.NONE

    def _coordinator_request(self, broker: BrokerSim, src: int, msg: TxnRequest) -> None:
        def answer(error: Errors, producer_id: int = -1, producer_epoch: int = -1) -> None:
            self.send(
                broker.broker_id,
                src,
                CoordinatorAnswer(msg.attempt, msg.producer, error, producer_id, producer_epoch),
            )

        coordinator = self.coordinator_on(broker)
        if coordinator is None:
            answer(Errors.NOT_COORDINATOR)
            return
        if not coordinator.loaded:
            answer(Errors.COORDINATOR_LOAD_IN_PROGRESS)
            return
        shard, now = coordinator.shard, self.now_ms
        request = msg.request
        pending: PendingMarkers | None = None
        if isinstance(request, InitPidRequest):
            init = shard.init_producer_id(
                request.transactional_id,
                request.timeout_ms,
                request.producer_id,
                request.producer_epoch,
                now_ms=now,
            )
            records, response = init.records, init.response
            error, pid, epoch = response.error, response.producer_id, response.producer_epoch
            pending = response.pending
        elif isinstance(request, AddPartitionsRequest):
            added = shard.add_partitions(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                [TopicPartition(TOPIC, p) for p in request.partitions],
                now,
            )
            records, error, pid, epoch = added.records, added.response.error, -1, -1
        else:
            assert isinstance(request, EndTxnRequest)
            ended = shard.end_txn(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.commit,
                now,
            )
            records, response_end = ended.records, ended.response
            error = response_end.error
            pid, epoch = response_end.producer_id, response_end.producer_epoch
            pending = response_end.pending
            self.end_txn_answers.append(
                (request.txn, request.commit, request.producer_epoch, error.name)
            )
            self.log(
                f"broker {broker.broker_id}: EndTxn({'commit' if request.commit else 'abort'}) "
                f"of transaction {request.txn[2]} of {request.txn[0]} at epoch "
                f"{request.producer_epoch}: {error.name}"
            )

        def then() -> None:
            answer(error, pid, epoch)
            if pending is not None:
                self._start_completing(coordinator, pending)

        refused = self._write(coordinator, records, then)
        if refused is not Errors.NONE:
            answer(refused)

    def _coordinator_verify(self, broker: BrokerSim, src: int, msg: VerifyRequest) -> None:
        def answer(error: Errors) -> None:
            self.send(broker.broker_id, src, VerifyAnswer(msg.verification, error))

        coordinator = self.coordinator_on(broker)
        if coordinator is None:
            answer(Errors.NOT_COORDINATOR)
            return
        if not coordinator.loaded:
            answer(Errors.COORDINATOR_LOAD_IN_PROGRESS)
            return
        tp = TopicPartition(TOPIC, msg.partition)
        found = coordinator.shard.verify_partitions(
            msg.transactional_id, msg.producer_id, msg.producer_epoch, [tp]
        )
        error = found[tp][0]
        self._write(coordinator, (), lambda: answer(error))

    def _coordinator_tick(self, coordinator: SimCoordinator) -> None:
        now = self.now_ms
        if now >= coordinator.next_timeout_check:
            coordinator.next_timeout_check = now + self.txn_config.timeout_check_interval_ms
            result = coordinator.shard.tick(now)
            if result.records:
                timed_out = result.response

                def then() -> None:
                    for pending in timed_out:
                        self._start_completing(coordinator, pending)

                self._write(coordinator, result.records, then)
        for completing in list(coordinator.completing.values()):
            if completing.remaining:
                self._send_markers(coordinator, completing)
            elif not completing.completed:
                self._complete_txn(coordinator, completing)

    def _start_completing(self, coordinator: SimCoordinator, pending: PendingMarkers) -> None:
        if self.coordinators.get(coordinator.broker_id) is not coordinator:
            return
        tid = pending.transactional_id
        if tid in coordinator.completing:
            return
        markers = pending.markers
        if self.txn_config.complete_after_first_marker:
            # The broken rule: only the first marker is written before the
            # transaction completes.
            markers = markers[:1]
        completing = _Completing(pending, {m.partition: m for m in markers})
        coordinator.completing[tid] = completing
        if completing.remaining:
            self._send_markers(coordinator, completing)
        else:
            self._complete_txn(coordinator, completing)

    def _send_markers(self, coordinator: SimCoordinator, completing: _Completing) -> None:
        now = self.now_ms
        for p, marker in sorted(completing.remaining.items()):
            sent = completing.sent.get(p)
            if sent is not None and now - sent < self.txn_config.marker_retry_ms:
                continue
            leader = self.leader_of(p)
            if leader == NO_LEADER:
                continue
            completing.sent[p] = now
            self.send(
                coordinator.broker_id,
                leader,
                MarkerRequest(
                    completing.pending.transactional_id, marker, coordinator.leader_epoch
                ),
            )

    def _marker_answer(self, broker: BrokerSim, msg: MarkerAnswer) -> None:
        coordinator = self.coordinator_on(broker)
        if coordinator is None or not coordinator.loaded:
            return
        completing = coordinator.completing.get(msg.transactional_id)
        marker = msg.marker
        if (
            completing is None
            or marker.partition not in completing.remaining
            or completing.remaining[marker.partition] != marker
        ):
            return
        if msg.error is Errors.NONE:
            del completing.remaining[marker.partition]
            if not completing.remaining:
                self._complete_txn(coordinator, completing)
        elif msg.error in _MARKER_RETRIABLE:
            # Sent again after the backoff.
            completing.sent[marker.partition] = (
                self.now_ms - self.txn_config.marker_retry_ms + self.txn_config.retry_backoff_ms
            )
        else:
            # A newer coordinator decides this id now (the runtime gives up).
            self.log(
                f"broker {broker.broker_id}: marker of {msg.transactional_id} on "
                f"p{marker.partition} refused ({msg.error.name}): giving up"
            )
            del coordinator.completing[msg.transactional_id]

    def _complete_txn(self, coordinator: SimCoordinator, completing: _Completing) -> None:
        pending = completing.pending
        tid = pending.transactional_id
        result = coordinator.shard.complete_txn(
            tid, pending.producer_id, pending.producer_epoch, self.now_ms
        )
        if result.response.error is not Errors.NONE:
            self.log(f"coordinator: {tid} not completed: {result.response.message}")
            coordinator.completing.pop(tid, None)
            return

        def then() -> None:
            if coordinator.completing.get(tid) is completing:
                del coordinator.completing[tid]

        if self._write(coordinator, result.records, then) is Errors.NONE:
            completing.completed = True


def _timer() -> Message:
    return Message(CLIENT, CLIENT, ClientTimer())


def _describe(record: TxnRecord) -> str:
    value = record.value
    if value is None:
        return f"{record.key.transactional_id} deleted"
    state = TransactionState(value.state).name
    return (
        f"{record.key.transactional_id} {state} producer {value.producer_id} epoch "
        f"{value.producer_epoch}"
        + (f" {sorted(tp.partition for tp in value.partitions)}" if value.partitions else "")
    )

"""A seeded, deterministic simulation of several brokers replicating
partitions, driven by a controller stub, on a simulated network in virtual
time.

Each broker holds a :class:`~broker.replica.PartitionReplica` of each of its
partitions over a :class:`PartitionLog` on its own :class:`MemoryDirectory`.
Everything that happens is an event taken from one queue ordered by
(virtual time, sequence number): a message delivered, a broker's or the
controller's periodic tick, or an action of the workload or the nemesis.
Every random choice comes from one ``random.Random(seed)``, so a seed and
the same calls replay the same run. After every event the invariants
(:mod:`broker.sim.invariants`) are checked; the first that fails raises
:class:`~broker.sim.invariants.Violation` naming the seed and the event.

- **Brokers** pull the controller's metadata log every
  ``metadata_interval_ms`` (so they learn changes late, as observers of the
  metadata log do), apply partition changes with ``become_leader`` /
  ``become_follower``, heartbeat, fetch from their leaders (one fetch in
  flight per partition), run the ISR expiration, send AlterPartition (one in
  flight, resent after a timeout) and answer produces (acks=all wait in a
  purgatory until the HW passes them, or time out).
- **The network** delays each message uniformly in [min, max] ms, drops it
  with the configured chance, and drops what crosses a cut link (one-way
  cuts, isolation). The controller (:data:`CONTROLLER`) and the clients
  (:data:`CLIENT`) are endpoints too.
- **The nemesis**: a power loss (``MemoryDirectory.crash`` with the run's
  rng: unsynced bytes lost, a torn tail possible), a process kill (what was
  written survives), restart (logs reopened with the checkpointed HW, a new
  registration and broker epoch), pause/resume, isolate, one-way cuts, heal.
- **Clients**: producers with acks=1 and acks=all recording every outcome,
  consumers reading from the leader below its HW (from its log start when
  their position lies below it, as ``auto.offset.reset=earliest``), and
  DeleteRecords sent to the leader, which moves its log start and answers
  once the low watermark reached the offset (``DelayedDeleteRecords``) or
  the request timed out; the followers move theirs from their fetch
  answers.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from broker.errors import Errors, ReplicaError
from broker.replica import (
    AlterPartitionRequest,
    LeaderFetchOutcome,
    MappingBrokerView,
    PartitionReplica,
    Role,
)
from broker.replica.leader import consumer_read_bound
from broker.replica.types import (
    AlterPartitionResult,
    FetchAnswer,
    FetchRequest,
    FollowerStep,
    ReplicaConfig,
)
from broker.sim.config import SimConfig
from broker.sim.controller import BrokerChange, PartitionChange, SimController
from broker.sim.logs import BatchId, read_values
from metadata.records import NO_LEADER
from partition_log.batch import BatchScanner, build_batch
from partition_log.errors import PartitionLogError
from partition_log.files import MemoryDirectory
from partition_log.log import LogConfig, PartitionLog
from partition_log.records import Record

__all__ = [
    "CLIENT",
    "CONTROLLER",
    "Acked",
    "BrokerSim",
    "Consumed",
    "ExtraBody",
    "Outcome",
    "Recorder",
    "SimCluster",
    "batches_at",
]

CONTROLLER = -1
CLIENT = -2


class Recorder(Protocol):
    """What a history recorder hears of a run (:mod:`broker.sim.history`)."""

    def send_invoked(self, outcome: Outcome) -> None: ...

    def send_completed(self, outcome: Outcome) -> None: ...

    def polled(self, p: int, leader: int | None, got: list[Consumed] | None) -> None: ...

    def nemesis(self, f: str, value: dict[str, object]) -> None: ...


# -- messages ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchMsg:
    partition: int
    request: FetchRequest


@dataclass(frozen=True, slots=True)
class FetchReply:
    partition: int
    request: FetchRequest
    answer: FetchAnswer


@dataclass(frozen=True, slots=True)
class AlterMsg:
    partition: int
    request: AlterPartitionRequest


@dataclass(frozen=True, slots=True)
class AlterReply:
    partition: int
    request: AlterPartitionRequest
    result: AlterPartitionResult | None
    error: Errors


@dataclass(frozen=True, slots=True)
class HeartbeatMsg:
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class ProduceMsg:
    op: int
    partition: int
    value: str
    acks: int


@dataclass(frozen=True, slots=True)
class ProduceReply:
    op: int
    error: Errors
    offset: int = -1
    batch: BatchId | None = None


@dataclass(frozen=True, slots=True)
class DeleteMsg:
    op: int
    partition: int
    # -1: the leader's HW.
    offset: int


@dataclass(frozen=True, slots=True)
class DeleteReply:
    op: int
    partition: int
    error: Errors
    # The offset the leader's log start was raised to (-1 on a refusal).
    offset: int = -1
    low_watermark: int = -1


@dataclass(frozen=True, slots=True)
class HeldFetch:
    """A leader's own reminder: the fetch of ``follower`` it holds is due
    (``DelayedFetch`` expiring)."""

    partition: int
    request: FetchRequest
    follower: int


class ExtraBody:
    """The base of the messages of a simulation built on this one (the
    transactions' requests and answers, :mod:`broker.sim.txn`): the subclass
    that sends them delivers them, and this class's brokers ignore them."""

    __slots__ = ()


Body = (
    FetchMsg
    | FetchReply
    | AlterMsg
    | AlterReply
    | HeartbeatMsg
    | ProduceMsg
    | ProduceReply
    | DeleteMsg
    | DeleteReply
    | HeldFetch
    | ExtraBody
)


@dataclass(frozen=True, slots=True)
class Message:
    src: int
    dst: int
    body: Body


# -- what clients saw ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acked:
    """An acks=all produce answered NONE: its batch at ``offset``."""

    partition: int
    offset: int
    batch: BatchId
    value: str


@dataclass(frozen=True, slots=True)
class Consumed:
    """A record a consumer read at ``offset`` (below the leader's HW)."""

    partition: int
    offset: int
    batch: BatchId
    value: str


@dataclass(slots=True)
class Outcome:
    """One produce: invoked at ``invoked_ms``, then ``ok``, ``fail``
    (definitely not written) or ``info`` (unknown)."""

    op: int
    partition: int
    value: str
    acks: int
    node: int
    invoked_ms: int
    status: str = "pending"
    error: str | None = None
    offset: int | None = None
    epoch: int | None = None
    completed_ms: int | None = None


# Errors a produce gets before anything is written: the write did not happen.
_DEFINITE = frozenset(
    {
        Errors.NOT_ENOUGH_REPLICAS,
        Errors.INVALID_REQUIRED_ACKS,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
    }
)


@dataclass(slots=True)
class _Waiting:
    op: int
    partition: int
    required: int
    leader_epoch: int
    offset: int
    batch: BatchId
    deadline_ms: int


@dataclass(slots=True)
class _WaitingDelete:
    op: int
    partition: int
    required: int
    low_watermark: int
    deadline_ms: int


@dataclass(slots=True)
class BrokerSim:
    """One simulated broker: its process state, logs and replicas."""

    broker_id: int
    partitions: tuple[int, ...]
    directories: dict[int, MemoryDirectory]
    alive: bool = True
    paused: bool = False
    broker_epoch: int = -1
    incarnation: int = 0
    lost_power: bool = False
    # Power losses so far: a log start may go back across one (the records
    # beneath it lost with the unsynced tail).
    power_losses: int = 0
    registered: bool = True
    logs: dict[int, PartitionLog] = field(default_factory=dict)
    replicas: dict[int, PartitionReplica] = field(default_factory=dict)
    view: MappingBrokerView = field(default_factory=lambda: MappingBrokerView({}))
    metadata_offset: int = 0
    fetching: dict[int, tuple[FetchRequest, int]] = field(default_factory=dict)
    backoff_until: dict[int, int] = field(default_factory=dict)
    altering: dict[int, tuple[AlterPartitionRequest, int]] = field(default_factory=dict)
    purgatory: list[_Waiting] = field(default_factory=list)
    delete_purgatory: list[_WaitingDelete] = field(default_factory=list)
    next_heartbeat_ms: int = 0
    next_metadata_ms: int = 0
    next_isr_ms: int = 0
    # The HW each log had, written as Kafka's replication-offset-checkpoint.
    hw_checkpoint: dict[int, int] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.alive and not self.paused


class SimCluster:
    """The brokers, the controller, the network and the clients of one run."""

    def __init__(
        self,
        seed: int,
        config: SimConfig | None = None,
        *,
        auto_fetch: bool = True,
        check: Callable[[SimCluster], None] | None = None,
    ) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.events = 0
        self.trace: list[str] = []
        self._logged_metadata = 0
        # Scripted schedules fetch explicitly (``fetch``) for exact
        # interleavings; random runs fetch on every tick.
        self.auto_fetch = auto_fetch
        # Followers whose fetches their leader holds this many ms before it
        # answers: a replica.fetch.wait.max.ms with a replica.fetch.min.bytes
        # that no answer reaches, so that the follower fetches in chunks of
        # that long's writes (kq's DelayedFetch; the chaos harness's
        # elect-catching-up-follower sets it on the next leader).  The leader
        # reads the fetch when it comes (the follower's state, the HW) and
        # again when it answers, as kq's service does.
        self.held_fetches: dict[int, int] = {}
        self._queue: list[tuple[int, int, str, object]] = []
        self._seq = 0
        self.cut: set[tuple[int, int]] = set()
        self.drop_rate = self.config.drop_rate
        self.messages_sent = 0
        self.messages_dropped = 0
        self.log_config = LogConfig(flush_messages=self.config.flush_messages)
        self.replica_config = ReplicaConfig(
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            min_insync_replicas=self.config.min_insync_replicas,
        )
        n, rf = self.config.brokers, self.config.rf
        assignments = {
            p: tuple((p + i) % n for i in range(rf)) for p in range(self.config.partitions)
        }
        self.assignments = assignments
        self.controller = SimController(self.config, assignments)
        self.brokers: dict[int, BrokerSim] = {}
        for b in range(n):
            held = tuple(p for p, replicas in assignments.items() if b in replicas)
            broker = BrokerSim(b, held, {p: MemoryDirectory() for p in held})
            self.brokers[b] = broker
            self._open(broker)
            broker.broker_epoch = self.controller.register(b, 0, unclean_shutdown=False)
            self._schedule(self.rng.randint(0, self.config.fetch_interval_ms), "tick", b)
        self._schedule(100, "tick", CONTROLLER)
        # Clients.
        self.outcomes: dict[int, Outcome] = {}
        self.acked: list[Acked] = []
        self.consumed: list[Consumed] = []
        # DeleteRecords: the highest offset a leader raised its log start to
        # (applied), and the highest one answered NONE (acknowledged: every
        # replica on a live broker and every ISR and ELR member had moved
        # its log start there), by
        # partition; the answers by operation.
        self.deletes_applied: dict[int, int] = dict.fromkeys(assignments, 0)
        self.deletes_acked: dict[int, int] = dict.fromkeys(assignments, 0)
        self.delete_replies: dict[int, DeleteReply] = {}
        self._next_delete = 0
        # The last poll: partition, leader, records, the leader's HW.
        self.last_poll: tuple[int, int, list[Consumed], int] | None = None
        self.positions: dict[int, int] = dict.fromkeys(assignments, 0)
        self._next_op = 0
        # The invariants, called after every event, and a history recorder.
        self.check = check
        self.recorder: Recorder | None = None
        # Partitions where some broker power-lost since it last joined the
        # ISR: (partition, broker); the power-loss guard skips them.
        self.tainted: set[tuple[int, int]] = set()
        for broker in self.brokers.values():
            self._pull_metadata(broker)

    # -- events ---------------------------------------------------------------------

    def _schedule(self, delay_ms: int, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ms + delay_ms, self._seq, kind, payload))

    def log(self, line: str) -> None:
        self.trace.append(f"{self.now_ms:>7} #{self.events} {line}")

    def _event_done(self, what: str) -> None:
        del what  # named for readers of the caller; the trace has the details
        self.events += 1
        changes = self.controller.changes_since(self._logged_metadata)
        self._logged_metadata += len(changes)
        for change in changes:
            if isinstance(change, PartitionChange):
                r = change.registration
                self.log(
                    f"p{change.partition} leader {r.leader} epoch {r.leader_epoch} "
                    f"ISR {list(r.isr)} ELR {list(r.elr)} ({r.partition_epoch})"
                )
        if self.check is not None:
            self.check(self)

    def step(self) -> bool:
        """Process the next event; False if none is queued."""
        if not self._queue:
            return False
        when, _, kind, payload = heapq.heappop(self._queue)
        self.now_ms = max(self.now_ms, when)
        if kind == "deliver":
            assert isinstance(payload, Message)
            self._deliver(payload)
            what = f"deliver {type(payload.body).__name__} {payload.src}->{payload.dst}"
        else:
            assert isinstance(payload, int)
            if payload == CONTROLLER:
                self._controller_tick()
            else:
                self._broker_tick(self.brokers[payload])
            what = f"tick {payload}"
        self._event_done(what)
        return True

    def run_for(self, ms: int, max_events: int | None = None) -> None:
        """Process every event due within ``ms`` of virtual time (at most
        ``max_events``), then move the clock to the end."""
        end = self.now_ms + ms
        done = 0
        while self._queue and self._queue[0][0] <= end:
            if max_events is not None and done >= max_events:
                return
            self.step()
            done += 1
        self.now_ms = end

    def action(self, what: str) -> None:
        """An action of the workload or nemesis counts as an event."""
        self.log(what)
        self._event_done(what)

    # -- the network ---------------------------------------------------------------------

    def connected(self, src: int, dst: int) -> bool:
        return (src, dst) not in self.cut

    def _endpoint_up(self, node: int) -> bool:
        return node < 0 or self.brokers[node].up

    def send(self, src: int, dst: int, body: Body) -> None:
        self.messages_sent += 1
        if not self.connected(src, dst) or (self.drop_rate and self.rng.random() < self.drop_rate):
            self.messages_dropped += 1
            return
        delay = self.rng.randint(self.config.min_delay_ms, self.config.max_delay_ms)
        self._schedule(delay, "deliver", Message(src, dst, body))

    def _deliver(self, message: Message) -> None:
        # A cut made while the message was in flight drops it too; a paused or
        # dead process loses what reaches it (its connections reset).
        if not self.connected(message.src, message.dst) or not self._endpoint_up(message.dst):
            self.messages_dropped += 1
            return
        body = message.body
        if message.dst == CONTROLLER:
            self._controller_receive(message.src, body)
        elif message.dst == CLIENT:
            if isinstance(body, DeleteReply):
                self._client_delete_reply(body)
            else:
                assert isinstance(body, ProduceReply)
                self._client_receive(message.src, body)
        else:
            self._broker_receive(self.brokers[message.dst], message.src, body)

    # -- the controller -------------------------------------------------------------------

    def _controller_tick(self) -> None:
        for broker_id in self.controller.tick(self.now_ms):
            self.log(f"controller fences broker {broker_id} (no heartbeat)")
        self._schedule(100, "tick", CONTROLLER)

    def _controller_receive(self, src: int, body: Body) -> None:
        if isinstance(body, HeartbeatMsg):
            self.controller.heartbeat(src, body.broker_epoch, self.now_ms)
        elif isinstance(body, AlterMsg):
            before = self.controller.partitions[body.partition].isr
            result, error = self.controller.alter_partition(body.partition, body.request)
            if result is not None:
                for b in set(result.isr) - set(before):
                    self.tainted.discard((body.partition, b))
                self.log(f"p{body.partition} AlterPartition from {src}: ISR {list(result.isr)}")
            self.send(CONTROLLER, src, AlterReply(body.partition, body.request, result, error))

    # -- brokers --------------------------------------------------------------------------

    def _open(self, broker: BrokerSim) -> None:
        broker.incarnation += 1
        broker.view = MappingBrokerView(dict(broker.view.brokers))
        broker.logs = {}
        broker.replicas = {}
        for p in broker.partitions:
            log = PartitionLog.open(
                broker.directories[p],
                self.log_config,
                now_ms=self.now_ms,
                high_watermark=broker.hw_checkpoint.get(p, 0),
            )
            broker.logs[p] = log
            broker.replicas[p] = PartitionReplica(
                broker.broker_id, log, self.replica_config, broker.view
            )
        broker.metadata_offset = 0
        broker.fetching = {}
        broker.backoff_until = {}
        broker.altering = {}
        broker.purgatory = []
        broker.delete_purgatory = []

    def _pull_metadata(self, broker: BrokerSim) -> None:
        """Apply the metadata log from where this broker stopped."""
        if not (
            self.connected(broker.broker_id, CONTROLLER)
            and self.connected(CONTROLLER, broker.broker_id)
        ):
            return
        changes = self.controller.changes_since(broker.metadata_offset)
        broker.metadata_offset += len(changes)
        # Applied as one delta (MetadataDelta): the registrations first, then
        # each partition's latest state; a restarted broker starts from the
        # image, never from older states of its partitions.
        registrations = dict(broker.view.brokers)
        latest: dict[int, PartitionChange] = {}
        for change in changes:
            if isinstance(change, BrokerChange):
                registrations[change.registration.broker_id] = change.registration
            else:
                latest[change.partition] = change
        broker.view.brokers = registrations
        for p in sorted(latest):
            self._apply_partition(broker, latest[p])
        # A fenced broker's replica is no longer waited for.
        self._complete_deletes(broker)

    def _apply_partition(self, broker: BrokerSim, change: PartitionChange) -> None:
        p, registration = change.partition, change.registration
        replica = broker.replicas.get(p)
        if replica is None or broker.broker_id not in registration.replicas:
            return
        if registration.leader == broker.broker_id:
            changed = replica.become_leader(registration, self.now_ms)
        else:
            changed = replica.become_follower(registration, self.now_ms)
        if changed:
            broker.fetching.pop(p, None)
            broker.altering.pop(p, None)
            self._complete_waiting(broker)
            self._complete_deletes(broker)

    def _broker_tick(self, broker: BrokerSim) -> None:
        config = self.config
        self._schedule(config.fetch_interval_ms, "tick", broker.broker_id)
        if not broker.up:
            return
        if not broker.registered:
            self._register(broker)
            if not broker.registered:
                return
        now = self.now_ms
        for p, log in broker.logs.items():
            broker.hw_checkpoint[p] = log.high_watermark
        if now >= broker.next_heartbeat_ms:
            broker.next_heartbeat_ms = now + config.heartbeat_interval_ms
            self.send(broker.broker_id, CONTROLLER, HeartbeatMsg(broker.broker_epoch))
        if now >= broker.next_metadata_ms:
            broker.next_metadata_ms = now + config.metadata_interval_ms
            self._pull_metadata(broker)
        if now >= broker.next_isr_ms:
            broker.next_isr_ms = now + config.isr_tick_ms
            for p, replica in broker.replicas.items():
                if p not in broker.altering:
                    request = replica.tick_isr(now)
                    if request is not None:
                        self._send_alter(broker, p, request)
        for p, (request, sent) in list(broker.altering.items()):
            if now - sent >= config.alter_partition_timeout_ms:
                self._send_alter(broker, p, request)
        if self.auto_fetch:
            for p in broker.partitions:
                self.fetch(broker.broker_id, p)
        # Delayed produces that waited too long (the request timeout).
        late = [w for w in broker.purgatory if now >= w.deadline_ms]
        for waiting in late:
            broker.purgatory.remove(waiting)
            self.send(broker.broker_id, CLIENT, ProduceReply(waiting.op, Errors.REQUEST_TIMED_OUT))
        for deleting in [w for w in broker.delete_purgatory if now >= w.deadline_ms]:
            broker.delete_purgatory.remove(deleting)
            reply = DeleteReply(
                deleting.op,
                deleting.partition,
                Errors.REQUEST_TIMED_OUT,
                deleting.required,
                deleting.low_watermark,
            )
            self.send(broker.broker_id, CLIENT, reply)

    def _send_alter(self, broker: BrokerSim, p: int, request: AlterPartitionRequest) -> None:
        broker.altering[p] = (request, self.now_ms)
        self.send(broker.broker_id, CONTROLLER, AlterMsg(p, request))

    def fetch(self, broker_id: int, p: int, max_bytes: int | None = None) -> bool:
        """Send the follower's next fetch of ``p`` if none is in flight."""
        broker = self.brokers[broker_id]
        if not broker.up:
            return False
        replica = broker.replicas[p]
        pending = broker.fetching.get(p)
        # A held fetch is given up only once its hold is over too.
        timeout = self.config.fetch_timeout_ms + self.held_fetches.get(broker_id, 0)
        if pending is not None and self.now_ms - pending[1] < timeout:
            return False
        if self.now_ms < broker.backoff_until.get(p, 0):
            return False
        request = replica.next_fetch_request(broker.broker_epoch)
        if request is None:
            return False
        if max_bytes is None:
            max_bytes = self.config.replica_fetch_max_bytes
        if max_bytes is not None:
            request = FetchRequest(
                request.replica_id,
                request.replica_epoch,
                request.current_leader_epoch,
                request.fetch_offset,
                request.last_fetched_epoch,
                request.log_start_offset,
                max_bytes,
            )
        broker.fetching[p] = (request, self.now_ms)
        self.send(broker_id, replica.leader_id, FetchMsg(p, request))
        return True

    def _step_fetch(
        self,
        broker: BrokerSim,
        replica: PartitionReplica,
        partition: int,
        request: FetchRequest,
        now: int,
    ) -> LeaderFetchOutcome:
        """A leader's step of a follower's fetch, with what it asks of the
        controller (an ISR change) and of held produces (a moved HW)."""
        outcome = replica.step_fetch(request, now)
        if outcome.alter_partition is not None:
            self._send_alter(broker, partition, outcome.alter_partition)
        if outcome.high_watermark_moved:
            self._complete_waiting(broker)
        if outcome.low_watermark_moved:
            self._complete_deletes(broker)
        return outcome

    def _broker_receive(self, broker: BrokerSim, src: int, body: Body) -> None:
        now = self.now_ms
        if isinstance(body, FetchMsg):
            replica = broker.replicas.get(body.partition)
            if replica is None:
                return
            outcome = self._step_fetch(broker, replica, body.partition, body.request, now)
            hold = self.held_fetches.get(src, 0)
            answer = outcome.answer
            if hold and answer.error is Errors.NONE and answer.diverging_epoch is None:
                # Held (an error or a divergence is answered at once, as
                # DelayedFetch.tryComplete does); lost if this broker dies.
                due = HeldFetch(body.partition, body.request, src)
                self._schedule(hold, "deliver", Message(broker.broker_id, broker.broker_id, due))
                return
            self.send(broker.broker_id, src, FetchReply(body.partition, body.request, answer))
        elif isinstance(body, HeldFetch):
            replica = broker.replicas.get(body.partition)
            if replica is None:
                return
            outcome = self._step_fetch(broker, replica, body.partition, body.request, now)
            self.send(
                broker.broker_id,
                body.follower,
                FetchReply(body.partition, body.request, outcome.answer),
            )
        elif isinstance(body, FetchReply):
            pending = broker.fetching.get(body.partition)
            if pending is None or pending[0] != body.request:
                return
            del broker.fetching[body.partition]
            replica = broker.replicas[body.partition]
            result = replica.step_fetch_answer(body.request, body.answer, now)
            if result.truncation is not None:
                t = result.truncation
                self.log(
                    f"p{body.partition} broker {broker.broker_id} truncates "
                    f"{t.log_end_offset} -> {t.offset}"
                )
            if result.step is FollowerStep.BACKOFF:
                broker.backoff_until[body.partition] = now + 100
        elif isinstance(body, AlterReply):
            pending_alter = broker.altering.get(body.partition)
            if pending_alter is None or pending_alter[0] != body.request:
                return
            del broker.altering[body.partition]
            replica = broker.replicas[body.partition]
            if body.result is not None:
                if replica.step_alter_partition_result(body.request, body.result, now):
                    self._complete_waiting(broker)
            else:
                again = replica.step_alter_partition_error(body.request, body.error)
                if again is not None:
                    self._send_alter(broker, body.partition, again)
        elif isinstance(body, ProduceMsg):
            self._produce_on(broker, body)
        elif isinstance(body, DeleteMsg):
            self._delete_on(broker, body)

    def _produce_on(self, broker: BrokerSim, msg: ProduceMsg) -> None:
        replica = broker.replicas.get(msg.partition)
        if replica is None:
            reply = ProduceReply(msg.op, Errors.UNKNOWN_TOPIC_OR_PARTITION)
            self.send(broker.broker_id, CLIENT, reply)
            return
        try:
            append = replica.append_as_leader(
                build_batch([Record(0, self.now_ms, None, msg.value.encode())]),
                msg.acks,
                self.now_ms,
            )
        except ReplicaError as error:
            self.send(broker.broker_id, CLIENT, ProduceReply(msg.op, error.code))
            return
        offset = append.info.first_offset
        batch = batches_at(broker.logs[msg.partition], offset)
        if msg.acks == -1:
            broker.purgatory.append(
                _Waiting(
                    msg.op,
                    msg.partition,
                    append.info.last_offset + 1,
                    append.leader_epoch,
                    offset,
                    batch,
                    self.now_ms + self.config.produce_timeout_ms,
                )
            )
            self._complete_waiting(broker)
        else:
            self.send(broker.broker_id, CLIENT, ProduceReply(msg.op, Errors.NONE, offset, batch))
            if append.high_watermark_moved:
                self._complete_waiting(broker)

    def _complete_waiting(self, broker: BrokerSim) -> None:
        """``DelayedProduce.tryComplete`` for every waiting produce."""
        still = []
        for waiting in broker.purgatory:
            check = broker.replicas[waiting.partition].check_enough_replicas_reach_offset(
                waiting.required, waiting.leader_epoch
            )
            if not check.done:
                still.append(waiting)
                continue
            self.send(
                broker.broker_id,
                CLIENT,
                ProduceReply(waiting.op, check.error, waiting.offset, waiting.batch),
            )
        broker.purgatory = still

    def _delete_on(self, broker: BrokerSim, msg: DeleteMsg) -> None:
        """``ReplicaManager.deleteRecords`` on one partition: the leader's log
        start moves, then the answer waits for the low watermark."""
        replica = broker.replicas.get(msg.partition)
        if replica is None:
            reply = DeleteReply(msg.op, msg.partition, Errors.UNKNOWN_TOPIC_OR_PARTITION)
            self.send(broker.broker_id, CLIENT, reply)
            return
        try:
            result = replica.delete_records(msg.offset, self.now_ms)
        except ReplicaError as error:
            self.send(broker.broker_id, CLIENT, DeleteReply(msg.op, msg.partition, error.code))
            return
        p = msg.partition
        self.deletes_applied[p] = max(self.deletes_applied[p], result.requested_offset)
        self.log(
            f"p{p} broker {broker.broker_id} deletes records below {result.requested_offset} "
            f"(op {msg.op}, low watermark {result.low_watermark})"
        )
        broker.delete_purgatory.append(
            _WaitingDelete(
                msg.op,
                p,
                result.requested_offset,
                result.low_watermark,
                self.now_ms + self.config.produce_timeout_ms,
            )
        )
        self._complete_deletes(broker)

    def _complete_deletes(self, broker: BrokerSim) -> None:
        """``DelayedDeleteRecords.tryComplete`` for every waiting delete."""
        still = []
        for waiting in broker.delete_purgatory:
            check = broker.replicas[waiting.partition].check_delete_records(waiting.required)
            if not check.done:
                still.append(waiting)
                continue
            reply = DeleteReply(
                waiting.op, waiting.partition, check.error, waiting.required, check.low_watermark
            )
            self.send(broker.broker_id, CLIENT, reply)
        broker.delete_purgatory = still

    # -- clients ---------------------------------------------------------------------

    def delete_records(self, p: int, offset: int = -1) -> int:
        """An admin client's DeleteRecords of ``p`` below ``offset`` (-1: the
        HW), sent to the leader the controller names; returns its
        operation's number (its answer lands in ``delete_replies``)."""
        op = self._next_delete
        self._next_delete += 1
        leader = self.leader_of(p)
        if leader == NO_LEADER:
            self.delete_replies[op] = DeleteReply(op, p, Errors.NOT_LEADER_OR_FOLLOWER)
        else:
            self.send(CLIENT, leader, DeleteMsg(op, p, offset))
        return op

    def _client_delete_reply(self, reply: DeleteReply) -> None:
        if reply.op in self.delete_replies:
            return
        self.delete_replies[reply.op] = reply
        if reply.error is Errors.NONE:
            p = reply.partition
            self.deletes_acked[p] = max(self.deletes_acked[p], reply.offset)
        self.log(
            f"delete op {reply.op} p{reply.partition} below {reply.offset}: {reply.error.name} "
            f"(low watermark {reply.low_watermark})"
        )

    def leader_of(self, p: int) -> int:
        return self.controller.partitions[p].leader

    def serving_leader(self, p: int) -> int | None:
        """The broker leading ``p`` now: the controller's leader, up and
        leading at the controller's leader epoch (it has applied the
        change); None while there is none."""
        registration = self.controller.partitions[p]
        leader = registration.leader
        if leader == NO_LEADER or not self.brokers[leader].alive:
            return None
        replica = self.brokers[leader].replicas[p]
        if replica.role is not Role.LEADER or replica.leader_epoch != registration.leader_epoch:
            return None
        return leader

    def produce(self, p: int, acks: int = -1, value: str | None = None) -> int:
        """A producer sends one record to the leader the controller names
        (clients learn leaders from any broker's metadata; KIP-951 hints
        make that quick); returns the operation's number."""
        op = self._next_op
        self._next_op += 1
        value = value if value is not None else f"s{self.seed}-{op}"
        leader = self.leader_of(p)
        outcome = Outcome(op, p, value, acks, leader, self.now_ms)
        self.outcomes[op] = outcome
        if self.recorder is not None:
            self.recorder.send_invoked(outcome)
        if leader == NO_LEADER:
            self._complete(outcome, "fail", Errors.NOT_LEADER_OR_FOLLOWER)
        else:
            self.send(CLIENT, leader, ProduceMsg(op, p, value, acks))
        return op

    def _complete(
        self,
        outcome: Outcome,
        status: str,
        error: Errors | None,
        offset: int | None = None,
        batch: BatchId | None = None,
    ) -> None:
        outcome.status = status
        outcome.error = None if error is None else error.name.lower().replace("_", "-")
        outcome.offset = offset
        outcome.epoch = None if batch is None else batch[0]
        outcome.completed_ms = self.now_ms
        if self.recorder is not None:
            self.recorder.send_completed(outcome)

    def _client_receive(self, src: int, reply: ProduceReply) -> None:
        outcome = self.outcomes.get(reply.op)
        if outcome is None or outcome.status != "pending":
            return
        if reply.error is Errors.NONE:
            assert reply.batch is not None
            self._complete(outcome, "ok", None, reply.offset, reply.batch)
            if outcome.acks == -1:
                self.acked.append(
                    Acked(outcome.partition, reply.offset, reply.batch, outcome.value)
                )
        elif reply.error in _DEFINITE or (
            reply.error is Errors.NOT_LEADER_OR_FOLLOWER and reply.batch is None
        ):
            self._complete(outcome, "fail", reply.error)
        else:
            self._complete(outcome, "info", reply.error)

    def expire_produces(self) -> None:
        """Produces unanswered well past the request timeout are unknown."""
        limit = self.config.produce_timeout_ms + 2 * self.config.max_delay_ms + 100
        for outcome in self.outcomes.values():
            if outcome.status == "pending" and self.now_ms - outcome.invoked_ms > limit:
                self._complete(outcome, "info", Errors.REQUEST_TIMED_OUT)

    def poll(self, p: int, *, from_start: bool = False) -> list[Consumed] | None:
        """A consumer reads ``p`` from its position at the leader, below the
        HW; None if the leader is unreachable or refuses."""
        if from_start:
            self.positions[p] = 0
        leader = self.leader_of(p)
        broker = self.brokers.get(leader)
        if (
            broker is None
            or not broker.up
            or not (self.connected(CLIENT, leader) and self.connected(leader, CLIENT))
            or broker.replicas[p].role is not Role.LEADER
        ):
            if self.recorder is not None:
                self.recorder.polled(p, None, None)
            return None
        log = broker.logs[p]
        if self.positions[p] < log.log_start_offset:
            # OFFSET_OUT_OF_RANGE below the log start (DeleteRecords):
            # auto.offset.reset=earliest.
            self.positions[p] = log.log_start_offset
        limit = consumer_read_bound(log.high_watermark, log.log_end_offset)
        try:
            data = log.read(self.positions[p], 1 << 16, max_offset=limit)
        except PartitionLogError:
            if self.recorder is not None:
                self.recorder.polled(p, leader, None)
            return None
        got = [
            Consumed(p, offset, batch, value)
            for offset, batch, value in read_values(data)
            if offset >= self.positions[p]
        ]
        self.consumed.extend(got)
        if self.recorder is not None:
            self.recorder.polled(p, leader, got)
        if got:
            self.positions[p] = got[-1].offset + 1
        self.last_poll = (p, leader, got, log.high_watermark)
        self.action(f"poll p{p} from {leader}: {[c.offset for c in got]} (HW {log.high_watermark})")
        return got

    # -- the nemesis --------------------------------------------------------------------

    def safe_to_lose_power(self, broker_id: int) -> bool:
        """Another intact in-sync copy (a live ISR or ELR member that has not
        lost power since it joined) of every partition this broker is in
        the ISR or ELR of, or leads."""
        for p, registration in self.controller.partitions.items():
            holders = set(registration.isr) | set(registration.elr)
            if broker_id not in holders and registration.leader != broker_id:
                continue
            others = [
                b
                for b in holders
                if b != broker_id and self.brokers[b].alive and (p, b) not in self.tainted
            ]
            if not others:
                return False
        return True

    def power_loss(self, broker_id: int) -> None:
        """The broker's machine loses power: only synced bytes survive (with
        a torn prefix of an unsynced tail, drawn from the run's rng)."""
        broker = self.brokers[broker_id]
        if broker.paused:
            # A stopped process that dies is no longer stopped.
            self._fault("resume", {"nodes": [broker_id]})
        for p in broker.partitions:
            broker.directories[p].crash(self.rng)
            self.tainted.add((p, broker_id))
        broker.alive = False
        broker.paused = False
        broker.lost_power = True
        broker.power_losses += 1
        self._fault("kill", {"nodes": [broker_id], "kind": "power-loss"})
        self.action(f"power loss of broker {broker_id}")

    def kill(self, broker_id: int) -> None:
        """The process is killed: what it wrote reached the OS and survives."""
        broker = self.brokers[broker_id]
        if broker.paused:
            # A stopped process that dies is no longer stopped.
            self._fault("resume", {"nodes": [broker_id]})
        for log in broker.logs.values():
            log.close()
        broker.alive = False
        broker.paused = False
        self._fault("kill", {"nodes": [broker_id]})
        self.action(f"kill broker {broker_id}")

    def controlled_shutdown(self, broker_id: int) -> None:
        """SIGTERM: the broker asks the controller to shut down (if it can
        reach it), which moves its leaderships away, then closes its logs
        cleanly and stops."""
        broker = self.brokers[broker_id]
        if not broker.up:
            return
        if self.connected(broker_id, CONTROLLER) and self.connected(CONTROLLER, broker_id):
            self.controller.controlled_shutdown(broker_id)
        for log in broker.logs.values():
            log.close()
        broker.alive = False
        self._fault("kill", {"nodes": [broker_id], "kind": "controlled-shutdown"})
        self.action(f"controlled shutdown of broker {broker_id}")

    def restart(self, broker_id: int) -> None:
        """The broker starts again: logs reopened (recovery cuts a torn
        tail), a new registration and broker epoch, metadata from the start."""
        broker = self.brokers[broker_id]
        if broker.alive:
            return
        self._open(broker)
        broker.alive = True
        broker.registered = False
        self._register(broker)
        self._fault("start", {"nodes": [broker_id]})
        self.action(f"restart broker {broker_id}")

    def _register(self, broker: BrokerSim) -> None:
        """Register with the controller (retried on every tick until the
        controller is reachable); a new broker epoch."""
        broker_id = broker.broker_id
        if not (self.connected(broker_id, CONTROLLER) and self.connected(CONTROLLER, broker_id)):
            return
        broker.broker_epoch = self.controller.register(
            broker_id, self.now_ms, unclean_shutdown=broker.lost_power
        )
        broker.registered = True
        broker.lost_power = False
        self.log(f"broker {broker_id} registers (epoch {broker.broker_epoch})")
        self._pull_metadata(broker)

    def pause(self, broker_id: int) -> None:
        if self.brokers[broker_id].alive:
            self.brokers[broker_id].paused = True
            self._fault("pause", {"nodes": [broker_id]})
            self.action(f"pause broker {broker_id}")

    def resume(self, broker_id: int) -> None:
        self.brokers[broker_id].paused = False
        self._fault("resume", {"nodes": [broker_id]})
        self.action(f"resume broker {broker_id}")

    def isolate(self, node: int) -> None:
        """Cut ``node`` from every other endpoint, both ways."""
        for other in [*self.brokers, CONTROLLER, CLIENT]:
            if other != node:
                self.cut.add((node, other))
                self.cut.add((other, node))
        self._fault("partition", {"groups": self._isolation_groups(node), "kind": "isolate-one"})
        self.action(f"isolate {node}")

    def sever(self, node: int) -> None:
        """Cut ``node`` from every other broker, both ways, keeping its links
        to the controller and the clients (the chaos harness's
        ``sever-partition-leader``): it keeps its session and learns every
        election, but no replica fetches from it nor it from one."""
        for other in self.brokers:
            if other != node:
                self.cut.add((node, other))
                self.cut.add((other, node))
        rest = [_name(n) for n in [*self.brokers, CONTROLLER] if n != node]
        groups = [[_name(node), _name(CONTROLLER)], rest]
        self._fault("partition", {"groups": groups, "kind": "sever-partition-leader"})
        self.action(f"sever {node}")

    def cut_link(self, src: int, dst: int) -> None:
        """A one-way cut: messages from ``src`` to ``dst`` are lost."""
        self.cut.add((src, dst))
        self._fault("partition", {"one_way": [[_name(src), _name(dst)]], "kind": "one-way"})
        self.action(f"cut {src} -> {dst}")

    def _fault(self, f: str, value: dict[str, object]) -> None:
        if self.recorder is not None:
            self.recorder.nemesis(f, value)

    def _isolation_groups(self, node: int) -> list[list[object]]:
        others = [_name(n) for n in [*self.brokers, CONTROLLER] if n != node]
        return [[_name(node)], others]

    def heal(self) -> None:
        self.cut.clear()
        self.drop_rate = self.config.drop_rate
        self._fault("heal", {})
        self.action("heal")

    def lossy(self, rate: float) -> None:
        self.drop_rate = rate
        self._fault("packet", {"drop": rate})
        self.action(f"lossy {rate}")

    def flush(self, broker_id: int) -> None:
        """Sync every log of the broker (a scripted flush)."""
        broker = self.brokers[broker_id]
        for log in broker.logs.values():
            log.flush(self.now_ms)
        self.action(f"flush broker {broker_id}")


def _name(node: int) -> object:
    """A node in a nemesis op: a broker's id, or the controller or clients."""
    return {CONTROLLER: "controller", CLIENT: "clients"}.get(node, node)


def batches_at(log: PartitionLog, offset: int) -> BatchId:
    """The batch starting at ``offset`` of ``log``."""
    for batch in BatchScanner(log.read(offset, 1), check_crc=False):
        header = batch.header
        if header.base_offset == offset:
            return (header.partition_leader_epoch, header.crc)
    raise ValueError(f"no batch starts at offset {offset} of the log")

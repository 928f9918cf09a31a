"""The ``queue`` workload: Jepsen's Kafka workload against kq's brokers.

``concurrency`` workers, each a logical single-threaded client with its own
idempotent, pipelined producer (at most five requests in flight, retries;
``docs/clients.md``) and its own consumer, run ``send``, ``poll``,
``assign`` and consumer ``crash`` ops at a target rate and record them as
the ``queue`` model of ``docs/history-format.md`` says:

- a ``send`` queues one or more records (each to a key, a topic-partition
  of :class:`history.queue.KeyMap`; values are integers unique over the
  run) and waits for every record's future: each resolves ``ok`` with its
  offset, or fails with :class:`~broker.grpc_client.DeliveryFailedError`
  whose ``outcome`` says ``fail`` (definitely not in the log) or ``info``
  (unknown).  The op is ``ok`` if every record is, ``fail`` if every record
  is, ``info`` otherwise (:func:`send_outcome`); its error is the first
  error's Kafka name in lower case with dashes (:func:`error_word`);
- a ``poll`` returns the records of the assigned keys; any error makes it
  ``fail`` (a poll has no effect);
- an ``assign`` takes some keys, optionally seeking them to the
  beginning; it is the consumer's own state, always ``ok``;
- a ``crash`` closes the worker's producer and consumer: always ``info``
  (Jepsen's rule), so the worker goes on as a new process with new
  clients, which assigns before it polls again.

With ``group`` (``config.json``'s ``queue.group``) the consumers share a
consumer group instead of assigning themselves keys (:class:`GroupTracker`):

- a ``subscribe`` joins the group with every key's topic (always ``ok``);
  the group's coordinator decides which keys the consumer reads, and each
  ``ok`` poll says what changed since the previous one: ``assigned`` (each
  new key with the offset the consumer starts it from and when) and
  ``revoked``;
- a ``commit`` commits, as Kafka's consumer does, the position of each key
  the consumer holds (one past the last record its polls returned): ``ok``
  once the coordinator acknowledged it, ``fail`` if the client knows it was
  not stored (:class:`broker.grpc_client.group.CommitError`'s ``definite``),
  ``info`` otherwise;
- a ``crash`` drops the consumer without leaving the group (a crashed
  member's keys move once its session expires).

Nothing else commits (no auto-commit, no commit on revocation), so every
offset the group stores is a ``commit`` op of the history.

With ``transactional`` each worker's producer is a transactional one (its
lane's transactional id; with ``zombie`` lanes 0 and 1 share one, so each
fences the other, Kafka's zombie) and ``send`` gives way to ``txn``
(Jepsen's ``:txn``): one transaction of up to four micro-ops, sends and
polls mixed, committed at the end:

- ``ok``: ``commit_transaction`` returned; each send's offset is known;
- ``fail``: the transaction definitely did not commit: a send, a poll or a
  partition's joining failed inside it (it is aborted), or the producer was
  fenced before it asked to commit; the consumer is sought back to where
  the transaction's polls began, as a read-process-write loop would be;
- ``info``: the commit was asked and its outcome is not known (no answer,
  or the producer was fenced while committing): the process retires.

A fenced producer is replaced by a new one with the same transactional
id, which fences its predecessor in turn.  With ``unadded_sends`` the
client misbehaves on purpose: each send of a transaction goes, with that
chance, to its partition without the partition being added to the
transaction (KIP-890's "buggy client"); the partition's leader must refuse
it (the transaction then fails), else it opens a transaction there that no
marker ends.  With ``zombie_pause_s`` the zombie (lane 1) stalls that long
between the micro-ops of each of its transactions, as a paused process
would, so that its successor fences it and writes in between.  The consumers read at
``isolation_level`` (``config.json``'s ``queue.isolation_level``).

An ``info`` op retires its process (``history.ops.next_process``).  After
the final heal, :meth:`QueueWorkload.final` runs the final polls: each
worker crashes its consumer, assigns every key from the beginning and polls
until every key has been read up to the highest offset any op learned for
it, in rounds of ``final_round_s``, until ``final_time_s`` passes; then
:func:`check_final_polls` checks that every acknowledged record is in the
final reads at its offset (kq's no-loss rule, a first check of the history
until the Spark checks take it over).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast

import bugs
from broker.client.producer_batch import TopicPartition
from broker.grpc_client.errors import (
    BrokerClientError,
    DeliveryFailedError,
    TransactionAbortableError,
    TransactionFatalError,
)
from broker.grpc_client.group import CommitError
from bugs import Bug
from chaos.workloads import FinalVerdict, Pacer, WorkloadStats, error_word, run_workers
from history.ops import HistoryRecorder, Op, next_process
from history.queue import (
    KeyMap,
    assign_value,
    commit_value,
    poll_invoke_value,
    poll_ok_value,
    record_key,
    send_completion_value,
    send_invoke_value,
    subscribe_value,
    txn_completion_value,
    txn_invoke_value,
)
from history.queue_checks import NO_CLEANUP, Cleanup

__all__ = [
    "FS",
    "GROUP_FS",
    "ConsumerLike",
    "GroupConsumerLike",
    "GroupTracker",
    "ProducerLike",
    "QueueWorkload",
    "TXN_FS",
    "TxnProducerLike",
    "PartitionAdderLike",
    "RecordOutcome",
    "ZOMBIE_LANE",
    "check_final_polls",
    "error_word",
    "record_outcome",
    "send_outcome",
]

FS: Final = ("send", "poll", "assign", "crash")
DEFAULT_WEIGHTS: Final = {"send": 4.0, "poll": 3.0, "assign": 0.5, "crash": 0.1}
GROUP_FS: Final = ("send", "poll", "subscribe", "commit", "crash")
"""The ops of a run whose consumers share a group (``subscribe`` in place
of ``assign``; a worker subscribes once per process, before its first poll)."""
GROUP_WEIGHTS: Final = {"send": 4.0, "poll": 3.0, "subscribe": 0.0, "commit": 1.0, "crash": 0.1}
TXN_FS: Final = ("txn", "poll", "assign", "crash")
"""The ops of a transactional run (``txn`` in place of ``send``)."""
TXN_WEIGHTS: Final = {"txn": 4.0, "poll": 3.0, "assign": 0.5, "crash": 0.1}
TXN_GROUP_FS: Final = ("txn", "poll", "subscribe", "commit", "crash")
TXN_GROUP_WEIGHTS: Final = {"txn": 4.0, "poll": 3.0, "subscribe": 0.0, "commit": 1.0, "crash": 0.1}
# The most micro-ops in one transaction (Jepsen's max-txn-length with txn?).
MAX_TXN_MOPS: Final = 4
# The lane that shares lane 0's transactional id in a zombie run
# (chaos.workloads.queue_setup), and stalls with ``zombie_pause_s``.
ZOMBIE_LANE: Final = 1
# A micro-op's chance of being a send rather than a poll.
TXN_SEND_P: Final = 0.6
# How many times a commit that timed out with its state unchanged is asked
# again within the op's timeout (each goes on where the last stopped).
TXN_COMMIT_ATTEMPTS: Final = 3
# A final reader's pause after a failed poll before it polls again: a
# consumer's ``retry.backoff.ms`` (100 ms in Kafka).  A failure (no leader,
# a broker down) comes back at once, and without the pause the final polls
# of a partition with no leader record thousands of failed polls a second.
FINAL_POLL_BACKOFF_S: Final = 0.1


class ProducerLike(Protocol):
    """What the workload uses of :class:`broker.grpc_client.Producer`."""

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]: ...

    async def close(self, timeout_s: float | None = None) -> None: ...


class TxnProducerLike(ProducerLike, Protocol):
    """A transactional producer (:class:`broker.grpc_client.Producer` with a
    transactional id)."""

    async def init_transactions(self, timeout_ms: int | None = None) -> None: ...

    def begin_transaction(self) -> None: ...

    async def commit_transaction(self, timeout_ms: int | None = None) -> None: ...

    async def abort_transaction(self, timeout_ms: int | None = None) -> None: ...


class PartitionAdderLike(Protocol):
    """What ``unadded_sends`` uses of a transactional producer's
    ``transactions`` (:class:`broker.client.transactions.TransactionManager`)."""

    def assume_added(self, tp: TopicPartition) -> None: ...


class ConsumerLike(Protocol):
    """What the workload uses of :class:`broker.grpc_client.Consumer`."""

    def assign(self, partitions: Any) -> None: ...

    def seek_to_beginning(self, partitions: Any = None) -> None: ...

    async def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[Any]: ...

    def log_start_offset(self, partition: Any) -> int: ...

    async def close(self, timeout_ms: int = 30_000, *, leave_group: bool = True) -> None: ...


class SeekingConsumerLike(ConsumerLike, Protocol):
    """A consumer a failed transaction's polls are undone on."""

    def known_position(self, partition: Any) -> int | None: ...

    def seek(self, partition: Any, offset: int) -> None: ...


class GroupConsumerLike(ConsumerLike, Protocol):
    """What a ``group`` run uses more of a consumer (``open_consumer``
    gives these then)."""

    def subscribe(
        self, topics: Any = None, *, pattern: Any = None, listener: Any = None
    ) -> None: ...

    def known_position(self, partition: Any) -> int | None: ...

    def committable(self) -> dict[Any, tuple[int, int]]: ...

    async def commit(self, offsets: Any = None) -> None: ...


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """How one record of a send ended: ``type`` ok, fail or info; the
    offset if known (ok only), the error word otherwise."""

    type: str
    offset: int | None = None
    error: str | None = None


def _read_late_error(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def record_outcome(
    future: asyncio.Future[Any] | None, error: BaseException | None = None
) -> RecordOutcome:
    """The outcome of one record from its (done) future, or from the error
    that kept it from being queued (``future`` None: never sent, ``fail``).

    The class comes from the client's ``DeliveryFailedError.outcome``, never
    from the error's name (``docs/clients.md``: the same answer is ``fail``
    or ``info`` depending on whether an earlier attempt may have written).
    """
    if future is None:
        name = error.name if isinstance(error, BrokerClientError) else type(error).__name__
        return RecordOutcome("fail", error=error_word(name))
    if not future.done():
        # The op ends here, unknown; whatever the record's fate (the final
        # reads decide it), its late error is read so that asyncio does not
        # report it as never retrieved when the retired producer is closed.
        future.add_done_callback(_read_late_error)
        return RecordOutcome("info", error="timeout")
    if future.cancelled():
        return RecordOutcome("info", error="timeout")
    exc = future.exception()
    if exc is None:
        offset = future.result().offset
        return RecordOutcome("ok", offset=offset if offset >= 0 else None)
    if isinstance(exc, DeliveryFailedError):
        definite = exc.definite or (
            # B18 (a harness bug): NOT_LEADER_OR_FOLLOWER after sending taken
            # as a refusal, though the records may be in the log (KAFKA-13574).
            bugs.on(Bug.HARNESS_NOT_LEADER_AS_FAIL) and exc.name == "NOT_LEADER_OR_FOLLOWER"
        )
        return RecordOutcome("fail" if definite else "info", error=error_word(exc.name))
    if isinstance(exc, BrokerClientError):
        # A producer failed as a whole (its sender's bug, a fatal refusal):
        # nothing says whether the record's batch was sent, so unknown.
        return RecordOutcome("info", error=error_word(exc.name))
    return RecordOutcome("info", error=error_word(type(exc).__name__))


def send_outcome(records: Sequence[RecordOutcome]) -> tuple[str, str | None]:
    """The op's type and error from its records': ``ok`` if every record
    is, ``fail`` if every record is, else ``info``; the first error."""
    types = {r.type for r in records}
    error = next((r.error for r in records if r.error is not None), None)
    if types == {"ok"}:
        return "ok", None
    if types == {"fail"}:
        return "fail", error
    return "info", error or "indeterminate"


# -- consumer groups ---------------------------------------------------------------


class GroupTracker:
    """A subscribed consumer's rebalance listener (Kafka's
    ``ConsumerRebalanceListener``, called inside its polls): keeps the keys
    the group gave and took since the last :meth:`take`, which a poll's
    ``assigned`` and ``revoked`` report (``docs/history-format.md``).

    A key's start is the consumer's position when the assigned callback
    runs (after the committed offsets were fetched); without one (no commit,
    so ``auto.offset.reset`` will place it, or the fetch failed and is
    retried) it is learned by a later poll: the first record the poll
    returned of the key, or the position the consumer found.  The time is
    the callback's, on the history's clock."""

    def __init__(
        self, keymap: KeyMap, consumer: GroupConsumerLike, clock: Callable[[], int]
    ) -> None:
        self.keymap = keymap
        self.consumer = consumer
        self.clock = clock
        # key -> (start if known, time): given, not yet reported.
        self.pending: dict[int, tuple[int | None, int]] = {}
        self.revoked: set[int] = set()

    def on_partitions_assigned(self, partitions: Sequence[Any]) -> None:
        now = self.clock()
        for tp in partitions:
            k = self.keymap.key(tp.topic, tp.partition)
            self.pending[k] = (self.consumer.known_position(tp), now)

    def on_partitions_revoked(self, partitions: Sequence[Any]) -> None:
        for tp in partitions:
            k = self.keymap.key(tp.topic, tp.partition)
            self.pending.pop(k, None)
            self.revoked.add(k)

    def on_partitions_lost(self, partitions: Sequence[Any]) -> None:
        # Fenced: taken without a revocation; reported as taken all the same.
        self.on_partitions_revoked(partitions)

    def take(
        self, found: Mapping[int, Sequence[tuple[int, Any]]]
    ) -> tuple[dict[str, list[int]] | None, list[int] | None]:
        """``assigned`` and ``revoked`` of an ``ok`` poll that returned
        ``found`` (records per key, in offset order)."""
        assigned: dict[str, list[int]] = {}
        for k, (start, at) in sorted(self.pending.items()):
            if start is None:
                records = found.get(k)
                start = (
                    records[0][0]
                    if records
                    else self.consumer.known_position(self.keymap.topic_partition(k))
                )
            if start is not None:
                assigned[str(k)] = [start, at]
                del self.pending[k]
        revoked = sorted(self.revoked)
        self.revoked.clear()
        return assigned or None, revoked or None


def _grouped(worker: _Worker) -> GroupConsumerLike:
    """The worker's consumer in a ``group`` run (``open_consumer``'s kind)."""
    return cast(GroupConsumerLike, worker.consumer)


# -- the workload ----------------------------------------------------------------


@dataclass
class _Worker:
    lane: int
    process: int
    producer: ProducerLike
    consumer: ConsumerLike
    assigned: list[int] = field(default_factory=list)
    # Group runs: the consumer's listener once it subscribed.
    tracker: GroupTracker | None = None
    # Transactional runs: the producer has its producer id and epoch.
    txn_ready: bool = False


class QueueWorkload:
    """Runs the queue workload and records it (module docstring).

    ``open_producer`` / ``open_consumer`` open a worker's clients (new ones
    for each process).  ``keymap`` maps keys to topic-partitions (the
    topics must exist: :meth:`prepare` is given ``create_topics`` to make
    them).  ``rate`` is ops per second over all workers; ``weights`` the
    relative frequency of ``send``, ``poll``, ``assign`` and ``crash``;
    ``max_send`` the most records in one send; ``poll_ms`` a poll's wait;
    ``op_timeout_s`` the longest the workload waits for a send (its records
    still unresolved then are ``info`` ``timeout``) or a poll;
    ``record_keys`` the record keys values cycle through
    (:func:`history.queue.record_key`); ``compacts`` and ``retains``: the
    topics are compacted, or delete by a retention limit, so that the final
    check lets records they removed go (:class:`history.queue_checks.Cleanup`);
    ``group``: the consumers subscribe in a consumer group (``open_consumer``
    gives consumers of that group, without auto-commit) and commit, and
    ``weights`` name ``subscribe`` and ``commit`` instead of ``assign``.
    """

    def __init__(
        self,
        recorder: HistoryRecorder,
        open_producer: Callable[[], ProducerLike],
        open_consumer: Callable[[], ConsumerLike],
        rng: random.Random,
        keymap: KeyMap,
        *,
        concurrency: int = 5,
        rate: float = 50.0,
        weights: Mapping[str, float] | None = None,
        max_send: int = 3,
        poll_ms: int = 500,
        op_timeout_s: float = 10.0,
        final_time_s: float = 60.0,
        final_round_s: float = 10.0,
        prepare: Callable[[], Any] | None = None,
        record_keys: int = 0,
        compacts: bool = False,
        retains: bool = False,
        group: bool = False,
        open_txn_producer: Callable[[int], TxnProducerLike] | None = None,
        read_committed: bool = False,
        unadded_sends: float = 0.0,
        zombie_pause_s: float = 0.0,
    ) -> None:
        if not 0.0 <= unadded_sends < 1.0:
            raise ValueError(f"unadded_sends must be in [0, 1), not {unadded_sends}")
        if not 0.0 <= zombie_pause_s <= 60.0:
            raise ValueError(f"zombie_pause_s must be in [0, 60], not {zombie_pause_s}")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if rate <= 0:
            raise ValueError("rate must be positive")
        if max_send < 1:
            raise ValueError("max_send must be at least 1")
        if record_keys < 0:
            raise ValueError("record_keys must be 0 or more")
        transactional = open_txn_producer is not None
        fs, defaults = {
            (False, False): (FS, DEFAULT_WEIGHTS),
            (True, False): (GROUP_FS, GROUP_WEIGHTS),
            (False, True): (TXN_FS, TXN_WEIGHTS),
            (True, True): (TXN_GROUP_FS, TXN_GROUP_WEIGHTS),
        }[(group, transactional)]
        w = {**defaults, **(weights or {})}
        writes = "txn" if transactional else "send"
        if set(w) != set(fs) or any(v < 0 for v in w.values()) or w[writes] + w["poll"] <= 0:
            raise ValueError(f"weights are non-negative numbers for {', '.join(fs)}")
        # Transactional runs: each lane's transactional producer.
        self.open_txn_producer = open_txn_producer
        # The consumers read committed records only (the final check knows).
        self.read_committed = read_committed
        # A transactional send's chance of going to a partition the client
        # never adds (KIP-890's buggy client): the leader must refuse it.
        self.unadded_sends = unadded_sends
        # Lane 1 (with ``zombie``, the second client of lane 0's id) stalls
        # this long between the micro-ops of each of its transactions, as a
        # zombie process does (a GC pause): its successor fences it and
        # writes meanwhile, and it goes on where it stopped.
        self.zombie_pause_s = zombie_pause_s
        self.group = group
        self.fs = fs
        self.recorder = recorder
        self.open_producer = open_producer
        self.open_consumer = open_consumer
        self.rng = rng
        self.keymap = keymap
        self.concurrency = concurrency
        self.rate = rate
        self.weights = [w[f] for f in fs]
        self.max_send = max_send
        self.poll_ms = poll_ms
        self.op_timeout_s = op_timeout_s
        self.final_time_s = final_time_s
        self.final_round_s = final_round_s
        self._prepare = prepare
        self.record_keys = record_keys
        self.compacts = compacts
        self.retains = retains
        self.stats = WorkloadStats()
        self._workers: list[_Worker] = []
        self._next_value = 0
        # The highest offset any op learned for each key (sends and polls).
        self.known: dict[int, int] = {}
        self._stop = asyncio.Event()
        self._closing: set[asyncio.Task[None]] = set()
        self.final_from: int | None = None
        # Every client op this workload recorded (for its final check).
        self.ops: list[Op] = []
        # The highest log start offset the final polls' fetches saw per key:
        # what retention removed (docs/history-format.md, final_polls).
        self.final_log_start: dict[int, int] = {}

    # -- workers ---------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        if not self._workers:
            self._workers = [
                _Worker(i, i, self._new_producer(i), self.open_consumer())
                for i in range(self.concurrency)
            ]

    def _new_producer(self, lane: int) -> ProducerLike:
        if self.open_txn_producer is not None:
            return self.open_txn_producer(lane)
        return self.open_producer()

    @property
    def processes(self) -> list[int]:
        return [w.process for w in self._workers]

    def _close_later(self, worker: _Worker, *, leave_group: bool = True) -> None:
        """Close the worker's clients without waiting: records still queued
        in its producer fail (their op was already completed); the consumer
        leaves its group unless ``leave_group`` is false (a crash)."""
        producer, consumer = worker.producer, worker.consumer

        async def close() -> None:
            with contextlib.suppress(Exception):
                await consumer.close(leave_group=leave_group)
            with contextlib.suppress(Exception):
                await producer.close(0)

        task = asyncio.create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _retire(self, worker: _Worker, *, crashed: bool = False) -> None:
        """The process got info: the worker goes on as a new process with
        new clients and no assignment (or subscription)."""
        self._close_later(worker, leave_group=not crashed)
        worker.process = next_process(worker.process, self.concurrency)
        worker.producer = self._new_producer(worker.lane)
        worker.consumer = self.open_consumer()
        worker.assigned = []
        worker.tracker = None
        worker.txn_ready = False
        self.stats.retired += 1

    def _note(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def _note_invoke(self, process: int, f: str, value: Any) -> Op:
        return self._note(self.recorder.invoke(process, f, value=value))

    def _learn(self, key: int, offset: int | None) -> None:
        if offset is not None and offset > self.known.get(key, -1):
            self.known[key] = offset

    # -- ops -------------------------------------------------------------------------

    async def send(self, worker: _Worker, records: Sequence[tuple[int, int]]) -> Op:
        process = worker.process
        self._note_invoke(process, "send", value=send_invoke_value(records))
        self.stats.invokes += 1
        futures: list[asyncio.Future[Any] | None] = []
        refusal: BaseException | None = None
        deadline = time.monotonic() + self.op_timeout_s
        for k, v in records:
            if refusal is not None:
                futures.append(None)
                continue
            topic, partition = self.keymap.topic_partition(k)
            try:
                # Not under a timeout of ours: cancelled after the record was
                # queued, it would count as never sent.  The producer bounds
                # it itself (max.block.ms for metadata and buffer memory).
                futures.append(
                    await worker.producer.send(
                        topic,
                        str(v).encode(),
                        key=record_key(k, v, self.record_keys).encode(),
                        partition=partition,
                    )
                )
            except Exception as exc:
                # Not queued (no metadata, a fatal producer, a client bug):
                # never sent.
                refusal = exc
                futures.append(None)
        live = [f for f in futures if f is not None]
        if live:
            await asyncio.wait(live, timeout=max(0.0, deadline - time.monotonic()))
        outcomes = [record_outcome(f, refusal) for f in futures]
        for (k, _), o in zip(records, outcomes, strict=True):
            self._learn(k, o.offset)
        type_, error = send_outcome(outcomes)
        value = send_completion_value(records, [o.offset for o in outcomes])
        op = self._note(self.recorder.complete(process, type_, value=value, error=error))  # type: ignore[arg-type]
        self.stats.completions[type_] += 1
        if type_ == "info":
            self._retire(worker)
        return op

    async def assign(self, worker: _Worker, keys: Sequence[int], seek: bool) -> Op:
        value = assign_value(keys, seek)
        self._note_invoke(worker.process, "assign", value=value)
        self.stats.invokes += 1
        tps = [self.keymap.topic_partition(k) for k in value["keys"]]
        worker.consumer.assign(tps)
        if seek:
            worker.consumer.seek_to_beginning(tps)
        worker.assigned = list(value["keys"])
        op = self._note(self.recorder.ok(worker.process, value=value))
        self.stats.completions["ok"] += 1
        return op

    async def poll(self, worker: _Worker, poll_ms: int | None = None) -> Op:
        process = worker.process
        self._note_invoke(process, "poll", value=poll_invoke_value())
        self.stats.invokes += 1
        wait_ms = self.poll_ms if poll_ms is None else poll_ms
        try:
            records = await asyncio.wait_for(
                worker.consumer.poll(wait_ms), wait_ms / 1000 + self.op_timeout_s
            )
        except TimeoutError:
            return self._poll_failed(process, "timeout")
        except BrokerClientError as exc:
            return self._poll_failed(process, error_word(exc.name))
        except Exception as exc:
            # A consumer's own failure (its bug reading an answer): the poll
            # had no effect; the error names it rather than ending the run.
            return self._poll_failed(process, error_word(type(exc).__name__))
        found: dict[int, list[tuple[int, Any]]] = {}
        for r in records:
            k = self.keymap.key(r.topic, r.partition)
            found.setdefault(k, []).append((r.offset, _decode(r.value)))
            self._learn(k, r.offset)
        assigned, revoked = worker.tracker.take(found) if worker.tracker else (None, None)
        op = self._note(
            self.recorder.ok(
                process, value=poll_ok_value(found), assigned=assigned, revoked=revoked
            )
        )
        self.stats.completions["ok"] += 1
        return op

    def _poll_failed(self, process: int, error: str) -> Op:
        op = self._note(self.recorder.fail(process, error, value=poll_invoke_value()))
        self.stats.completions["fail"] += 1
        return op

    async def crash(self, worker: _Worker) -> Op:
        self._note_invoke(worker.process, "crash", value=None)
        self.stats.invokes += 1
        op = self._note(self.recorder.info(worker.process, "crash", value=None))
        self.stats.completions["info"] += 1
        self._retire(worker, crashed=True)
        return op

    async def subscribe(self, worker: _Worker) -> Op:
        """Join the group with every key's topic (module docstring)."""
        value = subscribe_value(self.keymap.keys)
        self._note_invoke(worker.process, "subscribe", value=value)
        self.stats.invokes += 1
        consumer = _grouped(worker)
        tracker = GroupTracker(self.keymap, consumer, self.recorder.now)
        consumer.subscribe([name for name, _ in self.keymap.topics], listener=tracker)
        worker.tracker = tracker
        op = self._note(self.recorder.ok(worker.process, value=value))
        self.stats.completions["ok"] += 1
        return op

    async def commit(self, worker: _Worker) -> Op:
        """Commit the position of every key the consumer holds (module
        docstring); the caller checks there is one."""
        consumer = _grouped(worker)
        held = consumer.committable()
        offsets = {self.keymap.key(tp.topic, tp.partition): at[0] for tp, at in held.items()}
        process = worker.process
        self._note_invoke(process, "commit", value=commit_value(offsets))
        self.stats.invokes += 1
        type_, error = "ok", None
        try:
            await asyncio.wait_for(consumer.commit(held), self.op_timeout_s)
        except TimeoutError:
            type_, error = "info", "timeout"
        except CommitError as exc:
            type_, error = ("fail" if exc.definite else "info"), error_word(exc.name)
        except BrokerClientError as exc:
            # Not the commit's own answer (a consumer that was closed, ...):
            # nothing says it was not sent.
            type_, error = "info", error_word(exc.name)
        op = self._note(self.recorder.complete(process, type_, error=error))  # type: ignore[arg-type]
        self.stats.completions[type_] += 1
        if type_ == "info":
            self._retire(worker)
        return op

    async def txn(self, worker: _Worker, mops: Sequence[tuple[Any, ...]]) -> Op:
        """One transaction of ``mops`` (``("send", k, v)`` and ``("poll",)``)
        and its outcome (module docstring)."""
        process = worker.process
        self._note_invoke(process, "txn", value=txn_invoke_value(mops))
        self.stats.invokes += 1
        producer = cast(TxnProducerLike, worker.producer)
        deadline = time.monotonic() + self.op_timeout_s
        futures: dict[int, asyncio.Future[Any]] = {}
        polled: dict[int, dict[int, list[tuple[int, Any]]]] = {}
        before = self._positions(worker) if any(m[0] == "poll" for m in mops) else {}
        committing = False
        type_, error = "ok", None
        try:
            if not worker.txn_ready:
                await producer.init_transactions(_ms_left(deadline))
                worker.txn_ready = True
            producer.begin_transaction()
            for i, mop in enumerate(mops):
                if i and self.zombie_pause_s and worker.lane == ZOMBIE_LANE:
                    await asyncio.sleep(self.zombie_pause_s)
                if mop[0] == "send":
                    k, v = mop[1], mop[2]
                    topic, partition = self.keymap.topic_partition(k)
                    if self.unadded_sends and self.rng.random() < self.unadded_sends:
                        adder = cast(PartitionAdderLike, cast(Any, producer).transactions)
                        adder.assume_added(TopicPartition(topic, partition))
                    futures[i] = await producer.send(
                        topic,
                        str(v).encode(),
                        key=record_key(k, v, self.record_keys).encode(),
                        partition=partition,
                    )
                else:
                    polled[i] = await self._txn_poll(worker, deadline)
            committing = True
            await self._commit(producer, deadline)
        except TransactionFatalError as exc:
            # Fenced (another producer took the id) or worse: a transaction
            # whose commit was asked may have committed; otherwise it cannot.
            type_, error = ("info" if committing else "fail"), error_word(exc.name)
            self._replace_producer(worker)
        except (TransactionAbortableError, _PollFailed, TimeoutError, BrokerClientError) as exc:
            if committing and not isinstance(exc, TransactionAbortableError):
                # The commit was asked and not answered within the op.
                type_, error = "info", error_word(_name(exc))
            else:
                type_, error = "fail", error_word(_name(exc))
                await self._abort(worker, deadline)
        except Exception as exc:
            # Not queued (no metadata, a client bug): never committed.
            type_, error = "fail", error_word(type(exc).__name__)
            await self._abort(worker, deadline)
        for future in futures.values():
            # Their errors are the transaction's; read so none goes unread.
            if future.done():
                _read_late_error(future)
            else:
                future.add_done_callback(_read_late_error)
        offsets: dict[int, int | None] = {}
        if type_ != "fail":
            for i, future in futures.items():
                offsets[i] = (
                    future.result().offset
                    if future.done() and not future.cancelled() and future.exception() is None
                    else None
                )
        if type_ == "ok":
            for i, offset in offsets.items():
                self._learn(mops[i][1], offset)
            for found in polled.values():
                for k, recs in found.items():
                    for offset, _ in recs:
                        self._learn(k, offset)
        elif type_ == "fail":
            self._rewind(worker, before)
        value = txn_completion_value(mops, offsets, polled)
        op = self._note(self.recorder.complete(process, type_, value=value, error=error))  # type: ignore[arg-type]
        self.stats.completions[type_] += 1
        if type_ == "info":
            self._retire(worker)
        return op

    async def _txn_poll(self, worker: _Worker, deadline: float) -> dict[int, list[tuple[int, Any]]]:
        """A poll micro-op: the records by key (a failed poll fails the
        transaction)."""
        wait_ms = min(self.poll_ms, _ms_left(deadline))
        try:
            records = await asyncio.wait_for(
                worker.consumer.poll(wait_ms), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            raise _PollFailed("timeout") from None
        except BrokerClientError as exc:
            raise _PollFailed(exc.name) from None
        found: dict[int, list[tuple[int, Any]]] = {}
        for r in records:
            k = self.keymap.key(r.topic, r.partition)
            found.setdefault(k, []).append((r.offset, _decode(r.value)))
        return found

    async def _commit(self, producer: TxnProducerLike, deadline: float) -> None:
        """``commit_transaction``, asked again after a timeout that left it
        unchanged (it goes on where it stopped) while the op has time."""
        for attempt in range(TXN_COMMIT_ATTEMPTS):
            try:
                await producer.commit_transaction(_ms_left(deadline))
                return
            except (TransactionAbortableError, TransactionFatalError):
                raise
            except BrokerClientError:
                if attempt == TXN_COMMIT_ATTEMPTS - 1 or time.monotonic() >= deadline:
                    raise

    async def _abort(self, worker: _Worker, deadline: float) -> None:
        """Abort the worker's transaction; a producer that cannot (fenced,
        or no answer) is replaced (the coordinator aborts what it had open
        when its successor's InitProducerId fences it, or by its timeout)."""
        producer = cast(TxnProducerLike, worker.producer)
        if not worker.txn_ready:
            self._replace_producer(worker)
            return
        try:
            await producer.abort_transaction(max(1_000, _ms_left(deadline)))
        except Exception:
            self._replace_producer(worker)

    def _replace_producer(self, worker: _Worker) -> None:
        old = worker.producer

        async def close() -> None:
            with contextlib.suppress(Exception):
                await old.close(0)

        task = asyncio.create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        worker.producer = self._new_producer(worker.lane)
        worker.txn_ready = False

    def _positions(self, worker: _Worker) -> dict[int, int]:
        """Where the worker's consumer stands in each key it reads."""
        out: dict[int, int] = {}
        consumer = cast(SeekingConsumerLike, worker.consumer)
        for k in worker.assigned:
            at = consumer.known_position(self.keymap.topic_partition(k))
            if at is not None:
                out[k] = at
        return out

    def _rewind(self, worker: _Worker, before: Mapping[int, int]) -> None:
        """Seek the consumer back to where a failed transaction's polls
        began: what they returned counts for nothing (a read-process-write
        loop reads it again)."""
        consumer = cast(SeekingConsumerLike, worker.consumer)
        for k, offset in before.items():
            if k in worker.assigned:
                consumer.seek(self.keymap.topic_partition(k), offset)

    def _txn_mops(self, worker: _Worker) -> list[tuple[Any, ...]]:
        # In a group run a transaction only sends: what the group gives and
        # takes is reported by plain polls (a poll's assigned and revoked).
        can_poll = bool(worker.assigned) and not self.group
        mops: list[tuple[Any, ...]] = []
        for _ in range(self.rng.randint(1, MAX_TXN_MOPS)):
            if can_poll and self.rng.random() >= TXN_SEND_P:
                mops.append(("poll",))
            else:
                mops.append(("send", self.rng.choice(self.keymap.keys), self._new_values(1)[0]))
        return mops

    def _new_values(self, n: int) -> list[int]:
        out = list(range(self._next_value, self._next_value + n))
        self._next_value += n
        return out

    async def _one(self, worker: _Worker) -> None:
        f = self.rng.choices(self.fs, weights=self.weights)[0]
        keys = self.keymap.keys
        if f == "poll" and not worker.assigned and not self.group:
            f = "assign"
        if f in ("poll", "commit") and self.group and worker.tracker is None:
            f = "subscribe"
        if f == "commit" and not _grouped(worker).committable():
            f = "poll"
        if f == "subscribe":
            await self.subscribe(worker)
        elif f == "commit":
            await self.commit(worker)
        elif f == "txn":
            await self.txn(worker, self._txn_mops(worker))
        elif f == "send":
            n = self.rng.randint(1, self.max_send)
            ks = [self.rng.choice(keys) for _ in range(n)]
            await self.send(worker, list(zip(ks, self._new_values(n), strict=True)))
        elif f == "poll":
            await self.poll(worker)
        elif f == "assign":
            chosen = self.rng.sample(keys, self.rng.randint(1, len(keys)))
            await self.assign(worker, chosen, self.rng.random() < 0.5)
        else:
            await self.crash(worker)

    # -- phases ----------------------------------------------------------------------

    async def prepare(self) -> None:
        """Before the faults: make the topics (``prepare`` given at
        construction) and open the workers' clients."""
        if self._prepare is not None:
            await self._prepare()
        self._ensure_workers()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, time_limit_s: float, op_limit: int | None = None) -> WorkloadStats:
        """The main phase (as the register workload's)."""
        self._ensure_workers()
        self._stop.clear()
        pacer = Pacer(
            self._stop,
            self.rng,
            self.concurrency,
            self.rate,
            time_limit_s,
            op_limit,
            sleep_out=True,
        )
        await run_workers(
            (pacer.drive(lambda w=w: self._one(w)) for w in self._workers),  # type: ignore[misc]
            time_limit_s + self.op_timeout_s + 5,
        )
        return self.stats

    async def final_polls(self) -> dict[str, Any]:
        """Jepsen's final polls (module docstring); what they reached."""
        self._ensure_workers()
        in_flight = self.recorder.in_flight()
        for worker in self._workers:
            if worker.process in in_flight:
                self._note(self.recorder.complete(worker.process, "info", error="run-ended"))
                self.stats.completions["info"] += 1
                self._retire(worker)
        self.final_from = self.recorder.count
        targets = dict(self.known)
        keys = self.keymap.keys
        deadline = time.monotonic() + self.final_time_s
        rounds = 0

        async def reader(worker: _Worker) -> dict[int, int]:
            nonlocal rounds
            reached: dict[int, int] = {}
            while True:
                rounds += 1
                reached = {}
                await self.crash(worker)
                await self.assign(worker, keys, True)
                round_end = min(deadline, time.monotonic() + self.final_round_s)
                while time.monotonic() < round_end:
                    op = await self.poll(worker, 1_000)
                    if op.type != "ok":
                        pause = min(FINAL_POLL_BACKOFF_S, round_end - time.monotonic())
                        await asyncio.sleep(max(0.0, pause))
                    else:
                        for k, recs in op.value[0][1].items():
                            for offset, _ in recs:
                                reached[int(k)] = max(reached.get(int(k), -1), offset)
                        self._note_log_start(worker)
                    if all(self._reached(reached, k, t) for k, t in targets.items()):
                        return reached
                if time.monotonic() >= deadline:
                    return reached

        results = await asyncio.gather(*(reader(w) for w in self._workers))
        missing: dict[str, int] = {}
        for k, t in sorted(targets.items()):
            if any(not self._reached(r, k, t) for r in results):
                missing[str(k)] = t
        return {
            "from_index": self.final_from,
            "complete": not missing,
            "rounds": rounds,
            "missing": missing,
            "keys": len(keys),
            "log_start": {str(k): v for k, v in sorted(self.final_log_start.items())},
        }

    def _reached(self, reached: Mapping[int, int], key: int, target: int) -> bool:
        """A final reader got to offset ``target`` of ``key``, or, on topics
        with retention, the log start passed it (nothing up to it is left
        to read: with every segment old enough, retention deletes them all)."""
        if reached.get(key, -1) >= target:
            return True
        return self.retains and self.final_log_start.get(key, -1) > target

    def _note_log_start(self, worker: _Worker) -> None:
        """Keep the highest log start offset the worker's consumer learned
        of each key (a record below it was removed by retention while the
        final polls read; -1: no fetch answer yet)."""
        for k in self.keymap.keys:
            start = worker.consumer.log_start_offset(self.keymap.topic_partition(k))
            if start > self.final_log_start.get(k, -1):
                self.final_log_start[k] = start

    async def final(self) -> FinalVerdict:
        """The final polls, then :func:`check_final_polls` of the history
        recorded so far."""
        final = await self.final_polls()
        check = check_final_polls(
            self.ops,
            final["from_index"],
            self.cleanup(final),
            read_committed=self.read_committed,
        )
        problems = sum(len(v) for k, v in check.items() if isinstance(v, list))
        verdict = {"final_polls": final, **check}
        ok = final["complete"] and problems == 0
        reached = (
            "every key reached its highest known offset"
            if final["complete"]
            else f"missing {final['missing']}"
        )
        return FinalVerdict(
            f"final polls: {final['rounds']} rounds, {reached}; "
            f"{problems} lost, moved or inconsistent record(s)",
            verdict,
            ok,
        )

    def cleanup(self, final: Mapping[str, Any]) -> Cleanup:
        """What the topics may have removed, from the final polls' log starts."""
        return Cleanup(
            dict(final.get("log_start", {})) if self.retains else {},
            self.record_keys if self.compacts else None,
        )

    async def close(self) -> None:
        for worker in self._workers:
            self._close_later(worker)
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=10)


class _PollFailed(Exception):
    """A poll micro-op failed (its error's name): the transaction fails."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _name(exc: BaseException) -> str:
    name = getattr(exc, "name", None)
    return name if isinstance(name, str) else type(exc).__name__


def _ms_left(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def _text(value: Any) -> str:
    """A value's canonical JSON text (as ``history.queue_checks`` compares them)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _decode(value: bytes | None) -> Any:
    """A record's value as the history writes it: the integer it names, or
    its text if it names none (a foreign record: the shape check reports it)."""
    if value is None:
        return None
    text = value.decode("utf-8", errors="replace")
    try:
        return int(text)
    except ValueError:
        return text


# -- kq's no-loss rule, on the final polls ----------------------------------------


def check_final_polls(
    ops: Sequence[Op],
    from_index: int,
    cleanup: Cleanup = NO_CLEANUP,
    *,
    read_committed: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """kq's no-loss rule over a queue history whose final polls start at
    ``from_index`` (``docs/history-format.md``): every record of an ``ok``
    send, and every record of an ``info`` send that some ``ok`` poll saw,
    is in the final polls, at its acknowledged offset (``ok``) or at the
    offset a poll saw it at, with its value, unless the topics' retention
    or compaction removed it (``cleanup``: below the log start, or
    superseded by a later record of its record key the final polls read).

    ``lost``: such a record that no final poll returned; ``moved``: one
    the final polls returned at another offset; ``inconsistent``: two
    values at one offset of a key in the final polls.  A ``txn``'s sends
    count as a send's of its outcome; with ``read_committed`` final reads,
    ``aborted_read`` is a record of a ``fail`` (aborted) transaction they
    returned.
    """
    acked: dict[tuple[int, int], int | None] = {}  # (key, value) -> offset
    info_sent: set[tuple[int, int]] = set()
    seen_at: dict[tuple[int, int], int] = {}
    final: dict[int, dict[int, Any]] = {}
    inconsistent: list[dict[str, Any]] = []
    aborted_sent: set[tuple[int, int]] = set()
    for op in ops:
        if op.process == "nemesis" or op.type == "invoke":
            continue
        if op.f in ("send", "txn") and op.type in ("ok", "info"):
            for mop in op.value:
                if mop[0] != "send":
                    continue
                k, (offset, v) = mop[1], _sent(mop[2])
                if op.type == "ok":
                    acked[(k, v)] = offset
                else:
                    info_sent.add((k, v))
                    # A send's offset puts its record in the log for good;
                    # an unknown transaction's may have been aborted: it
                    # must be read only if some poll saw it.
                    if offset is not None and op.f == "send":
                        seen_at[(k, v)] = offset
        elif op.f == "txn" and op.type == "fail":
            for mop in op.value:
                if mop[0] == "send":
                    aborted_sent.add((mop[1], _sent(mop[2])[1]))
        if op.f == "txn" and op.type == "ok":
            for mop in op.value:
                if mop[0] == "poll" and len(mop) > 1:
                    for k_text, recs in mop[1].items():
                        for offset, v in recs:
                            seen_at.setdefault((int(k_text), v), offset)
        elif op.f == "poll" and op.type == "ok":
            for k_text, recs in op.value[0][1].items():
                k = int(k_text)
                for offset, v in recs:
                    seen_at.setdefault((k, v), offset)
                    if op.index >= from_index:
                        at = final.setdefault(k, {})
                        if offset in at and at[offset] != v:
                            inconsistent.append(
                                {"key": k, "offset": offset, "values": [at[offset], v]}
                            )
                        at.setdefault(offset, v)
    where: dict[tuple[int, int], int] = {
        (k, v): offset for k, at in final.items() for offset, v in at.items()
    }
    must = dict(acked)
    for kv in info_sent:
        if kv in seen_at:
            must.setdefault(kv, seen_at[kv])
    texts = {str(k): {offset: {_text(v)} for offset, v in at.items()} for k, at in final.items()}
    latest = cleanup.latest(texts)
    lost: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    for (k, v), offset in sorted(must.items()):
        if cleanup.gone(str(k), offset, _text(v), latest):
            continue
        found = where.get((k, v))
        if found is None:
            lost.append({"key": k, "value": v, "offset": offset})
        elif offset is not None and found != offset:
            moved.append({"key": k, "value": v, "offset": offset, "found": found})
    out = {"lost": lost, "moved": moved, "inconsistent": inconsistent}
    if read_committed:
        # A read_committed reader never returns a record of an aborted
        # transaction (G1a's final-read form).
        out["aborted_read"] = [
            {"key": k, "value": v, "offset": where[(k, v)]}
            for k, v in sorted(aborted_sent)
            if (k, v) in where
        ]
    return out


def _sent(micro: Any) -> tuple[int | None, Any]:
    """A send micro-op's ``[offset, v]`` (or its invoke's bare ``v``)."""
    if isinstance(micro, list):
        return micro[0], micro[1]
    return None, micro
